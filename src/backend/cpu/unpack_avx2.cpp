// AVX2 unpackers: quantized weight rows -> the common form of kernels.h,
//     w_k = D_s * u_k + Mn_s,  u_k uint8 in natural element order.
// Q8_0 is the exception on this level: u holds the signed int8 weights and
// Mn = 0 (UForm::signed_u), because vpmaddubsw's pair sums of (q + 128) * a
// could overflow int16.
// Layouts and preconditions as in unpack_avx512.cpp: weight rows at any
// alignment, outputs written unaligned. Scales are decoded per block with F16C
// scalar conversions (32-element types) or 64-bit bit tricks (K-quants).
// Bound by compute on L1-resident outputs; no threading here.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/kernels.h"
#include "quant/blocks.h"

namespace quern::cpu::avx2 {

namespace {

inline float h2f(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}
inline uint32_t rd32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
inline uint64_t rd64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}
inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline void store256(uint8_t* p, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }

// Byte e of the result is 0xFF where bit e of the 32-bit value is set.
inline __m256i bits_to_bytes(uint32_t bits) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                          3, 3, 3, 3, 3, 3);
    const __m256i sel = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuf);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
}

// Bytes where (v & bit) != 0 -> 0xFF.
inline __m256i test_bit(__m256i v, int bit) {
    const __m256i b = _mm256_set1_epi8(static_cast<char>(1 << bit));
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, b), b);
}

template <int BS, int DOFF, int MOFF, int QS, int QH, int BIAS>
void unpack_legacy(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D, float* Mn,
                   size_t lds) {
    const int64_t nb = K / 32;
    const __m128i m4 = _mm_set1_epi8(0x0F);
    for (int r = 0; r < nr; ++r) {
        const uint8_t* row = w + r * ldw;
        uint8_t* ur = u + r * ldu;
        float* Dr = D + r * lds;
        float* Mr = Mn + r * lds;
        for (int64_t i = 0; i < nb; ++i) {
            const uint8_t* b = row + i * BS;
            const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + QS));
            __m256i o = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m4), _mm_and_si128(x, m4));
            if constexpr (QH >= 0)
                o = _mm256_or_si256(o, _mm256_and_si256(bits_to_bytes(rd32(b + QH)), _mm256_set1_epi8(0x10)));
            store256(ur + 32 * i, o);
            const float d = h2f(b + DOFF);
            Dr[i] = d;
            if constexpr (MOFF >= 0)
                Mr[i] = h2f(b + MOFF);
            else
                Mr[i] = -static_cast<float>(BIAS) * d;
        }
    }
}

// Q4_K/Q5_K scales: D = d*sc, Mn = -dmin*m for the 8 sub-blocks.
inline void k4_scales(const uint8_t* b, float* Dr, float* Mr) {
    const uint8_t* q = b + 4;
    const uint32_t w0 = rd32(q), w1 = rd32(q + 4), w2 = rd32(q + 8);
    const uint32_t sc_lo = w0 & 0x3F3F3F3Fu;
    const uint32_t m_lo = w1 & 0x3F3F3F3Fu;
    const uint32_t sc_hi = (w2 & 0x0F0F0F0Fu) | (((w0 >> 6) & 0x03030303u) << 4);
    const uint32_t m_hi = ((w2 >> 4) & 0x0F0F0F0Fu) | (((w1 >> 6) & 0x03030303u) << 4);
    const __m128i sc = _mm_set_epi32(0, 0, static_cast<int>(sc_hi), static_cast<int>(sc_lo));
    const __m128i mm = _mm_set_epi32(0, 0, static_cast<int>(m_hi), static_cast<int>(m_lo));
    _mm256_storeu_ps(Dr, _mm256_mul_ps(_mm256_set1_ps(h2f(b)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc))));
    _mm256_storeu_ps(Mr, _mm256_mul_ps(_mm256_set1_ps(-h2f(b + 2)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mm))));
}

// Element 64g + 32t + l = nibble t of qs[32g + l] (Q5_K: bit 2g + t of qh[l] adds 16).
template <bool Five>
void unpack_q45_K(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D, float* Mn,
                  size_t lds) {
    constexpr int BS = Five ? sizeof(block_q5_K) : sizeof(block_q4_K);
    constexpr int QS = Five ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i b4 = _mm256_set1_epi8(0x10);
    for (int r = 0; r < nr; ++r) {
        const uint8_t* row = w + r * ldw;
        uint8_t* ur = u + r * ldu;
        for (int64_t i = 0; i < K / QK_K; ++i) {
            const uint8_t* b = row + i * BS;
            __m256i qh = _mm256_setzero_si256();
            if constexpr (Five) qh = load256(b + offsetof(block_q5_K, qh));
            for (int g = 0; g < 4; ++g) {
                const __m256i z = load256(b + QS + 32 * g);
                __m256i lo = _mm256_and_si256(z, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(z, 4), m4);
                if constexpr (Five) {
                    lo = _mm256_or_si256(lo, _mm256_and_si256(test_bit(qh, 2 * g), b4));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(test_bit(qh, 2 * g + 1), b4));
                }
                store256(ur + i * QK_K + 64 * g, lo);
                store256(ur + i * QK_K + 64 * g + 32, hi);
            }
            k4_scales(b, D + r * lds + 8 * i, Mn + r * lds + 8 * i);
        }
    }
}

}  // namespace

