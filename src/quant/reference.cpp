// Scalar reference (de)quantization: plain types, the 32-element block types
// and the K-quant dequantizers. K-quant weight quantizers live in
// reference_kquants.cpp.
//
// Bit-exactness: every float expression below is evaluated in the same order
// and with the same intermediate roundings as ggml's dequantize_row_* and
// quantize_row_*_ref (ggml-quants.c), which gguf.quants in Python also
// follows. No expression may be contracted into an FMA: GCC does not contract
// in ISO mode (-std=c++20), and clang is told so below.
#include "quant/no_fp_contract.h"  // first: applies to everything below, fit.h's inline code too
#include "quant/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/fp16.h"
#include "quant/blocks.h"
#include "quant/fit.h"
#include "quant/ref_rows.h"
#include "quant/traits.h"


namespace quern::ref {

void check_row_length(const char* type_name, int block_size, int64_t k) {
    if (k < 0 || k % block_size != 0)
        fail("quantization row of {} elements is not a whole number of {} blocks ({} elements each)", k,
             type_name, block_size);
}

namespace {

// Blocks are read and written through a local copy: the row may start at any
// byte address (GGUF only promises the file's alignment, not the struct's).
template <class B>
B load_block(const void* base, int64_t i) {
    B b;
    std::memcpy(&b, static_cast<const unsigned char*>(base) + i * static_cast<int64_t>(sizeof(B)), sizeof(B));
    return b;
}

// ggml's roundf: round half away from zero.
inline int8_t round_to_i8(float v) { return static_cast<int8_t>(std::round(v)); }

// ggml's `MIN(hi, (int8_t)v)` for the v >= 0 it meets: truncate toward zero and
// clamp to [0, hi]. Also defined (0) for NaN and huge inputs.
inline int trunc_clamp(float v, int hi) {
    if (!(v >= 0.0f)) return 0;
    if (v >= static_cast<float>(hi)) return hi;
    return static_cast<int>(v);
}

}  // namespace

// =========================================================== plain types

void to_float_f32(const void* x, float* y, int64_t k) {
    check_row_length("F32", 1, k);
    if (k) std::memcpy(y, x, static_cast<size_t>(k) * sizeof(float));
}

void to_float_f16(const void* x, float* y, int64_t k) {
    check_row_length("F16", 1, k);
    const auto* p = static_cast<const unsigned char*>(x);
    for (int64_t i = 0; i < k; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        y[i] = fp16_to_fp32(h);
    }
}

void to_float_bf16(const void* x, float* y, int64_t k) {
    check_row_length("BF16", 1, k);
    const auto* p = static_cast<const unsigned char*>(x);
    for (int64_t i = 0; i < k; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        y[i] = bf16_to_fp32(h);
    }
}

void from_float_f32(const float* x, void* y, int64_t k) {
    check_row_length("F32", 1, k);
    if (k) std::memcpy(y, x, static_cast<size_t>(k) * sizeof(float));
}

void from_float_f16(const float* x, void* y, int64_t k) {
    check_row_length("F16", 1, k);
    auto* p = static_cast<unsigned char*>(y);
    for (int64_t i = 0; i < k; ++i) {
        const uint16_t h = fp32_to_fp16(x[i]);
        std::memcpy(p + 2 * i, &h, 2);
    }
}

void from_float_bf16(const float* x, void* y, int64_t k) {
    check_row_length("BF16", 1, k);
    auto* p = static_cast<unsigned char*>(y);
    for (int64_t i = 0; i < k; ++i) {
        const uint16_t h = fp32_to_bf16(x[i]);
        std::memcpy(p + 2 * i, &h, 2);
    }
}

// =========================================================== 32-element blocks
// In Q4_*/Q5_* the low nibbles of qs[j] are elements j and the high nibbles
// elements j + 16; Q5_* keep bit 4 of element j in bit j of qh (little endian).

void to_float_q4_0(const void* x, float* y, int64_t k) {
    check_row_length("Q4_0", QK4_0, k);
    for (int64_t i = 0; i < k / QK4_0; ++i) {
        const auto b = load_block<block_q4_0>(x, i);
        const float d = fp16_to_fp32(b.d);
        float* out = y + i * QK4_0;
        for (int j = 0; j < QK4_0 / 2; ++j) {
            const int q0 = (b.qs[j] & 0x0F) - 8;
            const int q1 = (b.qs[j] >> 4) - 8;
            out[j] = static_cast<float>(q0) * d;
            out[j + QK4_0 / 2] = static_cast<float>(q1) * d;
        }
    }
}

void to_float_q4_1(const void* x, float* y, int64_t k) {
    check_row_length("Q4_1", QK4_1, k);
    for (int64_t i = 0; i < k / QK4_1; ++i) {
        const auto b = load_block<block_q4_1>(x, i);
        const float d = fp16_to_fp32(b.d);
        const float m = fp16_to_fp32(b.m);
        float* out = y + i * QK4_1;
        for (int j = 0; j < QK4_1 / 2; ++j) {
            const int q0 = b.qs[j] & 0x0F;
            const int q1 = b.qs[j] >> 4;
            out[j] = static_cast<float>(q0) * d + m;
            out[j + QK4_1 / 2] = static_cast<float>(q1) * d + m;
        }
    }
}

void to_float_q5_0(const void* x, float* y, int64_t k) {
    check_row_length("Q5_0", QK5_0, k);
    for (int64_t i = 0; i < k / QK5_0; ++i) {
        const auto b = load_block<block_q5_0>(x, i);
        const float d = fp16_to_fp32(b.d);
        uint32_t qh;
        std::memcpy(&qh, b.qh, 4);
        float* out = y + i * QK5_0;
        for (int j = 0; j < QK5_0 / 2; ++j) {
            const int h0 = static_cast<int>((qh >> j) & 1u) << 4;
            const int h1 = static_cast<int>((qh >> (j + QK5_0 / 2)) & 1u) << 4;
            const int q0 = ((b.qs[j] & 0x0F) | h0) - 16;
            const int q1 = ((b.qs[j] >> 4) | h1) - 16;
            out[j] = static_cast<float>(q0) * d;
            out[j + QK5_0 / 2] = static_cast<float>(q1) * d;
        }
    }
}

void to_float_q5_1(const void* x, float* y, int64_t k) {
    check_row_length("Q5_1", QK5_1, k);
    for (int64_t i = 0; i < k / QK5_1; ++i) {
        const auto b = load_block<block_q5_1>(x, i);
        const float d = fp16_to_fp32(b.d);
        const float m = fp16_to_fp32(b.m);
        uint32_t qh;
        std::memcpy(&qh, b.qh, 4);
        float* out = y + i * QK5_1;
        for (int j = 0; j < QK5_1 / 2; ++j) {
            const int h0 = static_cast<int>((qh >> j) & 1u) << 4;
            const int h1 = static_cast<int>((qh >> (j + QK5_1 / 2)) & 1u) << 4;
            const int q0 = (b.qs[j] & 0x0F) | h0;
            const int q1 = (b.qs[j] >> 4) | h1;
            out[j] = static_cast<float>(q0) * d + m;
            out[j + QK5_1 / 2] = static_cast<float>(q1) * d + m;
        }
    }
}

void to_float_q8_0(const void* x, float* y, int64_t k) {
    check_row_length("Q8_0", QK8_0, k);
    for (int64_t i = 0; i < k / QK8_0; ++i) {
        const auto b = load_block<block_q8_0>(x, i);
        const float d = fp16_to_fp32(b.d);
        for (int j = 0; j < QK8_0; ++j) y[i * QK8_0 + j] = static_cast<float>(b.qs[j]) * d;
    }
}

void to_float_q8_1(const void* x, float* y, int64_t k) {
    check_row_length("Q8_1", QK8_1, k);
    for (int64_t i = 0; i < k / QK8_1; ++i) {
        const auto b = load_block<block_q8_1>(x, i);
        const float d = fp16_to_fp32(b.d);
        for (int j = 0; j < QK8_1; ++j) y[i * QK8_1 + j] = static_cast<float>(b.qs[j]) * d;
    }
}

// Q4_0: d = max / -8 where max is the signed value of largest magnitude (the
// first one on ties), q = min(15, trunc(x/d + 8.5)).
void from_float_q4_0(const float* x, void* y, int64_t k) {
    check_row_length("Q4_0", QK4_0, k);
    for (int64_t i = 0; i < k / QK4_0; ++i) {
        const float* v = x + i * QK4_0;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK4_0; ++j) {
            if (amax < std::fabs(v[j])) {
                amax = std::fabs(v[j]);
                max = v[j];
            }
        }
        const float d = max / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q4_0 b{};
        b.d = fp32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; ++j) {
            const float x0 = v[j] * id;
            const float x1 = v[j + QK4_0 / 2] * id;
            const int q0 = trunc_clamp(x0 + 8.5f, 15);
            const int q1 = trunc_clamp(x1 + 8.5f, 15);
            b.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
        }
        store_block(y, i, b);
    }
}

