#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace quern {

Sampler::Sampler(const SamplingParams& p, int64_t n_vocab) : p_(p), n_vocab_(n_vocab), rng_(p.seed) {
    if (n_vocab <= 0) fail("sampler: vocabulary size must be positive");
    if (p.temperature < 0 || !std::isfinite(p.temperature)) fail("temperature must be >= 0, got {}", p.temperature);
    if (p.top_p <= 0 || p.top_p > 1 || std::isnan(p.top_p)) fail("top-p must be in (0, 1], got {}", p.top_p);
    if (p.min_p < 0 || p.min_p > 1 || std::isnan(p.min_p)) fail("min-p must be in [0, 1], got {}", p.min_p);
    if (p.repeat_penalty <= 0 || !std::isfinite(p.repeat_penalty))
        fail("repeat penalty must be positive, got {}", p.repeat_penalty);
}

void Sampler::reset() {
    history_.clear();
    rng_.seed(p_.seed);
}

double Sampler::draw() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

void Sampler::accept(int32_t token) {
    history_.push_back(token);
    const size_t cap = p_.repeat_last_n < 0 ? SIZE_MAX : static_cast<size_t>(p_.repeat_last_n);
    while (history_.size() > cap) history_.pop_front();
}

int64_t Sampler::candidates(const float* logits, int32_t& pick) {
    const bool penalize = p_.repeat_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
    if (p_.temperature <= 0.0f && !(penalize && !history_.empty())) {
        // Greedy without penalties: the first maximum, as below, without the copy.
        int64_t best = 0;
        for (int64_t i = 1; i < n_vocab_; ++i)
            if (logits[best] < logits[i]) best = i;
        pick = static_cast<int32_t>(best);
        return 0;
    }
    work_.assign(logits, logits + n_vocab_);
    // Penalties over the recent history.
    if (penalize && !history_.empty()) {
        auto& counts = counts_;  // member: keeps its buckets between tokens
        counts.clear();
        for (int32_t t : history_)
            if (t >= 0 && t < n_vocab_) counts[t]++;
        for (const auto& [t, n] : counts) {
            float& l = work_[static_cast<size_t>(t)];
            if (p_.repeat_penalty != 1.0f) l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
            l -= static_cast<float>(n) * p_.frequency_penalty + p_.presence_penalty;
        }
    }
    if (p_.temperature <= 0.0f) {
        pick = static_cast<int32_t>(std::max_element(work_.begin(), work_.end()) - work_.begin());
        return 0;
    }
    cand_.resize(static_cast<size_t>(n_vocab_));
    for (int64_t i = 0; i < n_vocab_; ++i) cand_[static_cast<size_t>(i)] = {static_cast<int32_t>(i), work_[static_cast<size_t>(i)]};
    size_t& n = n_cand_;
    n = cand_.size();
    sorted_ = 0;
    // top-k
    if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
        sort_to(static_cast<size_t>(p_.top_k));
        n = static_cast<size_t>(p_.top_k);
        sorted_ = std::min(sorted_, n);
    }
    sort_to(1);
    // probabilities at temperature 1 for top-p / min-p
    const float mx = cand_[0].logit;
    const auto p1 = [&](size_t i) { return std::exp(cand_[i].logit - mx); };  // float, as the reference chain
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += p1(i);
    if (p_.top_p < 1.0f) {
        double cum = 0.0;
        for (size_t i = 0; i < n; ++i) {
            sort_to(i + 1);
            cum += p1(i) / sum;
            if (cum >= p_.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (p_.min_p > 0.0f) {
        // p1(0) is the maximum (== 1 before normalisation)
        size_t keep = 1;
        while (keep < n) {
            sort_to(keep + 1);
            if (!(p1(keep) >= p_.min_p * 1.0f)) break;
            ++keep;
        }
        n = keep;
    }
    return static_cast<int64_t>(n);
}

void Sampler::sort_to(size_t k) {
    // The chain walks the candidates from the most likely down, but rarely
    // far: the list is sorted on demand, a prefix at a time (doubling, so at
    // most ~log2(n) partial sorts), rather than all n_vocab up front.
    // cand_[0 .. sorted_) is sorted and precedes everything after it.
    const auto by_logit = [](const Cand& a, const Cand& b) {
        return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    };
    const size_t n = n_cand_;
    k = std::min(k, n);
    if (k <= sorted_) return;
    const size_t want = std::min(n, std::max({k, 2 * sorted_, size_t{256}}));
    std::partial_sort(cand_.begin() + static_cast<std::ptrdiff_t>(sorted_),
                      cand_.begin() + static_cast<std::ptrdiff_t>(want),
                      cand_.begin() + static_cast<std::ptrdiff_t>(n), by_logit);
    sorted_ = want;
}

int32_t Sampler::sample(const float* logits) {
    int32_t pick = -1;
    const auto n = static_cast<size_t>(candidates(logits, pick));
    if (n == 0) return pick;
    const float mx = cand_[0].logit;
    // temperature, softmax, draw
    const auto pt = [&](size_t i) { return std::exp((cand_[i].logit - mx) / p_.temperature); };
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) total += pt(i);
    const double r = draw() * total;
    double acc = 0.0;
    size_t last = 0;  // the last candidate with a non-zero weight
    for (size_t i = 0; i < n; ++i) {
        sort_to(i + 1);
        const float w = pt(i);
        acc += w;
        if (w > 0.0f) last = i;
        if (r < acc) return cand_[i].id;
    }
    // r can reach the running sum's end only by rounding (`total` adds the
    // unsorted tail in another order): the least likely candidate that can
    // be drawn.
    return cand_[last].id;
}

void Sampler::distribution(const float* logits, std::vector<float>& probs) {
    probs.assign(static_cast<size_t>(n_vocab_), 0.0f);
    int32_t pick = -1;
    const auto n = static_cast<size_t>(candidates(logits, pick));
    if (n == 0) {
        probs[static_cast<size_t>(pick)] = 1.0f;
        return;
    }
    const float mx = cand_[0].logit;
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) total += std::exp((cand_[i].logit - mx) / p_.temperature);
    for (size_t i = 0; i < n; ++i)
        probs[static_cast<size_t>(cand_[i].id)] =
            static_cast<float>(std::exp((cand_[i].logit - mx) / p_.temperature) / total);
}

}  // namespace quern
