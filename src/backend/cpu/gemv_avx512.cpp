// AVX-512 VNNI fused GEMV (decode and small batches): y[c][r] = W[r] · x[c],
// one weight row against up to 4 activation rows at a time, reading the packed
// GGUF blocks directly (each block is unpacked once per 4 activation rows).
//
// Work mapping: the driver gives each thread one contiguous range of rows
// (one sequential memory stream per thread), processed one row at a time;
// the activation rows stay in L1. Bound by memory bandwidth: each weight byte
// is loaded once, with ~3 vector instructions per 32 weights (~10 bytes/cycle
// per core is DRAM speed on the target machine).
// Alignment: none (unaligned and masked loads; masked loads never touch bytes
// past the end of a row).
//
// Families and their tricks:
//  * Q4_0/Q4_1/Q5_0/Q5_1 (18..24-byte blocks), 4 blocks per step: two
//    overlapping 64-byte loads cover the 4 blocks; one vpermt2w gathers the 64
//    quant bytes, another the fp16 scales (and mins / high-bit words), already
//    replicated 4x per block. Low nibbles of the 4 blocks meet activations
//    a[0:16] of each block, high nibbles a[16:32] (the activation row is
//    permuted once per call to match), so each 32-bit lane of vpdpbusd holds 8
//    products of one block. The constant offset (q - 8, q - 16) is folded into
//    the accumulator's initial value, -B * sum(a) per lane, precomputed.
//  * MXFP4 (17-byte blocks): as Q4_0, the codes through kMxfp4U (vpshufb), the
//    E8M0 exponent for the fp16 scale.
//  * Q8_0 (34-byte blocks): u = q ^ 0x80 (unsigned), offset 128 folded as above.
//  * K-quants, one 256-element super-block per step: vpmaddubsw (u8 x s8 -> int16
//    pairs) then vpdpwssd with the int16 sub-block scales replicated per pair, so
//    the whole super-block accumulates in int32; Q3_K/Q6_K offsets use the Q8_K
//    16-element sums (vpmaddwd), Q2_K/Q4_K/Q5_K mins likewise into a separate
//    float accumulator. Q4_K/Q5_K activations are permuted to the nibble order.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/kernels.h"
#include "quant/blocks.h"

namespace quern::cpu::avx512 {

namespace {

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
inline __mmask64 bytes_mask(int64_t n) {
    return n <= 0 ? __mmask64(0) : n >= 64 ? ~__mmask64(0) : ((__mmask64(1) << n) - 1);
}
inline float f16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}
inline __m512i bcast256(const uint8_t* p) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512i two_bytes(int lo, int hi) {
    return _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(lo)), _mm256_set1_epi8(static_cast<char>(hi)), 1);
}

// ============================================================ Q4_0 / Q4_1 / Q5_0 / Q5_1

// Byte layout (words = 16-bit units): BS bytes per block; d at word 0; m at
// word MW; qh (32 bits) at words QHW, QHW+1; qs (16 bytes) at words QSW..QSW+7.
template <int BS_, int QSW_, int MW_, int QHW_, int BIAS_>
struct L4 {
    static constexpr int BS = BS_, QSW = QSW_, MW = MW_, QHW = QHW_, BIAS = BIAS_;
    static constexpr int W0 = 2 * BS - 32;  // first word of the second load (bytes 4*BS-64 ..)
    // group word -> vpermt2w index (A = words 0..31, B = words W0..W0+31)
    static constexpr int16_t src(int w) { return static_cast<int16_t>(w < 32 ? w : 32 + (w - W0)); }
    struct Idx {
        int16_t q[32], s[32], h[32];
    };
    static constexpr Idx make() {
        Idx x{};
        for (int i = 0; i < 32; ++i) {
            x.q[i] = src((i / 8) * (BS / 2) + QSW + i % 8);
            if (i < 16)
                x.s[i] = src((i / 4) * (BS / 2));
            else
                x.s[i] = MW >= 0 ? src(((i - 16) / 4) * (BS / 2) + MW) : 0;
            if (QHW >= 0 && i < 8) x.h[i] = src((i % 4) * (BS / 2) + QHW + i / 4);
        }
        return x;
    }
};

