// AVX-512 unpackers: quantized weight rows -> the common form of kernels.h,
//     w_k = D_s * u_k + Mn_s,  u_k uint8 in natural element order,
// with D_s, Mn_s per sub-block of G = 32 (Q4_0..Q8_0, MXFP4, Q4_K, Q5_K) or
// G = 16 (Q2_K, Q3_K, Q6_K) elements.
//
// Layouts: weight rows are GGUF blocks at any alignment (unaligned loads);
// u rows are written with unaligned stores, D/Mn rows as float arrays.
// Per row: vector unpacking of the packed bits (a few shuffles/shifts per 64
// elements) and vectorized scale decoding (gathers for the 32-element types,
// 64-bit bit tricks for the K-quant 6-bit scales).
// Threading: none here; the driver unpacks the rows each thread owns.
// Bound by: compute on L1-resident outputs; streamed weight reads.
// GCC 12 reports false -Wuninitialized positives inside the AVX-512 intrinsics headers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/kernels.h"
#include "quant/blocks.h"

namespace quern::cpu::avx512 {

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

// fp16 fields at byte offset `off` of nb blocks of size bs -> float out[i] * mul.
inline void gather_f16(const uint8_t* row, int bs, int off, int64_t nb, float mul, float* out) {
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(bs));
    const __m512 vm = _mm512_set1_ps(mul);
    for (int64_t i = 0; i < nb; i += 16) {
        const int64_t left = nb - i;
        const __mmask16 m = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
        // 32-bit reads at the fp16 field; the 2 bytes after it are inside the block.
        const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, row + i * bs + off, 1);
        const __m512 f = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(f, vm));
    }
}

// ---------------------------------------------------------------- 32-element blocks
// Q4/Q5 nibbles: element j < 16 = low nibble of qs[j], j + 16 = high nibble;
// Q5 adds bit e of the 32-bit qh as bit 4. Q8_0: u = q + 128. Fp4 (MXFP4):
// each nibble is an E2M1 code, looked up in kMxfp4U (vpshufb).
template <int BS, int QS, int QH, bool Fp4 = false>
void unpack_nibble_row(const uint8_t* row, int64_t nb, uint8_t* u) {
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4U)));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i b4 = _mm512_set1_epi8(0x10);
    const __m512i ia = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    const __m512i ib = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4) {
        const uint8_t* b = row + i * BS;
        __m512i z = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + QS)));
        z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + BS + QS)), 1);
        z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 * BS + QS)), 2);
        z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 3 * BS + QS)), 3);
        const __m512i lo = _mm512_and_si512(z, m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
        __m512i o0 = _mm512_permutex2var_epi64(lo, ia, hi);  // [lo0 hi0 lo1 hi1]
        __m512i o1 = _mm512_permutex2var_epi64(lo, ib, hi);  // [lo2 hi2 lo3 hi3]
        if constexpr (QH >= 0) {
            const __mmask64 h0 = static_cast<uint64_t>(rd32(b + QH)) | static_cast<uint64_t>(rd32(b + BS + QH)) << 32;
            const __mmask64 h1 =
                static_cast<uint64_t>(rd32(b + 2 * BS + QH)) | static_cast<uint64_t>(rd32(b + 3 * BS + QH)) << 32;
            o0 = _mm512_mask_add_epi8(o0, h0, o0, b4);
            o1 = _mm512_mask_add_epi8(o1, h1, o1, b4);
        }
        if constexpr (Fp4) {
            o0 = _mm512_shuffle_epi8(lut, o0);
            o1 = _mm512_shuffle_epi8(lut, o1);
        }
        _mm512_storeu_si512(u + i * 32, o0);
        _mm512_storeu_si512(u + i * 32 + 64, o1);
    }
    for (; i < nb; ++i) {
        const uint8_t* b = row + i * BS;
        const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + QS));
        const __m128i lo = _mm_and_si128(x, _mm_set1_epi8(0x0F));
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(x, 4), _mm_set1_epi8(0x0F));
        __m256i o = _mm256_set_m128i(hi, lo);
        if constexpr (QH >= 0) o = _mm256_mask_add_epi8(o, rd32(b + QH), o, _mm256_set1_epi8(0x10));
        if constexpr (Fp4) o = _mm256_shuffle_epi8(_mm512_castsi512_si256(lut), o);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(u + i * 32), o);
    }
}

