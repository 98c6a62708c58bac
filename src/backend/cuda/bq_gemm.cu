// Small-batch GEMM on quantized weights: the bq layouts and their product
// (API, layouts and numerics: bq_gemm.h).
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "backend/cuda/tuning.h"
#include "backend/cuda/bq_gemm.h"
#include "backend/cuda/bq_common.cuh"
#include "backend/cuda/context.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/ops_common.cuh"

namespace quern::cuda {
namespace {

using deq::DeqArgs;
using deq::half_at;
using deq::nib;
using deq::q5_bit;
using mma::cp_async16;
using mma::cp_async_commit;
using mma::cp_async_wait;
using mma::mma_bf16;


__host__ __device__ constexpr int record_bytes(int bits) { return bits == 4 ? 16 : 32; }
// Per (tile, chunk): {s, o} records (8 bytes per lane group: rows g, g+8),
// then {c, c'} centres (4 bytes per lane group).
__host__ __device__ constexpr int so_bytes(int bits) { return bits == 4 ? 128 : 256; }
__host__ __device__ constexpr int scale_bytes(int bits) { return so_bytes(bits) + so_bytes(bits) / 2; }

// Unit u (elements 32u .. 32u+31) of row `row` as integers q[e] (< 128) and
// the scale and offset of each 16-element half: value = s[e/16]·q[e] +
// o[e/16], the same value dequantize_row_ref gives (up to fp32 rounding).
template <DType T>
__device__ __forceinline__ void unit_parts(const DeqArgs& a, int64_t row, int64_t u, uint32_t (&q)[32], float (&s)[2],
                                           float (&o)[2]) {
    const int64_t gu = row * (a.K / 32) + u;
    if constexpr (T == DType::Q4_0 || T == DType::Q4_1 || T == DType::Q5_0 || T == DType::Q5_1) {
        const uint8_t* c = a.q + 16 * gu;
        float d, m;
        uint32_t hb = 0;
        if constexpr (T == DType::Q4_0) {
            d = half_at(a.s, gu), m = -8.0f * d;
        } else if constexpr (T == DType::Q4_1) {
            d = half_at(a.s, 2 * gu), m = half_at(a.s, 2 * gu + 1);
        } else if constexpr (T == DType::Q5_0) {
            d = half_at(a.s, gu), m = -16.0f * d;
            hb = reinterpret_cast<const uint32_t*>(a.q2)[gu];
        } else {
            const uint8_t* rec = a.s + 8 * gu;  // {fp16 d, fp16 m, uint32 fifth bits}
            d = half_at(rec, 0), m = half_at(rec, 1);
            hb = *reinterpret_cast<const uint32_t*>(rec + 4);
        }
#pragma unroll
        for (int e = 0; e < 32; ++e) {
            q[e] = nib(c, e);
            if constexpr (T == DType::Q5_0 || T == DType::Q5_1) q[e] |= q5_bit(hb, e) << 4;
        }
        s[0] = s[1] = d;
        o[0] = o[1] = m;
    } else if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
        const uint8_t* c = a.q + 16 * gu;
        const uint8_t* head = a.s + 16 * (row * (a.K / 256) + (u >> 3));
        float d1, m1;
        deq::k_scale_min(head, static_cast<int>(u & 7), d1, m1);
        s[0] = s[1] = d1;
        o[0] = o[1] = -m1;
        uint32_t hb = 0;
        if constexpr (T == DType::Q5_K) hb = reinterpret_cast<const uint32_t*>(a.q2)[gu];
#pragma unroll
        for (int e = 0; e < 32; ++e) {
            q[e] = nib(c, e);
            if constexpr (T == DType::Q5_K) q[e] |= q5_bit(hb, e) << 4;
        }
    } else if constexpr (T == DType::Q6_K) {
        const uint8_t* c = a.q + 16 * gu;
        const auto* qh = reinterpret_cast<const uint32_t*>(a.q2) + 2 * gu;
        const auto* sc = reinterpret_cast<const int8_t*>(a.s) + 2 * gu;
        const float d = half_at(a.s2, row * (a.K / 256) + (u >> 3));
#pragma unroll
        for (int e = 0; e < 32; ++e) {
            const int h = e >> 4, i = (e & 15) >> 2, k = e & 3;  // high bits: word h, byte k, bits 2i
            q[e] = nib(c, e) | (((qh[h] >> (8 * k + 2 * i)) & 3u) << 4);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            s[h] = d * static_cast<float>(sc[h]);
            o[h] = -32.0f * s[h];
        }
    }
}


// to_bq_kernel<T, BITS>
//   Shapes:  a: N rows × K (device layout, weights.h; K % 64 == 0); q, sc:
//            the bq layout of bq_gemm.h for tiles = ceil(N / 16) tiles
//            (rows past N: zeros).
//   Grid:    one thread per (tile, chunk, lane), grid-stride, 256 per
//            block: the thread decodes its two rows' unit (unit_parts) and
//            writes its lane record and, for its rows, the scale record.
//   Bound:   memory (run once at load).
template <DType T, int BITS>
__global__ void __launch_bounds__(256) to_bq_kernel(DeqArgs a, int64_t N, int64_t tiles, uint8_t* __restrict__ q,
                                                     uint8_t* __restrict__ sc) {
    const int64_t C = a.K / kChunk;
    const int64_t total = tiles * C * 32;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int lane = static_cast<int>(i & 31), g = lane >> 2, c = lane & 3;
        const int64_t tc = i >> 5, tile = tc / C, ch = tc % C;
        const int64_t u = 2 * ch + (c >> 1);  // the unit of this lane's 16 elements
        const int eb = 16 * (c & 1);          // their first element in the unit
        uint32_t qa[2][32], zc[2];
        float sa[2][2], oa[2][2];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            const int64_t row = kTile * tile + g + 8 * rr;
            if (row < N) {
                unit_parts<T>(a, row, u, qa[rr], sa[rr], oa[rr]);
            } else {
#pragma unroll
                for (int e = 0; e < 32; ++e) qa[rr][e] = 0;
                sa[rr][0] = sa[rr][1] = oa[rr][0] = oa[rr][1] = 0.0f;
            }
        }
        if constexpr (BITS == 4) {
            uint32_t w[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int e = eb + 4 * j;
                w[j] = qa[0][e] | qa[1][e] << 4 | qa[0][e + 2] << 8 | qa[1][e + 2] << 12 | qa[0][e + 1] << 16 |
                       qa[1][e + 1] << 20 | qa[0][e + 3] << 24 | qa[1][e + 3] << 28;
            }
            reinterpret_cast<uint4*>(q)[i] = make_uint4(w[0], w[1], w[2], w[3]);
            if ((c & 1) == 0) {
                const int64_t at = tc * scale_bytes(4) + 8 * (2 * g + (c >> 1));
                *reinterpret_cast<uint2*>(sc + at) = make_uint2(so_pair(sa[0][0], oa[0][0], 15, 8, zc[0]),
                                                                so_pair(sa[1][0], oa[1][0], 15, 8, zc[1]));
                *reinterpret_cast<uint32_t*>(sc + tc * scale_bytes(4) + so_bytes(4) + 4 * (2 * g + (c >> 1))) =
                    zc[0] | zc[1] << 16;
            }
        } else {
            uint32_t w[8];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int e = eb + 4 * j;
                w[2 * j] = qa[0][e] | qa[1][e] << 8 | qa[0][e + 1] << 16 | qa[1][e + 1] << 24;
                w[2 * j + 1] = qa[0][e + 2] | qa[1][e + 2] << 8 | qa[0][e + 3] << 16 | qa[1][e + 3] << 24;
            }
            reinterpret_cast<uint4*>(q)[2 * i] = make_uint4(w[0], w[1], w[2], w[3]);
            reinterpret_cast<uint4*>(q)[2 * i + 1] = make_uint4(w[4], w[5], w[6], w[7]);
            const int h = c & 1;
            *reinterpret_cast<uint2*>(sc + tc * scale_bytes(8) + 8 * (4 * g + c)) =
                make_uint2(so_pair(sa[0][h], oa[0][h], 127, 1, zc[0]), so_pair(sa[1][h], oa[1][h], 127, 1, zc[1]));
            *reinterpret_cast<uint32_t*>(sc + tc * scale_bytes(8) + so_bytes(8) + 4 * (4 * g + c)) = zc[0] | zc[1] << 16;
        }
    }
}

