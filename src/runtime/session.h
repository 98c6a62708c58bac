// Session: one sequence being evaluated on one backend — the model's weights
// as that backend holds them, the sequence's KV cache, and the scratch of a
// forward pass. The command-line tools drive generation through it, so the
// same loop runs on the CPU and on a GPU.
#pragma once
#include <cstdint>
#include <functional>
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
    virtual ~Session() = default;
    virtual const ModelConfig& config() const = 0;
    /// "CPU" or the GPU's name.
    virtual std::string backend_name() const = 0;
    /// Positions the KV cache holds at most.
    virtual int64_t n_ctx() const = 0;
    /// Positions filled (the next token goes at position size()).
    virtual int64_t size() const = 0;
    /// Forgets the sequence (the cache becomes empty).
    void clear() { truncate(0); }
    /// Keeps the first n positions (n <= size()) and forgets the rest, e.g.
    /// to reuse a shared prefix of the next prompt.
    virtual void truncate(int64_t n) = 0;

    /// Evaluates n tokens at positions size() .. size()+n-1; when `logits` is
    /// not null, writes the last token's logits (n_vocab floats) to it.
    /// Throws quern::Error when the cache would overflow or an id is out of
    /// the vocabulary (nothing is evaluated then).
    virtual void eval(const int32_t* tokens, int64_t n, float* logits) = 0;

    /// Evaluates one token and returns the most likely next token (greedy),
    /// without handing logits to the host where the backend can avoid it.
    virtual int32_t eval_greedy(int32_t token);

    /// Evaluates one token and returns the next token chosen by `sampler`
    /// (its parameters and generator; the caller accept()s tokens as usual,
    /// the token passed here included). The default evaluates on the
    /// backend and samples on the host; a GPU session runs the same chain on
    /// the device where it can (cuda::sample_token) and hands only the id
    /// over. Its penalties then read the session's own tokens, so the sampler
    /// must have accepted exactly the sequence's tokens (prompt and output).
    virtual int32_t eval_sample(int32_t token, Sampler& sampler);

    /// As eval(), calling `trace` with the intermediate tensors of the last
    /// token (see TraceFn in model.h). Slow; for verification only.
    virtual void eval_traced(const int32_t* tokens, int64_t n, float* logits, const TraceFn& trace) = 0;

    /// Evaluating at least this many tokens at once rounds the activations of
    /// the layer matrices to FP8 E4M3 per token (the CUDA prefill with
    /// --gpu-weights fp8); 0: never. A CPU reference for this session sets
    /// ModelOptions::fp8_activation_rows to it.
    virtual int64_t fp8_activation_rows() const { return 0; }

protected:
    /// Checks that n tokens fit and are in the vocabulary (quern::Error if not).
    void check_tokens(const int32_t* tokens, int64_t n) const;
    std::vector<float> greedy_logits_;  ///< eval_greedy's buffer, kept between tokens
};

/// A session on the CPU backend: `model` and `pool` must outlive it.
std::unique_ptr<Session> make_cpu_session(Model& model, int64_t n_ctx, ThreadPool& pool);

/// A session on a device backend's executor (cuda::make_sequence_executor
/// over model.program()); `model` must outlive it. Tokens are checked here;
/// sampling runs on the device where the executor can run the sampler's
/// chain (SequenceExecutor::samples_on_device), with the sampler's own
/// seeded draws, else on the host.
std::unique_ptr<Session> make_executor_session(const Model& model, std::unique_ptr<SequenceExecutor> executor);

}  // namespace quern
