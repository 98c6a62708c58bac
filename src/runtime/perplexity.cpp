#include "runtime/perplexity.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

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

void score_chunks(Model& model, const Tokenizer& tok, const std::vector<int32_t>& ids, int64_t n_ctx, int64_t n_chunk,
                  ThreadPool& pool, PerplexitySum& sum, const std::function<void(int64_t c)>& after_chunk) {
    if (n_chunk * n_ctx > static_cast<int64_t>(ids.size()))
        fail("{} tokens hold fewer than {} chunks of {}", ids.size(), n_chunk, n_ctx);
    const int64_t n_vocab = model.config().n_vocab;
    KvCache cache = model.make_cache(n_ctx);
    std::vector<float> logits(static_cast<size_t>(n_ctx * n_vocab));
    for (int64_t c = 0; c < n_chunk; ++c) {
        std::vector<int32_t> chunk(ids.begin() + c * n_ctx, ids.begin() + (c + 1) * n_ctx);
        if (tok.add_bos()) chunk[0] = tok.bos();
        cache.clear();
        model.forward(chunk.data(), n_ctx, cache, logits.data(), true, pool);
        sum.add_chunk(logits.data(), chunk.data(), n_ctx, n_vocab, n_ctx / 2);
        if (after_chunk) after_chunk(c);
    }
}

}  // namespace quern
