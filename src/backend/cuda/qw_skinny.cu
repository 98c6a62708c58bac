// qw_gemm's skinny kernel: products of 1-64 activation rows (the decode
// steps of a batch of sequences) on the resident Q4_K / Q6_K layout, where
// reading the weights bounds the product. API, choice and numerics:
// qw_gemm.h.
//
// The tiled kernel (qw_gemm.cu) stages the weights in shared memory and
// multiplies at least 32 activation rows per wgmma; below ~64 rows it issues
// more instructions per weight than the weights take to arrive. Here each
// warp streams its 16 weight rows straight into registers (16-byte loads, a
// super-block ahead) and multiplies them with mma.sync.m16n8k16, whose
// token tile is 8 rows: only the block's activations pass through shared
// memory, staged once per chunk of K for all eight warps.
//
// K order: lane L = 4g + c of a warp decodes, for rows g and g+8 of its tile,
// the whole sub-blocks c and 4+c of each super-block (one 16-byte load each,
// so a quad reads a row's 128 quant bytes of the super-block at once). An mma
// step pairs the mma's k positions of lane c with four elements of lane c's
// own sub-block — elements 4w, 4w+1 (k = 2c, 2c+1) and 4w+2, 4w+3 (k = 2c+8,
// 2c+9) of word w's low nibbles, or the same of its high nibbles (+16) — and
// the activations' B fragments take the same elements, which sit next to
// each other in a token's BF16 row. The sum over k is a sum over the same
// K elements in another order, and each sub-block keeps its own scale,
// applied when its weights are formed in BF16 (bq_common.cuh's affine).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/bq_common.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/qw_common.cuh"

namespace quern::cuda {
namespace {

using deq::DeqArgs;
using kern::ldw16;  // weights: read once, not kept in L1 (the activations are)
using kern::ldw2;
using kern::ldw8;
using mma::cp_async16;
using mma::cp_async_commit;
using mma::cp_async_wait;

constexpr int64_t kSkRows = kTile * kWarps;  // weight rows per block: one 16-row tile per warp

// Shared memory of a block multiplying 8·NT activation rows: two buffers of
// a chunk of K (kCh super-blocks of BF16, 512 bytes each per row) for every
// row, rows 16 bytes longer than the data so that a k step's reads of eight
// lanes (two tokens × four sub-blocks) fall in different banks together
// with the unit swizzle of stage(); bq_finish reuses the space.
template <int NT>
struct SkShape {
    static constexpr int kTok = 8 * NT;
    static constexpr int kCh = 8 / NT;
    static constexpr int kStride = kCh * 512 + 16;
    static constexpr int kBuf = kTok * kStride;
    static constexpr int kRed = NT * 4 * kThreads * 4;
    static constexpr int kSmem = 2 * kBuf > kRed ? 2 * kBuf : kRed;
};

// The four BF16 pairs 128 + q of word w of a sub-block's 16 quant bytes
// (byte i: element i in the low nibble, 16 + i in the high one): p[0] =
// elements 4w, 4w+1; p[1] = 4w+2, 4w+3; p[2], p[3] the same + 16.
__device__ __forceinline__ void nibble_pairs(uint32_t w, uint32_t (&p)[4]) {
    const uint32_t t01 = __byte_perm(w, 0, 0x4140u), t23 = __byte_perm(w, 0, 0x4342u);
    p[0] = and_or(t01, 0x000F000Fu, 0x43004300u);
    p[1] = and_or(t23, 0x000F000Fu, 0x43004300u);
    p[2] = and_or(t01 >> 4, 0x000F000Fu, 0x43004300u);
    p[3] = and_or(t23 >> 4, 0x000F000Fu, 0x43004300u);
}

// One super-block of a lane's weights (rows g and g+8 of the warp's tile,
// sub-blocks c and 4+c), loaded a super-block ahead of its use; form()
// makes the A fragments of words 2u, 2u+1 of sub-block 4·hh + c:
// a[ww][0] for the low nibbles of word 2u+ww, a[ww][1] for the high ones.
template <DType T>
struct SkWeights;

// The 4-bit quants both types keep in the same layout (Q6_K's low nibbles):
// sub-blocks c and 4+c of rows g, g+8.
struct SkQuants {
    uint4 q[2][2];  // [row][hh]
    __device__ __forceinline__ void load_quants(const DeqArgs& a, int r, int64_t row, int64_t sb, int c) {
        const uint8_t* p = a.q + row * (a.K / 2) + sb * 128 + 16 * c;
        q[r][0] = ldw16(p);
        q[r][1] = ldw16(p + 64);
    }
    // nibble_pairs of word 2u + ww of row r's sub-block hh.
    __device__ __forceinline__ void pairs(int r, int hh, int u, int ww, uint32_t (&p)[4]) const {
        const uint4 v = q[r][hh];
        nibble_pairs(u == 0 ? (ww == 0 ? v.x : v.y) : (ww == 0 ? v.z : v.w), p);
    }
};

template <>
struct SkWeights<DType::Q4_K> : SkQuants {
    uint4 head[2];  // [row]: fp16 d, dmin, the packed scales and mins (weights.h)
    __device__ __forceinline__ void load(const DeqArgs& a, const int64_t (&row)[2], int64_t sb, int c) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            load_quants(a, r, row[r], sb, c);
            head[r] = ldw16(a.s + (row[r] * (a.K / 256) + sb) * 16);
        }
    }
    struct Group {
        __nv_bfloat162 s[2], o[2], c[2];
    };
    __device__ __forceinline__ Group group(int hh, int c) const {
        Group gr;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint4 h = head[r];
            const float2 dm = __half22float2(*reinterpret_cast<const __half2*>(&h.x));
            const uint32_t sc = ((hh ? h.z : h.y) >> (8 * c)) & 0xFFu;
            const uint32_t mv = (sc >> 6) | (((h.w >> (4 * (4 * hh + c))) & 0xFu) << 2);
            uint32_t c16;
            const uint32_t so =
                so_pair<true>(dm.x * static_cast<float>(sc & 63u), -dm.y * static_cast<float>(mv), 15, 1, c16);
            gr.s[r] = as_bf2(__byte_perm(so, 0, 0x1010u));
            gr.o[r] = as_bf2(__byte_perm(so, 0, 0x3232u));
            gr.c[r] = as_bf2(c16 | c16 << 16);
        }
        return gr;
    }
    __device__ __forceinline__ void form(const Group& gr, int hh, int u, uint32_t (&a)[2][2][4]) const {
#pragma unroll
        for (int ww = 0; ww < 2; ++ww) {
            uint32_t p[2][4];
#pragma unroll
            for (int r = 0; r < 2; ++r) pairs(r, hh, u, ww, p[r]);
#pragma unroll
            for (int hi = 0; hi < 2; ++hi)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    a[ww][hi][r] = affine(p[r][2 * hi], gr.c[r], gr.s[r], gr.o[r]);
                    a[ww][hi][2 + r] = affine(p[r][2 * hi + 1], gr.c[r], gr.s[r], gr.o[r]);
                }
        }
    }
};

