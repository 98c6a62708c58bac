// Mask caches filled before the first constrained request. A token mask is
// cheap once the chain masks of its state's top frames exist (token_matcher.h),
// and those chains are keyed by structure, so every JSON schema shares the
// chains of strings, bounded strings, numbers, literals, arrays and object
// punctuation. Built on demand, the first request with a new chain pays a
// walk of the whole vocabulary for each (10-18 ms on a 150k vocabulary,
// bench/grammar-cpu.md). warm_json_masks walks sample documents through the
// json_object grammar and a schema that reaches those chains, so that a
// server's first constrained request costs what a new schema costs on a
// warm server. XGrammar precomputes per grammar at compile time instead;
// chains shared across grammars let one pass at start serve every schema.
#pragma once
#include <memory>

#include "grammar/token_matcher.h"

namespace quern {
class Tokenizer;
}

namespace quern::grammar {

/// What a warm-up walked.
struct WarmStats {
    int documents = 0;  ///< sample documents walked
    int accepted = 0;   ///< of those, accepted to the end by their grammar (all, unless the tokenizer splits oddly)
    int steps = 0;      ///< masks computed
};

/// Fills pieces' caches (shared by every matcher of it) with the masks of
/// sample JSON documents tokenized by `tok` (the tokenizer pieces was made
/// from). Thread-safe beside running matchers (the caches lock). Throws what
/// the tokenizer or grammar compiler throw.
WarmStats warm_json_masks(const Tokenizer& tok, const std::shared_ptr<const TokenPieces>& pieces);

}  // namespace quern::grammar