template <int BITS>
struct Rec;
template <>
struct Rec<4> {
    uint4 w;
    uint2 s;
    uint32_t c;
};
template <>
struct Rec<8> {
    uint4 w0, w1;
    uint2 s;
    uint32_t c;
};

// The lane's record of one (tile, chunk) from its staged copy: the lane
// records (32 × 16 or 32 bytes), then the {s, o} and centre records.
template <int BITS>
__device__ __forceinline__ void load_rec(Rec<BITS>& r, const uint8_t* tile, int lane) {
    const int grp = BITS == 4 ? 2 * (lane >> 2) + ((lane & 3) >> 1) : lane;  // this lane's {s, o} record
    if constexpr (BITS == 4) {
        r.w = reinterpret_cast<const uint4*>(tile)[lane];
    } else {
        r.w0 = reinterpret_cast<const uint4*>(tile)[2 * lane];
        r.w1 = reinterpret_cast<const uint4*>(tile)[2 * lane + 1];
    }
    const uint8_t* so = tile + 32 * record_bytes(BITS);
    r.s = reinterpret_cast<const uint2*>(so)[grp];
    r.c = reinterpret_cast<const uint32_t*>(so + so_bytes(BITS))[grp];
}


template <int BITS>
__device__ __forceinline__ Scales scales_of(const Rec<BITS>& r) {
    Scales k;
    k.s[0] = as_bf2(__byte_perm(r.s.x, 0, 0x1010)), k.o[0] = as_bf2(__byte_perm(r.s.x, 0, 0x3232));
    k.s[1] = as_bf2(__byte_perm(r.s.y, 0, 0x1010)), k.o[1] = as_bf2(__byte_perm(r.s.y, 0, 0x3232));
    k.c[0] = as_bf2(__byte_perm(r.c, 0, 0x1010)), k.c[1] = as_bf2(__byte_perm(r.c, 0, 0x3232));
    return k;
}

// The A fragment of step j (0..3) of a lane record: the weights of rows g
// and g+8 at the step's elements, decoded to BF16.
template <int BITS>
__device__ __forceinline__ void step_a(const Rec<BITS>& r, const Scales& k, int j, uint32_t (&a)[4]) {
    if constexpr (BITS == 4) {
        const uint32_t w = j == 0 ? r.w.x : j == 1 ? r.w.y : j == 2 ? r.w.z : r.w.w;
        constexpr uint32_t M = 0x00780078u, X = 0x43004300u;  // nibble pair into mantissa bits 3..6: 128 + 8q
        a[0] = affine(and_or(w << 3, M, X), k.c[0], k.s[0], k.o[0]);
        a[1] = affine(and_or(w >> 1, M, X), k.c[1], k.s[1], k.o[1]);
        a[2] = affine(and_or(w >> 5, M, X), k.c[0], k.s[0], k.o[0]);
        a[3] = affine(and_or(w >> 9, M, X), k.c[1], k.s[1], k.o[1]);
    } else {
        const uint4& v = j < 2 ? r.w0 : r.w1;
        const uint32_t wa = (j & 1) ? v.z : v.x, wb = (j & 1) ? v.w : v.y;
        constexpr uint32_t M = 0x007F007Fu, X = 0x43004300u;  // byte pair into the mantissa: 128 + q
        a[0] = affine(and_or(wa, M, X), k.c[0], k.s[0], k.o[0]);
        a[1] = affine(and_or(wa >> 8, M, X), k.c[1], k.s[1], k.o[1]);
        a[2] = affine(and_or(wb, M, X), k.c[0], k.s[0], k.o[0]);
        a[3] = affine(and_or(wb >> 8, M, X), k.c[1], k.s[1], k.o[1]);
    }
}

constexpr int kXPad = 72;  // BF16 per staged activation row: 64 + 8 (144 bytes: conflict-free 16-byte reads)

constexpr int kStages = 4;  // chunks in flight per block (cp.async ring)


template <int BITS, int NT, int MW>
struct BqShape {
    static constexpr int kTileBytes = 32 * record_bytes(BITS) + scale_bytes(BITS);  // one (tile, chunk)
    static constexpr int kTiles = kWarps * MW;                                        // per block
    static constexpr int kRows = 8 * NT;                                              // staged activation rows
    static constexpr int kStageBytes = kTiles * kTileBytes + kRows * kXPad * 2;
    static constexpr int kSmem = kStages * kStageBytes;
};