// ---- with importance weights (ggml's quantize_row_q4_0_impl .. q5_1_impl):
// each block of 32 is fitted under weights imp·sqrt(σ² + x²), σ² = mean(x²)
// of the whole row — symmetric types by fit_symmetric_search, the types with
// a minimum by fit_scale_min — and its codes are stored as the fit left them.

namespace {

/// σ² of a row of k floats: the mean of x².
float row_sigma2(const float* x, int64_t k) { return sum_squares(k, x) / static_cast<float>(k); }

/// Low nibbles of codes j and j+16 in qs[j]; bit 4 of each into qh (5-bit types).
void pack_nibbles(const uint8_t* L, uint8_t* qs, uint8_t* qh_bytes) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
        qs[j] = static_cast<uint8_t>((L[j] & 0x0F) | ((L[j + 16] & 0x0F) << 4));
        qh |= static_cast<uint32_t>((L[j] >> 4) & 1) << j;
        qh |= static_cast<uint32_t>((L[j + 16] >> 4) & 1) << (j + 16);
    }
    if (qh_bytes) std::memcpy(qh_bytes, &qh, 4);
}

/// Q4_0 / Q5_0: the symmetric fit of each block (nmax 8 or 16).
template <class B>
void weighted_symmetric(const float* x, void* y, int64_t k, const float* imp, int nmax, const char* name) {
    check_row_length(name, 32, k);
    const float sigma2 = row_sigma2(x, k);
    for (int64_t ib = 0; ib < k / 32; ++ib) {
        float w[32];
        int8_t L[32];
        importance_weights(32, x + 32 * ib, imp + 32 * ib, sigma2, w);
        B b{};
        b.d = fp32_to_fp16(fit_symmetric_search(32, nmax, x + 32 * ib, L, w));
        uint8_t u[32];
        for (int j = 0; j < 32; ++j) u[j] = static_cast<uint8_t>(L[j]);
        if constexpr (requires { b.qh; }) pack_nibbles(u, b.qs, b.qh);
        else pack_nibbles(u, b.qs, nullptr);
        store_block(y, ib, b);
    }
}

