// Perplexity as llama.cpp's llama-perplexity (and llama-imatrix) compute it:
// a text is cut into chunks of n_ctx tokens, each evaluated from an empty
// cache, and only the predictions of the second half of each chunk are
// scored, so every scored token has at least n_ctx/2 tokens of context.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/thread_pool.h"

namespace quern {

class Model;
class Tokenizer;

struct PerplexitySum {
    double nll = 0;   ///< Σ −log p(token)
    double nll2 = 0;  ///< Σ log² p(token), for the error estimate
    int64_t count = 0;

    /// Scores rows first .. n−2 of one chunk: row i's logits (n_vocab
    /// floats) predict tokens[i+1].
    void add_chunk(const float* logits, const int32_t* tokens, int64_t n, int64_t n_vocab, int64_t first);
    double ppl() const;
    /// The standard error of ppl(), as llama-perplexity prints it.
    double err() const;
};

/// Runs chunks 0 .. n_chunk−1 of n_ctx tokens of `ids` through `model` on
/// the CPU, each from an empty cache with its first token replaced by BOS
/// when the tokenizer adds one, and scores the second half of each into
/// `sum`; after_chunk(c) follows chunk c (progress). quern::Error when ids
/// hold fewer than n_chunk chunks.
void score_chunks(Model& model, const Tokenizer& tok, const std::vector<int32_t>& ids, int64_t n_ctx, int64_t n_chunk,
                  ThreadPool& pool, PerplexitySum& sum, const std::function<void(int64_t c)>& after_chunk = {});

}  // namespace quern
