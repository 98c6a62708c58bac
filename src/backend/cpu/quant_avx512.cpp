// AVX-512 activation quantizers: float rows -> Q8_0 / Q8_1 / Q8_K blocks,
// byte-identical to quantize_row_ref (src/quant/reference.cpp):
//   Q8_0/Q8_1: d = amax/127, id = 1/d, q = roundf(x*id) (ties away from zero),
//              Q8_1 s = fp16(float(sum q) * d).
//   Q8_K:      max = signed value of largest magnitude (first on ties),
//              iscale = -127/max, q = min(127, round-half-even(iscale*x)),
//              d = 1/iscale, bsums = sums of 16.
// Every float operation is the same IEEE operation as the reference (no FMA
// contraction: products are rounded before rounding to integers).
// fp16 rounding uses F16C (round to nearest even, as fp32_to_fp16). Header
// inline functions are not called from ISA-specific files (ODR: the linker
// could pick this file's copy for generic code).
// Input: any alignment. Output: block arrays at any alignment (unaligned stores).
// Bound by: compute (~0.5 instructions per element); O(n*K), small next to the matmul.
// GCC 12 reports false -Wuninitialized positives inside the AVX-512 intrinsics headers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/kernels.h"
#include "quant/blocks.h"

namespace quern::cpu::avx512 {

namespace {

// Horizontal max of 16 lanes, broadcast to all lanes.
inline __m512 hmax_bcast(__m512 m) {
    m = _mm512_max_ps(m, _mm512_shuffle_f32x4(m, m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm512_max_ps(m, _mm512_shuffle_f32x4(m, m, _MM_SHUFFLE(2, 3, 0, 1)));
    m = _mm512_max_ps(m, _mm512_permute_ps(m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm512_max_ps(m, _mm512_permute_ps(m, _MM_SHUFFLE(2, 3, 0, 1)));
    return m;
}

// roundf: nearest, ties away from zero, exact for every float.
inline __m512i round_away_epi32(__m512 t) {
    const __m512 tr = _mm512_roundscale_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m512 frac = _mm512_sub_ps(t, tr);  // exact
    const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(frac), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512 one = _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(t, _mm512_set1_ps(-0.0f)));
    return _mm512_cvttps_epi32(_mm512_mask_add_ps(tr, up, tr, one));
}

// Q8_0 / Q8_1 rows, 16 blocks (512 values) per step so that the scale
// arithmetic (amax/127, 1/d, fp16 rounding, Q8_1's sum*d) runs once per 16
// blocks in vector registers instead of as scalar divisions per block.
// Per element the operations are exactly the reference's.
template <bool Q81>
void q8_rows(const float* x, void* y, int64_t k) {
    constexpr int64_t BS = Q81 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    constexpr int64_t QOFF = Q81 ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
    auto* out = static_cast<uint8_t*>(y);
    const int64_t nb = k / 32;
    alignas(64) float amax[16], idv[16];
    alignas(64) int32_t sums[16];
    alignas(32) uint16_t dh[16], sh[16];
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
        const int nblk = static_cast<int>(nb - b0 < 16 ? nb - b0 : 16);
        const float* xb = x + b0 * 32;
        for (int b = 0; b < nblk; ++b) {
            const __m512 m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xb + 32 * b)),
                                           _mm512_abs_ps(_mm512_loadu_ps(xb + 32 * b + 16)));
            amax[b] = _mm512_cvtss_f32(hmax_bcast(m));
        }
        const __mmask16 valid = static_cast<__mmask16>((1u << nblk) - 1);
        const __m512 am = _mm512_maskz_load_ps(valid, amax);
        const __m512 d = _mm512_div_ps(am, _mm512_set1_ps(127.0f));
        const __mmask16 nz = _mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_OQ);
        _mm512_store_ps(idv, _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.0f), d));
        _mm256_store_si256(reinterpret_cast<__m256i*>(dh), _mm512_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT));
        for (int b = 0; b < nblk; ++b) {
            uint8_t* blk = out + (b0 + b) * BS;
            const __m512 iv = _mm512_set1_ps(idv[b]);
            const __m512i q0 = round_away_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 32 * b), iv));
            const __m512i q1 = round_away_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 32 * b + 16), iv));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(blk + QOFF), _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(blk + QOFF + 16), _mm512_cvtepi32_epi8(q1));
            std::memcpy(blk, &dh[b], 2);
            if constexpr (Q81) sums[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        }
        if constexpr (Q81) {
            const __m512 sd = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_maskz_load_epi32(valid, sums)), d);
            _mm256_store_si256(reinterpret_cast<__m256i*>(sh), _mm512_cvtps_ph(sd, _MM_FROUND_TO_NEAREST_INT));
            for (int b = 0; b < nblk; ++b) std::memcpy(out + (b0 + b) * BS + offsetof(block_q8_1, s), &sh[b], 2);
        }
    }
}

