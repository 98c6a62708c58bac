// AVX2 kernels for float weights (F32, F16, BF16, and the weight-only
// F8_E4M3_B32 / NVFP4 decoded on load: kernels.h) x float activations.
// y[c*ldy + r] = sum_k W[r][k] * x[c][k], fp32 accumulation.
// Register tile: R = 4 weight rows x C <= 2 activation rows (8 ymm
// accumulators, 8 elements per step, weights converted exactly on load), a
// scalar loop for the K % 8 tail, horizontal sums at the end. Activation rows
// in blocks of 64 (L2). Decode (n <= 3) goes one weight row at a time with 4
// accumulators per activation row (one sequential stream per thread) and is
// bandwidth-bound; prefill is FMA-bound.
// Alignment: none.
#include <immintrin.h>

#include <cstddef>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "quant/blocks.h"
#include "quant/fp8.h"

namespace quern::cpu::avx2 {

namespace {

struct LoadF32 {
    static __m256 load(const uint8_t* p, int64_t k) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p) + k); }
    static float one(const uint8_t* p, int64_t k) {
        float f;
        std::memcpy(&f, p + 4 * k, 4);
        return f;
    }
};
struct LoadF16 {
    static __m256 load(const uint8_t* p, int64_t k) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * k)));
    }
    static float one(const uint8_t* p, int64_t k) {
        uint16_t h;
        std::memcpy(&h, p + 2 * k, 2);
        return _cvtsh_ss(h);
    }
};
struct LoadBF16 {
    static __m256 load(const uint8_t* p, int64_t k) {
        const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * k)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    static float one(const uint8_t* p, int64_t k) {
        uint16_t h;
        std::memcpy(&h, p + 2 * k, 2);
        const uint32_t u = static_cast<uint32_t>(h) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
};

// Weight-only FP8 (F8_E4M3_B32): the 8 weights at element k (k % 8 == 0),
// decoded as the AVX-512 loader does (fgemm_avx512.cpp): E4M3 bits moved into
// an F16 2^-8 times their value, widened exactly, times d * 256.
struct LoadF8 {
    static __m256 load(const uint8_t* p, int64_t k) {
        const uint8_t* b = p + (k / QK_F8) * static_cast<int64_t>(sizeof(block_f8_b32));
        float d;
        std::memcpy(&d, b, 4);
        const __m128i c = _mm_cvtepi8_epi16(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + offsetof(block_f8_b32, qs) + k % QK_F8)));
        const __m128i h = _mm_and_si128(_mm_slli_epi16(c, 7), _mm_set1_epi16(static_cast<short>(0xBF80)));
        return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(d * 256.0f));
    }
    static float one(const uint8_t* p, int64_t k) {
        const uint8_t* b = p + (k / QK_F8) * static_cast<int64_t>(sizeof(block_f8_b32));
        float d;
        std::memcpy(&d, b, 4);
        return kFp8E4M3Values[b[offsetof(block_f8_b32, qs) + k % QK_F8]] * d;
    }
};

