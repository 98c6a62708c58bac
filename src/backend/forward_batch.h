// A forward pass as the runtime hands it to a backend (backend/executor.h):
// for each sequence its new tokens, where its keys and values live (a block
// table of the executor's paged KV storage), and what it wants back — the
// last token's logits, its most likely next token, or the token a sampling
// chain picks. A Session's decode step is one such pass of one row.
#pragma once
#include <cstdint>

#include "backend/program.h"

namespace quern {

/// The sampling chain a device may run after a pass's last row (penalties →
/// top-k → top-p → min-p → temperature → draw), with the uniform draw u in
/// [0, 1) the host's seeded generator gave for this token.
struct SamplingSpec {
    float temperature = 1.0f;
    int top_k = 0;
    float top_p = 1.0f, min_p = 0.0f;
    float repeat_penalty = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f;
    int repeat_last_n = 0;
    double u = 0.0;
};

/// One sequence's part of a forward pass.
struct SeqBatch {
    const int32_t* tokens = nullptr;       ///< n token ids, at positions n_past .. n_past + n - 1
    int64_t n = 0;
    const int32_t* block_table = nullptr;  ///< the sequence's blocks, covering positions 0 .. n_past + n - 1
    int64_t n_past = 0;                    ///< positions already in the cache
    bool decode = false;                   ///< a generated token rather than prompt tokens (informative: both
                                           ///< are computed alike)
    float* logits = nullptr;               ///< n_vocab floats for the last token, or null
    /// Receives the last token's next token, with or without `logits` (a GPU
    /// then hands over 4 bytes instead of n_vocab floats): the index of the
    /// largest logit (lowest on ties), or with `sampling` the chain's pick.
    int32_t* next = nullptr;
    /// With `next`: the chain to run (Executor::samples_on_device must have
    /// accepted it; only for a pass of one sequence whose tokens from
    /// position 0 all went through this executor, which its penalties read).
    const SamplingSpec* sampling = nullptr;
    /// The sequence's recurrent-state slot (Executor::make_state_slots) for
    /// programs with linear-attention layers; a pass at n_past 0 starts it
    /// from zeros. -1: none (a program without recurrent state).
    int32_t state_slot = -1;
    /// With `logits`: n_vocab floats for every one of the n tokens (n rows)
    /// instead of the last one's — the rows a speculative step verifies.
    bool all_logits = false;
    /// The program's given rows (OpKind::Input: a draft head's trunk hidden
    /// states), n rows; null for programs that read none.
    const float* hidden_in = nullptr;
    /// Receives Program::hidden of every token (n rows of n_embd floats), or
    /// null.
    float* hidden = nullptr;
    /// A lone sequence's pass of at most kMaxRowStateRows rows on an executor
    /// that keeps_row_states(): its recurrent state after each row is kept,
    /// so that Executor::keep_lone_rows can cut the pass back to any of its
    /// rows without evaluating them again (speculative verification).
    bool row_states = false;
};

/// The most rows of a SeqBatch::row_states pass (a round of 16 drafts).
inline constexpr int64_t kMaxRowStateRows = 17;

/// A forward pass of one or more sequences.
struct ForwardBatch {
    const SeqBatch* seqs = nullptr;
    int n_seqs = 0;
    /// true: every row's arithmetic is independent of the rest of the pass
    /// (what else is batched, how a prompt was cut into chunks) — the
    /// serving engine's passes, whose outputs must not depend on load. The
    /// CPU holds this bit for bit; a GPU to its documented tolerance (its
    /// products change form with the pass's rows: the decode step's GEMVs
    /// for one sequence's one row, quantized tensor-core products up to 32
    /// rows, BF16 copies beyond).
    /// false: a lone sequence whose block table is 0, 1, 2, ... (its cache
    /// contiguous from the storage's first row) may take the backend's
    /// fastest kernels for its row count — a Session's passes.
    bool invariant = true;
    /// A pass of one sequence: reports the program's traced values of its
    /// last token (slow; verification only). Null: off.
    const TraceFn* trace = nullptr;
};

}  // namespace quern
