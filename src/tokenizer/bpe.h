// BPE merging by merge rank: byte-level ("gpt2" GGUF vocabularies and
// tokenizer.json files with a ByteLevel pre-tokenizer) and over characters
// (tokenizer.json files of SentencePiece-derived models: "▁" for spaces and
// <0xNN> byte fallback, as Hugging Face stores Llama, Mistral, Gemma, Phi-3).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/piece_map.h"

namespace quern {

/// Settings of a BpeModel (the Hugging Face BPE model fields of the same names).
struct BpeOptions {
    bool byte_level = true;      // symbols are bytes; else UTF-8 characters
    bool ignore_merges = false;  // a word that is itself a token is emitted whole (Llama 3)
    bool byte_fallback = false;  // character mode: a character with no token becomes <0xNN> tokens
    bool fuse_unk = false;       // consecutive unknown characters become one unk
    int32_t unk = -1;            // token for characters with no token (-1: drop them)
};

/// Reusable working memory of one encode call (keeps merging allocation-free).
struct BpeScratch {
    struct Sym {
        int32_t id;
        int32_t prev, next;
        uint32_t len;  // bytes of the word it covers
    };
    struct Cand {
        int32_t rank, left, right, left_id, right_id, merged;
    };
    std::vector<Sym> syms;
    std::vector<Cand> heap;
};

/// Merges one pre-tokenized word into token ids: lowest merge rank first,
/// leftmost first among equal ranks (a heap over a linked list of symbols,
/// O(n log n) per word). Immutable after construction; thread-safe.
class BpeModel {
public:
    /// `vocab`: the mergeable tokens keyed by the text merging works on (raw
    /// bytes for byte-level, token text otherwise); `merges`: (left, right)
    /// texts in rank order, in the same key space; merges whose parts or
    /// result are not in `vocab` are ignored. `byte_tokens[b]`: the <0xNN>
    /// token of byte b for byte fallback (-1 when absent).
    BpeModel(PieceMap vocab, const std::vector<std::pair<std::string, std::string>>& merges,
             const std::array<int32_t, 256>& byte_tokens, BpeOptions opts);

    /// Appends the ids of `word` (in the key space of the vocabulary) to `out`.
    /// Results of short words are cached.
    void encode_word(std::string_view word, std::vector<int32_t>& out, BpeScratch& scratch) const;

    size_t n_merges() const { return merges_.size(); }
    const BpeOptions& options() const { return opts_; }
    /// Empties the word cache (benchmarks of the uncached path).
    void clear_cache() const { cache_.clear(); }

private:
    void merge(std::string_view word, std::vector<int32_t>& out, BpeScratch& scratch) const;
    PieceMap vocab_;
    PairMap merges_;
    std::array<int32_t, 256> byte_id_{};      // byte-level: token of each single byte
    std::array<int32_t, 256> byte_tokens_{};  // byte fallback: <0xNN>
    BpeOptions opts_;
    WordCache cache_;
};

}  // namespace quern