template <int BS, int DOFF, int MOFF, int QS, int QH, int BIAS>
void unpack_legacy(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D, float* Mn,
                   size_t lds) {
    const int64_t nb = K / 32;
    for (int r = 0; r < nr; ++r) {
        const uint8_t* row = w + r * ldw;
        unpack_nibble_row<BS, QS, QH>(row, nb, u + r * ldu);
        gather_f16(row, BS, DOFF, nb, 1.0f, D + r * lds);
        if constexpr (MOFF >= 0)
            gather_f16(row, BS, MOFF, nb, 1.0f, Mn + r * lds);
        else
            gather_f16(row, BS, DOFF, nb, -static_cast<float>(BIAS), Mn + r * lds);
    }
}

}  // namespace

void unpack_q4_0(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D, float* Mn,
                 size_t lds) {
    unpack_legacy<sizeof(block_q4_0), 0, -1, 2, -1, 8>(w, ldw, nr, K, u, ldu, D, Mn, lds);
}
// MXFP4: u = kMxfp4U[code], D = 2^(e - 128), Mn = -12 D (kernels.h).
void unpack_mxfp4(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D, float* Mn,
                  size_t lds) {
    constexpr int BS = sizeof(block_mxfp4);
    const int64_t nb = K / QK_MXFP4;
    for (int r = 0; r < nr; ++r) {
        const uint8_t* row = w + r * ldw;
        unpack_nibble_row<BS, offsetof(block_mxfp4, qs), -1, true>(row, nb, u + r * ldu);
        for (int64_t i = 0; i < nb; ++i) {
            const float d = mxfp4_half_scale(row[i * BS]);
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

void unpack_q8_0(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D, float* Mn,
                 size_t lds) {
    constexpr int BS = sizeof(block_q8_0);
    const int64_t nb = K / 32;
    const __m512i x80 = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int r = 0; r < nr; ++r) {
        const uint8_t* row = w + r * ldw;
        uint8_t* ur = u + r * ldu;
        int64_t i = 0;
        for (; i + 2 <= nb; i += 2) {
            const uint8_t* b = row + i * BS + 2;
            __m512i z = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
            z = _mm512_inserti64x4(z, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + BS)), 1);
            _mm512_storeu_si512(ur + i * 32, _mm512_xor_si512(z, x80));
        }
        if (i < nb) {
            const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + i * BS + 2));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(ur + i * 32),
                                _mm256_xor_si256(z, _mm512_castsi512_si256(x80)));
        }
        gather_f16(row, BS, 0, nb, 1.0f, D + r * lds);
        gather_f16(row, BS, 0, nb, -128.0f, Mn + r * lds);
    }
}

// ---------------------------------------------------------------- K-quants (256-element super-blocks)

// Q2_K: element 128h + 32j + l = bits 2j..2j+1 of qs[32h + l]; sub-block e/16;
// scales[s] = scale | min << 4: D = d * scale, Mn = -dmin * min.
void unpack_q2_K(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D, float* Mn,
                 size_t lds) {
    const __m512i m3 = _mm512_set1_epi8(3);
    const __m512i sh01 = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);  // word shifts: j = 0 | 1
    const __m512i sh23 = _mm512_setr_epi64(4, 4, 4, 4, 6, 6, 6, 6);  // j = 2 | 3
    for (int r = 0; r < nr; ++r) {
        const uint8_t* row = w + r * ldw;
        uint8_t* ur = u + r * ldu;
        float* Dr = D + r * lds;
        float* Mr = Mn + r * lds;
        for (int64_t i = 0; i < K / QK_K; ++i) {
            const uint8_t* b = row + i * static_cast<int64_t>(sizeof(block_q2_K));
            for (int h = 0; h < 2; ++h) {
                const __m512i q = _mm512_broadcast_i64x4(
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + offsetof(block_q2_K, qs) + 32 * h)));
                _mm512_storeu_si512(ur + i * QK_K + 128 * h, _mm512_and_si512(_mm512_srlv_epi64(q, sh01), m3));
                _mm512_storeu_si512(ur + i * QK_K + 128 * h + 64, _mm512_and_si512(_mm512_srlv_epi64(q, sh23), m3));
            }
            const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
            const __m512 d = _mm512_set1_ps(h2f(b + offsetof(block_q2_K, d)));
            const __m512 dm = _mm512_set1_ps(-h2f(b + offsetof(block_q2_K, dmin)));
            _mm512_storeu_ps(Dr + 16 * i, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(sc, _mm512_set1_epi32(15)))));
            _mm512_storeu_ps(Mr + 16 * i, _mm512_mul_ps(dm, _mm512_cvtepi32_ps(_mm512_srli_epi32(sc, 4))));
        }
    }
}