// Weight-only NVFP4: the 8 weights at element k (k % 8 == 0), half of one
// 16-element group. Code bytes interleaved with themselves shifted right by 4
// give one byte per element with its E2M1 code in the low nibble; vpermps
// looks up the magnitude (low 3 bits), bit 3 shifted to bit 31 is the sign.
struct LoadNvfp4 {
    static float scale(const uint8_t* b, int64_t k) {
        float d;
        std::memcpy(&d, b, 4);
        return kFp8E4M3Values[b[offsetof(block_nvfp4, sc) + (k % QK_NVFP4) / NVFP4_GROUP]] * d;
    }
    static __m256 load(const uint8_t* p, int64_t k) {
        const uint8_t* b = p + (k / QK_NVFP4) * static_cast<int64_t>(sizeof(block_nvfp4));
        uint32_t q;
        std::memcpy(&q, b + offsetof(block_nvfp4, qs) + (k % QK_NVFP4) / 2, 4);
        const __m128i v = _mm_cvtsi32_si128(static_cast<int>(q));
        const __m256i idx = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(v, _mm_srli_epi16(v, 4)));
        const __m256 mag =
            _mm256_permutevar8x32_ps(_mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f), idx);
        const __m256 sign = _mm256_castsi256_ps(
            _mm256_and_si256(_mm256_slli_epi32(idx, 28), _mm256_set1_epi32(static_cast<int>(0x80000000u))));
        return _mm256_mul_ps(_mm256_or_ps(mag, sign), _mm256_set1_ps(scale(b, k)));
    }
    static float one(const uint8_t* p, int64_t k) {
        const uint8_t* b = p + (k / QK_NVFP4) * static_cast<int64_t>(sizeof(block_nvfp4));
        const uint8_t q = b[offsetof(block_nvfp4, qs) + (k % QK_NVFP4) / 2];
        return fp4_e2m1_to_float(k % 2 ? q >> 4 : q & 0xF) * scale(b, k);
    }
};

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

template <class L, int R, int C>
void tile(int64_t K, const uint8_t* w, size_t ldw, const float* x, size_t ldx, float* y, size_t ldy) {
    __m256 acc[R][C];
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
        #pragma GCC unroll 16
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 wv[R];
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) wv[r] = L::load(w + r * ldw, k);
        #pragma GCC unroll 16
        for (int c = 0; c < C; ++c) {
            const __m256 xv = _mm256_loadu_ps(x + c * ldx + k);
            #pragma GCC unroll 16
            for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(wv[r], xv, acc[r][c]);
        }
    }
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
        #pragma GCC unroll 16
        for (int c = 0; c < C; ++c) {
            float s = hsum(acc[r][c]);
            for (int64_t kt = k; kt < K; ++kt) s += L::one(w + r * ldw, kt) * x[c * ldx + kt];
            y[c * ldy + r] = s;
        }
}

template <class L, int R>
void tile_rows(int64_t K, const uint8_t* w, size_t ldw, const float* x, size_t ldx, int nc, float* y, size_t ldy) {
    int c = 0;
    for (; c + 2 <= nc; c += 2) tile<L, R, 2>(K, w, ldw, x + c * ldx, ldx, y + c * ldy, ldy);
    if (c < nc) tile<L, R, 1>(K, w, ldw, x + c * ldx, ldx, y + c * ldy, ldy);
}

// Decode: one weight row against C <= 3 activation rows, K unrolled 4x (4*C
// independent FMA chains); rows one after the other (one sequential stream).
template <class L, int C>
void rowdot(int64_t K, const uint8_t* w, const float* x, size_t ldx, float* y, size_t ldy) {
    __m256 acc[4][C];
    #pragma GCC unroll 16
    for (int u = 0; u < 4; ++u)
        #pragma GCC unroll 16
        for (int c = 0; c < C; ++c) acc[u][c] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32)
        #pragma GCC unroll 16
        for (int u = 0; u < 4; ++u) {
            const __m256 wv = L::load(w, k + 8 * u);
            #pragma GCC unroll 16
            for (int c = 0; c < C; ++c)
                acc[u][c] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + c * ldx + k + 8 * u), acc[u][c]);
        }
    for (; k + 8 <= K; k += 8) {
        const __m256 wv = L::load(w, k);
        #pragma GCC unroll 16
        for (int c = 0; c < C; ++c) acc[0][c] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + c * ldx + k), acc[0][c]);
    }
    #pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
        float s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0][c], acc[1][c]), _mm256_add_ps(acc[2][c], acc[3][c])));
        for (int64_t kt = k; kt < K; ++kt) s += L::one(w, kt) * x[c * ldx + kt];
        y[c * ldy] = s;
    }
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
                        2,
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

}  // namespace quern::cpu::avx2
