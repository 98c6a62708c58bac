// Shared device code of the decode GEMV kernels: y[N] = W[N][K] · x[K].
//
// Kernel gemv_kernel<Op, R, NT, UNR>
//   Shapes:  W has N rows of K elements in the device layout of weights.h;
//            x is K values (Q8 planes or floats, see kernels.h); y is N floats.
//            A row is U = K / Op::kUnitElems "units"; one unit is the
//            elements covered by one 16-byte weight vector (32 for the
//            quantized types except Q8_0, whose unit is one 32-element block =
//            two 16-byte vectors; 16 for F8_E4M3_B32; 8 for F16/BF16; 4 for
//            F32).
//   Grid:    one thread block of NT threads per R consecutive rows
//            (ceil(N / R) blocks). Thread t handles units t, t+NT, ... of each
//            of its R rows; per trip it issues UNR × R weight loads (and UNR
//            activation loads, shared by the R rows) before the first use.
//            Partial sums are reduced by warp shuffles, then across warps
//            through R × NT/32 floats of shared memory; thread r writes y[row0+r].
//            Rows past N re-read row N-1 and write nothing.
//   Loads:   weights with ld.global.nc.L1::no_allocate (streamed once: no L1
//            pollution); activations with ld.global.nc (L1-resident, reread by
//            every block). Lane t of a warp reads bytes 16t..16t+15 of a span,
//            so each warp instruction moves one contiguous 512-byte span.
//   Align:   every stream 16-byte aligned per row (weights.h guarantees it for
//            K multiple of the block size; F32 needs K % 4 == 0, F16 K % 8 == 0).
//   Bound:   memory bandwidth for matrices of tens of MB and more (76-110% of
//            the 4.2 TB/s copy rate on the 8B shapes; bench/gemv-cuda-h200.md);
//            launch latency and ramp-up below ~10 MB. Per weight byte: ~1-2
//            integer ops, so issue slots are not the limit; loads in flight are
//            (registers cap the resident warps, hence the configuration table).
//   Numerics: integer dot products are exact (int32); each unit's sum is scaled
//            in fp32 and accumulated in fp32 per thread, then tree-reduced. (An
//            Op's dot2 sum of both levels, 254·s1 + s2 (Q4_K: 16 times it), can
//            pass 2^24 and is rounded to fp32's 24 bits when converted: ~6e-8
//            relative.)
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/ops_common.cuh"

namespace quern::cuda::kern {

// ---------------------------------------------------------------- loads
// Weight stream loads: read-only for the kernel's lifetime, read once.
// (An .L2::256B prefetch hint on these loads was measured 2-4% slower.)
__device__ __forceinline__ uint4 ldw16(const void* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 ldw8(const void* p) {
    uint2 v;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
__device__ __forceinline__ uint32_t ldw4(const void* p) {
    uint32_t v;
    asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ uint32_t ldw2(const void* p) {
    unsigned short v;
    asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}
// Activation loads: small, reread by every block, kept in L1.
__device__ __forceinline__ uint4 lda16(const void* p) { return __ldg(static_cast<const uint4*>(p)); }
__device__ __forceinline__ float4 lda16f(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }

__device__ __forceinline__ float half_bits_to_float(uint32_t bits) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xFFFFu)));
}