template <class T>
struct alignas(64) L4Tables {
    static constexpr typename T::Idx idx = T::make();
};

using TQ4_0 = L4<18, 1, -1, -1, 8>;
using TQ4_1 = L4<20, 2, 1, -1, 0>;
using TQ5_0 = L4<22, 3, -1, 1, 16>;
using TQ5_1 = L4<24, 4, 1, 2, 0>;

// One weight row against NC activation rows: the weights of each group are
// unpacked once and meet every activation row while in registers.
template <class T, int NC>
void gemv_l4(int64_t K, const uint8_t* w0, size_t ldw, int nr, const GemvAct* act, float* y0, size_t ldy) {
    constexpr bool kMin = T::MW >= 0;
    const __m512i iq = _mm512_loadu_si512(L4Tables<T>::idx.q);
    const __m512i is = _mm512_loadu_si512(L4Tables<T>::idx.s);
    const __m512i ih = _mm512_loadu_si512(L4Tables<T>::idx.h);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i b4 = _mm512_set1_epi8(0x10);
    const int64_t nb = K / 32;
    const int64_t ng = (nb + 3) / 4;
    for (int row = 0; row < nr; ++row) {
        const uint8_t* w = w0 + row * ldw;
        float* y = y0 + row;
        __m512 acc[NC], accm[NC];
#pragma GCC unroll 8
        for (int c = 0; c < NC; ++c) acc[c] = accm[c] = _mm512_setzero_ps();
        for (int64_t g = 0; g < ng; ++g) {
            const uint8_t* p = w + 4 * g * T::BS;
            prefetch_span<4 * T::BS>(p + kGemvPrefetchBytes);
            __m512i A, B;
            if (4 * g + 4 <= nb) {
                A = _mm512_loadu_si512(p);
                B = _mm512_loadu_si512(p + 4 * T::BS - 64);
            } else {
                const int64_t nbytes = (nb - 4 * g) * T::BS;  // valid bytes in this group
                A = _mm512_maskz_loadu_epi8(bytes_mask(nbytes), p);
                B = _mm512_maskz_loadu_epi8(bytes_mask(nbytes - (4 * T::BS - 64)), p + 4 * T::BS - 64);
            }
            const __m512i Q = _mm512_permutex2var_epi16(A, iq, B);
            const __m512i S = _mm512_permutex2var_epi16(A, is, B);
            __m512i lo = _mm512_and_si512(Q, m4);
            __m512i hi = _mm512_and_si512(_mm512_srli_epi16(Q, 4), m4);
            if constexpr (T::QHW >= 0) {
                const __m128i H = _mm512_castsi512_si128(_mm512_permutex2var_epi16(A, ih, B));
                lo = _mm512_mask_add_epi8(lo, static_cast<__mmask64>(_mm_cvtsi128_si64(H)), lo, b4);
                hi = _mm512_mask_add_epi8(hi, static_cast<__mmask64>(_mm_extract_epi64(H, 1)), hi, b4);
            }
            const __m512 D = _mm512_cvtph_ps(_mm512_castsi512_si256(S));
            __m512 M;
            if constexpr (kMin) M = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(S, 1));
#pragma GCC unroll 8
            for (int c = 0; c < NC; ++c) {
                const __m512i x = _mm512_loadu_si512(static_cast<const int32_t*>(act[c].lx) + 16 * g);
                __m512i I =
                    _mm512_dpbusd_epi32(kMin ? _mm512_setzero_si512() : x, lo, _mm512_loadu_si512(act[c].a + 128 * g));
                I = _mm512_dpbusd_epi32(I, hi, _mm512_loadu_si512(act[c].a + 128 * g + 64));
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(D, _mm512_loadu_ps(act[c].lf + 16 * g)),
                                         acc[c]);
                if constexpr (kMin) accm[c] = _mm512_fmadd_ps(M, _mm512_castsi512_ps(x), accm[c]);
            }
        }
