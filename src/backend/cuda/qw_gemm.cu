// GEMM on the resident quantized weights: kernel and launch (API, method and
// numerics: qw_gemm.h).
#include "backend/cuda/qw_gemm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "backend/cuda/bq_common.cuh"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/qw_common.cuh"

namespace quern::cuda {
namespace {

using deq::DeqArgs;
using mma::cp_async16;
using mma::cp_async_commit;
using mma::cp_async_wait;

constexpr int kQwStages = 5;  // chunks in the shared-memory ring; copies run three chunks ahead

// Bytes of one weight row in a stage: the chunk's two sub-blocks of quants
// (32), then for Q4_K the super-block head (16), for Q6_K the high bits
// (16), the four int8 scales (4) and the 4-byte word holding the fp16 d (4),
// padded to 80. Strides of 48 and 80 bytes put the 16-byte reads of a warp's
// eight rows in different banks.
template <DType T>
__host__ __device__ constexpr int row_bytes() {
    return T == DType::Q4_K ? 48 : 80;
}

template <DType T, int NT, int MW>
struct QwShape {
    static constexpr int kTok = 8 * NT;      // activation rows per block
    static constexpr int kRows = 128 * MW;   // weight rows per block: two warpgroups of MW 64-row groups
    static constexpr int kAct = kTok * 128;  // a chunk of the activations: 128-byte rows, swizzled
    static constexpr int kStage = kAct + kRows * row_bytes<T>();
    static constexpr int kRing = kQwStages * kStage;
    // Per warp and 16-row tile, the chunk's scale records (ChunkA::prep):
    // 512 bytes, after the ring.
    static constexpr int kScales = kWarps * MW * 512;
    static constexpr int kRed = MW * NT * 4 * kThreads * 4;  // bq_finish's partial sums
    // + the ring's alignment to the 1024-byte swizzle atoms.
    static constexpr int kSmem = (kRing + kScales > kRed ? kRing + kScales : kRed) + 1024;
    static_assert(kAct % 1024 == 0 && kStage % 1024 == 0, "stages of whole swizzle atoms");
};

#ifdef QUERN_WGMMA  // the decoding below exists in the sm_90a device pass only
__device__ __forceinline__ uint32_t lds32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Bytes 2h and 2h+1 of w into bits 0..7 and 16..23 (h = 0, 1), zeros between.
__device__ __forceinline__ uint32_t half_bytes(uint32_t w, uint32_t sel) { return __byte_perm(w, 0, sel); }

// One chunk (64 elements, steps j = 0..3 taking elements 16j .. 16j+15) of
// rows g (record r0) and g+8 (r1) of a warp's tile, read from their staged
// records. prep(): lane L turns the staged scales of one piece of the tile
// (tile row L/2; Q4_K: sub-block L%2, Q6_K: 16-element groups 2·(L%2) and
// +1) into the BF16 pairs the decode takes and stores them in the warp's
// 512-byte scale area — once per piece rather than in each of the four
// lanes that decode a row, the arithmetic (a division, roundings,
// conversions) that otherwise outweighed the decoding itself. load()
// (after __syncwarp) takes the quant words and those pairs, step(j) decodes
// the A fragment of step j. Lane c holds elements 2c, 2c+1 (a[0], a[1]) and
// 2c+8, 2c+9 (a[2], a[3]) of each step: bytes 2c, 2c+1 and 2c+8, 2c+9 of
// the sub-block's 16 quant bytes, whose low nibbles are elements 0..15 and
// high nibbles 16..31 (weights.h), so the K order is the natural one.
template <DType T>
struct ChunkA;

// Words of bytes 2c.. (wa) and 2c+8.. (wb) of each row's two sub-blocks.
struct QuantWords {
    uint32_t wa[2][2], wb[2][2];  // [row][sub-block]
    uint32_t sel;                 // byte_perm selector of bytes 2c, 2c+1 (half (c & 1) of a word)
    __device__ __forceinline__ void load(const uint8_t* const (&rec)[2], int c) {
        sel = (c & 1) ? 0x4342u : 0x4140u;
        const int wo = 4 * (c >> 1);
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                wa[rr][b] = lds32(rec[rr] + 16 * b + wo);
                wb[rr][b] = lds32(rec[rr] + 16 * b + 8 + wo);
            }
    }
    // The nibble pair of step j (sub-block j/2, low or high nibbles) as
    // BF16 bits 128 + q: word `w` of row rr.
    __device__ __forceinline__ uint32_t pair(uint32_t w, int j) const {
        return and_or(half_bytes(w >> (4 * (j & 1)), sel), 0x000F000Fu, 0x43004300u);
    }
};

template <>
struct ChunkA<DType::Q4_K> {
    QuantWords q;
    Scales k[2];  // per sub-block: rows g (index 0), g+8 (1)
    // Record `lane` (16 bytes: {s, s}, {o, o}, {c, c} of affine()) of tile
    // row lane/2, sub-block lane%2 of the chunk (ch: its index in K; the
    // chunk's sub-blocks are 2·(ch%4), +1 of the super-block).
    __device__ __forceinline__ static void prep(const uint8_t* tile, uint8_t* area, int lane, int64_t ch, int) {
        const int b = lane & 1, ch4 = static_cast<int>(ch & 3);
        const uint4 h = *reinterpret_cast<const uint4*>(tile + (lane >> 1) * row_bytes<DType::Q4_K>() + 32);
        const float2 dm = __half22float2(*reinterpret_cast<const __half2*>(&h.x));
        const uint32_t sw = (ch4 < 2 ? h.y : h.z) >> (16 * (ch4 & 1));  // scale bytes of sub-blocks 2·ch4, +1
        const uint32_t sb = (sw >> (8 * b)) & 0xFFu;
        const uint32_t mv = (sb >> 6) | (((h.w >> (4 * (2 * ch4 + b))) & 0xFu) << 2);
        uint32_t c16;
        const uint32_t so =
            so_pair<true>(dm.x * static_cast<float>(sb & 63u), -dm.y * static_cast<float>(mv), 15, 1, c16);
        *reinterpret_cast<uint4*>(area + 16 * lane) =
            make_uint4(__byte_perm(so, 0, 0x1010), __byte_perm(so, 0, 0x3232), c16 | c16 << 16, 0u);
    }
    __device__ __forceinline__ void load(const uint8_t* r0, const uint8_t* r1, int c, const uint8_t* area, int g) {
        const uint8_t* const rec[2] = {r0, r1};
        q.load(rec, c);
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                const uint4 e = *reinterpret_cast<const uint4*>(area + 16 * (2 * (g + 8 * rr) + b));
                k[b].s[rr] = as_bf2(e.x);
                k[b].o[rr] = as_bf2(e.y);
                k[b].c[rr] = as_bf2(e.z);
            }
    }
    __device__ __forceinline__ void step(int j, uint32_t (&a)[4]) const {
        const int b = j >> 1;
        a[0] = affine(q.pair(q.wa[0][b], j), k[b].c[0], k[b].s[0], k[b].o[0]);
        a[1] = affine(q.pair(q.wa[1][b], j), k[b].c[1], k[b].s[1], k[b].o[1]);
        a[2] = affine(q.pair(q.wb[0][b], j), k[b].c[0], k[b].s[0], k[b].o[0]);
        a[3] = affine(q.pair(q.wb[1][b], j), k[b].c[1], k[b].s[1], k[b].o[1]);
    }
};

