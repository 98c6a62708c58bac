// The streamed decode GEMV (sm_90): y[N] = W[N][K] · x[K] with the weights
// brought into a shared-memory ring by the Tensor Memory Accelerator.
//
// Kernel gemv_stream_kernel<Op, NORM, L>
//   Why:     gemv_kernel (gemv_common.cuh) keeps its loads in flight in
//            registers, so the bytes in flight per SM are capped by the
//            registers of the resident warps (the two-level Q4_K kernel:
//            155 registers, 12 warps per SM), and a block issues a row
//            group's loads only after computing the previous one. Here one
//            producer thread per block keeps a ring of NS stages of bulk
//            copies (cp.async.bulk, completion counted in bytes on an
//            mbarrier) in flight whatever the consumers are doing.
//   Shapes:  W: N rows × K elements in the device layout of weights.h, which
//            for these Ops is a set of byte streams, each N rows of
//            U/8 · Op::stream_bytes8(i) bytes back to back (U = K / 32 units;
//            a unit is 32 elements); x: the Q8 activation (one or two levels).
//   Stages:  a stage is RS consecutive rows (StreamPlan): one bulk copy per
//            stream (rows are contiguous in every stream), so a copy moves
//            kilobytes — the bulk copy engine spends ~70-80 cycles per copy
//            whatever its size, which made per-row copies of 128-1024 bytes
//            the bottleneck of a first version (44% of the copy rate).
//   Grid:    one block per SM (at most one per work item), 8 consumer warps
//            and 1 producer warp. Work items (stages, or with NORM 32-row
//            blocks) are split into contiguous ranges that differ by at most
//            one item between blocks. A row is cut into Q slices of at most
//            128 units (4 per lane); consumer warp w = (group w / Q, slice
//            w % Q) keeps its slice of the activation in registers for the
//            whole kernel, and the G = 8 / Q groups take the block's stages in
//            turn (stage k: group k % G), so G stages are computed at once.
//            Each warp reduces its rows over its lanes; with Q > 1 the group's
//            warps add their partial sums in a fixed order (named barrier per
//            stage), so results do not depend on timing.
//   PDL:     weights are never written during a step, so the producer starts
//            filling the ring at once, before the predecessor kernel has
//            finished; the consumers wait (griddepcontrol.wait) before reading
//            the activation and trigger the successor.
//   Epilogue: y[row] = Σ · deferred RMSNorm scale (ActScale), or with NORM
//            gemv_residual_norm's (gemv.h): per 32 rows, x += y, Σx² to the
//            partial sums and the next activation quantized (warp 0).
//   Align:   every stream's row stride must be a multiple of 16 bytes
//            (stream_supported), so every stage copy is 16-byte aligned.
//   Bound:   memory bandwidth.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/context.h"
#include "backend/cuda/gemv_common.cuh"