#pragma GCC unroll 8
        for (int c = 0; c < NC; ++c) y[c * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(acc[c], accm[c]));
    }
}

// ============================================================ MXFP4

// 17-byte blocks, 4 per step as Q4_0 (same lanes and activation layout): the
// odd block size rules out Q4_0's word permutes, so each block's 16 code
// bytes are loaded into their own 128-bit lane; the nibbles go through
// kMxfp4U (vpshufb) to u = 2 e2m1 + 12, whose offset 12 is folded into the
// accumulator as Q4_0's 8 is. The 4 exponent bytes sit at byte 0 of dwords
// 0, 4, 8, 12 shifted by 0, 8, 16, 24 bits: one permute and a variable shift
// give each lane its block's e.
template <int NC>
void gemv_mxfp4(int64_t K, const uint8_t* w0, size_t ldw, int nr, const GemvAct* act, float* y0, size_t ldy) {
    constexpr int BS = sizeof(block_mxfp4);
    constexpr int QS = offsetof(block_mxfp4, qs);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4U)));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i eidx = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
    const __m512i eshift = _mm512_setr_epi32(0, 0, 0, 0, 8, 8, 8, 8, 16, 16, 16, 16, 24, 24, 24, 24);
    const int64_t nb = K / 32;
    const int64_t ng = (nb + 3) / 4;
    for (int row = 0; row < nr; ++row) {
        const uint8_t* w = w0 + row * ldw;
        float* y = y0 + row;
        __m512 acc[NC];
#pragma GCC unroll 8
        for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
        for (int64_t g = 0; g < ng; ++g) {
            const uint8_t* p = w + 4 * g * BS;
            prefetch_span<4 * BS>(p + kGemvPrefetchBytes);
            const int64_t left = nb - 4 * g;  // blocks in this group (the rest is zero)
            auto qs = [&](int b) {
                return b < left ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + b * BS + QS))
                                : _mm_setzero_si128();
            };
            __m512i Q = _mm512_castsi128_si512(qs(0));
            Q = _mm512_inserti32x4(Q, qs(1), 1);
            Q = _mm512_inserti32x4(Q, qs(2), 2);
            Q = _mm512_inserti32x4(Q, qs(3), 3);
            const __m512i E = left >= 4 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(bytes_mask(left * BS), p);
            const __m512i e = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(eidx, E), eshift),
                                               _mm512_set1_epi32(0xFF));
            const __m512 D = mxfp4_half_scale_ps(e);
            const __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(Q, m4));
            const __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(Q, 4), m4));
#pragma GCC unroll 8
            for (int c = 0; c < NC; ++c) {
                const __m512i x = _mm512_loadu_si512(static_cast<const int32_t*>(act[c].lx) + 16 * g);
                __m512i I = _mm512_dpbusd_epi32(x, lo, _mm512_loadu_si512(act[c].a + 128 * g));
                I = _mm512_dpbusd_epi32(I, hi, _mm512_loadu_si512(act[c].a + 128 * g + 64));
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(D, _mm512_loadu_ps(act[c].lf + 16 * g)),
                                         acc[c]);
            }
        }
#pragma GCC unroll 8
        for (int c = 0; c < NC; ++c) y[c * ldy] = _mm512_reduce_add_ps(acc[c]);
    }
}

// ============================================================ Q8_0