// Q6_K: value = d·sc·(q − 32), q = low nibble | two high bits << 4; the high
// bits of element 16h + 4i + k sit in word h of the sub-block, byte k, bits
// 2i (i = c/2 for bytes 2c.., 2 + c/2 for bytes 2c+8..).
template <>
struct ChunkA<DType::Q6_K> {
    QuantWords q;
    uint4 qh[2];              // [row]: sub-block 0 words h = 0, 1, then sub-block 1's
    __nv_bfloat162 s[2][4];   // [row][16-element group of the chunk = step]
    int ia;                   // bit of the high bits of bytes 2c.. (2c+8..: ia + 4)
    // Record half lane%2 (8 bytes: {d·sc, d·sc} of groups 2·(lane%2), +1)
    // of tile row lane/2; dpar: the parity of that row's super-block index
    // at the start of K (which half of the staged d word is its d).
    __device__ __forceinline__ static void prep(const uint8_t* tile, uint8_t* area, int lane, int64_t ch, int dpar) {
        const uint8_t* rec = tile + (lane >> 1) * row_bytes<DType::Q6_K>();
        const int dhalf = (dpar + static_cast<int>((ch >> 2) & 1)) & 1;
        const uint32_t scw = lds32(rec + 48) >> (16 * (lane & 1)), dw = lds32(rec + 52);
        const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(dw >> (16 * dhalf))));
        const auto sc = [&](int i) { return static_cast<float>(static_cast<int8_t>((scw >> (8 * i)) & 0xFFu)); };
        *reinterpret_cast<uint2*>(area + 8 * lane) =
            make_uint2(as_u32(__float2bfloat162_rn(d * sc(0))), as_u32(__float2bfloat162_rn(d * sc(1))));
    }
    __device__ __forceinline__ void load(const uint8_t* r0, const uint8_t* r1, int c, const uint8_t* area, int g) {
        const uint8_t* const rec[2] = {r0, r1};
        q.load(rec, c);
        ia = 2 * (c >> 1);
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            qh[rr] = *reinterpret_cast<const uint4*>(rec[rr] + 32);
            const uint4 e = *reinterpret_cast<const uint4*>(area + 16 * (g + 8 * rr));
            s[rr][0] = as_bf2(e.x);
            s[rr][1] = as_bf2(e.y);
            s[rr][2] = as_bf2(e.z);
            s[rr][3] = as_bf2(e.w);
        }
    }
    __device__ __forceinline__ void step(int j, uint32_t (&a)[4]) const {
        const int b = j >> 1, hi = j & 1;
        const __nv_bfloat162 zero = as_bf2(0u), centre = as_bf2(0x43204320u);  // 128 + 32
        uint32_t x[4];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            const uint32_t hw = b == 0 ? (hi ? qh[rr].y : qh[rr].x) : (hi ? qh[rr].w : qh[rr].z);
            const uint32_t hp = half_bytes(hw, q.sel);
            x[rr] = q.pair(q.wa[rr][b], j) | (((hp >> ia) & 0x00030003u) << 4);
            x[2 + rr] = q.pair(q.wb[rr][b], j) | (((hp >> (ia + 4)) & 0x00030003u) << 4);
        }
        a[0] = affine(x[0], centre, s[0][j], zero);
        a[1] = affine(x[1], centre, s[1][j], zero);
        a[2] = affine(x[2], centre, s[0][j], zero);
        a[3] = affine(x[3], centre, s[1][j], zero);
    }
};

