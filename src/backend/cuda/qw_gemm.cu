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
    static constexpr int kRed = MW * NT * 4 * kThreads * 4;  // bq_finish's partial sums
    // + the ring's alignment to the 1024-byte swizzle atoms.
    static constexpr int kSmem = (kRing > kRed ? kRing : kRed) + 1024;
    static_assert(kAct % 1024 == 0 && kStage % 1024 == 0, "stages of whole swizzle atoms");
};

[[maybe_unused]] __device__ __forceinline__ uint32_t lds32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Bytes 2h and 2h+1 of w into bits 0..7 and 16..23 (h = 0, 1), zeros between.
[[maybe_unused]] __device__ __forceinline__ uint32_t half_bytes(uint32_t w, uint32_t sel) { return __byte_perm(w, 0, sel); }

// One chunk (64 elements, steps j = 0..3 taking elements 16j .. 16j+15) of
// rows g (record r0) and g+8 (r1) of a warp's tile, read from their staged
// records: load() takes the quant words and the scales, step(j) decodes the
// A fragment of step j. Lane c holds elements 2c, 2c+1 (a[0], a[1]) and
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
    // ch4: the chunk's place in its super-block (0..3).
    __device__ __forceinline__ void load(const uint8_t* r0, const uint8_t* r1, int c, int ch4, const int (&)[2]) {
        const uint8_t* const rec[2] = {r0, r1};
        q.load(rec, c);
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            const uint4 h = *reinterpret_cast<const uint4*>(rec[rr] + 32);
            const float2 dm = __half22float2(*reinterpret_cast<const __half2*>(&h.x));
            const uint32_t sw = (ch4 < 2 ? h.y : h.z) >> (16 * (ch4 & 1));  // scale bytes of sub-blocks 2·ch4, +1
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                const uint32_t sb = (sw >> (8 * b)) & 0xFFu;
                const uint32_t mv = (sb >> 6) | (((h.w >> (4 * (2 * ch4 + b))) & 0xFu) << 2);
                uint32_t c16;
                const uint32_t so = so_pair<true>(dm.x * static_cast<float>(sb & 63u), -dm.y * static_cast<float>(mv),
                                                  15, 1, c16);
                k[b].s[rr] = as_bf2(__byte_perm(so, 0, 0x1010));
                k[b].o[rr] = as_bf2(__byte_perm(so, 0, 0x3232));
                k[b].c[rr] = as_bf2(c16 | c16 << 16);
            }
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
    // dhalf[rr]: which half of the staged d word is row rr's d.
    __device__ __forceinline__ void load(const uint8_t* r0, const uint8_t* r1, int c, int, const int (&dhalf)[2]) {
        const uint8_t* const rec[2] = {r0, r1};
        q.load(rec, c);
        ia = 2 * (c >> 1);
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            qh[rr] = *reinterpret_cast<const uint4*>(rec[rr] + 32);
            const uint32_t scw = lds32(rec[rr] + 48), dw = lds32(rec[rr] + 52);
            const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(dw >> (16 * dhalf[rr]))));