// 8 words of a 32-element unit: lo = elements 0..15, hi = elements 16..31.
__device__ __forceinline__ int dp4a_16(uint4 w, uint4 a, int acc) {
    acc = __dp4a(static_cast<int>(w.x), static_cast<int>(a.x), acc);
    acc = __dp4a(static_cast<int>(w.y), static_cast<int>(a.y), acc);
    acc = __dp4a(static_cast<int>(w.z), static_cast<int>(a.z), acc);
    acc = __dp4a(static_cast<int>(w.w), static_cast<int>(a.w), acc);
    return acc;
}
// The same with unsigned weight bytes (0..255) against signed activations.
__device__ __forceinline__ int dp4a_us(uint32_t w, uint32_t a, int acc) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(w), "r"(a), "r"(acc));
    return d;
}
__device__ __forceinline__ int dp4a_us_16(uint4 w, uint4 a, int acc) {
    acc = dp4a_us(w.x, a.x, acc);
    acc = dp4a_us(w.y, a.y, acc);
    acc = dp4a_us(w.z, a.z, acc);
    acc = dp4a_us(w.w, a.w, acc);
    return acc;
}
__device__ __forceinline__ uint4 lo_nibbles(uint4 q) {
    return make_uint4(q.x & 0x0F0F0F0Fu, q.y & 0x0F0F0F0Fu, q.z & 0x0F0F0F0Fu, q.w & 0x0F0F0F0Fu);
}
__device__ __forceinline__ uint4 hi_nibbles(uint4 q) {
    return make_uint4((q.x >> 4) & 0x0F0F0F0Fu, (q.y >> 4) & 0x0F0F0F0Fu, (q.z >> 4) & 0x0F0F0F0Fu,
                      (q.w >> 4) & 0x0F0F0F0Fu);
}
// The high nibbles in place: bytes 16·h (0..240), one AND per word instead
// of a shift and an AND; dot products with them (dp4a_us) are 16× those of
// hi_nibbles, exactly.
__device__ __forceinline__ uint4 hi_nibbles_x16(uint4 q) {
    return make_uint4(q.x & 0xF0F0F0F0u, q.y & 0xF0F0F0F0u, q.z & 0xF0F0F0F0u, q.w & 0xF0F0F0F0u);
}

// Quantized activation of one 32-element unit (block b): both planes and the
// block record {d, s, sum_lo, sum_hi} (sums as int bits in .z, .w).
struct ActQ8 {
    uint4 lo, hi;
    float4 info;
};
struct ActQ8Ptrs {
    const int8_t* q;  // plane 0; plane 1 at q + half_k
    const ActBlockInfo* info;
    int64_t half_k;
};
__device__ __forceinline__ ActQ8 load_act_q8(const ActQ8Ptrs& a, int u) {
    ActQ8 r;
    r.lo = lda16(a.q + 16 * static_cast<int64_t>(u));
    r.hi = lda16(a.q + a.half_k + 16 * static_cast<int64_t>(u));
    r.info = __ldg(reinterpret_cast<const float4*>(a.info) + u);
    return r;
}

// ---------------------------------------------------------------- the main loop
// RowDot<Op, R, STRIDE, UNR, L>: the main loop both kernels below share.
// A thread's units are u = t, t + STRIDE, ... < U of each of its R rows;
// acc[r] += Σ_u Op::dot(W[rows[r]] unit u, x unit u), with one or two
// activation levels (L). One trip = UNR × R weight loads in flight, then the
// trip's arithmetic; the trip loop is not unrolled, so registers (and
// occupancy) follow the configuration. The caller requests the first trip
// (load_first) before its PDL wait: weights are never written during a step,
// so their DRAM latency overlaps the previous kernel's tail; activations are
// read only in run(), after the wait.
//
// An Op may define dot2(acc, w, x1, x2) = acc + w·(x1 + x2) for two levels
// in one step: level 2's scale is level 1's / kLevel2Ratio (gemv.h), so the
// two integer dot products can be combined before one float scaling.
template <class Op, int R, int STRIDE, int UNR, int L>
struct RowDot {
    static constexpr bool kHasDot2 = requires(const typename Op::W& w, const typename Op::A& a) {
        Op::dot2(0.0f, w, a, a);
    };
    typename Op::W w[UNR][R];

