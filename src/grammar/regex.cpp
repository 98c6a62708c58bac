#include "grammar/regex.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

#include "core/error.h"

namespace quern::grammar {

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // code point ranges [lo, hi]
constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr size_t kMaxCount = 10000;  // as GBNF's x{m,n}

Ranges normalized(Ranges r) {
    std::sort(r.begin(), r.end());
    Ranges out;
    for (const auto& [lo, hi] : r) {
        if (!out.empty() && lo <= out.back().second + 1) out.back().second = std::max(out.back().second, hi);
        else out.emplace_back(lo, hi);
    }
    return out;
}

Ranges complement(const Ranges& r) {
    Ranges out;
    uint32_t next = 0;
    for (const auto& [lo, hi] : normalized(r)) {
        if (lo > next) out.emplace_back(next, lo - 1);
        next = hi + 1;
    }
    if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
    return out;
}

const Ranges kDigits = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
// ECMA-262 WhiteSpace and LineTerminator.
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '},       {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
                       {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const Ranges kLineEnds = {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}};

/// A code point inside a GBNF class or literal.
std::string gbnf_char(uint32_t cp) {
    char buf[16];
    if (cp <= 0xFFFF) std::snprintf(buf, sizeof buf, "\\u%04X", cp);
    else std::snprintf(buf, sizeof buf, "\\U%08X", cp);
    return buf;
}

/// GBNF for one character of `set` as JSON string text: the characters a
/// JSON string may hold as they are, in a class; the others escaped.
std::string json_chars(const Ranges& set) {
    std::vector<std::string> alts;
    std::string cls;
    std::vector<uint32_t> controls;
    for (const auto& [lo, hi] : normalized(set)) {
        // As they are: everything from U+0020 but " and \ (split around them).
        for (uint32_t a = std::max<uint32_t>(lo, 0x20); a <= hi;) {
            if (a == 0x22 || a == 0x5C) {
                ++a;
                continue;
            }
            uint32_t b = hi;
            if (a < 0x22 && b >= 0x22) b = 0x21;
            else if (a < 0x5C && b >= 0x5C) b = 0x5B;
            cls += gbnf_char(a) + (b > a ? "-" + gbnf_char(b) : "");
            if (b == hi) break;
            a = b + 1;
        }
        for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x1F); ++c) controls.push_back(c);
        if (lo <= 0x22 && hi >= 0x22) alts.push_back(R"("\\\"")");
        if (lo <= 0x5C && hi >= 0x5C) alts.push_back(R"("\\\\")");
    }
    // Controls escaped: the short forms as one class, the others as \u00XX
    // grouped by their high digit (few alternatives: each is a stack the
    // matcher carries).
    std::string shorts, low[2];
    for (uint32_t c : controls) {
        const char* f = c == '\n' ? "n" : c == '\t' ? "t" : c == '\r' ? "r" : c == 8 ? "b" : c == 12 ? "f" : nullptr;
        if (f) shorts += f;
        else low[c >> 4] += "0123456789abcdef"[c & 15];
    }
    if (!shorts.empty()) alts.push_back(R"("\\" [)" + shorts + "]");
    for (int h = 0; h < 2; ++h)
        if (!low[h].empty()) alts.push_back(std::string(R"("\\u00)") + char('0' + h) + "\" [" + low[h] + "]");
    if (!cls.empty()) alts.insert(alts.begin(), "[" + cls + "]");
    if (alts.empty()) fail("pattern: a character class that matches no character");
    if (alts.size() == 1) return alts[0];
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : " ") + alts[i];
    return out + " )";
}

/// GBNF for one character of `set` as itself (plain text).
std::string text_chars(const Ranges& set) {
    std::string cls;
    for (const auto& [lo, hi] : normalized(set)) cls += gbnf_char(lo) + (hi > lo ? "-" + gbnf_char(hi) : "");
    if (cls.empty()) fail("pattern: a character class that matches no character");
    return "[" + cls + "]";
}

/// Recursive descent over the pattern, writing GBNF as it goes.
class RegexParser {
public:
    RegexParser(std::string_view p, RegexTarget target) : p_(p), target_(target) {}

