// SentencePiece-style merging by piece score (the "llama" GGUF tokenizer model).
#pragma once
#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/piece_map.h"

namespace quern {

/// Reusable working memory of one encode call.
struct SpmScratch {
    struct Sym {
        uint32_t start, len;  // byte range in the text; len 0 = merged away
        int32_t prev, next;
    };
    struct Bigram {
        float score;
        int32_t left, right;
        uint32_t len;  // combined length when made; a mismatch means stale
        int32_t id;
    };
    std::vector<Sym> syms;
    std::vector<Bigram> heap;
};

/// Greedy bigram merging by piece score: start from single UTF-8 characters
/// (each invalid byte is a symbol of its own), repeatedly merge the adjacent
/// pair whose concatenation is a vocabulary piece with the highest score
/// (leftmost on ties). Symbols left that are not pieces fall back to <0xNN>
/// byte tokens, or to unk when the vocabulary has no byte tokens.
/// Immutable after construction; thread-safe.
class SpmModel {
public:
    /// `pieces`: mergeable piece text -> id; `scores` may be empty (all
    /// pieces score 0); `byte_ids[b]` is the <0xNN> token of byte b or -1.
    SpmModel(PieceMap pieces, const std::vector<float>& scores, const std::array<int32_t, 256>& byte_ids, int32_t unk);

    /// Encodes already-escaped text (spaces replaced by "▁"), appending to
    /// `out`. Results of short texts are cached.
    void encode(std::string_view text, std::vector<int32_t>& out, SpmScratch& scratch) const;

    /// The id of a mergeable piece, or -1.
    int32_t piece_id(std::string_view s) const { return pieces_.find(s); }
    /// Calls fn(text, id) for every mergeable piece.
    template <class Fn>
    void for_each_piece(Fn&& fn) const {
        pieces_.for_each(fn);
    }
    /// Empties the word cache (benchmarks of the uncached path).
    void clear_cache() const { cache_.clear(); }

private:
    void merge(std::string_view text, std::vector<int32_t>& out, SpmScratch& scratch) const;
    float score(int32_t id) const {
        return id >= 0 && static_cast<size_t>(id) < scores_.size() ? scores_[id] : 0.0f;
    }
    PieceMap pieces_;
    std::vector<float> scores_;
    std::array<int32_t, 256> byte_ids_{};
    int32_t unk_ = -1;
    WordCache cache_;
};

}  // namespace quern
