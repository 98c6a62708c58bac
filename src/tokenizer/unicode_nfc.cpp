#include "tokenizer/unicode_nfc.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "tokenizer/unicode.h"

namespace quern::unicode {

namespace {

#include "tokenizer/unicode_nfc.inc"

// Property bits above the combining class (see tools/tok_gen_unicode_nfc.py).
constexpr uint16_t kQcNo = 256;          // NFC_QC=No: never in NFC text
constexpr uint16_t kMaybe = 512;         // NFC_QC=Maybe: may compose with what precedes
constexpr uint16_t kHasDecomp = 1024;    // canonical decomposition in kNfcDecomp
constexpr uint16_t kNotBoundary = 2048;  // a segment may not start before it

// Invalid bytes travel through the code point buffer as kInvalid + byte:
// starters that compose with nothing and are written back unchanged.
constexpr uint32_t kInvalid = 0x110000;

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

inline uint16_t props(uint32_t cp) {
    if (cp >= kNfcLimit) return 0;
    return kNfcStage2[(static_cast<uint32_t>(kNfcStage1[cp >> kNfcBlockShift]) << kNfcBlockShift) |
                      (cp & ((1u << kNfcBlockShift) - 1))];
}

inline uint8_t ccc(uint32_t cp) { return static_cast<uint8_t>(props(cp) & 0xFF); }

void decompose_into(uint32_t cp, std::vector<uint32_t>& out) {
    if (cp - kSBase < kSCount) {
        const uint32_t s = cp - kSBase;
        out.push_back(kLBase + s / kNCount);
        out.push_back(kVBase + (s % kNCount) / kTCount);
        if (s % kTCount) out.push_back(kTBase + s % kTCount);
        return;
    }
    if (!(props(cp) & kHasDecomp)) {
        out.push_back(cp);
        return;
    }
    const auto* end = kNfcDecomp + std::size(kNfcDecomp);
    const auto* it = std::lower_bound(kNfcDecomp, end, cp, [](const NfcDecomp& d, uint32_t c) { return d.cp < c; });
    if (it == end || it->cp != cp) {  // cannot happen with consistent tables
        out.push_back(cp);
        return;
    }
    out.insert(out.end(), kNfcDecompData + it->off, kNfcDecompData + it->off + it->len);
}

// The code point that ends at `pos`, or kInvalid when the bytes before `pos`
// do not end with a valid sequence.
uint32_t cp_before(std::string_view s, size_t pos) {
    for (size_t k = 1; k <= 4 && k <= pos; ++k) {
        const uint8_t b = static_cast<uint8_t>(s[pos - k]);
        if ((b & 0xC0) == 0x80) continue;
        const Utf8Char c = utf8_decode(s, pos - k);
        return c.valid && c.len == k ? c.cp : kInvalid;
    }
    return kInvalid;
}

// Decomposes, reorders and recomposes `seg` (which starts and ends at
// segment boundaries), appending the result to `out`.
void normalize_segment(std::string_view seg, std::string& out, std::vector<uint32_t>& cps) {
    cps.clear();
    for (size_t i = 0; i < seg.size();) {
        const Utf8Char c = utf8_decode(seg, i);
        if (!c.valid) {
            cps.push_back(kInvalid + static_cast<uint8_t>(seg[i]));
            ++i;
            continue;
        }
        decompose_into(c.cp, cps);
        i += c.len;
    }
    // Canonical ordering: each run of non-starters sorted stably by class.
    const auto by_class = [](uint32_t a, uint32_t b) { return ccc(a) < ccc(b); };
    for (size_t k = 0; k < cps.size();) {
        if (ccc(cps[k]) == 0) {
            ++k;
            continue;
        }
        size_t e = k + 1;
        while (e < cps.size() && ccc(cps[e]) != 0) ++e;
        if (e - k <= 32) {
            for (size_t a = k + 1; a < e; ++a)  // insertion sort: stable
                for (size_t b = a; b > k && by_class(cps[b], cps[b - 1]); --b) std::swap(cps[b], cps[b - 1]);
        } else {
            std::stable_sort(cps.begin() + static_cast<std::ptrdiff_t>(k), cps.begin() + static_cast<std::ptrdiff_t>(e),
                             by_class);
        }
        k = e;
    }
    // Canonical composition: each code point composes with the last starter
    // when nothing between blocks it (an uncomposed code point with class 0
    // or with a class not below its own).
    size_t w = 0;
    size_t starter = SIZE_MAX;
    int last_cc = 0;
    for (size_t r = 0; r < cps.size(); ++r) {
        const uint32_t c = cps[r];
        const uint16_t p = props(c);
        const int cc = p & 0xFF;
        if (starter != SIZE_MAX && (p & kMaybe) && (w == starter + 1 || last_cc < cc)) {
            if (const uint32_t comp = nfc_compose_pair(cps[starter], c)) {
                cps[starter] = comp;
                continue;
            }
        }
        if (cc == 0) starter = w;
        last_cc = cc;
        cps[w++] = c;
    }
    for (size_t k = 0; k < w; ++k) {
        if (cps[k] >= kInvalid)
            out += static_cast<char>(cps[k] - kInvalid);
        else
            utf8_append(out, cps[k]);
    }
}

inline bool ascii8(const char* p) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    return (w & 0x8080808080808080ull) == 0;
}

// The quick check of the code point `c` at `pos`, after code points whose
// last combining class is `last_ccc`.
inline bool passes(std::string_view s, size_t pos, uint32_t cp, uint16_t p, uint8_t last_ccc) {
    const uint8_t cc = p & 0xFF;
    if ((p & kQcNo) || (cc != 0 && last_ccc > cc)) return false;
    if (!(p & kMaybe)) return true;
    // A starter that composes only with the code point right before it.
    return cc == 0 && (pos == 0 || nfc_compose_pair(cp_before(s, pos), cp) == 0);
}

}  // namespace