#pragma unroll
            for (int g = 0; g < 4; ++g)
                s[rr][g] = __float2bfloat162_rn(d * static_cast<float>(static_cast<int8_t>((scw >> (8 * g)) & 0xFFu)));
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
//            of the chunk kQwStages−2 ahead (cp.async; activation rows past
//            n_all zero-filled, weight rows past the product read its last
//            row and are never stored); each warp decodes its tile's A
//            fragments from the staged records once the previous chunk's
//            products are done, and its warpgroup issues 4·MW wgmma as one
//            commit group, which run while the next chunk's barrier, copies
//            and decoding proceed. One barrier per chunk.
//   Output:  bq_finish (K splits > 1: added over the cluster in split order).
//   Bound:   meant to be the tensor cores from ~64 activation rows on and
//            the weights' bytes below; measured ~1.5 us per chunk whatever
//            the rows (qw_gemm.h), the limit not yet found.
template <DType T, int NT, int MW>
__global__ void __launch_bounds__(kThreads, NT * MW <= 8 ? 2 : 1)
    qw_kernel(DeqArgs a, int64_t row0, int64_t rows, const uint16_t* __restrict__ x, int n_all,
              float* __restrict__ y_all, int64_t ldy, int cps) {
#ifdef QUERN_WGMMA
    using Sh = QwShape<T, NT, MW>;
    constexpr int S = kQwStages, R = Sh::kRows, RB = row_bytes<T>();
    extern __shared__ __align__(128) uint8_t smem_raw[];
    uint8_t* const smem =
        smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wq4 = warp & 3, g = lane >> 2, c = lane & 3;
    const int64_t K = a.K, C = K / kChunk;
    const int64_t rb0 = static_cast<int64_t>(blockIdx.x) * R;
    const int t0 = static_cast<int>(blockIdx.z) * Sh::kTok;
    const int n = n_all - t0 < Sh::kTok ? n_all - t0 : Sh::kTok;
    float* y = y_all + static_cast<int64_t>(t0) * ldy;
    const int64_t cb = static_cast<int64_t>(blockIdx.y) * cps;
    const int64_t nch = (C < cb + cps ? C : cb + cps) - cb;
    const auto wrow = [&](int r) { return row0 + (rb0 + r < rows ? rb0 + r : rows - 1); };  // absolute row

    // Activation pieces: q = k·kThreads + tid is K half hh = q%2 of token
    // 8·g8 + r8 (r8 = q/2%8) at step j = q/16%4, g8 = q/64: 16 bytes; the two
    // halves of a token's step are one 32-byte span of x. Token t's chunk is
    // a 128-byte row of the stage whose 16-byte unit u sits at u ^ (t % 8)
    // (wgmma_desc_sw128): a k16 step's eight rows of an atom hit every bank.
    constexpr int PA = Sh::kTok * 8 / kThreads;
    static_assert(PA >= 1 && Sh::kTok * 8 % kThreads == 0, "whole activation pieces per thread");
    uint32_t adst[PA];
    const uint16_t* asrc[PA];
    bool alive[PA];
#pragma unroll
    for (int k = 0; k < PA; ++k) {
        const int q = k * kThreads + tid, hh = q & 1, r8 = (q >> 1) & 7, j = (q >> 4) & 3, g8 = q >> 6;
        const int t = 8 * g8 + r8;
        adst[k] = static_cast<uint32_t>(t * 128 + (((2 * j + hh) ^ (t & 7)) << 4));
        alive[k] = t < n;
        asrc[k] = x + static_cast<int64_t>(t0 + (t < n ? t : 0)) * K + 16 * j + 8 * hh;
    }
    // Weight pieces of 16 bytes: p < 2R: quant half p%2 of row p/2; p < 3R:
    // row p − 2R's head (Q4_K) or high bits (Q6_K). Q6_K also copies 4-byte
    // pieces: p < R the scales, p < 2R the d word of row p − R.
    constexpr int PW = (3 * R + kThreads - 1) / kThreads;
    const int64_t KS = K / 256;
    const auto issue = [&](int64_t i) {
        if (i < nch) {
            const int64_t ch = cb + i;
            uint8_t* st = smem + (i % S) * Sh::kStage;
#pragma unroll
            for (int k = 0; k < PA; ++k) cp_async16(st + adst[k], asrc[k] + kChunk * ch, alive[k]);
            uint8_t* ws = st + Sh::kAct;
#pragma unroll
            for (int k = 0; k < PW; ++k) {
                const int p = k * kThreads + tid;
                if (p < 2 * R) {
                    const int r = p >> 1, h = p & 1;
                    cp_async16(ws + r * RB + 16 * h, a.q + wrow(r) * (K / 2) + 32 * ch + 16 * h, true);
                } else if (p < 3 * R) {
                    const int r = p - 2 * R;
                    const uint8_t* src = T == DType::Q4_K ? a.s + (wrow(r) * KS + (ch >> 2)) * 16
                                                          : a.q2 + wrow(r) * (K / 4) + 16 * ch;
                    cp_async16(ws + r * RB + 32, src, true);
                }
            }
            if constexpr (T == DType::Q6_K) {
                constexpr int P4 = (2 * R + kThreads - 1) / kThreads;
#pragma unroll
                for (int k = 0; k < P4; ++k) {
                    const int p = k * kThreads + tid;
                    if (p >= 2 * R) continue;
                    const int r = p < R ? p : p - R;
                    const uint8_t* src = p < R ? a.s + wrow(r) * (K / 16) + 4 * ch
                                               : a.s2 + ((wrow(r) * KS + (ch >> 2)) * 2 & ~int64_t{3});
                    const auto dst = static_cast<uint32_t>(__cvta_generic_to_shared(ws + r * RB + (p < R ? 48 : 52)));
                    mma::cp_async4(dst, src, true);
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
    for (int i = 0; i < S - 2; ++i) issue(i);
    const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    uint32_t af[MW][4][4];
    ChunkA<T> ca[MW];
    // Chunk i. Each step's products are their own commit group, issued as
    // soon as the step is decoded; before a step's fragments are written
    // again, the previous chunk's products of that step must be done: at
    // most three later groups may still run (wgmma_wait<3>), so the tensor
    // cores keep three steps queued while the next is decoded, across the
    // chunk's barrier and copies too.
    const auto chunk = [&](int64_t i) {
        cp_async_wait<S - 3>();  // this thread's pieces of chunk i are in
        mma::fence_proxy_async_smem();
        __syncthreads();         // everyone's; every warpgroup is past chunk i − 2's products
        issue(i + S - 2);        // into chunk i − 2's slot
        const int64_t ch = cb + i;
        const uint8_t* ws = smem + (i % S) * Sh::kStage + Sh::kAct;
#pragma unroll
        for (int mt = 0; mt < MW; ++mt) {
            const int lr = 64 * (wg * MW + mt) + 16 * wq4 + g;
            int dhalf[2] = {0, 0};
            if constexpr (T == DType::Q6_K) {
                dhalf[0] = static_cast<int>((wrow(lr) * KS + (ch >> 2)) & 1);
                dhalf[1] = static_cast<int>((wrow(lr + 8) * KS + (ch >> 2)) & 1);
            }
            ca[mt].load(ws + lr * RB, ws + (lr + 8) * RB, c, static_cast<int>(ch & 3), dhalf);
        }
        const uint32_t st = sbase + static_cast<uint32_t>((i % S) * Sh::kStage);
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
    };
    // Chunk 0 before the loop (every split has one): inside the loop the
    // accumulators then only ever come from wgmma (ptxas serializes the
    // products when the zero-initialized accumulators reach the loop).
    chunk(0);
    for (int64_t i = 1; i < nch; ++i) chunk(i);
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
void launch_qw(const DeqArgs& a, int64_t row0, int64_t rows, const uint16_t* x, int n, float* y, int64_t ldy,
               cudaStream_t stream) {
    using Sh = QwShape<T, NT, MW>;
    const auto kernel = qw_kernel<T, NT, MW>;
    static const auto active = active_clusters(kernel, Sh::kSmem);
    const int64_t C = a.K / kChunk, bx = (rows + Sh::kRows - 1) / Sh::kRows, tz = (n + Sh::kTok - 1) / Sh::kTok;
    int64_t splits = pick_splits(bx * tz, C, active);
    const int64_t cps = (C + splits - 1) / splits;
    splits = (C + cps - 1) / cps;
    const ClusterLaunch l(dim3(static_cast<unsigned>(bx), static_cast<unsigned>(splits), static_cast<unsigned>(tz)),
                          static_cast<unsigned>(splits), Sh::kSmem, stream);
    QUERN_CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, kernel, a, row0, rows, x, n, y, ldy, static_cast<int>(cps)));
}

std::atomic<int> g_tokens{0}, g_groups{0};  // qw_gemm_set_shape (0: by the shape)

template <DType T>
void launch_qw_n(const DeqArgs& a, int64_t row0, int64_t rows, const uint16_t* x, int n, float* y, int64_t ldy,
                 cudaStream_t stream) {
    int tok = g_tokens.load(std::memory_order_relaxed), grp = g_groups.load(std::memory_order_relaxed);
    if (tok == 0) tok = n <= 32 ? 32 : n <= 64 ? 64 : 128;
    if (grp == 0) grp = 1;
    if (tok <= 32) return grp == 1 ? launch_qw<T, 4, 1>(a, row0, rows, x, n, y, ldy, stream)
                                   : launch_qw<T, 4, 2>(a, row0, rows, x, n, y, ldy, stream);
    if (tok <= 64) return grp == 1 ? launch_qw<T, 8, 1>(a, row0, rows, x, n, y, ldy, stream)
                                   : launch_qw<T, 8, 2>(a, row0, rows, x, n, y, ldy, stream);
    return grp == 1 ? launch_qw<T, 16, 1>(a, row0, rows, x, n, y, ldy, stream)
                    : launch_qw<T, 16, 2>(a, row0, rows, x, n, y, ldy, stream);
}

}  // namespace

bool qw_supported(DType t, int64_t K) {
    return (t == DType::Q4_K || t == DType::Q6_K) && K > 0 && K % 256 == 0 && device_has_wgmma();
}

void qw_gemm(const DeviceWeight& w, int64_t row0, int64_t rows, const uint16_t* xb, int64_t n, float* y,
             int64_t ldy, cudaStream_t stream) {
    if (!qw_supported(w.type, w.K))
        throw_error(std::string("qw_gemm: no quantized-weight GEMM for ") + std::string(dtype_name(w.type)) +
                    " rows of " + std::to_string(w.K) + " on this device");
    if (!xb || !y || !w.q) throw_error("qw_gemm: null pointer");
    if (n < 1 || n > (int64_t{1} << 30) || rows < 1 || row0 < 0 || row0 + rows > w.N || ldy < rows)
        throw_error("qw_gemm: shape out of range");
    if (reinterpret_cast<uintptr_t>(xb) % 16 != 0) throw_error("qw_gemm: activations must be 16-byte aligned");
    const DeqArgs a{static_cast<const uint8_t*>(w.q), static_cast<const uint8_t*>(w.q2),
                    static_cast<const uint8_t*>(w.s), static_cast<const uint8_t*>(w.s2), w.K};
    const int nn = static_cast<int>(n);
    if (w.type == DType::Q4_K) launch_qw_n<DType::Q4_K>(a, row0, rows, xb, nn, y, ldy, stream);
    else launch_qw_n<DType::Q6_K>(a, row0, rows, xb, nn, y, ldy, stream);
    QUERN_CUDA_CHECK_LAUNCH();
}

void qw_gemm_set_shape(int tokens, int groups) {
    g_tokens.store(tokens <= 0 ? 0 : tokens <= 32 ? 32 : tokens <= 64 ? 64 : 128, std::memory_order_relaxed);
    g_groups.store(groups <= 0 ? 0 : groups == 1 ? 1 : 2, std::memory_order_relaxed);
}

}  // namespace quern::cuda
