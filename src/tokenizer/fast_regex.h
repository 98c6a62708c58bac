// Hand-written matchers for the pre-tokenizer regexes of the known families.
//
// Each matcher finds the leftmost match at or after a position as the regex
// does, as long as every character it has to look at is valid UTF-8;
// otherwise it answers Unknown and the caller asks PCRE2. Character classes
// (\p{L}, \p{N}, \p{P}, \p{S}, \p{M}, \s, and the letter cases
// [\p{Lu}\p{Lt}] and \p{Ll}) come from unicode_classes.inc:
// Unicode 16.0 with \s = White_Space, the classes of the regex engine of
// Hugging Face `tokenizers` (the system PCRE2 has Unicode 14 and counts U+180E
// as \s). The control flow of each regex is written out by hand and tested
// against PCRE2 on random text made of characters both agree on.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace quern::fastre {

/// The outcome of one search.
enum class Result { Match, NoMatch, Unknown };

/// A hand-written equivalent of one regex.
struct Matcher {
    const char* pattern;
    /// Leftmost match in `s` at or after `pos`: sets [begin, end) on Match.
    Result (*find)(std::string_view s, size_t pos, size_t& begin, size_t& end);
};

/// The matcher for exactly this pattern string, or nullptr.
const Matcher* find_matcher(std::string_view pattern);

/// Class bits of a code point.
enum ClassBit : unsigned {
    kLetter = 1,   // \p{L}
    kNumber = 2,   // \p{N}
    kPunct = 4,    // \p{P}
    kSymbol = 8,   // \p{S}
    kMark = 16,    // \p{M}
    kSpace = 32,   // \s
    kUpper = 64,   // \p{Lu} or \p{Lt} (GPT-4o's case split)
    kLower = 128,  // \p{Ll}
    kUnknown = 256,  // invalid UTF-8: not classified
};

/// Class bits of a code point (0 for unassigned and other categories).
unsigned class_of(uint32_t cp);

/// Class bits of the character at `pos` (< s.size()) and its length in bytes.
unsigned classify(std::string_view s, size_t pos, size_t& len);

}  // namespace quern::fastre