template <int NC>
void gemv_q8_0(int64_t K, const uint8_t* w0, size_t ldw, int nr, const GemvAct* act, float* y0, size_t ldy) {
    constexpr int BS = sizeof(block_q8_0);
    alignas(64) static constexpr int16_t kIdx[32] = {0,  0,  0,  0,  0,  0,  0,  0,  17, 17, 17, 17, 17, 17, 17, 17,
                                                     34, 34, 34, 34, 34, 34, 34, 34, 51, 51, 51, 51, 51, 51, 51, 51};
    const __m512i idx = _mm512_load_si512(kIdx);
    const __m512i x80 = _mm512_set1_epi8(static_cast<char>(0x80));
    const int64_t nb = K / 32;
    const int64_t ng = (nb + 3) / 4;
    for (int row = 0; row < nr; ++row) {
        const uint8_t* w = w0 + row * ldw;
        float* y = y0 + row;
        __m512 acc[NC];
#pragma GCC unroll 8
        for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
        for (int64_t g = 0; g < ng; ++g) {
            const uint8_t* p = w + 4 * g * BS;
            prefetch_span<4 * BS>(p + kGemvPrefetchBytes);
            __m512i w01, w23, A, B;
            if (4 * g + 4 <= nb) {
                w01 = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2))),
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 + BS)), 1);
                w23 = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 + 2 * BS))),
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 + 3 * BS)), 1);
                A = _mm512_loadu_si512(p);
                B = _mm512_loadu_si512(p + 64);
            } else {
                const int64_t nbytes = (nb - 4 * g) * BS;
                auto blk = [&](int b) {
                    return b * BS < nbytes ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 + b * BS))
                                           : _mm256_setzero_si256();
                };
                w01 = _mm512_inserti64x4(_mm512_castsi256_si512(blk(0)), blk(1), 1);
                w23 = _mm512_inserti64x4(_mm512_castsi256_si512(blk(2)), blk(3), 1);
                A = _mm512_maskz_loadu_epi8(bytes_mask(nbytes), p);
                B = _mm512_maskz_loadu_epi8(bytes_mask(nbytes - 64), p + 64);
            }
            const __m512i S = _mm512_permutex2var_epi16(A, idx, B);
            const __m512 D01 = _mm512_cvtph_ps(_mm512_castsi512_si256(S));
            const __m512 D23 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(S, 1));
            const __m512i u01 = _mm512_xor_si512(w01, x80);
            const __m512i u23 = _mm512_xor_si512(w23, x80);
#pragma GCC unroll 8
            for (int c = 0; c < NC; ++c) {
                const int32_t* lx = static_cast<const int32_t*>(act[c].lx) + 32 * g;
                const __m512i I0 =
                    _mm512_dpbusd_epi32(_mm512_loadu_si512(lx), u01, _mm512_loadu_si512(act[c].a + 128 * g));
                const __m512i I1 =
                    _mm512_dpbusd_epi32(_mm512_loadu_si512(lx + 16), u23, _mm512_loadu_si512(act[c].a + 128 * g + 64));
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I0),
                                         _mm512_mul_ps(D01, _mm512_loadu_ps(act[c].lf + 32 * g)), acc[c]);
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I1),
                                         _mm512_mul_ps(D23, _mm512_loadu_ps(act[c].lf + 32 * g + 16)), acc[c]);
            }
        }
#pragma GCC unroll 8
        for (int c = 0; c < NC; ++c) y[c * ldy] = _mm512_reduce_add_ps(acc[c]);
    }
}

// ============================================================ K-quants

// One unpacked super-block: 4 vectors of 64 unsigned quants u[j] (each meets
// activation vector j of the super-block), int16 scales per vpmaddubsw output
// word, and what the corrections need.
struct KW {
    __m512i u[4], sc[4];
    __m256i s16;  // Q2_K: mins; Q3_K/Q6_K: scales (for the offset correction); Q4_K/Q5_K: mins in the low 128
    __m128 dd;    // [d, dmin]
};

struct KAcc {
    __m512 acc = _mm512_setzero_ps();
    __m256 accm = _mm256_setzero_ps();  // subtracted at the end (mins)
};

// Scales per pair-word for sub-blocks of 16 (Q2_K, Q3_K, Q6_K): word w of
// vector j belongs to sub-block 4j + w/8.
inline __m512i sc16_of(const __m512i S16, int j) {
    const __m512i base = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0,
                                          0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_epi16(_mm512_add_epi16(base, _mm512_set1_epi16(static_cast<short>(4 * j))), S16);
}