    std::string run() {
        bool start = false, end = false;
        if (!p_.empty() && p_[0] == '^') {
            start = true;
            p_.remove_prefix(1);
        }
        if (!p_.empty() && p_.back() == '$') {
            size_t slashes = 0;  // an escaped \$ is a literal
            for (size_t k = p_.size() - 1; k > 0 && p_[k - 1] == '\\'; --k) ++slashes;
            if (slashes % 2 == 0) {
                end = true;
                p_.remove_suffix(1);
            }
        }
        int alternatives = 0;
        const std::string body = alternation(alternatives);
        if (i_ < p_.size()) refuse("an unmatched ')'");
        if ((start || end) && alternatives > 1 && target_ == RegexTarget::JsonString)
            refuse("anchors around a top-level alternation (write ^(a|b)$ for either whole string)");
        if (target_ == RegexTarget::Text) return "( " + body + " )";  // matched whole
        return std::string(start ? "" : "char* ") + "( " + body + " )" + (end ? "" : " char*");
    }

private:
    std::string chars(const Ranges& set) const { return target_ == RegexTarget::Text ? text_chars(set) : json_chars(set); }
    [[noreturn]] void refuse(const std::string& what) const {
        fail("pattern '{}': {} at offset {} is not supported", std::string(p_), what, i_);
    }
    bool at(char c) const { return i_ < p_.size() && p_[i_] == c; }

    std::string alternation(int& count) {
        std::string out = sequence();
        count = 1;
        while (at('|')) {
            ++i_;
            out += " | " + sequence();
            ++count;
        }
        return out;
    }

    std::string sequence() {
        std::string out;
        while (i_ < p_.size() && !at('|') && !at(')')) {
            std::string a = atom();
            a = quantified(std::move(a));
            out += (out.empty() ? "" : " ") + a;
        }
        return out.empty() ? "\"\"" : out;
    }

    /// Reads a count, or returns false (the '{' is then a literal).
    bool number(size_t& v) {
        const size_t b = i_;
        v = 0;
        while (i_ < p_.size() && p_[i_] >= '0' && p_[i_] <= '9') {
            v = v * 10 + static_cast<size_t>(p_[i_++] - '0');
            if (v > kMaxCount) refuse("a count above 10000");
        }
        return i_ > b;
    }

    std::string quantified(std::string a) {
        for (;;) {
            std::string suffix;
            if (at('*') || at('+') || at('?')) {
                suffix = std::string(1, p_[i_++]);
            } else if (at('{')) {
                const size_t b = i_++;
                size_t m = 0, n = 0;
                bool ok = number(m), unbounded = false;
                n = m;
                if (ok && at(',')) {
                    ++i_;
                    if (at('}')) unbounded = true;
                    else ok = number(n);
                }
                ok = ok && at('}');
                if (!ok) {  // not a quantifier: '{' stands for itself (as ECMA-262 Annex B reads it)
                    i_ = b;
                    return a;
                }
                ++i_;
                if (!unbounded && n < m) refuse("a count {m,n} with n below m");
                suffix = "{" + std::to_string(m) + (unbounded ? "," : m == n ? "" : "," + std::to_string(n)) + "}";
            } else {
                return a;
            }
            if (at('?')) ++i_;  // lazy: the same strings
            a = "( " + a + " )" + suffix;
        }
    }

