// Python str semantics on UTF-8 text (see pystr.h).
#include "chat/pystr.h"

#include <algorithm>

#include "chat/value.h"

namespace quern::jinja::pystr {

uint32_t next_cp(std::string_view s, size_t& pos) {
    const auto b0 = static_cast<uint8_t>(s[pos]);
    if (b0 < 0x80) {
        ++pos;
        return b0;
    }
    int n = 0;
    uint32_t cp = 0, min = 0;
    if ((b0 & 0xE0) == 0xC0) n = 1, cp = b0 & 0x1F, min = 0x80;
    else if ((b0 & 0xF0) == 0xE0) n = 2, cp = b0 & 0x0F, min = 0x800;
    else if ((b0 & 0xF8) == 0xF0) n = 3, cp = b0 & 0x07, min = 0x10000;
    if (n > 0 && pos + n < s.size()) {
        bool ok = true;
        for (int k = 1; k <= n; ++k) {
            const auto b = static_cast<uint8_t>(s[pos + k]);
            if ((b & 0xC0) != 0x80) {
                ok = false;
                break;
            }
            cp = (cp << 6) | (b & 0x3F);
        }
        if (ok && cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF)) {
            pos += n + 1;
            return cp;
        }
    }
    ++pos;
    return 0xDC00 + b0;  // surrogateescape
}

void append_cp(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp >= 0xDC80 && cp <= 0xDCFF) {
        out.push_back(static_cast<char>(cp - 0xDC00));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

std::u32string decode(std::string_view s) {
    std::u32string r;
    r.reserve(s.size());
    for (size_t i = 0; i < s.size();) r.push_back(next_cp(s, i));
    return r;
}

std::string encode(std::u32string_view s) {
    std::string r;
    r.reserve(s.size());
    for (char32_t c : s) append_cp(r, c);
    return r;
}

bool is_ascii(std::string_view s) {
    for (char c : s)
        if (static_cast<uint8_t>(c) >= 0x80) return false;
    return true;
}

size_t length(std::string_view s) {
    size_t n = 0;
    for (size_t i = 0; i < s.size(); ++n) next_cp(s, i);
    return n;
}

size_t byte_offset(std::string_view s, size_t index) {
    size_t i = 0;
    for (size_t k = 0; k < index && i < s.size(); ++k) next_cp(s, i);
    return i;
}

// ------------------------------------------------------------------ classes

bool is_space(uint32_t c) {
    if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
    if (c < 0x85) return false;
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_printable(uint32_t c) {
    if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return false;
    if (c < 0x300) return true;
    if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x206F) ||
        c == 0x3000)
        return false;
    if ((c >= 0x600 && c <= 0x605) || c == 0x61C || c == 0x6DD || c == 0x70F || c == 0x180E || c == 0x8E2) return false;
    if (c >= 0xD800 && c <= 0xF8FF) return false;  // surrogates, private use
    if (c == 0xFEFF || (c >= 0xFFF0 && c <= 0xFFFB) || c == 0xFFFE || c == 0xFFFF) return false;
    if ((c >= 0x1BCA0 && c <= 0x1BCA3) || (c >= 0x1D173 && c <= 0x1D17A)) return false;
    if (c >= 0xE0000) return false;  // tags, private use planes
    return true;
}