// Q3_K: low 2 bits as Q2_K; bit 4h + j of hmask[l] adds 4; value u - 4.
// Scales: 16 six-bit values (low 4 bits from bytes 0..7, high 2 from 8..11), minus 32.
void unpack_q3_K(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D, float* Mn,
                 size_t lds) {
    const __m512i m3 = _mm512_set1_epi8(3);
    const __m512i four = _mm512_set1_epi8(4);
    const __m512i sh01 = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    const __m512i sh23 = _mm512_setr_epi64(4, 4, 4, 4, 6, 6, 6, 6);
    for (int r = 0; r < nr; ++r) {
        const uint8_t* row = w + r * ldw;
        uint8_t* ur = u + r * ldu;
        float* Dr = D + r * lds;
        float* Mr = Mn + r * lds;
        for (int64_t i = 0; i < K / QK_K; ++i) {
            const uint8_t* b = row + i * static_cast<int64_t>(sizeof(block_q3_K));
            const __m512i hm = _mm512_broadcast_i64x4(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + offsetof(block_q3_K, hmask))));
            for (int h = 0; h < 2; ++h) {
                const __m512i q = _mm512_broadcast_i64x4(
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + offsetof(block_q3_K, qs) + 32 * h)));
                for (int p = 0; p < 2; ++p) {  // j = 2p, 2p + 1
                    __m512i v = _mm512_and_si512(_mm512_srlv_epi64(q, p ? sh23 : sh01), m3);
                    const int bit = 4 * h + 2 * p;
                    const __m512i test = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << bit)),
                                                            _mm256_set1_epi8(static_cast<char>(1 << (bit + 1))), 1);
                    v = _mm512_mask_add_epi8(v, _mm512_test_epi8_mask(hm, test), v, four);
                    _mm512_storeu_si512(ur + i * QK_K + 128 * h + 64 * p, v);
                }
            }
            const uint8_t* s = b + offsetof(block_q3_K, scales);
            const uint64_t a = rd64(s);
            const uint32_t c = rd32(s + 8);
            const uint64_t hi_lo = (static_cast<uint64_t>((c >> 2) & 0x03030303u) << 32) | (c & 0x03030303u);
            const uint64_t hi_hi = (static_cast<uint64_t>((c >> 6) & 0x03030303u) << 32) | ((c >> 4) & 0x03030303u);
            const uint64_t s0 = (a & 0x0F0F0F0F0F0F0F0Full) | (hi_lo << 4);         // scales 0..7
            const uint64_t s1 = ((a >> 4) & 0x0F0F0F0F0F0F0F0Full) | (hi_hi << 4);  // scales 8..15
            const __m512i sc = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_set_epi64x(static_cast<int64_t>(s1),
                                                                                     static_cast<int64_t>(s0))),
                                                _mm512_set1_epi32(32));
            const __m512 dv = _mm512_mul_ps(_mm512_set1_ps(h2f(b + offsetof(block_q3_K, d))), _mm512_cvtepi32_ps(sc));
            _mm512_storeu_ps(Dr + 16 * i, dv);
            _mm512_storeu_ps(Mr + 16 * i, _mm512_mul_ps(dv, _mm512_set1_ps(-4.0f)));
        }
    }
}

namespace {

// Q4_K/Q5_K 6-bit scales and mins of the 8 sub-blocks: D = d*sc, Mn = -dmin*m.
inline void k4_scales(const uint8_t* b, float* Dr, float* Mr) {
    const uint8_t* q = b + 4;  // offsetof(block_q4_K, scales) == offsetof(block_q5_K, scales) == 4
    const uint32_t w0 = rd32(q), w1 = rd32(q + 4), w2 = rd32(q + 8);
    const uint32_t sc_lo = w0 & 0x3F3F3F3Fu;
    const uint32_t m_lo = w1 & 0x3F3F3F3Fu;
    const uint32_t sc_hi = (w2 & 0x0F0F0F0Fu) | (((w0 >> 6) & 0x03030303u) << 4);
    const uint32_t m_hi = ((w2 >> 4) & 0x0F0F0F0Fu) | (((w1 >> 6) & 0x03030303u) << 4);
    const uint64_t sc = (static_cast<uint64_t>(sc_hi) << 32) | sc_lo;
    const uint64_t mm = (static_cast<uint64_t>(m_hi) << 32) | m_lo;
    const __m512 v = _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_set_epi64x(static_cast<int64_t>(mm), static_cast<int64_t>(sc))));
    const __m512 mul = _mm512_insertf32x8(_mm512_set1_ps(h2f(b)), _mm256_set1_ps(-h2f(b + 2)), 1);
    const __m512 r = _mm512_mul_ps(v, mul);
    _mm256_storeu_ps(Dr, _mm512_castps512_ps256(r));
    _mm256_storeu_ps(Mr, _mm512_extractf32x8_ps(r, 1));
}

