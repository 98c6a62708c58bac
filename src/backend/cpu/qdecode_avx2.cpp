// AVX2 decode kernel: the AVX2 GEMM tile's arithmetic (qgemm_avx2.cpp) with
// weight rows, not activation rows, across the vector lanes, so that it runs
// at full vector width for any number of activation rows, one included.
//
// Per panel of kRows = 8 weight rows:
//   1. the type's unpacker (the GEMM's) writes u [8][K] bytes and D, Mn
//      [8][K/G] floats to an L1 buffer;
//   2. 8 x 8 dword transposes interleave them: ui [K/4][8 rows][4 bytes] (one
//      ymm = 4 consecutive k of all 8 rows), DT, MT [K/G][8 rows];
//   3. for every activation row c (columns of 16-wide panels a[K/4][16][4],
//      da/dsa [K/G][16], the GEMM's ActPanel format), per sub-block s:
//        acc = sum over k in s of u[r][k] * a[c][k]: vpmaddubsw (pairs of
//              products in int16, several k-steps added in int16 where the
//              type's largest u allows, as the tile does: exact) then
//              vpmaddwd by ones; signed u (Q8_0) as |u| and sign(a, u);
//        t   = float(acc) * da[s][c]
//        f   = fma(t, D[r][s], f)
//        f   = fma(dsa[s][c], Mn[r][s], f)
//      the tile's sequence of operations for the pair (r, c), so the result is
//      bit-identical to the GEMM tile whatever the number of rows and columns.
//      Up to 4 columns share each weight load.
// Bound by: the unpacking and transposes with few columns, maddubs/madd
// throughput with many. Alignment: none required; the work buffer is 64-byte
// aligned (decode_work_bytes).
#include <immintrin.h>

#include "backend/cpu/kernels.h"
#include "core/dtype.h"

namespace quern::cpu::avx2 {

namespace {

constexpr int kRows = 8;   // weight rows per panel (ymm lanes)
constexpr int kNCP = 16;   // activation columns per panel
constexpr int kCols = 4;   // activation columns per pass over the weights

inline int32_t rd32(const int8_t* p) {
    int32_t v;
    __builtin_memcpy(&v, p, 4);
    return v;
}
inline size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

// dst[8 * j + i] = src[i * ld + j] for 8 rows i and 8 dwords j (ld in bytes).
inline void transpose8(const uint8_t* src, size_t ld, uint8_t* dst) {
    __m256i r[8], t[8], s[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i * ld));
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
        t[2 * p] = _mm256_unpacklo_epi32(r[2 * p], r[2 * p + 1]);
        t[2 * p + 1] = _mm256_unpackhi_epi32(r[2 * p], r[2 * p + 1]);
    }
    // s[4q + m], 128-bit half L: rows 4q..4q+3 at dword 4L + m
#pragma GCC unroll 2
    for (int q = 0; q < 2; ++q) {
        s[4 * q + 0] = _mm256_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
        s[4 * q + 1] = _mm256_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
        s[4 * q + 2] = _mm256_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
        s[4 * q + 3] = _mm256_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
    }
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * m), _mm256_permute2x128_si256(s[m], s[4 + m], 0x20));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * (m + 4)),
                            _mm256_permute2x128_si256(s[m], s[4 + m], 0x31));
    }
}

// The work buffer: u [8][ldu], D and Mn [8][lds], then their interleaved
// copies ui [ldu/4][8][4], DT and MT [lds][8].
struct Work {
    size_t ldu, lds;
    uint8_t *u, *ui;
    float *D, *Mn, *DT, *MT;
    Work(int64_t K, int G, uint8_t* base) {
        ldu = round_up(static_cast<size_t>(K), 64);  // as the GEMM driver gives the unpackers
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
// interleaved panel of 8 weight rows; rows r < nr are stored to
// y[(c - c0) * ldy + r]. S: signed u; F: k-steps summed in int16 (as the tile).
template <int G, bool S, int F, int C>
void columns(int64_t nsub, const Work& wk, const ActPanel& act, int c0, float* y, size_t ldy, int nr) {
    static_assert((G / 4) % F == 0);
    const __m256i ones16 = _mm256_set1_epi16(1);
    __m256 f[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) f[c] = _mm256_setzero_ps();
    const uint8_t* wp = wk.ui;
    const int8_t* ap = act.a + 4 * c0;
    const float* da = act.da + c0;
    const float* dsa = act.dsa + c0;
    for (int64_t s = 0; s < nsub; ++s) {
        __m256i acc[C];
        if constexpr (F != G / 4) {
#pragma GCC unroll 4
            for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_si256();
        }
#pragma GCC unroll 8
        for (int k0 = 0; k0 < G / 4; k0 += F) {
            __m256i h[C];  // int16 pair sums over F steps
#pragma GCC unroll 8
            for (int kk = k0; kk < k0 + F; ++kk) {
                const __m256i Ws = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + 32 * kk));
                const __m256i W = S ? _mm256_sign_epi8(Ws, Ws) : Ws;
#pragma GCC unroll 4
                for (int c = 0; c < C; ++c) {
                    __m256i A = _mm256_set1_epi32(rd32(ap + (kk * kNCP + c) * 4));
                    if constexpr (S) A = _mm256_sign_epi8(A, Ws);
                    const __m256i p = _mm256_maddubs_epi16(W, A);
                    h[c] = kk == k0 ? p : _mm256_add_epi16(h[c], p);
                }
            }
#pragma GCC unroll 4
            for (int c = 0; c < C; ++c)
                acc[c] = F == G / 4 ? _mm256_madd_epi16(h[c], ones16)
                                    : _mm256_add_epi32(acc[c], _mm256_madd_epi16(h[c], ones16));
        }
        wp += 8 * G;
        ap += G * kNCP;
        const __m256 Dv = _mm256_loadu_ps(wk.DT + 8 * s);
        const __m256 Mv = _mm256_loadu_ps(wk.MT + 8 * s);
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
            const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[c]), _mm256_set1_ps(da[s * kNCP + c]));
            f[c] = _mm256_fmadd_ps(t, Dv, f[c]);
            f[c] = _mm256_fmadd_ps(_mm256_set1_ps(dsa[s * kNCP + c]), Mv, f[c]);
        }
    }
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i rm = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), lane);
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
        if (nr == kRows)
            _mm256_storeu_ps(y + c * ldy, f[c]);
        else
            _mm256_maskstore_ps(y + c * ldy, rm, f[c]);
    }
}