#endif  // QUERN_WGMMA

using QwSeg = qw::Seg;
using QwSegs = qw::Segs;

// qw_kernel<T, NT, MW>
//   Shapes:  a: the matrix in its resident layout (weights.h); the product
//            covers weight rows row0 .. row0+rows−1 (output column j = row
//            row0 + j); x: n_all rows of K BF16 (row stride K); y: n_all
//            rows at stride ldy floats.
//   Grid:    (ceil(rows / (128·MW)), splits, ceil(n_all / (8·NT))) blocks of
//            two warpgroups; block (b, s, t) multiplies weight rows
//            128·MW·b .. (warpgroup G's group m: the 64 rows from
//            64·(G·MW + m), warp w%4 holding 16 of them) by activation rows
//            8·NT·t .. over chunks s·cps .. of K. Per chunk: the block copies
//            its weight rows' records (row_bytes) and its activation rows
//            (128-byte K-major rows, 128-byte swizzle) into the ring slot
//            of the chunk kQwStages−2 ahead (cp.async from addresses fixed
//            before the loop; activation rows past n_all zero-filled, weight
//            rows past the product read its last row and are never stored);
//            each warp makes its tiles' scale records (ChunkA::prep), then
//            decodes its A fragments step by step once the previous chunk's
//            products of that step are done, and its warpgroup issues MW
//            wgmma per step as one commit group, which run while the next
//            steps, the next chunk's barrier, copies and decoding proceed.
//            One barrier per chunk.
//   Output:  bq_finish (K splits > 1: added over the cluster in split order).
//   Bound:   the instructions each warp issues per chunk (copies, scales,
//            decoding: independent of the activation rows) below ~128
//            rows; above, 400-480 TFLOP/s on an H100, not yet the tensor
//            cores' rate (limit not yet found).
template <DType T, int NT, int MW>
__global__ void __launch_bounds__(kThreads, NT * MW <= 8 ? 2 : 1)
    qw_kernel(QwSegs segs, const uint16_t* __restrict__ x, int n_all, float* __restrict__ y_all, int64_t ldy,
              int cps) {
#ifdef QUERN_WGMMA
    using Sh = QwShape<T, NT, MW>;
    constexpr int S = kQwStages, R = Sh::kRows, RB = row_bytes<T>();
    extern __shared__ __align__(128) uint8_t smem_raw[];
    uint8_t* const smem =
        smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
    const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wq4 = warp & 3, g = lane >> 2, c = lane & 3;
    const int bx = static_cast<int>(blockIdx.x);
    const int seg = (segs.count > 1 && bx >= segs.s[1].bx0) + (segs.count > 2 && bx >= segs.s[2].bx0);
    static_assert(kQwMaxPieces == 3, "the segment choice below");
    const QwSeg& sg = seg == 0 ? segs.s[0] : seg == 1 ? segs.s[1] : segs.s[2];
    const DeqArgs a = sg.a;
    const int64_t row0 = sg.row0, rows = sg.rows;
    const int64_t K = a.K, C = K / kChunk, KS = K / 256;
    const int64_t rb0 = (bx - sg.bx0) * R;
    const int t0 = static_cast<int>(blockIdx.z) * Sh::kTok;
    const int n = n_all - t0 < Sh::kTok ? n_all - t0 : Sh::kTok;
    float* y = y_all + static_cast<int64_t>(t0) * ldy + sg.ycol;
    const int64_t cb = static_cast<int64_t>(blockIdx.y) * cps;
    const int nch = static_cast<int>((C < cb + cps ? C : cb + cps) - cb);
    const auto wrow = [&](int r) { return row0 + (rb0 + r < rows ? rb0 + r : rows - 1); };  // absolute row

    // Activation piece k of this thread: K half hh of token ta + 32k at step
    // ja of the chunk, 16 bytes; the two halves of a token's step are one
    // 32-byte span of x. Token t's chunk is a 128-byte row of the stage
    // whose 16-byte unit u sits at u ^ (t % 8) (wgmma_desc_sw128): a k16
    // step's eight rows of an atom hit every bank.
    constexpr int PA = Sh::kTok * 8 / kThreads;
    static_assert(PA >= 1 && Sh::kTok * 8 % kThreads == 0, "whole activation pieces per thread");
    const int hh = tid & 1, ja = (tid >> 4) & 3, ta = 8 * (tid >> 6) + ((tid >> 1) & 7);
    const uint32_t adst = static_cast<uint32_t>(ta * 128 + (((2 * ja + hh) ^ (ta & 7)) << 4));
    const uint16_t* const xa = x + static_cast<int64_t>(t0) * K + cb * kChunk + 16 * ja + 8 * hh;
    uint32_t aoff[PA];  // elements from xa (dead tokens read token 0's row and write zeros)
#pragma unroll
    for (int k = 0; k < PA; ++k) aoff[k] = static_cast<uint32_t>((ta + 32 * k < n ? ta + 32 * k : 0) * K);
    // Weight pieces of 16 bytes: k < MW the quant half tid%2 of record row
    // (kThreads·k + tid)/2; then row tid's head (Q4_K: one per super-block)
    // or high bits (Q6_K), for tid < R. Q6_K also copies 4-byte pieces of
    // rows kThreads·k + tid (k < MW; p < R the scales, else the d word of
    // row p − R).
    const uint8_t* wq[MW];
    uint32_t wqd[MW];
#pragma unroll
    for (int k = 0; k < MW; ++k) {
        const int r = (kThreads * k + tid) >> 1;
        wq[k] = a.q + wrow(r) * (K / 2) + 32 * cb + 16 * hh;
        wqd[k] = static_cast<uint32_t>(r * RB + 16 * hh);
    }
    static_assert(R <= kThreads, "one head piece per thread");
    const bool hok = tid < R;
    const uint8_t* const wh =
        T == DType::Q4_K ? a.s + wrow(tid) * KS * 16 : a.q2 + wrow(tid) * (K / 4) + 16 * cb;
    const uint32_t whd = static_cast<uint32_t>(tid * RB + 32);
    int64_t w4o[MW];  // Q6_K: bytes into a.s (scales at chunk cb) or the row's first super-block index (d words)
    uint32_t w4d[MW];
    bool w4s[MW];     // scales (true) or d word
    if constexpr (T == DType::Q6_K) {
#pragma unroll
        for (int k = 0; k < MW; ++k) {
            const int p = kThreads * k + tid, r = p < R ? p : p - R;
            w4s[k] = p < R;
            w4o[k] = w4s[k] ? wrow(r) * (K / 16) + 4 * cb : wrow(r) * KS;
            w4d[k] = static_cast<uint32_t>(r * RB + (w4s[k] ? 48 : 52));
        }
    }
    const auto issue = [&](int i, int slot) {
        if (i < nch) {
            const uint32_t st = sbase + static_cast<uint32_t>(slot * Sh::kStage);
            const uint16_t* xi = xa + static_cast<int64_t>(i) * kChunk;
#pragma unroll
            for (int k = 0; k < PA; ++k) cp_async16(st + adst + 4096 * k, xi + aoff[k], ta + 32 * k < n);
            const uint32_t ws = st + Sh::kAct;
#pragma unroll
            for (int k = 0; k < MW; ++k) cp_async16(ws + wqd[k], wq[k] + 32 * i, true);
            const int64_t ch = cb + i;
            if (hok) cp_async16(ws + whd, T == DType::Q4_K ? wh + (ch >> 2) * 16 : wh + 16 * i, true);
            if constexpr (T == DType::Q6_K) {
#pragma unroll
                for (int k = 0; k < MW; ++k) {
                    const uint8_t* src =
                        w4s[k] ? a.s + w4o[k] + 4 * i : a.s2 + ((w4o[k] + (ch >> 2)) * 2 & ~int64_t{3});
                    mma::cp_async4(ws + w4d[k], src, true);
                }
            }
        }
        cp_async_commit();
    };

    float acc[MW][NT][4];
#pragma unroll
    for (int mt = 0; mt < MW; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
#pragma unroll
    for (int i = 0; i < S - 2; ++i) issue(i, i);
    uint8_t* const area = smem + Sh::kRing + warp * (MW * 512);
    int dpar[MW] = {};  // Q6_K: parity of the super-block index of tile row lane/2 at K = 0
    if constexpr (T == DType::Q6_K) {
#pragma unroll
        for (int mt = 0; mt < MW; ++mt) dpar[mt] = static_cast<int>((wrow(64 * (wg * MW + mt) + 16 * wq4 + (lane >> 1)) * KS) & 1);
    }
    uint32_t af[MW][4][4];
    ChunkA<T> ca[MW];
    int rd = 0, wr = S - 2;  // ring slots of chunk i and of chunk i + S − 2
    // Chunk i. Each step's products are their own commit group, issued as
    // soon as the step is decoded; before a step's fragments are written
    // again, the previous chunk's products of that step must be done: at
    // most three later groups may still run (wgmma_wait<3>), so the tensor
    // cores keep three steps queued while the next is decoded, across the
    // chunk's barrier and copies too.
    const auto chunk = [&](int i) {
        cp_async_wait<S - 3>();  // this thread's pieces of chunk i are in
        mma::fence_proxy_async_smem();
        __syncthreads();         // everyone's; every warpgroup is past chunk i − 2's products
        issue(i + S - 2, wr);    // into chunk i − 2's slot
        const int64_t ch = cb + i;
        const uint8_t* ws = smem + rd * Sh::kStage + Sh::kAct;
#pragma unroll
        for (int mt = 0; mt < MW; ++mt)
            ChunkA<T>::prep(ws + (64 * (wg * MW + mt) + 16 * wq4) * RB, area + 512 * mt, lane, ch, dpar[mt]);
        __syncwarp();
#pragma unroll
        for (int mt = 0; mt < MW; ++mt) {
            const uint8_t* tile = ws + (64 * (wg * MW + mt) + 16 * wq4) * RB;
            ca[mt].load(tile + g * RB, tile + (g + 8) * RB, c, area + 512 * mt, g);
        }
        const uint32_t st = sbase + static_cast<uint32_t>(rd * Sh::kStage);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            mma::wgmma_wait<3>();  // the previous chunk's step j (its A registers)
#pragma unroll
            for (int mt = 0; mt < MW; ++mt) {
                ca[mt].step(j, af[mt][j]);
                mma::fence_operand(af[mt][j]);  // decoded before the fence
            }
            mma::wgmma_fence();
            const uint64_t desc = mma::wgmma_desc_sw128(st + 32 * j);
#pragma unroll
            for (int mt = 0; mt < MW; ++mt) mma::wgmma_bf16<NT>(acc[mt], af[mt][j], desc);
            mma::wgmma_commit();
        }
        rd = rd + 1 == S ? 0 : rd + 1;
        wr = wr + 1 == S ? 0 : wr + 1;
    };
    // Chunk 0 before the loop (every split has one): inside the loop the
    // accumulators then only ever come from wgmma (ptxas serializes the
    // products when the zero-initialized accumulators reach the loop).
    chunk(0);
    for (int i = 1; i < nch; ++i) chunk(i);
    mma::wgmma_wait<0>();
    cp_async_wait<0>();
    const int64_t tb = rb0 / kTile;
    bq_finish<MW, NT, false>(
        acc, [&](int mt) { return tb + 4 * (wg * MW + mt) + wq4; }, rows, n, y, ldy, BqGlu{}, smem);
#else
    __trap();  // launched only on devices that run the sm_90a code (qw_supported)
#endif
}