// Q6_K: value = d·sc·(q − 32), q = low nibble | two high bits << 4, one
// int8 scale per 16 elements (a sub-block's low nibbles take scale 2j, its
// high nibbles 2j+1).
template <>
struct SkWeights<DType::Q6_K> : SkQuants {
    uint2 qh[2][2];  // [row][hh]: high bits, word 0 of elements 0..15, word 1 of 16..31
    uint4 sc[2];     // [row]: the super-block's sixteen int8 scales
    uint32_t d[2];   // [row]: fp16 d
    __device__ __forceinline__ void load(const DeqArgs& a, const int64_t (&row)[2], int64_t sb, int c) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            load_quants(a, r, row[r], sb, c);
            const uint8_t* h = a.q2 + row[r] * (a.K / 4) + sb * 64 + 8 * c;
            qh[r][0] = ldw8(h);
            qh[r][1] = ldw8(h + 32);
            sc[r] = ldw16(a.s + row[r] * (a.K / 16) + sb * 16);
            d[r] = ldw2(a.s2 + (row[r] * (a.K / 256) + sb) * 2);
        }
    }
    struct Group {
        __nv_bfloat162 s[2][2];  // [row][low, high nibbles]
    };
    __device__ __forceinline__ Group group(int hh, int c) const {
        Group gr;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint4 v = sc[r];
            const uint32_t w = (hh ? ((c >> 1) ? v.w : v.z) : ((c >> 1) ? v.y : v.x)) >> (16 * (c & 1));
            const float dd = __half2float(__ushort_as_half(static_cast<unsigned short>(d[r])));
            gr.s[r][0] = __float2bfloat162_rn(dd * static_cast<float>(static_cast<int8_t>(w & 0xFFu)));
            gr.s[r][1] = __float2bfloat162_rn(dd * static_cast<float>(static_cast<int8_t>((w >> 8) & 0xFFu)));
        }
        return gr;
    }
    __device__ __forceinline__ void form(const Group& gr, int hh, int u, uint32_t (&a)[2][2][4]) const {
        const __nv_bfloat162 zero = as_bf2(0u), centre = as_bf2(0x43204320u);  // 128 + 32
#pragma unroll
        for (int ww = 0; ww < 2; ++ww) {
            const int wi = 2 * u + ww;
            uint32_t p[2][4];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                pairs(r, hh, u, ww, p[r]);
                // High bits of element 16h + 4wi + k: word h, byte k, bits 2wi, 2wi+1.
                const uint32_t lo = (qh[r][hh].x >> (2 * wi)) & 0x03030303u;
                const uint32_t hi = (qh[r][hh].y >> (2 * wi)) & 0x03030303u;
                p[r][0] |= __byte_perm(lo, 0, 0x4140u) << 4;
                p[r][1] |= __byte_perm(lo, 0, 0x4342u) << 4;
                p[r][2] |= __byte_perm(hi, 0, 0x4140u) << 4;
                p[r][3] |= __byte_perm(hi, 0, 0x4342u) << 4;
            }
#pragma unroll
            for (int hi = 0; hi < 2; ++hi)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    a[ww][hi][r] = affine(p[r][2 * hi], centre, gr.s[r][hi], zero);
                    a[ww][hi][2 + r] = affine(p[r][2 * hi + 1], centre, gr.s[r][hi], zero);
                }
        }
    }
};

