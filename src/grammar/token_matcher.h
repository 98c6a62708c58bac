// A grammar applied to a model's tokens: which tokens may come next (the
// logits of the others set to −inf before sampling), and the state advanced
// by the token chosen. A token is allowed when its bytes take the grammar
// state somewhere; end-of-generation tokens only when the text so far is a
// whole sentence of the grammar. Special tokens with no text are never
// allowed otherwise.
//
// A mask is assembled per stack of the state: the chain mask of its top
// frames (chain_mask.h, computed once per chain signature for the whole
// vocabulary), plus those of the chain's leaving tokens whose rest the
// frames below accept — usually a few hundred checks instead of a walk of
// 150k tokens. Finished masks are cached by grammar state too.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "grammar/chain_mask.h"
#include "grammar/grammar.h"

namespace quern {
class Tokenizer;
}

namespace quern::grammar {

struct MaskCaches;

/// A vocabulary's token texts, sorted, with the mask caches every matcher of
/// a model shares (thread-safe; bounded: about 60 MiB at most for a 150k
/// vocabulary).
struct TokenPieces {
    SortedTokens tokens;
    std::vector<int32_t> eog;    ///< end-of-generation ids
    std::vector<int32_t> where;  ///< by id: index in tokens.sorted, -1 without text
    int64_t n_vocab = 0;
    std::shared_ptr<MaskCaches> caches;
    static std::shared_ptr<const TokenPieces> of(const Tokenizer& tok);
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
    /// The mask of the current state, computed.
    TokenBits compute() const;

    std::shared_ptr<const TokenPieces> pieces_;
    uint64_t grammar_id_;
    GrammarState state_;
};

}  // namespace quern::grammar
