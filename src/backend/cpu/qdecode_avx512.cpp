// AVX-512 VNNI decode kernel: the GEMM tile's arithmetic (qgemm_avx512.cpp)
// with weight rows, not activation rows, across the vector lanes, so that it
// runs at full vpdpbusd width for any number of activation rows, one included.
//
// Per panel of kRows = 16 weight rows:
//   1. the type's unpacker (the GEMM's) writes u [16][K] bytes and D, Mn
//      [16][K/G] floats to an L1 buffer;
//   2. 16 x 16 dword transposes interleave them: ui [K/4][16 rows][4 bytes]
//      (one zmm = 4 consecutive k of all 16 rows), DT, MT [K/G][16 rows];
//   3. for every activation row c (columns of 16-wide panels a[K/4][16][4],
//      da/dsa [K/G][16], the GEMM's ActPanel format), per sub-block s:
//        acc  = sum over k in s of u[r][k] * a[c][k]     (vpdpbusd, int32 exact,
//               the 4 activation bytes broadcast from memory)
//        t    = float(acc) * da[s][c]
//        f    = fma(t, D[r][s], f)
//        f    = fma(dsa[s][c], Mn[r][s], f)
//      which is the tile's sequence of operations for the pair (r, c), so the
//      result is bit-identical to the GEMM whatever the number of rows and
//      columns. Up to 8 columns share each weight load.
// Bound by: vpdpbusd throughput when there are many columns; the unpacking and
// the transposes (~2 passes over 16 x K bytes in L1) per panel when there are
// few. Alignment: none required (unaligned loads); the work buffer is 64-byte
// aligned (decode_work_bytes).
// GCC 12 reports false -Wuninitialized positives inside the AVX-512 intrinsics headers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "backend/cpu/kernels.h"
#include "core/dtype.h"
#include "quant/blocks.h"

