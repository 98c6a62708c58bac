// A batched forward pass as the serving engine hands it to a backend: for
// each sequence its new tokens, where its keys and values live (a block table
// of a paged cache) and whether it wants the last token's logits.
#pragma once
#include <cstdint>

namespace quern {

/// One sequence's part of a batched forward pass.
struct SeqBatch {
    const int32_t* tokens = nullptr;       ///< n token ids, at positions n_past .. n_past + n - 1
    int64_t n = 0;
    const int32_t* block_table = nullptr;  ///< the sequence's blocks, covering positions 0 .. n_past + n - 1
    int64_t n_past = 0;                    ///< positions already in the cache
    bool decode = false;                   ///< a generated token rather than prompt tokens (informative: both
                                           ///< are computed alike)
    float* logits = nullptr;               ///< n_vocab floats for the last token, or null
    /// Receives the index of the last token's largest logit (lowest on ties),
    /// with or without `logits` (a GPU then hands over 4 bytes instead of
    /// n_vocab floats). The CPU backend ignores it (its runner asks for
    /// logits and picks on the host).
    int32_t* greedy = nullptr;
};

}  // namespace quern
