#include "runtime/paged_kv.h"

#include <new>

#include "core/error.h"

namespace quern {

PagedKvPool::PagedKvPool(int64_t n_layer, int64_t kv_dim, int64_t n_blocks, int64_t block_size, bool host_storage)
    : n_layer_(n_layer), kv_dim_(kv_dim), n_blocks_(n_blocks), block_size_(block_size) {
    if (n_layer <= 0 || kv_dim <= 0 || n_blocks <= 0 || block_size <= 0 || n_blocks > (int64_t{1} << 30))
        fail("paged KV cache: bad sizes (layers {}, kv_dim {}, blocks {}, block size {})", n_layer, kv_dim, n_blocks,
             block_size);
    const auto floats = host_storage ? static_cast<size_t>(n_layer * n_blocks * block_size * kv_dim) : 0;
    try {
        k_.assign(floats, 0.0f);
        v_.assign(floats, 0.0f);
    } catch (const std::bad_alloc&) {
        fail("paged KV cache: cannot allocate {:.2f} GiB for {} blocks of {} positions (lower --kv-tokens or -c)",
             2.0 * static_cast<double>(floats) * 4 / (1 << 30), n_blocks, block_size);
    }
    refs_.assign(static_cast<size_t>(n_blocks), 0);
    lru_pos_.resize(static_cast<size_t>(n_blocks));
    hash_of_.assign(static_cast<size_t>(n_blocks), 0);
    free_.reserve(static_cast<size_t>(n_blocks));
    for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

int32_t PagedKvPool::allocate() {
    int32_t b;
    if (!free_.empty()) {
        b = free_.back();
        free_.pop_back();
    } else if (!lru_.empty()) {
        b = lru_.front();  // evict the least recently used cached prefix block
        forget(b);
    } else {
        return -1;
    }
    refs_[static_cast<size_t>(b)] = 1;
    ++used_;
    return b;
}

void PagedKvPool::forget(int32_t b) {
    const auto i = static_cast<size_t>(b);
    if (hash_of_[i] != 0) {
        by_hash_.erase(hash_of_[i]);
        hash_of_[i] = 0;
        if (refs_[i] == 0) lru_.erase(lru_pos_[i]);
    }
}

void PagedKvPool::ref(int32_t b) {
    const auto i = static_cast<size_t>(b);
    if (refs_[i]++ == 0) {
        ++used_;
        if (hash_of_[i] != 0) lru_.erase(lru_pos_[i]);
    }
}

void PagedKvPool::unref(int32_t b) {
    const auto i = static_cast<size_t>(b);
    if (refs_[i] <= 0) fail("paged KV cache: block {} released more often than taken", b);
    if (--refs_[i] > 0) return;
    --used_;
    if (hash_of_[i] != 0) {
        lru_pos_[i] = lru_.insert(lru_.end(), b);  // stays cached, newest last
    } else {
        free_.push_back(b);
    }
}

int32_t PagedKvPool::lookup(uint64_t hash) {
    const auto it = by_hash_.find(hash);
    if (it == by_hash_.end()) return -1;
    ref(it->second);
    return it->second;
}

void PagedKvPool::publish(int32_t b, uint64_t hash) {
    if (hash == 0) hash = 1;  // 0 marks "not published"
    const auto i = static_cast<size_t>(b);
    if (hash_of_[i] != 0 || by_hash_.count(hash)) return;
    hash_of_[i] = hash;
    by_hash_.emplace(hash, b);
}

uint64_t PagedKvPool::chain_hash(uint64_t parent, const int32_t* tokens, int64_t n) {
    // FNV-1a over the parent hash and the token ids, then a 64-bit finalizer
    // (splitmix64's) to spread the bits.
    uint64_t h = 1469598103934665603ull ^ parent;
    h *= 1099511628211ull;
    for (int64_t i = 0; i < n; ++i) {
        auto t = static_cast<uint32_t>(tokens[i]);
        for (int byte = 0; byte < 4; ++byte, t >>= 8) {
            h ^= t & 0xFFu;
            h *= 1099511628211ull;
        }
    }
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h == 0 ? 1 : h;
}

}  // namespace quern
