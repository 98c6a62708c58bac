#include "tokenizer/unicode.h"

namespace quern::unicode {

Utf8Char utf8_decode(std::string_view s, size_t pos) {
    const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + pos;
    const size_t left = s.size() - pos;
    const uint8_t b0 = p[0];
    if (b0 < 0x80) return {b0, 1, true};
    const int n = utf8_lead_len(b0);
    if (n == 0 || static_cast<size_t>(n) > left) return {b0, 1, false};
    uint32_t cp = b0 & (0x7F >> n);
    for (int i = 1; i < n; ++i) {
        if ((p[i] & 0xC0) != 0x80) return {b0, 1, false};
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are invalid.
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return {b0, 1, false};
    return {cp, static_cast<uint32_t>(n), true};
}

void utf8_append(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

int utf8_lead_len(uint8_t b) {
    if (b < 0x80) return 1;
    if (b < 0xC2) return 0;  // continuation bytes and overlong 2-byte leads
    if (b < 0xE0) return 2;
    if (b < 0xF0) return 3;
    if (b < 0xF5) return 4;
    return 0;
}

bool utf8_valid(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        const Utf8Char c = utf8_decode(s, i);
        if (!c.valid) return false;
        i += c.len;
    }
    return true;
}

size_t utf8_incomplete_tail(std::string_view s) {
    const size_t n = s.size();
    // Find the last non-continuation byte within the last 4 bytes.
    for (size_t k = 1; k <= 4 && k <= n; ++k) {
        const auto b = static_cast<uint8_t>(s[n - k]);
        if ((b & 0xC0) == 0x80) continue;
        const int want = utf8_lead_len(b);
        if (want <= 1 || static_cast<size_t>(want) <= k) return 0;
        // k bytes of a `want`-byte sequence: check the second byte's range so
        // that a sequence which can never complete validly is not held.
        if (k >= 2) {
            const auto b1 = static_cast<uint8_t>(s[n - k + 1]);
            if ((b == 0xE0 && b1 < 0xA0) || (b == 0xED && b1 > 0x9F) || (b == 0xF0 && b1 < 0x90) ||
                (b == 0xF4 && b1 > 0x8F))
                return 0;
        }
        return k;
    }
    return 0;
}

bool is_white_space(uint32_t cp) {
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85) return false;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

const ByteMap& ByteMap::get() {
    static const ByteMap m;
    return m;
}

ByteMap::ByteMap() {
    cp_to_byte_.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
        const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        const uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
        byte_to_cp_[b] = cp;
        cp_to_byte_[cp] = static_cast<int16_t>(b);
        std::string u;
        utf8_append(u, cp);
        for (size_t i = 0; i < u.size(); ++i) utf8_[b][i] = u[i];
        utf8_len_[b] = static_cast<uint8_t>(u.size());
    }
}

std::string ByteMap::encode(std::string_view bytes) const {
    std::string out;
    out.reserve(bytes.size() * 2);
    for (char c : bytes) out += byte_to_utf8(static_cast<uint8_t>(c));
    return out;
}

std::string ByteMap::decode(std::string_view text) const {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
        const Utf8Char c = utf8_decode(text, i);
        const int b = c.valid ? cp_to_byte(c.cp) : -1;
        if (b >= 0) {
            out += static_cast<char>(b);
        } else {
            out.append(text.substr(i, c.len));
        }
        i += c.len;
    }
    return out;
}

}  // namespace quern::unicode