    __device__ __forceinline__ void load(const typename Op::Args& args, const int (&rows)[R], int u0, int U) {
#pragma unroll
        for (int i = 0; i < UNR; ++i) {
            const int u = u0 + i * STRIDE;
            if (UNR == 1 || u < U) {
#pragma unroll
                for (int r = 0; r < R; ++r) w[i][r] = Op::load_w(args, rows[r], u);
            } else {  // zero weights contribute exactly 0 in every Op
#pragma unroll
                for (int r = 0; r < R; ++r) w[i][r] = typename Op::W{};
            }
        }
    }
    __device__ __forceinline__ void load_first(const typename Op::Args& args, const int (&rows)[R], int t, int U) {
        if (t < U) load(args, rows, t, U);
    }
    // Runs every trip; the first one's weights come from load_first.
    __device__ __forceinline__ void run(const typename Op::Args& args, const typename Op::Args& args2,
                                        const int (&rows)[R], int t, int U, float (&acc)[R]) {
#pragma unroll 1
        for (int u0 = t; u0 < U; u0 += UNR * STRIDE) {
            if (u0 != t) load(args, rows, u0, U);
            typename Op::A x[UNR][L];
#pragma unroll
            for (int i = 0; i < UNR; ++i) {
                const int u = u0 + i * STRIDE;
                if (UNR == 1 || u < U) {
                    x[i][0] = Op::load_a(args, u);
                    if constexpr (L == 2) x[i][L - 1] = Op::load_a(args2, u);
                } else {
#pragma unroll
                    for (int l = 0; l < L; ++l) x[i][l] = typename Op::A{};
                }
            }
#pragma unroll
            for (int i = 0; i < UNR; ++i)
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    if constexpr (L == 2 && kHasDot2) {
                        acc[r] = Op::dot2(acc[r], w[i][r], x[i][0], x[i][1]);
                    } else {
#pragma unroll
                        for (int l = 0; l < L; ++l) acc[r] += Op::dot(w[i][r], x[i][l]);
                    }
                }
        }
    }
};

// ---------------------------------------------------------------- the kernel
// L = 2: two-level activations. x = x8 + r8 where x8 is x quantized and r8
// the residual x - x8 quantized in turn (args.a and a2); each weight vector
// is loaded once and dotted with both (Op::dot twice on the same W, the
// weight unpacking shared by the compiler; or the Op's dot2 once), so the weight traffic is
// unchanged and the activation error drops from ~1/127 to ~1/127² of the
// block maximum.
// The deferred RMSNorm scale (ActScale, gemv.h's DeferredNormScale): warp
// 0 sums the partials in a fixed order (lane-strided, then a butterfly), so
// every block of every consumer computes the same float.
__device__ __forceinline__ float deferred_scale(const ActScale& sc, int lane) {
    float v = 0.0f;
    for (int i = lane; i < sc.n; i += 32) v += sc.parts[i];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
    return 1.0f / sqrtf(v * sc.inv_dim + sc.eps);
}

