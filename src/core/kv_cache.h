// Host KV-cache layouts the CPU backend reads and writes: a contiguous cache
// of one sequence (KvCache, with its recurrent state when the model has
// linear-attention layers) and the storage of a paged pool shared by many
// (PagedKvStore; the pool's bookkeeping is runtime/paged_kv.h). Both hold
// per layer one row of K and one of V per position (n_head_kv * head_dim
// floats each).
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace quern {

class KvCache {
public:
    /// A cache of its own: n_ctx positions of every layer, and state_floats
    /// of recurrent state (Program::state_floats; linear-attention layers).
    KvCache(int64_t n_layer, int64_t n_ctx, int64_t kv_dim, int64_t state_floats = 0)
        : n_ctx_(n_ctx), kv_dim_(kv_dim), layer_stride_(n_ctx * kv_dim),
          own_k_(static_cast<size_t>(n_layer * n_ctx * kv_dim)), own_v_(own_k_.size()),
          own_state_(static_cast<size_t>(state_floats)), k_(own_k_.data()), v_(own_v_.data()),
          state_(own_state_.data()), state_floats_(state_floats) {}
    /// A view of storage kept elsewhere (a paged pool whose sequence holds
    /// consecutive rows): position p of layer l at k + l · layer_stride +
    /// p · kv_dim (v likewise), p < n_ctx; the recurrent state at `state`.
    KvCache(float* k, float* v, int64_t layer_stride, int64_t n_ctx, int64_t kv_dim, float* state = nullptr,
            int64_t state_floats = 0)
        : n_ctx_(n_ctx), kv_dim_(kv_dim), layer_stride_(layer_stride), k_(k), v_(v), state_(state),
          state_floats_(state_floats) {}
    KvCache(KvCache&& o) noexcept { *this = std::move(o); }
    KvCache& operator=(KvCache&& o) noexcept {
        const bool owned = o.k_ == o.own_k_.data();
        const bool owned_state = o.state_ == o.own_state_.data();
        n_ctx_ = o.n_ctx_, kv_dim_ = o.kv_dim_, layer_stride_ = o.layer_stride_, n_past_ = o.n_past_;
        state_floats_ = o.state_floats_;
        own_k_ = std::move(o.own_k_), own_v_ = std::move(o.own_v_), own_state_ = std::move(o.own_state_);
        k_ = owned ? own_k_.data() : o.k_;
        v_ = owned ? own_v_.data() : o.v_;
        state_ = owned_state ? own_state_.data() : o.state_;
        return *this;
    }

    int64_t n_ctx() const { return n_ctx_; }
    int64_t kv_dim() const { return kv_dim_; }
    /// Number of positions filled (the next token goes at position size()).
    int64_t size() const { return n_past_; }
    void set_size(int64_t n) { n_past_ = n; }
    void clear() { n_past_ = 0; }

    float* k(int64_t layer, int64_t pos = 0) { return k_ + layer * layer_stride_ + pos * kv_dim_; }
    float* v(int64_t layer, int64_t pos = 0) { return v_ + layer * layer_stride_ + pos * kv_dim_; }
    /// The sequence's recurrent state (state_floats() floats; null when none):
    /// it describes positions 0 .. size()-1, so truncating a sequence that has
    /// one means recomputing it (a pass at position 0 starts from zeros).
    float* state() { return state_; }
    int64_t state_floats() const { return state_floats_; }
    /// Bytes this cache owns (0 for a view).
    size_t bytes() const { return (own_k_.size() + own_v_.size() + own_state_.size()) * sizeof(float); }

private:
    int64_t n_ctx_ = 0, kv_dim_ = 0, layer_stride_ = 0;
    int64_t n_past_ = 0;
    std::vector<float> own_k_, own_v_, own_state_;
    float* k_ = nullptr;
    float* v_ = nullptr;
    float* state_ = nullptr;
    int64_t state_floats_ = 0;
};

/// The keys and values of a paged pool in host memory: layer l's K rows start
/// at k + l · layer_stride (V likewise), position p of a sequence with block
/// table t is row t[p / block_size] · block_size + p % block_size.
struct PagedKvStore {
    float* k = nullptr;
    float* v = nullptr;
    int64_t layer_stride = 0;  ///< floats per layer
    int64_t block_size = 0;
    int64_t kv_dim = 0;
    int64_t n_layer = 0;
    /// Recurrent state: n_state_slots slots of state_floats floats (programs
    /// with linear-attention layers; SeqBatch::state_slot picks one).
    float* state = nullptr;
    int64_t state_floats = 0, n_state_slots = 0;
    float* k_layer(int64_t layer) const { return k + layer * layer_stride; }
    float* v_layer(int64_t layer) const { return v + layer * layer_stride; }
    int64_t row(const int32_t* table, int64_t pos) const {
        return table[pos / block_size] * block_size + pos % block_size;
    }
};

}  // namespace quern