namespace quern::cuda::kern {

// ---------------------------------------------------------------- PTX helpers
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ uint4 lds16(uint32_t a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
    return v;
}
__device__ __forceinline__ uint2 lds8(uint32_t a) {
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a));
    return v;
}
__device__ __forceinline__ uint32_t lds2(uint32_t a) {
    unsigned short v;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(a));
    return v;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    do {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
// One bulk copy global -> shared (bytes and both addresses multiples of 16),
// its completion counted on the mbarrier in bytes.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
#endif

// Named barrier 1 + gi (gi < 8) over n threads; constant ids, so ptxas
// reserves only the barriers used.
__device__ __forceinline__ void group_sync(int gi, int n) {
    switch (gi) {
        case 0: asm volatile("bar.sync 1, %0;" ::"r"(n) : "memory"); break;
        case 1: asm volatile("bar.sync 2, %0;" ::"r"(n) : "memory"); break;
        case 2: asm volatile("bar.sync 3, %0;" ::"r"(n) : "memory"); break;
        case 3: asm volatile("bar.sync 4, %0;" ::"r"(n) : "memory"); break;
        case 4: asm volatile("bar.sync 5, %0;" ::"r"(n) : "memory"); break;
        case 5: asm volatile("bar.sync 6, %0;" ::"r"(n) : "memory"); break;
        case 6: asm volatile("bar.sync 7, %0;" ::"r"(n) : "memory"); break;
        default: asm volatile("bar.sync 8, %0;" ::"r"(n) : "memory"); break;
    }
}

inline constexpr int kStreamWarps = 8;   // consumer warps per block
inline constexpr int kStreamSliceUnits = 128;  // units (of 32 elements) of a warp's slice of a row: 4 per lane

/// How a launch of gemv_stream_kernel cuts its work (made by stream_plan).
struct StreamPlan {
    int rs = 0;      ///< rows per stage (a power of two, 1..8)
    int ns = 0;      ///< stages in the ring (2..16)
    int q = 0;       ///< warps per row (slices of the row; 1, 2, 4, 8)
    int stage = 0;   ///< bytes of one stage: rs rows of every stream
};

template <class Op, bool NORM, int L>
__global__ void __launch_bounds__(32 * (kStreamWarps + 1), 1)
    gemv_stream_kernel(const typename Op::Args args, const ActQ8Ptrs a2, float* __restrict__ y, const ActScale sc,
                       const NormEpilogue epi, int N, int U, const StreamPlan plan) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int S = Op::kStreams;
    extern __shared__ __align__(128) uint8_t smem[];
    const int RS = plan.rs, NS = plan.ns, Q = plan.q, G = kStreamWarps / plan.q;
    const uint32_t ring = smem_u32(smem);
    const uint32_t full = ring + NS * plan.stage;  // NS mbarriers: stage filled
    const uint32_t empty = full + 8 * 16;          // NS mbarriers: stage released by its Q warps
    // Row partial sums of the Q slices: [2 parities][G groups][Q][8 rows]; NORM: 32 results.
    float* red = reinterpret_cast<float*>(smem + NS * plan.stage + 16 * 16);
    float* ys = red + 2 * kStreamWarps * 8;

    const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
    if (threadIdx.x == 0) {
        for (int s = 0; s < NS; ++s) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, Q);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    uint32_t rowb[S];  // bytes of one row of each stream
#pragma unroll
    for (int i = 0; i < S; ++i) rowb[i] = static_cast<uint32_t>((U / 8) * Op::stream_bytes8(i));
    // Work: stages of RS consecutive rows; with NORM, items of 32 rows (32 / RS
    // stages). Block b takes a contiguous range of items.
    const int n_stages = (N + RS - 1) / RS;
    const int per_item = NORM ? 32 / RS : 1;
    const int items = (n_stages + per_item - 1) / per_item;
    const int g = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
    const int item0 = static_cast<int>(static_cast<int64_t>(items) * b / g);
    const int item1 = static_cast<int>(static_cast<int64_t>(items) * (b + 1) / g);
    const int k0 = item0 * per_item, k1 = min(n_stages, item1 * per_item);

    if (warp == kStreamWarps) {
        // ---------------- producer: one copy per stream and stage; starts before the predecessor ends
        if (lane == 0) {
            for (int k = k0; k < k1; ++k) {
                const int j = k - k0, s = j % NS;
                if (j >= NS) mbar_wait(empty + 8 * s, ((j / NS) - 1) & 1);
                const int r0 = k * RS, rows = min(RS, N - r0);
                uint32_t bytes = 0;
#pragma unroll
                for (int i = 0; i < S; ++i) bytes += rows * rowb[i];
                mbar_arrive_expect_tx(full + 8 * s, bytes);
                uint32_t dst = ring + s * plan.stage;
#pragma unroll
                for (int i = 0; i < S; ++i) {
                    bulk_copy_g2s(dst, Op::stream_base(args, i) + static_cast<int64_t>(r0) * rowb[i], rows * rowb[i],
                                  full + 8 * s);
                    dst += RS * rowb[i];
                }
            }
        }
        return;
    }

    // ---------------- consumers: warp = (group gi, slice q); the slice's activation stays in registers
    const int gi = warp / Q, qs = warp % Q;
    const int sw = (U + Q - 1) / Q;  // units per slice
    const int u0 = qs * sw, u1 = min(U, u0 + sw);
    typename Op::Args args2 = args;
    if constexpr (L == 2) args2.a = a2;
    pdl_wait();
    pdl_trigger();
    const float scale = sc.parts ? deferred_scale(sc, lane) : 1.0f;
    constexpr int J = kStreamSliceUnits / 32;
    typename Op::A x1[J], x2[J];
    bool ok[J];
#pragma unroll
    for (int jj = 0; jj < J; ++jj) {
        const int u = u0 + lane + 32 * jj;
        ok[jj] = u < u1;
        if (ok[jj]) {
            x1[jj] = Op::load_a(args, u);
            if constexpr (L == 2) x2[jj] = Op::load_a(args2, u);
        }
    }
    const auto stage_rows = [&](int k, int s) {
        // Rows of stage k (slot s): this warp's slice of each, reduced over the
        // lanes; lane r < RS ends up holding row r's partial sum.
        const uint32_t base = ring + s * plan.stage;
        float mine = 0.0f;
#pragma unroll 2
        for (int r = 0; r < RS; ++r) {
            uint32_t p[S];
            uint32_t o = base;
#pragma unroll
            for (int i = 0; i < S; ++i) {
                p[i] = o + r * rowb[i];
                o += RS * rowb[i];
            }
            float acc = 0.0f;
#pragma unroll
            for (int jj = 0; jj < J; ++jj) {
                if (ok[jj]) {
                    const typename Op::W w = Op::load_w_shared(p, u0 + lane + 32 * jj);
                    if constexpr (L == 2) {
                        if constexpr (requires { Op::dot2(0.0f, w, x1[jj], x2[jj]); })
                            acc = Op::dot2(acc, w, x1[jj], x2[jj]);
                        else
                            acc += Op::dot(w, x1[jj]) + Op::dot(w, x2[jj]);
                    } else {
                        acc += Op::dot(w, x1[jj]);
                    }
                }
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, off);
            if (lane == r) mine = acc;
        }
        return mine;
    };
    // Writes the sums of stage k's rows (lane r: row r), after combining the
    // Q slices (group barrier, fixed order).
    const auto finish = [&](int k, float v) {
        if (Q > 1) {
            float* rb = red + ((k / G) & 1) * kStreamWarps * 8 + gi * Q * 8;
            if (lane < RS) rb[qs * 8 + lane] = v;
            group_sync(gi, 32 * Q);
            if (qs != 0) return;
            v = 0.0f;
            if (lane < RS)
                for (int q = 0; q < Q; ++q) v += rb[q * 8 + lane];
        }
        const int row = k * RS + lane;
        if (lane < RS && row < N) {
            if constexpr (NORM) ys[row % 32] = v;
            else y[row] = v * scale;
        }
    };
    if constexpr (!NORM) {
        for (int k = k0 + gi; k < k1; k += G) {
            const int j = k - k0, s = j % NS;
            mbar_wait(full + 8 * s, (j / NS) & 1);
            const float v = stage_rows(k, s);
            __syncwarp();
            if (lane == 0) mbar_arrive(empty + 8 * s);
            finish(k, v);
        }
    } else {
        for (int it = item0; it < item1; ++it) {
            for (int k = it * per_item + ((gi - it * per_item) % G + G) % G; k < (it + 1) * per_item; k += G) {
                const int j = k - k0, s = j % NS;
                mbar_wait(full + 8 * s, (j / NS) & 1);
                const float v = stage_rows(k, s);
                __syncwarp();
                if (lane == 0) mbar_arrive(empty + 8 * s);
                finish(k, v);
            }
            // Warp 0 ends the residual branch for these 32 rows (gemv_norm_kernel's epilogue).
            asm volatile("bar.sync 9, %0;" ::"n"(32 * kStreamWarps) : "memory");
            if (warp == 0) {
                const int i = it * 32 + lane;
                const float v = epi.x[i] + ys[lane];
                epi.x[i] = v;
                float ss = v * v;
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, off);
                if (lane == 0) epi.ss_parts[it] = ss;
                detail::quantize_block_q8_1_l2(v * __ldg(epi.w + i), lane, it, epi.xq, epi.xinfo, epi.xq2, epi.xinfo2,
                                               N / 2);
            }
            asm volatile("bar.sync 9, %0;" ::"n"(32 * kStreamWarps) : "memory");
        }
    }
