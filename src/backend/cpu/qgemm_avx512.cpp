// AVX-512 VNNI kernels over unpacked weights (see kernels.h for the form
// w_k = D_s * u_k + Mn_s). Integer products with vpdpbusd (u8 weights x s8
// activations, 4 products per 32-bit lane), float scaling once per sub-block.
//
// GEMV (decode, n small): up to 4 weight rows against one activation row in
//   natural order. Per 64 elements and row: one vpdpbusd, one cvt, one permute
//   (lane-expanded D_s * da_s), one FMA; the Mn_s * dsa_s terms are a short
//   separate dot over sub-blocks. Inputs in L1 (freshly unpacked); bound by the
//   unpacking + weight streaming, i.e. memory bandwidth at 2 threads.
// GEMM tile (prefill): NR = 4 weight rows x NCP = 32 activation rows (two
//   16-lane vectors). Activations are packed a[K/4][32][4]; each step loads two
//   64-byte activation vectors, broadcasts one 4-byte weight group per row and
//   issues 8 vpdpbusd into 8 int32 accumulators; after each sub-block the int
//   sums are converted and folded into 8 float accumulators with
//   D_s * da_s and Mn_s * dsa_s. Compute-bound (vpdpbusd throughput).
// Alignment: none required (unaligned loads); u rows must be readable for K
// bytes, D/Mn for K/G floats.
// GCC 12 reports false -Wuninitialized positives inside the AVX-512 intrinsics headers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "backend/cpu/kernels.h"

namespace quern::cpu::avx512 {

namespace {

inline __mmask64 tail_mask64(int64_t n) { return n >= 64 ? ~__mmask64(0) : ((__mmask64(1) << n) - 1); }
inline __mmask16 tail_mask16(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

// Lane-expansion indices: for G = 32 a 64-element chunk c (0..7) of a group of
// 16 sub-blocks covers sub-blocks 2c, 2c+1 (8 lanes each); for G = 16 chunk c
// (0..3) covers 4c..4c+3 (4 lanes each).
template <int G>
inline __m512i expand_idx(int c) {
    if constexpr (G == 32) {
        return _mm512_add_epi32(_mm512_set1_epi32(2 * c),
                                _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    } else {
        return _mm512_add_epi32(_mm512_set1_epi32(4 * c),
                                _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
    }
}

template <int G, int NRT>
void gemv_rows(int64_t K, const uint8_t* u, size_t ldu, const float* D, const float* Mn, size_t lds,
               const ActRow& act, float* y) {
    constexpr int CH = 16 * G / 64;  // 64-element chunks per group of 16 sub-blocks
    const int64_t nsub = K / G;
    __m512 acc[NRT], accm[NRT];
    #pragma GCC unroll 16
    for (int r = 0; r < NRT; ++r) acc[r] = accm[r] = _mm512_setzero_ps();
    for (int64_t s0 = 0; s0 < nsub; s0 += 16) {
        const __mmask16 ms = tail_mask16(nsub - s0);
        const __m512 da = _mm512_maskz_loadu_ps(ms, act.da + s0);
        const __m512 dsa = _mm512_maskz_loadu_ps(ms, act.dsa + s0);
        __m512 P[NRT];
        #pragma GCC unroll 16
        for (int r = 0; r < NRT; ++r) {
            P[r] = _mm512_mul_ps(_mm512_maskz_loadu_ps(ms, D + r * lds + s0), da);
            accm[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(ms, Mn + r * lds + s0), dsa, accm[r]);
        }
        const int64_t e0 = s0 * G;
        if (nsub - s0 >= 16) {
            for (int c = 0; c < CH; ++c) {
                const __m512i a = _mm512_loadu_si512(act.a + e0 + 64 * c);
                const __m512i idx = expand_idx<G>(c);
                #pragma GCC unroll 16
                for (int r = 0; r < NRT; ++r) {
                    const __m512i w = _mm512_loadu_si512(u + r * ldu + e0 + 64 * c);
                    const __m512i I = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, a);
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_permutexvar_ps(idx, P[r]), acc[r]);
                }
            }
        } else {
            const int64_t left = K - e0;
            for (int c = 0; 64 * c < left; ++c) {
                const __mmask64 m = tail_mask64(left - 64 * c);
                const __m512i a = _mm512_maskz_loadu_epi8(m, act.a + e0 + 64 * c);
                const __m512i idx = expand_idx<G>(c);
                #pragma GCC unroll 16
                for (int r = 0; r < NRT; ++r) {
                    const __m512i w = _mm512_maskz_loadu_epi8(m, u + r * ldu + e0 + 64 * c);
                    const __m512i I = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, a);
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_permutexvar_ps(idx, P[r]), acc[r]);
                }
            }
        }
    }
    #pragma GCC unroll 16
    for (int r = 0; r < NRT; ++r) y[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], accm[r]));
}

