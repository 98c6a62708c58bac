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
};

/// Called with a named intermediate tensor of the last position of a forward
/// pass (host floats): "blk.N" is the residual stream after layer N (n_embd
/// floats), "logits" the output (n_vocab floats). Used by --verify to find
/// the first layer where two backends diverge.
using TraceFn = std::function<void(const std::string& name, const float* data, int64_t n)>;

/// One sequence's part of a batched forward pass (Model::forward_batch).
struct SeqBatch {
    const int32_t* tokens = nullptr;  ///< n token ids, evaluated at positions cache->size() ..
    int64_t n = 0;
    KvCache* cache = nullptr;         ///< the sequence's cache; the n new keys/values are appended
    float* logits = nullptr;          ///< n_vocab floats for the last token, or null
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

    /// Several sequences in one pass: the matrix products of all their rows
    /// share one read of the weights; attention runs per sequence.
    /// Batch-invariant: a sequence's results do not depend on what else is in
    /// the batch — rows of one-token entries (decode) always use the GEMV
    /// kernels, rows of longer entries (prompt chunks) the GEMM kernels, and
    /// every kernel computes each row independently — so a request gives the
    /// same tokens alone or among others, provided its prompt is cut into the
    /// same chunks. Entries with n == 1 must come first. Throws quern::Error
    /// (before anything is evaluated) when a cache would overflow, an id is
    /// out of range, or the order is violated.
    virtual void forward_batch(const SeqBatch* seqs, int n_seqs, ThreadPool& pool);

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
