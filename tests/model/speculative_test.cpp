// Speculative decoding (runtime/speculative.h) with drafters whose drafts
// the test controls: one that knows the model's greedy continuation and
// errs on purpose (every path of a round: all drafts kept, a rejection
// after some, the first rejected), on a recurrent model (Qwen3.5: the state
// rolled back) and an attention-only one (Llama: positions forgotten); and
// one whose drafts follow a fixed distribution unlike the model's, whose
// sampled output must be distributed as plain sampling's (rejection
// sampling is exact: a chi-square test on fixed seeds).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "hf_test_util.h"
#include "model/hf_model.h"
#include "runtime/session.h"
#include "runtime/speculative.h"

namespace quern {
namespace {

using hf_test::argmax;
using hf_test::kDir;

/// Drafts truth[p] for position p, except where `wrong(p)`: the next id.
class OracleDrafter final : public Drafter {
public:
    OracleDrafter(std::vector<int32_t> truth, int64_t n_vocab, std::function<bool(int64_t)> wrong)
        : truth_(std::move(truth)), V_(n_vocab), wrong_(std::move(wrong)) {}
    bool reads_hidden() const override { return false; }
    void observe(const int32_t*, const float*, int64_t n) override { n_ += n; }
    void truncate(int64_t n) override { n_ = std::min(n_, n); }
    bool begin(int32_t, float* logits) override {
        pos_ = n_ + 1;  // tok is at n_, the first draft at n_ + 1
        fill(logits);
        return true;
    }
    void next(int32_t, float* logits) override {
        ++pos_;
        fill(logits);
    }
    void end() override {}

private:
    void fill(float* logits) const {
        std::fill_n(logits, V_, 0.0f);
        if (pos_ >= static_cast<int64_t>(truth_.size())) return;  // past what it knows: id 0
        const int32_t t = truth_[static_cast<size_t>(pos_)];
        logits[wrong_(pos_) ? (t + 1) % V_ : t] = 10.0f;
    }
    std::vector<int32_t> truth_;
    int64_t V_, n_ = 0, pos_ = 0;
    std::function<bool(int64_t)> wrong_;
};

/// The prompt and its greedy continuation of n tokens, as one sequence.
std::vector<int32_t> greedy_sequence(Model& m, const std::vector<int32_t>& prompt, int n, ThreadPool& pool) {
    auto s = make_cpu_session(m, 128, pool);
    std::vector<float> l(static_cast<size_t>(m.config().n_vocab));
    s->eval(prompt.data(), static_cast<int64_t>(prompt.size()), l.data());
    std::vector<int32_t> seq = prompt;
    seq.push_back(static_cast<int32_t>(argmax(l.data(), static_cast<int64_t>(l.size()))));
    while (static_cast<int>(seq.size() - prompt.size()) < n) seq.push_back(s->eval_greedy(seq.back()));
    return seq;
}

class SpecOracle : public ::testing::TestWithParam<std::string> {};

TEST_P(SpecOracle, GreedyOutputIsTheModelsWhicheverDraftsAreKept) {
    auto model = load_hf_model(kDir + GetParam() + "/fp32");
    const int64_t V = model->config().n_vocab;
    ThreadPool pool(2);
    const std::vector<int32_t> prompt{3, 141, 59, 26, 5, 35, 89, 79};
    const std::vector<int32_t> truth = greedy_sequence(*model, prompt, 48, pool);
    // Every draft right; every 5th position wrong; every 2nd; all wrong.
    for (int period : {0, 5, 2, 1}) {
        auto s = make_cpu_session(*model, 128, pool);
        auto wrong = [period](int64_t p) { return period > 0 && p % period == 0; };
        Speculator sp(*s, std::make_unique<OracleDrafter>(truth, V, wrong), 3, 7);
        SamplingParams p;
        p.temperature = 0;
        Sampler sampler(p, V);
        std::vector<float> l(static_cast<size_t>(V));
        sp.eval(prompt.data(), static_cast<int64_t>(prompt.size()), l.data());
        std::vector<int32_t> seq = prompt;
        seq.push_back(sampler.sample(l.data()));
        while (seq.size() < truth.size()) {
            std::vector<int32_t> got;
            sp.step(seq.back(), sampler, got);
            seq.insert(seq.end(), got.begin(), got.end());
        }
        seq.resize(truth.size());
        EXPECT_EQ(seq, truth) << "period " << period;
        const SpecStats& st = sp.stats();
        if (period == 0) EXPECT_EQ(st.accepted, st.drafted);
        if (period == 1) EXPECT_EQ(st.accepted, 0);
        if (period == 5) EXPECT_GT(st.accepted, 0);
        if (period == 5) EXPECT_LT(st.accepted, st.drafted);
        // Cutting the sequence back and going on gives the same tokens.
        sp.truncate(static_cast<int64_t>(prompt.size()) + 10);
        std::vector<int32_t> again(truth.begin(), truth.begin() + static_cast<int64_t>(prompt.size()) + 11);
        while (again.size() < truth.size()) {
            std::vector<int32_t> got;
            sp.step(again.back(), sampler, got);
            again.insert(again.end(), got.begin(), got.end());
        }
        again.resize(truth.size());
        EXPECT_EQ(again, truth) << "period " << period << " after truncating";
    }
}

INSTANTIATE_TEST_SUITE_P(Models, SpecOracle, ::testing::Values("qwen3_5", "llama"));

/// Drafts from a fixed distribution per position, unlike the model's: logits
/// drawn once from N(0, 2) with a seed of the position.
class FixedDrafter final : public Drafter {
public:
    explicit FixedDrafter(int64_t n_vocab) : V_(n_vocab) {}
    bool reads_hidden() const override { return false; }
    void observe(const int32_t*, const float*, int64_t n) override { n_ += n; }
    void truncate(int64_t n) override { n_ = std::min(n_, n); }
    bool begin(int32_t, float* logits) override {
        pos_ = n_ + 1;
        fill(logits);
        return true;
    }
    void next(int32_t, float* logits) override { fill(logits, ++pos_); }
    void end() override {}

private:
    void fill(float* logits, int64_t pos = -1) const {
        std::mt19937 g(static_cast<uint32_t>(pos < 0 ? pos_ : pos));
        std::normal_distribution<float> nd(0.0f, 2.0f);
        for (int64_t i = 0; i < V_; ++i) logits[i] = nd(g);
    }
    int64_t V_, n_ = 0, pos_ = 0;
};

/// Chi-square statistic of two samples' counts over the same categories
/// (categories seen fewer than 10 times in all pooled into one), and its
/// degrees of freedom.
std::pair<double, int> chi_square(const std::vector<int>& a, const std::vector<int>& b) {
    double na = 0, nb = 0;
    for (size_t i = 0; i < a.size(); ++i) na += a[i], nb += b[i];
    std::vector<std::pair<double, double>> cells;
    double ra = 0, rb = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        if (a[i] + b[i] >= 10) cells.push_back({a[i], b[i]});
        else ra += a[i], rb += b[i];
    }
    if (ra + rb > 0) cells.push_back({ra, rb});
    double chi = 0;
    for (auto [x, y] : cells) {
        const double t = x + y, ea = t * na / (na + nb), eb = t * nb / (na + nb);
        chi += (x - ea) * (x - ea) / ea + (y - eb) * (y - eb) / eb;
    }
    return {chi, static_cast<int>(cells.size()) - 1};
}

// The second, third and fourth generated tokens (the ones a round decides)
// are distributed as plain sampling's, for a recurrent and an attention
// model: chi-square within df + 6·sqrt(2·df) (p < ~1e-5 for these df);
// fixed seeds keep it deterministic.
TEST_P(SpecOracle, SampledTokensAreDistributedAsWithoutDrafts) {
    auto model = load_hf_model(kDir + GetParam() + "/fp32");
    const int64_t V = model->config().n_vocab;
    ThreadPool pool(1);
    const std::vector<int32_t> prompt{3, 141, 59, 26, 5, 35};
    SamplingParams p;
    p.temperature = 1.5f;  // flatter than the model: many tokens in play
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    constexpr int kRuns = 3000, kDepth = 4;
    std::vector<std::vector<int>> plain(kDepth, std::vector<int>(static_cast<size_t>(V))), spec = plain;
    std::vector<float> l(static_cast<size_t>(V));
    auto s = make_cpu_session(*model, 32, pool);
    for (int r = 0; r < kRuns; ++r) {
        p.seed = static_cast<uint64_t>(r);
        Sampler sampler(p, V);
        s->clear();
        s->eval(prompt.data(), static_cast<int64_t>(prompt.size()), l.data());
        int32_t t = sampler.sample(l.data());
        for (int d = 0; d < kDepth; ++d) {
            sampler.accept(t);
            t = s->eval_sample(t, sampler);
            plain[static_cast<size_t>(d)][static_cast<size_t>(t)]++;
        }
    }
    int64_t kept = 0, drafted = 0;
    for (int r = 0; r < kRuns; ++r) {
        p.seed = static_cast<uint64_t>(1000000 + r);
        Sampler sampler(p, V);
        auto ts = make_cpu_session(*model, 32, pool);
        Speculator sp(*ts, std::make_unique<FixedDrafter>(V), 2, p.seed);
        sp.eval(prompt.data(), static_cast<int64_t>(prompt.size()), l.data());
        std::vector<int32_t> seq{sampler.sample(l.data())};
        sampler.accept(seq.back());
        while (static_cast<int>(seq.size()) < kDepth + 1) {
            std::vector<int32_t> got;
            sp.step(seq.back(), sampler, got);
            for (int32_t g : got) {
                sampler.accept(g);
                seq.push_back(g);
            }
        }
        for (int d = 0; d < kDepth; ++d) spec[static_cast<size_t>(d)][static_cast<size_t>(seq[static_cast<size_t>(d + 1)])]++;
        kept += sp.stats().accepted;
        drafted += sp.stats().drafted;
    }
    EXPECT_GT(kept, drafted / 50) << "the drafts must sometimes be kept for the test to mean something";
    EXPECT_LT(kept, drafted) << "and sometimes rejected";
    for (int d = 0; d < kDepth; ++d) {
        const auto [chi, df] = chi_square(plain[static_cast<size_t>(d)], spec[static_cast<size_t>(d)]);
        EXPECT_LT(chi, df + 6.0 * std::sqrt(2.0 * df)) << "token " << d + 2 << ": chi-square " << chi << " on " << df;
        std::printf("%s token %d: chi-square %.1f on %d df (kept %lld of %lld drafts)\n", GetParam().c_str(), d + 2,
                    chi, df, static_cast<long long>(kept), static_cast<long long>(drafted));
    }
}

}  // namespace
}  // namespace quern