#endif
}

/// Whether Op's streamed kernel takes rows of U units: every stream's row
/// stride a multiple of 16 bytes (so every chunk's row piece is 16-byte
/// aligned) and whole super-blocks (U % 8 == 0).
template <class Op>
bool stream_supported(int64_t U) {
    if (U <= 0 || U % 8 != 0) return false;
    for (int i = 0; i < Op::kStreams; ++i)
        if ((U / 8) * Op::stream_bytes8(i) % 16 != 0) return false;
    return true;
}

/// Whether the current device runs the streamed kernels (compute capability
/// 9.0 or later: bulk copies and transaction-counted mbarriers). Read once.
bool stream_device_supported();

/// The work cut of a streamed launch for rows of `row_bytes` bytes (all
/// streams) and U units within a ring budget, `block_rows` rows per block:
/// rows are split into slices of at most 128 units (q warps per row, 8/q
/// stage groups in flight), and stages hold the largest power of two of rows
/// (≤ 8) that leaves room for 3 more stages than groups and gives every group
/// a stage of the block's rows; rs = 0 where not even one row fits.
inline StreamPlan stream_plan(int64_t row_bytes, int64_t U, int budget, int64_t block_rows) {
    StreamPlan p;
    p.q = 1;
    while (p.q < kStreamWarps && U > static_cast<int64_t>(p.q) * kStreamSliceUnits) p.q *= 2;
    if (U > static_cast<int64_t>(p.q) * kStreamSliceUnits) return p;
    const int groups = kStreamWarps / p.q;
    for (int rs = 8; rs >= 1; rs /= 2)
        if ((rs * row_bytes * (groups + 3) <= budget && rs * groups <= block_rows) || rs == 1) {
            p.rs = rs;
            break;
        }
    p.stage = static_cast<int>(p.rs * row_bytes);
    p.ns = std::min<int64_t>(16, budget / p.stage);
    if (p.ns < 2) p.rs = 0;
    return p;
}

