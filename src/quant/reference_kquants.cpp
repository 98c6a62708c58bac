// Reference quantizers for the K-quant weight types (Q2_K .. Q6_K), following
// the algorithms of ggml's quantize_row_q*_K_ref (no importance matrix):
//
//  * Q2_K, Q4_K, Q5_K ("scale + min" types): each sub-block gets an affine fit
//    x ≈ scale*q - min, searched by fit_scale_min() below; the sub-block scales
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
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "quant/blocks.h"
#include "quant/ref_rows.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace quern::ref {

namespace {

// Below this magnitude a group is treated as all zeros (ggml's GROUP_MAX_EPS).
constexpr float kGroupMaxEps = 1e-15f;

template <class B>
void store_block(void* base, int64_t i, const B& b) {
    std::memcpy(static_cast<unsigned char*>(base) + i * static_cast<int64_t>(sizeof(B)), &b, sizeof(B));
}

inline int clampi(int v, int lo, int hi) { return std::max(lo, std::min(hi, v)); }

// Weighted affine fit for n values: x[i] ≈ scale * L[i] - the_min, L in
// [0, nmax], the_min >= 0 (the offset is never positive, so a sub-block of
// positive values still decodes 0 exactly). Starts from the min/max grid, then
// tries nstep+1 grid spacings (nmax + rmin + rdelta*s)/(max - min), solving the
// weighted least squares for scale and offset on each and keeping the one with
// the smallest weighted error (|diff| with use_mad, else diff²).
// Writes L and the_min; returns scale. Laux is scratch of n entries.
float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* the_min, uint8_t* Laux,
                    float rmin, float rdelta, int nstep, bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        std::fill(L, L + n, uint8_t{0});
        *the_min = -min;
        return 0.f;
    }
    float iscale = static_cast<float>(nmax) / (max - min);
    float scale = 1 / iscale;
    auto error_of = [&](float s, float m, const uint8_t* q) {
        float e = 0;
        for (int i = 0; i < n; ++i) {
            float diff = s * static_cast<float>(q[i]) + m - x[i];
            diff = use_mad ? std::fabs(diff) : diff * diff;
            e += w[i] * diff;
        }
        return e;
    };
    for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(clampi(nearest_int(iscale * (x[i] - min)), 0, nmax));
    float best_error = error_of(scale, min, L);
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int step = 0; step <= nstep; ++step) {
        iscale = (rmin + rdelta * static_cast<float>(step) + static_cast<float>(nmax)) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            const int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = static_cast<uint8_t>(l);
            const float fl = static_cast<float>(l);
            sum_l += w[i] * fl;
            sum_l2 += w[i] * fl * fl;
            sum_xl += w[i] * fl * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            const float err = error_of(this_scale, this_min, Laux);
            if (err < best_error) {
                std::copy(Laux, Laux + n, L);
                best_error = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

// Symmetric fit x ≈ scale * l, l in [-nmax, nmax-1], weights x², refined by
// coordinate descent: up to 5 passes, each moving single l[i] to the value
// that maximises (Σ w x l)² / Σ w l² (the least-squares objective) given the
// others. Writes L = l + nmax; returns scale (0 for an all-zero group).
float fit_symmetric_refine(int n, int nmax, const float* x, int8_t* L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        const float ax = std::fabs(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < kGroupMaxEps) {
        std::fill(L, L + n, int8_t{0});
        return 0.f;
    }
    const float iscale = static_cast<float>(-nmax) / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = static_cast<int8_t>(l);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * static_cast<float>(l);
        suml2 += w * static_cast<float>(l) * static_cast<float>(l);
    }
    for (int pass = 0; pass < 5; ++pass) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = x[i] * x[i];
            const float li = static_cast<float>(L[i]);
            float slx = sumlx - w * x[i] * li;
            if (slx > 0) {
                float sl2 = suml2 - w * li * li;
                const int new_l = clampi(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    const float fl = static_cast<float>(new_l);
                    slx += w * x[i] * fl;
                    sl2 += w * fl * fl;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = static_cast<int8_t>(new_l);
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
    return sumlx / suml2;
}

// Symmetric fit x ≈ scale * l, l in [-nmax, nmax-1], weights x² (ggml's
// make_qx_quants with rmse_type 1): least-squares scale for the grid
// -nmax/max, then for the 18 grids -(nmax + 0.1*s)/max, s = ±1..±9, keeping
// the one with the largest (Σ w x l)² / Σ w l². Writes L = l + nmax.
float fit_symmetric_search(int n, int nmax, const float* x, int8_t* L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        const float ax = std::fabs(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < kGroupMaxEps) {
        std::fill(L, L + n, int8_t{0});
        return 0.f;
    }
    auto sums_for = [&](float iscale, float& sumlx, float& suml2, bool write_L) {
        sumlx = 0;
        suml2 = 0;
        for (int i = 0; i < n; ++i) {
            const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            if (write_L) L[i] = static_cast<int8_t>(l + nmax);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * static_cast<float>(l);
            suml2 += w * static_cast<float>(l) * static_cast<float>(l);
        }
    };
    float sumlx, suml2;
    sums_for(static_cast<float>(-nmax) / max, sumlx, suml2, true);
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int s = -9; s <= 9; ++s) {
        if (s == 0) continue;
        const float iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(s)) / max;
        sums_for(iscale, sumlx, suml2, false);
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            sums_for(iscale, sumlx, suml2, true);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

// Packs the 2-bit values L[0..255] as Q2_K/Q3_K store them: element
// 128*h + 32*j + l goes to bits 2j.. of qs[32*h + l].
void pack_2bit(const uint8_t* L, uint8_t* qs) {
    for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l) {
            const uint8_t* e = L + 128 * h + l;
            qs[32 * h + l] = static_cast<uint8_t>(e[0] | (e[32] << 2) | (e[64] << 4) | (e[96] << 6));
        }
}

// Q4_K/Q5_K: 6-bit scale ls and min lm of sub-block j (0..7) into 12 bytes.
// j < 4: bytes j and j+4 hold ls and lm in their low 6 bits. j >= 4: byte j+4
// holds the low nibbles of ls | lm << 4, and the top 2 bits of ls and lm go to
// bits 6..7 of bytes j-4 and j.
void pack_scale_min_k4(int j, int ls, int lm, uint8_t* s) {
    if (j < 4) {
        s[j] = static_cast<uint8_t>(ls);
        s[j + 4] = static_cast<uint8_t>(lm);
    } else {
        s[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
        s[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
        s[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
}

// Shared by Q4_K and Q5_K: fits the 8 sub-blocks of one super-block, packs
// scales/mins into `scales`, returns d and dmin as fp16 bits, and leaves the
// final element codes (0..nmax) in L.
void quantize_scale_min_super_block(const float* x, int nmax, float rmin, int nstep, uint8_t* scales12,
                                    uint16_t* d_out, uint16_t* dmin_out, uint8_t* L) {
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
    std::memset(scales12, 0, K_SCALE_SIZE);
    for (int j = 0; j < 8; ++j) {
        const int ls = std::min(63, static_cast<int>(static_cast<uint8_t>(nearest_int(inv_scale * scales[j]))));
        const int lm = std::min(63, static_cast<int>(static_cast<uint8_t>(nearest_int(inv_min * mins[j]))));
        pack_scale_min_k4(j, ls, lm, scales12);
    }
    *d_out = fp32_to_fp16(max_scale / 63.f);
    *dmin_out = fp32_to_fp16(max_min / 63.f);
    // Re-quantize every element against the scales exactly as they decode.
    for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        get_scale_min_k4(j, scales12, &sc, &m);
        const float d = fp16_to_fp32(*d_out) * static_cast<float>(sc);
        if (d == 0.0f) continue;
        const float dm = fp16_to_fp32(*dmin_out) * static_cast<float>(m);
        for (int l = 0; l < 32; ++l)
            L[32 * j + l] = static_cast<uint8_t>(clampi(nearest_int((x[32 * j + l] + dm) / d), 0, nmax));
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
        for (int j = 0; j < 16; ++j) {
            const float d = fp16_to_fp32(b.d) * static_cast<float>(b.scales[j] & 0xF);
            if (d == 0.0f) continue;
            const float dm = fp16_to_fp32(b.dmin) * static_cast<float>(b.scales[j] >> 4);
            for (int l = 0; l < 16; ++l)
                L[16 * j + l] = static_cast<uint8_t>(clampi(nearest_int((xb[16 * j + l] + dm) / d), 0, 3));
        }
        pack_2bit(L, b.qs);
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
            for (int j = 0; j < 16; ++j) {
                const int l = clampi(nearest_int(iscale * scales[j]), -32, 31) + 32;
                if (j < 8)
                    b.scales[j] = static_cast<uint8_t>(l & 0xF);
                else
                    b.scales[j - 8] = static_cast<uint8_t>(b.scales[j - 8] | ((l & 0xF) << 4));
                b.scales[8 + j % 4] = static_cast<uint8_t>(b.scales[8 + j % 4] | ((l >> 4) << (2 * (j / 4))));
            }
            b.d = fp32_to_fp16(1 / iscale);
        } else {
            b.d = fp32_to_fp16(0.f);
        }
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
        quantize_scale_min_super_block(x + i * QK_K, 15, -1.f, 20, b.scales, &b.d, &b.dmin, L);
        for (int p = 0; p < 4; ++p)
            for (int l = 0; l < 32; ++l)
                b.qs[32 * p + l] = static_cast<uint8_t>(L[64 * p + l] | (L[64 * p + 32 + l] << 4));
        store_block(y, i, b);
    }
}

void from_float_q5_K(const float* x, void* y, int64_t k) {
    check_row_length("Q5_K", QK_K, k);
    for (int64_t i = 0; i < k / QK_K; ++i) {
        block_q5_K b{};
        uint8_t L[QK_K];
        quantize_scale_min_super_block(x + i * QK_K, 31, -0.5f, 15, b.scales, &b.d, &b.dmin, L);
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
        store_block(y, i, b);
    }
}

// =========================================================== Q6_K
// Sub-blocks of 16: fit_symmetric_search(nmax 32); int8 scales against
// d = -max_scale/128.
void from_float_q6_K(const float* x, void* y, int64_t k) {
    check_row_length("Q6_K", QK_K, k);
    for (int64_t i = 0; i < k / QK_K; ++i) {
        const float* xb = x + i * QK_K;
        int8_t L[QK_K];
        float scales[16];
        float max_scale = 0, max_abs_scale = 0;
        for (int j = 0; j < 16; ++j) {
            scales[j] = fit_symmetric_search(16, 32, xb + 16 * j, L + 16 * j);
            const float a = std::fabs(scales[j]);
            if (a > max_abs_scale) {
                max_abs_scale = a;
                max_scale = scales[j];
            }
        }
        block_q6_K b{};
        if (max_abs_scale < kGroupMaxEps) {
            store_block(y, i, b);  // all zero, d = +0
            continue;
        }
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
        store_block(y, i, b);
    }
}

}  // namespace quern::ref