namespace {

struct Pair {
    uint32_t lo, hi;  // inclusive range of upper-case code points
    int32_t delta;    // lower = upper + delta
    uint8_t stride;   // 1: every code point; 2: alternating upper/lower pairs
};

// Simple case pairs of the common scripts (Latin, Greek, Cyrillic, Armenian,
// Georgian, Cherokee-free, fullwidth, Deseret).
const Pair kPairs[] = {
    {0x41, 0x5A, 32, 1},       {0xC0, 0xD6, 32, 1},       {0xD8, 0xDE, 32, 1},       {0x100, 0x12E, 1, 2},
    {0x132, 0x136, 1, 2},      {0x139, 0x147, 1, 2},      {0x14A, 0x176, 1, 2},      {0x179, 0x17D, 1, 2},
    {0x182, 0x184, 1, 2},      {0x1A0, 0x1A4, 1, 2},      {0x1B3, 0x1B5, 1, 2},      {0x1CD, 0x1DB, 1, 2},
    {0x1DE, 0x1EE, 1, 2},      {0x1F8, 0x21E, 1, 2},      {0x222, 0x232, 1, 2},      {0x246, 0x24E, 1, 2},
    {0x370, 0x372, 1, 2},      {0x376, 0x376, 1, 1},      {0x386, 0x386, 38, 1},     {0x388, 0x38A, 37, 1},
    {0x38C, 0x38C, 64, 1},     {0x38E, 0x38F, 63, 1},     {0x391, 0x3A1, 32, 1},     {0x3A3, 0x3AB, 32, 1},
    {0x3D8, 0x3EE, 1, 2},      {0x400, 0x40F, 80, 1},     {0x410, 0x42F, 32, 1},     {0x460, 0x480, 1, 2},
    {0x48A, 0x4BE, 1, 2},      {0x4C1, 0x4CD, 1, 2},      {0x4D0, 0x52E, 1, 2},      {0x531, 0x556, 48, 1},
    {0x10A0, 0x10C5, 7264, 1}, {0x1E00, 0x1E94, 1, 2},    {0x1EA0, 0x1EFE, 1, 2},    {0x1F08, 0x1F0F, -8, 1},
    {0x1F18, 0x1F1D, -8, 1},   {0x1F28, 0x1F2F, -8, 1},   {0x1F38, 0x1F3F, -8, 1},   {0x1F48, 0x1F4D, -8, 1},
    {0x1F68, 0x1F6F, -8, 1},   {0x2160, 0x216F, 16, 1},   {0x24B6, 0x24CF, 26, 1},   {0x2C00, 0x2C2F, 48, 1},
    {0x2C80, 0x2CE2, 1, 2},    {0xA640, 0xA66C, 1, 2},    {0xA680, 0xA69A, 1, 2},    {0xA722, 0xA72E, 1, 2},
    {0xA732, 0xA76E, 1, 2},    {0xA779, 0xA77B, 1, 2},    {0xA77E, 0xA786, 1, 2},    {0xA790, 0xA792, 1, 2},
    {0xA796, 0xA7A8, 1, 2},    {0xFF21, 0xFF3A, 32, 1},   {0x10400, 0x10427, 40, 1}, {0x1E900, 0x1E921, 34, 1},
};

bool in_pair(const Pair& p, uint32_t c) { return c >= p.lo && c <= p.hi && (p.stride == 1 || (c - p.lo) % 2 == 0); }

}  // namespace

uint32_t to_lower(uint32_t c) {
    if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
    if (c == 0x130) return 'i';  // Python maps İ to "i̇"; the simple mapping is i
    for (const Pair& p : kPairs)
        if (in_pair(p, c)) return static_cast<uint32_t>(static_cast<int64_t>(c) + p.delta);
    return c;
}

uint32_t to_upper(uint32_t c) {
    if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
    if (c == 0xB5) return 0x39C;
    if (c == 0xFF) return 0x178;
    if (c == 0x131) return 'I';
    if (c == 0x17F) return 'S';
    if (c == 0x3C2) return 0x3A3;
    for (const Pair& p : kPairs) {
        const int64_t u = static_cast<int64_t>(c) - p.delta;
        if (u >= 0 && in_pair(p, static_cast<uint32_t>(u))) return static_cast<uint32_t>(u);
    }
    return c;
}

bool is_upper(uint32_t c) { return to_lower(c) != c; }
bool is_lower(uint32_t c) {
    if (c == 0xDF || c == 0x138 || c == 0x149) return true;
    return to_upper(c) != c;
}