// One super-block of a lane's weights times the staged activations: xs at
// token g's row of the chunk, sub-block c of the super-block; sw: the unit
// swizzle of this lane's sub-blocks (stage()).
template <int NT, int kStride, DType T>
__device__ __forceinline__ void multiply(const SkWeights<T>& w, const uint8_t* xs, int c, int sw,
                                         float (&acc)[NT][4]) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const auto gr = w.group(hh, c);
        const uint8_t* const xh = xs + hh * 256;
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            uint32_t af[2][2][4];
            w.form(gr, hh, u, af);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const uint8_t* const xr = xh + nt * 8 * kStride;
                const uint4 lo = *reinterpret_cast<const uint4*>(xr + ((u ^ sw) << 4));
                const uint4 hi = *reinterpret_cast<const uint4*>(xr + (((u + 2) ^ sw) << 4));
                mma::mma_bf16(acc[nt], af[0][0], lo.x, lo.y);
                mma::mma_bf16(acc[nt], af[1][0], lo.z, lo.w);
                mma::mma_bf16(acc[nt], af[0][1], hi.x, hi.y);
                mma::mma_bf16(acc[nt], af[1][1], hi.z, hi.w);
            }
        }
    }
}

// skinny_kernel<T, NT, PAIR>
//   Shapes:  segs: up to three matrices (qw_common.cuh); x: n_all rows of K
//            BF16 (row stride K); y: n_all rows at stride ldy floats.
//            PAIR (a GLU layer): segs holds the gate (0) and up (1) rows, of
//            one count; the gated values go to glu.h (BF16, stride ldy).
//   Grid:    (Σ ceil(rows / 128) · tz, splits) blocks of eight warps,
//            tz = ceil(n_all / (8·NT)), clusters of 1 × splits; block
//            (b·tz + t, s) multiplies the 16-row tiles 8·b .. 8·b + 7 of its
//            matrix (one a warp; PAIR: the same tile of both; rows past the
//            matrix read its last row and are never stored) by activation
//            rows 8·NT·t .. over super-blocks s·sps .. of K.
//   Method:  the activations of kCh super-blocks of all the block's rows
//            are copied into one of two shared buffers (cp.async; rows past
//            n_all zero-filled) while the other is read; each warp loads its
//            lanes' next super-block (PAIR: gate and up in turn) while it
//            forms and multiplies the current one (SkWeights, mma_bf16 per 8
//            activation rows).
//   Output:  bq_finish (K splits > 1: added over the cluster in split order).
template <DType T, int NT, bool PAIR>
__global__ void __launch_bounds__(kThreads, PAIR || NT >= 8 ? 1 : 2)
    skinny_kernel(qw::Segs segs, const uint16_t* __restrict__ x, int n_all, float* __restrict__ y_all, int64_t ldy,
                  int sps, BqGlu glu) {
    using Sh = SkShape<NT>;
    constexpr int CH = Sh::kCh, MW = PAIR ? 2 : 1;
    extern __shared__ __align__(16) uint8_t smem[];
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, c = lane & 3;
    // Token groups vary fastest in x: the groups of a row block run together
    // and all but the first read its weights from the L2.
    const int tz = (n_all + Sh::kTok - 1) / Sh::kTok;
    const int bx = static_cast<int>(blockIdx.x) / tz, tg = static_cast<int>(blockIdx.x) - bx * tz;
    const int seg = PAIR ? 0 : (segs.count > 1 && bx >= segs.s[1].bx0) + (segs.count > 2 && bx >= segs.s[2].bx0);
    static_assert(kQwMaxPieces == 3, "the segment choice above");
    const qw::Seg& sg = seg == 0 ? segs.s[0] : seg == 1 ? segs.s[1] : segs.s[2];
    const int64_t K = sg.a.K, KS = K / 256, rows = sg.rows;
    const int64_t tile = (bx - sg.bx0) * kWarps + warp;
    const int t0 = tg * Sh::kTok;
    const int n = n_all - t0 < Sh::kTok ? n_all - t0 : Sh::kTok;
    const int64_t sb0 = static_cast<int64_t>(blockIdx.y) * sps;
    const int nsb = static_cast<int>((KS < sb0 + sps ? KS : sb0 + sps) - sb0);
    const int nch = (nsb + CH - 1) / CH;
    DeqArgs a[MW];
    int64_t row[MW][2];
#pragma unroll
    for (int m = 0; m < MW; ++m) {
        const qw::Seg& sm = m == 0 ? sg : segs.s[1];
        a[m] = sm.a;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int64_t j = kTile * tile + g + 8 * r;
            row[m][r] = sm.row0 + (j < rows ? j : rows - 1);
        }
    }

    // Chunk q into buffer buf: token t's 16-byte unit e (elements 8e..) of
    // the chunk at sub-block e/4, unit (e%4) ^ (2 if sub-block bit 1), so
    // that lanes c and c+2 (sub-blocks 4j+c, 4j+c+2) of one k step hit
    // different banks.
    const uint16_t* const xt = x + static_cast<int64_t>(t0) * K;
    const auto stage = [&](int q, int buf) {
        constexpr int UNITS = CH * 32;  // per token row
        const int have = (nsb - q * CH < CH ? nsb - q * CH : CH) * 32;
        uint8_t* base = smem + buf * Sh::kBuf;
        const uint16_t* src = xt + (sb0 + static_cast<int64_t>(q) * CH) * 256;
#pragma unroll
        for (int p = tid; p < Sh::kTok * UNITS; p += kThreads) {
            const int t = p / UNITS, e = p % UNITS, sbr = e >> 2;
            if (e >= have) continue;
            const int phys = (e & 3) ^ (((sbr >> 1) & 1) << 1);
            cp_async16(base + t * Sh::kStride + sbr * 64 + phys * 16,
                       src + static_cast<int64_t>(t < n ? t : 0) * K + 8 * e, t < n);
        }
    };

    float acc[MW][NT][4];
