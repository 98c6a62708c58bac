// SentencePiece-style merging (the "llama" tokenizer model).
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

namespace quern {

/// Greedy bigram merging by piece score: start from single UTF-8 characters
/// (each invalid byte is a symbol of its own), repeatedly merge the adjacent
/// pair whose concatenation is a vocabulary piece with the highest score
/// (leftmost on ties). Symbols left that are not pieces fall back to <0xNN>
/// byte tokens, or to unk when the vocabulary has no byte tokens.
class SpmModel {
public:
    /// `lookup` maps text to a mergeable piece id (-1 when absent or not a
    /// text piece); `scores` may be empty (all pieces score 0);
    /// `byte_ids[b]` is the <0xNN> token of byte b or -1.
    SpmModel(std::function<int32_t(std::string_view)> lookup, const std::vector<float>& scores,
             const std::array<int32_t, 256>& byte_ids, int32_t unk);

    /// Encodes already-escaped text (spaces replaced by "▁"), appending to `out`.
    void encode(std::string_view text, std::vector<int32_t>& out) const;

private:
    float score(int32_t id) const {
        return id >= 0 && static_cast<size_t>(id) < scores_.size() ? scores_[id] : 0.0f;
    }
    std::function<int32_t(std::string_view)> lookup_;
    std::vector<float> scores_;
    std::array<int32_t, 256> byte_ids_{};
    int32_t unk_ = -1;
};

}  // namespace quern
