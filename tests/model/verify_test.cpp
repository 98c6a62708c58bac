// verify_sessions (runtime/verify.h, the check behind `quern run --verify`):
// its cosine, argmaxes and argmax gap equal what the two sessions' own logits
// give for the same passes, and two identical sessions agree exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "model/model.h"
#include "model/synth.h"
#include "runtime/session.h"
#include "runtime/verify.h"

using namespace quern;

namespace {

std::unique_ptr<Model> synthetic(bool precise) {
    SynthModel sm = make_synthetic(synth_tiny(synth_preset("llama3-1b")), "Q4_K_M", 7);
    auto m = Model::from_weights(sm.cfg, std::move(sm.weights));
    ModelOptions o;
    o.precise_activations = precise;
    m->set_options(o);
    return m;
}

/// The last position's logits after the passes verify_sessions makes.
std::vector<float> last_logits(Session& s, const std::vector<int32_t>& ids) {
    std::vector<float> l(static_cast<size_t>(s.config().n_vocab));
    s.clear();
    s.eval(ids.data(), static_cast<int64_t>(ids.size()) - 1, nullptr);
    s.eval(ids.data() + ids.size() - 1, 1, l.data());
    return l;
}

TEST(Verify, ReportsWhatTheLogitsGive) {
    ThreadPool pool(2);
    auto precise = synthetic(true), onelevel = synthetic(false);
    auto a = make_cpu_session(*precise, 64, pool), b = make_cpu_session(*onelevel, 64, pool);
    for (int seed : {1, 2, 3, 4}) {
        std::vector<int32_t> ids(9);
        for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 11 * seed) % 400);
        const VerifyResult v = verify_sessions(*a, *b, ids);
        const auto la = last_logits(*a, ids), lb = last_logits(*b, ids);
        const auto top = [](const std::vector<float>& l) {
            return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
        };
        EXPECT_EQ(v.argmax_ref, top(la)) << seed;
        EXPECT_EQ(v.argmax_test, top(lb)) << seed;
        const double gap = static_cast<double>(la[static_cast<size_t>(v.argmax_ref)]) -
                           static_cast<double>(la[static_cast<size_t>(v.argmax_test)]);
        EXPECT_NEAR(v.argmax_gap, gap, 1e-6 * (1 + std::fabs(gap))) << seed;
        EXPECT_GE(v.argmax_gap, 0.0) << seed;
        if (v.argmax_ref == v.argmax_test) EXPECT_EQ(v.argmax_gap, 0.0) << seed;
        EXPECT_NEAR(v.logits_cosine, cosine_similarity(la.data(), lb.data(), static_cast<int64_t>(la.size())), 1e-9)
            << seed;
        EXPECT_LT(v.logits_cosine, 1.0) << seed << ": one-level activations should move the logits";
        EXPECT_EQ(v.ok, v.logits_cosine >= v.threshold) << seed;
        ASSERT_FALSE(v.cosines.empty());
        EXPECT_EQ(v.cosines.back().first, "logits");
    }
    // A session against an identical one: everything agrees exactly.
    auto c = make_cpu_session(*precise, 64, pool);
    const std::vector<int32_t> ids = {5, 17, 99, 3};
    const VerifyResult same = verify_sessions(*a, *c, ids);
    EXPECT_TRUE(same.ok);
    EXPECT_EQ(same.argmax_ref, same.argmax_test);
    EXPECT_EQ(same.argmax_gap, 0.0);
    EXPECT_NEAR(same.logits_cosine, 1.0, 1e-12);
    EXPECT_TRUE(same.first_diverging.empty());
}

}  // namespace
