// Scalar FP8 / FP4 encodings and scaling recipes (see fp8.h).
#include "quant/fp8.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"

namespace quern {

namespace {

// A minifloat layout: M mantissa bits, exponent bias B, largest exponent
// field of a finite value.
struct Mini {
    int M, B, max_field;
};
constexpr Mini kE4M3{3, 7, 15};
constexpr Mini kE5M2{2, 15, 30};
constexpr Mini kE2M1{1, 1, 3};

// Magnitude bits (exponent field << M | mantissa) of |a| (finite, >= 0),
// rounded to nearest even; may exceed the finite range (the callers decide
// what overflow means).
uint32_t encode_magnitude(float a, const Mini& f) {
    if (a == 0.0f) return 0;
    int ex;
    std::frexp(a, &ex);  // a = m · 2^ex, m in [0.5, 1)
    int e = ex - 1;      // a in [2^e, 2^(e+1))
    if (e < 1 - f.B) {   // subnormal: quantum 2^(1-B-M); a code of 2^M is the smallest normal
        const float q = std::nearbyint(std::ldexp(a, f.B - 1 + f.M));
        return static_cast<uint32_t>(q);
    }
    float q = std::nearbyint(std::ldexp(a, f.M - e));  // in [2^M, 2^(M+1)]
    if (q >= static_cast<float>(1 << (f.M + 1))) {
        q = static_cast<float>(1 << f.M);
        ++e;
    }
    return (static_cast<uint32_t>(e + f.B) << f.M) | (static_cast<uint32_t>(q) - (1u << f.M));
}

float decode_magnitude(uint32_t bits, const Mini& f) {
    const uint32_t field = bits >> f.M, mant = bits & ((1u << f.M) - 1);
    if (field == 0) return std::ldexp(static_cast<float>(mant), 1 - f.B - f.M);
    return std::ldexp(static_cast<float>((1u << f.M) | mant), static_cast<int>(field) - f.B - f.M);
}

float absmax(const float* x, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
    return m;
}

}  // namespace

float fp8_e4m3_to_float(uint8_t v) {
    if ((v & 0x7F) == 0x7F) return std::numeric_limits<float>::quiet_NaN();
    const float m = decode_magnitude(v & 0x7Fu, kE4M3);
    return (v & 0x80) ? -m : m;
}

uint8_t float_to_fp8_e4m3(float x) {
    if (std::isnan(x)) return 0x7F;
    const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    const float a = std::fabs(x);
    if (a >= 448.0f) return sign | 0x7E;
    uint32_t bits = encode_magnitude(a, kE4M3);
    if (bits > 0x7E) bits = 0x7E;  // rounded past 448: saturate (never the NaN code)
    return static_cast<uint8_t>(sign | bits);
}

float fp8_e5m2_to_float(uint8_t v) {
    const uint32_t mag = v & 0x7Fu;
    const bool neg = (v & 0x80) != 0;
    if ((mag >> 2) == 31) {
        if ((mag & 3) != 0) return std::numeric_limits<float>::quiet_NaN();
        return neg ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
    }
    const float m = decode_magnitude(mag, kE5M2);
    return neg ? -m : m;
}

uint8_t float_to_fp8_e5m2(float x) {
    if (std::isnan(x)) return 0x7F;
    const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    const float a = std::fabs(x);
    if (std::isinf(a)) return sign | 0x7C;
    uint32_t bits = encode_magnitude(a, kE5M2);
    if ((bits >> 2) > static_cast<uint32_t>(kE5M2.max_field)) bits = 0x7C;  // overflow: inf
    return static_cast<uint8_t>(sign | bits);
}

float fp4_e2m1_to_float(uint8_t v) {
    const float m = decode_magnitude(v & 0x7u, kE2M1);
    return (v & 0x8) ? -m : m;
}

uint8_t float_to_fp4_e2m1(float x) {
    const uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
    const float a = std::fabs(x);
    if (std::isnan(x)) return 0;
    if (a >= 6.0f) return sign | 0x7;
    uint32_t bits = encode_magnitude(a, kE2M1);
    if (bits > 0x7) bits = 0x7;
    return static_cast<uint8_t>(sign | bits);
}

void quantize_fp8_rows(const float* x, int64_t rows, int64_t cols, uint8_t* q, float* scale) {
    if (rows < 0 || cols < 0) fail("quantize_fp8_rows: negative size");
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols;
        const float m = absmax(xr, cols);
        const float s = m > 0.0f ? m / 448.0f : 1.0f;
        scale[r] = s;
        for (int64_t c = 0; c < cols; ++c) q[r * cols + c] = float_to_fp8_e4m3(xr[c] / s);
    }
}