// The block's share of a product: its btiles tiles from global tile
// tile_base (warp w: tiles w·MW .. w·MW+MW−1 of those; PAIR, MW = 2: warp w
// takes pair tile w, its gate tile from wq/ws and its up tile from
// wq2/ws2, and btiles counts pair tiles) times n <= 8·NT
// activation rows at x (row stride K) over chunks cb .. cb+nch−1, into acc
// (fragment order). The cp.async ring of kStages stages lives in smem;
// returns with every copy done.
template <int BITS, int NT, int MW, bool PAIR>
__device__ __forceinline__ void bq_block_product(const uint8_t* __restrict__ wq, const uint8_t* __restrict__ ws,
                                                 const uint8_t* __restrict__ wq2, const uint8_t* __restrict__ ws2,
                                                 int64_t C, int64_t tile_base, int btiles,
                                                 const uint16_t* __restrict__ x, int64_t K, int n, int64_t cb,
                                                 int64_t nch, uint8_t* smem, float (&acc)[MW][NT][4]) {
    using Sh = BqShape<BITS, NT, MW>;
    constexpr int RQ = 32 * record_bytes(BITS), GT = Sh::kTileBytes / 16, GX = Sh::kRows * 8;
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MW; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
    // The 16-byte pieces of a chunk's stage: the lane records and scale
    // records of the block's kTiles tiles (GT pieces each; tiles past
    // btiles copy the block's first tile, their sums are never stored), then
    // 8·NT activation rows of 8 pieces (rows past n are zero-filled). Thread
    // tid copies pieces tid, tid + kThreads, ...: their source addresses at
    // chunk cb and strides per chunk are worked out once, here.
    constexpr int PQ = Sh::kTiles * GT + GX, P = (PQ + kThreads - 1) / kThreads;
    const uint8_t* src[P];
    int stride[P];
    uint32_t dst[P];
    bool live[P], full[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
        const int q = tid + p * kThreads;
        live[p] = q < PQ;
        full[p] = true;
        dst[p] = static_cast<uint32_t>(16 * q);  // tile records, then the activation rows at kTiles·kTileBytes
        if (q < Sh::kTiles * GT) {
            const int ti = q / GT, gi = q % GT;
            const int tt = PAIR ? ti / 2 : ti;  // PAIR: slot ti is pair tile ti/2 of the gate (even) or up (odd)
            const bool second = PAIR && (ti & 1);
            const int64_t tc = (tile_base + (tt < btiles ? tt : 0)) * C + cb;
            if (gi < RQ / 16) {
                src[p] = (second ? wq2 : wq) + tc * RQ + 16 * gi;
                stride[p] = RQ;
            } else {
                src[p] = (second ? ws2 : ws) + tc * scale_bytes(BITS) + 16 * (gi - RQ / 16);
                stride[p] = scale_bytes(BITS);
            }
        } else {
            const int xi = q - Sh::kTiles * GT, t = xi >> 3, p16 = xi & 7;
            src[p] = reinterpret_cast<const uint8_t*>(x + static_cast<int64_t>(t < n ? t : 0) * K + kChunk * cb +
                                                      8 * p16);
            stride[p] = 2 * kChunk;
            full[p] = t < n;
            dst[p] = static_cast<uint32_t>(Sh::kTiles * Sh::kTileBytes + (t * kXPad + 8 * p16) * 2);
        }
    }
    // Copies chunk cb + i into stage i % kStages (one commit group).
    const auto issue = [&](int64_t i) {
        if (i < nch) {
            uint8_t* st = smem + (i % kStages) * Sh::kStageBytes;
#pragma unroll
            for (int p = 0; p < P; ++p)
                if (live[p]) cp_async16(st + dst[p], src[p] + i * stride[p], full[p]);
        }
        cp_async_commit();
    };
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) issue(i);
    for (int64_t i = 0; i < nch; ++i) {
        cp_async_wait<kStages - 2>();  // this thread's copies of chunk i are done
        __syncthreads();               // everyone's; and stage (i − 1) % kStages is consumed
        issue(i + kStages - 1);
        const uint8_t* st = smem + (i % kStages) * Sh::kStageBytes;
        const auto* xs = reinterpret_cast<const uint16_t*>(st + Sh::kTiles * Sh::kTileBytes);
        uint32_t b[NT][8];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const auto* p = reinterpret_cast<const uint4*>(xs + (8 * nt + g) * kXPad + 16 * c);
            const uint4 v0 = p[0], v1 = p[1];
            b[nt][0] = v0.x, b[nt][1] = v0.y, b[nt][2] = v0.z, b[nt][3] = v0.w;
            b[nt][4] = v1.x, b[nt][5] = v1.y, b[nt][6] = v1.z, b[nt][7] = v1.w;
        }
        {
            // Steps outer, tiles inner: consecutive products on one
            // accumulator are MW·NT products apart (the mma latency hides).
            // Tiles past the matrix multiply stale shared memory; their
            // sums are never stored.
            Rec<BITS> r[MW];
            Scales k[MW];
#pragma unroll
            for (int mt = 0; mt < MW; ++mt) {
                load_rec<BITS>(r[mt], st + (warp * MW + mt) * Sh::kTileBytes, lane);
                k[mt] = scales_of<BITS>(r[mt]);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int mt = 0; mt < MW; ++mt) {
                    uint32_t a[4];
                    step_a<BITS>(r[mt], k[mt], j, a);
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) mma_bf16(acc[mt][nt], a, b[nt][2 * j], b[nt][2 * j + 1]);
                }
        }
    }
    cp_async_wait<0>();
}


// bq_gemm_kernel<BITS, NT, MW>
//   Shapes:  wq, ws: a bq layout (bq_gemm.h) of C = K/64 chunks per row;
//            the product covers its tiles tile0 .. tile0+tiles−1 (output
//            rows 0 .. rows−1 = weight rows 16·tile0 + j); x: n <= 8·NT rows
//            of K BF16 (row stride K); y: n rows at stride ldy floats.
//   Grid:    (ceil(tiles / (8·MW)), splits) blocks of 8 warps; block (b, s)
//            takes tiles 8·MW·b .. +8·MW−1 (warp w: MW of them) and chunks
//            s·cps .. s·cps+cps−1 of K. The block copies each chunk's lane
//            records, scales and activation rows (8·NT × 64 BF16) into a
//            ring of kStages stages in shared memory with cp.async, kStages−1
//            chunks ahead of the one it multiplies; per chunk each warp reads
//            its tiles' records, decodes them into A fragments (the
//            integer-in-mantissa trick, HSUB2 + HFMA2 per pair), reads the B
//            fragments from the staged rows and issues 4·NT mma.m16n8k16 per
//            tile.
//            PAIR (a GLU product, MW = 2): tiles are pair tiles, 8 per
//            block; warp w's slot 0 is the gate and slot 1 the up tile of
//            pair tile 8·b + w.
//   Output:  bq_finish (splits > 1: one thread block cluster per row group).
//   Bound:   memory at small n: 5.5 (B4) or 11 (B8) bits per weight read
//            once; the activations once per block from L2.
template <int BITS, int NT, int MW, bool PAIR>
__global__ void __launch_bounds__(kThreads, (MW == 1 && NT <= 4) || !(NT >= 4 || (BITS == 8 && MW == 2)) ? 3 : 2) bq_gemm_kernel(const uint8_t* __restrict__ wq, const uint8_t* __restrict__ ws,
                                                       int64_t C, int64_t tile0, int64_t tiles, int64_t rows,
                                                       const uint16_t* __restrict__ x, int64_t K, int n,
                                                       float* __restrict__ y, int64_t ldy, int cps, BqGlu glu) {
    extern __shared__ __align__(16) uint8_t smem[];
    using Sh = BqShape<BITS, NT, MW>;
    constexpr int kBlockTiles = PAIR ? kWarps : Sh::kTiles;  // tiles (pair tiles) per block
    const int warp = static_cast<int>(threadIdx.x) >> 5;
    const int64_t bt0 = static_cast<int64_t>(blockIdx.x) * kBlockTiles;  // the block's first tile
    const int btiles = static_cast<int>(tiles - bt0 < kBlockTiles ? tiles - bt0 : kBlockTiles);
    const int64_t mt0 = bt0 + warp * (PAIR ? 1 : MW);
    const int64_t cb = static_cast<int64_t>(blockIdx.y) * cps;
    const int64_t nch = (C < cb + cps ? C : cb + cps) - cb;
    float acc[MW][NT][4];
    bq_block_product<BITS, NT, MW, PAIR>(wq, ws, glu.wq2, glu.ws2, C, tile0 + bt0, btiles, x, K, n, cb, nch, smem, acc);
    bq_finish<MW, NT, PAIR>(acc, [&](int mt) { return PAIR ? mt0 : mt0 + mt; }, rows, n, y, ldy, glu, smem);
}