    uint32_t hex(int digits) {
        uint32_t v = 0;
        for (int k = 0; k < digits; ++k, ++i_) {
            if (i_ >= p_.size()) refuse("a short hex escape");
            const char c = p_[i_];
            const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0) refuse("a bad hex escape");
            v = v * 16 + static_cast<uint32_t>(d);
        }
        return v;
    }

    uint32_t utf8() {
        const auto b = static_cast<uint8_t>(p_[i_]);
        const int n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
        if (i_ + static_cast<size_t>(n) > p_.size()) refuse("a truncated UTF-8 character");
        uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1Fu) : n == 3 ? (b & 0x0Fu) : (b & 0x07u);
        for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(p_[i_ + static_cast<size_t>(k)]) & 0x3Fu);
        i_ += static_cast<size_t>(n);
        return cp;
    }

    /// After a backslash: the set it stands for. `in_class`: \b is a backspace.
    Ranges escape(bool in_class) {
        if (i_ >= p_.size()) refuse("a trailing backslash");
        const char c = p_[i_++];
        switch (c) {
            case 'd': return kDigits;
            case 'D': return complement(kDigits);
            case 'w': return kWord;
            case 'W': return complement(kWord);
            case 's': return kSpace;
            case 'S': return complement(kSpace);
            case 'n': return {{'\n', '\n'}};
            case 't': return {{'\t', '\t'}};
            case 'r': return {{'\r', '\r'}};
            case 'f': return {{'\f', '\f'}};
            case 'v': return {{'\v', '\v'}};
            case '0': return {{0, 0}};
            case 'x': {
                const uint32_t v = hex(2);
                return {{v, v}};
            }
            case 'u': {
                uint32_t v;
                if (at('{')) {
                    ++i_;
                    v = 0;
                    while (!at('}')) v = v * 16 + hex(1);
                    ++i_;
                } else {
                    v = hex(4);
                }
                if (v > kMaxCodePoint) refuse("a code point past U+10FFFF");
                return {{v, v}};
            }
            case 'c': {
                if (i_ >= p_.size()) refuse("a bad \\c escape");
                const uint32_t v = static_cast<uint32_t>(p_[i_++]) % 32;
                return {{v, v}};
            }
            case 'b':
                if (in_class) return {{8, 8}};
                --i_;
                refuse("the word boundary \\b");
            case 'B': --i_; refuse("the word boundary \\B");
            case 'k': --i_; refuse("a named backreference");
            case 'p': case 'P': --i_; refuse("a Unicode property escape");
            default:
                if (c >= '1' && c <= '9') {
                    --i_;
                    refuse("a backreference");
                }
                --i_;
                const uint32_t cp = utf8();
                return {{cp, cp}};
        }
    }

    Ranges bracket() {  // after '['
        bool negate = false;
        if (at('^')) {
            negate = true;
            ++i_;
        }
        Ranges set;
        while (i_ < p_.size() && !at(']')) {  // `[]` is empty, `[^]` everything (ECMA-262)
            Ranges one;
            if (at('\\')) {
                ++i_;
                one = escape(true);
            } else {
                const uint32_t cp = utf8();
                one = {{cp, cp}};
            }
            if (one.size() == 1 && one[0].first == one[0].second && at('-') && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
                ++i_;
                Ranges hi;
                if (at('\\')) {
                    ++i_;
                    hi = escape(true);
                } else {
                    const uint32_t cp = utf8();
                    hi = {{cp, cp}};
                }
                if (hi.size() != 1 || hi[0].first != hi[0].second) refuse("a range ending in a class escape");
                if (hi[0].first < one[0].first) refuse("a range whose end is below its start");
                one = {{one[0].first, hi[0].first}};
            }
            set.insert(set.end(), one.begin(), one.end());
        }
        if (!at(']')) refuse("an unclosed '['");
        ++i_;
        return negate ? complement(set) : normalized(set);
    }

    std::string atom() {
        const char c = p_[i_];
        if (c == '(') {
            ++i_;
            if (at('?')) {
                if (p_.substr(i_, 2) == "?:") {
                    i_ += 2;
                } else if (p_.substr(i_, 2) == "?<" && p_.substr(i_, 3) != "?<=" && p_.substr(i_, 3) != "?<!") {
                    const size_t close = p_.find('>', i_);
                    if (close == std::string_view::npos) refuse("an unclosed group name");
                    i_ = close + 1;
                } else {
                    refuse("a lookaround or inline flag group");
                }
            }
            int unused = 0;
            const std::string inner = alternation(unused);
            if (!at(')')) refuse("an unclosed '('");
            ++i_;
            return "( " + inner + " )";
        }
        if (c == '[') {
            ++i_;
            return chars(bracket());
        }
        if (c == '.') {
            ++i_;
            return chars(complement(kLineEnds));
        }
        if (c == '\\') {
            ++i_;
            return chars(escape(false));
        }
        if (c == '^' || c == '$') refuse(std::string("the anchor '") + c + "' inside the pattern");
        if (c == '*' || c == '+' || c == '?') refuse("a quantifier with nothing before it");
        const uint32_t cp = utf8();
        return chars({{cp, cp}});
    }

    std::string_view p_;
    RegexTarget target_;
    size_t i_ = 0;
};

}  // namespace

std::string regex_to_gbnf(std::string_view pattern, RegexTarget target) { return RegexParser(pattern, target).run(); }

}  // namespace quern::grammar