template <int G>
void gemv_g(int64_t K, int nr, const uint8_t* u, size_t ldu, const float* D, const float* Mn, size_t lds,
            const ActRow& act, float* y) {
    int r = 0;
    for (; r + 4 <= nr; r += 4) gemv_rows<G, 4>(K, u + r * ldu, ldu, D + r * lds, Mn + r * lds, lds, act, y + r);
    switch (nr - r) {
        case 3: gemv_rows<G, 3>(K, u + r * ldu, ldu, D + r * lds, Mn + r * lds, lds, act, y + r); break;
        case 2: gemv_rows<G, 2>(K, u + r * ldu, ldu, D + r * lds, Mn + r * lds, lds, act, y + r); break;
        case 1: gemv_rows<G, 1>(K, u + r * ldu, ldu, D + r * lds, Mn + r * lds, lds, act, y + r); break;
        default: break;
    }
}

void gemv(int64_t K, UForm f, int nr, const uint8_t* u, size_t ldu, const float* D, const float* Mn, size_t lds,
          const ActRow& act, float* y) {
    if (f.G == 32)
        gemv_g<32>(K, nr, u, ldu, D, Mn, lds, act, y);
    else
        gemv_g<16>(K, nr, u, ldu, D, Mn, lds, act, y);
}

constexpr int kNR = 4;
constexpr int kNCV = 2;
constexpr int kNCP = 16 * kNCV;

inline int32_t rd32(const uint8_t* p) {
    int32_t v;
    __builtin_memcpy(&v, p, 4);
    return v;
}

// Writes rows r < nr of a 4-row tile (f[r][v]: 16 columns per vector) to
// y[c * ldy + r], c < nc: a 4x4 transpose per 128-bit lane, then one masked
// 4-float store per column.
template <int L>
inline void store_lane(const __m512 u[4], int c0, int nc, __mmask8 rm, float* y, size_t ldy) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
        const int c = c0 + 4 * L + j;
        if (c < nc) _mm_mask_storeu_ps(y + c * ldy, rm, _mm512_extractf32x4_ps(u[j], L));
    }
}

template <int NR>
inline void store_tile(const __m512 (&f)[NR][kNCV], int nr, int nc, float* y, size_t ldy) {
    const __mmask8 rm = static_cast<__mmask8>((1u << nr) - 1);
#pragma GCC unroll 4
    for (int v = 0; v < kNCV; ++v) {
        const __m512 z = _mm512_setzero_ps();
        const __m512 a0 = f[0][v];
        const __m512 a1 = NR > 1 ? f[NR > 1 ? 1 : 0][v] : z;
        const __m512 a2 = NR > 2 ? f[NR > 2 ? 2 : 0][v] : z;
        const __m512 a3 = NR > 3 ? f[NR > 3 ? 3 : 0][v] : z;
        const __m512 t0 = _mm512_unpacklo_ps(a0, a1), t1 = _mm512_unpackhi_ps(a0, a1);
        const __m512 t2 = _mm512_unpacklo_ps(a2, a3), t3 = _mm512_unpackhi_ps(a2, a3);
        const __m512 u[4] = {_mm512_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2)),
                             _mm512_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2))};  // u[j] lane L: column 4L + j
        store_lane<0>(u, 16 * v, nc, rm, y, ldy);
        store_lane<1>(u, 16 * v, nc, rm, y, ldy);
        store_lane<2>(u, 16 * v, nc, rm, y, ldy);
        store_lane<3>(u, 16 * v, nc, rm, y, ldy);
    }
}