// ------------------------------------------------- the warpgroup form (wgmma)
// For 17 to 64 activation rows on sm_90a: the same bq layout and decode, the
// products on wgmma.m64n{32,64}k16 with the decoded weights as the A operand
// straight from registers, so the weights never pass through shared memory
// and the tensor cores run while the next chunk is decoded.

constexpr int kWgStages = 6;  // activation chunks in the shared-memory ring

// Bytes of one chunk's activations in the ring: four k16 steps of
// 8·NT rows × 16 BF16 as wgmma's K-major no-swizzle layout (8-row × 16-byte
// core matrices; per step: [row group of 8][K half][8 rows][16 bytes]).
__host__ __device__ constexpr int wg_step_bytes(int NT) { return 8 * NT * 32; }
__host__ __device__ constexpr int wg_smem_bytes(int NT, int MW) {
    return kWgStages * 4 * wg_step_bytes(NT) > MW * NT * 4 * kThreads * 4 ? kWgStages * 4 * wg_step_bytes(NT)
                                                                           : MW * NT * 4 * kThreads * 4;
}

// The lane's record of one (tile, chunk) straight from the layout: lane
// record at q (this lane's), {s, o} and centre records from the tile-chunk's
// scale block at s.
template <int BITS>
__device__ __forceinline__ void load_rec_global(Rec<BITS>& r, const uint8_t* q, const uint8_t* s, int grp) {
    if constexpr (BITS == 4) {
        r.w = kern::ldw16(q);
    } else {
        r.w0 = kern::ldw16(q);
        r.w1 = kern::ldw16(q + 16);
    }
    r.s = kern::ldw8(s + 8 * grp);
    r.c = kern::ldw4(s + so_bytes(BITS) + 4 * grp);
}

