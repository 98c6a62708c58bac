// Device helpers of the 5-bit (Q5_0, Q5_1, Q5_K) and 2/3-bit (Q2_K, Q3_K)
// decode GEMVs: turning the device layouts of weights.h into int8 words that
// line up with the Q8 activation words (word i of a 16-element half = its
// elements 4i..4i+3, byte k = element 4i+k).
#pragma once
#include <cstdint>

#include "backend/cuda/gemv_common.cuh"

namespace quern::cuda::kern {

// ---------------------------------------------------------------- 5-bit
// 32 elements: q = the 16 nibble bytes (byte i: low nibble = element i, high
// nibble = element 16+i); h = the 32 fifth bits re-ordered at upload so that
// byte k, bit i (0..3) is bit 4 of element 4i+k and bit 4+i that of element
// 16+4i+k. Each result word then costs one shift and one LOP3.
struct Q5Words {
    uint4 lo, hi;  // values 0..31: elements 0..15 / 16..31
};
__device__ __forceinline__ Q5Words q5_words(uint4 q, uint32_t h) {
    const uint4 ln = lo_nibbles(q), hn = hi_nibbles(q);
    Q5Words r;
    r.lo.x = ln.x | ((h << 4) & 0x10101010u);
    r.lo.y = ln.y | ((h << 3) & 0x10101010u);
    r.lo.z = ln.z | ((h << 2) & 0x10101010u);
    r.lo.w = ln.w | ((h << 1) & 0x10101010u);
    r.hi.x = hn.x | (h & 0x10101010u);
    r.hi.y = hn.y | ((h >> 1) & 0x10101010u);
    r.hi.z = hn.z | ((h >> 2) & 0x10101010u);
    r.hi.w = hn.w | ((h >> 3) & 0x10101010u);
    return r;
}

// Σ q·a over the 32 elements (q 0..31, exact int32).
__device__ __forceinline__ int q5_dot(uint4 q, uint32_t h, const ActQ8& x) {
    const Q5Words v = q5_words(q, h);
    return dp4a_16(v.hi, x.hi, dp4a_16(v.lo, x.lo, 0));
}

// ---------------------------------------------------------------- 2-bit
// One 32-bit word of 16 two-bit values (a 16-element group): byte k, bits
// 2i..2i+1 = element 4i+k. Σ q·a over the group against activation words a
// (q 0..3, or 0..7 with the third bit merged by the caller).
__device__ __forceinline__ uint32_t q2_word(uint32_t w, int i) { return (w >> (2 * i)) & 0x03030303u; }

__device__ __forceinline__ int q2_dot16(uint32_t w, uint4 a) {
    int s = __dp4a(static_cast<int>(q2_word(w, 0)), static_cast<int>(a.x), 0);
    s = __dp4a(static_cast<int>(q2_word(w, 1)), static_cast<int>(a.y), s);
    s = __dp4a(static_cast<int>(q2_word(w, 2)), static_cast<int>(a.z), s);
    s = __dp4a(static_cast<int>(q2_word(w, 3)), static_cast<int>(a.w), s);
    return s;
}

// Q3_K: the 2-bit word w of a 16-element group plus its third bits: h holds
// the group's 16 high bits as byte k, bit i = element 4i+k, starting at bit
// `base` (0 or 4) of each byte. Values 0..7 (the GGUF value plus 4).
template <int base>
__device__ __forceinline__ uint32_t q3_word(uint32_t w, uint32_t h, int i) {
    // bit base+i of each byte -> bit 2
    const int sh = base + i - 2;
    const uint32_t hb = (sh >= 0 ? (h >> sh) : (h << -sh)) & 0x04040404u;
    return q2_word(w, i) | hb;
}
template <int base>
__device__ __forceinline__ int q3_dot16(uint32_t w, uint32_t h, uint4 a) {
    int s = __dp4a(static_cast<int>(q3_word<base>(w, h, 0)), static_cast<int>(a.x), 0);
    s = __dp4a(static_cast<int>(q3_word<base>(w, h, 1)), static_cast<int>(a.y), s);
    s = __dp4a(static_cast<int>(q3_word<base>(w, h, 2)), static_cast<int>(a.z), s);
    s = __dp4a(static_cast<int>(q3_word<base>(w, h, 3)), static_cast<int>(a.w), s);
    return s;
}

}  // namespace quern::cuda::kern
