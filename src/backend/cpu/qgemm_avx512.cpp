// AVX-512 VNNI GEMM tile over unpacked weights (see kernels.h for the form
// w_k = D_s * u_k + Mn_s). Integer products with vpdpbusd (u8 weights x s8
// activations, 4 products per 32-bit lane), float scaling once per sub-block.
// qdecode_avx512.cpp computes the same floats with weight rows across the
// lanes (few activation rows); single-sequence decode uses the fused GEMV
// kernels of gemv_avx512.cpp, which round differently.
//
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
        if (c < nc) {
            if (rm == 0xF)
                _mm_storeu_ps(y + c * ldy, _mm512_extractf32x4_ps(u[j], L));
            else
                _mm_mask_storeu_ps(y + c * ldy, rm, _mm512_extractf32x4_ps(u[j], L));
        }
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
    tile,
    pack_panel,
    16,
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

}  // namespace quern::cpu::avx512