// bq_wgmma_kernel<BITS, NT, MW, PD>
//   Shapes:  as bq_gemm_kernel (n <= 8·NT).
//   Grid:    (ceil(tiles / (8·MW)), splits) blocks of 8 warps = 2
//            warpgroups; warpgroup G multiplies MW groups of 64 rows (group
//            m: tiles bt0 + 4·(G·MW + m) .. +3, warp w%4 holding one), over
//            chunks s·cps .. of K. Per chunk: every thread copies its share
//            of the chunk's activation rows (4-byte pieces, cp.async, zero
//            past n) into the ring slot of the chunk kWgStages−2 ahead,
//            placing each element where the bq K order of the step puts it
//            (step j's k index κ is element 16·(κ%8/2) + 4j + 2·(κ/8) + κ%2
//            of the chunk); each warp decodes its tiles' records (loaded from
//            global memory PD chunks ahead) into A fragments once the
//            previous chunk's products are done, and its warpgroup issues
//            4·MW wgmma as one commit group, which run while the next
//            chunk's barrier, copies and loads are issued. One barrier per
//            chunk.
//            PAIR (a GLU product, MW = 2): 8 pair tiles per block,
//            warpgroup G's group 0 the gate and group 1 the up rows of pair
//            tiles 8·b + 4·G .. +3.
//   Output:  bq_finish, the accumulators being the m16n8 fragments.
//   Bound:   memory: the weights' bytes once, the activations from L2 once
//            per block.
template <int BITS, int NT, int MW, int PD, bool PAIR>
__global__ void __launch_bounds__(kThreads) bq_wgmma_kernel(const uint8_t* __restrict__ wq,
                                                        const uint8_t* __restrict__ ws, int64_t C, int64_t tile0,
                                                        int64_t tiles, int64_t rows, const uint16_t* __restrict__ x,
                                                        int64_t K, int n, float* __restrict__ y, int64_t ldy, int cps,
                                                        BqGlu glu) {
#ifdef QUERN_WGMMA
    extern __shared__ __align__(16) uint8_t smem[];
    constexpr int kTok = 8 * NT, STEP = wg_step_bytes(NT), STAGE = 4 * STEP, S = kWgStages;
    constexpr int RB = 32 * record_bytes(BITS), SB = scale_bytes(BITS);
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wq4 = warp & 3;
    const int g = lane >> 2, c = lane & 3;
    static_assert(!PAIR || MW == 2, "a GLU product pairs two 64-row groups");
    const int64_t bt0 = static_cast<int64_t>(blockIdx.x) * (PAIR ? kWarps : kWarps * MW);
    const auto tile_of = [&](int mt) { return PAIR ? bt0 + 4 * wg + wq4 : bt0 + 4 * (wg * MW + mt) + wq4; };
    const int64_t cb = static_cast<int64_t>(blockIdx.y) * cps;
    const int64_t nch = (C < cb + cps ? C : cb + cps) - cb;
    float acc[MW][NT][4];
#pragma unroll
    for (int mt = 0; mt < MW; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
    // This lane's weight records (tiles past the matrix read the block's
    // first tile instead; their sums are never stored).
    const int grp = BITS == 4 ? 2 * g + (c >> 1) : lane;
    const uint8_t* rq[MW];
    const uint8_t* rs[MW];
#pragma unroll
    for (int mt = 0; mt < MW; ++mt) {
        const int64_t t = tile_of(mt) < tiles ? tile_of(mt) : bt0;
        const int64_t tc = (tile0 + t) * C + cb;
        rq[mt] = (PAIR && mt == 1 ? glu.wq2 : wq) + tc * RB + lane * record_bytes(BITS);
        rs[mt] = (PAIR && mt == 1 ? glu.ws2 : ws) + tc * SB;
    }
    // This thread's activation pieces: piece q = k·kThreads + tid is lane
    // (row r8 = q%8, lane range cc = q%32/8) of warp-slice w = q/32 = (step
    // j, K half h, row group g8); it covers elements 2p, 2p+1 of token t.
    // Lanes of one copy instruction write 32 different banks.
    constexpr int PPT = kTok * 32 / kThreads;
    uint32_t dsto[PPT];
    const uint8_t* srcp[PPT];
    bool live[PPT];
#pragma unroll
    for (int k = 0; k < PPT; ++k) {
        const int q = k * kThreads + tid, ln = q & 31, w = q >> 5;
        const int r8 = ln & 7, cc = ln >> 3, g8 = w % (kTok / 8), jh = w / (kTok / 8), j = jh >> 1, h = jh & 1;
        const int t = 8 * g8 + r8, p = 8 * cc + 2 * j + h;
        dsto[k] = static_cast<uint32_t>(j * STEP + g8 * 256 + h * 128 + r8 * 16 + cc * 4);
        live[k] = t < n;
        srcp[k] = reinterpret_cast<const uint8_t*>(x + static_cast<int64_t>(t < n ? t : 0) * K + kChunk * cb + 2 * p);
    }
    const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    const auto issue = [&](int64_t i) {
        if (i < nch) {
            const uint32_t st = sbase + static_cast<uint32_t>((i % S) * STAGE);
#pragma unroll
            for (int k = 0; k < PPT; ++k) mma::cp_async4(st + dsto[k], srcp[k] + i * 2 * kChunk, live[k]);
        }
        cp_async_commit();
    };
    Rec<BITS> rec[PD][MW];
#pragma unroll
    for (int u = 0; u < PD; ++u)
#pragma unroll
        for (int mt = 0; mt < MW; ++mt)
            if (u < nch) load_rec_global<BITS>(rec[u][mt], rq[mt] + u * RB, rs[mt] + u * SB, grp);
#pragma unroll
    for (int i = 0; i < S - 2; ++i) issue(i);
    uint32_t a[MW][4][4];
    // Chunk i, its records in rec[i % PD] (compile-time in every call below).
    // ptxas keeps a wgmma asynchronous only while no other instruction
    // writes a register any wgmma reads, so the A fragments are decoded
    // after the previous chunk's products are waited for; the barrier, the
    // next copies and the weight loads run while this chunk's products do
    // (and other warpgroups' decoding overlaps them too).
    const auto chunk = [&](int64_t i, auto slot) {
        constexpr int u = decltype(slot)::value;
        cp_async_wait<S - 3>();  // this thread's pieces of chunk i are in
        mma::fence_proxy_async_smem();
        __syncthreads();         // everyone's; every warpgroup is past chunk i − 2's products
        issue(i + S - 2);        // into chunk i − 2's slot
        mma::wgmma_wait<0>();    // chunk i − 1's products (their A registers)
#pragma unroll
        for (int mt = 0; mt < MW; ++mt) {
            const Scales k = scales_of<BITS>(rec[u][mt]);
#pragma unroll
            for (int j = 0; j < 4; ++j) step_a<BITS>(rec[u][mt], k, j, a[mt][j]);
        }
        const uint32_t st = sbase + static_cast<uint32_t>((i % S) * STAGE);
        uint64_t desc[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) desc[j] = mma::wgmma_desc(st + j * STEP, 128, 256);
#pragma unroll
        for (int mt = 0; mt < MW; ++mt)
#pragma unroll
            for (int j = 0; j < 4; ++j) mma::fence_operand(a[mt][j]);  // decoded before the fence
        mma::wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int mt = 0; mt < MW; ++mt) mma::wgmma_bf16<NT>(acc[mt], a[mt][j], desc[j]);
        mma::wgmma_commit();
        if (i + PD < nch) {
#pragma unroll
            for (int mt = 0; mt < MW; ++mt)
                load_rec_global<BITS>(rec[u][mt], rq[mt] + (i + PD) * RB, rs[mt] + (i + PD) * SB, grp);
        }
    };
    // Chunk 0 before the loop (every split has one): inside the loop the
    // accumulators then only ever come from wgmma (ptxas serializes the
    // products when the zero-initialized accumulators reach the loop).
    chunk(0, std::integral_constant<int, 0>{});
    for (int64_t i0 = 1; i0 < nch; i0 += PD) {
        [&]<int... U>(std::integer_sequence<int, U...>) {
            ((i0 + U < nch ? chunk(i0 + U, std::integral_constant<int, (U + 1) % PD>{}) : void()), ...);
        }(std::make_integer_sequence<int, PD>{});
    }
    mma::wgmma_wait<0>();
    cp_async_wait<0>();
    bq_finish<MW, NT, PAIR>(acc, tile_of, rows, n, y, ldy, glu, smem);
#else
    __trap();  // launched only on devices that run the sm_90a code (device_has_wgmma)
#endif
}

// bq_grouped_kernel<BITS, NT, MW>
//   Shapes:  wq, ws: the bq layout of a mixture-of-experts bank, expert e's
//            rows_e rows (tiles_e tiles) from tile e·tiles_e; off: n_expert
//            + 1 offsets of the experts' groups of rows in x and y (device);
//            x: grouped activation rows of K BF16; y: rows at stride ldy.
//   Grid:    (ceil(tiles_e / kTiles), token tiles, n_expert) blocks of 8
//            warps; block (b, t, e) multiplies tiles b·kTiles .. of expert e
//            by rows off[e] + 8·NT·t .. (at most 8·NT; blocks past the
//            group's end leave at once) over all of K (bq_block_product) and
//            stores them: one launch for every expert of a layer, whatever
//            the group sizes.
//   Bound:   memory (each expert's weights read once per token tile).
template <int BITS, int NT, int MW>
__global__ void __launch_bounds__(kThreads) bq_grouped_kernel(const uint8_t* __restrict__ wq,
                                                          const uint8_t* __restrict__ ws, int64_t C, int64_t tiles_e,
                                                          int64_t rows_e, const int32_t* __restrict__ off,
                                                          const uint16_t* __restrict__ x, int64_t K,
                                                          float* __restrict__ y, int64_t ldy) {
    using Sh = BqShape<BITS, NT, MW>;
    extern __shared__ __align__(16) uint8_t smem[];
    const int64_t e = blockIdx.z, o0 = off[e], t0 = static_cast<int64_t>(blockIdx.y) * Sh::kRows;
    const int64_t ne = off[e + 1] - o0;
    if (t0 >= ne) return;  // the whole block, before any barrier
    const int n = static_cast<int>(ne - t0 < Sh::kRows ? ne - t0 : Sh::kRows);
    const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int64_t bt0 = static_cast<int64_t>(blockIdx.x) * Sh::kTiles;
    const int btiles = static_cast<int>(tiles_e - bt0 < Sh::kTiles ? tiles_e - bt0 : Sh::kTiles);
    const int64_t mt0 = bt0 + warp * MW;
    float acc[MW][NT][4];
    bq_block_product<BITS, NT, MW, false>(wq, ws, nullptr, nullptr, C, e * tiles_e + bt0, btiles, x + (o0 + t0) * K, K,
                                          n, 0, C, smem, acc);
#pragma unroll
    for (int mt = 0; mt < MW; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int64_t j = kTile * (mt0 + mt) + g + (i >= 2 ? 8 : 0);
                const int r = 8 * nt + 2 * c + (i & 1);
                if (j < rows_e && r < n) y[(o0 + t0 + r) * ldy + j] = acc[mt][nt][i];  // rows_e % 16 == 0: tiles past the bank fail j
            }
}


