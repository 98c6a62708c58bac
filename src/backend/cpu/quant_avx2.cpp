// AVX2 activation quantizers: float rows -> Q8_0 / Q8_1 / Q8_K blocks,
// byte-identical to quantize_row_ref (same IEEE operations in the same order
// per element; see quant_avx512.cpp for the formulas).
// Input/output: any alignment. Bound by compute; O(n*K).
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/kernels.h"
#include "quant/blocks.h"

namespace quern::cpu::avx2 {

namespace {

inline __m256 hmax_bcast(__m256 m) {
    m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
    m = _mm256_max_ps(m, _mm256_permute_ps(m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm256_max_ps(m, _mm256_permute_ps(m, _MM_SHUFFLE(2, 3, 0, 1)));
    return m;
}

inline __m256 absps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

// roundf (ties away from zero), exact.
inline __m256i round_away_epi32(__m256 t) {
    const __m256 tr = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_sub_ps(t, tr);
    const __m256 up = _mm256_cmp_ps(absps(frac), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 one = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(t, _mm256_set1_ps(-0.0f)));
    return _mm256_cvttps_epi32(_mm256_add_ps(tr, _mm256_and_ps(up, one)));
}

// Four vectors of 8 int32 in [-128, 127] -> 32 int8 in order.
inline __m256i pack4(__m256i q0, __m256i q1, __m256i q2, __m256i q3) {
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

inline int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

inline float quant32(const float* x, int8_t* qs, int* sum) {
    __m256 v[4];
    for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(x + 8 * j);
    const __m256 m = hmax_bcast(_mm256_max_ps(_mm256_max_ps(absps(v[0]), absps(v[1])),
                                              _mm256_max_ps(absps(v[2]), absps(v[3]))));
    const float amax = _mm256_cvtss_f32(m);
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m256 idv = _mm256_set1_ps(id);
    __m256i q[4];
    for (int j = 0; j < 4; ++j) q[j] = round_away_epi32(_mm256_mul_ps(v[j], idv));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), pack4(q[0], q[1], q[2], q[3]));
    if (sum) *sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    return d;
}

void q8_0(const float* x, void* y, int64_t k) {
    auto* out = static_cast<uint8_t*>(y);
    for (int64_t i = 0; i < k / QK8_0; ++i) {
        uint8_t* b = out + i * static_cast<int64_t>(sizeof(block_q8_0));
        const float d = quant32(x + i * QK8_0, reinterpret_cast<int8_t*>(b + offsetof(block_q8_0, qs)), nullptr);
        const uint16_t dh = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        std::memcpy(b + offsetof(block_q8_0, d), &dh, 2);
    }
}

void q8_1(const float* x, void* y, int64_t k) {
    auto* out = static_cast<uint8_t*>(y);
    for (int64_t i = 0; i < k / QK8_1; ++i) {
        uint8_t* b = out + i * static_cast<int64_t>(sizeof(block_q8_1));
        int sum = 0;
        const float d = quant32(x + i * QK8_1, reinterpret_cast<int8_t*>(b + offsetof(block_q8_1, qs)), &sum);
        const uint16_t dh = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        const uint16_t sh = _cvtss_sh(static_cast<float>(sum) * d, _MM_FROUND_TO_NEAREST_INT);
        std::memcpy(b + offsetof(block_q8_1, d), &dh, 2);
        std::memcpy(b + offsetof(block_q8_1, s), &sh, 2);
    }
}

void q8_K(const float* x, void* y, int64_t k) {
    auto* out = static_cast<uint8_t*>(y);
    for (int64_t i = 0; i < k / QK_K; ++i) {
        const float* v = x + i * QK_K;
        uint8_t* b = out + i * static_cast<int64_t>(sizeof(block_q8_K));
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < 32; ++j) m = _mm256_max_ps(m, absps(_mm256_loadu_ps(v + 8 * j)));
        m = hmax_bcast(m);
        const float amax = _mm256_cvtss_f32(m);
        if (!(amax > 0.0f)) {
            std::memset(b, 0, sizeof(block_q8_K));
            continue;
        }
        float mx = 0.0f;
        for (int j = 0; j < 32; ++j) {
            const int eq = _mm256_movemask_ps(_mm256_cmp_ps(absps(_mm256_loadu_ps(v + 8 * j)), m, _CMP_EQ_OQ));
            if (eq) {
                mx = v[8 * j + __builtin_ctz(static_cast<unsigned>(eq))];
                break;
            }
        }
        const float iscale = -127.f / mx;
        const __m256 is = _mm256_set1_ps(iscale);
        const __m256i c127 = _mm256_set1_epi32(127);
        const __m256i ones8 = _mm256_set1_epi8(1);
        const __m256i ones16 = _mm256_set1_epi16(1);
        __m256i gs[8];  // 128-bit lane l of gs[c]: partial sums of group 2c + l
        for (int c = 0; c < 8; ++c) {
            __m256i q[4];
            for (int j = 0; j < 4; ++j)
                q[j] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 32 * c + 8 * j), is)), c127);
            const __m256i bytes = pack4(q[0], q[1], q[2], q[3]);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(b + offsetof(block_q8_K, qs) + 32 * c), bytes);
            gs[c] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, bytes), ones16);
        }
        // lane l of h0 = [g l, g 2+l, g 4+l, g 6+l]; h1 the same plus 8
        const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(gs[0], gs[1]), _mm256_hadd_epi32(gs[2], gs[3]));
        const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(gs[4], gs[5]), _mm256_hadd_epi32(gs[6], gs[7]));
        const __m256i p = _mm256_packs_epi32(h0, h1);  // lane 0: even groups, lane 1: odd groups
        const __m128i lo = _mm256_castsi256_si128(p), hi = _mm256_extracti128_si256(p, 1);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(b + offsetof(block_q8_K, bsums)), _mm_unpacklo_epi16(lo, hi));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(b + offsetof(block_q8_K, bsums) + 16), _mm_unpackhi_epi16(lo, hi));
        const float d = 1 / iscale;
        std::memcpy(b + offsetof(block_q8_K, d), &d, 4);
    }
}

}  // namespace

const ActQuantizers quantizers{q8_0, q8_1, q8_K};

}  // namespace quern::cpu::avx2