// P = 1 (persistent): the grid is one wave of resident blocks (launch_configured
// sizes it from the occupancy); block b computes row groups b, b + gridDim.x,
// ... and requests the next group's first trip before reducing the current
// one, so no block starts or retires mid-kernel and the next loads are in
// flight through the reduction. The RMSNorm scale is computed once per block.
//
// gemv_rows is one block's share: row group g, and with P = 1 also g +
// stride, g + 2·stride, ...; gemv_kernel calls it with (blockIdx.x,
// gridDim.x), gemv_pair_kernel with its own split of the grid.
template <class Op, int R, int NT, int UNR, int P, int L>
__device__ __forceinline__ void gemv_rows(const typename Op::Args& args, const ActQ8Ptrs& a2, float* __restrict__ y,
                                          int N, int U, const ActScale& sc, int g, int stride) {
    static_assert(NT % 32 == 0 && R >= 1 && UNR >= 1 && (P == 0 || P == 1) && (L == 1 || L == 2));
    typename Op::Args args2 = args;
    if constexpr (L == 2) args2.a = a2;
    constexpr int NW = NT / 32;
    const int t = static_cast<int>(threadIdx.x);
    const int groups = (N + R - 1) / R;
    int rows[R];
    const auto set_rows = [&](int grp) {
#pragma unroll
        for (int r = 0; r < R; ++r) rows[r] = min(grp * R + r, N - 1);
    };
    set_rows(g);
    RowDot<Op, R, NT, UNR, L> rd;
    rd.load_first(args, rows, t, U);
    pdl_wait_trigger(sc.early);
    // The scale's partials are read by warp 0 (the writer of y) while the
    // first weights are in flight.
    float scale = 1.0f;
    if (sc.parts && t < 32) scale = deferred_scale(sc, t);

    __shared__ float part[2][NW][R];  // two buffers: a group's writes never meet the previous group's reads
    for (int it = 0;; ++it) {
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = 0.0f;
        rd.run(args, args2, rows, t, U, acc);
        const int row0 = g * R;
        if constexpr (P == 1) {
            g += stride;
            if (g < groups) {
                set_rows(g);
                rd.load_first(args, rows, t, U);
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xFFFFFFFFu, acc[r], off);
        if constexpr (NW == 1) {
            if (t < R) {
                float v = acc[0];
#pragma unroll
                for (int r = 1; r < R; ++r)
                    if (t == r) v = acc[r];
                if (row0 + t < N) y[row0 + t] = v * scale;
            }
        } else {
            const int warp = t >> 5, lane = t & 31, b = it & 1;
            if (lane == 0) {
#pragma unroll
                for (int r = 0; r < R; ++r) part[b][warp][r] = acc[r];
            }
            __syncthreads();
            if (t < R) {
                float v = 0.0f;
#pragma unroll
                for (int wi = 0; wi < NW; ++wi) v += part[b][wi][t];
                if (row0 + t < N) y[row0 + t] = v * scale;
            }
        }
        if (P == 0 || g >= groups) break;
    }
}

template <class Op, int R, int NT, int UNR, int P, int L>
__global__ void __launch_bounds__(NT) gemv_kernel(const typename Op::Args args, const ActQ8Ptrs a2,
                                                  float* __restrict__ y, int N, int U, const ActScale sc) {
    gemv_rows<Op, R, NT, UNR, P, L>(args, a2, y, N, U, sc, static_cast<int>(blockIdx.x),
                                    static_cast<int>(gridDim.x));
}

// gemv_pair_kernel<Op1, R1, UNR1, Op2, R2, UNR2, NT, L> — gemv_pair (gemv.h)
//   Two GEMVs on one activation (same K, same deferred scale) in one launch:
//   blocks 0 .. blocks1 − 1 run Op1's rows as a persistent gemv_kernel over
//   blocks1 blocks, the rest Op2's over the remaining ones (both P = 1, so
//   each path's arithmetic per row is that of its gemv_kernel configuration).
//   Registers and occupancy are those of the heavier path.
template <class Op1, int R1, int UNR1, class Op2, int R2, int UNR2, int NT, int L>
__global__ void __launch_bounds__(NT) gemv_pair_kernel(const typename Op1::Args args1, const ActQ8Ptrs r1,
                                                       float* __restrict__ y1, int N1, int U1,
                                                       const typename Op2::Args args2, const ActQ8Ptrs r2,
                                                       float* __restrict__ y2, int N2, int U2, const ActScale sc,
                                                       int blocks1) {
    const int b = static_cast<int>(blockIdx.x);
    if (b < blocks1)
        gemv_rows<Op1, R1, NT, UNR1, 1, L>(args1, r1, y1, N1, U1, sc, b, blocks1);
    else
        gemv_rows<Op2, R2, NT, UNR2, 1, L>(args2, r2, y2, N2, U2, sc, b - blocks1,
                                           static_cast<int>(gridDim.x) - blocks1);
}

// ---------------------------------------------------------------- indexed (expert) mode
// gemv_indexed_kernel<Op, R, NT, UNR, L> — gemv_indexed (gemv.h), GemvIndex (kernels.h)
//   Shapes:  W is a bank of ix.n_ids matrices of N rows × K (row e·N + r is
//            row r of matrix e; one DeviceWeight, e.g. a GGUF 3-D expert
//            tensor, ne = [K, N, n_ids]); y is ix.slots × N floats (slot s
//            at y + s·N). The activation is the launch's (ix.act_stride 0)
//            or, per slot, the elements s·act_stride .. s·act_stride + K − 1
//            of one longer row: floats, or Q8 blocks of a QuantizedActivation
//            row whose two planes are ix.act_half_k bytes apart.
//   Grid:    (ceil(N / R), ix.slots) blocks of NT threads; blockIdx.y = slot.
//            The block reads ids[slot] (clamped to [0, n_ids)) after its PDL
//            wait (the routing kernel writes it in the same step), so unlike
//            gemv_kernel no weight is requested before the wait. Row group,
//            unit striding, RowDot main loop and reduction as gemv_kernel
//            with P = 0; rows past N re-read row N−1 and write nothing.
//   Align:   as gemv_kernel; act_stride a multiple of 32 (quantized) or of the
//            Op's unit (floats).
//   Bound:   memory bandwidth: slots × N × K weights are read (only the
//            selected matrices), activations from L1.
// A separate kernel (not a flag of gemv_kernel) so that the dense hot loop is
// untouched; every Op works unchanged because only its rows and activation
// pointers move.
template <class Args>
__device__ __forceinline__ void offset_slot_activation(Args& g, const GemvIndex& ix, int slot) {
    if constexpr (requires(Args v) { v.a; }) {
        g.a.q += static_cast<int64_t>(slot) * (ix.act_stride / 2);  // 16 bytes per 32-element block
        g.a.info += static_cast<int64_t>(slot) * (ix.act_stride / 32);
        g.a.half_k = ix.act_half_k;
    } else {
        g.x += static_cast<int64_t>(slot) * ix.act_stride;
    }
}

template <class Op, int R, int NT, int UNR, int L>
__global__ void __launch_bounds__(NT) gemv_indexed_kernel(typename Op::Args args, const ActQ8Ptrs a2,
                                                          float* __restrict__ y, int N, int U, const GemvIndex ix) {
    static_assert(NT % 32 == 0 && R >= 1 && UNR >= 1 && (L == 1 || L == 2));
    const int slot = static_cast<int>(blockIdx.y);
    typename Op::Args args2 = args;
    if constexpr (L == 2) args2.a = a2;
    if (ix.act_stride != 0) {
        offset_slot_activation(args, ix, slot);
        if constexpr (L == 2) offset_slot_activation(args2, ix, slot);
    }
    constexpr int NW = NT / 32;
    const int t = static_cast<int>(threadIdx.x);
    const int row0 = static_cast<int>(blockIdx.x) * R;
    pdl_wait();
    const int id = min(max(ix.ids[slot], 0), ix.n_ids - 1);
    pdl_trigger();
    int rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = id * N + min(row0 + r, N - 1);
    RowDot<Op, R, NT, UNR, L> rd;
    rd.load_first(args, rows, t, U);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    rd.run(args, args2, rows, t, U, acc);
    float* ys = y + static_cast<int64_t>(slot) * N;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xFFFFFFFFu, acc[r], off);
    __shared__ float part[NW][R];
    const int warp = t >> 5, lane = t & 31;
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) part[warp][r] = acc[r];
    }
    __syncthreads();
    if (t < R) {
        float v = 0.0f;
#pragma unroll
        for (int wi = 0; wi < NW; ++wi) v += part[wi][t];
        if (row0 + t < N) ys[row0 + t] = v;
    }
}

