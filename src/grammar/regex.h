// Regular expressions (JSON Schema `pattern`, ECMA-262 syntax) as GBNF over
// the text of a JSON string: what lies between the quotes, escapes included,
// whose decoded value the pattern matches.
//
// Covered: literals; `.`; classes `[...]` with ranges and negation; \d \D \w
// \W \s \S; escapes \n \t \r \f \v \0 \xHH \uHHHH and escaped punctuation;
// groups `(...)`, `(?:...)`, `(?<name>...)`; alternation; the quantifiers
// * + ? {m} {m,} {m,n} (lazy forms too: the language is the same); `^` at the
// start and `$` at the end. A pattern is a search, as JSON Schema says: without
// `^` (or `$`) any text may come before (or after) a match. Refused, naming
// the construct: lookaround, backreferences, \b \B word boundaries, anchors
// elsewhere, and counts above 10000.
//
// The grammar writes a subset of the strings that match (sound, not
// complete): characters the JSON string needs escaped are written with the
// short escapes (\" \\ \n \t \r \b \f) or \u00XX; alternatives spelled
// differently (\/ for /, \u0041 for A) are never produced.
#pragma once
#include <string>
#include <string_view>

namespace quern::grammar {

/// What the expression writes: the inside of a JSON string (escaped, a
/// search as JSON Schema's `pattern` is), or plain text matching the pattern
/// whole (vLLM's guided_regex; ^ and $ change nothing).
enum class RegexTarget { JsonString, Text };

/// A GBNF expression matching the texts described above (JsonString: using
/// the `char` rule of json_value_rules for unanchored ends). quern::Error
/// naming the unsupported construct and its offset.
std::string regex_to_gbnf(std::string_view pattern, RegexTarget target = RegexTarget::JsonString);

}  // namespace quern::grammar
