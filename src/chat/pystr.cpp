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

namespace {

struct CaseMap {
    uint32_t cp;
    uint32_t to[3];
};

#include "chat/pystr_tables.inc"

template <size_t N>
bool in_ranges(const uint32_t (&r)[N][2], uint32_t c) {
    size_t lo = 0, hi = N;
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (c < r[mid][0]) hi = mid;
        else if (c > r[mid][1]) lo = mid + 1;
        else return true;
    }
    return false;
}

template <size_t N>
const CaseMap* find_map(const CaseMap (&m)[N], uint32_t c) {
    const CaseMap* it = std::lower_bound(m, m + N, c, [](const CaseMap& e, uint32_t v) { return e.cp < v; });
    return (it != m + N && it->cp == c) ? it : nullptr;
}

// Appends the (full) case mapping of c, or c itself.
template <size_t N>
void put_mapped(std::string& r, const CaseMap (&m)[N], uint32_t c) {
    if (const CaseMap* e = find_map(m, c)) {
        for (uint32_t t : e->to)
            if (t) append_cp(r, t);
    } else {
        append_cp(r, c);
    }
}

bool is_title(uint32_t c) { return in_ranges(kTitlecaseRanges, c); }
bool is_cased(uint32_t c) { return c < 0x80 ? ((c | 32) >= 'a' && (c | 32) <= 'z') : in_ranges(kCasedRanges, c); }
bool is_case_ignorable(uint32_t c) { return in_ranges(kCaseIgnorableRanges, c); }

void put_upper(std::string& r, uint32_t c) {
    if (c < 0x80) r.push_back(static_cast<char>((c >= 'a' && c <= 'z') ? c - 32 : c));
    else put_mapped(r, kUpperMap, c);
}
void put_lower(std::string& r, uint32_t c) {
    if (c < 0x80) r.push_back(static_cast<char>((c >= 'A' && c <= 'Z') ? c + 32 : c));
    else put_mapped(r, kLowerMap, c);
}
void put_title(std::string& r, uint32_t c) {
    if (const CaseMap* e = find_map(kTitleMap, c)) {
        for (uint32_t t : e->to)
            if (t) append_cp(r, t);
    } else {
        put_upper(r, c);
    }
}

}  // namespace

bool is_printable(uint32_t c) {
    if (c >= 0xDC80 && c <= 0xDCFF) return false;  // an escaped invalid byte (a lone surrogate in Python)
    return in_ranges(kPrintableRanges, c);
}
bool is_alpha(uint32_t c) { return c < 0x80 ? ((c | 32) >= 'a' && (c | 32) <= 'z') : in_ranges(kAlphaRanges, c); }
bool is_decimal(uint32_t c) { return c < 0x80 ? (c >= '0' && c <= '9') : in_ranges(kDecimalRanges, c); }
bool is_digit(uint32_t c) { return c < 0x80 ? (c >= '0' && c <= '9') : in_ranges(kDigitRanges, c); }
bool is_numeric(uint32_t c) { return c < 0x80 ? (c >= '0' && c <= '9') : in_ranges(kNumericRanges, c); }
bool is_upper(uint32_t c) { return c < 0x80 ? (c >= 'A' && c <= 'Z') : in_ranges(kUpperRanges, c); }
bool is_lower(uint32_t c) { return c < 0x80 ? (c >= 'a' && c <= 'z') : in_ranges(kLowerRanges, c); }

uint32_t to_upper(uint32_t c) {
    if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
    const CaseMap* e = find_map(kUpperMap, c);
    return (e && !e->to[1]) ? e->to[0] : c;
}

uint32_t to_lower(uint32_t c) {
    if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
    const CaseMap* e = find_map(kLowerMap, c);
    return (e && !e->to[1]) ? e->to[0] : c;
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

namespace {
// Lowercases u[i] into r, with Python's final-sigma rule: a capital sigma
// after a cased letter and not before one becomes the final form.
void lower_at(const std::u32string& u, size_t i, std::string& r) {
    if (u[i] != 0x3A3) {
        put_lower(r, u[i]);
        return;
    }
    size_t j = i;
    while (j > 0 && is_case_ignorable(u[j - 1])) --j;
    const bool before = j > 0 && is_cased(u[j - 1]);
    j = i + 1;
    while (j < u.size() && is_case_ignorable(u[j])) ++j;
    const bool after = j < u.size() && is_cased(u[j]);
    append_cp(r, before && !after ? 0x3C2 : 0x3C3);
}
}  // namespace

std::string lower(std::string_view s) {
    if (is_ascii(s)) {
        std::string r(s);
        for (char& c : r)
            if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
        return r;
    }
    const std::u32string u = decode(s);
    std::string r;
    r.reserve(s.size());
    for (size_t i = 0; i < u.size(); ++i) lower_at(u, i, r);
    return r;
}

std::string title(std::string_view s) {
    const std::u32string u = decode(s);
    std::string r;
    bool prev_cased = false;
    for (size_t i = 0; i < u.size(); ++i) {
        if (prev_cased) lower_at(u, i, r);
        else put_title(r, u[i]);
        prev_cased = is_cased(u[i]);
    }
    return r;
}

std::string capitalize(std::string_view s) {
    const std::u32string u = decode(s);
    std::string r;
    for (size_t i = 0; i < u.size(); ++i) {
        if (i == 0) put_title(r, u[i]);
        else lower_at(u, i, r);
    }
    return r;
}

std::string swapcase(std::string_view s) {
    const std::u32string u = decode(s);
    std::string r;
    for (size_t i = 0; i < u.size(); ++i) {
        if (is_upper(u[i])) lower_at(u, i, r);
        else if (is_lower(u[i])) put_upper(r, u[i]);
        else append_cp(r, u[i]);
    }
    return r;
}

bool str_isupper(std::string_view s) {
    bool cased = false;
    for (size_t i = 0; i < s.size();) {
        const uint32_t c = next_cp(s, i);
        if (is_lower(c) || is_title(c)) return false;
        if (is_upper(c)) cased = true;
    }
    return cased;
}

bool str_islower(std::string_view s) {
    bool cased = false;
    for (size_t i = 0; i < s.size();) {
        const uint32_t c = next_cp(s, i);
        if (is_upper(c) || is_title(c)) return false;
        if (is_lower(c)) cased = true;
    }
    return cased;
}

bool str_istitle(std::string_view s) {
    bool cased = false, prev_cased = false;
    for (size_t i = 0; i < s.size();) {
        const uint32_t c = next_cp(s, i);
        if (is_upper(c) || is_title(c)) {
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