template <int G, bool S, int F>
void all_columns(int64_t nsub, const Work& wk, const ActPanel* panels, int nc, float* y, size_t ldy, int nr) {
    for (int c0 = 0; c0 < nc; c0 += kCols) {
        const ActPanel& p = panels[c0 / kNCP];
        const int off = c0 % kNCP;
        float* yc = y + c0 * ldy;
        switch (nc - c0 < kCols ? nc - c0 : kCols) {
            case 4: columns<G, S, F, 4>(nsub, wk, p, off, yc, ldy, nr); break;
            case 3: columns<G, S, F, 3>(nsub, wk, p, off, yc, ldy, nr); break;
            case 2: columns<G, S, F, 2>(nsub, wk, p, off, yc, ldy, nr); break;
            default: columns<G, S, F, 1>(nsub, wk, p, off, yc, ldy, nr); break;
        }
    }
}

// Prefetches `bytes` bytes from `next` (the next panel) in `parts` slices,
// slice i at call i, after one load per page (a software prefetch that misses
// the TLB is dropped).
struct Prefetcher {
    const uint8_t* next;
    size_t bytes;
    void fetch(size_t i, size_t parts) const {
        if (bytes == 0) return;
        if (i == 0) {
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

}  // namespace

size_t decode_work_bytes(int64_t K, int G) { return Work::bytes(K, G); }

void decode(int64_t K, DType type, UForm f, const uint8_t* w, size_t ldw, int nr, int next_rows,
            const ActPanel* panels, int nc, float* y, size_t ldy, uint8_t* work) {
    const int64_t nsub = K / f.G;
    const Work wk(K, f.G, work);
    // (up to the end of the last row's data: a strided view's gap after its
    // last row may be outside the allocation)
    const size_t next_bytes = next_rows > 0 ? (next_rows - 1) * ldw + row_size(type, K) : 0;
    const Prefetcher pf{w + kRows * ldw, next_bytes};
    // Rows nr..7 of the buffers hold stale data; their lanes are never stored.
    qkernels.unpack(type)(w, ldw, nr, K, wk.u, wk.ldu, wk.D, wk.Mn, wk.lds);
    const size_t chunks = wk.ldu / 32;
    for (size_t k = 0; k < wk.ldu; k += 32) {
        transpose8(wk.u + k, wk.ldu, wk.ui + 8 * k);
        pf.fetch(k / 32, chunks);
    }
    for (size_t s = 0; s < wk.lds; s += 8) {
        transpose8(reinterpret_cast<const uint8_t*>(wk.D + s), wk.lds * sizeof(float),
                   reinterpret_cast<uint8_t*>(wk.DT + 8 * s));
        transpose8(reinterpret_cast<const uint8_t*>(wk.Mn + s), wk.lds * sizeof(float),
                   reinterpret_cast<uint8_t*>(wk.MT + 8 * s));
    }
    // int16 accumulation span from the largest unsigned weight value, as the tile.
    const int span = f.signed_u ? 1 : 32767 / (2 * 127 * (f.umax > 0 ? f.umax : 255));
    if (f.signed_u)
        all_columns<32, true, 1>(nsub, wk, panels, nc, y, ldy, nr);
    else if (f.G == 16) {
        if (span >= 4)
            all_columns<16, false, 4>(nsub, wk, panels, nc, y, ldy, nr);
        else if (span >= 2)
            all_columns<16, false, 2>(nsub, wk, panels, nc, y, ldy, nr);
        else
            all_columns<16, false, 1>(nsub, wk, panels, nc, y, ldy, nr);
    } else {
        if (span >= 8)
            all_columns<32, false, 8>(nsub, wk, panels, nc, y, ldy, nr);
        else if (span >= 4)
            all_columns<32, false, 4>(nsub, wk, panels, nc, y, ldy, nr);
        else if (span >= 2)
            all_columns<32, false, 2>(nsub, wk, panels, nc, y, ldy, nr);
        else
            all_columns<32, false, 1>(nsub, wk, panels, nc, y, ldy, nr);
    }
}

}  // namespace quern::cpu::avx2