// Element 64g + 32t + l = nibble t of qs[32g + l] (Q5_K: bit 2g + t of qh[l] adds 16).
template <bool Five>
void unpack_q45_K(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D, float* Mn,
                  size_t lds) {
    constexpr int BS = Five ? sizeof(block_q5_K) : sizeof(block_q4_K);
    constexpr int QS = Five ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i b4 = _mm512_set1_epi8(0x10);
    for (int r = 0; r < nr; ++r) {
        const uint8_t* row = w + r * ldw;
        uint8_t* ur = u + r * ldu;
        for (int64_t i = 0; i < K / QK_K; ++i) {
            const uint8_t* b = row + i * BS;
            __m512i qh;
            if constexpr (Five)
                qh = _mm512_broadcast_i64x4(
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + offsetof(block_q5_K, qh))));
            for (int c = 0; c < 2; ++c) {  // 64 bytes of qs = groups 2c, 2c+1
                const __m512i z = _mm512_loadu_si512(b + QS + 64 * c);
                const __m512i lo = _mm512_and_si512(z, m4);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
                __m512i g0 = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0));
                __m512i g1 = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2));
                if constexpr (Five) {
                    const int g = 2 * c;
                    const __m512i t0 = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (2 * g))),
                                                          _mm256_set1_epi8(static_cast<char>(1 << (2 * g + 1))), 1);
                    const __m512i t1 = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (2 * g + 2))),
                                                          _mm256_set1_epi8(static_cast<char>(1 << (2 * g + 3))), 1);
                    g0 = _mm512_mask_add_epi8(g0, _mm512_test_epi8_mask(qh, t0), g0, b4);
                    g1 = _mm512_mask_add_epi8(g1, _mm512_test_epi8_mask(qh, t1), g1, b4);
                }
                _mm512_storeu_si512(ur + i * QK_K + 128 * c, g0);
                _mm512_storeu_si512(ur + i * QK_K + 128 * c + 64, g1);
            }
            k4_scales(b, D + r * lds + 8 * i, Mn + r * lds + 8 * i);
        }
    }
}

}  // namespace

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
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i m30 = _mm512_set1_epi8(0x30);
    const __m512i shl01 = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2);  // t = 0 | 1: bits 0..1, 2..3 -> 4..5
    const __m512i shr23 = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);  // t = 2 | 3: bits 4..5, 6..7 -> 4..5
    for (int r = 0; r < nr; ++r) {
        const uint8_t* row = w + r * ldw;
        uint8_t* ur = u + r * ldu;
        for (int64_t i = 0; i < K / QK_K; ++i) {
            const uint8_t* b = row + i * static_cast<int64_t>(sizeof(block_q6_K));
            for (int h = 0; h < 2; ++h) {
                const __m512i ql = _mm512_loadu_si512(b + offsetof(block_q6_K, ql) + 64 * h);
                const __m512i qh = _mm512_broadcast_i64x4(
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + offsetof(block_q6_K, qh) + 32 * h)));
                const __m512i lo = _mm512_and_si512(ql, m4);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4);
                const __m512i h01 = _mm512_and_si512(_mm512_sllv_epi64(qh, shl01), m30);
                const __m512i h23 = _mm512_and_si512(_mm512_srlv_epi64(qh, shr23), m30);
                _mm512_storeu_si512(ur + i * QK_K + 128 * h, _mm512_or_si512(lo, h01));
                _mm512_storeu_si512(ur + i * QK_K + 128 * h + 64, _mm512_or_si512(hi, h23));
            }
            const __m512i sc =
                _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + offsetof(block_q6_K, scales))));
            const __m512 dv = _mm512_mul_ps(_mm512_set1_ps(h2f(b + offsetof(block_q6_K, d))), _mm512_cvtepi32_ps(sc));
            _mm512_storeu_ps(D + r * lds + 16 * i, dv);
            _mm512_storeu_ps(Mn + r * lds + 16 * i, _mm512_mul_ps(dv, _mm512_set1_ps(-32.0f)));
        }
    }
}

}  // namespace quern::cpu::avx512