// Where a bq layout's lane records and its scale records start, from tile
// tile0 on (bits = w.bq_bits).
struct BqParts {
    const uint8_t* q;
    const uint8_t* s;
};
BqParts bq_parts(const DeviceWeight& w, int64_t tile0) {
    const int64_t C = w.K / kChunk, all_tiles = (w.N + kTile - 1) / kTile;
    const uint8_t* s = w.bq + static_cast<size_t>(all_tiles * C) * 32 * record_bytes(w.bq_bits);
    return {w.bq + static_cast<size_t>(tile0 * C) * 32 * record_bytes(w.bq_bits),
            s + static_cast<size_t>(tile0 * C) * scale_bytes(w.bq_bits)};
}

// Launches a bq product kernel on bx row groups of blocks, K (C chunks)
// split over a thread block cluster of pick_splits blocks per row group.
template <class Kernel>
void launch_split(Kernel kernel, int smem, const std::array<int, kMaxSplits + 1>& active, int64_t bx, BqParts wp,
                  int64_t C, int64_t K, int64_t tiles, int64_t rows, const uint16_t* x, int n, float* y, int64_t ldy,
                  const BqGlu& glu, cudaStream_t stream) {
    if (smem > 48 * 1024)  // per call: the attribute is per device
        QUERN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int64_t splits = pick_splits(bx, C, active);
    const int64_t cps = (C + splits - 1) / splits;
    splits = (C + cps - 1) / cps;
    const ClusterLaunch l(dim3(static_cast<unsigned>(bx), static_cast<unsigned>(splits)),
                          static_cast<unsigned>(splits), smem, stream);
    QUERN_CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, kernel, wp.q, wp.s, C, int64_t{0}, tiles, rows, x, K, n, y, ldy,
                                        static_cast<int>(cps), glu));
}

// The product over `tiles` tiles from wp (pair tiles for PAIR) on the
// mma.sync kernel, and on the wgmma kernel.
template <int BITS, int NT, int MW, bool PAIR = false>
void launch_bq(BqParts wp, int64_t C, int64_t K, int64_t tiles, int64_t rows, const uint16_t* x, int n, float* y,
               int64_t ldy, const BqGlu& glu, cudaStream_t stream) {
    constexpr int smem = BqShape<BITS, NT, MW>::kSmem;
    static_assert(smem >= MW * NT * 4 * kThreads * 4, "the partial sums reuse the ring");
    static const auto active = active_clusters(bq_gemm_kernel<BITS, NT, MW, PAIR>, smem);
    constexpr int per_block = PAIR ? kWarps : kWarps * MW;
    launch_split(bq_gemm_kernel<BITS, NT, MW, PAIR>, smem, active, (tiles + per_block - 1) / per_block, wp, C, K,
                 tiles, rows, x, n, y, ldy, glu, stream);
}

template <int BITS, int NT, int MW, int PD, bool PAIR = false>
void launch_wg(BqParts wp, int64_t C, int64_t K, int64_t tiles, int64_t rows, const uint16_t* x, int n, float* y,
               int64_t ldy, const BqGlu& glu, cudaStream_t stream) {
    constexpr int smem = wg_smem_bytes(NT, MW);
    static const auto active = active_clusters(bq_wgmma_kernel<BITS, NT, MW, PD, PAIR>, smem);
    constexpr int per_block = PAIR ? kWarps : kWarps * MW;
    launch_split(bq_wgmma_kernel<BITS, NT, MW, PD, PAIR>, smem, active, (tiles + per_block - 1) / per_block, wp, C,
                 K, tiles, rows, x, n, y, ldy, glu, stream);
}


// The form bq_gemm uses for 17-64 rows (bq_gemm_set_form); -1 until decided.
std::atomic<int> g_form{-1};

int form_now() {
    int f = g_form.load(std::memory_order_relaxed);
    if (f >= 0) return f;
    f = 1;
    if (tuning().bq_wgmma >= 0) f = std::clamp(tuning().bq_wgmma, 0, kBqLastForm);
    if (!device_has_wgmma()) f = 0;
    int unset = -1;  // a concurrent bq_gemm_set_form wins
    return g_form.compare_exchange_strong(unset, f, std::memory_order_relaxed) ? f : unset;
}