/// Launches gemv_stream_kernel for `l` (quantized activation, one or two
/// levels, deferred scale, or with l.epi the residual-norm epilogue) with
/// streamed configuration `variant` (QUERN_GEMV_STREAM_CONFIGS, kernels.h).
/// Returns false, launching nothing, where the kernel does not apply.
template <class Op>
bool launch_streamed(const typename Op::Args& args, const GemvLaunch& l, int variant, cudaStream_t stream) {
    const int64_t U = l.K / 32;
    if (l.index || !stream_supported<Op>(U) || !stream_device_supported() || l.N > (int64_t{1} << 30)) return false;
    if (l.epi && l.N % 32 != 0) return false;
    int budget_kb = 0;
    switch (variant) {
#define QUERN_GEMV_STREAM_CASE(idx, KB) \
    case idx: budget_kb = KB; break;
        QUERN_GEMV_STREAM_CONFIGS(QUERN_GEMV_STREAM_CASE)
#undef QUERN_GEMV_STREAM_CASE
        default: return false;
    }
    int64_t row_bytes = 0;
    for (int i = 0; i < Op::kStreams; ++i) row_bytes += (U / 8) * Op::stream_bytes8(i);
    const int sms = CudaContext::current_sm_count();
    const int64_t block_rows = l.epi ? 32 * ((l.N / 32 + sms - 1) / sms) : (l.N + sms - 1) / sms;
    const StreamPlan plan = stream_plan(row_bytes, U, budget_kb * 1024, block_rows);
    if (plan.rs == 0) return false;
    const ActQ8Ptrs a2 = residual_act(l);
    const NormEpilogue epi = l.epi ? *l.epi : NormEpilogue{};
    float* y = l.epi ? nullptr : l.y;
    const int smem = plan.ns * plan.stage + 16 * 16 + (2 * kStreamWarps * 8 + 32) * 4;
    const int64_t n_stages = (l.N + plan.rs - 1) / plan.rs;
    const int64_t items = l.epi ? l.N / 32 : n_stages;
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(items, sms));
    const auto pick = [&]<bool NORM, int LV>() {
        constexpr auto kern = gemv_stream_kernel<Op, NORM, LV>;
        static int attr_smem = 0;  // the largest dynamic shared memory asked for so far
        if (smem > attr_smem) {
            cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
            attr_smem = smem;
        }
        launch_pdl(kern, dim3(grid), dim3(32 * (kStreamWarps + 1)), smem, stream, args, a2, y, l.scale, epi,
                   static_cast<int>(l.N), static_cast<int>(U), plan);
    };
    if (l.epi) {
        if (a2.q) pick.template operator()<true, 2>();
        else pick.template operator()<true, 1>();
    } else {
        if (a2.q) pick.template operator()<false, 2>();
        else pick.template operator()<false, 1>();
    }
    return true;
}

}  // namespace quern::cuda::kern
