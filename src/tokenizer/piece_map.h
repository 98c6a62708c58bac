// Lookup structures of the tokenizer models: open-addressing hash maps for
// piece text -> id and (left id, right id) -> merge, and a thread-safe cache
// of encoded words. Lookups allocate nothing.
#pragma once
#include <array>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace quern {

/// 64-bit hash of a byte string (multiply-mix over 8-byte words).
inline uint64_t hash_bytes(std::string_view s) {
    constexpr uint64_t k1 = 0x9E3779B97F4A7C15ull, k2 = 0xBF58476D1CE4E5B9ull;
    uint64_t h = k1 ^ (s.size() * k2);
    const char* p = s.data();
    size_t n = s.size();
    while (n >= 8) {
        uint64_t v;
        std::memcpy(&v, p, 8);
        h = (h ^ (v * k2)) * k1;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    if (n) {
        uint64_t v = 0;
        std::memcpy(&v, p, n);
        h = (h ^ (v * k2)) * k1;
    }
    h ^= h >> 32;
    h *= k2;
    h ^= h >> 29;
    return h;
}

/// Byte string -> non-negative id. Built once, then read from any thread.
class PieceMap {
public:
    /// Adds `key` unless present (the first id for a key wins); false when present.
    bool insert(std::string_view key, int32_t id);
    /// The id of `key`, or -1.
    int32_t find(std::string_view key) const {
        if (slots_.empty()) return -1;
        const uint64_t h = hash_bytes(key);
        for (size_t i = h & mask_;; i = (i + 1) & mask_) {
            const Slot& s = slots_[i];
            if (s.id < 0) return -1;
            if (s.hash == h && s.len == key.size() && std::memcmp(arena_.data() + s.off, key.data(), key.size()) == 0)
                return s.id;
        }
    }
    size_t size() const { return size_; }
    /// Calls fn(key, id) for every entry.
    template <class Fn>
    void for_each(Fn&& fn) const {
        for (const Slot& s : slots_)
            if (s.id >= 0) fn(std::string_view(arena_.data() + s.off, s.len), s.id);
    }

private:
    struct Slot {
        uint64_t hash = 0;
        uint32_t off = 0, len = 0;
        int32_t id = -1;
    };
    void rehash(size_t n_slots);
    std::string arena_;
    std::vector<Slot> slots_;
    size_t mask_ = 0, size_ = 0;
};

/// (left id, right id) -> (rank, merged id). Built once, then read from any thread.
class PairMap {
public:
    struct Value {
        int32_t rank = -1;
        int32_t id = -1;
    };
    static uint64_t key(int32_t a, int32_t b) {
        return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    }
    /// Adds the pair unless present (the lowest rank, inserted first, wins).
    bool insert(int32_t a, int32_t b, Value v);
    /// The merge of (a, b); rank -1 when there is none.
    Value find(int32_t a, int32_t b) const {
        if (slots_.empty()) return {};
        const uint64_t k = key(a, b);
        for (size_t i = slot_of(k);; i = (i + 1) & mask_) {
            const Slot& s = slots_[i];
            if (s.v.rank < 0) return {};
            if (s.key == k) return s.v;
        }
    }
    size_t size() const { return size_; }

private:
    struct Slot {
        uint64_t key = 0;
        Value v;
    };
    size_t slot_of(uint64_t k) const { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 20) & mask_; }
    void rehash(size_t n_slots);
    std::vector<Slot> slots_;
    size_t mask_ = 0, size_ = 0;
};

/// Word -> ids memo shared by all threads using one tokenizer. Sharded, each
/// shard an open-addressing table with its keys and ids in two arenas, behind
/// its own mutex; a full shard is simply emptied (bounded memory).
class WordCache {
public:
    /// `max_words`: total capacity; 0 disables the cache.
    explicit WordCache(size_t max_words = 1 << 16);

    /// Appends the cached ids of `word` to `out`; false when not cached.
    bool lookup(std::string_view word, std::vector<int32_t>& out) const;
    /// Remembers the ids of `word`.
    void insert(std::string_view word, const int32_t* ids, size_t n) const;
    /// Forgets everything (for benchmarks of the uncached path).
    void clear() const;

private:
    static constexpr size_t kShards = 16;
    static constexpr size_t kMaxWordBytes = 256;
    struct Slot {
        uint64_t hash = 0;
        uint32_t key_off = 0, key_len = 0, ids_off = 0, ids_len = 0;
        bool used = false;
    };
    struct Shard {
        std::mutex mu;
        std::vector<Slot> slots;
        std::string keys;
        std::vector<int32_t> ids;
        size_t count = 0;
    };
    static void reset(Shard& sh, size_t n_slots);
    size_t per_shard_;
    size_t n_slots_;
    mutable std::array<Shard, kShards> shards_;
};

}  // namespace quern
