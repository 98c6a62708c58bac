// AVX2 fused GEMV (decode and small batches): y[c][r] = W[r] · x[c], one
// weight row against up to 4 activation rows at a time, reading the packed
// GGUF blocks directly. Activation layouts are the shared ones of act_prep.cpp
// (GemvAct); the lane mapping of vpmaddubsw + vpmaddwd over a pair of blocks
// [low halves | high halves] matches the AVX-512 kernels' lanes.
//
// Work mapping: each thread gets one contiguous range of rows (one sequential
// memory stream), processed one row at a time; activations stay in L1.
// Bound by memory bandwidth (~8-12 instructions per 32 weights).
// Overflow: vpmaddubsw pair sums are at most 2 * 63 * 127 (u <= 63; Q8_0 uses
// |w| and sign(a, w): 2 * 128 * 127), and at most two are added in int16.
// Alignment: none (unaligned loads; nothing is read past a row's last block).
#include <immintrin.h>

#include <array>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "quant/blocks.h"

namespace quern::cpu::avx2 {

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
inline float f16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}
inline __m128i load128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline __m256i load256(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Byte e of the result is 0xFF where bit e of `bits` is set.
inline __m256i bits_to_bytes(uint32_t bits) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                          3, 3, 3, 3, 3, 3);
    const __m256i sel = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuf);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
}
inline __m256i test_bit(__m256i v, int bit) {
    const __m256i b = _mm256_set1_epi8(static_cast<char>(1 << bit));
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, b), b);
}
inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
// [a x4 | b x4]
inline __m256 two_floats(float a, float b) { return _mm256_set_m128(_mm_set1_ps(b), _mm_set1_ps(a)); }

// mxfp4_half_scale by table: one L1 load per block instead of its branches
// (the kernel is instruction-bound in cache).
const std::array<float, 256> kMxfp4Half = [] {
    std::array<float, 256> t{};
    for (int e = 0; e < 256; ++e) t[static_cast<size_t>(e)] = mxfp4_half_scale(static_cast<uint8_t>(e));
    return t;
}();

// ============================================================ Q4_0 / Q4_1 / Q5_0 / Q5_1 / MXFP4

// Block layout: BS bytes; d at 0; m at MOFF; qh (32 bits) at QH; qs (16 bytes) at QS.
// Fp4 (MXFP4): byte 0 is the E8M0 exponent (D = 2^(e - 128)) and the nibbles
// are E2M1 codes, looked up as u = kMxfp4U[code] (offset 12 as in Q4_0's 8).
template <int BS, int MOFF, int QH, int QS, int NC, bool Fp4>
void gemv_l4(int64_t K, const uint8_t* w, const GemvAct* act, float* y, size_t ldy) {
    constexpr bool kMin = MOFF >= 0;
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4U)));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i b4 = _mm256_set1_epi8(0x10);
    const __m256i ones16 = _mm256_set1_epi16(1);
    const int64_t nb = K / 32;
    __m256 acc[NC], accm[NC];
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) acc[c] = accm[c] = _mm256_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += 2) {  // a pair of blocks: lanes 8 * (b0 / 2) ..
        const bool two = b0 + 1 < nb;
        const uint8_t* p0 = w + b0 * BS;
        const uint8_t* p1 = p0 + BS;
        prefetch_span<2 * BS>(p0 + kGemvPrefetchBytes);
        const __m256i q = _mm256_set_m128i(two ? load128(p1 + QS) : _mm_setzero_si128(), load128(p0 + QS));
        __m256i lo = _mm256_and_si256(q, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if constexpr (QH >= 0) {
            const uint32_t h0 = rd32(p0 + QH), h1 = two ? rd32(p1 + QH) : 0u;
            lo = _mm256_or_si256(lo, _mm256_and_si256(bits_to_bytes((h0 & 0xFFFFu) | (h1 << 16)), b4));
            hi = _mm256_or_si256(hi, _mm256_and_si256(bits_to_bytes((h0 >> 16) | (h1 & 0xFFFF0000u)), b4));
        }
        if constexpr (Fp4) {
            lo = _mm256_shuffle_epi8(lut, lo);
            hi = _mm256_shuffle_epi8(lut, hi);
        }
        const __m256 D = Fp4 ? two_floats(kMxfp4Half[p0[0]], two ? kMxfp4Half[p1[0]] : 0.0f)
                             : two_floats(f16(p0), two ? f16(p1) : 0.0f);
        __m256 M;
        if constexpr (kMin) M = two_floats(f16(p0 + MOFF), two ? f16(p1 + MOFF) : 0.0f);
        const int64_t g = b0 / 4, half = (b0 % 4) / 2;  // group of 4 blocks, which pair in it
        const int64_t lane = 16 * g + 8 * half;
#pragma GCC unroll 8
        for (int c = 0; c < NC; ++c) {
            const int8_t* a = act[c].a + 128 * g + 32 * half;
            const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, load256(a)),
                                                 _mm256_maddubs_epi16(hi, load256(a + 64)));
            __m256i I = _mm256_madd_epi16(s16, ones16);
            if constexpr (!kMin) I = _mm256_add_epi32(I, load256(static_cast<const int32_t*>(act[c].lx) + lane));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(D, _mm256_loadu_ps(act[c].lf + lane)),
                                     acc[c]);
            if constexpr (kMin)
                accm[c] = _mm256_fmadd_ps(M, _mm256_loadu_ps(static_cast<const float*>(act[c].lx) + lane), accm[c]);
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) y[c * ldy] = hsum(_mm256_add_ps(acc[c], accm[c]));
}