/// Q4_1 / Q5_1: the affine fit of each block (nmax 15 or 31), m = −the_min.
template <class B>
void weighted_affine(const float* x, void* y, int64_t k, const float* imp, int nmax, const char* name) {
    check_row_length(name, 32, k);
    const float sigma2 = row_sigma2(x, k);
    for (int64_t ib = 0; ib < k / 32; ++ib) {
        float w[32], the_min;
        uint8_t L[32], Laux[32];
        importance_weights(32, x + 32 * ib, imp + 32 * ib, sigma2, w);
        const float d = fit_scale_min(32, nmax, x + 32 * ib, w, L, &the_min, Laux, -0.9f, 0.05f, 36, false);
        B b{};
        b.d = fp32_to_fp16(d);
        b.m = fp32_to_fp16(-the_min);
        if constexpr (requires { b.qh; }) pack_nibbles(L, b.qs, b.qh);
        else pack_nibbles(L, b.qs, nullptr);
        store_block(y, ib, b);
    }
}

}  // namespace

void from_float_weighted_q4_0(const float* x, void* y, int64_t k, const float* imp) {
    weighted_symmetric<block_q4_0>(x, y, k, imp, 8, "Q4_0");
}
void from_float_weighted_q5_0(const float* x, void* y, int64_t k, const float* imp) {
    weighted_symmetric<block_q5_0>(x, y, k, imp, 16, "Q5_0");
}
void from_float_weighted_q4_1(const float* x, void* y, int64_t k, const float* imp) {
    weighted_affine<block_q4_1>(x, y, k, imp, 15, "Q4_1");
}
void from_float_weighted_q5_1(const float* x, void* y, int64_t k, const float* imp) {
    weighted_affine<block_q5_1>(x, y, k, imp, 31, "Q5_1");
}