inline __m512i kdot(const KW& w, const int8_t* a) {
    __m512i acc =
        _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(w.u[0], _mm512_loadu_si512(a)), w.sc[0]);
    acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(w.u[1], _mm512_loadu_si512(a + 64)), w.sc[1]);
    acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(w.u[2], _mm512_loadu_si512(a + 128)), w.sc[2]);
    return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(w.u[3], _mm512_loadu_si512(a + 192)), w.sc[3]);
}

inline __m128 f16x2(const uint8_t* p) { return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(rd32(p)))); }

// Q4_K / Q5_K: u[0] = [sb0 sb2], u[1] = [sb1 sb3], u[2] = [sb4 sb6], u[3] = [sb5 sb7]
// (activations are permuted to match); 6-bit scales and mins.
template <bool Five>
struct KQ45 {
    static constexpr int BS = Five ? sizeof(block_q5_K) : sizeof(block_q4_K);
    static void load(const uint8_t* p, KW& w) {
        constexpr int QS = Five ? 48 : 16;
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        const __m512i z0 = _mm512_loadu_si512(p + QS);
        const __m512i z1 = _mm512_loadu_si512(p + QS + 64);
        w.u[0] = _mm512_and_si512(z0, m4);
        w.u[1] = _mm512_and_si512(_mm512_srli_epi16(z0, 4), m4);
        w.u[2] = _mm512_and_si512(z1, m4);
        w.u[3] = _mm512_and_si512(_mm512_srli_epi16(z1, 4), m4);
        if constexpr (Five) {
            const __m512i qh = bcast256(p + 16);
            const __m512i b4 = _mm512_set1_epi8(0x10);
            w.u[0] = _mm512_mask_add_epi8(w.u[0], _mm512_test_epi8_mask(qh, two_bytes(1, 4)), w.u[0], b4);
            w.u[1] = _mm512_mask_add_epi8(w.u[1], _mm512_test_epi8_mask(qh, two_bytes(2, 8)), w.u[1], b4);
            w.u[2] = _mm512_mask_add_epi8(w.u[2], _mm512_test_epi8_mask(qh, two_bytes(16, 64)), w.u[2], b4);
            w.u[3] = _mm512_mask_add_epi8(w.u[3], _mm512_test_epi8_mask(qh, two_bytes(32, 128)), w.u[3], b4);
        }
        // 6-bit scales and mins -> bytes [sc0..sc7, m0..m7]
        const uint32_t w0 = rd32(p + 4), w1 = rd32(p + 8), w2 = rd32(p + 12);
        const uint32_t sc_lo = w0 & 0x3F3F3F3Fu, m_lo = w1 & 0x3F3F3F3Fu;
        const uint32_t sc_hi = (w2 & 0x0F0F0F0Fu) | (((w0 >> 6) & 0x03030303u) << 4);
        const uint32_t m_hi = ((w2 >> 4) & 0x0F0F0F0Fu) | (((w1 >> 6) & 0x03030303u) << 4);
        const __m128i scm = _mm_set_epi32(static_cast<int>(m_hi), static_cast<int>(m_lo), static_cast<int>(sc_hi),
                                          static_cast<int>(sc_lo));
        const __m512i sb = _mm512_broadcast_i32x4(scm);
        const char Z = static_cast<char>(0x80);
        // pshufb controls: words 0..15 <- scale byte sa, words 16..31 <- sb2 (zero-extended)
        auto ctrl = [Z](char sa, char sb2) {
            return _mm512_set_epi8(Z, sb2, Z, sb2, Z, sb2, Z, sb2, Z, sb2, Z, sb2, Z, sb2, Z, sb2, Z, sb2, Z, sb2, Z,
                                   sb2, Z, sb2, Z, sb2, Z, sb2, Z, sb2, Z, sb2, Z, sa, Z, sa, Z, sa, Z, sa, Z, sa, Z,
                                   sa, Z, sa, Z, sa, Z, sa, Z, sa, Z, sa, Z, sa, Z, sa, Z, sa, Z, sa, Z, sa);
        };
        w.sc[0] = _mm512_shuffle_epi8(sb, ctrl(0, 2));
        w.sc[1] = _mm512_shuffle_epi8(sb, ctrl(1, 3));
        w.sc[2] = _mm512_shuffle_epi8(sb, ctrl(4, 6));
        w.sc[3] = _mm512_shuffle_epi8(sb, ctrl(5, 7));
        w.s16 = _mm256_zextsi128_si256(_mm_cvtepu8_epi16(_mm_srli_si128(scm, 8)));
        w.dd = f16x2(p);
    }
    static void dot(const KW& w, const int8_t* a, const int16_t* kb, float kd, KAcc& A) {
        const __m512i I = kdot(w, a);
        const __m128i mins =
            _mm_madd_epi16(_mm256_castsi256_si128(w.s16), _mm_loadu_si128(reinterpret_cast<const __m128i*>(kb)));
        const __m128 dd = _mm_mul_ps(w.dd, _mm_set1_ps(kd));
        A.acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_broadcastss_ps(dd), A.acc);
        A.accm = _mm256_fmadd_ps(_mm256_zextps128_ps256(_mm_cvtepi32_ps(mins)),
                                 _mm256_broadcastss_ps(_mm_movehdup_ps(dd)), A.accm);
    }
};