// ---------------------------------------------------------------- residual + RMSNorm epilogue
// gemv_norm_kernel<Op, RW, UNR, L> — gemv_residual_norm (gemv.h)
//   Grid:    one block of 32/RW warps per 32 consecutive rows (N % 32 == 0);
//            warp w computes rows 32·b + RW·w .. + RW − 1, its lanes striding
//            over the units (RowDot: UNR × RW loads in flight per lane, the
//            first set before pdl_wait as in gemv_kernel); butterfly reduction.
//   Epilogue: warp 0, lane i, row 32b + i: x += y (x is read and written by
//            this block only), the block's Σx² to ss_parts[b], and
//            x·w quantized as Q8_1 block b of the next activation (one or two
//            levels; the RMSNorm scale is left to its consumers).
//   Bound:   as gemv_kernel; one wave of N/32 blocks for N = 4096 on 132 SMs.
template <class Op, int RW, int UNR, int L>
__global__ void __launch_bounds__(32 * (32 / RW)) gemv_norm_kernel(const typename Op::Args args,
                                                                 const ActQ8Ptrs a2, const NormEpilogue epi,
                                                                 int N, int U) {
    static_assert(32 % RW == 0 && (L == 1 || L == 2));
    typename Op::Args args2 = args;
    if constexpr (L == 2) args2.a = a2;
    const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
    const int rb = static_cast<int>(blockIdx.x) * 32;
    int rows[RW];
#pragma unroll
    for (int r = 0; r < RW; ++r) rows[r] = rb + warp * RW + r;
    float acc[RW];
#pragma unroll
    for (int r = 0; r < RW; ++r) acc[r] = 0.0f;
    RowDot<Op, RW, 32, UNR, L> rd;
    rd.load_first(args, rows, lane, U);
    const float nw = warp == 0 ? __ldg(epi.w + rb + lane) : 0.0f;  // a weight: before the wait
    pdl_wait_trigger(epi.early);
    const float x_old = warp == 0 ? epi.x[rb + lane] : 0.0f;
    rd.run(args, args2, rows, lane, U, acc);
    __shared__ float ys[32];
#pragma unroll
    for (int r = 0; r < RW; ++r) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xFFFFFFFFu, acc[r], off);
        if (lane == r) ys[warp * RW + r] = acc[r];
    }
    __syncthreads();
    if (warp == 0) {
        const int i = rb + lane;
        const float v = x_old + ys[lane];
        epi.x[i] = v;
        float ss = v * v;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, off);
        if (lane == 0) epi.ss_parts[blockIdx.x] = ss;
        detail::quantize_block_q8_1_l2(v * nw, lane, blockIdx.x, epi.xq, epi.xinfo, epi.xq2, epi.xinfo2, N / 2);
    }
}

