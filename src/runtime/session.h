// Session: one sequence being evaluated on one backend's Executor — the
// model's weights as that backend holds them, the sequence's KV cache (a
// paged storage the sequence owns whole, its blocks 0, 1, 2, ...) and the
// scratch of a forward pass. Each call is one ForwardBatch of this sequence
// (a decode step: one row), marked non-invariant so that the backend takes
// its fastest kernels for the row count. The command-line tools drive
// generation through it, so the same loop runs on the CPU and on a GPU.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/executor.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "runtime/sampler.h"

namespace quern {

class Session {
public:
    /// A session of up to n_ctx positions on `executor` (which makes the
    /// storage; a memory budget it was given may lower n_ctx). quern::Error
    /// naming `flag` when not even one position fits.
    Session(const ModelConfig& cfg, std::unique_ptr<Executor> executor, int64_t n_ctx, const char* flag = "-c");

    const ModelConfig& config() const { return cfg_; }
    /// "CPU" or the GPU's name.
    std::string backend_name() const { return x_->device_name(); }
    /// Positions the KV cache holds at most.
    int64_t n_ctx() const { return n_ctx_; }
    /// Positions filled (the next token goes at position size()).
    int64_t size() const { return n_past_; }
    /// Forgets the sequence (the cache becomes empty).
    void clear() { truncate(0); }
    /// Keeps the first n positions (n <= size()) and forgets the rest, e.g.
    /// to reuse a shared prefix of the next prompt.
    /// A model with recurrent (linear-attention) state recomputes the kept
    /// positions from the tokens the session saw: its state cannot be rolled
    /// back.
    void truncate(int64_t n);

    /// Evaluates n tokens at positions size() .. size()+n-1; when `logits` is
    /// not null, writes the last token's logits (n_vocab floats) to it.
    /// Throws quern::Error when the cache would overflow or an id is out of
    /// the vocabulary (nothing is evaluated then).
    void eval(const int32_t* tokens, int64_t n, float* logits);

    /// Evaluates one token and returns the most likely next token (greedy),
    /// without handing logits to the host where the backend can avoid it.
    int32_t eval_greedy(int32_t token);

    /// Evaluates one token and returns the next token chosen by `sampler`
    /// (its parameters and generator; the caller accept()s tokens as usual,
    /// the token passed here included). Where the executor runs the chain
    /// (Executor::samples_on_device: a GPU, cuda::sample_token) only the id
    /// comes back, and its penalties read the session's own tokens, so the
    /// sampler must have accepted exactly the sequence's tokens (prompt and
    /// output); else the host samples the logits.
    int32_t eval_sample(int32_t token, Sampler& sampler);

    /// Evaluates n tokens as eval() does, with what a speculative step needs:
    /// `logits` (when not null) receives n_vocab floats for every one of the
    /// n tokens when all_logits, else for the last; `hidden` (when not null)
    /// the program's hidden rows (Program::hidden, n_embd floats each) of
    /// every token; `hidden_in` gives the rows of a program that reads some
    /// (a NextN draft head: n rows of n_embd). On the GPU such a pass goes
    /// through the batched rows path whatever n (quern::Error for a model
    /// without one: a weight type with no GPU GEMM).
    /// row_states (where keeps_row_states(), at most kMaxRowStateRows
    /// tokens): the pass keeps its recurrent state after each token, for
    /// keep_rows.
    void eval_rows(const int32_t* tokens, int64_t n, float* logits, bool all_logits, float* hidden,
                   const float* hidden_in = nullptr, bool row_states = false);
    /// Whether eval_rows takes row_states: a model with recurrent state on a
    /// backend that keeps them (the GPU).
    bool keeps_row_states() const { return cfg_.has_recurrent_state() && x_->keeps_row_states(); }
    /// Right after an eval_rows with row_states of n tokens: keeps the first
    /// m of them (1 <= m <= n) and forgets the rest, recurrent state
    /// included, without evaluating anything again. quern::Error otherwise.
    void keep_rows(int64_t m);

    /// Remembers the sequence as it is (its length, and a model with
    /// recurrent state its state) so that back_to_save_point() can return to
    /// it after tokens that turned out not to belong (rejected drafts):
    /// attention forgets positions for free, the recurrent state is copied.
    void save_point();
    void back_to_save_point();

    /// As eval(), calling `trace` with the intermediate tensors of the last
    /// token (see TraceFn in backend/program.h). Slow; for verification only.
    void eval_traced(const int32_t* tokens, int64_t n, float* logits, const TraceFn& trace);

    /// Evaluating at least this many tokens at once rounds the activations of
    /// the layer matrices to FP8 E4M3 per token (the CUDA prefill with
    /// --gpu-weights fp8); 0: never. A CPU reference for this session sets
    /// ModelOptions::fp8_activation_rows to it.
    int64_t fp8_activation_rows() const { return x_->fp8_activation_rows(); }

private:
    /// Checks that n tokens fit and are in the vocabulary (quern::Error if not).
    void check_tokens(const int32_t* tokens, int64_t n) const;
    /// One pass of n tokens at size(); then size() += n.
    void run(const int32_t* tokens, int64_t n, float* logits, int32_t* next, const SamplingSpec* sampling,
             const TraceFn* trace, SeqBatch rows = {});

    ModelConfig cfg_;
    std::unique_ptr<Executor> x_;
    int64_t n_ctx_ = 0, n_past_ = 0;
    std::vector<int32_t> table_;  // 0, 1, 2, ...: the whole storage, in order
    std::vector<float> logits_;   // eval_sample's host logits, kept between tokens
    std::vector<int32_t> history_;  // the sequence's tokens (recurrent models: truncate replays them)
    int64_t saved_n_past_ = -1;     // save_point()'s length (-1: none)
    int64_t rows_pos_ = -1, rows_n_ = 0;  // the last row_states pass: its first position and tokens
};

/// A session on the CPU backend (cpu::make_executor with the model's
/// options): `model` and `pool` must outlive it. profile: the time of every
/// op, printed to stderr when the session ends (--cpu-profile).
std::unique_ptr<Session> make_cpu_session(Model& model, int64_t n_ctx, ThreadPool& pool, bool profile = false);

/// A session on a device backend's executor (cuda::make_executor over
/// model.program()); `model` must outlive it.
std::unique_ptr<Session> make_executor_session(const Model& model, std::unique_ptr<Executor> executor, int64_t n_ctx);

}  // namespace quern