// Q4_1: d = (max - min) / 15, m = min, q = min(15, trunc((x - min)/d + 0.5)).
void from_float_q4_1(const float* x, void* y, int64_t k) {
    check_row_length("Q4_1", QK4_1, k);
    for (int64_t i = 0; i < k / QK4_1; ++i) {
        const float* v = x + i * QK4_1;
        float min = std::numeric_limits<float>::max(), max = -std::numeric_limits<float>::max();
        for (int j = 0; j < QK4_1; ++j) {
            if (v[j] < min) min = v[j];
            if (v[j] > max) max = v[j];
        }
        const float d = (max - min) / 15;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q4_1 b{};
        b.d = fp32_to_fp16(d);
        b.m = fp32_to_fp16(min);
        for (int j = 0; j < QK4_1 / 2; ++j) {
            const float x0 = (v[j] - min) * id;
            const float x1 = (v[j + QK4_1 / 2] - min) * id;
            const int q0 = trunc_clamp(x0 + 0.5f, 15);
            const int q1 = trunc_clamp(x1 + 0.5f, 15);
            b.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
        }
        store_block(y, i, b);
    }
}

// Q5_0: as Q4_0 with d = max / -16 and q = min(31, trunc(x/d + 16.5)).
void from_float_q5_0(const float* x, void* y, int64_t k) {
    check_row_length("Q5_0", QK5_0, k);
    for (int64_t i = 0; i < k / QK5_0; ++i) {
        const float* v = x + i * QK5_0;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK5_0; ++j) {
            if (amax < std::fabs(v[j])) {
                amax = std::fabs(v[j]);
                max = v[j];
            }
        }
        const float d = max / -16;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q5_0 b{};
        b.d = fp32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; ++j) {
            const float x0 = v[j] * id;
            const float x1 = v[j + QK5_0 / 2] * id;
            const int q0 = trunc_clamp(x0 + 16.5f, 31);
            const int q1 = trunc_clamp(x1 + 16.5f, 31);
            b.qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
            qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + QK5_0 / 2);
        }
        std::memcpy(b.qh, &qh, 4);
        store_block(y, i, b);
    }
}

// Q5_1: as Q4_1 with d = (max - min) / 31 and q = min(31, trunc((x - min)/d + 0.5)).
void from_float_q5_1(const float* x, void* y, int64_t k) {
    check_row_length("Q5_1", QK5_1, k);
    for (int64_t i = 0; i < k / QK5_1; ++i) {
        const float* v = x + i * QK5_1;
        float min = std::numeric_limits<float>::max(), max = -std::numeric_limits<float>::max();
        for (int j = 0; j < QK5_1; ++j) {
            if (v[j] < min) min = v[j];
            if (v[j] > max) max = v[j];
        }
        const float d = (max - min) / 31;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q5_1 b{};
        b.d = fp32_to_fp16(d);
        b.m = fp32_to_fp16(min);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_1 / 2; ++j) {
            const float x0 = (v[j] - min) * id;
            const float x1 = (v[j + QK5_1 / 2] - min) * id;
            const int q0 = trunc_clamp(x0 + 0.5f, 31);
            const int q1 = trunc_clamp(x1 + 0.5f, 31);
            b.qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
            qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + QK5_1 / 2);
        }
        std::memcpy(b.qh, &qh, 4);
        store_block(y, i, b);
    }
}