void q8_0(const float* x, void* y, int64_t k) { q8_rows<false>(x, y, k); }
void q8_1(const float* x, void* y, int64_t k) { q8_rows<true>(x, y, k); }

void q8_K(const float* x, void* y, int64_t k) {
    auto* out = static_cast<uint8_t*>(y);
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t i = 0; i < k / QK_K; ++i) {
        const float* v = x + i * QK_K;
        uint8_t* b = out + i * static_cast<int64_t>(sizeof(block_q8_K));
        __m512 xv[16];
        __m512 m = _mm512_setzero_ps();
        for (int j = 0; j < 16; ++j) {
            xv[j] = _mm512_loadu_ps(v + 16 * j);
            m = _mm512_max_ps(m, _mm512_and_ps(xv[j], absmask));
        }
        m = hmax_bcast(m);
        const float amax = _mm512_cvtss_f32(m);
        if (!(amax > 0.0f)) {  // all zeros (the reference also yields zeros for NaN-free zero input)
            std::memset(b, 0, sizeof(block_q8_K));
            continue;
        }
        // first element whose magnitude equals amax
        float mx = 0.0f;
        for (int j = 0; j < 16; ++j) {
            const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_and_ps(xv[j], absmask), m, _CMP_EQ_OQ);
            if (eq) {
                mx = v[16 * j + __builtin_ctz(eq)];
                break;
            }
        }
        const float iscale = -127.f / mx;
        const __m512 is = _mm512_set1_ps(iscale);
        const __m512i c127 = _mm512_set1_epi32(127);
        const __m512i ones = _mm512_set1_epi8(1);
        // dword permutation undoing packs' 128-bit lane interleave
        const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        __m512i gsum[4];
        for (int c = 0; c < 4; ++c) {  // 64 elements = 4 groups of 16 per step
            __m512i q[4];
            for (int j = 0; j < 4; ++j)
                q[j] = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(xv[4 * c + j], is)), c127);
            const __m512i p01 = _mm512_packs_epi32(q[0], q[1]);
            const __m512i p23 = _mm512_packs_epi32(q[2], q[3]);
            const __m512i bytes = _mm512_permutexvar_epi32(perm, _mm512_packs_epi16(p01, p23));
            _mm512_storeu_si512(b + offsetof(block_q8_K, qs) + 64 * c, bytes);
            gsum[c] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, bytes);  // 128-bit lane l: group 4c+l
        }
        // sum the 4 dwords within each 128-bit lane, for 4 vectors at once
        const __m512i s01 =
            _mm512_add_epi32(_mm512_unpacklo_epi32(gsum[0], gsum[1]), _mm512_unpackhi_epi32(gsum[0], gsum[1]));
        const __m512i s23 =
            _mm512_add_epi32(_mm512_unpacklo_epi32(gsum[2], gsum[3]), _mm512_unpackhi_epi32(gsum[2], gsum[3]));
        const __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
        // lane l of s = [g l, g 4+l, g 8+l, g 12+l]; same permutation restores group order
        const __m512i g = _mm512_permutexvar_epi32(perm, s);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(b + offsetof(block_q8_K, bsums)), _mm512_cvtepi32_epi16(g));
        const float d = 1 / iscale;
        std::memcpy(b + offsetof(block_q8_K, d), &d, 4);
    }
}

}  // namespace

const ActQuantizers quantizers{q8_0, q8_1, q8_K};

