// AVX2 GEMM tile over unpacked weights (form of kernels.h). Integer products
// with vpmaddubsw (u8 x s8 -> pairs of int16) + vpmaddwd by ones (-> int32 per
// 4 products); signed weights (Q8_0 here) use |w| and sign(a, w).
// qdecode_avx2.cpp computes the same floats with weight rows across the lanes
// (few activation rows); single-sequence decode uses the fused GEMV kernels of
// gemv_avx2.cpp, which round differently.
// Overflow: pair sums are <= 2 * 63 * 127 for u <= 63 (all unsigned forms
// here except Q8_0, which is signed: 2 * 127 * 127). In the GEMM tile, pair
// sums of several k-steps are added in int16 before widening when the type's
// largest u allows it (Q4: a whole sub-block, Q5: 4 steps, Q6_K: 2 steps).
//
// GEMM tile (prefill): NR = 2 weight rows x NCP = 16 activation rows (two
//   8-lane vectors), activations packed a[K/4][16][4]; per 4-element step two
//   activation loads, one 4-byte weight broadcast per row, 4 x (maddubs,
//   maddwd, add). Folded into float accumulators once per sub-block.
//   Compute-bound.
// Alignment: none required.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/kernels.h"

namespace quern::cpu::avx2 {

namespace {

template <bool S>
inline __m256i dot4(__m256i u, __m256i a, __m256i ones16) {
    if constexpr (S)
        return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(u, u), _mm256_sign_epi8(a, u)), ones16);
    else
        return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), ones16);
}

constexpr int kNR = 2;
constexpr int kNCV = 2;
constexpr int kNCP = 8 * kNCV;

inline int32_t rd32(const uint8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// F: k-steps whose vpmaddubsw pair sums are added in int16 before widening
// with vpmaddwd (F * 2 * umax * 127 <= 32767); F = 1 widens every step.
template <int G, int NR, bool S, int F>
void tile_g(int64_t K, const uint8_t* u, size_t ldu, const float* D, const float* Mn, size_t lds,
            const ActPanel& act, float* out) {
    static_assert((G / 4) % F == 0);
    const __m256i ones16 = _mm256_set1_epi16(1);
    const int64_t nsub = K / G;
    __m256 f[NR][kNCV];
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 16
        for (int v = 0; v < kNCV; ++v) f[r][v] = _mm256_setzero_ps();
    const int8_t* ap = act.a;
    for (int64_t s = 0; s < nsub; ++s) {
        __m256i acc[NR][kNCV];
        if constexpr (F != G / 4) {
#pragma GCC unroll 16
            for (int r = 0; r < NR; ++r)
#pragma GCC unroll 16
                for (int v = 0; v < kNCV; ++v) acc[r][v] = _mm256_setzero_si256();
        }
        const uint8_t* us = u + s * G;
#pragma GCC unroll 8
        for (int k0 = 0; k0 < G / 4; k0 += F) {
            __m256i h[NR][kNCV];  // int16 pair sums over F steps
#pragma GCC unroll 8
            for (int kk = k0; kk < k0 + F; ++kk) {
                __m256i A[kNCV];
#pragma GCC unroll 16
                for (int v = 0; v < kNCV; ++v)
                    A[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ap + (kk * kNCP + 8 * v) * 4));
#pragma GCC unroll 16
                for (int r = 0; r < NR; ++r) {
                    __m256i B = _mm256_set1_epi32(rd32(us + r * ldu + 4 * kk));
                    __m256i Bs = B;
                    if constexpr (S) B = _mm256_sign_epi8(B, B);
#pragma GCC unroll 16
                    for (int v = 0; v < kNCV; ++v) {
                        const __m256i p = _mm256_maddubs_epi16(B, S ? _mm256_sign_epi8(A[v], Bs) : A[v]);
                        h[r][v] = kk == k0 ? p : _mm256_add_epi16(h[r][v], p);
                    }
                }
            }
#pragma GCC unroll 16
            for (int r = 0; r < NR; ++r)
#pragma GCC unroll 16
                for (int v = 0; v < kNCV; ++v)
                    acc[r][v] = F == G / 4 ? _mm256_madd_epi16(h[r][v], ones16)  // one span: no int32 sum kept
                                           : _mm256_add_epi32(acc[r][v], _mm256_madd_epi16(h[r][v], ones16));
        }
        ap += G * kNCP;
#pragma GCC unroll 16
        for (int v = 0; v < kNCV; ++v) {
            const __m256 da = _mm256_loadu_ps(act.da + s * kNCP + 8 * v);
            const __m256 dsa = _mm256_loadu_ps(act.dsa + s * kNCP + 8 * v);
#pragma GCC unroll 16
            for (int r = 0; r < NR; ++r) {
                const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][v]), da);
                f[r][v] = _mm256_fmadd_ps(t, _mm256_set1_ps(D[r * lds + s]), f[r][v]);
                f[r][v] = _mm256_fmadd_ps(dsa, _mm256_set1_ps(Mn[r * lds + s]), f[r][v]);
            }
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 16
        for (int v = 0; v < kNCV; ++v) _mm256_storeu_ps(out + r * kNCP + 8 * v, f[r][v]);
}

template <int G, bool S, int F>
void tile_dispatch(int64_t K, int nr, const uint8_t* u, size_t ldu, const float* D, const float* Mn, size_t lds,
                   const ActPanel& act, float* out) {
    if (nr >= 2)
        tile_g<G, 2, S, F>(K, u, ldu, D, Mn, lds, act, out);
    else
        tile_g<G, 1, S, F>(K, u, ldu, D, Mn, lds, act, out);
}

void tile(int64_t K, UForm f, int nr, int nc, const uint8_t* u, size_t ldu, const float* D, const float* Mn,
          size_t lds, const ActPanel& act, float* y, size_t ldy) {
    alignas(32) float out[kNR * kNCP];
    // int16 accumulation span from the largest unsigned weight value
    const int span = f.signed_u ? 1 : 32767 / (2 * 127 * (f.umax > 0 ? f.umax : 255));
    if (f.signed_u)
        tile_dispatch<32, true, 1>(K, nr, u, ldu, D, Mn, lds, act, out);
    else if (f.G == 16) {
        if (span >= 4)
            tile_dispatch<16, false, 4>(K, nr, u, ldu, D, Mn, lds, act, out);
        else if (span >= 2)
            tile_dispatch<16, false, 2>(K, nr, u, ldu, D, Mn, lds, act, out);
        else
            tile_dispatch<16, false, 1>(K, nr, u, ldu, D, Mn, lds, act, out);
    } else {
        if (span >= 8)
            tile_dispatch<32, false, 8>(K, nr, u, ldu, D, Mn, lds, act, out);
        else if (span >= 4)
            tile_dispatch<32, false, 4>(K, nr, u, ldu, D, Mn, lds, act, out);
        else if (span >= 2)
            tile_dispatch<32, false, 2>(K, nr, u, ldu, D, Mn, lds, act, out);
        else
            tile_dispatch<32, false, 1>(K, nr, u, ldu, D, Mn, lds, act, out);
    }
    for (int c = 0; c < nc; ++c)
        for (int r = 0; r < nr; ++r) y[c * ldy + r] = out[r * kNCP + c];
}

}  // namespace

const QKernels qkernels{
    kNR,
    kNCP,
    true,
    tile,
    pack_panel_generic,
    8,
    16,
    decode,
    decode_work_bytes,
    gemv_scratch_generic,
    gemv_prep_generic,
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
    unpack_mxfp4,
};

}  // namespace quern::cpu::avx2