#pragma unroll
    for (int m = 0; m < MW; ++m)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[m][nt][i] = 0.0f;
    stage(0, 0);
    cp_async_commit();
    SkWeights<T> cur, nxt;
    cur.load(a[0], row[0], sb0, c);
    const int sw = (c >> 1) << 1;  // the unit swizzle of this lane's sub-blocks
    for (int i = 0; i < nsb; ++i) {
        const int q = i / CH, k = i - q * CH;
        if (k == 0) {
            // Buffer (q+1) & 1 was last read in chunk q−1, which ended at a barrier.
            if (q + 1 < nch) stage(q + 1, (q + 1) & 1);
            cp_async_commit();
            cp_async_wait<1>();
            __syncthreads();
        }
        const uint8_t* const xs = smem + (q & 1) * Sh::kBuf + g * Sh::kStride + k * 512 + c * 64;
#pragma unroll
        for (int m = 0; m < MW; ++m) {
            // The next (matrix, super-block) in the order gate i, up i, gate i+1, ...
            if (m + 1 < MW) nxt.load(a[m + 1], row[m + 1], sb0 + i, c);
            else nxt.load(a[0], row[0], sb0 + (i + 1 < nsb ? i + 1 : i), c);  // (the last: a reload, from L2)
            multiply<NT, Sh::kStride>(cur, xs, c, sw, acc[m]);
            cur = nxt;
        }
        if (k == CH - 1 || i + 1 == nsb) __syncthreads();  // this chunk's buffer may be refilled
    }
    float* y = PAIR ? nullptr : y_all + static_cast<int64_t>(t0) * ldy + sg.ycol;
    if constexpr (PAIR) glu.h += static_cast<int64_t>(t0) * ldy;
    bq_finish<MW, NT, PAIR>(acc, [&](int) { return tile; }, rows, n, y, ldy, glu, smem);
}