// ============================================================ Q8_0 (signed: |w| x sign(a, w))

template <int NC>
void gemv_q8_0(int64_t K, const uint8_t* w, const GemvAct* act, float* y, size_t ldy) {
    constexpr int BS = sizeof(block_q8_0);
    const __m256i ones16 = _mm256_set1_epi16(1);
    __m256 acc[NC];
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < K / 32; ++b) {
        const uint8_t* p = w + b * BS;
        prefetch_span<BS>(p + kGemvPrefetchBytes);
        const __m256i q = load256(p + 2);
        const __m256i aq = _mm256_sign_epi8(q, q);
        const __m256 d = _mm256_set1_ps(f16(p));
#pragma GCC unroll 8
        for (int c = 0; c < NC; ++c) {
            const __m256i I =
                _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(load256(act[c].a + 32 * b), q)), ones16);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(d, _mm256_loadu_ps(act[c].lf + 8 * b)),
                                     acc[c]);
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) y[c * ldy] = hsum(acc[c]);
}

// ============================================================ K-quants

// Per super-block a type provides 8 chunks of 32 unsigned quants u(j) (chunk j
// meets activation bytes 32j..32j+31 of the super-block), the int16 scale of
// each vpmaddubsw output word sc(j), and a correction per activation row.
struct KAcc {
    __m256 acc = _mm256_setzero_ps();
    __m256 accm = _mm256_setzero_ps();  // subtracted at the end (mins)
};

inline __m256i pair_scales(const int16_t* s, int j) {  // [s[2j] x8 | s[2j+1] x8]
    return _mm256_set_m128i(_mm_set1_epi16(s[2 * j + 1]), _mm_set1_epi16(s[2 * j]));
}

