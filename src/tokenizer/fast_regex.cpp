#include "tokenizer/fast_regex.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

#include "tokenizer/patterns.h"
#include "tokenizer/unicode.h"

namespace quern::fastre {

namespace {

constexpr size_t kBail = SIZE_MAX;  // "met a character that is not classified"

// Class bits of every code point: a two-level table (blocks of 256 code
// points, identical blocks shared) built once from unicode_classes.inc.
struct ClassTable {
    std::array<uint16_t, 0x110000 / 256> stage1{};
    std::vector<uint8_t> blocks;
    ClassTable() {
        struct Range {
            uint32_t first, last;
            uint8_t bits;
        };
        static const Range kRanges[] = {
#include "tokenizer/unicode_classes.inc"
        };
        std::vector<uint8_t> flat(0x110000, 0);
        for (const Range& r : kRanges)
            for (uint32_t cp = r.first; cp <= r.last; ++cp) flat[cp] = r.bits;
        std::map<std::string_view, uint16_t> seen;
        for (size_t b = 0; b < stage1.size(); ++b) {
            const std::string_view block(reinterpret_cast<const char*>(flat.data()) + b * 256, 256);
            auto it = seen.find(block);
            if (it == seen.end()) {
                const auto index = static_cast<uint16_t>(blocks.size() / 256);
                blocks.insert(blocks.end(), flat.begin() + static_cast<ptrdiff_t>(b * 256),
                              flat.begin() + static_cast<ptrdiff_t>(b * 256 + 256));
                // Key on the stored copy (`flat` is freed at the end).
                it = seen.emplace(block, index).first;
            }
            stage1[b] = it->second;
        }
    }
    unsigned get(uint32_t cp) const { return cp < 0x110000 ? blocks[stage1[cp >> 8] * 256u + (cp & 255u)] : 0; }
};

const ClassTable& table() {
    static const ClassTable t;
    return t;
}

// Reads characters of one subject with the class table.
struct Cursor {
    std::string_view s;
    const ClassTable& t;
    const uint8_t* ascii;
    size_t n;

    explicit Cursor(std::string_view text)
        : s(text), t(table()), ascii(t.blocks.data() + t.stage1[0] * 256u), n(text.size()) {}

    unsigned at(size_t i, size_t& len) const {
        uint32_t cp;
        return at(i, len, cp);
    }
    unsigned at(size_t i, size_t& len, uint32_t& cp) const {
        const auto b = static_cast<uint8_t>(s[i]);
        if (b < 0x80) {
            len = 1;
            cp = b;
            return ascii[b];
        }
        const unicode::Utf8Char c = unicode::utf8_decode(s, i);
        len = c.len;
        cp = c.cp;
        return c.valid ? t.get(c.cp) : kUnknown;
    }

