// AVX-512 kernels for float weights (F32, F16, BF16, and the weight-only
// F8_E4M3_B32 / NVFP4 decoded on load: kernels.h) x float activations.
// y[c*ldy + r] = sum_k W[r][k] * x[c][k], fp32 accumulation.
//
// Register tile: R = 4 weight rows x C <= 4 activation rows, 16 zmm
// accumulators along K (16 elements per step; weights converted to fp32 on
// load: vcvtph2ps for F16, a 16-bit shift for BF16, both exact), reduced
// horizontally at the end. K tails use masked loads.
// Blocking: activation rows in blocks of 64 (L2), the caller's weight rows
// (a chunk of a few tiles) stay in L1/L2 across the column block.
// Decode (n <= 3): one weight row at a time (a single sequential stream per
// thread), 4 accumulators per activation row; bandwidth-bound. Prefill is
// FMA-bound.
// Alignment: none (unaligned loads).
// GCC 12 reports false -Wuninitialized positives inside the AVX-512 intrinsics headers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstddef>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "quant/blocks.h"
#include "quant/fp8.h"

namespace quern::cpu::avx512 {

namespace {

struct LoadF32 {
    static __m512 load(const uint8_t* p, int64_t k) { return _mm512_loadu_ps(reinterpret_cast<const float*>(p) + k); }
    static __m512 loadm(const uint8_t* p, int64_t k, __mmask16 m) {
        return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(p) + k);
    }
};
struct LoadF16 {
    static __m512 load(const uint8_t* p, int64_t k) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * k)));
    }
    static __m512 loadm(const uint8_t* p, int64_t k, __mmask16 m) {
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p + 2 * k));
    }
};
struct LoadBF16 {
    static __m512 cvt(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
    static __m512 load(const uint8_t* p, int64_t k) {
        return cvt(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * k)));
    }
    static __m512 loadm(const uint8_t* p, int64_t k, __mmask16 m) { return cvt(_mm256_maskz_loadu_epi16(m, p + 2 * k)); }
};

// Weight-only FP8 (F8_E4M3_B32): the 16 weights at element k (k % 16 == 0,
// inside one 32-element block). An E4M3 byte sign-extended to 16 bits and
// shifted left by 7 holds the sign in bits 15 and 14 and the exponent and
// mantissa in bits 13..7; clearing bit 14 leaves an F16 whose value is 2^-8
// times the E4M3 value (normal and subnormal alike), which vcvtph2ps widens
// exactly; d * 256 (exact) restores the scale, so each weight is the single
// rounding of e4m3(q) * d, as in the reference. NaN codes (refused at load)
// would decode as finite values.
struct LoadF8 {
    static __m512 load(const uint8_t* p, int64_t k) {
        const uint8_t* b = p + (k / QK_F8) * static_cast<int64_t>(sizeof(block_f8_b32));
        float d;
        std::memcpy(&d, b, 4);
        const __m256i c = _mm256_cvtepi8_epi16(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + offsetof(block_f8_b32, qs) + k % QK_F8)));
        const __m256i h = _mm256_and_si256(_mm256_slli_epi16(c, 7), _mm256_set1_epi16(static_cast<short>(0xBF80)));
        return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(d * 256.0f));
    }
    // K is a multiple of the block size: the masked tail never runs.
    static __m512 loadm(const uint8_t* p, int64_t k, __mmask16 m) { return _mm512_maskz_mov_ps(m, load(p, k)); }
};

// Weight-only NVFP4: the 16 weights of group (k % 64) / 16 of block k / 64
// (k % 16 == 0). The 8 code bytes and the same bytes shifted right by 4,
// interleaved, give one byte per element whose low nibble is its E2M1 code
// (element order: even elements in low nibbles); vpermps reads only the low 4
// bits of each index, so the high nibbles need no masking. The table holds
// the 16 E2M1 values; the group scale is f32(e4m3(sc) * d), as in the reference.
struct LoadNvfp4 {
    static __m512 load(const uint8_t* p, int64_t k) {
        const uint8_t* b = p + (k / QK_NVFP4) * static_cast<int64_t>(sizeof(block_nvfp4));
        const int g = static_cast<int>(k % QK_NVFP4) / NVFP4_GROUP;
        float d;
        std::memcpy(&d, b, 4);
        const float s = kFp8E4M3Values[b[offsetof(block_nvfp4, sc) + g]] * d;
        const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + offsetof(block_nvfp4, qs) + 8 * g));
        const __m128i codes = _mm_unpacklo_epi8(v, _mm_srli_epi16(v, 4));
        const __m512 lut = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                                          -2.0f, -3.0f, -4.0f, -6.0f);
        return _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(codes), lut), _mm512_set1_ps(s));
    }
    static __m512 loadm(const uint8_t* p, int64_t k, __mmask16 m) { return _mm512_maskz_mov_ps(m, load(p, k)); }
};

