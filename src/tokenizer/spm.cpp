#include "tokenizer/spm.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace quern {

SpmModel::SpmModel(PieceMap pieces, const std::vector<float>& scores, const std::array<int32_t, 256>& byte_ids,
                   int32_t unk)
    : pieces_(std::move(pieces)), scores_(scores), byte_ids_(byte_ids), unk_(unk) {}

void SpmModel::encode(std::string_view text, std::vector<int32_t>& out, SpmScratch& scratch) const {
    if (text.empty()) return;
    if (cache_.lookup(text, out)) return;
    const size_t start = out.size();
    merge(text, out, scratch);
    cache_.insert(text, out.data() + start, out.size() - start);
}

void SpmModel::merge(std::string_view text, std::vector<int32_t>& out, SpmScratch& scratch) const {
    auto& syms = scratch.syms;
    syms.clear();
    for (size_t i = 0; i < text.size();) {
        const uint32_t n = unicode::utf8_decode(text, i).len;
        const auto k = static_cast<int32_t>(syms.size());
        syms.push_back({static_cast<uint32_t>(i), n, k - 1, k + 1});
        i += n;
    }
    syms.back().next = -1;

    auto& heap = scratch.heap;
    heap.clear();
    auto worse = [](const SpmScratch::Bigram& a, const SpmScratch::Bigram& b) {
        return a.score != b.score ? a.score < b.score : a.left > b.left;
    };
    auto consider = [&](int32_t l, int32_t r) {
        if (l < 0 || r < 0) return;
        const uint32_t len = syms[l].len + syms[r].len;
        const int32_t id = pieces_.find(text.substr(syms[l].start, len));
        if (id < 0) return;
        heap.push_back({score(id), l, r, len, id});
        std::push_heap(heap.begin(), heap.end(), worse);
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) consider(i, i + 1);

    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), worse);
        const SpmScratch::Bigram b = heap.back();
        heap.pop_back();
        SpmScratch::Sym& l = syms[b.left];
        SpmScratch::Sym& r = syms[b.right];
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
        const int32_t id = pieces_.find(piece);
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