// Q6_K: u[2h] = elements 128h + 0..63, u[2h+1] = 128h + 64..127 (natural order).
struct KQ6 {
    static constexpr int BS = sizeof(block_q6_K);
    static void load(const uint8_t* p, KW& w) {
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        const __m512i m30 = _mm512_set1_epi8(0x30);
        const __m512i shl01 = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2);
        const __m512i shr23 = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
            const __m512i ql = _mm512_loadu_si512(p + 64 * h);
            const __m512i qh = bcast256(p + 128 + 32 * h);
            w.u[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi64(qh, shl01), m30));
            w.u[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                             _mm512_and_si512(_mm512_srlv_epi64(qh, shr23), m30));
        }
        w.s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192)));
        const __m512i S = _mm512_castsi256_si512(w.s16);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) w.sc[j] = sc16_of(S, j);
        w.dd = _mm_set1_ps(f16(p + 208));
    }
    static void dot(const KW& w, const int8_t* a, const int16_t* kb, float kd, KAcc& A) {
        __m512i I = kdot(w, a);
        const __m256i corr = _mm256_madd_epi16(w.s16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kb)));
        I = _mm512_sub_epi32(I, _mm512_zextsi256_si512(_mm256_slli_epi32(corr, 5)));  // offset 32
        A.acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_set1_ps(_mm_cvtss_f32(w.dd) * kd), A.acc);
    }
};

// Q2_K / Q3_K low bits: u[2h] = bits 0..1 | 2..3 of qs[32h..], u[2h+1] = bits 4..5 | 6..7.
inline void q23_low(const uint8_t* qs, __m512i u[4]) {
    const __m512i m3 = _mm512_set1_epi8(3);
    const __m512i sh01 = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    const __m512i sh23 = _mm512_setr_epi64(4, 4, 4, 4, 6, 6, 6, 6);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
        const __m512i q = bcast256(qs + 32 * h);
        u[2 * h] = _mm512_and_si512(_mm512_srlv_epi64(q, sh01), m3);
        u[2 * h + 1] = _mm512_and_si512(_mm512_srlv_epi64(q, sh23), m3);
    }
}