void unpack_q4_0(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D, float* Mn,
                 size_t lds) {
    unpack_legacy<sizeof(block_q4_0), 0, -1, 2, -1, 8>(w, ldw, nr, K, u, ldu, D, Mn, lds);
}
// MXFP4: u = kMxfp4U[code] (vpshufb of the nibbles), D = 2^(e - 128), Mn = -12 D.
void unpack_mxfp4(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D, float* Mn,
                  size_t lds) {
    constexpr int BS = sizeof(block_mxfp4);
    const int64_t nb = K / QK_MXFP4;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4U)));
    for (int r = 0; r < nr; ++r) {
        const uint8_t* row = w + r * ldw;
        for (int64_t i = 0; i < nb; ++i) {
            const uint8_t* b = row + i * BS;
            const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + offsetof(block_mxfp4, qs)));
            const __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), m4);
            store256(u + r * ldu + 32 * i, _mm256_shuffle_epi8(lut, q));
            const float d = mxfp4_half_scale(b[0]);
            D[r * lds + i] = d;
            Mn[r * lds + i] = -12.0f * d;
        }
    }
}
void unpack_q4_1(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D, float* Mn,
                 size_t lds) {
    unpack_legacy<sizeof(block_q4_1), 0, 2, 4, -1, 0>(w, ldw, nr, K, u, ldu, D, Mn, lds);
}
void unpack_q5_0(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D, float* Mn,
                 size_t lds) {
    unpack_legacy<sizeof(block_q5_0), 0, -1, 6, 2, 16>(w, ldw, nr, K, u, ldu, D, Mn, lds);
}
void unpack_q5_1(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D, float* Mn,
                 size_t lds) {
    unpack_legacy<sizeof(block_q5_1), 0, 2, 8, 4, 0>(w, ldw, nr, K, u, ldu, D, Mn, lds);
}

// Signed: u = q as int8, D = d, Mn = 0.
void unpack_q8_0(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D, float* Mn,
                 size_t lds) {
    constexpr int BS = sizeof(block_q8_0);
    for (int r = 0; r < nr; ++r) {
        const uint8_t* row = w + r * ldw;
        for (int64_t i = 0; i < K / 32; ++i) {
            store256(u + r * ldu + 32 * i, load256(row + i * BS + 2));
            D[r * lds + i] = h2f(row + i * BS);
            Mn[r * lds + i] = 0.0f;
        }
    }
}

// Q2_K: element 128h + 32j + l = bits 2j..2j+1 of qs[32h + l]; scales[s] = sc | m << 4.
void unpack_q2_K(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D, float* Mn,
                 size_t lds) {
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int r = 0; r < nr; ++r) {
        const uint8_t* row = w + r * ldw;
        uint8_t* ur = u + r * ldu;
        for (int64_t i = 0; i < K / QK_K; ++i) {
            const uint8_t* b = row + i * static_cast<int64_t>(sizeof(block_q2_K));
            for (int h = 0; h < 2; ++h) {
                const __m256i q = load256(b + offsetof(block_q2_K, qs) + 32 * h);
                uint8_t* o = ur + i * QK_K + 128 * h;
                store256(o, _mm256_and_si256(q, m3));
                store256(o + 32, _mm256_and_si256(_mm256_srli_epi16(q, 2), m3));
                store256(o + 64, _mm256_and_si256(_mm256_srli_epi16(q, 4), m3));
                store256(o + 96, _mm256_and_si256(_mm256_srli_epi16(q, 6), m3));
            }
            const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
            const __m128i lo = _mm_and_si128(sc, _mm_set1_epi8(0x0F));
            const __m128i hi = _mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0x0F));
            const __m256 d = _mm256_set1_ps(h2f(b + offsetof(block_q2_K, d)));
            const __m256 dm = _mm256_set1_ps(-h2f(b + offsetof(block_q2_K, dmin)));
            float* Dr = D + r * lds + 16 * i;
            float* Mr = Mn + r * lds + 16 * i;
            _mm256_storeu_ps(Dr, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo))));
            _mm256_storeu_ps(Dr + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)))));
            _mm256_storeu_ps(Mr, _mm256_mul_ps(dm, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi))));
            _mm256_storeu_ps(Mr + 8, _mm256_mul_ps(dm, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)))));
        }
    }
}