template <DType T, int NT, bool PAIR>
void launch(qw::Segs segs, const uint16_t* x, int n, float* y, int64_t ldy, const BqGlu& glu, cudaStream_t stream) {
    using Sh = SkShape<NT>;
    constexpr int smem = Sh::kSmem > (PAIR ? 2 : 1) * Sh::kRed ? Sh::kSmem : (PAIR ? 2 : 1) * Sh::kRed;
    const auto kernel = skinny_kernel<T, NT, PAIR>;
    static const auto active = active_clusters(kernel, smem);
    int64_t bx = 0;
    for (int i = 0; i < (PAIR ? 1 : segs.count); ++i) {
        segs.s[i].bx0 = bx;
        bx += (segs.s[i].rows + kSkRows - 1) / kSkRows;
    }
    const int64_t KS = segs.s[0].a.K / 256, tz = (n + Sh::kTok - 1) / Sh::kTok;
    // The splits with the fewest waves of clusters × super-blocks per block,
    // each split at least two super-blocks; adding a cluster's partial sums
    // costs about one super-block.
    int64_t splits = 1, best = -1;
    for (int64_t s = 1; s <= kMaxSplits; ++s) {
        const int64_t sps = (KS + s - 1) / s;
        if (s > 1 && sps < 2) break;
        const int64_t act = active[static_cast<size_t>(s)];
        const int64_t cost = (bx * tz + act - 1) / act * ((PAIR ? 2 : 1) * sps + (s > 1 ? 1 : 0));
        if (best < 0 || cost < best) splits = s, best = cost;
    }
    const int64_t sps = (KS + splits - 1) / splits;
    splits = (KS + sps - 1) / sps;
    const ClusterLaunch l(dim3(static_cast<unsigned>(bx * tz), static_cast<unsigned>(splits)),
                          static_cast<unsigned>(splits), smem, stream);
    QUERN_CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, kernel, segs, x, n, y, ldy, static_cast<int>(sps), glu));
}

template <DType T, bool PAIR>
void launch_n(const qw::Segs& segs, const uint16_t* x, int n, float* y, int64_t ldy, const BqGlu& glu,
              cudaStream_t stream) {
    if (n <= 8) return launch<T, 1, PAIR>(segs, x, n, y, ldy, glu, stream);
    if (n <= 16) return launch<T, 2, PAIR>(segs, x, n, y, ldy, glu, stream);
    // Past 32 rows the GLU form takes token groups of 32: its 64-row tile
    // would hold 64 accumulators a lane beside two matrices' weights.
    if constexpr (PAIR) launch<T, 4, PAIR>(segs, x, n, y, ldy, glu, stream);
    else if (n <= 32) launch<T, 4, PAIR>(segs, x, n, y, ldy, glu, stream);
    else launch<T, 8, PAIR>(segs, x, n, y, ldy, glu, stream);
}

}  // namespace

void qw::launch_skinny(DType t, Segs segs, const uint16_t* x, int n, float* y, int64_t ldy, cudaStream_t stream) {
    if (t == DType::Q4_K) launch_n<DType::Q4_K, false>(segs, x, n, y, ldy, BqGlu{}, stream);
    else launch_n<DType::Q6_K, false>(segs, x, n, y, ldy, BqGlu{}, stream);
}

void qw::launch_skinny_glu(DType t, Segs segs, const uint16_t* x, int n, uint16_t* h, int64_t ldh, bool gelu,
                           cudaStream_t stream) {
    BqGlu glu;
    glu.h = h;
    glu.gelu = gelu ? 1 : 0;
    if (t == DType::Q4_K) launch_n<DType::Q4_K, true>(segs, x, n, nullptr, ldh, glu, stream);
    else launch_n<DType::Q6_K, true>(segs, x, n, nullptr, ldh, glu, stream);
}

}  // namespace quern::cuda