struct KQ3 {
    static constexpr int BS = sizeof(block_q3_K);
    static void load(const uint8_t* p, KW& w) {
        q23_low(p + 32, w.u);
        const __m512i hm = bcast256(p);
        const __m512i four = _mm512_set1_epi8(4);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {  // u[j] holds hmask bits 2j, 2j+1
            const __mmask64 m = _mm512_test_epi8_mask(hm, two_bytes(1 << (2 * j), 1 << (2 * j + 1)));
            w.u[j] = _mm512_mask_add_epi8(w.u[j], m, w.u[j], four);
        }
        const uint8_t* s = p + 96;
        const uint64_t a8 = rd64(s);
        const uint32_t c = rd32(s + 8);
        const uint64_t hi_lo = (static_cast<uint64_t>((c >> 2) & 0x03030303u) << 32) | (c & 0x03030303u);
        const uint64_t hi_hi = (static_cast<uint64_t>((c >> 6) & 0x03030303u) << 32) | ((c >> 4) & 0x03030303u);
        const uint64_t s0 = (a8 & 0x0F0F0F0F0F0F0F0Full) | (hi_lo << 4);
        const uint64_t s1 = ((a8 >> 4) & 0x0F0F0F0F0F0F0F0Full) | (hi_hi << 4);
        const __m128i sb =
            _mm_sub_epi8(_mm_set_epi64x(static_cast<int64_t>(s1), static_cast<int64_t>(s0)), _mm_set1_epi8(32));
        w.s16 = _mm256_cvtepi8_epi16(sb);
        const __m512i S = _mm512_castsi256_si512(w.s16);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) w.sc[j] = sc16_of(S, j);
        w.dd = _mm_set1_ps(f16(p + 108));
    }
    static void dot(const KW& w, const int8_t* a, const int16_t* kb, float kd, KAcc& A) {
        __m512i I = kdot(w, a);
        const __m256i corr = _mm256_madd_epi16(w.s16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kb)));
        I = _mm512_sub_epi32(I, _mm512_zextsi256_si512(_mm256_slli_epi32(corr, 2)));  // offset 4
        A.acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_set1_ps(_mm_cvtss_f32(w.dd) * kd), A.acc);
    }
};

struct KQ2 {
    static constexpr int BS = sizeof(block_q2_K);
    static void load(const uint8_t* p, KW& w) {
        q23_low(p + 16, w.u);
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        const __m128i m4 = _mm_set1_epi8(0x0F);
        const __m512i S = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(raw, m4)));
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) w.sc[j] = sc16_of(S, j);
        w.s16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));  // mins
        w.dd = f16x2(p + 80);
    }
    static void dot(const KW& w, const int8_t* a, const int16_t* kb, float kd, KAcc& A) {
        const __m512i I = kdot(w, a);
        const __m256i mins = _mm256_madd_epi16(w.s16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kb)));
        const __m128 dd = _mm_mul_ps(w.dd, _mm_set1_ps(kd));
        A.acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_broadcastss_ps(dd), A.acc);
        A.accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_broadcastss_ps(_mm_movehdup_ps(dd)), A.accm);
    }
};

template <class T, int NC>
void gemv_k(int64_t K, const uint8_t* w0, size_t ldw, int nr, const GemvAct* act, float* y0, size_t ldy) {
    for (int row = 0; row < nr; ++row) {
        const uint8_t* w = w0 + row * ldw;
        float* y = y0 + row;
        KAcc acc[NC];
        for (int64_t i = 0; i < K / QK_K; ++i) {
            KW kw;
            prefetch_span<T::BS>(w + i * T::BS + kGemvPrefetchBytes);
            T::load(w + i * T::BS, kw);
#pragma GCC unroll 8
            for (int c = 0; c < NC; ++c) T::dot(kw, act[c].a + 256 * i, act[c].kb + 16 * i, act[c].kd[i], acc[c]);
        }
#pragma GCC unroll 8
        for (int c = 0; c < NC; ++c) {
            const __m256 m = acc[c].accm;
            const __m128 m4 = _mm_add_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            const __m128 m2 = _mm_add_ps(m4, _mm_movehl_ps(m4, m4));
            y[c * ldy] = _mm512_reduce_add_ps(acc[c].acc) - _mm_cvtss_f32(_mm_add_ss(m2, _mm_movehdup_ps(m2)));
        }
    }
}

// ============================================================ row dispatch

