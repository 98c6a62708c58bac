// Model: a transformer's weights bound by name and shape, and its forward pass.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/kv_cache.h"

namespace quern {

class GgufFile;

/// Weight types a matrix product may have on the CPU.
const std::vector<DType>& matmul_weight_types();

/// Run-time choices of how a model computes (not what it computes).
struct ModelOptions {
    /// Quantized matmuls see their activations split into an 8-bit part and an
    /// 8-bit residual (two-level quantization), keeping logits within cosine
    /// 0.9999 of a float reference. false: one 8-bit quantization, as llama.cpp
    /// does (faster prefill, cosine ~0.99 on small models).
    bool precise_activations = true;
    /// When > 0: a forward pass of at least this many rows rounds the
    /// activations of its F8_E4M3_B32 matrix products to FP8 E4M3 with one
    /// scale per row (round_fp8_activation_rows, fp8_weights.h), as the CUDA
    /// prefill with --gpu-weights fp8 computes them (FP8 × FP8 on the tensor
    /// cores); smaller passes keep float activations, as the GPU's decode
    /// step does. The reference for `run --verify --gpu-weights fp8`
    /// (Session::fp8_activation_rows). 0: never (the default).
    int64_t fp8_activation_rows = 0;
};

/// Called with a named intermediate tensor of the last position of a forward
/// pass (host floats): "blk.N" is the residual stream after layer N (n_embd
/// floats), "logits" the output (n_vocab floats). Used by --verify to find
/// the first layer where two backends diverge.
using TraceFn = std::function<void(const std::string& name, const float* data, int64_t n)>;

class PagedKvPool;

/// One sequence's part of a batched forward pass (Model::forward_batch).
struct SeqBatch {
    const int32_t* tokens = nullptr;       ///< n token ids, at positions n_past .. n_past + n - 1
    int64_t n = 0;
    const int32_t* block_table = nullptr;  ///< the sequence's blocks, covering positions 0 .. n_past + n - 1
    int64_t n_past = 0;                    ///< positions already in the cache
    bool decode = false;                   ///< a generated token rather than prompt tokens (informative: both
                                           ///< are computed alike)
    float* logits = nullptr;               ///< n_vocab floats for the last token, or null
    /// BatchRunner only: receives the index of the last token's largest
    /// logit (lowest on ties), with or without `logits` (a GPU then hands
    /// over 4 bytes instead of n_vocab floats). Model::forward_batch ignores it.
    int32_t* greedy = nullptr;
};

class Model {
public:
    virtual ~Model() = default;
    const ModelConfig& config() const { return cfg_; }
    const WeightStore& weights() const { return weights_; }
    const ModelOptions& options() const { return opts_; }
    void set_options(const ModelOptions& o) { opts_ = o; }
    /// Makes forward() report intermediate tensors of its last position to
    /// `t` (null: off, the default).
    void set_trace(TraceFn t) { trace_ = std::move(t); }

    /// A KV cache for one sequence of up to n_ctx positions.
    KvCache make_cache(int64_t n_ctx) const { return KvCache(cfg_.n_layer, n_ctx, cfg_.kv_dim()); }

    /// Runs n tokens of one sequence at positions cache.size() .. cache.size()+n-1,
    /// appending their keys/values to `cache`. Writes logits (n_vocab floats per
    /// row) for every token when all_logits, else for the last token only.
    /// Throws quern::Error when the cache would overflow or an id is out of range.
    virtual void forward(const int32_t* tokens, int64_t n, KvCache& cache, float* logits, bool all_logits,
                         ThreadPool& pool) = 0;

    /// Several sequences in one pass over a paged KV cache: the matrix
    /// products of all their rows share one read of the weights; attention
    /// runs per sequence and per query row. Keys and values of the new
    /// positions are written into the sequences' blocks (which the caller
    /// allocated). Batch-invariant: a row's results depend only on its
    /// sequence's tokens, never on the rest of the batch, on how a prompt was
    /// cut into chunks or on whether a token was generated or given in the
    /// prompt — every row goes through the GEMM family of matmul kernels
    /// (cpu::MatmulPath::Gemm), which computes each row alike whatever the
    /// batch, and attention is computed row by row. Throws quern::Error
    /// (before anything is evaluated) for an out-of-range id or a missing
    /// block table; the default implementation throws (architecture without a
    /// batched pass).
    virtual void forward_batch(const SeqBatch* seqs, int n_seqs, PagedKvPool& kv, ThreadPool& pool);

    /// Parameters (elements) and bytes of all weights.
    int64_t n_params() const;
    uint64_t n_bytes() const;

    /// Builds the model described by a GGUF file (kept open by the model).
    static std::unique_ptr<Model> from_gguf(std::shared_ptr<GgufFile> file);
    /// Builds a model from a config and weights made elsewhere (synthetic models).
    static std::unique_ptr<Model> from_weights(const ModelConfig& cfg, WeightStore weights);

protected:
    Model(ModelConfig cfg, WeightStore w) : cfg_(std::move(cfg)), weights_(std::move(w)) {}
    ModelConfig cfg_;
    WeightStore weights_;
    ModelOptions opts_;
    TraceFn trace_;
};

}  // namespace quern
