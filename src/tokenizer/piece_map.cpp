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

}  // namespace quern
