// A contiguous per-sequence KV cache: for each layer, one row of K and one of
// V per position (n_head_kv * head_dim floats each). The paged, shared cache of
// the server builds on the same row layout.
#pragma once
#include <cstdint>
#include <vector>

namespace quern {

class KvCache {
public:
    KvCache(int64_t n_layer, int64_t n_ctx, int64_t kv_dim)
        : n_layer_(n_layer), n_ctx_(n_ctx), kv_dim_(kv_dim),
          k_(static_cast<size_t>(n_layer * n_ctx * kv_dim)), v_(k_.size()) {}

    int64_t n_ctx() const { return n_ctx_; }
    int64_t kv_dim() const { return kv_dim_; }
    /// Number of positions filled (the next token goes at position size()).
    int64_t size() const { return n_past_; }
    void set_size(int64_t n) { n_past_ = n; }
    void clear() { n_past_ = 0; }

    float* k(int64_t layer, int64_t pos = 0) { return k_.data() + (layer * n_ctx_ + pos) * kv_dim_; }
    float* v(int64_t layer, int64_t pos = 0) { return v_.data() + (layer * n_ctx_ + pos) * kv_dim_; }
    size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

private:
    int64_t n_layer_, n_ctx_, kv_dim_;
    int64_t n_past_ = 0;
    std::vector<float> k_, v_;
};

}  // namespace quern