bool is_alpha(uint32_t c) {
    if (c < 0x80) return (c | 32) >= 'a' && (c | 32) <= 'z';
    if (c == 0xAA || c == 0xB5 || c == 0xBA) return true;
    if (c < 0xC0 || c == 0xD7 || c == 0xF7) return false;
    if (c < 0x2C2) return true;
    if (is_upper(c) || is_lower(c)) return true;
    return (c >= 0x5D0 && c <= 0x5EA) || (c >= 0x620 && c <= 0x64A) || (c >= 0x904 && c <= 0x939) ||
           (c >= 0xE01 && c <= 0xE30) || (c >= 0x3041 && c <= 0x3096) || (c >= 0x30A1 && c <= 0x30FA) ||
           (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0xAC00 && c <= 0xD7A3) ||
           (c >= 0x20000 && c <= 0x2FA1F);
}

bool is_decimal(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    static const uint32_t zeros[] = {0x660, 0x6F0, 0x7C0, 0x966, 0x9E6, 0xA66, 0xAE6, 0xB66, 0xBE6, 0xC66,
                                     0xCE6, 0xD66, 0xE50, 0xED0, 0xF20, 0x1040, 0x17E0, 0x1810, 0xFF10};
    for (uint32_t z : zeros)
        if (c >= z && c <= z + 9) return true;
    return false;
}

bool is_digit(uint32_t c) {
    return is_decimal(c) || c == 0xB2 || c == 0xB3 || c == 0xB9 || (c >= 0x2070 && c <= 0x2079 && c != 0x2071 &&
                                                                     c != 0x2072 && c != 0x2073) ||
           (c >= 0x2080 && c <= 0x2089) || (c >= 0x2460 && c <= 0x2468);
}

bool is_numeric(uint32_t c) {
    return is_digit(c) || (c >= 0xBC && c <= 0xBE) || (c >= 0x2150 && c <= 0x2182) || c == 0x3007 ||
           c == 0x4E00 || c == 0x4E8C || c == 0x4E09 || c == 0x56DB || c == 0x4E94 || c == 0x516D || c == 0x4E03 ||
           c == 0x516B || c == 0x4E5D || c == 0x5341 || c == 0x767E || c == 0x5343 || c == 0x4E07;
}

// ------------------------------------------------------------------ case

namespace {
template <class F>
std::string map_cps(std::string_view s, F f) {
    std::string r;
    r.reserve(s.size());
    for (size_t i = 0; i < s.size();) f(r, next_cp(s, i));
    return r;
}
void put_upper(std::string& r, uint32_t c) {
    if (c == 0xDF) r += "SS";
    else append_cp(r, to_upper(c));
}
bool is_cased(uint32_t c) { return is_upper(c) || is_lower(c); }
}  // namespace

std::string upper(std::string_view s) {
    if (is_ascii(s)) {
        std::string r(s);
        for (char& c : r)
            if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
        return r;
    }
    return map_cps(s, put_upper);
}

std::string lower(std::string_view s) {
    if (is_ascii(s)) {
        std::string r(s);
        for (char& c : r)
            if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
        return r;
    }
    return map_cps(s, [](std::string& r, uint32_t c) { append_cp(r, to_lower(c)); });
}

std::string title(std::string_view s) {
    bool prev_cased = false;
    return map_cps(s, [&](std::string& r, uint32_t c) {
        if (prev_cased) append_cp(r, to_lower(c));
        else put_upper(r, c);
        prev_cased = is_cased(c);
    });
}

std::string capitalize(std::string_view s) {
    bool first = true;
    return map_cps(s, [&](std::string& r, uint32_t c) {
        if (first) put_upper(r, c);
        else append_cp(r, to_lower(c));
        first = false;
    });
}

std::string swapcase(std::string_view s) {
    return map_cps(s, [](std::string& r, uint32_t c) {
        if (is_upper(c)) append_cp(r, to_lower(c));
        else if (is_lower(c)) put_upper(r, c);
        else append_cp(r, c);
    });
}

bool str_isupper(std::string_view s) {
    bool cased = false;
    for (size_t i = 0; i < s.size();) {
        const uint32_t c = next_cp(s, i);
        if (is_lower(c)) return false;
        if (is_upper(c)) cased = true;
    }
    return cased;
}