namespace quern::cpu::avx512 {

namespace {

constexpr int kRows = 16;  // weight rows per panel (zmm lanes)
constexpr int kNCP = 16;   // activation columns per panel (pack_panel's unit)
constexpr int kCols = 8;   // activation columns per pass over the weights

inline int32_t rd32(const int8_t* p) {
    int32_t v;
    __builtin_memcpy(&v, p, 4);
    return v;
}
inline size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

// dst[16 * j + i] = src[i * ld + j] for 16 rows i and 16 dwords j (ld in
// bytes): four rounds of shuffles (32-bit, 64-bit, 128-bit twice).
inline void transpose16(const uint8_t* src, size_t ld, uint8_t* dst) {
    __m512i r[16], a[16], b[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * ld);
#pragma GCC unroll 8
    for (int p = 0; p < 8; ++p) {
        a[2 * p] = _mm512_unpacklo_epi32(r[2 * p], r[2 * p + 1]);
        a[2 * p + 1] = _mm512_unpackhi_epi32(r[2 * p], r[2 * p + 1]);
    }
    // b[4q + m], 128-bit lane L: rows 4q..4q+3 at dword 4L + m
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
        b[4 * q + 0] = _mm512_unpacklo_epi64(a[4 * q], a[4 * q + 2]);
        b[4 * q + 1] = _mm512_unpackhi_epi64(a[4 * q], a[4 * q + 2]);
        b[4 * q + 2] = _mm512_unpacklo_epi64(a[4 * q + 1], a[4 * q + 3]);
        b[4 * q + 3] = _mm512_unpackhi_epi64(a[4 * q + 1], a[4 * q + 3]);
    }
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) {
        const __m512i c0 = _mm512_shuffle_i32x4(b[m], b[4 + m], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512i c1 = _mm512_shuffle_i32x4(b[m], b[4 + m], _MM_SHUFFLE(3, 2, 3, 2));
        const __m512i c2 = _mm512_shuffle_i32x4(b[8 + m], b[12 + m], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512i c3 = _mm512_shuffle_i32x4(b[8 + m], b[12 + m], _MM_SHUFFLE(3, 2, 3, 2));
        _mm512_storeu_si512(dst + 64 * (0 + m), _mm512_shuffle_i32x4(c0, c2, _MM_SHUFFLE(2, 0, 2, 0)));
        _mm512_storeu_si512(dst + 64 * (4 + m), _mm512_shuffle_i32x4(c0, c2, _MM_SHUFFLE(3, 1, 3, 1)));
        _mm512_storeu_si512(dst + 64 * (8 + m), _mm512_shuffle_i32x4(c1, c3, _MM_SHUFFLE(2, 0, 2, 0)));
        _mm512_storeu_si512(dst + 64 * (12 + m), _mm512_shuffle_i32x4(c1, c3, _MM_SHUFFLE(3, 1, 3, 1)));
    }
}

// The work buffer: u [16][ldu], D and Mn [16][lds], then their interleaved
// copies ui [ldu/4][16][4], DT and MT [lds][16]. The direct loaders copy the
// raw blocks of the panel where u is (room for up to 34 bytes per 32 elements)
// and do not use D and Mn: an L1-sized footprint either way.
struct Work {
    size_t ldu, lds;
    uint8_t *u, *ui, *raw;
    float *D, *Mn, *DT, *MT;
    static size_t u_bytes(int64_t K) {
        return kRows * std::max(round_up(static_cast<size_t>(K), 64), round_up(static_cast<size_t>(K / 32 * 34), 64));
    }
    Work(int64_t K, int G, uint8_t* base) {
        ldu = round_up(static_cast<size_t>(K), 64);
        lds = round_up(static_cast<size_t>(K / G), 16);
        u = raw = base;
        ui = u + u_bytes(K);
        D = reinterpret_cast<float*>(ui + kRows * ldu);
        Mn = D + kRows * lds;
        DT = Mn + kRows * lds;
        MT = DT + kRows * lds;
    }
    static size_t bytes(int64_t K, int G) {
        return u_bytes(K) + kRows * round_up(static_cast<size_t>(K), 64) +
               4 * kRows * round_up(static_cast<size_t>(K / G), 16) * sizeof(float);
    }
};

// Columns c0 .. c0 + C - 1 (C <= kCols) of one activation panel against the
// interleaved panel of 16 weight rows; rows where `rm` is set are stored to
// y[(c - c0) * ldy + r].
template <int G, int C>
__attribute__((noinline)) void columns(int64_t nsub, const Work& wk, const ActPanel& act, int c0, float* y, size_t ldy, __mmask16 rm) {
    __m512 f[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) f[c] = _mm512_setzero_ps();
    const uint8_t* wp = wk.ui;
    const int8_t* ap = act.a + 4 * c0;
    const float* da = act.da + c0;
    const float* dsa = act.dsa + c0;
    for (int64_t s = 0; s < nsub; ++s) {
        __m512i acc[C];
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int kk = 0; kk < G / 4; ++kk) {
            const __m512i W = _mm512_loadu_si512(wp + 64 * kk);
#pragma GCC unroll 8
            for (int c = 0; c < C; ++c)
                acc[c] = _mm512_dpbusd_epi32(acc[c], W, _mm512_set1_epi32(rd32(ap + (kk * kNCP + c) * 4)));
        }
        wp += 16 * G;
        ap += G * kNCP;
        const __m512 Dv = _mm512_loadu_ps(wk.DT + 16 * s);
        const __m512 Mv = _mm512_loadu_ps(wk.MT + 16 * s);
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
            const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[c]), _mm512_set1_ps(da[s * kNCP + c]));
            f[c] = _mm512_fmadd_ps(t, Dv, f[c]);
            f[c] = _mm512_fmadd_ps(_mm512_set1_ps(dsa[s * kNCP + c]), Mv, f[c]);
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) _mm512_mask_storeu_ps(y + c * ldy, rm, f[c]);
}

template <int G>
void all_columns(int64_t nsub, const Work& wk, const ActPanel* panels, int nc, float* y, size_t ldy, __mmask16 rm) {
    for (int c0 = 0; c0 < nc; c0 += kCols) {
        const ActPanel& p = panels[c0 / kNCP];
        const int off = c0 % kNCP;
        float* yc = y + c0 * ldy;
        switch (nc - c0 < kCols ? nc - c0 : kCols) {
            case 8: columns<G, 8>(nsub, wk, p, off, yc, ldy, rm); break;
            case 7: columns<G, 7>(nsub, wk, p, off, yc, ldy, rm); break;
            case 6: columns<G, 6>(nsub, wk, p, off, yc, ldy, rm); break;
            case 5: columns<G, 5>(nsub, wk, p, off, yc, ldy, rm); break;
            case 4: columns<G, 4>(nsub, wk, p, off, yc, ldy, rm); break;
            case 3: columns<G, 3>(nsub, wk, p, off, yc, ldy, rm); break;
            case 2: columns<G, 2>(nsub, wk, p, off, yc, ldy, rm); break;
            default: columns<G, 1>(nsub, wk, p, off, yc, ldy, rm); break;
        }
    }
}

