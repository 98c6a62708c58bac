// Device pieces shared by the GEMMs that decode quantized weights in
// registers for the tensor cores (bq_gemm.cu on its bq layouts, qw_gemm.cu on
// the resident layouts of weights.h): the BF16 pair arithmetic of the
// decode, the end of a product whose K splits form a thread block cluster,
// and the cluster launch with its choice of splits. Included by those .cu
// files only (everything has internal linkage).
#pragma once
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "backend/cuda/context.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/tuning.h"

namespace quern::cuda {
namespace {

constexpr int64_t kTile = 16;   // weight rows per tile (the mma's M)
constexpr int64_t kChunk = 64;  // elements per chunk (four k16 steps)

__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// The record of a group with value = s·q + o, for kernels that form
// (x − c)·s' + o' in BF16 with x = 128 + m·q, i.e. BF16(s)·(q − z) + o': the
// centre z = round(−o/s) clamped to [0, zmax] makes o' = s·z + o (exact at
// q = z) small — at most s/2 when z is not clamped — so its BF16 rounding
// costs no more than one weight's, where rounding o itself would shift every
// weight of the group by up to 2^-9·|o|. c = BF16 bits of 128 + m·z (exact),
// s' = BF16(s)/m (exact); returns {s', o'}, c in c16. kFast (for decoding in
// the product's inner loop): −o/s by the approximate division, which may
// move z by one where −o/s is near a half — any z in range is exact at q = z.
template <bool kFast = false>
__device__ __forceinline__ uint32_t so_pair(float s, float o, int zmax, int m, uint32_t& c16) {
    const float sb = __bfloat162float(__float2bfloat16_rn(s));
    const float r = kFast ? __fdividef(-o, sb) : -o / sb;
    const float z = sb != 0.0f ? fminf(fmaxf(rintf(r), 0.0f), static_cast<float>(zmax)) : 0.0f;
    c16 = 0x4300u | (static_cast<uint32_t>(z) * static_cast<uint32_t>(m));
    return bf16_pair(sb / static_cast<float>(m), fmaf(s, z, o));
}

__device__ __forceinline__ __nv_bfloat162 as_bf2(uint32_t u) { return *reinterpret_cast<const __nv_bfloat162*>(&u); }
__device__ __forceinline__ uint32_t as_u32(__nv_bfloat162 v) { return *reinterpret_cast<const uint32_t*>(&v); }

// value = (x − c)·s + o for a pair x = 128 + m·q built by OR-ing q into the
// mantissa of 128.0 (exact: m·q < 128), c = 128 + m·z (so x − c = m·(q − z)
// exactly), s and o broadcast to both halves: one rounding, of s·(q−z) + o.
__device__ __forceinline__ uint32_t affine(uint32_t x, __nv_bfloat162 c, __nv_bfloat162 s, __nv_bfloat162 o) {
    return as_u32(__hfma2(__hsub2(as_bf2(x), c), s, o));
}

// (v & m) | x in one LOP3 (the compiler otherwise spends two, one per
// immediate constant).
__device__ __forceinline__ uint32_t and_or(uint32_t v, uint32_t m, uint32_t x) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(v), "r"(m), "r"(x));
    return d;
}

// The broadcast scale registers of a decoded group (bq lane records, qw rows): {s, s}, {o, o} and {c, c}
// of rows g (index 0) and g+8 (index 1).
struct Scales {
    __nv_bfloat162 s[2], o[2], c[2];
};

constexpr int kMaxSplits = 8;  // K splits of a row group: one thread block cluster (portable size)

constexpr int kWarps = 8;  // per block
constexpr int kThreads = 32 * kWarps;

// The second matrix and the output of a GLU product (bq_gemm_glu, the
// kernels' PAIR form): each warp's tile slot 1 multiplies the up rows at
// wq2 / ws2 (the layout's records from the first tile of the product) while
// slot 0 multiplies the gate rows, and the gated values go to h in BF16.
// Plain products pass it empty.
struct BqGlu {
    const uint8_t* wq2 = nullptr;
    const uint8_t* ws2 = nullptr;
    uint16_t* h = nullptr;
    int gelu = 0;
};