template <DType T, int NT, int MW>
void launch_qw(QwSegs segs, const uint16_t* x, int n, float* y, int64_t ldy, cudaStream_t stream) {
    using Sh = QwShape<T, NT, MW>;
    const auto kernel = qw_kernel<T, NT, MW>;
    static const auto active = active_clusters(kernel, Sh::kSmem);
    int64_t bx = 0;
    for (int i = 0; i < segs.count; ++i) {
        segs.s[i].bx0 = bx;
        bx += (segs.s[i].rows + Sh::kRows - 1) / Sh::kRows;
    }
    const int64_t C = segs.s[0].a.K / kChunk, tz = (n + Sh::kTok - 1) / Sh::kTok;
    // A split's partial sums (NT·MW·4 KiB per block) cross the cluster's
    // shared memory: about NT·MW/2 chunks' time (on an H100, 8 splits of
    // Llama-3-8B's gate|up at 16-256 rows took 2-4x one split without it).
    int64_t splits = pick_splits(bx * tz, C, active, NT * MW / 2);
    const int64_t cps = (C + splits - 1) / splits;
    splits = (C + cps - 1) / cps;
    const ClusterLaunch l(dim3(static_cast<unsigned>(bx), static_cast<unsigned>(splits), static_cast<unsigned>(tz)),
                          static_cast<unsigned>(splits), Sh::kSmem, stream);
    QUERN_CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, kernel, segs, x, n, y, ldy, static_cast<int>(cps)));
}