void quantize_fp8_tensor(const float* x, int64_t n, uint8_t* q, float* scale) {
    if (n < 0) fail("quantize_fp8_tensor: negative size");
    const float m = absmax(x, n);
    const float s = m > 0.0f ? m / 448.0f : 1.0f;
    *scale = s;
    for (int64_t i = 0; i < n; ++i) q[i] = float_to_fp8_e4m3(x[i] / s);
}

void quantize_nvfp4(const float* w, int64_t rows, int64_t cols, uint8_t* packed, uint8_t* block_scale,
                    float* global_scale) {
    if (rows < 0 || cols < 0 || cols % 16 != 0) fail("quantize_nvfp4: cols must be a multiple of 16, got {}", cols);
    const float amax = absmax(w, rows * cols);
    const float g = amax > 0.0f ? amax / (6.0f * 448.0f) : 1.0f;
    *global_scale = g;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < cols / 16; ++b) {
            const float* wb = w + r * cols + 16 * b;
            const uint8_t bs = float_to_fp8_e4m3(absmax(wb, 16) / (6.0f * g));
            block_scale[r * (cols / 16) + b] = bs;
            const float d = fp8_e4m3_to_float(bs) * g;
            uint8_t* out = packed + r * (cols / 2) + 8 * b;
            for (int i = 0; i < 8; ++i) {
                const uint8_t lo = d > 0.0f ? float_to_fp4_e2m1(wb[2 * i] / d) : 0;
                const uint8_t hi = d > 0.0f ? float_to_fp4_e2m1(wb[2 * i + 1] / d) : 0;
                out[i] = static_cast<uint8_t>(lo | (hi << 4));
            }
        }
}

void dequantize_nvfp4(const uint8_t* packed, const uint8_t* block_scale, float global_scale, int64_t rows,
                      int64_t cols, float* w) {
    if (rows < 0 || cols < 0 || cols % 16 != 0) fail("dequantize_nvfp4: cols must be a multiple of 16, got {}", cols);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < cols / 16; ++b) {
            const float d = fp8_e4m3_to_float(block_scale[r * (cols / 16) + b]) * global_scale;
            const uint8_t* in = packed + r * (cols / 2) + 8 * b;
            float* out = w + r * cols + 16 * b;
            for (int i = 0; i < 8; ++i) {
                out[2 * i] = fp4_e2m1_to_float(in[i] & 0xF) * d;
                out[2 * i + 1] = fp4_e2m1_to_float(in[i] >> 4) * d;
            }
        }
}

void round_fp8_activation_rows(const float* x, int64_t rows, int64_t K, float* out) {
    std::vector<float> b(static_cast<size_t>(K));
    std::vector<uint8_t> q(static_cast<size_t>(K));
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t k = 0; k < K; ++k) b[static_cast<size_t>(k)] = bf16_to_fp32(fp32_to_bf16(x[r * K + k]));
        float scale = 1.0f;
        quantize_fp8_rows(b.data(), 1, K, q.data(), &scale);
        for (int64_t k = 0; k < K; ++k) out[r * K + k] = scale * fp8_e4m3_to_float(q[static_cast<size_t>(k)]);
    }
}

}  // namespace quern