// Q4_K / Q5_K: chunks [sb0 sb2 sb1 sb3 sb4 sb6 sb5 sb7] (the activation order).
template <bool Five>
struct KQ45 {
    static constexpr int BS = Five ? sizeof(block_q5_K) : sizeof(block_q4_K);
    static constexpr int kSb[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    const uint8_t* p;
    __m256i qh;
    alignas(16) uint8_t scm[16];  // sc0..sc7, m0..m7
    __m128 dd;
    explicit KQ45(const uint8_t* blk) : p(blk) {
        if constexpr (Five) qh = load256(p + 16);
        const uint32_t w0 = rd32(p + 4), w1 = rd32(p + 8), w2 = rd32(p + 12);
        const uint32_t v[4] = {w0 & 0x3F3F3F3Fu, (w2 & 0x0F0F0F0Fu) | (((w0 >> 6) & 0x03030303u) << 4),
                               w1 & 0x3F3F3F3Fu, ((w2 >> 4) & 0x0F0F0F0Fu) | (((w1 >> 6) & 0x03030303u) << 4)};
        std::memcpy(scm, v, 16);
        dd = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(rd32(p))));
    }
    __m256i u(int j) const {
        constexpr int QS = Five ? 48 : 16;
        // chunk j: nibble (j >> 1) & 1 of qs bytes 32 * ((j & 1) + 2 * (j >> 2)) ..
        const __m256i z = load256(p + QS + 32 * ((j & 1) + 2 * (j >> 2)));
        __m256i v = _mm256_and_si256((j >> 1) & 1 ? _mm256_srli_epi16(z, 4) : z, _mm256_set1_epi8(0x0F));
        if constexpr (Five) v = _mm256_or_si256(v, _mm256_and_si256(test_bit(qh, kSb[j]), _mm256_set1_epi8(0x10)));
        return v;
    }
    __m256i sc(int j) const { return _mm256_set1_epi16(scm[kSb[j]]); }
    void finish(__m256i I, const int16_t* kb, float kd, KAcc& A) const {
        const __m128i mins = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scm + 8))),
                                            _mm_loadu_si128(reinterpret_cast<const __m128i*>(kb)));
        const __m128 d = _mm_mul_ps(dd, _mm_set1_ps(kd));
        A.acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_broadcastss_ps(d), A.acc);
        A.accm = _mm256_fmadd_ps(_mm256_zextps128_ps256(_mm_cvtepi32_ps(mins)),
                                 _mm256_broadcastss_ps(_mm_movehdup_ps(d)), A.accm);
    }
};

// Q6_K: chunk j = 4h + t = elements 128h + 32t ..: nibble (t >> 1) of
// ql[64h + 32(t & 1) ..], bits 2t..2t+1 of qh[32h ..]; value u - 32.
struct KQ6 {
    static constexpr int BS = sizeof(block_q6_K);
    const uint8_t* p;
    alignas(32) int16_t s[16];
    __m256i s16;
    float d;
    explicit KQ6(const uint8_t* blk) : p(blk) {
        s16 = _mm256_cvtepi8_epi16(load128(p + 192));
        _mm256_store_si256(reinterpret_cast<__m256i*>(s), s16);
        d = f16(p + 208);
    }
    __m256i u(int j) const {
        const int h = j >> 2, t = j & 3;
        const __m256i ql = load256(p + 64 * h + 32 * (t & 1));
        const __m256i qh = load256(p + 128 + 32 * h);
        const __m256i lo = _mm256_and_si256(t >> 1 ? _mm256_srli_epi16(ql, 4) : ql, _mm256_set1_epi8(0x0F));
        __m256i hb;
        switch (t) {
            case 0: hb = _mm256_slli_epi16(qh, 4); break;
            case 1: hb = _mm256_slli_epi16(qh, 2); break;
            case 2: hb = qh; break;
            default: hb = _mm256_srli_epi16(qh, 2); break;
        }
        return _mm256_or_si256(lo, _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
    }
    __m256i sc(int j) const { return pair_scales(s, j); }
    void finish(__m256i I, const int16_t* kb, float kd, KAcc& A) const {
        const __m256i corr = _mm256_madd_epi16(s16, load256(kb));  // offset 32
        I = _mm256_sub_epi32(I, _mm256_slli_epi32(corr, 5));
        A.acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_set1_ps(d * kd), A.acc);
    }
};

