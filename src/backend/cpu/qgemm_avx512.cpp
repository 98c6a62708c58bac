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

template <int G, int NR>
void tile_g(int64_t K, const uint8_t* u, size_t ldu, const float* D, const float* Mn, size_t lds,
            const ActPanel& act, float* out) {
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
    #pragma GCC unroll 16
    for (int r = 0; r < NR; ++r)
        #pragma GCC unroll 16
        for (int v = 0; v < kNCV; ++v) _mm512_storeu_ps(out + r * kNCP + 16 * v, f[r][v]);
}

template <int G>
void tile_dispatch(int64_t K, int nr, const uint8_t* u, size_t ldu, const float* D, const float* Mn, size_t lds,
                   const ActPanel& act, float* out) {
    switch (nr) {
        case 4: tile_g<G, 4>(K, u, ldu, D, Mn, lds, act, out); break;
        case 3: tile_g<G, 3>(K, u, ldu, D, Mn, lds, act, out); break;
        case 2: tile_g<G, 2>(K, u, ldu, D, Mn, lds, act, out); break;
        default: tile_g<G, 1>(K, u, ldu, D, Mn, lds, act, out); break;
    }
}

void tile(int64_t K, UForm f, int nr, const uint8_t* u, size_t ldu, const float* D, const float* Mn, size_t lds,
          const ActPanel& act, float* out) {
    if (f.G == 32)
        tile_dispatch<32>(K, nr, u, ldu, D, Mn, lds, act, out);
    else
        tile_dispatch<16>(K, nr, u, ldu, D, Mn, lds, act, out);
}

}  // namespace

const QKernels qkernels{
    kNR,
    kNCP,
    false,
    gemv,
    tile,
    prep_row_generic,
    pack_panel_generic,
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
