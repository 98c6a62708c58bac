#include "tokenizer/piece_map.h"

#include "core/error.h"

namespace quern {

bool PieceMap::insert(std::string_view key, int32_t id) {
    if (id < 0) fail("tokenizer: negative token id {}", id);
    if (arena_.size() + key.size() > UINT32_MAX) fail("tokenizer: vocabulary text is too large");
    if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.empty() ? 1024 : slots_.size() * 2);
    const uint64_t h = hash_bytes(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
        Slot& s = slots_[i];
        if (s.id < 0) {
            s.hash = h;
            s.off = static_cast<uint32_t>(arena_.size());
            s.len = static_cast<uint32_t>(key.size());
            s.id = id;
            arena_.append(key);
            ++size_;
            return true;
        }
        if (s.hash == h && s.len == key.size() && arena_.compare(s.off, s.len, key) == 0) return false;
    }
}

void PieceMap::rehash(size_t n_slots) {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(n_slots, Slot{});
    mask_ = n_slots - 1;
    for (const Slot& s : old) {
        if (s.id < 0) continue;
        size_t i = s.hash & mask_;
        while (slots_[i].id >= 0) i = (i + 1) & mask_;
        slots_[i] = s;
    }
}

bool PairMap::insert(int32_t a, int32_t b, Value v) {
    if (v.rank < 0) fail("tokenizer: negative merge rank");
    if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.empty() ? 1024 : slots_.size() * 2);
    const uint64_t k = key(a, b);
    for (size_t i = slot_of(k);; i = (i + 1) & mask_) {
        Slot& s = slots_[i];
        if (s.v.rank < 0) {
            s.key = k;
            s.v = v;
            ++size_;
            return true;
        }
        if (s.key == k) return false;
    }
}

void PairMap::rehash(size_t n_slots) {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(n_slots, Slot{});
    mask_ = n_slots - 1;
    for (const Slot& s : old) {
        if (s.v.rank < 0) continue;
        size_t i = slot_of(s.key);
        while (slots_[i].v.rank >= 0) i = (i + 1) & mask_;
        slots_[i] = s;
    }
}

WordCache::WordCache(size_t max_words) : per_shard_(max_words / kShards), n_slots_(1) {
    while (n_slots_ < per_shard_ * 2) n_slots_ *= 2;
}

void WordCache::reset(Shard& sh, size_t n_slots) {
    sh.slots.assign(n_slots, Slot{});
    sh.keys.clear();
    sh.ids.clear();
    sh.count = 0;
}

bool WordCache::lookup(std::string_view word, std::vector<int32_t>& out) const {
    if (!per_shard_ || word.size() > kMaxWordBytes) return false;
    const uint64_t h = hash_bytes(word);
    Shard& sh = shards_[(h >> 56) % kShards];
    std::lock_guard<std::mutex> lock(sh.mu);
    if (sh.slots.empty()) return false;
    const size_t mask = sh.slots.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const Slot& s = sh.slots[i];
        if (!s.used) return false;
        if (s.hash == h && s.key_len == word.size() &&
            std::memcmp(sh.keys.data() + s.key_off, word.data(), word.size()) == 0) {
            out.insert(out.end(), sh.ids.begin() + s.ids_off, sh.ids.begin() + s.ids_off + s.ids_len);
            return true;
        }
    }
}

void WordCache::insert(std::string_view word, const int32_t* ids, size_t n) const {
    if (!per_shard_ || word.size() > kMaxWordBytes || n > UINT32_MAX) return;
    const uint64_t h = hash_bytes(word);
    Shard& sh = shards_[(h >> 56) % kShards];
    std::lock_guard<std::mutex> lock(sh.mu);
    if (sh.slots.empty() || sh.count >= per_shard_ || sh.ids.size() + n > UINT32_MAX / 2) reset(sh, n_slots_);
    const size_t mask = sh.slots.size() - 1;
    size_t i = h & mask;
    for (;; i = (i + 1) & mask) {
        const Slot& s = sh.slots[i];
        if (!s.used) break;
        if (s.hash == h && s.key_len == word.size() &&
            std::memcmp(sh.keys.data() + s.key_off, word.data(), word.size()) == 0)
            return;  // another thread was first
    }
    Slot& s = sh.slots[i];
    s = {h, static_cast<uint32_t>(sh.keys.size()), static_cast<uint32_t>(word.size()),
         static_cast<uint32_t>(sh.ids.size()), static_cast<uint32_t>(n), true};
    sh.keys.append(word);
    sh.ids.insert(sh.ids.end(), ids, ids + n);
    ++sh.count;
}

void WordCache::clear() const {
    for (Shard& sh : shards_) {
        std::lock_guard<std::mutex> lock(sh.mu);
        reset(sh, 0);
    }
}

}  // namespace quern
