#include "tokenizer/spm.h"

#include <queue>

#include "tokenizer/unicode.h"

namespace quern {

SpmModel::SpmModel(std::function<int32_t(std::string_view)> lookup, const std::vector<float>& scores,
                   const std::array<int32_t, 256>& byte_ids, int32_t unk)
    : lookup_(std::move(lookup)), scores_(scores), byte_ids_(byte_ids), unk_(unk) {}

void SpmModel::encode(std::string_view text, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    struct Sym {
        uint32_t start, len;  // byte range in text; len 0 = merged away
        int32_t prev, next;
    };
    std::vector<Sym> syms;
    syms.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
        const uint32_t n = unicode::utf8_decode(text, i).len;
        const auto k = static_cast<int32_t>(syms.size());
        syms.push_back({static_cast<uint32_t>(i), n, k - 1, k + 1});
        i += n;
    }
    syms.back().next = -1;

    struct Bigram {
        float score;
        int32_t left, right;
        uint32_t len;  // combined length when made; a mismatch means stale
    };
    auto worse = [](const Bigram& a, const Bigram& b) {
        return a.score != b.score ? a.score < b.score : a.left > b.left;
    };
    std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> heap(worse);
    auto consider = [&](int32_t l, int32_t r) {
        if (l < 0 || r < 0) return;
        const uint32_t len = syms[l].len + syms[r].len;
        const int32_t id = lookup_(text.substr(syms[l].start, len));
        if (id < 0) return;
        heap.push({score(id), l, r, len});
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) consider(i, i + 1);

    while (!heap.empty()) {
        const Bigram b = heap.top();
        heap.pop();
        Sym& l = syms[b.left];
        Sym& r = syms[b.right];
        if (l.len == 0 || r.len == 0 || l.next != b.right || l.len + r.len != b.len) continue;
        l.len += r.len;
        l.next = r.next;
        if (r.next >= 0) syms[r.next].prev = b.left;
        r.len = 0;
        consider(l.prev, b.left);
        consider(b.left, l.next);
    }

    for (int32_t i = 0; i >= 0; i = syms[i].next) {
        const std::string_view piece = text.substr(syms[i].start, syms[i].len);
        const int32_t id = lookup_(piece);
        if (id >= 0) {
            out.push_back(id);
            continue;
        }
        // Byte fallback: one <0xNN> per byte; without byte tokens, one unk
        // per character.
        bool all_bytes = true;
        for (char c : piece) all_bytes &= byte_ids_[static_cast<uint8_t>(c)] >= 0;
        if (all_bytes) {
            for (char c : piece) out.push_back(byte_ids_[static_cast<uint8_t>(c)]);
        } else if (unk_ >= 0) {
            out.push_back(unk_);
        }
    }
}

}  // namespace quern