// The end of a bq product: a block's sums acc (fragment order; tile mt of
// the warp is output tile tile_of(mt), rows 16·tile_of(mt) + g (+8)) are
// stored, or — when the K splits of a row group form a thread block cluster
// (gridDim.y > 1) — added over the cluster in split order first: each block
// leaves its partial sums in its shared memory (fragment order), and block r
// of the cluster adds fragment slots k ≡ r (mod S) over all S blocks through
// distributed shared memory (the result does not depend on timing). PAIR
// (MW = 2, slot 0 the gate and slot 1 the up product of one pair tile):
// the two sums of an element are added by one block, and the gated value
// glu_value(gate, up) goes to glu.h in BF16 (row stride ldy) instead of y.
// smem: at least MW·NT·4·kThreads floats, no longer read by the product.
template <int MW, int NT, bool PAIR, class TileOf>
__device__ __forceinline__ void bq_finish(float (&acc)[MW][NT][4], TileOf tile_of, int64_t rows, int n,
                                          float* __restrict__ y, int64_t ldy, const BqGlu& glu, uint8_t* smem) {
    static_assert(!PAIR || MW == 2, "a GLU product pairs two tile slots");
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31;
    const int g = lane >> 2, c = lane & 3;
    // c0, c1: row g, tokens 2c, 2c+1 of the token tile; c2, c3: row g+8.
    // Tiles past the matrix (which multiplied a stand-in tile) start at row
    // 16·tiles >= rows: never stored.
    const auto store = [&](int mt, int nt, int i, float v) {
        const int64_t j = kTile * tile_of(mt) + g + (i >= 2 ? 8 : 0);
        const int r = 8 * nt + 2 * c + (i & 1);
        if (j < rows && r < n) y[static_cast<int64_t>(r) * ldy + j] = v;
    };
    const auto store_glu = [&](int nt, int i, float gate, float up) {
        const int64_t j = kTile * tile_of(0) + g + (i >= 2 ? 8 : 0);
        const int r = 8 * nt + 2 * c + (i & 1);
        if (j < rows && r < n) glu.h[static_cast<int64_t>(r) * ldy + j] = detail::bf16_bits(detail::glu_value(gate, up, glu.gelu));
    };
    if (gridDim.y == 1) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                if constexpr (PAIR) {
                    store_glu(nt, i, acc[0][nt][i], acc[1][nt][i]);
                } else {
#pragma unroll
                    for (int mt = 0; mt < MW; ++mt) store(mt, nt, i, acc[mt][nt][i]);
                }
            }
        return;
    }
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    const int S = static_cast<int>(cl.num_blocks()), rank = static_cast<int>(cl.block_rank());
    float* red = reinterpret_cast<float*>(smem);
    __syncthreads();  // the ring is no longer read
#pragma unroll
    for (int mt = 0; mt < MW; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) red[((mt * NT + nt) * 4 + i) * kThreads + tid] = acc[mt][nt][i];
    cl.sync();
    // The S remote slots are loaded together, then added in split order:
    // one distributed-shared-memory round trip rather than S in a row.
    const float* part[kMaxSplits];
#pragma unroll
    for (int b = 0; b < kMaxSplits; ++b) part[b] = b < S ? cl.map_shared_rank(red, b) : red;
    const auto sum = [&](int k) {
        float t[kMaxSplits];
#pragma unroll
        for (int b = 0; b < kMaxSplits; ++b) t[b] = b < S ? part[b][k * kThreads + tid] : 0.0f;
        float v = t[0];
#pragma unroll
        for (int b = 1; b < kMaxSplits; ++b) v += t[b];
        return v;
    };
    if constexpr (PAIR) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i)
                if ((nt * 4 + i) % S == rank) store_glu(nt, i, sum(nt * 4 + i), sum((NT + nt) * 4 + i));
    } else {
#pragma unroll
        for (int mt = 0; mt < MW; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int k = (mt * NT + nt) * 4 + i;
                    if (k % S == rank) store(mt, nt, i, sum(k));
                }
    }
    cl.sync();  // the other blocks' shared memory stays until every read is done
}

