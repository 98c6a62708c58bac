// Context-free grammars for constrained decoding, in the GBNF notation
// llama.cpp popularised (a de-facto format its users already write):
//
//   root   ::= object
//   object ::= "{" ws ( pair ( "," ws pair )* )? "}"
//   pair   ::= string ":" ws value         # comments run to the end of the line
//   ws     ::= [ \t\n]*
//   digit  ::= [0-9]
//   other  ::= [^"\\] | "\\" ["\\/bfnrtu]
//
// Literals in double quotes, character classes in brackets (ranges, ^ to
// negate, escapes \n \t \r \\ \" \] \xHH \uHHHH), rule names, groups in
// parentheses, alternatives with |, and the postfix operators * + ? and
// {m} {m,} {m,n} (counts up to 10000). The start rule is `root`. Groups and
// repetitions become rules of their own (named rule-N), so a rule is a list
// of alternatives, each a sequence of elements: a character set, a rule
// reference, or a bounded repetition of a rule (x{m,n}, counted in its
// stack frame).
//
// GrammarState recognises text a code point at a time: the set of positions
// (stacks of rule positions, as a pushdown automaton holds them) the text so
// far may have reached. Left-recursive rules are refused (they would expand
// without end).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace quern::grammar {

/// A set of code points: ranges [lo, hi], or everything outside them.
struct CharSet {
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    bool negated = false;
    bool contains(uint32_t cp) const;
    /// Whether some code point of [lo, hi] is in the set.
    bool intersects(uint32_t lo, uint32_t hi) const;
};

struct Element {
    /// Repeat: `rule` min..max times (a bounded count, x{m,n}); the stack
    /// frame counts the repetitions done, so every count is a state of its
    /// own, which mask caches can tell apart from the counts no token reaches.
    enum class Kind : uint8_t { Chars, Rule, Repeat } kind = Kind::Chars;
    CharSet chars;  ///< Chars
    int rule = -1;  ///< Rule, Repeat: index into Grammar::rules
    int min = 0, max = 0;  ///< Repeat
};

struct Rule {
    std::string name;
    std::vector<std::vector<Element>> alternatives;
};

struct Grammar {
    std::vector<Rule> rules;
    std::vector<uint8_t> nullable;  ///< by rule: it may match the empty text
    int root = -1;
    uint64_t id = 0;  ///< unique per parsed grammar (keys of mask caches)

    /// Parses GBNF text. quern::Error naming the line and what is wrong
    /// (an undefined rule, a missing root, left recursion, a syntax error).
    /// A text parsed before and still in use gives the same grammar.
    static std::shared_ptr<const Grammar> parse(std::string_view text);
    /// JSON text (RFC 8259) of any value — response_format json_object
    /// asks for an object: `object_only`.
    static std::shared_ptr<const Grammar> json(bool object_only);
};

/// `text` as a GBNF literal: in double quotes, with " \ newline and
/// carriage return escaped.
std::string gbnf_literal(std::string_view text);

/// GBNF rules for JSON values without a root: value, object, member, array,
/// string, char, hex, number, integer, boolean, null, ws (one space, or a
/// newline and at most 20 spaces or tabs) and indent. Numbers have at most
/// 20 digits before the point, 24 after it and 3 of exponent. Grammar::json
/// and the JSON-schema compiler end their grammars with them.
const std::string& json_value_rules();

/// Where a text may stand in a grammar: a set of stacks, each a path of
/// (rule, alternative, element) positions from the root; an empty stack means
/// the text may end here.
class GrammarState {
public:
    explicit GrammarState(std::shared_ptr<const Grammar> g);

    /// Advances over one code point; false (the state unchanged) when the
    /// grammar does not allow it here.
    bool advance(uint32_t cp);
    /// Advances over UTF-8 bytes, keeping an incomplete trailing sequence for
    /// the next call; false (the state unchanged) when any code point is
    /// refused or the bytes are not UTF-8.
    bool advance_bytes(std::string_view bytes);
    /// Whether the text so far is a whole sentence of the grammar.
    bool accepting() const;
    /// Whether any code point may follow.
    bool can_continue() const;
    /// Whether some code point of [lo, hi] may come next.
    bool allows(uint32_t lo, uint32_t hi) const;
    /// The state as bytes: equal keys, equal futures (a mask cache's key).
    std::string key() const;

    // What token masks are built from (token_matcher.h): a stack's top
    // frames alone — a *chain* — whose future depends only on the rules it
    // can reach, not on the stack below it.

    size_t stack_count() const { return ends_.size(); }
    /// Frames of stack i (0 for the empty stack).
    int depth(size_t i) const { return static_cast<int>(ends_[i] - start(i)); }
    /// Whether an incomplete UTF-8 sequence is pending.
    bool has_partial() const { return !partial_.empty(); }
    /// Whether some stack is empty: the text may end here — or, in a chain,
    /// the chain is finished and the frames below it would go on.
    bool has_empty_stack() const;
    /// The state of stack i's top k frames alone.
    GrammarState chain(size_t i, int k) const;
    /// Stack i once its top k frames are finished: the frames below, the
    /// new top past its call, expanded (the state a token goes on in after
    /// leaving the chain).
    GrammarState after_chain(size_t i, int k) const;
    /// Stack i's top k frames and every rule they can reach, rules renumbered
    /// by first reach: equal signatures, equal futures for the chain (in any
    /// grammar: schemas share the JSON rules).
    /// `max_chars`: the most characters one token holds — counts of a
    /// Repeat whose unit takes a character are told apart only up to it.
    std::string chain_signature(size_t i, int k, int max_chars) const;

private:
    struct Pos {
        int rule, alt, elem;
        int count = 0;  ///< repetitions done of a Repeat element at elem
        bool operator==(const Pos& o) const { return rule == o.rule && alt == o.alt && elem == o.elem && count == o.count; }
        bool operator<(const Pos& o) const;
    };
    /// Scratch space of expand and advance (per thread: no allocation once grown).
    struct Scratch;
    static Scratch& scratch();
    struct Bare {};
    /// `of`'s grammar, no stacks yet.
    GrammarState(const GrammarState& of, Bare) : g_(of.g_) {}
    /// allows() over the code points of [lo, hi] that a valid n-byte UTF-8
    /// sequence encodes.
    bool allows_encoded(uint32_t lo, uint32_t hi, int n) const;
    size_t start(size_t i) const { return i == 0 ? 0 : ends_[i - 1]; }
    const Pos& top(size_t i) const { return frames_[ends_[i] - 1]; }
    /// Appends to (frames, ends) the stacks that work[base, work.size())
    /// stands for once rule references on top are expanded and finished
    /// alternatives popped: every top a character set, or the stack empty.
    /// `work` is scratch; it is left as it came.
    void expand(std::vector<Pos>& work, size_t base, std::vector<Pos>& frames, std::vector<uint32_t>& ends,
                int& budget) const;
    /// A frame whose callee finished: past the call, or one more repetition.
    void past_call(Pos& f) const;
    /// The stacks (frames, ends), sorted and deduplicated, become the state's.
    void adopt(const std::vector<Pos>& frames, const std::vector<uint32_t>& ends);

    std::shared_ptr<const Grammar> g_;
    // The stacks, top at the back of each, stored one after another: stack i
    // is frames_[start(i), ends_[i]).
    std::vector<Pos> frames_;
    std::vector<uint32_t> ends_;
    std::string partial_;  // bytes of an incomplete UTF-8 sequence
};

}  // namespace quern::grammar