template <int BITS>
void launch_bq_n(BqParts wp, int64_t C, int64_t K, int64_t tiles, int64_t rows, const uint16_t* x, int n, float* y,
                 int64_t ldy, cudaStream_t stream) {
    const BqGlu none;
    if (n <= 8) return launch_bq<BITS, 1, 2>(wp, C, K, tiles, rows, x, n, y, ldy, none, stream);
    if (n <= 16) return launch_bq<BITS, 2, 2>(wp, C, K, tiles, rows, x, n, y, ldy, none, stream);
    const bool head = tiles * kTile >= 65536;
    int form = form_now();
    if (form == 1) {
        // The fastest per shape on an H200 (bench/batched-cuda-h200.md,
        // Llama-3-8B's matrices): the output head stays on mma.sync; at
        // 17-32 rows two 64-row groups per warpgroup for the 8k-64k-row
        // matrices (gate, up) and four chunks of weights in flight for the
        // rest; at 33-64 rows wgmma only where K is short.
        if (head) form = 0;
        else if (n <= 32) form = tiles * kTile >= 8192 ? 4 : 3;
        else form = K > 4096 ? 0 : 2;
    }
    switch (form) {
        case 2:
            if (n <= 32) return launch_wg<BITS, 4, 1, 2>(wp, C, K, tiles, rows, x, n, y, ldy, none, stream);
            return launch_wg<BITS, 8, 1, 2>(wp, C, K, tiles, rows, x, n, y, ldy, none, stream);
        case 3:
            if (n <= 32) return launch_wg<BITS, 4, 1, 4>(wp, C, K, tiles, rows, x, n, y, ldy, none, stream);
            return launch_wg<BITS, 8, 1, 4>(wp, C, K, tiles, rows, x, n, y, ldy, none, stream);
        case 4:
            if (n <= 32) return launch_wg<BITS, 4, 2, 2>(wp, C, K, tiles, rows, x, n, y, ldy, none, stream);
            return launch_wg<BITS, 8, 1, 2>(wp, C, K, tiles, rows, x, n, y, ldy, none, stream);
        default: break;
    }
    // mma.sync, 17-32 rows: one tile per warp (three blocks per SM) except on
    // the output head, where two per warp are faster (H200: 4096 x 4096 Q4_K
    // 17.0 -> 14.3 us, 4096 x 14336 39.5 -> 33.4, 128256 x 4096 Q6_K 188 ->
    // 197; bench/batched-cuda-h200.md).
    // (Two per warp only where the device's shared memory per block holds
    // them: 108 KB for the 8-bit layouts.)
    if (n <= 32 && (!head || BqShape<BITS, 4, 2>::kSmem > smem_optin()))
        return launch_bq<BITS, 4, 1>(wp, C, K, tiles, rows, x, n, y, ldy, none, stream);
    if (n <= 32) return launch_bq<BITS, 4, 2>(wp, C, K, tiles, rows, x, n, y, ldy, none, stream);
    launch_bq<BITS, 8, 1>(wp, C, K, tiles, rows, x, n, y, ldy, none, stream);
}

// The GLU product (bq_gemm_glu): 8 or 16 rows on mma.sync with two tiles
// per warp, 17-32 on the wgmma kernel with two 64-row groups per warpgroup
// (the form 1 takes for the gate and up matrices; mma.sync with two tiles
// per warp when the form is 0). glu_smem: the dynamic shared memory of the
// kernel it takes.
template <int BITS>
int glu_smem(int n) {
    if (n <= 8) return BqShape<BITS, 1, 2>::kSmem;
    if (n <= 16) return BqShape<BITS, 2, 2>::kSmem;
    return form_now() == 0 ? BqShape<BITS, 4, 2>::kSmem : wg_smem_bytes(4, 2);
}

template <int BITS>
void launch_glu_n(BqParts gate, BqParts up, int64_t C, int64_t K, int64_t tiles, int64_t rows, const uint16_t* x,
                  int n, uint16_t* h, int64_t ldh, bool gelu, cudaStream_t stream) {
    const BqGlu glu{up.q, up.s, h, gelu ? 1 : 0};
    if (n <= 8) return launch_bq<BITS, 1, 2, true>(gate, C, K, tiles, rows, x, n, nullptr, ldh, glu, stream);
    if (n <= 16) return launch_bq<BITS, 2, 2, true>(gate, C, K, tiles, rows, x, n, nullptr, ldh, glu, stream);
    if (form_now() == 0) return launch_bq<BITS, 4, 2, true>(gate, C, K, tiles, rows, x, n, nullptr, ldh, glu, stream);
    launch_wg<BITS, 4, 2, 2, true>(gate, C, K, tiles, rows, x, n, nullptr, ldh, glu, stream);
}

template <int BITS, int NT>
void launch_grouped(const DeviceWeight& w, int64_t rows_e, const int32_t* off, int64_t n_expert, int64_t max_rows,
                    const uint16_t* x, float* y, int64_t ldy, cudaStream_t stream) {
    constexpr int MW = 1;
    using Sh = BqShape<BITS, NT, MW>;
    const int64_t C = w.K / kChunk, tiles_e = rows_e / kTile;
    const int64_t all_tiles = (w.N + kTile - 1) / kTile;
    const uint8_t* wq = w.bq;
    const uint8_t* ws = w.bq + static_cast<size_t>(all_tiles * C) * 32 * record_bytes(BITS);
    static const bool attr = [] {
        QUERN_CUDA_CHECK(cudaFuncSetAttribute(bq_grouped_kernel<BITS, NT, MW>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, Sh::kSmem));
        return true;
    }();
    (void)attr;
    const dim3 grid(static_cast<unsigned>((tiles_e + Sh::kTiles - 1) / Sh::kTiles),
                    static_cast<unsigned>((max_rows + Sh::kRows - 1) / Sh::kRows), static_cast<unsigned>(n_expert));
    bq_grouped_kernel<BITS, NT, MW><<<grid, kThreads, Sh::kSmem, stream>>>(wq, ws, C, tiles_e, rows_e, off, x, w.K, y,
                                                                          ldy);
}

template <int BITS>
void launch_grouped_n(const DeviceWeight& w, int64_t rows_e, const int32_t* off, int64_t n_expert, int64_t max_rows,
                      const uint16_t* x, float* y, int64_t ldy, cudaStream_t stream) {
    if (max_rows <= 8) launch_grouped<BITS, 1>(w, rows_e, off, n_expert, max_rows, x, y, ldy, stream);
    else if (max_rows <= 32) launch_grouped<BITS, 4>(w, rows_e, off, n_expert, max_rows, x, y, ldy, stream);
    else launch_grouped<BITS, 8>(w, rows_e, off, n_expert, max_rows, x, y, ldy, stream);
}

constexpr int bq_bits_of(DType t) {
    switch (t) {
        case DType::Q4_0: case DType::Q4_1: case DType::Q4_K: return 4;
        case DType::Q5_0: case DType::Q5_1: case DType::Q5_K: case DType::Q6_K: return 8;
        default: return 0;
    }
}

template <DType T>
void convert(const DeviceWeight& w, uint8_t* q, uint8_t* sc, cudaStream_t stream) {
    const DeqArgs a{static_cast<const uint8_t*>(w.q), static_cast<const uint8_t*>(w.q2),
                    static_cast<const uint8_t*>(w.s), static_cast<const uint8_t*>(w.s2), w.K};
    const int64_t tiles = (w.N + kTile - 1) / kTile;
    const int64_t threads = tiles * (w.K / kChunk) * 32;
    const auto blocks = static_cast<unsigned>(std::clamp<int64_t>((threads + 255) / 256, 1, 65535));
    to_bq_kernel<T, bq_bits_of(T) == 4 ? 4 : 8><<<blocks, 256, 0, stream>>>(a, w.N, tiles, q, sc);
}

}  // namespace

bool bq_supported(DType t, int64_t K) { return bq_bits_of(t) != 0 && K > 0 && K % kChunk == 0; }

