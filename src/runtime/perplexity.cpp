#include "runtime/perplexity.h"

#include <algorithm>
#include <cmath>

namespace quern {

void PerplexitySum::add_chunk(const float* logits, const int32_t* tokens, int64_t n, int64_t n_vocab, int64_t first) {
    for (int64_t i = first; i < n - 1; ++i) {
        const float* l = logits + i * n_vocab;
        const float mx = *std::max_element(l, l + n_vocab);
        double sum = 0;
        for (int64_t v = 0; v < n_vocab; ++v) sum += std::exp(static_cast<double>(l[v]) - mx);
        const double lp = static_cast<double>(l[tokens[i + 1]]) - mx - std::log(sum);
        nll -= lp;
        nll2 += lp * lp;
        ++count;
    }
}

double PerplexitySum::ppl() const { return count ? std::exp(nll / static_cast<double>(count)) : 0.0; }

double PerplexitySum::err() const {
    if (count < 2) return 0.0;
    const double mean = nll / static_cast<double>(count);
    const double var = nll2 / static_cast<double>(count) - mean * mean;
    return ppl() * std::sqrt(std::max(var, 0.0) / static_cast<double>(count - 1));
}

}  // namespace quern