// Q3_K: low 2 bits as Q2_K, bit 4h + j of hmask[l] adds 4; value u - 4; 6-bit scales - 32.
void unpack_q3_K(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D, float* Mn,
                 size_t lds) {
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i four = _mm256_set1_epi8(4);
    for (int r = 0; r < nr; ++r) {
        const uint8_t* row = w + r * ldw;
        uint8_t* ur = u + r * ldu;
        for (int64_t i = 0; i < K / QK_K; ++i) {
            const uint8_t* b = row + i * static_cast<int64_t>(sizeof(block_q3_K));
            const __m256i hm = load256(b + offsetof(block_q3_K, hmask));
            for (int h = 0; h < 2; ++h) {
                const __m256i q = load256(b + offsetof(block_q3_K, qs) + 32 * h);
                for (int j = 0; j < 4; ++j) {
                    const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
                    const __m256i hb = _mm256_and_si256(test_bit(hm, 4 * h + j), four);
                    store256(ur + i * QK_K + 128 * h + 32 * j, _mm256_or_si256(lo, hb));
                }
            }
            const uint8_t* s = b + offsetof(block_q3_K, scales);
            const uint64_t a = rd64(s);
            const uint32_t c = rd32(s + 8);
            const uint64_t hi_lo = (static_cast<uint64_t>((c >> 2) & 0x03030303u) << 32) | (c & 0x03030303u);
            const uint64_t hi_hi = (static_cast<uint64_t>((c >> 6) & 0x03030303u) << 32) | ((c >> 4) & 0x03030303u);
            const uint64_t s0 = (a & 0x0F0F0F0F0F0F0F0Full) | (hi_lo << 4);
            const uint64_t s1 = ((a >> 4) & 0x0F0F0F0F0F0F0F0Full) | (hi_hi << 4);
            const __m256 d = _mm256_set1_ps(h2f(b + offsetof(block_q3_K, d)));
            const __m256i c32 = _mm256_set1_epi32(32);
            const __m256 d0 = _mm256_mul_ps(
                d, _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(s0))), c32)));
            const __m256 d1 = _mm256_mul_ps(
                d, _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(s1))), c32)));
            float* Dr = D + r * lds + 16 * i;
            float* Mr = Mn + r * lds + 16 * i;
            _mm256_storeu_ps(Dr, d0);
            _mm256_storeu_ps(Dr + 8, d1);
            _mm256_storeu_ps(Mr, _mm256_mul_ps(d0, _mm256_set1_ps(-4.0f)));
            _mm256_storeu_ps(Mr + 8, _mm256_mul_ps(d1, _mm256_set1_ps(-4.0f)));
        }
    }
}

void unpack_q4_K(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D, float* Mn,
                 size_t lds) {
    unpack_q45_K<false>(w, ldw, nr, K, u, ldu, D, Mn, lds);
}
void unpack_q5_K(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D, float* Mn,
                 size_t lds) {
    unpack_q45_K<true>(w, ldw, nr, K, u, ldu, D, Mn, lds);
}

// Q6_K: element 128h + 32t + l: nibble (t >> 1) of ql[64h + 32(t & 1) + l],
// bits 2t..2t+1 of qh[32h + l] as bits 4..5; value u - 32; int8 scales.
void unpack_q6_K(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D, float* Mn,
                 size_t lds) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    for (int r = 0; r < nr; ++r) {
        const uint8_t* row = w + r * ldw;
        uint8_t* ur = u + r * ldu;
        for (int64_t i = 0; i < K / QK_K; ++i) {
            const uint8_t* b = row + i * static_cast<int64_t>(sizeof(block_q6_K));
            for (int h = 0; h < 2; ++h) {
                const __m256i ql0 = load256(b + offsetof(block_q6_K, ql) + 64 * h);
                const __m256i ql1 = load256(b + offsetof(block_q6_K, ql) + 64 * h + 32);
                const __m256i qh = load256(b + offsetof(block_q6_K, qh) + 32 * h);
                uint8_t* o = ur + i * QK_K + 128 * h;
                store256(o, _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)));
                store256(o + 32,
                         _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)));
                store256(o + 64, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                                 _mm256_and_si256(qh, m30)));
                store256(o + 96, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                                 _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30)));
            }
            const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + offsetof(block_q6_K, scales)));
            const __m256 d = _mm256_set1_ps(h2f(b + offsetof(block_q6_K, d)));
            const __m256 d0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
            const __m256 d1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
            float* Dr = D + r * lds + 16 * i;
            float* Mr = Mn + r * lds + 16 * i;
            _mm256_storeu_ps(Dr, d0);
            _mm256_storeu_ps(Dr + 8, d1);
            _mm256_storeu_ps(Mr, _mm256_mul_ps(d0, _mm256_set1_ps(-32.0f)));
            _mm256_storeu_ps(Mr + 8, _mm256_mul_ps(d1, _mm256_set1_ps(-32.0f)));
        }
    }
}

}  // namespace quern::cpu::avx2
