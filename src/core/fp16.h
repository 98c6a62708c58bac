// IEEE 754 binary16 and bfloat16 conversions (scalar, exact).
// fp16 -> fp32 is exact for every input including subnormals, inf and NaN;
// fp32 -> fp16 and fp32 -> bf16 round to nearest, ties to even.
#pragma once
#include <cstdint>
#include <cstring>

namespace quern {

inline float bits_to_f32(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline uint32_t f32_to_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

/// binary16 bits -> float (exact).
inline float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0) return bits_to_f32(sign);
        // subnormal: man * 2^-24
        const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (man << 13));
    return bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

/// float -> binary16 bits, round to nearest even; overflow gives inf, NaN stays NaN.
inline uint16_t fp32_to_fp16(float f) {
    const uint32_t x = f32_to_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520 -> inf
    if (ax < 0x38800000u) {
        // result is subnormal or zero: value / 2^-24, rounded to nearest even
        const float v = bits_to_f32(ax) * 16777216.0f;  // exact scaling by 2^24
        // nearbyint-style ties-to-even using the float trick
        const float r = (v + 8388608.0f) - 8388608.0f;
        return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
    }
    // normal: rebias exponent, round mantissa from 23 to 10 bits
    const uint32_t lsb = (ax >> 13) & 1u;
    ax += 0xfffu + lsb;
    return static_cast<uint16_t>(sign | (((ax >> 13) - (112u << 10)) & 0x7fffu));
}

/// bfloat16 bits -> float (exact).
inline float bf16_to_fp32(uint16_t h) { return bits_to_f32(static_cast<uint32_t>(h) << 16); }

/// float -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN.
inline uint16_t fp32_to_bf16(float f) {
    const uint32_t u = f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 64u);
    return static_cast<uint16_t>((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

}  // namespace quern