bool str_islower(std::string_view s) {
    bool cased = false;
    for (size_t i = 0; i < s.size();) {
        const uint32_t c = next_cp(s, i);
        if (is_upper(c)) return false;
        if (is_lower(c)) cased = true;
    }
    return cased;
}

bool str_istitle(std::string_view s) {
    bool cased = false, prev_cased = false;
    for (size_t i = 0; i < s.size();) {
        const uint32_t c = next_cp(s, i);
        if (is_upper(c)) {
            if (prev_cased) return false;
            prev_cased = cased = true;
        } else if (is_lower(c)) {
            if (!prev_cased) return false;
            prev_cased = cased = true;
        } else {
            prev_cased = false;
        }
    }
    return cased;
}

bool str_all(std::string_view s, bool (*pred)(uint32_t)) {
    if (s.empty()) return false;
    for (size_t i = 0; i < s.size();)
        if (!pred(next_cp(s, i))) return false;
    return true;
}

// ------------------------------------------------------------------ strip / split

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
    const std::u32string set = chars ? decode(*chars) : std::u32string();
    auto strip_it = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : is_space(c); };
    if (is_ascii(s)) {
        size_t b = 0, e = s.size();
        if (left)
            while (b < e && strip_it(static_cast<unsigned char>(s[b]))) ++b;
        if (right)
            while (e > b && strip_it(static_cast<unsigned char>(s[e - 1]))) --e;
        return std::string(s.substr(b, e - b));
    }
    const std::u32string u = decode(s);
    size_t b = 0, e = u.size();
    if (left)
        while (b < e && strip_it(u[b])) ++b;
    if (right)
        while (e > b && strip_it(u[e - 1])) --e;
    return encode(std::u32string_view(u).substr(b, e - b));
}

namespace {
// Whitespace run boundaries as byte ranges of words.
std::vector<std::pair<size_t, size_t>> ws_words(std::string_view s) {
    std::vector<std::pair<size_t, size_t>> w;
    size_t i = 0;
    while (i < s.size()) {
        size_t p = i;
        if (is_space(next_cp(s, p))) {
            i = p;
            continue;
        }
        const size_t start = i;
        i = p;
        while (i < s.size()) {
            p = i;
            if (is_space(next_cp(s, p))) break;
            i = p;
        }
        w.emplace_back(start, i);
    }
    return w;
}
}  // namespace

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
    std::vector<std::string> r;
    if (!sep) {
        const auto w = ws_words(s);
        for (size_t k = 0; k < w.size(); ++k) {
            if (maxsplit >= 0 && static_cast<int64_t>(k) == maxsplit) {
                r.emplace_back(s.substr(w[k].first));
                return r;
            }
            r.emplace_back(s.substr(w[k].first, w[k].second - w[k].first));
        }
        return r;
    }
    if (sep->empty()) raise("ValueError", "empty separator");
    size_t pos = 0;
    int64_t n = 0;
    while (maxsplit < 0 || n < maxsplit) {
        const size_t f = s.find(*sep, pos);
        if (f == std::string_view::npos) break;
        r.emplace_back(s.substr(pos, f - pos));
        pos = f + sep->size();
        ++n;
    }
    r.emplace_back(s.substr(pos));
    return r;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
    std::vector<std::string> r;
    if (!sep) {
        const auto w = ws_words(s);
        int64_t n = 0;
        for (size_t k = w.size(); k-- > 0;) {
            if (maxsplit >= 0 && n == maxsplit) {
                r.emplace_back(s.substr(0, w[k].second));
                break;
            }
            r.emplace_back(s.substr(w[k].first, w[k].second - w[k].first));
            ++n;
        }
        std::reverse(r.begin(), r.end());
        return r;
    }
    if (sep->empty()) raise("ValueError", "empty separator");
    size_t end = s.size();
    int64_t n = 0;
    while (maxsplit < 0 || n < maxsplit) {
        if (end < sep->size()) break;
        const size_t f = s.rfind(*sep, end - sep->size());
        if (f == std::string_view::npos) break;
        r.emplace_back(s.substr(f + sep->size(), end - f - sep->size()));
        end = f;
        ++n;
    }
    r.emplace_back(s.substr(0, end));
    std::reverse(r.begin(), r.end());
    return r;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
    std::vector<std::string> r;
    size_t start = 0, i = 0;
    while (i < s.size()) {
        size_t p = i;
        const uint32_t c = next_cp(s, p);
        const bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 ||
                         c == 0x2028 || c == 0x2029;
        if (!brk) {
            i = p;
            continue;
        }
        size_t eol = p;
        if (c == '\r' && eol < s.size() && s[eol] == '\n') ++eol;
        r.emplace_back(s.substr(start, (keepends ? eol : i) - start));
        start = i = eol;
    }
    if (start < s.size()) r.emplace_back(s.substr(start));
    return r;
}