// GEMM activation panel from Q8 rows (see kernels.h ActPanel): per 32-element
// chunk and 16 activation rows, a 16 x 8 dword transpose (8 inserts, 16
// unpacks, 8 vpermt2q) yields the 8 panel rows a[k4][c][0..3]; the same
// vectors give the exact per-row sums for dsa through vpdpbusd with ones.
void pack_panel(DType act, int G, int64_t K, int ncp, const void* const* rows, int nrows, int8_t* a, float* da,
                float* dsa) {
    alignas(64) static const uint8_t kZeros[320] = {};
    const bool qk = act == DType::Q8_K;
    const int64_t bsz = qk ? int64_t(sizeof(block_q8_K)) : act == DType::Q8_0 ? int64_t(sizeof(block_q8_0))
                                                                                : int64_t(sizeof(block_q8_1));
    const int64_t qoff = act == DType::Q8_1 ? int64_t(offsetof(block_q8_1, qs)) : int64_t(2);
    const __m512i ones = _mm512_set1_epi8(1);
    const __m512i idx_lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i idx_hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int h = 0; h < ncp / 16; ++h) {
        const uint8_t* base[16];
        int64_t stride[16];
        for (int c = 0; c < 16; ++c) {
            const bool have = 16 * h + c < nrows;
            base[c] = have ? static_cast<const uint8_t*>(rows[16 * h + c]) : kZeros;
            stride[c] = have ? bsz : 0;
        }
        for (int64_t q = 0; q < K / 32; ++q) {
            __m256i Y[16];
            alignas(64) float dcol[16];
            for (int c = 0; c < 16; ++c) {
                if (qk) {
                    const uint8_t* b = base[c] + (q / 8) * stride[c];
                    Y[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 4 + 32 * (q % 8)));
                    std::memcpy(&dcol[c], b, 4);
                } else {
                    const uint8_t* b = base[c] + q * stride[c];
                    Y[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + qoff));
                    uint16_t dh;
                    std::memcpy(&dh, b, 2);
                    dcol[c] = _cvtsh_ss(dh);
                }
            }
            __m512i R[8];
#pragma GCC unroll 8
            for (int c = 0; c < 8; ++c) R[c] = _mm512_inserti64x4(_mm512_castsi256_si512(Y[c]), Y[c + 8], 1);
            __m512i t[8], s8[8];
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) {
                t[2 * i] = _mm512_unpacklo_epi32(R[2 * i], R[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_epi32(R[2 * i], R[2 * i + 1]);
            }
#pragma GCC unroll 2
            for (int i = 0; i < 2; ++i) {  // i = 0: columns 0-3 (8-11), i = 1: columns 4-7 (12-15)
                s8[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
                s8[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
                s8[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
                s8[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
            }
            __m512i slo = _mm512_setzero_si512(), shi = _mm512_setzero_si512();
            int8_t* dst = a + (8 * q * ncp + 16 * h) * 4;
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j) {
                const __m512i zl = _mm512_permutex2var_epi64(s8[j], idx_lo, s8[4 + j]);  // dword j
                const __m512i zh = _mm512_permutex2var_epi64(s8[j], idx_hi, s8[4 + j]);  // dword j + 4
                _mm512_storeu_si512(dst + j * ncp * 4, zl);
                _mm512_storeu_si512(dst + (j + 4) * ncp * 4, zh);
                slo = _mm512_dpbusd_epi32(slo, ones, zl);
                shi = _mm512_dpbusd_epi32(shi, ones, zh);
            }
            const __m512 dv = _mm512_load_ps(dcol);
            if (G == 32) {
                _mm512_storeu_ps(da + q * ncp + 16 * h, dv);
                _mm512_storeu_ps(dsa + q * ncp + 16 * h, _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_add_epi32(slo, shi))));
            } else {
                _mm512_storeu_ps(da + 2 * q * ncp + 16 * h, dv);
                _mm512_storeu_ps(dsa + 2 * q * ncp + 16 * h, _mm512_mul_ps(dv, _mm512_cvtepi32_ps(slo)));
                _mm512_storeu_ps(da + (2 * q + 1) * ncp + 16 * h, dv);
                _mm512_storeu_ps(dsa + (2 * q + 1) * ncp + 16 * h, _mm512_mul_ps(dv, _mm512_cvtepi32_ps(shi)));
            }
        }
    }
}

}  // namespace quern::cpu::avx512
