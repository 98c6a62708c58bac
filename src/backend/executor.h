// What a device backend offers the runtime: running a layer program for one
// sequence whose KV cache it keeps (SequenceExecutor), and batched passes of
// many sequences over a paged cache whose storage it keeps
// (BatchExecutor). The runtime's Session and BatchRunner wrap these; the
// backend knows nothing of requests, samplers or models.
#pragma once
#include <cstdint>
#include <string>

#include "backend/forward_batch.h"
#include "backend/program.h"

namespace quern {

/// The sampling chain a device may run after a decode step (penalties →
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

class SequenceExecutor {
public:
    virtual ~SequenceExecutor() = default;
    /// The device's name ("NVIDIA H200", ...).
    virtual std::string device_name() const = 0;
    /// Positions the KV cache holds at most, and holds now.
    virtual int64_t n_ctx() const = 0;
    virtual int64_t size() const = 0;
    /// Keeps the first n positions (n <= size()).
    virtual void truncate(int64_t n) = 0;
    /// Evaluates n tokens (checked by the caller: they fit and are in the
    /// vocabulary) at positions size() .. size()+n-1; when `logits` is not
    /// null, writes the last token's logits (n_vocab floats) to it.
    virtual void eval(const int32_t* tokens, int64_t n, float* logits) = 0;
    /// One token; returns the most likely next token.
    virtual int32_t eval_greedy(int32_t token) = 0;
    /// Whether eval_sample runs this chain on the device.
    virtual bool samples_on_device(const SamplingSpec& s) const = 0;
    /// One token; returns the token the chain picks. Penalties read the
    /// sequence's own tokens (prompt and output).
    virtual int32_t eval_sample(int32_t token, const SamplingSpec& s) = 0;
    /// As eval(), reporting the program's traced values of the last token.
    virtual void eval_traced(const int32_t* tokens, int64_t n, float* logits, const TraceFn& trace) = 0;
    /// Evaluating at least this many tokens at once rounds the layer
    /// matrices' activations to FP8 (ModelOptions::fp8_activation_rows of a
    /// CPU reference); 0: never.
    virtual int64_t fp8_activation_rows() const { return 0; }
};

class BatchExecutor {
public:
    virtual ~BatchExecutor() = default;
    virtual std::string device_name() const = 0;
    /// Storage for a paged cache of n_blocks blocks of block_size positions
    /// (replacing any earlier one). quern::Error naming `flag`, the option
    /// that sized it, when it does not fit.
    virtual void make_kv_storage(int64_t n_blocks, int64_t block_size, const char* flag) = 0;
    /// One batched pass over that storage: the sequences' new tokens, their
    /// keys and values written into their blocks, logits (host floats) or the
    /// greedy token for the sequences that ask. quern::Error (before anything
    /// runs) for an id out of range or a block outside the storage.
    virtual void forward_batch(const SeqBatch* seqs, int n_seqs) = 0;
    /// Passes replayed from CUDA graphs so far (tests and benchmarks).
    virtual int64_t graph_replays() const { return 0; }
};

}  // namespace quern
