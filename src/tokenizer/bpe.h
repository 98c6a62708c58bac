// Byte-level BPE merging (the "gpt2" tokenizer model).
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace quern {

/// Merges one pre-tokenized word (byte-character text) into token ids by merge
/// rank: lowest rank first, leftmost first among equal ranks, using a heap over
/// a linked list of symbols (O(n log n) per word).
class BpeModel {
public:
    /// `lookup` maps token text to an id (-1 when absent); `merges` are
    /// "left right" strings in rank order. Merges whose parts or result are not
    /// in the vocabulary are ignored. `ignore_merges`: a word that is itself a
    /// token is emitted whole (Llama 3 style).
    BpeModel(std::function<int32_t(std::string_view)> lookup, const std::vector<std::string>& merges, int32_t unk,
             bool ignore_merges);

    /// Appends the ids for `word` to `out`. Characters with no token (some
    /// vocabularies lack the byte characters of bytes that never occur in
    /// valid UTF-8, or rare control bytes) become `unk` when there is one and
    /// are dropped otherwise, as Hugging Face does.
    void encode_word(std::string_view word, std::vector<int32_t>& out) const;

    size_t n_merges() const { return merges_.size(); }

private:
    struct Merge {
        int32_t rank;
        int32_t id;
    };
    static uint64_t key(int32_t a, int32_t b) {
        return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    }
    std::function<int32_t(std::string_view)> lookup_;
    std::unordered_map<uint64_t, Merge> merges_;
    std::array<int32_t, 256> byte_id_{};  // token id of each byte's character
    int32_t unk_ = -1;
    bool ignore_merges_ = false;
};

}  // namespace quern
