// Reference quantizers for the K-quant weight types (Q2_K .. Q6_K), following
// the algorithms of ggml's quantize_row_q*_K_ref (no importance matrix), and
// the importance-weighted ones (from_float_weighted_*: ggml's
// quantize_row_q*_K_impl with quant_weights):
//
//  * Q2_K, Q4_K, Q5_K ("scale + min" types): each sub-block gets an affine fit
//    x ≈ scale*q - min, searched by fit_scale_min() (quant/fit.h); the sub-block scales
//    and mins are then themselves quantized against one fp16 super-scale each
//    (4 bits for Q2_K, 6 bits packed into 12 bytes for Q4_K/Q5_K), and the
//    elements are re-quantized with the scales as they will be decoded.
//  * Q3_K, Q6_K ("symmetric" types): each sub-block gets x ≈ scale*q with q in
//    [-nmax, nmax-1], searched by fit_symmetric_refine() (Q3_K) or
//    fit_symmetric_search() (Q6_K); sub-block scales are quantized to 6 bits
//    (Q3_K, packed into 12 bytes) or int8 (Q6_K) against one fp16 super-scale.
//
// The float expressions keep ggml's evaluation order so that results match
// ggml's reference quantizers; see reference.cpp for the FMA note.
#include "quant/no_fp_contract.h"  // first: applies to everything below, fit.h's inline code too
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "quant/blocks.h"
#include "quant/fit.h"
#include "quant/ref_rows.h"