uint8_t combining_class(uint32_t cp) { return ccc(cp); }

uint32_t nfc_compose_pair(uint32_t a, uint32_t b) {
    if (a >= kInvalid || b >= kInvalid) return 0;
    if (a - kLBase < kLCount && b - kVBase < kVCount) return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
    if (a - kSBase < kSCount && (a - kSBase) % kTCount == 0 && b - kTBase - 1 < kTCount - 1) return a + (b - kTBase);
    const uint64_t key = (static_cast<uint64_t>(a) << 21) | b;
    const auto* end = kNfcPairs + std::size(kNfcPairs);
    const auto* it = std::lower_bound(kNfcPairs, end, key, [](const NfcPair& q, uint64_t k) { return q.key < k; });
    return it != end && it->key == key ? it->cp : 0;
}

bool nfc_quick_check(std::string_view s) {
    uint8_t last_ccc = 0;
    for (size_t i = 0; i < s.size();) {
        if (static_cast<uint8_t>(s[i]) < 0x80) {
            ++i;
            while (i + 8 <= s.size() && ascii8(s.data() + i)) i += 8;
            last_ccc = 0;
            continue;
        }
        const Utf8Char c = utf8_decode(s, i);
        if (!c.valid) {
            last_ccc = 0;
            ++i;
            continue;
        }
        const uint16_t p = props(c.cp);
        if (!passes(s, i, c.cp, p, last_ccc)) return false;
        last_ccc = p & 0xFF;
        i += c.len;
    }
    return true;
}

std::string_view nfc(std::string_view s, std::string& buf) {
    const size_t n = s.size();
    std::string out;
    std::vector<uint32_t> cps;
    bool writing = false;
    size_t done = 0;  // s[0, done) is in `out` (when writing)
    size_t seg = 0;   // the last segment boundary at or before i
    uint8_t last_ccc = 0;
    for (size_t i = 0; i < n;) {
        if (static_cast<uint8_t>(s[i]) < 0x80) {  // ASCII: starters, boundaries
            size_t j = i + 1;
            while (j + 8 <= n && ascii8(s.data() + j)) j += 8;
            while (j < n && static_cast<uint8_t>(s[j]) < 0x80) ++j;
            seg = j - 1;
            last_ccc = 0;
            i = j;
            continue;
        }
        const Utf8Char c = utf8_decode(s, i);
        if (!c.valid) {
            seg = i;
            last_ccc = 0;
            ++i;
            continue;
        }
        const uint16_t p = props(c.cp);
        if (passes(s, i, c.cp, p, last_ccc)) {
            if (!(p & kNotBoundary)) seg = i;
            last_ccc = p & 0xFF;
            i += c.len;
            continue;
        }
        // Normalize from the last boundary to the next one.
        size_t e = i + c.len;
        while (e < n) {
            if (static_cast<uint8_t>(s[e]) < 0x80) break;
            const Utf8Char d = utf8_decode(s, e);
            if (!d.valid || !(props(d.cp) & kNotBoundary)) break;
            e += d.len;
        }
        if (!writing) {
            out.reserve(n + n / 8 + 16);
            writing = true;
        }
        out.append(s.substr(done, seg - done));
        normalize_segment(s.substr(seg, e - seg), out, cps);
        done = seg = i = e;
        last_ccc = 0;
    }
    if (!writing) return s;
    out.append(s.substr(done));
    buf.swap(out);
    return buf;
}

}  // namespace quern::unicode