template <int G, int NR>
void tile_g(int64_t K, int nr, int nc, const uint8_t* u, size_t ldu, const float* D, const float* Mn, size_t lds,
            const ActPanel& act, float* y, size_t ldy) {
    static_assert(NR <= 4);
    const int64_t nsub = K / G;
    __m512 f[NR][kNCV];
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 16
        for (int v = 0; v < kNCV; ++v) f[r][v] = _mm512_setzero_ps();
    const int8_t* ap = act.a;
    for (int64_t s = 0; s < nsub; ++s) {
        __m512i acc[NR][kNCV];
#pragma GCC unroll 16
        for (int r = 0; r < NR; ++r)
#pragma GCC unroll 16
            for (int v = 0; v < kNCV; ++v) acc[r][v] = _mm512_setzero_si512();
        const uint8_t* us = u + s * G;
#pragma GCC unroll 8
        for (int kk = 0; kk < G / 4; ++kk) {
            __m512i A[kNCV];
#pragma GCC unroll 16
            for (int v = 0; v < kNCV; ++v) A[v] = _mm512_loadu_si512(ap + (kk * kNCP + 16 * v) * 4);
#pragma GCC unroll 16
            for (int r = 0; r < NR; ++r) {
                const __m512i B = _mm512_set1_epi32(rd32(us + r * ldu + 4 * kk));
#pragma GCC unroll 16
                for (int v = 0; v < kNCV; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], B, A[v]);
            }
        }
        ap += G * kNCP;
#pragma GCC unroll 16
        for (int v = 0; v < kNCV; ++v) {
            const __m512 da = _mm512_loadu_ps(act.da + s * kNCP + 16 * v);
            const __m512 dsa = _mm512_loadu_ps(act.dsa + s * kNCP + 16 * v);
#pragma GCC unroll 16
            for (int r = 0; r < NR; ++r) {
                const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][v]), da);
                f[r][v] = _mm512_fmadd_ps(t, _mm512_set1_ps(D[r * lds + s]), f[r][v]);
                f[r][v] = _mm512_fmadd_ps(dsa, _mm512_set1_ps(Mn[r * lds + s]), f[r][v]);
            }
        }
    }
    store_tile<NR>(f, nr, nc, y, ldy);
}

template <int G>
void tile_dispatch(int64_t K, int nr, int nc, const uint8_t* u, size_t ldu, const float* D, const float* Mn,
                   size_t lds, const ActPanel& act, float* y, size_t ldy) {
    switch (nr) {
        case 4: tile_g<G, 4>(K, nr, nc, u, ldu, D, Mn, lds, act, y, ldy); break;
        case 3: tile_g<G, 3>(K, nr, nc, u, ldu, D, Mn, lds, act, y, ldy); break;
        case 2: tile_g<G, 2>(K, nr, nc, u, ldu, D, Mn, lds, act, y, ldy); break;
        default: tile_g<G, 1>(K, nr, nc, u, ldu, D, Mn, lds, act, y, ldy); break;
    }
}

void tile(int64_t K, UForm f, int nr, int nc, const uint8_t* u, size_t ldu, const float* D, const float* Mn,
          size_t lds, const ActPanel& act, float* y, size_t ldy) {
    if (f.G == 32)
        tile_dispatch<32>(K, nr, nc, u, ldu, D, Mn, lds, act, y, ldy);
    else
        tile_dispatch<16>(K, nr, nc, u, ldu, D, Mn, lds, act, y, ldy);
}

}  // namespace

const QKernels qkernels{
    kNR,
    kNCP,
    false,
    gemv,
    tile,
    prep_row_generic,
    pack_panel,
    gemv_scratch,
    gemv_prep,
    gemv_for,
    unpack_q4_0,
    unpack_q4_1,
    unpack_q5_0,
    unpack_q5_1,
    unpack_q8_0,
    unpack_q2_K,
    unpack_q3_K,
    unpack_q4_K,
    unpack_q5_K,
    unpack_q6_K,
};

}  // namespace quern::cpu::avx512
