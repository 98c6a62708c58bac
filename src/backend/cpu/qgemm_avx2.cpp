// AVX2 kernels over unpacked weights (form of kernels.h). Integer products with
// vpmaddubsw (u8 x s8 -> pairs of int16) + vpmaddwd by ones (-> int32 per 4
// products); signed weights (Q8_0 here) use |w| and sign(a, w).
// Overflow: pair sums are <= 2 * 63 * 127 for u <= 63 (all unsigned forms
// here except Q8_0, which is signed: 2 * 127 * 127). In the GEMM tile, pair
// sums of several k-steps are added in int16 before widening when the type's
// largest u allows it (Q4: a whole sub-block, Q5: 4 steps, Q6_K: 2 steps).
//
// GEMV (decode): up to 4 weight rows against one activation row; per 32
//   elements and row: maddubs, maddwd, cvt, one lane-expanded scale (permute of
//   D_s * da_s), FMA. Bandwidth-bound at 2 threads.
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

inline __m256 maskload8(const float* p, int64_t n) {
    if (n >= 8) return _mm256_loadu_ps(p);
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), idx));
}

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Group of 8 sub-blocks. G = 32: chunk c (32 elements) = sub-block c.
// G = 16: chunk c covers sub-blocks 2c, 2c+1.
template <int G>
inline __m256i expand_idx(int c) {
    if constexpr (G == 32)
        return _mm256_set1_epi32(c);
    else
        return _mm256_add_epi32(_mm256_set1_epi32(2 * c), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
}

template <int G, int NRT, bool S>
void gemv_rows(int64_t K, const uint8_t* u, size_t ldu, const float* D, const float* Mn, size_t lds,
               const ActRow& act, float* y) {
    constexpr int CH = 8 * G / 32;  // 32-element chunks per group of 8 sub-blocks
    const __m256i ones16 = _mm256_set1_epi16(1);
    const int64_t nsub = K / G;
    __m256 acc[NRT], accm[NRT];
    #pragma GCC unroll 16
    for (int r = 0; r < NRT; ++r) acc[r] = accm[r] = _mm256_setzero_ps();
    for (int64_t s0 = 0; s0 < nsub; s0 += 8) {
        const int64_t left = nsub - s0;
        const __m256 da = maskload8(act.da + s0, left);
        const __m256 dsa = maskload8(act.dsa + s0, left);
        __m256 P[NRT];
        #pragma GCC unroll 16
        for (int r = 0; r < NRT; ++r) {
            P[r] = _mm256_mul_ps(maskload8(D + r * lds + s0, left), da);
            accm[r] = _mm256_fmadd_ps(maskload8(Mn + r * lds + s0, left), dsa, accm[r]);
        }
        const int64_t e0 = s0 * G;
        const int nch = left >= 8 ? CH : static_cast<int>((K - e0) / 32);
        for (int c = 0; c < nch; ++c) {
            const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act.a + e0 + 32 * c));
            const __m256i idx = expand_idx<G>(c);
            #pragma GCC unroll 16
            for (int r = 0; r < NRT; ++r) {
                const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + r * ldu + e0 + 32 * c));
                const __m256i I = dot4<S>(w, a, ones16);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_permutevar8x32_ps(P[r], idx), acc[r]);
            }
        }
    }
    #pragma GCC unroll 16
    for (int r = 0; r < NRT; ++r) y[r] = hsum(_mm256_add_ps(acc[r], accm[r]));
}

template <int G, bool S>
void gemv_g(int64_t K, int nr, const uint8_t* u, size_t ldu, const float* D, const float* Mn, size_t lds,
            const ActRow& act, float* y) {
    int r = 0;
    for (; r + 4 <= nr; r += 4) gemv_rows<G, 4, S>(K, u + r * ldu, ldu, D + r * lds, Mn + r * lds, lds, act, y + r);
    for (; r < nr; ++r) gemv_rows<G, 1, S>(K, u + r * ldu, ldu, D + r * lds, Mn + r * lds, lds, act, y + r);
}

void gemv(int64_t K, UForm f, int nr, const uint8_t* u, size_t ldu, const float* D, const float* Mn, size_t lds,
          const ActRow& act, float* y) {
    if (f.G == 16)
        gemv_g<16, false>(K, nr, u, ldu, D, Mn, lds, act, y);
    else if (f.signed_u)
        gemv_g<32, true>(K, nr, u, ldu, D, Mn, lds, act, y);
    else
        gemv_g<32, false>(K, nr, u, ldu, D, Mn, lds, act, y);
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
    gemv,
    tile,
    prep_row_generic,
    pack_panel_generic,
    nullptr,
    nullptr,
    [](DType) -> GemvFn { return nullptr; },
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

}  // namespace quern::cpu::avx2