size_t bq_bytes(const DeviceWeight& w) {
    const int bits = bq_bits_of(w.type);
    if (!bq_supported(w.type, w.K) || w.N < 1) return 0;
    const int64_t tc = (w.N + kTile - 1) / kTile * (w.K / kChunk);
    return static_cast<size_t>(tc) * (32 * record_bytes(bits) + scale_bytes(bits));
}

void make_resident_bq(DeviceWeight& w, cudaStream_t stream) {
    if (w.bq) return;
    if (!bq_supported(w.type, w.K) || !w.q || w.N < 1)
        throw_error(std::string("make_resident_bq: no small-batch layout for ") + std::string(dtype_name(w.type)) +
                    " rows of " + std::to_string(w.K));
    const int bits = bq_bits_of(w.type);
    DeviceBuffer b(bq_bytes(w));  // quern::Error when out of memory
    const int64_t tc = (w.N + kTile - 1) / kTile * (w.K / kChunk);
    uint8_t* q = b.as<uint8_t>();
    uint8_t* sc = q + static_cast<size_t>(tc) * 32 * record_bytes(bits);
    switch (w.type) {
        case DType::Q4_0: convert<DType::Q4_0>(w, q, sc, stream); break;
        case DType::Q4_1: convert<DType::Q4_1>(w, q, sc, stream); break;
        case DType::Q4_K: convert<DType::Q4_K>(w, q, sc, stream); break;
        case DType::Q5_0: convert<DType::Q5_0>(w, q, sc, stream); break;
        case DType::Q5_1: convert<DType::Q5_1>(w, q, sc, stream); break;
        case DType::Q5_K: convert<DType::Q5_K>(w, q, sc, stream); break;
        case DType::Q6_K: convert<DType::Q6_K>(w, q, sc, stream); break;
        default: break;
    }
    QUERN_CUDA_CHECK_LAUNCH();
    QUERN_CUDA_CHECK(cudaStreamSynchronize(stream));
    w.bq_buf = std::move(b);
    w.bq = w.bq_buf.as<uint8_t>();
    w.bq_bits = bits;
}

void bq_gemm(const DeviceWeight& w, int64_t row0, int64_t rows, const uint16_t* xb, int64_t n, float* y, int64_t ldy,
             cudaStream_t stream) {
    if (!w.bq) throw_error("bq_gemm: the weight has no small-batch layout (make_resident_bq)");
    if (!xb || !y) throw_error("bq_gemm: null pointer");
    if (n < 1 || n > kBqMaxRows || rows < 1 || row0 < 0 || row0 % kTile != 0 || row0 + rows > w.N || ldy < rows)
        throw_error("bq_gemm: shape out of range");
    if (reinterpret_cast<uintptr_t>(xb) % 16 != 0) throw_error("bq_gemm: activations must be 16-byte aligned");
    const int64_t tiles = (rows + kTile - 1) / kTile, C = w.K / kChunk;
    const BqParts wp = bq_parts(w, row0 / kTile);
    const int nn = static_cast<int>(n);
    if (w.bq_bits == 4) launch_bq_n<4>(wp, C, w.K, tiles, rows, xb, nn, y, ldy, stream);
    else launch_bq_n<8>(wp, C, w.K, tiles, rows, xb, nn, y, ldy, stream);
    QUERN_CUDA_CHECK_LAUNCH();
}

bool bq_glu_supported(const DeviceWeight& gate, const DeviceWeight& up, int64_t n) {
    if (!gate.bq || !up.bq || gate.bq_bits != up.bq_bits || gate.K != up.K || n < 1 || n > kBqGluMaxRows) return false;
    const int nn = static_cast<int>(n);
    return (gate.bq_bits == 4 ? glu_smem<4>(nn) : glu_smem<8>(nn)) <= smem_optin();
}

void bq_gemm_glu(const DeviceWeight& gate, int64_t gate_row0, const DeviceWeight& up, int64_t up_row0, int64_t rows,
                 const uint16_t* xb, int64_t n, uint16_t* h, int64_t ldh, bool gelu, cudaStream_t stream) {
    if (!gate.bq || !up.bq) throw_error("bq_gemm_glu: a weight has no small-batch layout (make_resident_bq)");
    if (!xb || !h) throw_error("bq_gemm_glu: null pointer");
    if (!bq_glu_supported(gate, up, n) || rows < 1 || gate_row0 < 0 || up_row0 < 0 || gate_row0 % kTile != 0 ||
        up_row0 % kTile != 0 || gate_row0 + rows > gate.N || up_row0 + rows > up.N || ldh < rows)
        throw_error("bq_gemm_glu: shapes out of range or the two layouts differ");
    if (reinterpret_cast<uintptr_t>(xb) % 16 != 0) throw_error("bq_gemm_glu: activations must be 16-byte aligned");
    const int64_t tiles = (rows + kTile - 1) / kTile, C = gate.K / kChunk;
    const BqParts g = bq_parts(gate, gate_row0 / kTile), u = bq_parts(up, up_row0 / kTile);
    const int nn = static_cast<int>(n);
    if (gate.bq_bits == 4) launch_glu_n<4>(g, u, C, gate.K, tiles, rows, xb, nn, h, ldh, gelu, stream);
    else launch_glu_n<8>(g, u, C, gate.K, tiles, rows, xb, nn, h, ldh, gelu, stream);
    QUERN_CUDA_CHECK_LAUNCH();
}

void bq_gemm_set_form(int form) {
    g_form.store(device_has_wgmma() ? std::clamp(form, 0, kBqLastForm) : 0, std::memory_order_relaxed);
}

int bq_gemm_form() { return form_now(); }

void bq_gemm_grouped(const DeviceWeight& w, int64_t rows, const int32_t* off, int64_t n_expert, int64_t max_rows,
                     const uint16_t* xb, float* y, int64_t ldy, cudaStream_t stream) {
    if (!w.bq) throw_error("bq_gemm_grouped: the bank has no small-batch layout (make_resident_bq)");
    if (!off || !xb || !y) throw_error("bq_gemm_grouped: null pointer");
    if (rows < 1 || rows % kTile != 0 || n_expert < 1 || n_expert * rows > w.N || n_expert > 65535 || ldy < rows ||
        max_rows < 0 || max_rows > int64_t{65535} * 8)
        throw_error("bq_gemm_grouped: shape out of range");
    if (reinterpret_cast<uintptr_t>(xb) % 16 != 0) throw_error("bq_gemm_grouped: activations must be 16-byte aligned");
    if (max_rows == 0) return;
    if (w.bq_bits == 4) launch_grouped_n<4>(w, rows, off, n_expert, max_rows, xb, y, ldy, stream);
    else launch_grouped_n<8>(w, rows, off, n_expert, max_rows, xb, y, ldy, stream);
    QUERN_CUDA_CHECK_LAUNCH();
}

}  // namespace quern::cuda
