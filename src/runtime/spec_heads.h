// The serving engine's draft heads: the model's NextN head (its draft
// program) run for every sequence of the engine in batched passes of its own
// over a paged KV storage that shares the engine's block tables (a
// sequence's blocks hold its keys and values in both), so that speculative
// rounds (runtime/speculative.h) draft for many sequences at once.
//
// Each sequence's head has read the model's rows of positions [0, pos) and
// keeps the rows after them (their hidden states) until the token after
// each is known. A sequence that took blocks from the prefix cache starts at
// their end, reading what the cached blocks' head keys and values are (those
// of the sequence that filled them: the drafts' quality may suffer, never the
// output, which the model verifies).
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "backend/executor.h"
#include "runtime/sampler.h"

namespace quern {

class SpecHeads {
public:
    /// The draft program on `x` (an executor made over it on the engine's
    /// backend: cpu::make_executor, cuda::make_executor with batches), over
    /// n_blocks blocks of block_size positions (the engine's), for n_slots
    /// sequences; n_embd and n_vocab are the model's.
    SpecHeads(std::unique_ptr<Executor> x, int64_t n_embd, int64_t n_vocab, int64_t n_blocks, int64_t block_size,
              int n_slots);

    /// Slot i's head starts over at position pos (a new request, a prefix
    /// taken from the cache, a preempted sequence).
    void reset(int slot, int64_t pos);
    /// The model's rows of slot i's next n positions: their hidden rows.
    void observe(int slot, const float* hidden, int64_t n);

    /// One sequence's part of a drafting phase.
    struct Ask {
        int slot = 0;
        const std::vector<int32_t>* tokens = nullptr;  ///< the sequence's tokens (prompt + generated)
        const int32_t* blocks = nullptr;               ///< its block table (covering the drafts' positions)
        int64_t k = 0;             ///< drafts wanted (0: only read what it can); lowered to 0 when the head
                                   ///< cannot draft (rows missing)
        Sampler* sampler = nullptr;  ///< the chain the drafts are drawn from (history + drafts)
        std::mt19937_64* rng = nullptr;
        std::vector<int32_t>* drafts = nullptr;  ///< receives the k drafts
        std::vector<float>* q_rows = nullptr;    ///< receives their k distributions (n_vocab each)
    };
    /// Every head reads the rows whose next token is known (one batched
    /// pass), then those asked for drafts draw them (k − 1 more passes of
    /// one row each, the head's own hidden row fed back).
    void draft(std::vector<Ask>& asks);

    int64_t pos(int slot) const { return heads_[static_cast<size_t>(slot)].pos; }

private:
    struct Head {
        int64_t pos = 0;
        std::vector<float> pend;   // hidden rows of positions pos, pos + 1, ...
        std::vector<float> chain;  // the last pass's hidden row (the next draft step's input)
        std::vector<float> logits;
        std::vector<float> rows;   // a pass's hidden rows out
        std::vector<int32_t> toks;
    };
    std::unique_ptr<Executor> x_;
    int64_t n_vocab_, n_embd_;
    std::vector<Head> heads_;
};

}  // namespace quern