// Q3_K: chunk j = 4h + t: bits 2t..2t+1 of qs[32h ..], plus 4 where bit 4h + t
// of hmask[l]; value u - 4; 6-bit scales - 32.
struct KQ3 {
    static constexpr int BS = sizeof(block_q3_K);
    const uint8_t* p;
    __m256i hm;
    alignas(32) int16_t s[16];
    __m256i s16;
    float d;
    explicit KQ3(const uint8_t* blk) : p(blk) {
        hm = load256(p);
        const uint8_t* q = p + 96;
        const uint64_t a8 = rd64(q);
        const uint32_t c = rd32(q + 8);
        const uint64_t hi_lo = (static_cast<uint64_t>((c >> 2) & 0x03030303u) << 32) | (c & 0x03030303u);
        const uint64_t hi_hi = (static_cast<uint64_t>((c >> 6) & 0x03030303u) << 32) | ((c >> 4) & 0x03030303u);
        const uint64_t s0 = (a8 & 0x0F0F0F0F0F0F0F0Full) | (hi_lo << 4);
        const uint64_t s1 = ((a8 >> 4) & 0x0F0F0F0F0F0F0F0Full) | (hi_hi << 4);
        s16 = _mm256_cvtepi8_epi16(
            _mm_sub_epi8(_mm_set_epi64x(static_cast<int64_t>(s1), static_cast<int64_t>(s0)), _mm_set1_epi8(32)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(s), s16);
        d = f16(p + 108);
    }
    __m256i u(int j) const {
        const int h = j >> 2, t = j & 3;
        const __m256i q = load256(p + 32 + 32 * h);
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q, 2 * t), _mm256_set1_epi8(3));
        return _mm256_or_si256(lo, _mm256_and_si256(test_bit(hm, 4 * h + t), _mm256_set1_epi8(4)));
    }
    __m256i sc(int j) const { return pair_scales(s, j); }
    void finish(__m256i I, const int16_t* kb, float kd, KAcc& A) const {
        const __m256i corr = _mm256_madd_epi16(s16, load256(kb));  // offset 4
        I = _mm256_sub_epi32(I, _mm256_slli_epi32(corr, 2));
        A.acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_set1_ps(d * kd), A.acc);
    }
};

// Q2_K: chunk j = 4h + t: bits 2t..2t+1 of qs[32h ..]; scales[s] = sc | m << 4.
struct KQ2 {
    static constexpr int BS = sizeof(block_q2_K);
    const uint8_t* p;
    alignas(32) int16_t s[16];
    __m256i m16;
    __m128 dd;
    explicit KQ2(const uint8_t* blk) : p(blk) {
        const __m128i raw = load128(p);
        const __m128i m4 = _mm_set1_epi8(0x0F);
        _mm256_store_si256(reinterpret_cast<__m256i*>(s), _mm256_cvtepu8_epi16(_mm_and_si128(raw, m4)));
        m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
        dd = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(rd32(p + 80))));
    }
    __m256i u(int j) const {
        const int h = j >> 2, t = j & 3;
        return _mm256_and_si256(_mm256_srli_epi16(load256(p + 16 + 32 * h), 2 * t), _mm256_set1_epi8(3));
    }
    __m256i sc(int j) const { return pair_scales(s, j); }
    void finish(__m256i I, const int16_t* kb, float kd, KAcc& A) const {
        const __m256i mins = _mm256_madd_epi16(m16, load256(kb));
        const __m128 d = _mm_mul_ps(dd, _mm_set1_ps(kd));
        A.acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_broadcastss_ps(d), A.acc);
        A.accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_broadcastss_ps(_mm_movehdup_ps(d)), A.accm);
    }
};