std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
    std::string r;
    if (old.empty()) {
        int64_t n = 0;
        size_t i = 0;
        while (true) {
            if (count >= 0 && n >= count) {
                r.append(s.substr(i));
                break;
            }
            r.append(repl);
            ++n;
            if (i >= s.size()) break;
            const size_t st = i;
            next_cp(s, i);
            r.append(s.substr(st, i - st));
        }
        return r;
    }
    size_t pos = 0;
    int64_t n = 0;
    while (count < 0 || n < count) {
        const size_t f = s.find(old, pos);
        if (f == std::string_view::npos) break;
        r.append(s.substr(pos, f - pos));
        r.append(repl);
        pos = f + old.size();
        ++n;
    }
    r.append(s.substr(pos));
    return r;
}

int64_t find(std::string_view s, std::string_view sub, int64_t start, int64_t end, bool reverse) {
    if (end < start) return -1;
    const size_t b = byte_offset(s, static_cast<size_t>(start));
    const size_t e = byte_offset(s, static_cast<size_t>(end));
    const std::string_view win = s.substr(b, e - b);
    const size_t f = reverse ? win.rfind(sub) : win.find(sub);
    if (f == std::string_view::npos) return -1;
    return start + static_cast<int64_t>(length(win.substr(0, f)));
}

int64_t count(std::string_view s, std::string_view sub) {
    if (sub.empty()) return static_cast<int64_t>(length(s)) + 1;
    int64_t n = 0;
    for (size_t pos = 0; (pos = s.find(sub, pos)) != std::string_view::npos; pos += sub.size()) ++n;
    return n;
}

std::string pad(std::string_view s, int64_t width, uint32_t fill, char align) {
    const int64_t len = static_cast<int64_t>(length(s));
    if (width <= len) return std::string(s);
    const int64_t total = width - len;
    int64_t left = 0;
    if (align == '>') left = total;
    else if (align == '^') left = total / 2 + (total & width & 1);  // Python's centering rule
    std::string f;
    append_cp(f, fill);
    std::string r;
    for (int64_t k = 0; k < left; ++k) r += f;
    r += s;
    for (int64_t k = 0; k < total - left; ++k) r += f;
    return r;
}

std::string zfill(std::string_view s, int64_t width) {
    const int64_t len = static_cast<int64_t>(length(s));
    if (width <= len) return std::string(s);
    std::string r;
    size_t i = 0;
    if (!s.empty() && (s[0] == '+' || s[0] == '-')) r.push_back(s[0]), i = 1;
    r.append(static_cast<size_t>(width - len), '0');
    r.append(s.substr(i));
    return r;
}

std::string html_escape(std::string_view s) {
    std::string r;
    r.reserve(s.size());
    for (char c : s) {
        switch (c) {
            case '&': r += "&amp;"; break;
            case '<': r += "&lt;"; break;
            case '>': r += "&gt;"; break;
            case '"': r += "&#34;"; break;
            case '\'': r += "&#39;"; break;
            default: r.push_back(c);
        }
    }
    return r;
}

}  // namespace quern::jinja::pystr