std::atomic<int> g_tokens{0}, g_groups{0};  // qw_gemm_set_shape (0: by the shape)
std::atomic<int> g_form{static_cast<int>(QwForm::kAuto)};  // qw_gemm_set_form

// The default token tile for n activation rows of the launch's pieces: the
// tile that covers n up to 128 rows; beyond, 256 where that still gives half
// the SMs a block, else 128. On an H100 with Llama-3-8B's matrices this
// picked the fastest shape or one within 8 % of it at 256-2048 rows: gate|up
// and the output head take 256 from 256 rows, Q|K|V from 512, the 4096-row
// matrices from 1024 (bench/batched-cuda-h200.md).
int default_tokens(int n, const QwSegs& segs) {
    if (n <= 128) return n <= 32 ? 32 : n <= 64 ? 64 : 128;
    int64_t row_blocks = 0;  // of 128 weight rows, as the 256-token kernel has
    for (int i = 0; i < segs.count; ++i) row_blocks += (segs.s[i].rows + 127) / 128;
    const int64_t blocks256 = row_blocks * ((n + 255) / 256);
    return 2 * blocks256 >= CudaContext::current_sm_count() ? 256 : 128;
}

template <DType T>
void launch_qw_n(const QwSegs& segs, const uint16_t* x, int n, float* y, int64_t ldy, cudaStream_t stream) {
    int tok = g_tokens.load(std::memory_order_relaxed), grp = g_groups.load(std::memory_order_relaxed);
    if (tok == 0) tok = default_tokens(n, segs);
    if (grp == 0) grp = 1;
    if (tok > 128) return launch_qw<T, 32, 1>(segs, x, n, y, ldy, stream);  // 128 accumulators: one group
    if (tok <= 32) return grp == 1 ? launch_qw<T, 4, 1>(segs, x, n, y, ldy, stream)
                                   : launch_qw<T, 4, 2>(segs, x, n, y, ldy, stream);
    if (tok <= 64) return grp == 1 ? launch_qw<T, 8, 1>(segs, x, n, y, ldy, stream)
                                   : launch_qw<T, 8, 2>(segs, x, n, y, ldy, stream);
    return grp == 1 ? launch_qw<T, 16, 1>(segs, x, n, y, ldy, stream)
                    : launch_qw<T, 16, 2>(segs, x, n, y, ldy, stream);
}

}  // namespace