// Prefetches `bytes` bytes from `next` (the next panel) in `parts` slices,
// slice i at call i.
struct Prefetcher {
    const uint8_t* next;
    size_t bytes;
    void fetch(size_t i, size_t parts) const {
        if (bytes == 0) return;
        if (i == 0) {  // a load per page first: prefetches that miss the TLB are dropped
            uint8_t t = 0;
            for (size_t p = 0; p < bytes; p += 4096) t |= *reinterpret_cast<const volatile uint8_t*>(next + p);
            t |= *reinterpret_cast<const volatile uint8_t*>(next + bytes - 1);
            sink = t;
        }
        for (size_t p = bytes * i / parts & ~size_t(63); p < bytes * (i + 1) / parts; p += 64)
            _mm_prefetch(reinterpret_cast<const char*>(next + p), _MM_HINT_T0);
    }
    static inline thread_local uint8_t sink = 0;
};

// ---------------------------------------------------------------- direct loaders
// The 32-element block types go from their blocks straight to the interleaved
// form, 16 rows at a time, with the values the unpackers (unpack_avx512.cpp)
// give: u = nibble (+ 16 for the fifth bit), q + 128 or MXFP4's kMxfp4U[code],
// D = d * 1, Mn = m * 1 or d * -bias (the same float multiplications).

// The fp16 value in the low (Hi = false) or high half of each 32-bit lane, times mul.
template <bool Hi>
inline __m512 f16_lanes(__m512i g, float mul) {
    if constexpr (Hi) g = _mm512_srli_epi32(g, 16);
    return _mm512_mul_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)), _mm512_set1_ps(mul));
}

// What a direct loader does with each block (32 elements = one sub-block) of
// the 16 rows: u[g] holds elements 4g..4g+3 of every row, D and Mn the rows'
// scale and offset.
//   StoreSink: keeps them in the work buffer for `columns` (any number of
//     activation rows);
//   MulSink<C>: multiplies them at once by the first C <= kCols columns of an
//     activation panel, with `columns`' operations in `columns`' order, so a
//     call with few activation rows never writes the interleaved panel.
struct StoreSink {
    const Work& wk;
    void block(int64_t b, const __m512i (&u)[8], __m512 D, __m512 Mn) {
        uint8_t* dst = wk.ui + b * 8 * 64;
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) _mm512_storeu_si512(dst + 64 * g, u[g]);
        _mm512_storeu_ps(wk.DT + 16 * b, D);
        _mm512_storeu_ps(wk.MT + 16 * b, Mn);
    }
    void finish() {}
};

template <int C>
struct MulSink {
    const ActPanel& act;
    float* y;
    size_t ldy;
    __mmask16 rm;
    __m512 f[C];
    MulSink(const ActPanel& a, float* y_, size_t ldy_, __mmask16 rm_) : act(a), y(y_), ldy(ldy_), rm(rm_) {
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) f[c] = _mm512_setzero_ps();
    }
    void block(int64_t s, const __m512i (&u)[8], __m512 Dv, __m512 Mv) {
        const int8_t* ap = act.a + s * 32 * kNCP;
        __m512i acc[C];
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int kk = 0; kk < 8; ++kk)
#pragma GCC unroll 8
            for (int c = 0; c < C; ++c)
                acc[c] = _mm512_dpbusd_epi32(acc[c], u[kk], _mm512_set1_epi32(rd32(ap + (kk * kNCP + c) * 4)));
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
            const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[c]), _mm512_set1_ps(act.da[s * kNCP + c]));
            f[c] = _mm512_fmadd_ps(t, Dv, f[c]);
            f[c] = _mm512_fmadd_ps(_mm512_set1_ps(act.dsa[s * kNCP + c]), Mv, f[c]);
        }
    }
    void finish() {
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) _mm512_mask_storeu_ps(y + c * ldy, rm, f[c]);
    }
};