/// The residual level of a launch's quantized activation (q == nullptr: one level).
inline ActQ8Ptrs residual_act(const GemvLaunch& l) { return ActQ8Ptrs{l.xq2, l.xinfo2, l.K / 2}; }

/// Blocks of `Kernel` (nt threads each) resident at once on the current
/// device: its occupancy times the SM count (at least 1), cached per
/// instantiation.
template <auto Kernel>
int resident_blocks(int nt) {
    static const int resident = [nt] {
        int dev = 0, sms = 0, per_sm = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Kernel, nt, 0);
        return std::max(1, sms * per_sm);
    }();
    return resident;
}

/// Grid of a gemv_kernel launch: one block per row group, or for a
/// persistent configuration as many as are resident at once
/// (resident_blocks), at most one per group.
template <auto Kernel>
unsigned gemv_grid(int nt, int groups, bool persistent) {
    if (!persistent) return static_cast<unsigned>(groups);
    return static_cast<unsigned>(std::min(groups, resident_blocks<Kernel>(nt)));
}

/// Launches gemv_kernel<Op, ...> with kGemvConfigs[config] (the list is
/// QUERN_GEMV_CONFIGS in kernels.h); two-level when a2.q is not null (Ops
/// with a quantized activation `a` only). Returns false for an unknown index.
/// With `l` (quantized Ops only): its deferred RMSNorm scale, and with l->epi
/// gemv_norm_kernel instead (config ignored). With l->index (any Op):
/// gemv_indexed_kernel with the configuration's R, NT and UNR (a persistent
/// configuration shares its non-persistent twin's instantiation); N is then
/// the rows of one matrix of the bank.
template <class Op>
bool launch_configured(const typename Op::Args& args, float* y, int64_t N, int64_t K, int config,
                       cudaStream_t stream, const ActQ8Ptrs a2 = ActQ8Ptrs{nullptr, nullptr, 0},
                       const GemvLaunch* l = nullptr) {
    const int U = static_cast<int>(K / Op::kUnitElems);
    const int n = static_cast<int>(N);
    constexpr bool kQ8 = requires(typename Op::Args g) { g.a; };
    const ActScale sc = l ? l->scale : ActScale{};
    if (l && l->index) {  // indexed mode: the configuration's shape, never persistent
        const GemvIndex ix = *l->index;
        switch (config) {
#define QUERN_GEMV_INDEXED_CASE(idx, R, NT, UNR, P)                                                       \
    case idx: {                                                                                           \
        const dim3 grid(static_cast<unsigned>((N + R - 1) / R), static_cast<unsigned>(ix.slots));         \
        if constexpr (kQ8) {                                                                              \
            if (a2.q) {                                                                                   \
                launch_pdl(gemv_indexed_kernel<Op, R, NT, UNR, 2>, grid, dim3(NT), 0, stream, args, a2, y, \
                           n, U, ix);                                                                     \
                return true;                                                                              \
            }                                                                                             \
        }                                                                                                 \
        launch_pdl(gemv_indexed_kernel<Op, R, NT, UNR, 1>, grid, dim3(NT), 0, stream, args, a2, y, n, U, ix); \
        return true;                                                                                      \
    }
            QUERN_GEMV_CONFIGS(QUERN_GEMV_INDEXED_CASE)
#undef QUERN_GEMV_INDEXED_CASE
            default: return false;
        }
    }
    if constexpr (kQ8) {
        if (l && l->epi) {
            // Loads in flight per row: 2, or the Op's kNormUnroll (Q8_0: 3;
            // 3 for every type measured slower, bench/decode-cuda-h200.md).
            constexpr int RW = 2;
            constexpr int UNR = [] {
                if constexpr (requires { Op::kNormUnroll; }) return Op::kNormUnroll;
                return 2;
            }();
            const dim3 grid(static_cast<unsigned>(N / 32)), block(32 * (32 / RW));
            if (a2.q)
                launch_pdl(gemv_norm_kernel<Op, RW, UNR, 2>, grid, block, 0, stream, args, a2, *l->epi, n, U);
            else
                launch_pdl(gemv_norm_kernel<Op, RW, UNR, 1>, grid, block, 0, stream, args, a2, *l->epi, n, U);
            return true;
        }
    }
#define QUERN_GEMV_CASE(idx, R, NT, UNR, P)                                                              \
    case idx: {                                                                                          \
        const int groups = static_cast<int>((N + R - 1) / R);                                            \
        if constexpr (kQ8) {                                                                             \
            if (a2.q) {                                                                                  \
                constexpr auto kern = gemv_kernel<Op, R, NT, UNR, P, 2>;                                 \
                launch_pdl(kern, dim3(gemv_grid<kern>(NT, groups, P)), dim3(NT), 0, stream, args, a2, y, \
                           n, U, sc);                                                                    \
                return true;                                                                             \
            }                                                                                            \
        }                                                                                                \
        constexpr auto kern = gemv_kernel<Op, R, NT, UNR, P, 1>;                                         \
        launch_pdl(kern, dim3(gemv_grid<kern>(NT, groups, P)), dim3(NT), 0, stream, args, a2, y, n, U,   \
                   sc);                                                                                  \
        return true;                                                                                     \
    }
    switch (config) {
        QUERN_GEMV_CONFIGS(QUERN_GEMV_CASE)
        default: return false;
    }
#undef QUERN_GEMV_CASE
}

}  // namespace quern::cuda::kern