// Q8_0: d = amax / 127, q = roundf(x * (1/d)).
void from_float_q8_0(const float* x, void* y, int64_t k) {
    check_row_length("Q8_0", QK8_0, k);
    for (int64_t i = 0; i < k / QK8_0; ++i) {
        const float* v = x + i * QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; ++j) amax = std::max(amax, std::fabs(v[j]));
        const float d = amax / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q8_0 b{};
        b.d = fp32_to_fp16(d);
        for (int j = 0; j < QK8_0; ++j) b.qs[j] = round_to_i8(v[j] * id);
        store_block(y, i, b);
    }
}

// Q8_1: as Q8_0, plus s = fp16(float(sum of qs) * d) with d the unrounded fp32 scale.
void from_float_q8_1(const float* x, void* y, int64_t k) {
    check_row_length("Q8_1", QK8_1, k);
    for (int64_t i = 0; i < k / QK8_1; ++i) {
        const float* v = x + i * QK8_1;
        float amax = 0.0f;
        for (int j = 0; j < QK8_1; ++j) amax = std::max(amax, std::fabs(v[j]));
        const float d = amax / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q8_1 b{};
        b.d = fp32_to_fp16(d);
        int sum = 0;
        for (int j = 0; j < QK8_1; ++j) {
            b.qs[j] = round_to_i8(v[j] * id);
            sum += b.qs[j];
        }
        b.s = fp32_to_fp16(static_cast<float>(sum) * d);
        store_block(y, i, b);
    }
}

// =========================================================== K-quants: dequantize

// Q2_K: 16 sub-blocks of 16; scales[s] = scale | min << 4. Element
// 128*h + 32*j + l (h half, j 0..3, l 0..31) is bits 2j..2j+1 of qs[32*h + l];
// its sub-block is 8*h + 2*j + l/16.
void to_float_q2_K(const void* x, float* y, int64_t k) {
    check_row_length("Q2_K", QK_K, k);
    for (int64_t i = 0; i < k / QK_K; ++i) {
        const auto b = load_block<block_q2_K>(x, i);
        const float d = fp16_to_fp32(b.d);
        const float dmin = fp16_to_fp32(b.dmin);
        float* out = y + i * QK_K;
        for (int h = 0; h < 2; ++h) {
            const uint8_t* q = b.qs + 32 * h;
            for (int j = 0; j < 4; ++j) {
                for (int part = 0; part < 2; ++part) {
                    const uint8_t sc = b.scales[8 * h + 2 * j + part];
                    const float dl = d * static_cast<float>(sc & 0xF);
                    const float ml = dmin * static_cast<float>(sc >> 4);
                    for (int l = 0; l < 16; ++l) {
                        const int qv = (q[16 * part + l] >> (2 * j)) & 3;
                        *out++ = dl * static_cast<float>(qv) - ml;
                    }
                }
            }
        }
    }
}