// Q4_0 / Q4_1 / Q5_0 / Q5_1 (template parameters as unpack_legacy's): per
// block, the 16 rows' 16 bytes of nibbles become four vectors of one dword per
// row (a 4 x 4 dword transpose in each 128-bit lane, then of the lanes); low
// nibbles are elements 0-15, high nibbles 16-31; Q5 adds bit j of qh as 16.
// Fp4 (MXFP4): the nibbles are E2M1 codes, u = kMxfp4U[code], and byte 0 is
// the exponent e: D = 2^(e - 128), Mn = D * -12, as unpack_mxfp4 gives them.
template <int BS, int DOFF, int MOFF, int QS, int QH, int BIAS, bool Fp4, class Sink>
__attribute__((noinline)) void load_legacy(const uint8_t* w, size_t ldw, __m512i idx, int64_t K, Sink& sink,
                                           const Prefetcher& pf) {
    const int64_t nb = K / 32;
    const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4U)));
    // bit i of a 4-bit index -> 16 in byte i
    const __m512i spread = _mm512_setr_epi32(0x00000000, 0x00000010, 0x00001000, 0x00001010, 0x00100000,
                                             0x00100010, 0x00101000, 0x00101010, 0x10000000, 0x10000010,
                                             0x10001000, 0x10001010, 0x10100000, 0x10100010, 0x10101000, 0x10101010);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = w + b * BS + QS;
        auto ld = [&](int r) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + r * ldw)); };
        __m512i W[4];
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) {
            __m512i z = _mm512_castsi128_si512(ld(4 * q));
            z = _mm512_inserti32x4(z, ld(4 * q + 1), 1);
            z = _mm512_inserti32x4(z, ld(4 * q + 2), 2);
            z = _mm512_inserti32x4(z, ld(4 * q + 3), 3);
            W[q] = _mm512_permutexvar_epi32(perm, z);  // lane m: dword m of rows 4q..4q+3
        }
        const __m512i c0 = _mm512_shuffle_i32x4(W[0], W[1], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512i c1 = _mm512_shuffle_i32x4(W[0], W[1], _MM_SHUFFLE(3, 2, 3, 2));
        const __m512i c2 = _mm512_shuffle_i32x4(W[2], W[3], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512i c3 = _mm512_shuffle_i32x4(W[2], W[3], _MM_SHUFFLE(3, 2, 3, 2));
        const __m512i V[4] = {_mm512_shuffle_i32x4(c0, c2, _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_i32x4(c0, c2, _MM_SHUFFLE(3, 1, 3, 1)),
                              _mm512_shuffle_i32x4(c1, c3, _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_i32x4(c1, c3, _MM_SHUFFLE(3, 1, 3, 1))};  // dword m of every row
        __m512i H = _mm512_setzero_si512();
        if constexpr (QH >= 0) H = _mm512_i32gather_epi32(idx, w + b * BS + QH, 1);
        __m512i u[8];
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) {
            u[g] = g < 4 ? _mm512_and_si512(V[g], m4) : _mm512_and_si512(_mm512_srli_epi16(V[g - 4], 4), m4);
            if constexpr (Fp4) u[g] = _mm512_shuffle_epi8(lut, u[g]);
            if constexpr (QH >= 0)
                u[g] = _mm512_or_si512(u[g], _mm512_permutexvar_epi32(_mm512_and_si512(_mm512_srli_epi32(H, 4 * g),
                                                                                       _mm512_set1_epi32(15)),
                                                                      spread));
        }
        // d (and m right after it) of the 16 rows, or their exponents: one gather
        static_assert(DOFF == 0 && (MOFF < 0 || MOFF == 2));
        const __m512i dm = _mm512_i32gather_epi32(idx, w + b * BS, 1);
        if constexpr (Fp4) {
            const __m512 D = mxfp4_half_scale_ps(_mm512_and_si512(dm, _mm512_set1_epi32(0xFF)));
            sink.block(b, u, D, _mm512_mul_ps(D, _mm512_set1_ps(-static_cast<float>(BIAS))));
        } else {
            sink.block(b, u, f16_lanes<false>(dm, 1.0f),
                       MOFF >= 0 ? f16_lanes<true>(dm, 1.0f) : f16_lanes<false>(dm, -static_cast<float>(BIAS)));
        }
        pf.fetch(static_cast<size_t>(b), static_cast<size_t>(nb));
    }
    sink.finish();
}

// Q8_0: per block, the 16 rows' 32 bytes become eight vectors of one dword
// per row (a 16 x 8 dword transpose), u = q ^ 0x80.
template <class Sink>
__attribute__((noinline)) void load_q8_0(const uint8_t* w, size_t ldw, __m512i idx, int64_t K, Sink& sink,
                                         const Prefetcher& pf) {
    constexpr int BS = 34;
    const int64_t nb = K / 32;
    const __m512i x80 = _mm512_set1_epi8(static_cast<char>(0x80));
    const __m512i idx_lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i idx_hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = w + b * BS + 2;
        auto ld = [&](int r) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + r * ldw)); };
        __m512i R[8];
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) R[c] = _mm512_inserti64x4(_mm512_castsi256_si512(ld(c)), ld(c + 8), 1);
        __m512i t[8], s8[8];
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
            t[2 * i] = _mm512_unpacklo_epi32(R[2 * i], R[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_epi32(R[2 * i], R[2 * i + 1]);
        }
#pragma GCC unroll 2
        for (int i = 0; i < 2; ++i) {
            s8[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
            s8[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
            s8[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
            s8[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
        }
        __m512i u[8];
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
            u[j] = _mm512_xor_si512(_mm512_permutex2var_epi64(s8[j], idx_lo, s8[4 + j]), x80);
            u[j + 4] = _mm512_xor_si512(_mm512_permutex2var_epi64(s8[j], idx_hi, s8[4 + j]), x80);
        }
        const __m512i d = _mm512_i32gather_epi32(idx, w + b * BS, 1);
        sink.block(b, u, f16_lanes<false>(d, 1.0f), f16_lanes<false>(d, -128.0f));
        pf.fetch(static_cast<size_t>(b), static_cast<size_t>(nb));
    }
    sink.finish();
}

// n bytes, 64 at a time, then the tail.
inline void copy_bytes(uint8_t* dst, const uint8_t* src, size_t n) {
    size_t i = 0;
    for (; i + 64 <= n; i += 64) _mm512_storeu_si512(dst + i, _mm512_loadu_si512(src + i));
    if (i < n) {
        const __mmask64 m = _bzhi_u64(~0ull, static_cast<unsigned>(n - i));
        _mm512_mask_storeu_epi8(dst + i, m, _mm512_maskz_loadu_epi8(m, src + i));
    }
}

template <class Sink>
void load_type(DType type, const uint8_t* w, size_t ldw, __m512i idx, int64_t K, Sink& sink, const Prefetcher& pf) {
    switch (type) {
        case DType::Q4_0: load_legacy<18, 0, -1, 2, -1, 8, false>(w, ldw, idx, K, sink, pf); break;
        case DType::Q4_1: load_legacy<20, 0, 2, 4, -1, 0, false>(w, ldw, idx, K, sink, pf); break;
        case DType::Q5_0: load_legacy<22, 0, -1, 6, 2, 16, false>(w, ldw, idx, K, sink, pf); break;
        case DType::Q5_1: load_legacy<24, 0, 2, 8, 4, 0, false>(w, ldw, idx, K, sink, pf); break;
        case DType::MXFP4: load_legacy<17, 0, -1, 1, -1, 12, true>(w, ldw, idx, K, sink, pf); break;
        default: load_q8_0(w, ldw, idx, K, sink, pf); break;
    }
}

// The direct path for the 32-element block types (false for the others).
// A whole panel of contiguous rows is read in place (the read-ahead of the
// previous panel has brought it in: the loaders read the 16 rows side by side,
// which the hardware prefetchers do not follow); other panels are first
// copied to the work buffer with rows nr..15 as copies of row 0. Up to kCols
// activation rows are multiplied as the blocks are unpacked (MulSink); more go
// through the work buffer and `columns`.
bool decode_direct(DType type, const uint8_t* w, size_t ldw, int nr, int64_t K, const Work& wk, const Prefetcher& pf,
                   const ActPanel* panels, int nc, float* y, size_t ldy, __mmask16 rm) {
    const int BS = type == DType::Q4_0   ? 18
                   : type == DType::Q4_1 ? 20
                   : type == DType::Q5_0 ? 22
                   : type == DType::Q5_1 ? 24
                   : type == DType::Q8_0 ? 34
                   : type == DType::MXFP4 ? 17
                                         : 0;
    if (BS == 0) return false;
    const size_t rb = static_cast<size_t>(K / 32 * BS);
    const uint8_t* src = wk.raw;
    if (ldw == rb && nr == kRows) {
        src = w;
    } else {
        for (int r = 0; r < kRows; ++r) copy_bytes(wk.raw + r * rb, w + (r < nr ? r : 0) * ldw, rb);
    }
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(static_cast<int32_t>(rb)));
    auto mul = [&](auto c) {
        MulSink<decltype(c)::value> sink(panels[0], y, ldy, rm);
        load_type(type, src, rb, idx, K, sink, pf);
    };
    switch (nc) {
        case 1: mul(std::integral_constant<int, 1>{}); break;
        case 2: mul(std::integral_constant<int, 2>{}); break;
        case 3: mul(std::integral_constant<int, 3>{}); break;
        case 4: mul(std::integral_constant<int, 4>{}); break;
        case 5: mul(std::integral_constant<int, 5>{}); break;
        case 6: mul(std::integral_constant<int, 6>{}); break;
        case 7: mul(std::integral_constant<int, 7>{}); break;
        case 8: mul(std::integral_constant<int, 8>{}); break;
        default: {
            StoreSink sink{wk};
            load_type(type, src, rb, idx, K, sink, pf);
            all_columns<32>(K / 32, wk, panels, nc, y, ldy, rm);
        }
    }
    return true;
}

}  // namespace

