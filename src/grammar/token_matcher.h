// A grammar applied to a model's tokens: which tokens may come next (the
// logits of the others set to −inf before sampling), and the state advanced
// by the token chosen. A token is allowed when its bytes take the grammar
// state somewhere; end-of-generation tokens only when the text so far is a
// whole sentence of the grammar. Special tokens with no text are never
// allowed otherwise.
//
// The mask is computed by walking the vocabulary's tokens in sorted order
// and reusing the state of the longest shared prefix (a depth-first walk of
// the token trie), so each distinct prefix is advanced once; masks are
// cached by grammar state (TokenPieces::MaskCache).
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace quern {
class Tokenizer;
}

namespace quern::grammar {

/// A vocabulary's token texts, sorted, shared by every matcher of a model.
struct TokenPieces {
    std::vector<std::pair<std::string, int32_t>> sorted;  ///< (bytes, id), ids with text only
    std::vector<int32_t> eog;                             ///< end-of-generation ids
    std::vector<int32_t> where;                           ///< by id: index in sorted, -1 without text
    int64_t n_vocab = 0;
    static std::shared_ptr<const TokenPieces> of(const Tokenizer& tok);

    /// Masks already computed, by grammar and state: a state seen before (the
    /// inside of a JSON string, say) costs a lookup. One bit per token,
    /// at most kMaxCachedMasks of them (cleared when full: 38 MiB for a
    /// 150k vocabulary); shared by the sequences of an engine (thread-safe).
    struct MaskCache {
        std::mutex mu;
        std::unordered_map<std::string, std::shared_ptr<const std::vector<uint64_t>>> masks;
    };
    static constexpr size_t kMaxCachedMasks = 2048;
    std::unique_ptr<MaskCache> cache = std::make_unique<MaskCache>();
};

class TokenMatcher {
public:
    TokenMatcher(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenPieces> pieces);
    /// Sets the logits (n_vocab floats) of tokens the grammar does not allow
    /// next to −inf. Returns the allowed count.
    int64_t mask(float* logits) const;
    /// The token chosen: advances the state. false when the grammar does not
    /// allow it (the state is unchanged).
    bool accept(int32_t token);
    bool accepting() const { return state_.accepting(); }

private:
    std::shared_ptr<const TokenPieces> pieces_;
    uint64_t grammar_id_;
    GrammarState state_;
};

}  // namespace quern::grammar