bool qw_supported(DType t, int64_t K) {
    return (t == DType::Q4_K || t == DType::Q6_K) && K > 0 && K % 256 == 0 && device_has_wgmma();
}

void qw_gemm_pieces(const QwPiece* pieces, int count, const uint16_t* xb, int64_t n, float* y, int64_t ldy,
                    cudaStream_t stream) {
    if (!pieces || count < 1 || count > kQwMaxPieces) throw_error("qw_gemm: 1 to 3 pieces per launch");
    const DeviceWeight* w0 = pieces[0].w;
    if (!xb || !y || !w0) throw_error("qw_gemm: null pointer");
    if (n < 1 || n > (int64_t{1} << 30)) throw_error("qw_gemm: shape out of range");
    if (reinterpret_cast<uintptr_t>(xb) % 16 != 0) throw_error("qw_gemm: activations must be 16-byte aligned");
    QwSegs segs{};
    segs.count = count;
    for (int i = 0; i < count; ++i) {
        const QwPiece& p = pieces[i];
        const DeviceWeight* w = p.w;
        if (!w || !w->q) throw_error("qw_gemm: null pointer");
        if (!qw_supported(w->type, w->K))
            throw_error(std::string("qw_gemm: no quantized-weight GEMM for ") + std::string(dtype_name(w->type)) +
                        " rows of " + std::to_string(w->K) + " on this device");
        if (w->type != w0->type || w->K != w0->K) throw_error("qw_gemm: the pieces of a launch differ in type or K");
        if (p.rows < 1 || p.row0 < 0 || p.row0 + p.rows > w->N || p.ycol < 0 || p.ycol + p.rows > ldy)
            throw_error("qw_gemm: shape out of range");
        segs.s[i] = QwSeg{DeqArgs{static_cast<const uint8_t*>(w->q), static_cast<const uint8_t*>(w->q2),
                                  static_cast<const uint8_t*>(w->s), static_cast<const uint8_t*>(w->s2), w->K},
                          p.row0, p.rows, p.ycol, 0};
    }
    const int nn = static_cast<int>(n);
    const auto form = static_cast<QwForm>(g_form.load(std::memory_order_relaxed));
    const bool tiled = g_tokens.load(std::memory_order_relaxed) != 0;  // a forced tile shape
    if (form == QwForm::kSkinny || (form == QwForm::kAuto && !tiled && n <= kQwSkinnyRows)) {
        qw::launch_skinny(w0->type, segs, xb, nn, y, ldy, stream);
    } else if (w0->type == DType::Q4_K) {
        launch_qw_n<DType::Q4_K>(segs, xb, nn, y, ldy, stream);
    } else {
        launch_qw_n<DType::Q6_K>(segs, xb, nn, y, ldy, stream);
    }
    QUERN_CUDA_CHECK_LAUNCH();
}

