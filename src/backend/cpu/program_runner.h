// The CPU backend of a layer program (backend/program.h): it interprets the
// program op by op with the CPU kernels (matmul.h, ops.h), over the KV cache
// of one sequence (forward) or a paged cache shared by many (forward_batch).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/forward_batch.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/op_profile.h"
#include "backend/program.h"
#include "core/kv_cache.h"
#include "core/thread_pool.h"

namespace quern::cpu {

class ProgramRunner {
public:
    /// `program` (and the tensors it names) must outlive the runner.
    /// quern::Error when an op's input has a layout the interpreter cannot
    /// read (never for the programs of model/arch/).
    explicit ProgramRunner(const Program& program);
    ~ProgramRunner();
    ProgramRunner(const ProgramRunner&) = delete;
    ProgramRunner& operator=(const ProgramRunner&) = delete;

    void set_options(const ModelOptions& o) { opts_ = o; }
    /// Reports the program's traced values of forward()'s last position to
    /// `t` (null: off).
    void set_trace(TraceFn t) { trace_ = std::move(t); }
    /// Shows every matrix product's input rows to `f` (null: off).
    void set_activation_observer(ActivationFn f) { observe_ = std::move(f); }
    /// Times every op of every pass into `p` (null: off, the default); `p`
    /// must outlive the runner or be unset first.
    void set_profile(OpProfile* p) { profile_ = p; }

    /// Runs n tokens of one sequence at positions cache.size() ..
    /// cache.size()+n-1, appending their keys/values to `cache`, in passes of
    /// up to 512 tokens. Writes logits (n_vocab floats per row) for every
    /// token when all_logits, else for the last token only. Matrix products
    /// take the fastest kernel for each pass's row count (MatmulPath::Auto).
    /// quern::Error (before anything is evaluated) when the cache would
    /// overflow, its row size is not the program's or an id is out of range.
    /// hidden_in: the rows of the program's Input op (n rows); hidden_out:
    /// receives Program::hidden of every token (n rows of its width).
    void forward(const int32_t* tokens, int64_t n, KvCache& cache, float* logits, bool all_logits, ThreadPool& pool,
                 const float* hidden_in = nullptr, float* hidden_out = nullptr);

    /// Several sequences in one pass over a paged cache: the matrix products
    /// of all their rows share one read of the weights; attention runs per
    /// sequence and per query row. Keys and values of the new positions are
    /// written into the sequences' blocks (which the caller allocated).
    /// Batch-invariant: a row's results depend only on its sequence's tokens,
    /// never on the rest of the batch, on how a prompt was cut into chunks or
    /// on whether a token was generated or given in the prompt — every row
    /// goes through the GEMM family of matmul kernels (MatmulPath::Gemm) and
    /// attention is computed row by row. quern::Error (before anything is
    /// evaluated) for an out-of-range id, a missing block table or a store of
    /// another shape.
    void forward_batch(const SeqBatch* seqs, int n_seqs, const PagedKvStore& kv, ThreadPool& pool);

private:
    struct Pass;
    struct State;
    void run(Pass& pass, ThreadPool& pool);
    /// Value v's n rows as one row-major array: its slot, or its pieces
    /// gathered into scratch buffer `which` (0 or 1).
    const float* gather(Value v, int64_t n, int which);
    void run_attention(const Op& op, Pass& pass, ThreadPool& pool);
    void run_moe(const Op& op, Pass& pass, ThreadPool& pool);
    /// The gated delta rule of a DeltaNet op over the pass's rows, in order,
    /// on the sequence's recurrent state.
    void run_delta_net(const Op& op, Pass& pass, ThreadPool& pool);
    /// y = x · Wᵀ over `rows` rows with ModelOptions' activation handling
    /// (two-level activations, FP8 rounding); `same_input` reuses the
    /// previous call's split of x (the pieces of one Linear op).
    void mm(const Tensor& W, const float* x, int64_t rows, float* y, int64_t ldy, ThreadPool& pool, bool same_input,
            MatmulPath path, bool fp8_act);

    const Program& p_;
    ModelOptions opts_;
    TraceFn trace_;
    ActivationFn observe_;
    OpProfile* profile_ = nullptr;
    std::unique_ptr<State> st_;  // the compiled plan, value slots and scratch (program_runner.cpp)
};

}  // namespace quern::cpu