template <class T, int NC>
void gemv_k(int64_t K, const uint8_t* w, const GemvAct* act, float* y, size_t ldy) {
    KAcc acc[NC];
    for (int64_t i = 0; i < K / QK_K; ++i) {
        prefetch_span<T::BS>(w + i * T::BS + kGemvPrefetchBytes);
        const T blk(w + i * T::BS);
        __m256i I[NC];
#pragma GCC unroll 8
        for (int c = 0; c < NC; ++c) I[c] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
            const __m256i u = blk.u(j);
            const __m256i sc = blk.sc(j);
#pragma GCC unroll 8
            for (int c = 0; c < NC; ++c)
                I[c] = _mm256_add_epi32(
                    I[c], _mm256_madd_epi16(_mm256_maddubs_epi16(u, load256(act[c].a + 256 * i + 32 * j)), sc));
        }
#pragma GCC unroll 8
        for (int c = 0; c < NC; ++c) blk.finish(I[c], act[c].kb + 16 * i, act[c].kd[i], acc[c]);
    }
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) y[c * ldy] = hsum(acc[c].acc) - hsum(acc[c].accm);
}

// ============================================================ row dispatch (as gemv_avx512.cpp)

template <template <int> class F>
void rows(int64_t K, const uint8_t* w, size_t ldw, int nr, const GemvAct* act, int nc, float* y, size_t ldy) {
    const int rb = nc <= 4 ? nr : 16;
    for (int r0 = 0; r0 < nr; r0 += rb)
        for (int c0 = 0; c0 < nc; c0 += 4) {
            const int n = nc - c0 < 4 ? nc - c0 : 4;
            for (int r = r0; r < r0 + rb && r < nr; ++r) {
                const uint8_t* wr = w + r * ldw;
                float* yr = y + c0 * ldy + r;
                switch (n) {
                    case 1: F<1>::run(K, wr, act + c0, yr, ldy); break;
                    case 2: F<2>::run(K, wr, act + c0, yr, ldy); break;
                    case 3: F<3>::run(K, wr, act + c0, yr, ldy); break;
                    default: F<4>::run(K, wr, act + c0, yr, ldy); break;
                }
            }
        }
}

template <int BS, int MOFF, int QH, int QS, bool Fp4 = false>
struct L4K {
    template <int NC>
    struct F {
        static void run(int64_t K, const uint8_t* w, const GemvAct* a, float* y, size_t ldy) {
            gemv_l4<BS, MOFF, QH, QS, NC, Fp4>(K, w, a, y, ldy);
        }
    };
};
template <int NC>
struct Q8K {
    static void run(int64_t K, const uint8_t* w, const GemvAct* a, float* y, size_t ldy) {
        gemv_q8_0<NC>(K, w, a, y, ldy);
    }
};
template <class T>
struct KK {
    template <int NC>
    struct F {
        static void run(int64_t K, const uint8_t* w, const GemvAct* a, float* y, size_t ldy) {
            gemv_k<T, NC>(K, w, a, y, ldy);
        }
    };
};

}  // namespace

GemvFn gemv_for(DType t) {
    switch (t) {
        case DType::Q4_0: return rows<L4K<sizeof(block_q4_0), -1, -1, 2>::F>;
        case DType::Q4_1: return rows<L4K<sizeof(block_q4_1), 2, -1, 4>::F>;
        case DType::Q5_0: return rows<L4K<sizeof(block_q5_0), -1, 2, 6>::F>;
        case DType::Q5_1: return rows<L4K<sizeof(block_q5_1), 2, 4, 8>::F>;
        case DType::Q8_0: return rows<Q8K>;
        case DType::MXFP4: return rows<L4K<sizeof(block_mxfp4), -1, -1, offsetof(block_mxfp4, qs), true>::F>;
        case DType::Q2_K: return rows<KK<KQ2>::F>;
        case DType::Q3_K: return rows<KK<KQ3>::F>;
        case DType::Q4_K: return rows<KK<KQ45<false>>::F>;
        case DType::Q5_K: return rows<KK<KQ45<true>>::F>;
        case DType::Q6_K: return rows<KK<KQ6>::F>;
        default: return nullptr;
    }
}

}  // namespace quern::cpu::avx2