    // End of the run of characters from `i` whose class satisfies `pred`;
    // kBail when an unclassified character is met first.
    template <class Pred>
    size_t run(size_t i, Pred pred) const {
        while (i < n) {
            size_t len;
            uint32_t cp;
            const unsigned c = at(i, len, cp);
            if (c & kUnknown) return kBail;
            if (!pred(c, cp)) break;
            i += len;
        }
        return i;
    }
};

bool other(unsigned c) { return !(c & (kLetter | kNumber | kSpace)); }  // [^\s\p{L}\p{N}]

bool is(unsigned c, unsigned bits) { return (c & bits) != 0; }

Result done(size_t end, size_t& e) {
    if (end == kBail) return Result::Unknown;
    e = end;
    return Result::Match;
}

// `\s+(?!\S)|\s+` from `pos` (a \s character): the run minus its last
// character when more than one and followed by \S, else the whole run.
Result whitespace_tail(const Cursor& c, size_t pos, size_t& e) {
    size_t i = pos, last = pos;
    int count = 0;
    while (i < c.n) {
        size_t len;
        const unsigned k = c.at(i, len);
        if (k & kUnknown) return Result::Unknown;
        if (!(k & kSpace)) break;
        last = i;
        i += len;
        ++count;
    }
    e = (i == c.n || count < 2) ? i : last;
    return Result::Match;
}

// `\s*[\r\n]+|\s+(?!\S)|\s+` from `pos` (a \s character).
Result newline_or_whitespace_tail(const Cursor& c, size_t pos, size_t& e) {
    size_t i = pos, last_crlf = kBail;
    while (i < c.n) {
        size_t len;
        const unsigned x = c.at(i, len);
        if (x & kUnknown) return Result::Unknown;
        if (!(x & kSpace)) break;
        if (c.s[i] == '\r' || c.s[i] == '\n') last_crlf = i;
        i += len;
    }
    if (last_crlf != kBail) return done(last_crlf + 1, e);
    return whitespace_tail(c, pos, e);
}

size_t skip_crlf(const Cursor& c, size_t i) {
    while (i < c.n && (c.s[i] == '\r' || c.s[i] == '\n')) ++i;
    return i;
}

// \p{N}{1,max} from `pos`, a number of len0 bytes.
Result numbers(const Cursor& c, size_t pos, size_t len0, int max, size_t& e) {
    size_t i = pos + len0;
    for (int k = 1; k < max && i < c.n; ++k) {
        size_t len;
        const unsigned x = c.at(i, len);
        if (x & kUnknown) return Result::Unknown;
        if (!(x & kNumber)) break;
        i += len;
    }
    return done(i, e);
}

// ` ?P+T*` from `pos` (class c0) for a punctuation class P and trailing
// bytes T (tail(byte)); NoMatch when neither pos nor (after a space) the
// next character is P.
template <class Punct, class Tail>
Result punct_run(const Cursor& c, size_t pos, unsigned c0, Punct punct, Tail tail, size_t& e) {
    size_t start = kBail;
    if (c.s[pos] == ' ') {
        if (pos + 1 < c.n) {
            size_t len1;
            const unsigned c1 = c.at(pos + 1, len1);
            if (c1 & kUnknown) return Result::Unknown;
            if (punct(c1, 0)) start = pos + 1;
        }
    } else if (punct(c0, 0)) {
        start = pos;
    }
    if (start == kBail) return Result::NoMatch;
    size_t end = c.run(start, punct);
    if (end == kBail) return Result::Unknown;
    while (end < c.n && tail(c.s[end])) ++end;
    return done(end, e);
}

// Searches for the leftmost position where `match_at(cursor, i, end)`
// matches; match_at answers Match / NoMatch (nothing starts at i) / Unknown.
template <class MatchAt>
Result search(std::string_view s, size_t pos, size_t& b, size_t& e, MatchAt match_at) {
    const Cursor c(s);
    for (size_t i = pos; i < c.n;) {
        const Result r = match_at(c, i, e);
        if (r == Result::Match) {
            b = i;
            return r;
        }
        if (r == Result::Unknown) return r;
        size_t len;
        c.at(i, len);
        i += len;
    }
    return Result::NoMatch;
}

// ---------------------------------------------------------------- GPT-2
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
Result gpt2(std::string_view s, size_t pos, size_t& b, size_t& e) {
    const Cursor c(s);
    if (pos >= c.n) return Result::NoMatch;
    size_t len0;
    const unsigned c0 = c.at(pos, len0);
    if (c0 & kUnknown) return Result::Unknown;
    b = pos;
    const char ch = s[pos];
    if (ch == '\'' && pos + 1 < c.n) {
        const char c1 = s[pos + 1];
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return done(pos + 2, e);
        if (pos + 2 < c.n) {
            const char c2 = s[pos + 2];
            if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return done(pos + 3, e);
        }
    }
    size_t start = pos;
    unsigned k = c0;
    if (ch == ' ' && pos + 1 < c.n) {
        size_t len1;
        const unsigned c1 = c.at(pos + 1, len1);
        if (c1 & kUnknown) return Result::Unknown;
        if (!(c1 & kSpace)) {
            start = pos + 1;
            k = c1;
        }
    }
    if (start != pos || !(c0 & kSpace)) {
        if (k & kLetter) return done(c.run(start, [](unsigned x, uint32_t) { return is(x, kLetter); }), e);
        if (k & kNumber) return done(c.run(start, [](unsigned x, uint32_t) { return is(x, kNumber); }), e);
        return done(c.run(start, [](unsigned x, uint32_t) { return other(x); }), e);
    }
    return whitespace_tail(c, pos, e);
}

// ---------------------------------------------------------------- Llama 3 / Qwen2 / Qwen3.5
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,MaxDigits}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
char ascii_lower(uint8_t b) { return static_cast<char>(b >= 'A' && b <= 'Z' ? b + 32 : b); }

// The case-insensitive contractions; 0 when none matches at `pos` ('\'').
// Unknown when a non-ASCII letter could take part (U+017F folds to 's').
Result contraction_ci(const Cursor& c, size_t pos, size_t& e) {
    if (pos + 1 >= c.n) return Result::NoMatch;
    const auto b1 = static_cast<uint8_t>(c.s[pos + 1]);
    if (b1 >= 0x80) {
        uint32_t cp;
        size_t len;
        c.at(pos + 1, len, cp);
        if (cp == 0x17F) return done(pos + 1 + len, e);  // 'ſ (long s)
        if (cp == 0x212A) return Result::NoMatch;        // Kelvin sign: no contraction has a k
        return Result::NoMatch;
    }
    const char l1 = ascii_lower(b1);
    if (l1 == 's' || l1 == 't' || l1 == 'm' || l1 == 'd') return done(pos + 2, e);
    if ((l1 == 'r' || l1 == 'v' || l1 == 'l') && pos + 2 < c.n) {
        const auto b2 = static_cast<uint8_t>(c.s[pos + 2]);
        const char l2 = ascii_lower(b2);
        if ((l1 == 'r' && l2 == 'e') || (l1 == 'v' && l2 == 'e') || (l1 == 'l' && l2 == 'l')) return done(pos + 3, e);
    }
    return Result::NoMatch;
}

template <int MaxDigits, bool Marks = false>
Result llama3(std::string_view s, size_t pos, size_t& b, size_t& e) {
    const Cursor c(s);
    if (pos >= c.n) return Result::NoMatch;
    size_t len0;
    const unsigned c0 = c.at(pos, len0);
    if (c0 & kUnknown) return Result::Unknown;
    b = pos;
    const char ch = s[pos];
    if (ch == '\'') {
        const Result r = contraction_ci(c, pos, e);
        if (r != Result::NoMatch) return r;
    }
    // Marks: the Qwen3.5 form, [\p{L}\p{M}] for \p{L} and [^\s\p{L}\p{M}\p{N}]
    // for [^\s\p{L}\p{N}]. A mark at pos then starts the letter run either
    // way the optional prefix is taken.
    constexpr unsigned kWord = Marks ? (kLetter | kMark) : kLetter;
    auto letters = [](unsigned x, uint32_t) { return is(x, kWord); };
    auto punct = [](unsigned x, uint32_t) { return !(x & (kWord | kNumber | kSpace)); };
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (c0 & kWord) return done(c.run(pos, letters), e);
    if (ch != '\r' && ch != '\n' && !(c0 & kNumber) && pos + len0 < c.n) {
        size_t len1;
        const unsigned c1 = c.at(pos + len0, len1);
        if (c1 & kUnknown) return Result::Unknown;
        if (c1 & kWord) return done(c.run(pos + len0, letters), e);
    }
    // \p{N}{1,MaxDigits}
    if (c0 & kNumber) return numbers(c, pos, len0, MaxDigits, e);
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    const Result r = punct_run(c, pos, c0, punct, [](char t) { return t == '\r' || t == '\n'; }, e);
    if (r != Result::NoMatch) return r;
    return newline_or_whitespace_tail(c, pos, e);  // c0 is \s here
}

// ---------------------------------------------------------------- GPT-4o (o200k)
// P?A*B+C?|P?A+B*C?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with P = [^\r\n\p{L}\p{N}], A = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}],
// B = [\p{Ll}\p{Lm}\p{Lo}\p{M}], C = (?i:'s|'t|'re|'ve|'m|'ll|'d).
bool case_a(unsigned x) { return is(x, kMark) || (is(x, kLetter) && !is(x, kLower)); }
bool case_b(unsigned x) { return is(x, kMark) || (is(x, kLetter) && !is(x, kUpper)); }

// The optional contraction after a letter run ending at `i`.
Result with_contraction(const Cursor& c, size_t i, size_t& e) {
    if (i < c.n && c.s[i] == '\'') {
        const Result r = contraction_ci(c, i, e);
        if (r != Result::NoMatch) return r;
    }
    return done(i, e);
}

// A*B+ from i as a backtracking engine takes it: A* greedy, then giving
// characters back until B+ can start. B+ starts at the first position from
// the end of the A run backwards that holds a B character: the run's end
// itself (a B-only character), else the run's last character in both
// classes (after it the run holds A-only ones, so B+ is that one
// character). kBail when there is none (NoMatch), `unknown` set when an
// unclassified character decides.
size_t upper_then_lower(const Cursor& c, size_t i, bool& unknown) {
    size_t j = i, last_both = kBail;
    while (j < c.n) {
        size_t len;
        const unsigned x = c.at(j, len);
        if (x & kUnknown) {
            unknown = true;
            return kBail;
        }
        if (!case_a(x)) break;
        if (case_b(x)) last_both = j;
        j += len;
    }
    if (j < c.n) {
        size_t len;
        const unsigned x = c.at(j, len);  // classified: the loop above stopped on it
        if (case_b(x)) {
            const size_t end = c.run(j, [](unsigned y, uint32_t) { return case_b(y); });
            if (end == kBail) unknown = true;
            return end;
        }
    }
    if (last_both == kBail) return kBail;
    size_t len;
    c.at(last_both, len);
    return last_both + len;
}

// A+B* from i: kBail when i holds no A character.
size_t upper_then_any_lower(const Cursor& c, size_t i, bool& unknown) {
    const size_t j = c.run(i, [](unsigned y, uint32_t) { return case_a(y); });
    if (j == kBail) unknown = true;
    if (j == kBail || j == i) return kBail;
    const size_t end = c.run(j, [](unsigned y, uint32_t) { return case_b(y); });
    if (end == kBail) unknown = true;
    return end;
}

Result gpt4o_at(const Cursor& c, size_t pos, size_t& e) {
    size_t len0;
    const unsigned c0 = c.at(pos, len0);
    if (c0 & kUnknown) return Result::Unknown;
    const char ch = c.s[pos];
    const bool prefix = ch != '\r' && ch != '\n' && !(c0 & (kLetter | kNumber));
    // The letter alternatives: with the optional prefix character taken
    // first, then without it (which can only start with a mark).
    for (size_t (*alt)(const Cursor&, size_t, bool&) : {upper_then_lower, upper_then_any_lower})
        for (const size_t start : {prefix ? pos + len0 : kBail, pos}) {
            if (start == kBail) continue;
            bool unknown = false;
            const size_t end = alt(c, start, unknown);
            if (unknown) return Result::Unknown;
            if (end != kBail) return with_contraction(c, end, e);
        }
    // \p{N}{1,3}
    if (c0 & kNumber) return numbers(c, pos, len0, 3, e);
    //  ?[^\s\p{L}\p{N}]+[\r\n/]*
    const Result r = punct_run(c, pos, c0, [](unsigned x, uint32_t) { return other(x); },
                               [](char t) { return t == '\r' || t == '\n' || t == '/'; }, e);
    if (r != Result::NoMatch) return r;
    return newline_or_whitespace_tail(c, pos, e);  // c0 is \s here
}

Result gpt4o(std::string_view s, size_t pos, size_t& b, size_t& e) { return search(s, pos, b, e, gpt4o_at); }

// ---------------------------------------------------------------- DeepSeek V3
// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
//  ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
bool ascii_punct(char ch) {
    return (ch >= '!' && ch <= '/') || (ch >= ':' && ch <= '@') || (ch >= '[' && ch <= '`') || (ch >= '{' && ch <= '~');
}
bool ascii_letter(char ch) { return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z'); }

Result deepseek3_at(const Cursor& c, size_t i, size_t& e) {
    size_t len0;
    const unsigned c0 = c.at(i, len0);
    if (c0 & kUnknown) return Result::Unknown;
    const char ch = c.s[i];
    if (ascii_punct(ch) && i + 1 < c.n && ascii_letter(c.s[i + 1])) {
        size_t j = i + 1;
        while (j < c.n && ascii_letter(c.s[j])) ++j;
        return done(j, e);
    }
    auto lm = [](unsigned x, uint32_t) { return is(x, kLetter | kMark); };
    if (c0 & (kLetter | kMark)) return done(c.run(i, lm), e);
    if (ch != '\r' && ch != '\n' && !(c0 & (kPunct | kSymbol)) && i + len0 < c.n) {
        size_t len1;
        const unsigned c1 = c.at(i + len0, len1);
        if (c1 & kUnknown) return Result::Unknown;
        if (c1 & (kLetter | kMark)) return done(c.run(i + len0, lm), e);
    }
    auto ps = [](unsigned x, uint32_t) { return is(x, kPunct | kSymbol); };
    size_t start = kBail;
    if (ch == ' ' && i + 1 < c.n) {
        size_t len1;
        const unsigned c1 = c.at(i + 1, len1);
        if (c1 & kUnknown) return Result::Unknown;
        if (c1 & (kPunct | kSymbol)) start = i + 1;
    }
    if (start == kBail && (c0 & (kPunct | kSymbol))) start = i;
    if (start != kBail) {
        const size_t end = c.run(start, ps);
        if (end == kBail) return Result::Unknown;
        return done(skip_crlf(c, end), e);
    }
    if (c0 & kSpace) return newline_or_whitespace_tail(c, i, e);
    return Result::NoMatch;
}

Result deepseek3(std::string_view s, size_t pos, size_t& b, size_t& e) { return search(s, pos, b, e, deepseek3_at); }

// ---------------------------------------------------------------- searches
// Leftmost run of characters satisfying `pred`, at most `max_chars` long.
template <class Pred>
Result find_run(std::string_view s, size_t pos, size_t& b, size_t& e, Pred pred, size_t max_chars = SIZE_MAX) {
    const Cursor c(s);
    for (size_t i = pos; i < c.n;) {
        size_t len;
        uint32_t cp;
        const unsigned x = c.at(i, len, cp);
        if (x & kUnknown) return Result::Unknown;
        if (pred(x, cp)) {
            b = i;
            size_t j = i + len, count = 1;
            while (j < c.n && count < max_chars) {
                const unsigned y = c.at(j, len, cp);
                if (y & kUnknown) return Result::Unknown;
                if (!pred(y, cp)) break;
                j += len;
                ++count;
            }
            e = j;
            return Result::Match;
        }
        i += len;
    }
    return Result::NoMatch;
}

// Hugging Face's Digits pre-tokenizer: Rust's char::is_numeric, which is
// Unicode 17 in tokenizers 0.23 (the table here is Unicode 16): also the
// digits that Unicode 17 added.
bool hf_numeric(unsigned x, uint32_t cp) {
    return is(x, kNumber) || (cp >= 0x11DE0 && cp <= 0x11DE9) || (cp >= 0x16FF4 && cp <= 0x16FF6);
}
Result digit(std::string_view s, size_t pos, size_t& b, size_t& e) { return find_run(s, pos, b, e, hf_numeric, 1); }
Result digit_run(std::string_view s, size_t pos, size_t& b, size_t& e) { return find_run(s, pos, b, e, hf_numeric); }
Result digits1to3(std::string_view s, size_t pos, size_t& b, size_t& e) {
    return find_run(s, pos, b, e, [](unsigned x, uint32_t) { return is(x, kNumber); }, 3);
}

// [\r\n]: no classification needed.
Result crlf(std::string_view s, size_t pos, size_t& b, size_t& e) {
    for (size_t i = pos; i < s.size(); ++i) {
        if (s[i] == '\r' || s[i] == '\n') {
            b = i;
            e = i + 1;
            return Result::Match;
        }
    }
    return Result::NoMatch;
}

// [0-9][0-9][0-9]: ASCII only.
Result three_digits(std::string_view s, size_t pos, size_t& b, size_t& e) {
    auto d = [&](size_t i) { return s[i] >= '0' && s[i] <= '9'; };
    for (size_t i = pos; i + 3 <= s.size(); ++i) {
        if (d(i) && d(i + 1) && d(i + 2)) {
            b = i;
            e = i + 3;
            return Result::Match;
        }
    }
    return Result::NoMatch;
}

// \s?<class>+
template <class Pred>
Result space_opt_run(std::string_view s, size_t pos, size_t& b, size_t& e, Pred want) {
    return search(s, pos, b, e, [&](const Cursor& c, size_t i, size_t& end) {
        size_t len;
        uint32_t cp;
        const unsigned x = c.at(i, len, cp);
        if (x & kUnknown) return Result::Unknown;
        if (want(x, cp)) return done(c.run(i, want), end);
        if ((x & kSpace) && i + len < c.n) {
            size_t len1;
            uint32_t cp1;
            const unsigned y = c.at(i + len, len1, cp1);
            if (y & kUnknown) return Result::Unknown;
            if (want(y, cp1)) return done(c.run(i + len, want), end);
        }
        return Result::NoMatch;
    });
}

Result space_letters(std::string_view s, size_t pos, size_t& b, size_t& e) {
    return space_opt_run(s, pos, b, e, [](unsigned x, uint32_t) { return is(x, kLetter); });
}
Result space_punct(std::string_view s, size_t pos, size_t& b, size_t& e) {
    return space_opt_run(s, pos, b, e, [](unsigned x, uint32_t) { return is(x, kPunct); });
}

// DeepSeek LLM's enumerated classes (the same ranges as patterns.h).
struct CpRange {
    uint32_t a, b;
};
constexpr CpRange kDsLetters[] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xB5, 0xB5},       {0xC0, 0xD6},       {0xD8, 0xF6},
    {0xF8, 0x1BA},      {0x1BC, 0x1BF},     {0x1C4, 0x293},     {0x295, 0x2AF},     {0x370, 0x373},
    {0x376, 0x377},     {0x37B, 0x37D},     {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x38A},
    {0x38C, 0x38C},     {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},
    {0x531, 0x556},     {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},   {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},   {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},
    {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},   {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},
    {0x1F5B, 0x1F5B},   {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},   {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},   {0x2102, 0x2102},   {0x2107, 0x2107},
    {0x210A, 0x2113},   {0x2115, 0x2115},   {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},
    {0x2128, 0x2128},   {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},   {0x2C7E, 0x2CE4},
    {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},   {0xA680, 0xA69B},   {0xA722, 0xA76F},
    {0xA771, 0xA787},   {0xA78B, 0xA78E},   {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},
    {0xFF21, 0xFF3A},   {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
constexpr CpRange kDsPunct[] = {{0x21, 0x2F},     {0x3A, 0x7E},     {0x2018, 0x201F},
                                {0x3000, 0x3002}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E}};

template <size_t N>
bool in_ranges(const CpRange (&r)[N], uint32_t cp) {
    size_t lo = 0, hi = N;
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (cp < r[mid].a)
            hi = mid;
        else if (cp > r[mid].b)
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

// Hugging Face's Punctuation pre-tokenizer: ASCII punctuation, or General
// Category P as of Unicode 8.0 (the `unicode_categories` crate it uses), not
// the Unicode 16 of its regexes. So: Unicode 16 P, less the punctuation
// assigned after 8.0 (these ranges), plus U+111C9 and U+166D, which were P
// in 8.0 and are Mn / So now. Checked against `tokenizers` on every code point.
constexpr CpRange kPunctAfterUnicode8[] = {
    {0x61D, 0x61D},     {0x9FD, 0x9FD},     {0xA76, 0xA76},     {0xC77, 0xC77},     {0xC84, 0xC84},
    {0x1B4E, 0x1B4F},   {0x1B7D, 0x1B7F},   {0x2E43, 0x2E4F},   {0x2E52, 0x2E5D},   {0x10D6E, 0x10D6E},
    {0x10EAD, 0x10EAD}, {0x10F55, 0x10F59}, {0x10F86, 0x10F89}, {0x113D4, 0x113D5}, {0x113D7, 0x113D8},
    {0x1144B, 0x1144F}, {0x1145A, 0x1145B}, {0x1145D, 0x1145D}, {0x11660, 0x1166C}, {0x116B9, 0x116B9},
    {0x1183B, 0x1183B}, {0x11944, 0x11946}, {0x119E2, 0x119E2}, {0x11A3F, 0x11A46}, {0x11A9A, 0x11A9C},
    {0x11A9E, 0x11AA2}, {0x11B00, 0x11B09}, {0x11BE1, 0x11BE1}, {0x11C41, 0x11C45}, {0x11C70, 0x11C71},
    {0x11EF7, 0x11EF8}, {0x11F43, 0x11F4F}, {0x11FFF, 0x11FFF}, {0x12FF1, 0x12FF2}, {0x16D6D, 0x16D6F},
    {0x16E97, 0x16E9A}, {0x16FE2, 0x16FE2}, {0x1E5FF, 0x1E5FF}, {0x1E95E, 0x1E95F},
};

bool hf_punctuation(unsigned x, uint32_t cp) {
    if (cp < 0x80) return is(x, kPunct | kSymbol) && cp > 0x20;  // all ASCII P and S are ASCII punctuation
    if (cp == 0x111C9 || cp == 0x166D) return true;
    return is(x, kPunct) && !in_ranges(kPunctAfterUnicode8, cp);
}

// [\p{P}\$\+<=>\^~\|`]+ as HF's Punctuation(Contiguous), and one at a time.
Result hf_punct_run(std::string_view s, size_t pos, size_t& b, size_t& e) {
    return find_run(s, pos, b, e, hf_punctuation);
}
Result hf_punct_one(std::string_view s, size_t pos, size_t& b, size_t& e) {
    return find_run(s, pos, b, e, hf_punctuation, 1);
}

Result ds_letters(std::string_view s, size_t pos, size_t& b, size_t& e) {
    return space_opt_run(s, pos, b, e, [](unsigned, uint32_t cp) { return in_ranges(kDsLetters, cp); });
}
Result ds_punct(std::string_view s, size_t pos, size_t& b, size_t& e) {
    return space_opt_run(s, pos, b, e, [](unsigned, uint32_t cp) { return in_ranges(kDsPunct, cp); });
}

// \s+$ ($: the end, or before a final newline): the trailing white space.
Result trailing_space(std::string_view s, size_t pos, size_t& b, size_t& e) {
    const Cursor c(s);
    size_t run_start = kBail;
    for (size_t i = pos; i < c.n;) {
        size_t len;
        const unsigned x = c.at(i, len);
        if (x & kUnknown) return Result::Unknown;
        if (x & kSpace) {
            if (run_start == kBail) run_start = i;
        } else {
            run_start = kBail;
        }
        i += len;
    }
    if (run_start == kBail) return Result::NoMatch;
    b = run_start;
    e = c.n;
    return Result::Match;
}

// [\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+ and the V3 CJK/kana class.
Result ds_cjk(std::string_view s, size_t pos, size_t& b, size_t& e) {
    return find_run(s, pos, b, e, [](unsigned, uint32_t cp) {
        return (cp >= 0x800 && cp <= 0x9FA5) || (cp >= 0xAC00 && cp <= 0xD7FF);
    });
}
Result ds3_cjk(std::string_view s, size_t pos, size_t& b, size_t& e) {
    return find_run(s, pos, b, e, [](unsigned, uint32_t cp) {
        return (cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x309F) || (cp >= 0x30A0 && cp <= 0x30FF);
    });
}

const Matcher kMatchers[] = {
    {patterns::kGpt2, gpt2},
    {patterns::kLlama3, llama3<3>},
    {patterns::kQwen2, llama3<1>},
    {patterns::kQwen35, llama3<1, true>},
    {patterns::kGpt4o, gpt4o},
    {patterns::kDeepseek3Main, deepseek3},
    {patterns::kDigit, digit},
    {patterns::kDigitRun, digit_run},
    {patterns::kDigits1to3, digits1to3},
    {patterns::kThreeAsciiDigits, three_digits},
    {patterns::kCrLf, crlf},
    {patterns::kSpaceLetters, space_letters},
    {patterns::kSpacePunct, space_punct},
    {patterns::kFalconPunct, hf_punct_run},
    {patterns::kPunctOne, hf_punct_one},
    {patterns::kDeepseekLlmLetters, ds_letters},
    {patterns::kDeepseekLlmPunct, ds_punct},
    {patterns::kTrailingSpace, trailing_space},
    {patterns::kDeepseekCjk, ds_cjk},
    {patterns::kDeepseek3Cjk, ds3_cjk},
};

}  // namespace

const Matcher* find_matcher(std::string_view pattern) {
    for (const Matcher& m : kMatchers)
        if (pattern == m.pattern) return &m;
    return nullptr;
}

unsigned class_of(uint32_t cp) { return table().get(cp); }

unsigned classify(std::string_view s, size_t pos, size_t& len) { return Cursor(s).at(pos, len); }

}  // namespace quern::fastre
