#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/fast_regex.h"

#include <pcre2.h>

#include <array>
#include <cstdint>
#include <cstring>

#include "tokenizer/patterns.h"
#include "tokenizer/unicode.h"

namespace quern::fastre {

namespace {

constexpr size_t kBail = SIZE_MAX;  // "met a character that is not classified"
constexpr size_t kTableSize = 0x800;

// Class bits of U+0000..U+07FF, read from PCRE2 (UTF + UCP) once.
struct ClassTable {
    std::array<uint8_t, kTableSize> bits{};
    ClassTable() {
        struct Probe {
            const char* pattern;
            unsigned bit;
        };
        const Probe probes[] = {{R"(\A\p{L}\z)", kLetter}, {R"(\A\p{N}\z)", kNumber}, {R"(\A\p{P}\z)", kPunct},
                                {R"(\A\p{S}\z)", kSymbol}, {R"(\A\p{M}\z)", kMark},   {R"(\A\s\z)", kSpace}};
        for (const Probe& p : probes) {
            int err = 0;
            PCRE2_SIZE off = 0;
            pcre2_code* code =
                pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.pattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err,
                              &off, nullptr);
            if (!code) {
                // Cannot happen for these fixed patterns; leave everything unclassified.
                bits.fill(kUnknown);
                return;
            }
            pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
            for (uint32_t cp = 0; cp < kTableSize; ++cp) {
                std::string s;
                unicode::utf8_append(s, cp);
                const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, md, nullptr);
                if (rc >= 0) bits[cp] |= static_cast<uint8_t>(p.bit);
            }
            pcre2_match_data_free(md);
            pcre2_code_free(code);
        }
    }
};

const uint8_t* table() {
    static const ClassTable t;
    return t.bits.data();
}

// Reads characters of one subject with the class table.
struct Cursor {
    std::string_view s;
    const uint8_t* t;
    size_t n;

    explicit Cursor(std::string_view text) : s(text), t(table()), n(text.size()) {}

    unsigned at(size_t i, size_t& len) const {
        const auto b = static_cast<uint8_t>(s[i]);
        if (b < 0x80) {
            len = 1;
            return t[b];
        }
        if (b >= 0xC2 && b <= 0xDF && i + 1 < n && (static_cast<uint8_t>(s[i + 1]) & 0xC0) == 0x80) {
            len = 2;
            return t[((b & 0x1Fu) << 6) | (static_cast<uint8_t>(s[i + 1]) & 0x3Fu)];
        }
        len = 1;
        return kUnknown;
    }

    // End of the run of characters from `i` whose class satisfies `pred`;
    // kBail when an unclassified character is met first.
    template <class Pred>
    size_t run(size_t i, Pred pred) const {
        while (i < n) {
            size_t len;
            const unsigned c = at(i, len);
            if (c & kUnknown) return kBail;
            if (!pred(c, i)) break;
            i += len;
        }
        return i;
    }
};

bool other(unsigned c) { return !(c & (kLetter | kNumber | kSpace)); }  // [^\s\p{L}\p{N}]

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
        if (k & kLetter) return done(c.run(start, [](unsigned x, size_t) { return (x & kLetter) != 0; }), e);
        if (k & kNumber) return done(c.run(start, [](unsigned x, size_t) { return (x & kNumber) != 0; }), e);
        return done(c.run(start, [](unsigned x, size_t) { return other(x); }), e);
    }
    return whitespace_tail(c, pos, e);
}

// ---------------------------------------------------------------- Llama 3 / Qwen2
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,MaxDigits}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
char ascii_lower(uint8_t b) { return static_cast<char>(b >= 'A' && b <= 'Z' ? b + 32 : b); }