// Q3_K scale s (0..15): low 4 bits are the low (s < 8) or high (s >= 8) nibble of
// scales[s % 8]; high 2 bits are bits 2*(s/4).. of scales[8 + s % 4]; minus 32.
static int q3_K_scale(const uint8_t* sc, int s) {
    const int lo = s < 8 ? (sc[s] & 0xF) : (sc[s - 8] >> 4);
    const int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

// Q3_K: 16 sub-blocks of 16. Element 128*h + 32*j + l takes its 2 low bits from
// bits 2j.. of qs[32*h + l] and its high bit from bit 4*h + j of hmask[l]; a
// clear high bit means "subtract 4".
void to_float_q3_K(const void* x, float* y, int64_t k) {
    check_row_length("Q3_K", QK_K, k);
    for (int64_t i = 0; i < k / QK_K; ++i) {
        const auto b = load_block<block_q3_K>(x, i);
        const float d_all = fp16_to_fp32(b.d);
        float* out = y + i * QK_K;
        for (int h = 0; h < 2; ++h) {
            const uint8_t* q = b.qs + 32 * h;
            for (int j = 0; j < 4; ++j) {
                const uint8_t hbit = static_cast<uint8_t>(1u << (4 * h + j));
                for (int part = 0; part < 2; ++part) {
                    const float dl = d_all * static_cast<float>(q3_K_scale(b.scales, 8 * h + 2 * j + part));
                    for (int l = 16 * part; l < 16 * part + 16; ++l) {
                        const int qv = ((q[l] >> (2 * j)) & 3) - ((b.hmask[l] & hbit) ? 0 : 4);
                        *out++ = dl * static_cast<float>(qv);
                    }
                }
            }
        }
    }
}

// Q4_K: 8 sub-blocks of 32 with 6-bit scale and min; element 64*p + l is the
// low nibble of qs[32*p + l] (sub-block 2p), element 64*p + 32 + l the high
// nibble (sub-block 2p + 1). y = (d*sc) * q - (dmin*m).
void to_float_q4_K(const void* x, float* y, int64_t k) {
    check_row_length("Q4_K", QK_K, k);
    for (int64_t i = 0; i < k / QK_K; ++i) {
        const auto b = load_block<block_q4_K>(x, i);
        const float d = fp16_to_fp32(b.d);
        const float dmin = fp16_to_fp32(b.dmin);
        float* out = y + i * QK_K;
        for (int p = 0; p < 4; ++p) {
            uint8_t sc, m;
            get_scale_min_k4(2 * p, b.scales, &sc, &m);
            const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
            get_scale_min_k4(2 * p + 1, b.scales, &sc, &m);
            const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
            const uint8_t* q = b.qs + 32 * p;
            for (int l = 0; l < 32; ++l) *out++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; ++l) *out++ = d2 * static_cast<float>(q[l] >> 4) - m2;
        }
    }
}