void qw_gemm(const DeviceWeight& w, int64_t row0, int64_t rows, const uint16_t* xb, int64_t n, float* y,
             int64_t ldy, cudaStream_t stream) {
    const QwPiece p{&w, row0, rows, 0};
    qw_gemm_pieces(&p, 1, xb, n, y, ldy, stream);
}

bool qw_glu_supported(const DeviceWeight& gate, const DeviceWeight& up, int64_t n) {
    return gate.q && up.q && gate.type == up.type && gate.K == up.K && qw_supported(gate.type, gate.K) && n >= 1 &&
           n <= kQwGluMaxRows;
}

void qw_gemm_glu(const DeviceWeight& gate, int64_t gate_row0, const DeviceWeight& up, int64_t up_row0, int64_t rows,
                 const uint16_t* xb, int64_t n, uint16_t* h, int64_t ldh, bool gelu, cudaStream_t stream) {
    if (!xb || !h) throw_error("qw_gemm_glu: null pointer");
    if (!qw_glu_supported(gate, up, n))
        throw_error("qw_gemm_glu: gate and up must be one type and K that qw_gemm takes, for 1 to " +
                    std::to_string(kQwGluMaxRows) + " activation rows");
    if (rows < 1 || gate_row0 < 0 || up_row0 < 0 || gate_row0 + rows > gate.N || up_row0 + rows > up.N || ldh < rows)
        throw_error("qw_gemm_glu: shape out of range");
    if (reinterpret_cast<uintptr_t>(xb) % 16 != 0) throw_error("qw_gemm_glu: activations must be 16-byte aligned");
    const auto args = [](const DeviceWeight& w) {
        return DeqArgs{static_cast<const uint8_t*>(w.q), static_cast<const uint8_t*>(w.q2),
                       static_cast<const uint8_t*>(w.s), static_cast<const uint8_t*>(w.s2), w.K};
    };
    QwSegs segs{};
    segs.count = 2;
    segs.s[0] = QwSeg{args(gate), gate_row0, rows, 0, 0};
    segs.s[1] = QwSeg{args(up), up_row0, rows, 0, 0};
    qw::launch_skinny_glu(gate.type, segs, xb, static_cast<int>(n), h, ldh, gelu, stream);
    QUERN_CUDA_CHECK_LAUNCH();
}

void qw_gemm_set_form(QwForm form) { g_form.store(static_cast<int>(form), std::memory_order_relaxed); }

void qw_gemm_set_shape(int tokens, int groups) {
    g_tokens.store(tokens <= 0 ? 0 : tokens <= 32 ? 32 : tokens <= 64 ? 64 : tokens <= 128 ? 128 : 256,
                   std::memory_order_relaxed);
    g_groups.store(groups <= 0 ? 0 : groups == 1 ? 1 : 2, std::memory_order_relaxed);
}

}  // namespace quern::cuda
