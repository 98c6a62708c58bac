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

#include "backend/cpu/kernels.h"

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
// copies ui [ldu/4][16][4], DT and MT [lds][16].
struct Work {
    size_t ldu, lds;
    uint8_t *u, *ui;
    float *D, *Mn, *DT, *MT;
    Work(int64_t K, int G, uint8_t* base) {
        ldu = round_up(static_cast<size_t>(K), 64);
        lds = round_up(static_cast<size_t>(K / G), 16);
        u = base;
        ui = u + kRows * ldu;
        D = reinterpret_cast<float*>(ui + kRows * ldu);
        Mn = D + kRows * lds;
        DT = Mn + kRows * lds;
        MT = DT + kRows * lds;
    }
    static size_t bytes(int64_t K, int G) {
        return 2 * kRows * round_up(static_cast<size_t>(K), 64) +
               4 * kRows * round_up(static_cast<size_t>(K / G), 16) * sizeof(float);
    }
};

// Columns c0 .. c0 + C - 1 (C <= kCols) of one activation panel against the
// interleaved panel of 16 weight rows; rows where `rm` is set are stored to
// y[(c - c0) * ldy + r].
template <int G, int C>
void columns(int64_t nsub, const Work& wk, const ActPanel& act, int c0, float* y, size_t ldy, __mmask16 rm) {
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

}  // namespace

size_t decode_work_bytes(int64_t K, int G) { return Work::bytes(K, G); }

void decode(int64_t K, UForm f, UnpackFn unpack, const uint8_t* w, size_t ldw, int nr, const ActPanel* panels, int nc,
            float* y, size_t ldy, uint8_t* work) {
    const int64_t nsub = K / f.G;
    const Work wk(K, f.G, work);
    unpack(w, ldw, nr, K, wk.u, wk.ldu, wk.D, wk.Mn, wk.lds);
    // The next panel's weights (if the caller has one there: prefetches do not
    // fault) are fetched while this one is transposed and multiplied, so that
    // the memory stream does not stop for the arithmetic.
    const uint8_t* next = w + kRows * ldw;
    const size_t next_bytes = kRows * ldw;
    const size_t chunks = wk.ldu / 64;
    size_t pf = 0;
    // Rows nr..15 of the buffers hold stale data; their lanes are never stored.
    for (size_t k = 0; k < wk.ldu; k += 64) {
        transpose16(wk.u + k, wk.ldu, wk.ui + 16 * k);
        const size_t pf_end = next_bytes * (k / 64 + 1) / chunks;
        for (; pf < pf_end; pf += 64) _mm_prefetch(reinterpret_cast<const char*>(next + pf), _MM_HINT_T0);
    }
    for (size_t s = 0; s < wk.lds; s += 16) {
        transpose16(reinterpret_cast<const uint8_t*>(wk.D + s), wk.lds * sizeof(float),
                    reinterpret_cast<uint8_t*>(wk.DT + 16 * s));
        transpose16(reinterpret_cast<const uint8_t*>(wk.Mn + s), wk.lds * sizeof(float),
                    reinterpret_cast<uint8_t*>(wk.MT + 16 * s));
    }
    const __mmask16 rm = static_cast<__mmask16>((1u << nr) - 1);
    if (f.G == 32)
        all_columns<32>(nsub, wk, panels, nc, y, ldy, rm);
    else
        all_columns<16>(nsub, wk, panels, nc, y, ldy, rm);
}

}  // namespace quern::cpu::avx512