template <class L, int R, int C>
void tile(int64_t K, const uint8_t* w, size_t ldw, const float* x, size_t ldx, float* y, size_t ldy) {
    __m512 acc[R][C];
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
        #pragma GCC unroll 16
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 wv[R];
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) wv[r] = L::load(w + r * ldw, k);
        #pragma GCC unroll 16
        for (int c = 0; c < C; ++c) {
            const __m512 xv = _mm512_loadu_ps(x + c * ldx + k);
            #pragma GCC unroll 16
            for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(wv[r], xv, acc[r][c]);
        }
    }
    if (k < K) {
        const __mmask16 m = static_cast<__mmask16>((1u << (K - k)) - 1);
        __m512 wv[R];
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) wv[r] = L::loadm(w + r * ldw, k, m);
        #pragma GCC unroll 16
        for (int c = 0; c < C; ++c) {
            const __m512 xv = _mm512_maskz_loadu_ps(m, x + c * ldx + k);
            #pragma GCC unroll 16
            for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(wv[r], xv, acc[r][c]);
        }
    }
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
        #pragma GCC unroll 16
        for (int c = 0; c < C; ++c) y[c * ldy + r] = _mm512_reduce_add_ps(acc[r][c]);
}

template <class L, int R>
void tile_rows(int64_t K, const uint8_t* w, size_t ldw, const float* x, size_t ldx, int nc, float* y, size_t ldy) {
    int c = 0;
    for (; c + 4 <= nc; c += 4) tile<L, R, 4>(K, w, ldw, x + c * ldx, ldx, y + c * ldy, ldy);
    switch (nc - c) {
        case 3: tile<L, R, 3>(K, w, ldw, x + c * ldx, ldx, y + c * ldy, ldy); break;
        case 2: tile<L, R, 2>(K, w, ldw, x + c * ldx, ldx, y + c * ldy, ldy); break;
        case 1: tile<L, R, 1>(K, w, ldw, x + c * ldx, ldx, y + c * ldy, ldy); break;
        default: break;
    }
}

// Decode: one weight row against C <= 3 activation rows, K unrolled 4x so that
// 4*C independent FMA chains hide the latency; rows one after the other keep
// the weights a single sequential stream.
template <class L, int C>
void rowdot(int64_t K, const uint8_t* w, const float* x, size_t ldx, float* y, size_t ldy) {
    __m512 acc[4][C];
    #pragma GCC unroll 16
    for (int u = 0; u < 4; ++u)
        #pragma GCC unroll 16
        for (int c = 0; c < C; ++c) acc[u][c] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= K; k += 64)
        #pragma GCC unroll 16
        for (int u = 0; u < 4; ++u) {
            const __m512 wv = L::load(w, k + 16 * u);
            #pragma GCC unroll 16
            for (int c = 0; c < C; ++c)
                acc[u][c] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + c * ldx + k + 16 * u), acc[u][c]);
        }
    for (; k < K; k += 16) {
        const __mmask16 m = K - k >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (K - k)) - 1);
        const __m512 wv = L::loadm(w, k, m);
        #pragma GCC unroll 16
        for (int c = 0; c < C; ++c) acc[0][c] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x + c * ldx + k), acc[0][c]);
    }
    #pragma GCC unroll 16
    for (int c = 0; c < C; ++c)
        y[c * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0][c], acc[1][c]), _mm512_add_ps(acc[2][c], acc[3][c])));
}

// Rowdot: take the decode kernel (rowdot) for nc <= 3; without it every
// output element has the same arithmetic whatever nr and nc (the tiles).
template <class L, bool Rowdot>
void fgemm(int64_t K, const void* wv, size_t ldw, int nr, const float* x, size_t ldx, int nc, float* y, size_t ldy) {
    const auto* w = static_cast<const uint8_t*>(wv);
    if (Rowdot && nc <= 3) {
        for (int r = 0; r < nr; ++r) {
            if (nc == 1) rowdot<L, 1>(K, w + r * ldw, x, ldx, y + r, ldy);
            else if (nc == 2) rowdot<L, 2>(K, w + r * ldw, x, ldx, y + r, ldy);
            else if (nc == 3) rowdot<L, 3>(K, w + r * ldw, x, ldx, y + r, ldy);
        }
        return;
    }
    constexpr int kColBlock = 64;
    for (int c0 = 0; c0 < nc; c0 += kColBlock) {
        const int ncb = nc - c0 < kColBlock ? nc - c0 : kColBlock;
        const float* xb = x + c0 * ldx;
        float* yb = y + c0 * ldy;
        int r = 0;
        for (; r + 4 <= nr; r += 4) tile_rows<L, 4>(K, w + r * ldw, ldw, xb, ldx, ncb, yb + r, ldy);
        for (; r < nr; ++r) tile_rows<L, 1>(K, w + r * ldw, ldw, xb, ldx, ncb, yb + r, ldy);
    }
}

}  // namespace

const FKernels fkernels{4,
                        4,
                        fgemm<LoadF32, true>,
                        fgemm<LoadF16, true>,
                        fgemm<LoadBF16, true>,
                        fgemm<LoadF32, false>,
                        fgemm<LoadF16, false>,
                        fgemm<LoadBF16, false>,
                        fgemm<LoadF8, true>,
                        fgemm<LoadNvfp4, true>,
                        fgemm<LoadF8, false>,
                        fgemm<LoadNvfp4, false>};

}  // namespace quern::cpu::avx512