// The launch of a bq product kernel: blocks of kThreads threads with smem
// bytes of dynamic shared memory on `grid`, in clusters of 1 × cluster_y
// blocks (the K splits of a row group). Not copyable: cfg points at attr.
struct ClusterLaunch {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1] = {};
    ClusterLaunch(dim3 grid, unsigned cluster_y, int smem, cudaStream_t stream) {
        cfg.gridDim = grid;
        cfg.blockDim = dim3(kThreads);
        cfg.dynamicSmemBytes = static_cast<size_t>(smem);
        cfg.stream = stream;
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = 1;
        attr[0].val.clusterDim.y = cluster_y;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    ClusterLaunch(const ClusterLaunch&) = delete;
    ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// How many thread block clusters of s blocks (s = 1 .. kMaxSplits; index s)
// of `kernel` (kThreads threads, smem bytes) the device runs at once: the
// residency of a cluster is bounded by one GPC's SMs, so this is at most,
// and often less than, blocks per SM × SMs / s. Tuning::bq_blocks_per_sm = N
// sets blocks per SM × SMs / s instead.
template <class Kernel>
std::array<int, kMaxSplits + 1> active_clusters(Kernel kernel, int smem) {
    QUERN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    std::array<int, kMaxSplits + 1> a{};
    const int forced = tuning().bq_blocks_per_sm;
    for (int s = 1; s <= kMaxSplits; ++s) {
        if (forced > 0) {
            a[static_cast<size_t>(s)] = std::max(1, forced * CudaContext::current_sm_count() / s);
            continue;
        }
        const ClusterLaunch l(dim3(1, static_cast<unsigned>(s)), static_cast<unsigned>(s), smem, nullptr);
        int n = 0;
        if (cudaOccupancyMaxActiveClusters(&n, kernel, &l.cfg) != cudaSuccess) {
            (void)cudaGetLastError();  // then as if every SM held whole clusters
            int per_sm = 0;
            QUERN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
            n = per_sm * CudaContext::current_sm_count() / s;
        }
        a[static_cast<size_t>(s)] = std::max(n, 1);
    }
    return a;
}

// The K splits for bx row groups of C chunks: the count s (at most
// kMaxSplits, each split at least four chunks) with the least
// ceil(bx / active[s]) · (ceil(C / s) + (s > 1 ? reduce : 0)) — waves of
// clusters times the chunks each block walks, plus what adding the
// partial sums over the cluster costs in chunks (reduce: 0 where the
// partials are small, as bq_gemm's) — and the fewest splits among equals.
// (Filling the SMs by rounding up instead left a second, mostly empty wave:
// 30-40% longer on Llama-3-8B's gate/up at 32 rows.)
int64_t pick_splits(int64_t bx, int64_t C, const std::array<int, kMaxSplits + 1>& active, int64_t reduce = 0) {
    const int64_t most = std::clamp<int64_t>(C / 4, 1, kMaxSplits);
    int64_t best = 1, best_cost = -1;
    for (int64_t s = 1; s <= most; ++s) {
        const int64_t cps = (C + s - 1) / s, a = active[static_cast<size_t>(s)];
        const int64_t cost = (bx + a - 1) / a * (cps + (s > 1 ? reduce : 0));
        if (best_cost < 0 || cost < best_cost) best = s, best_cost = cost;
    }
    return best;
}

// Whether the current device runs the sm_90a code: the library was built with
// it (QUERN_CUDA_SM90A, from QUERN_CUDA_ARCHS) and the device has compute
// capability 9.0. Read once per process (one kind of GPU per process).
bool device_has_wgmma() {
#ifndef QUERN_CUDA_SM90A
    return false;
#else
    static const bool has = [] {
        int dev = 0, major = 0, minor = 0;
        const bool ok = cudaGetDevice(&dev) == cudaSuccess &&
                        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess;
        (void)cudaGetLastError();
        return ok && major == 9 && minor == 0;
    }();
    return has;
#endif
}

// The device's dynamic shared memory per block (opt-in maximum), read once
// per process (one kind of GPU per process).
int smem_optin() {
    static const int bytes = [] {
        int dev = 0, b = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&b, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            b = 48 * 1024;
        }
        return b;
    }();
    return bytes;
}

}  // namespace
}  // namespace quern::cuda