namespace quern::ref {

namespace {

// ---- the steps after the scales are chosen, shared by the reference and the
// importance-weighted quantizers: each re-quantizes the elements against the
// scales exactly as they decode, then packs them.

void finish_q2_K(const float* xb, block_q2_K& b, uint8_t* L) {
    for (int j = 0; j < 16; ++j) {
        const float d = fp16_to_fp32(b.d) * static_cast<float>(b.scales[j] & 0xF);
        if (d == 0.0f) continue;
        const float dm = fp16_to_fp32(b.dmin) * static_cast<float>(b.scales[j] >> 4);
        for (int l = 0; l < 16; ++l)
            L[16 * j + l] = static_cast<uint8_t>(clampi(nearest_int((xb[16 * j + l] + dm) / d), 0, 3));
    }
    pack_2bit(L, b.qs);
}

// The 6-bit scale code l (0..63) of sub-block j into Q3_K's 12 bytes: low
// nibbles in bytes 0..7 (j < 8 low half, else high half), top 2 bits in
// bytes 8..11.
void pack_q3_K_scale(int j, int l, uint8_t* scales) {
    if (j < 8)
        scales[j] = static_cast<uint8_t>(l & 0xF);
    else
        scales[j - 8] = static_cast<uint8_t>(scales[j - 8] | ((l & 0xF) << 4));
    scales[8 + j % 4] = static_cast<uint8_t>(scales[8 + j % 4] | ((l >> 4) << (2 * (j / 4))));
}

void finish_q3_K(const float* xb, block_q3_K& b, int8_t* L) {
    for (int j = 0; j < 16; ++j) {
        const int lo = j < 8 ? (b.scales[j] & 0xF) : (b.scales[j - 8] >> 4);
        const int sc = (lo | (((b.scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
        const float d = fp16_to_fp32(b.d) * static_cast<float>(sc);
        if (d == 0.0f) continue;
        for (int l = 0; l < 16; ++l)
            L[16 * j + l] = static_cast<int8_t>(clampi(nearest_int(xb[16 * j + l] / d), -4, 3) + 4);
    }
    // High bit (value >= 4) of element e goes to bit e/32 of hmask[e%32].
    uint8_t Lu[QK_K];
    for (int e = 0; e < QK_K; ++e) {
        int v = L[e];
        if (v > 3) {
            b.hmask[e % 32] = static_cast<uint8_t>(b.hmask[e % 32] | (1u << (e / 32)));
            v -= 4;
        }
        Lu[e] = static_cast<uint8_t>(v);
    }
    pack_2bit(Lu, b.qs);
}

// Q4_K / Q5_K: the element codes (0..nmax) against the packed scales and mins.
void requantize_scale_min(const float* x, int nmax, const uint8_t* scales12, uint16_t d16, uint16_t dmin16,
                          uint8_t* L) {
    for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        get_scale_min_k4(j, scales12, &sc, &m);
        const float d = fp16_to_fp32(d16) * static_cast<float>(sc);
        if (d == 0.0f) continue;
        const float dm = fp16_to_fp32(dmin16) * static_cast<float>(m);
        for (int l = 0; l < 32; ++l)
            L[32 * j + l] = static_cast<uint8_t>(clampi(nearest_int((x[32 * j + l] + dm) / d), 0, nmax));
    }
}

void pack_q4_K(const uint8_t* L, block_q4_K& b) {
    for (int p = 0; p < 4; ++p)
        for (int l = 0; l < 32; ++l)
            b.qs[32 * p + l] = static_cast<uint8_t>(L[64 * p + l] | (L[64 * p + 32 + l] << 4));
}

void pack_q5_K(const uint8_t* L, block_q5_K& b) {
    for (int p = 0; p < 4; ++p) {
        for (int l = 0; l < 32; ++l) {
            int l1 = L[64 * p + l], l2 = L[64 * p + 32 + l];
            if (l1 > 15) {
                l1 -= 16;
                b.qh[l] = static_cast<uint8_t>(b.qh[l] | (1u << (2 * p)));
            }
            if (l2 > 15) {
                l2 -= 16;
                b.qh[l] = static_cast<uint8_t>(b.qh[l] | (2u << (2 * p)));
            }
            b.qs[32 * p + l] = static_cast<uint8_t>(l1 | (l2 << 4));
        }
    }
}

// Shared by Q4_K and Q5_K without weights: fits the 8 sub-blocks of one
// super-block, packs scales/mins against max/63, sets d and dmin and leaves
// the final element codes (0..nmax) in L.
template <class B>
void scale_min_super_block(const float* x, int nmax, float rmin, int nstep, B& b, uint8_t* L) {
    float weights[32], mins[8], scales[8];
    uint8_t Laux[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
        const float* xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
        const float av_x = std::sqrt(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
        scales[j] = fit_scale_min(32, nmax, xs, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < 8; ++j) {
        const int ls = std::min(63, static_cast<int>(static_cast<uint8_t>(nearest_int(inv_scale * scales[j]))));
        const int lm = std::min(63, static_cast<int>(static_cast<uint8_t>(nearest_int(inv_min * mins[j]))));
        pack_scale_min_k4(j, ls, lm, b.scales);
    }
    b.d = fp32_to_fp16(max_scale / 63.f);
    b.dmin = fp32_to_fp16(max_min / 63.f);
    requantize_scale_min(x, nmax, b.scales, b.d, b.dmin, L);
}

// The same with importance weights (ggml's quantize_row_q4_K_impl /
// q5_K_impl): sub-block weights imp·sqrt(σ² + x²) with σ² = 2·mean(x²) of
// the super-block, a finer grid search (rmin −0.9, step 0.05, 37 grids), and
// the scales and mins fitted by fit_positive under the sub-blocks' total
// weights instead of max/63. Q5_K caps the codes at 63 (clamp_63).
template <class B>
void scale_min_super_block_weighted(const float* x, const float* imp, int nmax, bool clamp_63, B& b, uint8_t* L) {
    const float sigma2 = 2 * sum_squares(QK_K, x) / QK_K;
    float weights[32], sw[8], mins[8], scales[8];
    uint8_t Laux[32], Ls[8], Lm[8];
    for (int j = 0; j < 8; ++j) {
        importance_weights(32, x + 32 * j, imp + 32 * j, sigma2, weights);
        float sumw = 0;
        for (int l = 0; l < 32; ++l) sumw += weights[l];
        sw[j] = sumw;
        scales[j] = fit_scale_min(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -0.9f, 0.05f, 36, false);
    }
    const float d_block = fit_positive(8, 63, scales, Ls, sw);
    const float m_block = fit_positive(8, 63, mins, Lm, sw);
    for (int j = 0; j < 8; ++j) {
        const int ls = clamp_63 ? std::min<int>(63, Ls[j]) : Ls[j];
        const int lm = clamp_63 ? std::min<int>(63, Lm[j]) : Lm[j];
        pack_scale_min_k4(j, ls, lm, b.scales);
    }
    b.d = fp32_to_fp16(d_block);
    b.dmin = fp32_to_fp16(m_block);
    requantize_scale_min(x, nmax, b.scales, b.d, b.dmin, L);
}

// Q6_K's super-block: fit_symmetric_search(nmax 32) per sub-block of 16
// (weights imp, or x² without), int8 scales against d = −max_scale/128.
void q6_K_block(const float* xb, const float* imp, block_q6_K& b) {
    int8_t L[QK_K];
    float scales[16];
    float max_scale = 0, max_abs_scale = 0;
    for (int j = 0; j < 16; ++j) {
        scales[j] = fit_symmetric_search(16, 32, xb + 16 * j, L + 16 * j, imp ? imp + 16 * j : nullptr);
        const float a = std::fabs(scales[j]);
        if (a > max_abs_scale) {
            max_abs_scale = a;
            max_scale = scales[j];
        }
    }
    b = block_q6_K{};
    if (max_abs_scale < kGroupMaxEps) return;  // all zero, d = +0
    const float iscale = -128.f / max_scale;
    b.d = fp32_to_fp16(1 / iscale);
    for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[j])));
    for (int j = 0; j < 16; ++j) {
        const float d = fp16_to_fp32(b.d) * static_cast<float>(b.scales[j]);
        if (d == 0.0f) continue;
        for (int l = 0; l < 16; ++l)
            L[16 * j + l] = static_cast<int8_t>(clampi(nearest_int(xb[16 * j + l] / d), -32, 31) + 32);
    }
    // Element 128*h + 32*r + l: low nibble into ql[64*h + 32*(r%2) + l]
    // (low half for r < 2, high half for r >= 2), top 2 bits into bits 2r..
    // of qh[32*h + l].
    for (int h = 0; h < 2; ++h) {
        for (int l = 0; l < 32; ++l) {
            const int8_t* e = L + 128 * h + l;
            b.ql[64 * h + l] = static_cast<uint8_t>((e[0] & 0xF) | ((e[64] & 0xF) << 4));
            b.ql[64 * h + 32 + l] = static_cast<uint8_t>((e[32] & 0xF) | ((e[96] & 0xF) << 4));
            b.qh[32 * h + l] =
                static_cast<uint8_t>((e[0] >> 4) | ((e[32] >> 4) << 2) | ((e[64] >> 4) << 4) | ((e[96] >> 4) << 6));
        }
    }
}

}  // namespace

// =========================================================== Q2_K
// Sub-blocks of 16: fit_scale_min(nmax 3, weights |x|, mean absolute error);
// 4-bit scales and mins against d = max_scale/15 and dmin = max_min/15.
void from_float_q2_K(const float* x, void* y, int64_t k) {
    check_row_length("Q2_K", QK_K, k);
    constexpr float q4scale = 15.f;
    for (int64_t i = 0; i < k / QK_K; ++i) {
        const float* xb = x + i * QK_K;
        uint8_t L[QK_K], Laux[16];
        float weights[16], mins[16], scales[16];
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 16; ++j) {
            for (int l = 0; l < 16; ++l) weights[l] = std::fabs(xb[16 * j + l]);
            scales[j] = fit_scale_min(16, 3, xb + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        block_q2_K b{};
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
            b.d = fp32_to_fp16(max_scale / q4scale);
        } else {
            b.d = fp32_to_fp16(0.f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < 16; ++j)
                b.scales[j] = static_cast<uint8_t>(b.scales[j] | (nearest_int(iscale * mins[j]) << 4));
            b.dmin = fp32_to_fp16(max_min / q4scale);
        } else {
            b.dmin = fp32_to_fp16(0.f);
        }
        finish_q2_K(xb, b, L);
        store_block(y, i, b);
    }
}

// With importance weights (ggml's quantize_row_q2_K_impl): sub-block weights
// imp·sqrt(σ² + x²), σ² = mean(x²) of the super-block; squared error, the
// finer grid search; 4-bit scales and mins by fit_positive.
void from_float_weighted_q2_K(const float* x, void* y, int64_t k, const float* imp) {
    check_row_length("Q2_K", QK_K, k);
    for (int64_t i = 0; i < k / QK_K; ++i) {
        const float* xb = x + i * QK_K;
        const float* qw = imp + i * QK_K;
        const float sigma2 = sum_squares(QK_K, xb) / QK_K;
        uint8_t L[QK_K], Laux[16], Ls[16], Lm[16];
        float weight[16], mins[16], scales[16], sw[16] = {};
        for (int j = 0; j < 16; ++j) {
            importance_weights(16, xb + 16 * j, qw + 16 * j, sigma2, weight);
            for (int l = 0; l < 16; ++l) sw[j] += weight[l];
            scales[j] = fit_scale_min(16, 3, xb + 16 * j, weight, L + 16 * j, &mins[j], Laux, -0.9f, 0.05f, 36, false);
        }
        const float dm = fit_positive(16, 15, scales, Ls, sw);
        const float mm = fit_positive(16, 15, mins, Lm, sw);
        block_q2_K b{};
        b.d = fp32_to_fp16(dm);
        b.dmin = fp32_to_fp16(mm);
        for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<uint8_t>(Ls[j] | (Lm[j] << 4));
        finish_q2_K(xb, b, L);
        store_block(y, i, b);
    }
}

// =========================================================== Q3_K
// Sub-blocks of 16: fit_symmetric_refine(nmax 4); 6-bit signed scales (stored
// +32) against d = -max_scale/32, packed as to_float_q3_K reads them.
void from_float_q3_K(const float* x, void* y, int64_t k) {
    check_row_length("Q3_K", QK_K, k);
    for (int64_t i = 0; i < k / QK_K; ++i) {
        const float* xb = x + i * QK_K;
        int8_t L[QK_K];
        float scales[16];
        float max_scale = 0, amax = 0;
        for (int j = 0; j < 16; ++j) {
            scales[j] = fit_symmetric_refine(16, 4, xb + 16 * j, L + 16 * j);
            const float a = std::fabs(scales[j]);
            if (a > amax) {
                amax = a;
                max_scale = scales[j];
            }
        }
        block_q3_K b{};
        if (max_scale != 0.0f) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < 16; ++j) pack_q3_K_scale(j, clampi(nearest_int(iscale * scales[j]), -32, 31) + 32, b.scales);
            b.d = fp32_to_fp16(1 / iscale);
        } else {
            b.d = fp32_to_fp16(0.f);
        }
        finish_q3_K(xb, b, L);
        store_block(y, i, b);
    }
}

// With importance weights (ggml's quantize_row_q3_K_impl): each sub-block by
// fit_symmetric_search under weights imp·sqrt(σ² + x²), σ² = 2·mean(x²); the
// 16 scales themselves by fit_symmetric_search(nmax 32) under the
// sub-blocks' total weights.
void from_float_weighted_q3_K(const float* x, void* y, int64_t k, const float* imp) {
    check_row_length("Q3_K", QK_K, k);
    for (int64_t i = 0; i < k / QK_K; ++i) {
        const float* xb = x + i * QK_K;
        const float* qw = imp + i * QK_K;
        const float sigma2 = 2 * sum_squares(QK_K, xb) / QK_K;
        int8_t L[QK_K], Ls[16];
        float weight[16], scales[16], sw[16];
        for (int j = 0; j < 16; ++j) {
            importance_weights(16, xb + 16 * j, qw + 16 * j, sigma2, weight);
            float sumw = 0;
            for (int l = 0; l < 16; ++l) sumw += weight[l];
            sw[j] = sumw;
            scales[j] = fit_symmetric_search(16, 4, xb + 16 * j, L + 16 * j, weight);
        }
        block_q3_K b{};
        const float d_block = fit_symmetric_search(16, 32, scales, Ls, sw);
        for (int j = 0; j < 16; ++j) pack_q3_K_scale(j, Ls[j], b.scales);
        b.d = fp32_to_fp16(d_block);
        finish_q3_K(xb, b, L);
        store_block(y, i, b);
    }
}

// =========================================================== Q4_K / Q5_K
// Sub-blocks of 32: fit_scale_min(weights av|x| + |x|, squared error), 6-bit
// scales and mins against d = max_scale/63 and dmin = max_min/63.
void from_float_q4_K(const float* x, void* y, int64_t k) {
    check_row_length("Q4_K", QK_K, k);
    for (int64_t i = 0; i < k / QK_K; ++i) {
        block_q4_K b{};
        uint8_t L[QK_K];
        scale_min_super_block(x + i * QK_K, 15, -1.f, 20, b, L);
        pack_q4_K(L, b);
        store_block(y, i, b);
    }
}

void from_float_q5_K(const float* x, void* y, int64_t k) {
    check_row_length("Q5_K", QK_K, k);
    for (int64_t i = 0; i < k / QK_K; ++i) {
        block_q5_K b{};
        uint8_t L[QK_K];
        scale_min_super_block(x + i * QK_K, 31, -0.5f, 15, b, L);
        pack_q5_K(L, b);
        store_block(y, i, b);
    }
}

void from_float_weighted_q4_K(const float* x, void* y, int64_t k, const float* imp) {
    check_row_length("Q4_K", QK_K, k);
    for (int64_t i = 0; i < k / QK_K; ++i) {
        block_q4_K b{};
        uint8_t L[QK_K];
        scale_min_super_block_weighted(x + i * QK_K, imp + i * QK_K, 15, false, b, L);
        pack_q4_K(L, b);
        store_block(y, i, b);
    }
}

void from_float_weighted_q5_K(const float* x, void* y, int64_t k, const float* imp) {
    check_row_length("Q5_K", QK_K, k);
    for (int64_t i = 0; i < k / QK_K; ++i) {
        block_q5_K b{};
        uint8_t L[QK_K];
        scale_min_super_block_weighted(x + i * QK_K, imp + i * QK_K, 31, true, b, L);
        pack_q5_K(L, b);
        store_block(y, i, b);
    }
}

// =========================================================== Q6_K
// Sub-blocks of 16: fit_symmetric_search(nmax 32); int8 scales against
// d = -max_scale/128. The weighted form passes the importance as the fit's
// weights as they are (ggml's quantize_row_q6_K_impl).
void from_float_q6_K(const float* x, void* y, int64_t k) {
    check_row_length("Q6_K", QK_K, k);
    for (int64_t i = 0; i < k / QK_K; ++i) {
        block_q6_K b;
        q6_K_block(x + i * QK_K, nullptr, b);
        store_block(y, i, b);
    }
}

void from_float_weighted_q6_K(const float* x, void* y, int64_t k, const float* imp) {
    check_row_length("Q6_K", QK_K, k);
    for (int64_t i = 0; i < k / QK_K; ++i) {
        block_q6_K b;
        q6_K_block(x + i * QK_K, imp + i * QK_K, b);
        store_block(y, i, b);
    }
}

}  // namespace quern::ref