size_t decode_work_bytes(int64_t K, int G) { return Work::bytes(K, G); }

void decode(int64_t K, DType type, UForm f, const uint8_t* w, size_t ldw, int nr, int next_rows,
            const ActPanel* panels, int nc, float* y, size_t ldy, uint8_t* work) {
    const int64_t nsub = K / f.G;
    const Work wk(K, f.G, work);
    // The next rows' weights are fetched while this panel is unpacked and
    // multiplied, so that the memory stream does not stop for the arithmetic.
    // (up to the end of the last row's data: a strided view's gap after its
    // last row may be outside the allocation)
    const size_t next_bytes = next_rows > 0 ? (next_rows - 1) * ldw + row_size(type, K) : 0;
    const Prefetcher pf{w + kRows * ldw, next_bytes};
    // Rows nr..15 of the buffers hold stale data or copies of row 0; their
    // lanes are never stored.
    const __mmask16 rm = static_cast<__mmask16>((1u << nr) - 1);
    if (decode_direct(type, w, ldw, nr, K, wk, pf, panels, nc, y, ldy, rm)) return;
    {
        qkernels.unpack(type)(w, ldw, nr, K, wk.u, wk.ldu, wk.D, wk.Mn, wk.lds);
        const size_t chunks = wk.ldu / 64;
        for (size_t k = 0; k < wk.ldu; k += 64) {
            transpose16(wk.u + k, wk.ldu, wk.ui + 16 * k);
            pf.fetch(k / 64, chunks);
        }
        for (size_t s = 0; s < wk.lds; s += 16) {
            transpose16(reinterpret_cast<const uint8_t*>(wk.D + s), wk.lds * sizeof(float),
                        reinterpret_cast<uint8_t*>(wk.DT + 16 * s));
            transpose16(reinterpret_cast<const uint8_t*>(wk.Mn + s), wk.lds * sizeof(float),
                        reinterpret_cast<uint8_t*>(wk.MT + 16 * s));
        }
    }
    if (f.G == 32)
        all_columns<32>(nsub, wk, panels, nc, y, ldy, rm);
    else
        all_columns<16>(nsub, wk, panels, nc, y, ldy, rm);
}

}  // namespace quern::cpu::avx512
