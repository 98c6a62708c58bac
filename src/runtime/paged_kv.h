// A paged KV cache (as in vLLM's PagedAttention, Kwon et al. 2023): one pool
// of fixed-size blocks of positions shared by every sequence, a block table
// per sequence, reference-counted blocks, and a prefix cache that lets a
// prompt starting with the same tokens as an earlier one reuse its blocks.
//
// Storage, per layer: K and V each [n_blocks][block_size][kv_dim] floats, so
// position p of a sequence is row block_table[p / block_size] * block_size +
// p % block_size (PagedKvStore, core/kv_cache.h).
//
// Prefix cache: a full block is identified by a hash chained over all tokens
// from position 0 through the block's end (so equal hashes mean equal
// prefixes, barring 64-bit collisions), published once its keys and values
// are computed. A block whose last reference goes away stays cached (least
// recently used first out) until its memory is needed.
#pragma once
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "core/kv_cache.h"

namespace quern {

class PagedKvPool {
public:
    /// n_blocks blocks of block_size positions for n_layer layers of kv_dim
    /// floats per position (quern::Error for non-positive sizes or an
    /// allocation that fails). host_storage false: the pool only allocates
    /// blocks and keeps the prefix cache; the keys and values live elsewhere
    /// (a GPU's memory, cuda::make_executor) and store() must not be
    /// called.
    PagedKvPool(int64_t n_layer, int64_t kv_dim, int64_t n_blocks, int64_t block_size = 16, bool host_storage = true);

    int64_t block_size() const { return block_size_; }
    int64_t n_blocks() const { return n_blocks_; }
    int64_t kv_dim() const { return kv_dim_; }
    int64_t n_layer() const { return n_layer_; }
    /// Where the keys and values live (host storage only).
    PagedKvStore store() {
        return PagedKvStore{k_.data(), v_.data(), n_blocks_ * block_size_ * kv_dim_, block_size_, kv_dim_, n_layer_};
    }

    /// A block with one reference, or -1 when none is free (cached blocks
    /// without references are evicted first, oldest first).
    int32_t allocate();
    void ref(int32_t b);
    /// Drops a reference; at zero the block is free (or stays cached).
    void unref(int32_t b);
    int32_t refcount(int32_t b) const { return refs_[static_cast<size_t>(b)]; }

    /// The cached block holding the prefix with this hash (one reference
    /// added), or -1.
    int32_t lookup(uint64_t hash);
    /// Whether a block with this prefix hash is cached (no reference taken).
    bool cached(uint64_t hash) const { return by_hash_.count(hash) != 0; }
    /// Publishes block b (computed, referenced) under `hash`; no-op when the
    /// hash is already cached or b already published.
    void publish(int32_t b, uint64_t hash);

    /// Hash of a block of tokens following the prefix hashed as `parent`
    /// (0 for the first block).
    static uint64_t chain_hash(uint64_t parent, const int32_t* tokens, int64_t n);

    /// Blocks with at least one reference.
    int64_t used_blocks() const { return used_; }
    /// Blocks holding a published prefix (referenced or not).
    int64_t cached_blocks() const { return static_cast<int64_t>(by_hash_.size()); }
    /// Blocks allocate() can return now (free or evictable).
    int64_t available_blocks() const { return n_blocks_ - used_; }

private:
    void forget(int32_t b);

    int64_t n_layer_, kv_dim_, n_blocks_, block_size_;
    std::vector<float> k_, v_;
    std::vector<int32_t> refs_;
    std::vector<int32_t> free_;                      // never published or forgotten
    std::list<int32_t> lru_;                         // published, no references; front = oldest
    std::vector<std::list<int32_t>::iterator> lru_pos_;
    std::vector<uint64_t> hash_of_;                  // 0: not published
    std::unordered_map<uint64_t, int32_t> by_hash_;
    int64_t used_ = 0;
};

}  // namespace quern
