#include "tokenizer/bpe.h"

#include <queue>

#include "tokenizer/unicode.h"

namespace quern {

BpeModel::BpeModel(std::function<int32_t(std::string_view)> lookup, const std::vector<std::string>& merges,
                   int32_t unk, bool ignore_merges)
    : lookup_(std::move(lookup)), unk_(unk), ignore_merges_(ignore_merges) {
    const auto& bm = unicode::ByteMap::get();
    for (int b = 0; b < 256; ++b) byte_id_[b] = lookup_(bm.byte_to_utf8(static_cast<uint8_t>(b)));
    merges_.reserve(merges.size());
    std::string joined;
    for (size_t r = 0; r < merges.size(); ++r) {
        const std::string& m = merges[r];
        const size_t sp = m.find(' ', 1);
        if (sp == std::string::npos) continue;
        const std::string_view left(m.data(), sp), right(m.data() + sp + 1, m.size() - sp - 1);
        const int32_t a = lookup_(left), b = lookup_(right);
        if (a < 0 || b < 0) continue;
        joined.assign(left);
        joined.append(right);
        const int32_t c = lookup_(joined);
        if (c < 0) continue;
        // The first (lowest-rank) occurrence of a pair wins.
        merges_.try_emplace(key(a, b), Merge{static_cast<int32_t>(r), c});
    }
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
    if (word.empty()) return;
    if (ignore_merges_) {
        const int32_t whole = lookup_(word);
        if (whole >= 0) {
            out.push_back(whole);
            return;
        }
    }
    const auto& bm = unicode::ByteMap::get();

    // Initial symbols: one per character.
    struct Sym {
        int32_t id;
        int32_t prev, next;
    };
    std::vector<Sym> syms;
    syms.reserve(word.size());
    for (size_t i = 0; i < word.size();) {
        const unicode::Utf8Char c = unicode::utf8_decode(word, i);
        const int byte = c.valid ? bm.cp_to_byte(c.cp) : -1;
        const int32_t id = byte >= 0 ? byte_id_[byte] : lookup_(word.substr(i, c.len));
        i += c.len;
        // Without <unk>, a character with no token is dropped before merging,
        // so its neighbours can merge with each other (as Hugging Face does).
        if (id < 0 && unk_ < 0) continue;
        const auto n = static_cast<int32_t>(syms.size());
        syms.push_back({id, n - 1, n + 1});
    }
    if (syms.empty()) return;
    syms.back().next = -1;

    if (syms.size() > 1) {
        struct Cand {
            int32_t rank, left, right, left_id, right_id, merged;
        };
        auto worse = [](const Cand& x, const Cand& y) {
            return x.rank != y.rank ? x.rank > y.rank : x.left > y.left;
        };
        std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
        auto consider = [&](int32_t l, int32_t r) {
            if (l < 0 || r < 0 || syms[l].id < 0 || syms[r].id < 0) return;
            auto it = merges_.find(key(syms[l].id, syms[r].id));
            if (it == merges_.end()) return;
            heap.push({it->second.rank, l, r, syms[l].id, syms[r].id, it->second.id});
        };
        for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) consider(i, i + 1);
        while (!heap.empty()) {
            const Cand c = heap.top();
            heap.pop();
            Sym& l = syms[c.left];
            // Stale when either side has merged since the candidate was made.
            if (l.id != c.left_id || l.next != c.right || syms[c.right].id != c.right_id) continue;
            Sym& r = syms[c.right];
            l.id = c.merged;
            l.next = r.next;
            if (r.next >= 0) syms[r.next].prev = c.left;
            r.id = -2;  // dead
            r.prev = r.next = -1;
            consider(l.prev, c.left);
            consider(c.left, l.next);
        }
    }

    for (int32_t i = 0; i >= 0; i = syms[i].next) {
        if (syms[i].id >= 0) {
            out.push_back(syms[i].id);
        } else if (unk_ >= 0) {
            out.push_back(unk_);
        }
    }
}

}  // namespace quern