template <int MaxDigits>
Result llama3(std::string_view s, size_t pos, size_t& b, size_t& e) {
    const Cursor c(s);
    if (pos >= c.n) return Result::NoMatch;
    size_t len0;
    const unsigned c0 = c.at(pos, len0);
    if (c0 & kUnknown) return Result::Unknown;
    b = pos;
    const char ch = s[pos];
    if (ch == '\'' && pos + 1 < c.n) {
        const auto b1 = static_cast<uint8_t>(s[pos + 1]);
        if (b1 >= 0x80) return Result::Unknown;  // case-insensitive 's' also matches U+017F
        const char l1 = ascii_lower(b1);
        if (l1 == 's' || l1 == 't' || l1 == 'm' || l1 == 'd') return done(pos + 2, e);
        if ((l1 == 'r' || l1 == 'v' || l1 == 'l') && pos + 2 < c.n) {
            const auto b2 = static_cast<uint8_t>(s[pos + 2]);
            if (b2 >= 0x80) return Result::Unknown;
            const char l2 = ascii_lower(b2);
            if ((l1 == 'r' && l2 == 'e') || (l1 == 'v' && l2 == 'e') || (l1 == 'l' && l2 == 'l')) return done(pos + 3, e);
        }
    }
    auto letters = [](unsigned x, size_t) { return (x & kLetter) != 0; };
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (c0 & kLetter) return done(c.run(pos, letters), e);
    if (ch != '\r' && ch != '\n' && !(c0 & kNumber) && pos + len0 < c.n) {
        size_t len1;
        const unsigned c1 = c.at(pos + len0, len1);
        if (c1 & kUnknown) return Result::Unknown;
        if (c1 & kLetter) return done(c.run(pos + len0, letters), e);
    }
    // \p{N}{1,MaxDigits}
    if (c0 & kNumber) {
        size_t i = pos + len0;
        for (int k = 1; k < MaxDigits && i < c.n; ++k) {
            size_t len;
            const unsigned x = c.at(i, len);
            if (x & kUnknown) return Result::Unknown;
            if (!(x & kNumber)) break;
            i += len;
        }
        return done(i, e);
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    size_t start = kBail;
    if (ch == ' ') {
        if (pos + 1 < c.n) {
            size_t len1;
            const unsigned c1 = c.at(pos + 1, len1);
            if (c1 & kUnknown) return Result::Unknown;
            if (other(c1)) start = pos + 1;
        }
    } else if (other(c0)) {
        start = pos;
    }
    if (start != kBail) {
        size_t end = c.run(start, [](unsigned x, size_t) { return other(x); });
        if (end == kBail) return Result::Unknown;
        while (end < c.n && (s[end] == '\r' || s[end] == '\n')) ++end;
        return done(end, e);
    }
    // c0 is \s here. \s*[\r\n]+ : up to the last CR/LF of the run.
    size_t i = pos, last_crlf = kBail;
    while (i < c.n) {
        size_t len;
        const unsigned x = c.at(i, len);
        if (x & kUnknown) return Result::Unknown;
        if (!(x & kSpace)) break;
        if (s[i] == '\r' || s[i] == '\n') last_crlf = i;
        i += len;
    }
    if (last_crlf != kBail) return done(last_crlf + 1, e);
    return whitespace_tail(c, pos, e);
}

// ---------------------------------------------------------------- searches
// Leftmost run of characters satisfying `pred`, at most `max_chars` long.
template <class Pred>
Result find_run(std::string_view s, size_t pos, size_t& b, size_t& e, Pred pred, size_t max_chars = SIZE_MAX) {
    const Cursor c(s);
    for (size_t i = pos; i < c.n;) {
        size_t len;
        const unsigned x = c.at(i, len);
        if (x & kUnknown) return Result::Unknown;
        if (pred(x, i)) {
            b = i;
            size_t j = i + len, count = 1;
            while (j < c.n && count < max_chars) {
                const unsigned y = c.at(j, len);
                if (y & kUnknown) return Result::Unknown;
                if (!pred(y, j)) break;
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

Result digit(std::string_view s, size_t pos, size_t& b, size_t& e) {
    return find_run(s, pos, b, e, [](unsigned x, size_t) { return (x & kNumber) != 0; }, 1);
}
Result digits1to3(std::string_view s, size_t pos, size_t& b, size_t& e) {
    return find_run(s, pos, b, e, [](unsigned x, size_t) { return (x & kNumber) != 0; }, 3);
}
Result digit_run(std::string_view s, size_t pos, size_t& b, size_t& e) {
    return find_run(s, pos, b, e, [](unsigned x, size_t) { return (x & kNumber) != 0; });
}

// [\p{P}\$\+<=>\^~\|`]+
Result falcon_punct(std::string_view s, size_t pos, size_t& b, size_t& e) {
    return find_run(s, pos, b, e, [s](unsigned x, size_t i) {
        if (x & kPunct) return true;
        const char ch = s[i];
        return ch == '$' || ch == '+' || ch == '<' || ch == '=' || ch == '>' || ch == '^' || ch == '~' || ch == '|' ||
               ch == '`';
    });
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
template <unsigned Want>
Result space_opt_run(std::string_view s, size_t pos, size_t& b, size_t& e) {
    const Cursor c(s);
    auto want = [](unsigned x, size_t) { return (x & Want) != 0; };
    for (size_t i = pos; i < c.n;) {
        size_t len;
        const unsigned x = c.at(i, len);
        if (x & kUnknown) return Result::Unknown;
        if (x & Want) {
            b = i;
            return done(c.run(i, want), e);
        }
        if ((x & kSpace) && i + len < c.n) {
            size_t len1;
            const unsigned y = c.at(i + len, len1);
            if (y & kUnknown) return Result::Unknown;
            if (y & Want) {
                b = i;
                return done(c.run(i + len, want), e);
            }
        }
        i += len;
    }
    return Result::NoMatch;
}

// Classes of code points at or above U+0800 only (the CJK / kana runs).
Result beyond_table(std::string_view s, size_t pos, size_t&, size_t&) {
    const Cursor c(s);
    for (size_t i = pos; i < c.n;) {
        size_t len;
        if (c.at(i, len) & kUnknown) return Result::Unknown;
        i += len;
    }
    return Result::NoMatch;
}

const Matcher kMatchers[] = {
    {patterns::kGpt2, gpt2},
    {patterns::kLlama3, llama3<3>},
    {patterns::kQwen2, llama3<1>},
    {patterns::kDigit, digit},
    {patterns::kDigitRun, digit_run},
    {patterns::kDigits1to3, digits1to3},
    {patterns::kThreeAsciiDigits, three_digits},
    {patterns::kCrLf, crlf},
    {patterns::kSpaceLetters, space_opt_run<kLetter>},
    {patterns::kSpacePunct, space_opt_run<kPunct>},
    {patterns::kFalconPunct, falcon_punct},
    {patterns::kDeepseekCjk, beyond_table},
    {patterns::kDeepseek3Cjk, beyond_table},
};

}  // namespace

const Matcher* find_matcher(std::string_view pattern) {
    for (const Matcher& m : kMatchers)
        if (pattern == m.pattern) return &m;
    return nullptr;
}

unsigned classify(std::string_view s, size_t pos, size_t& len) { return Cursor(s).at(pos, len); }

}  // namespace quern::fastre