// Q5_K: Q4_K plus bit 4 of element 64*p + l in bit 2p of qh[l] and of element
// 64*p + 32 + l in bit 2p + 1.
void to_float_q5_K(const void* x, float* y, int64_t k) {
    check_row_length("Q5_K", QK_K, k);
    for (int64_t i = 0; i < k / QK_K; ++i) {
        const auto b = load_block<block_q5_K>(x, i);
        const float d = fp16_to_fp32(b.d);
        const float dmin = fp16_to_fp32(b.dmin);
        float* out = y + i * QK_K;
        for (int p = 0; p < 4; ++p) {
            uint8_t sc, m;
            get_scale_min_k4(2 * p, b.scales, &sc, &m);
            const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
            get_scale_min_k4(2 * p + 1, b.scales, &sc, &m);
            const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
            const uint8_t* ql = b.qs + 32 * p;
            const uint8_t u1 = static_cast<uint8_t>(1u << (2 * p)), u2 = static_cast<uint8_t>(2u << (2 * p));
            for (int l = 0; l < 32; ++l)
                *out++ = d1 * static_cast<float>((ql[l] & 0xF) + ((b.qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l)
                *out++ = d2 * static_cast<float>((ql[l] >> 4) + ((b.qh[l] & u2) ? 16 : 0)) - m2;
        }
    }
}

// Q6_K: 16 sub-blocks of 16 with int8 scales. In half h, element
// 128*h + 32*r + l (r 0..3, l 0..31): low 4 bits from ql[64*h + 32*(r%2) + l]
// (low nibble for r < 2, high for r >= 2), high 2 bits from bits 2r.. of
// qh[32*h + l]; minus 32. Sub-block 8*h + 2*r + l/16. y = (d*sc) * q.
void to_float_q6_K(const void* x, float* y, int64_t k) {
    check_row_length("Q6_K", QK_K, k);
    for (int64_t i = 0; i < k / QK_K; ++i) {
        const auto b = load_block<block_q6_K>(x, i);
        const float d = fp16_to_fp32(b.d);
        float* out = y + i * QK_K;
        for (int h = 0; h < 2; ++h) {
            const uint8_t* ql = b.ql + 64 * h;
            const uint8_t* qh = b.qh + 32 * h;
            const int8_t* sc = b.scales + 8 * h;
            for (int r = 0; r < 4; ++r) {
                for (int l = 0; l < 32; ++l) {
                    const uint8_t lo = r < 2 ? (ql[32 * r + l] & 0xF) : (ql[32 * (r - 2) + l] >> 4);
                    const int qv = (lo | (((qh[l] >> (2 * r)) & 3) << 4)) - 32;
                    const float dl = d * static_cast<float>(sc[2 * r + l / 16]);
                    out[128 * h + 32 * r + l] = dl * static_cast<float>(qv);
                }
            }
        }
    }
}

void to_float_q8_K(const void* x, float* y, int64_t k) {
    check_row_length("Q8_K", QK_K, k);
    for (int64_t i = 0; i < k / QK_K; ++i) {
        const auto b = load_block<block_q8_K>(x, i);
        for (int j = 0; j < QK_K; ++j) y[i * QK_K + j] = b.d * static_cast<float>(b.qs[j]);
    }
}

// Q8_K: max = signed value of largest magnitude (first on ties),
// iscale = -127/max, q = min(127, nearest_int(iscale*x)), d = 1/iscale (fp32),
// bsums = sums of q over groups of 16. An all-zero block is all zeros.
void from_float_q8_K(const float* x, void* y, int64_t k) {
    check_row_length("Q8_K", QK_K, k);
    for (int64_t i = 0; i < k / QK_K; ++i) {
        const float* v = x + i * QK_K;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK_K; ++j) {
            const float ax = std::fabs(v[j]);
            if (ax > amax) {
                amax = ax;
                max = v[j];
            }
        }
        block_q8_K b{};
        if (amax != 0.0f) {
            const float iscale = -127.f / max;
            for (int j = 0; j < QK_K; ++j) b.qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * v[j])));
            for (int g = 0; g < QK_K / 16; ++g) {
                int sum = 0;
                for (int l = 0; l < 16; ++l) sum += b.qs[16 * g + l];
                b.bsums[g] = static_cast<int16_t>(sum);
            }
            b.d = 1 / iscale;
        }
        store_block(y, i, b);
    }
}

}  // namespace quern::ref

// =========================================================== dispatch

namespace quern {

// The traits table (quant/traits.cpp) is the one list of per-type functions.
bool quant_ref_supports(DType t) { return find_quant_traits(t) != nullptr; }

void dequantize_row_ref(DType t, const void* x, float* y, int64_t k) { quant_traits(t).to_float(x, y, k); }

void quantize_row_ref(DType t, const float* x, void* y, int64_t k) { quant_traits(t).from_float(x, y, k); }

void quantize_row_weighted(DType t, const float* x, void* y, int64_t k, const float* importance) {
    using Fn = void (*)(const float*, void*, int64_t, const float*);
    Fn fn = nullptr;
    switch (t) {
        case DType::Q4_0: fn = ref::from_float_weighted_q4_0; break;
        case DType::Q4_1: fn = ref::from_float_weighted_q4_1; break;
        case DType::Q5_0: fn = ref::from_float_weighted_q5_0; break;
        case DType::Q5_1: fn = ref::from_float_weighted_q5_1; break;
        case DType::Q2_K: fn = ref::from_float_weighted_q2_K; break;
        case DType::Q3_K: fn = ref::from_float_weighted_q3_K; break;
        case DType::Q4_K: fn = ref::from_float_weighted_q4_K; break;
        case DType::Q5_K: fn = ref::from_float_weighted_q5_K; break;
        case DType::Q6_K: fn = ref::from_float_weighted_q6_K; break;
        default: break;
    }
    if (fn && importance) fn(x, y, k, importance);
    else quantize_row_ref(t, x, y, k);
}

}  // namespace quern
