#include "tokenizer/bpe.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace quern {

BpeModel::BpeModel(PieceMap vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                   const std::array<int32_t, 256>& byte_tokens, BpeOptions opts)
    : vocab_(std::move(vocab)), byte_tokens_(byte_tokens), opts_(opts) {
    for (int b = 0; b < 256; ++b) {
        const char c = static_cast<char>(b);
        byte_id_[b] = vocab_.find(std::string_view(&c, 1));
    }
    std::string joined;
    for (size_t r = 0; r < merges.size(); ++r) {
        const auto& [left, right] = merges[r];
        const int32_t a = vocab_.find(left), b = vocab_.find(right);
        if (a < 0 || b < 0) continue;
        joined.assign(left);
        joined.append(right);
        const int32_t c = vocab_.find(joined);
        if (c < 0) continue;
        // The first (lowest-rank) occurrence of a pair wins.
        merges_.insert(a, b, {static_cast<int32_t>(r), c});
    }
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out, BpeScratch& scratch) const {
    if (word.empty()) return;
    if (cache_.lookup(word, out)) return;
    const size_t start = out.size();
    merge(word, out, scratch);
    cache_.insert(word, out.data() + start, out.size() - start);
}

void BpeModel::merge(std::string_view word, std::vector<int32_t>& out, BpeScratch& scratch) const {
    if (opts_.ignore_merges) {
        const int32_t whole = vocab_.find(word);
        if (whole >= 0) {
            out.push_back(whole);
            return;
        }
    }

    // Initial symbols. A character with no token falls back to byte tokens,
    // else to unk (fused when asked), else it is dropped before merging, so
    // its neighbours can merge with each other (as Hugging Face does). A
    // pending unk is placed when the next known character comes (also HF).
    auto& syms = scratch.syms;
    syms.clear();
    int32_t pending_unk_len = 0;
    auto add = [&](int32_t id, uint32_t len) {
        const auto n = static_cast<int32_t>(syms.size());
        syms.push_back({id, n - 1, n + 1, len});
    };
    auto flush_unk = [&] {
        if (pending_unk_len) add(opts_.unk, static_cast<uint32_t>(pending_unk_len));
        pending_unk_len = 0;
    };
    auto unknown = [&](uint32_t len) {
        if (opts_.unk < 0) return;
        if (pending_unk_len && !opts_.fuse_unk) flush_unk();
        pending_unk_len += static_cast<int32_t>(len);
    };
    if (opts_.byte_level) {
        for (char ch : word) {
            const int32_t id = byte_id_[static_cast<uint8_t>(ch)];
            if (id >= 0) {
                flush_unk();
                add(id, 1);
            } else {
                unknown(1);
            }
        }
    } else {
        for (size_t i = 0; i < word.size();) {
            const uint32_t len = unicode::utf8_decode(word, i).len;
            const int32_t id = vocab_.find(word.substr(i, len));
            if (id >= 0) {
                flush_unk();
                add(id, len);
            } else {
                bool done = false;
                if (opts_.byte_fallback) {
                    done = true;
                    for (uint32_t k = 0; k < len; ++k) done &= byte_tokens_[static_cast<uint8_t>(word[i + k])] >= 0;
                    if (done)
                        for (uint32_t k = 0; k < len; ++k) add(byte_tokens_[static_cast<uint8_t>(word[i + k])], 1);
                }
                if (!done) unknown(len);
            }
            i += len;
        }
    }
    flush_unk();
    if (syms.empty()) return;
    syms.back().next = -1;

    if (syms.size() > 1) {
        auto& heap = scratch.heap;
        heap.clear();
        auto worse = [](const BpeScratch::Cand& x, const BpeScratch::Cand& y) {
            return x.rank != y.rank ? x.rank > y.rank : x.left > y.left;
        };
        auto consider = [&](int32_t l, int32_t r) {
            if (l < 0 || r < 0) return;
            const PairMap::Value m = merges_.find(syms[l].id, syms[r].id);
            if (m.rank < 0) return;
            heap.push_back({m.rank, l, r, syms[l].id, syms[r].id, m.id});
            std::push_heap(heap.begin(), heap.end(), worse);
        };
        for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) consider(i, i + 1);
        while (!heap.empty()) {
            std::pop_heap(heap.begin(), heap.end(), worse);
            const BpeScratch::Cand c = heap.back();
            heap.pop_back();
            BpeScratch::Sym& l = syms[c.left];
            // Stale when either side has merged since the candidate was made.
            if (l.id != c.left_id || l.next != c.right || syms[c.right].id != c.right_id) continue;
            BpeScratch::Sym& r = syms[c.right];
            l.id = c.merged;
            l.len += r.len;
            l.next = r.next;
            if (r.next >= 0) syms[r.next].prev = c.left;
            r.id = -2;  // dead
            r.prev = r.next = -1;
            consider(l.prev, c.left);
            consider(c.left, l.next);
        }
    }
    for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

}  // namespace quern
