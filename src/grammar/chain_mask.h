// Which of a vocabulary's tokens a grammar state takes, found by one walk of
// the token trie (the sorted token texts: each distinct prefix advanced
// once), and the precomputed part of a token mask.
//
// A state's stacks are independent, and most of a token's fate is decided by
// the top few frames of a stack — a *chain* (GrammarState::chain). Walked
// from a chain alone, a token is
//   - accepted: its bytes stay inside the chain (or end just as it ends),
//     whatever lies below — the same in every context;
//   - leaving: the chain finishes before the token does; the rest of the
//     token must then fit the frames below (GrammarState::after_chain), which
//     only the whole stack knows;
//   - refused otherwise.
// A chain's result depends only on its signature (the frames and the rules
// they reach), so it is computed once per signature and shared by every
// state, request and schema that reaches the same chain — XGrammar's split
// of context-independent and context-dependent tokens.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "grammar/grammar.h"

namespace quern::grammar {

/// A vocabulary's token texts in byte order, and their trie: a node per
/// distinct prefix, in depth-first order (which is the texts' order).
struct SortedTokens {
    std::vector<std::pair<std::string, int32_t>> sorted;  ///< (bytes, id), ids with text only
    int64_t n_vocab = 0;
    int max_len = 0;  ///< bytes of the longest text
    // Node n is the prefix of depth[n] bytes ending in byte[n]; its subtree
    // is nodes [n, end[n]); the texts starting with it are
    // sorted[first[n], first[end[n]]) (first has a sentinel), and those that
    // are exactly it sorted[first[n], first[n + 1]).
    std::vector<uint8_t> byte;
    std::vector<uint16_t> depth;
    std::vector<uint32_t> end, first;

    /// Sorts `pieces` and builds the trie.
    static SortedTokens of(std::vector<std::pair<std::string, int32_t>> pieces, int64_t n_vocab);
};

/// A set of token ids: one bit per id.
using TokenBits = std::vector<uint64_t>;
inline void set_bit(TokenBits& b, int32_t id) { b[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63); }
inline bool test_bit(const TokenBits& b, int32_t id) { return (b[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1u; }

/// A chain's tokens (see the file comment).
struct ChainMask {
    struct Leaving {
        int32_t id;   ///< token id
        uint16_t at;  ///< bytes of the token taken inside the chain before it finished
    };
    TokenBits accepted;            ///< n_vocab bits
    std::vector<Leaving> leaving;  ///< by token text order; a token may leave at several offsets
};

/// Walks every token from `start` (each trie node's state found once; equal
/// states share their transitions). `leaving`: record where the state has an
/// empty stack before a token's end (for a chain; for a whole state an empty
/// stack is the end of the text, where no byte may follow). `max_states`
/// bounds the states remembered at once (8192: 8 MiB of transitions; tests
/// set it low to exercise the restart).
ChainMask walk_tokens(const GrammarState& start, const SortedTokens& tokens, bool leaving, size_t max_states = 8192);

}  // namespace quern::grammar