// Rows one after the other: consecutive rows are contiguous in memory, so the
// weights stream as one sequential run, which the hardware prefetchers follow
// at full speed (interleaving 4 rows - 4 short streams of 1-2 KB - was
// measured 2-3x slower from DRAM). Activation rows go up to 4 at a time.
constexpr int kMaxNC = 8;  // activation rows per kernel call

template <template <int> class F>
void rows(int64_t K, const uint8_t* w, size_t ldw, int nr, const GemvAct* act, int nc, float* y, size_t ldy) {
    // more than 4 activation rows: blocks of 16 weight rows (L1/L2) are reused
    // across the column chunks instead of being streamed from memory again
    const int rb = nc <= kMaxNC ? nr : 16;
    for (int r0 = 0; r0 < nr; r0 += rb) {
        const int rn = nr - r0 < rb ? nr - r0 : rb;
        for (int c0 = 0; c0 < nc; c0 += kMaxNC) {
            const uint8_t* wr = w + r0 * ldw;
            float* yr = y + c0 * ldy + r0;
            switch (nc - c0 < kMaxNC ? nc - c0 : kMaxNC) {
                case 1: F<1>::run(K, wr, ldw, rn, act + c0, yr, ldy); break;
                case 2: F<2>::run(K, wr, ldw, rn, act + c0, yr, ldy); break;
                case 3: F<3>::run(K, wr, ldw, rn, act + c0, yr, ldy); break;
                case 4: F<4>::run(K, wr, ldw, rn, act + c0, yr, ldy); break;
                case 5: F<5>::run(K, wr, ldw, rn, act + c0, yr, ldy); break;
                case 6: F<6>::run(K, wr, ldw, rn, act + c0, yr, ldy); break;
                case 7: F<7>::run(K, wr, ldw, rn, act + c0, yr, ldy); break;
                default: F<8>::run(K, wr, ldw, rn, act + c0, yr, ldy); break;
            }
        }
    }
}

template <class T>
struct L4K {
    template <int NC>
    struct F {
        static void run(int64_t K, const uint8_t* w, size_t ldw, int nr, const GemvAct* a, float* y, size_t ldy) {
            gemv_l4<T, NC>(K, w, ldw, nr, a, y, ldy);
        }
    };
};
template <int NC>
struct Q8K {
    static void run(int64_t K, const uint8_t* w, size_t ldw, int nr, const GemvAct* a, float* y, size_t ldy) {
        gemv_q8_0<NC>(K, w, ldw, nr, a, y, ldy);
    }
};
template <int NC>
struct MX4 {
    static void run(int64_t K, const uint8_t* w, size_t ldw, int nr, const GemvAct* a, float* y, size_t ldy) {
        gemv_mxfp4<NC>(K, w, ldw, nr, a, y, ldy);
    }
};
template <class T>
struct KK {
    template <int NC>
    struct F {
        static void run(int64_t K, const uint8_t* w, size_t ldw, int nr, const GemvAct* a, float* y, size_t ldy) {
            gemv_k<T, NC>(K, w, ldw, nr, a, y, ldy);
        }
    };
};

}  // namespace

GemvFn gemv_for(DType t) {
    switch (t) {
        case DType::Q4_0:
            return rows<L4K<TQ4_0>::F>;
        case DType::Q4_1:
            return rows<L4K<TQ4_1>::F>;
        case DType::Q5_0:
            return rows<L4K<TQ5_0>::F>;
        case DType::Q5_1:
            return rows<L4K<TQ5_1>::F>;
        case DType::Q8_0:
            return rows<Q8K>;
        case DType::MXFP4:
            return rows<MX4>;
        case DType::Q2_K:
            return rows<KK<KQ2>::F>;
        case DType::Q3_K:
            return rows<KK<KQ3>::F>;
        case DType::Q4_K:
            return rows<KK<KQ45<false>>::F>;
        case DType::Q5_K:
            return rows<KK<KQ45<true>>::F>;
        case DType::Q6_K:
            return rows<KK<KQ6>::F>;
        default:
            return nullptr;
    }
}

}  // namespace quern::cpu::avx512
