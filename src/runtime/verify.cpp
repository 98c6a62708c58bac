#include "runtime/verify.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"

namespace quern {

double cosine_similarity(const float* a, const float* b, int64_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (int64_t i = 0; i < n; ++i) {
        ab += static_cast<double>(a[i]) * b[i];
        aa += static_cast<double>(a[i]) * a[i];
        bb += static_cast<double>(b[i]) * b[i];
    }
    if (aa == 0 && bb == 0) return 1.0;
    if (aa == 0 || bb == 0) return 0.0;
    return ab / std::sqrt(aa * bb);
}

VerifyResult verify_sessions(Session& ref, Session& test, const std::vector<int32_t>& tokens, double threshold) {
    if (ref.config().n_vocab != test.config().n_vocab)
        fail("verify: the sessions' vocabularies differ ({} vs {})", ref.config().n_vocab, test.config().n_vocab);
    if (tokens.empty()) fail("verify: no tokens");
    std::vector<std::string> order;
    std::map<std::string, std::vector<float>> a, b;
    const auto collect = [&order](std::map<std::string, std::vector<float>>& into, bool record) {
        return [&into, &order, record](const std::string& name, const float* data, int64_t n) {
            into[name].assign(data, data + n);
            if (record) order.push_back(name);
        };
    };
    const auto n_vocab = static_cast<size_t>(ref.config().n_vocab);
    std::vector<float> la(n_vocab), lb(n_vocab);
    ref.clear();
    test.clear();
    // The prompt but its last token in one pass, then the last token traced
    // on its own (as a GPU session traces it: through its decode step), so
    // that both sides evaluate the same passes.
    const auto n = static_cast<int64_t>(tokens.size());
    if (n > 1) {
        ref.eval(tokens.data(), n - 1, nullptr);
        test.eval(tokens.data(), n - 1, nullptr);
    }
    ref.eval_traced(tokens.data() + n - 1, 1, la.data(), collect(a, true));
    test.eval_traced(tokens.data() + n - 1, 1, lb.data(), collect(b, false));

    VerifyResult r;
    r.threshold = threshold;
    for (const auto& name : order) {
        const auto it = b.find(name);
        if (it == b.end() || it->second.size() != a[name].size()) continue;
        const double c = cosine_similarity(a[name].data(), it->second.data(), static_cast<int64_t>(it->second.size()));
        r.cosines.emplace_back(name, c);
        if (r.first_diverging.empty() && !(c >= threshold)) r.first_diverging = name;
    }
    r.logits_cosine = cosine_similarity(la.data(), lb.data(), static_cast<int64_t>(n_vocab));
    r.argmax_ref = static_cast<int32_t>(std::max_element(la.begin(), la.end()) - la.begin());
    r.argmax_test = static_cast<int32_t>(std::max_element(lb.begin(), lb.end()) - lb.begin());
    r.argmax_gap = static_cast<double>(la[static_cast<size_t>(r.argmax_ref)]) -
                   static_cast<double>(la[static_cast<size_t>(r.argmax_test)]);
    r.ok = r.logits_cosine >= threshold;
    return r;
}

}  // namespace quern
