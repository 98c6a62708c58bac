// Mixture-of-experts decode on the device: the routing of one token and the
// weighted sum of its experts' outputs (ops.h). Between them the expert
// GEMVs read the chosen ids from device memory (gemv_indexed, gemv.h), so a
// captured decode step routes every replay without the host.
//
// moe_route_kernel
//   Shapes:  logits: rows of n_expert floats; ids, weights: rows of k (k + 1
//            with the shared slot).
//   Grid:    one warp per row, kRouteWarps rows a block; lane i holds experts
//            i, i + 32, ... in registers (PER of them: ceil(n_expert / 32)
//            rounded up to a power of two). No shared memory and no block
//            barrier: every reduction is warp shuffles.
//   Math:    as moe_route (src/backend/cpu/moe_route.cpp) step by step: the max
//            (std::max_element's value: exact in any order), p_x =
//            exp(double(l_x − max)) (the float difference widened, as the
//            CPU), Σp in double (shuffles: the order differs from the CPU's,
//            a relative 1e-16 that reaches a float weight's last bit about
//            once in 10⁸), p_x /= Σ; slot j = the argmax of p over the
//            experts not yet taken, ties to the lower index (the CPU's
//            partial_sort comparator: descending p, then index), k rounds of
//            a warp argmax; the chosen sum in slot order; w_j = float(p /
//            chosen or p). Only exp's last bit and the sum's may differ from
//            the CPU (CUDA's double exp is within 1 ulp), which can move a
//            weight by one float ulp and never changes the order of distinct
//            logits.
//   Bound:   latency (a few hundred bytes; k + 2 warp reductions of five
//            shuffles — a block-wide argmax costs two barriers a round).
//
// moe_weighted_sum_kernel
//   Shapes:  y: k rows of n floats (slot j at y + j·n); weights: k floats;
//            out: n floats.
//   Grid:    ceil(n / 256) blocks of 256 threads, one element per thread.
//   Math:    out[i] = w_0·y_0[i] + w_1·y_1[i] + ... in slot order (the CPU's
//            order; fp32, separate multiply and add as the CPU loop).
//   Bound:   latency (k·n·4 bytes, a few tens of KB).
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/ops.h"

namespace quern::cuda {
namespace {

constexpr int kRouteWarps = 4;  // rows a block
static_assert(kMaxExpertsUsed <= 32, "lane j keeps slot j");

__device__ __forceinline__ double warp_sum_double(double d) {
    for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    return d;
}

// One row's routing by the calling warp (moe_route_kernel's Math, above).
template <int PER>
__device__ void route_row(const float* logits, int n_expert, int k, bool renormalise, int32_t* __restrict__ ids,
                          float* __restrict__ weights, int lane) {
    float l[PER];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int x = lane + 32 * i;
        l[i] = x < n_expert ? logits[x] : -INFINITY;
        mx = fmaxf(mx, l[i]);  // fmaxf skips NaN
    }
    mx = detail::warp_max(mx);
    // std::max_element keeps a NaN first element and skips later NaNs.
    const float l0 = __shfl_sync(0xffffffffu, l[0], 0);
    if (l0 != l0) mx = l0;
    double key[PER];  // p_x; experts past n_expert hold 0 until the ranking below
    double part = 0;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        key[i] = lane + 32 * i < n_expert ? exp(static_cast<double>(l[i] - mx)) : 0.0;
        part += key[i];
    }
    const double sum = warp_sum_double(part);
    // The ranking key: p_x; NaN probabilities (from non-finite logits) rank
    // below every number (as -1: p >= 0 otherwise), so a row never names an
    // expert twice; experts past n_expert and those already taken rank below
    // NaN.
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const double p = key[i] / sum;
        key[i] = lane + 32 * i >= n_expert ? -INFINITY : p == p ? p : -1.0;
    }
    // k rounds of a warp argmax (largest key, ties to the lower index): slot
    // j takes the expert of rank j; lane j keeps it.
    int my_x = 0;
    double my_p = 0;
    for (int j = 0; j < k; ++j) {
        double bk = -INFINITY;
        int bx = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < PER; ++i)
            if (key[i] > bk) bk = key[i], bx = lane + 32 * i;
        for (int o = 16; o > 0; o >>= 1) {
            const double ok = __shfl_xor_sync(0xffffffffu, bk, o);
            const int ox = __shfl_xor_sync(0xffffffffu, bx, o);
            if (ok > bk || (ok == bk && ox < bx)) bk = ok, bx = ox;
        }
        if (lane == j) my_x = bx, my_p = bk < 0 ? static_cast<double>(NAN) : bk;
#pragma unroll
        for (int i = 0; i < PER; ++i)
            if (lane + 32 * i == bx) key[i] = -INFINITY;
    }
    double chosen = 0;  // in slot order, as the CPU
    for (int j = 0; j < k; ++j) chosen += __shfl_sync(0xffffffffu, my_p, j);
    if (lane < k) {
        ids[lane] = my_x;
        weights[lane] = static_cast<float>(renormalise ? my_p / chosen : my_p);
    }
}

template <int PER>
__global__ void __launch_bounds__(32 * kRouteWarps)
    moe_route_kernel(const float* __restrict__ logits, int64_t n, int n_expert, int k, bool renormalise,
                     int32_t* __restrict__ ids, float* __restrict__ weights, SharedExpertGate sh) {
    const int lane = static_cast<int>(threadIdx.x & 31);
    const int64_t row = static_cast<int64_t>(blockIdx.x) * kRouteWarps + (threadIdx.x >> 5);
    pdl_wait();
    pdl_trigger();
    if (row >= n) return;  // whole warps leave together
    const int stride = k + (sh.w ? 1 : 0);
    ids += row * stride;
    weights += row * stride;
    if (sh.w) {  // slot k: the shared expert, weighted by sigmoid(w · x) (add_sigmoid_gated's, a warp's sum)
        const float* x = sh.x + row * sh.dim;
        float d = 0.0f;
        for (int64_t i = lane; i < sh.dim; i += 32) d += x[i] * sh.w[i];
        d = detail::warp_sum(d);
        if (lane == 0) {
            ids[k] = n_expert;
            weights[k] = 1.0f / (1.0f + expf(-d));
        }
    }
    route_row<PER>(logits + row * n_expert, n_expert, k, renormalise, ids, weights, lane);
}

__global__ void moe_weighted_sum_kernel(const float* __restrict__ y, const float* __restrict__ w, int k, int64_t n,
                                        float* __restrict__ out) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    pdl_wait();
    pdl_trigger();
    if (i >= n) return;
    float acc = w[0] * y[i];
    for (int j = 1; j < k; ++j) acc = __fadd_rn(acc, __fmul_rn(w[j], y[static_cast<int64_t>(j) * n + i]));
    out[i] = acc;
}

// gather_rows_bf16_kernel: out row i = x row src[i] (K BF16 values), one
// thread per element, grid-stride. Bound: memory.
__global__ void gather_rows_bf16_kernel(const uint16_t* __restrict__ x, int64_t K, const int32_t* __restrict__ src,
                                        int64_t m, uint16_t* __restrict__ out) {
    const int64_t total = m * K;
    for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
         t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t i = t / K, e = t % K;
        out[t] = x[static_cast<int64_t>(src[i]) * K + e];
    }
}

// moe_weighted_sum_rows_kernel: moe_weighted_sum_kernel for n rows, the
// outputs of row r's slot j at y + pos[r·k + j]·dim. One thread per output
// element, grid-stride; the CPU's slot order and arithmetic. Bound: memory.
__global__ void moe_weighted_sum_rows_kernel(const float* __restrict__ y, const int32_t* __restrict__ pos,
                                             const float* __restrict__ w, int64_t n, int k, int64_t dim,
                                             float* __restrict__ out) {
    const int64_t total = n * dim;
    for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
         t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = t / dim, i = t % dim;
        const int32_t* pr = pos + r * k;
        const float* wr = w + r * k;
        float acc = wr[0] * y[static_cast<int64_t>(pr[0]) * dim + i];
        for (int j = 1; j < k; ++j) acc = __fadd_rn(acc, __fmul_rn(wr[j], y[static_cast<int64_t>(pr[j]) * dim + i]));
        out[t] = acc;
    }
}

// moe_group_kernel
//   Shapes:  ids: m = n·k expert ids (row r's slot j at r·k + j, each in
//            [0, n_expert)); pos, src: m int32; off: n_expert + 1 int32.
//   Grid:    one block of kGroupThreads; entries e = t, t + kGroupThreads, ...
//   Math:    counts per expert (shared atomics), off = their exclusive
//            prefix sum (thread 0, expert order), then each entry takes the
//            next free row of its expert's group: pos[e] = g, src[g] = e / k.
//            The order of the rows inside a group depends on timing; every
//            row is multiplied on its own and summed back in slot order, so
//            the layer's output does not.
//   Bound:   latency (m ≤ a few ten thousand entries, shared-memory atomics).
constexpr int kGroupThreads = 1024;

__global__ void __launch_bounds__(kGroupThreads)
    moe_group_kernel(const int32_t* __restrict__ ids, int64_t m, int k, int n_expert, int32_t* __restrict__ pos,
                     int32_t* __restrict__ src, int32_t* __restrict__ off) {
    __shared__ int count[kMaxExperts];
    __shared__ int next[kMaxExperts];
    const int t = static_cast<int>(threadIdx.x);
    for (int x = t; x < n_expert; x += kGroupThreads) count[x] = 0;
    __syncthreads();
    // Ids outside [0, n_expert) (a caller's bug) are clamped: no shared-memory
    // write lands outside the counts.
    const auto expert = [&](int64_t e) { return min(max(ids[e], 0), n_expert - 1); };
    for (int64_t e = t; e < m; e += kGroupThreads) atomicAdd(&count[expert(e)], 1);
    __syncthreads();
    if (t == 0) {
        int at = 0;
        for (int x = 0; x < n_expert; ++x) {
            off[x] = next[x] = at;
            at += count[x];
        }
        off[n_expert] = at;
    }
    __syncthreads();
    for (int64_t e = t; e < m; e += kGroupThreads) {
        const int g = atomicAdd(&next[expert(e)], 1);
        pos[e] = g;
        src[g] = static_cast<int32_t>(e / k);
    }
}

unsigned grid_for_elems(int64_t total) {
    return static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 65535 * 8));
}

}  // namespace

void gather_rows_bf16(const uint16_t* x, int64_t K, const int32_t* src, int64_t m, uint16_t* out,
                      cudaStream_t stream) {
    if (!x || !src || !out) throw_error("gather_rows_bf16: null pointer");
    if (K < 1 || m < 1) throw_error("gather_rows_bf16: empty shape");
    gather_rows_bf16_kernel<<<grid_for_elems(m * K), 256, 0, stream>>>(x, K, src, m, out);
    QUERN_CUDA_CHECK_LAUNCH();
}

void moe_weighted_sum_rows(const float* y, const int32_t* pos, const float* weights, int64_t n, int k, int64_t dim,
                           float* out, cudaStream_t stream) {
    if (!y || !pos || !weights || !out) throw_error("moe_weighted_sum_rows: null pointer");
    if (n < 1 || k < 1 || dim < 1) throw_error("moe_weighted_sum_rows: empty shape");
    moe_weighted_sum_rows_kernel<<<grid_for_elems(n * dim), 256, 0, stream>>>(y, pos, weights, n, k, dim, out);
    QUERN_CUDA_CHECK_LAUNCH();
}

namespace {

void launch_route(const float* logits, int64_t n, int n_expert, int k, bool renormalise, int32_t* ids,
                  float* weights, const SharedExpertGate& sh, cudaStream_t stream) {
    if (!logits || !ids || !weights) throw_error("moe_route: null pointer");
    if (sh.w && (!sh.x || sh.dim < 1)) throw_error("moe_route: a shared expert gate without its input");
    if (n < 1 || n > 0x7fffffff) throw_error("moe_route_rows: rows out of range");
    if (n_expert < 1 || n_expert > kMaxExperts)
        throw_error("moe_route: " + std::to_string(n_expert) + " experts (1.." + std::to_string(kMaxExperts) + ")");
    if (k < 1 || k > n_expert || k > kMaxExpertsUsed)
        throw_error("moe_route: " + std::to_string(k) + " experts used of " + std::to_string(n_expert) + " (1.." +
                    std::to_string(kMaxExpertsUsed) + ")");
    const dim3 grid(static_cast<unsigned>((n + kRouteWarps - 1) / kRouteWarps)), block(32 * kRouteWarps);
    const auto launch = [&](auto kernel) {
        launch_pdl(kernel, grid, block, 0, stream, logits, n, n_expert, k, renormalise, ids, weights, sh);
    };
    const int per = (n_expert + 31) / 32;
    if (per <= 1) launch(moe_route_kernel<1>);
    else if (per <= 2) launch(moe_route_kernel<2>);
    else if (per <= 4) launch(moe_route_kernel<4>);
    else if (per <= 8) launch(moe_route_kernel<8>);
    else if (per <= 16) launch(moe_route_kernel<16>);
    else launch(moe_route_kernel<32>);
    QUERN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void moe_route(const float* logits, int n_expert, int k, bool renormalise, int32_t* ids, float* weights,
               cudaStream_t stream, const SharedExpertGate& shared) {
    launch_route(logits, 1, n_expert, k, renormalise, ids, weights, shared, stream);
}

void moe_route_rows(const float* logits, int64_t n, int n_expert, int k, bool renormalise, int32_t* ids,
                    float* weights, cudaStream_t stream) {
    launch_route(logits, n, n_expert, k, renormalise, ids, weights, SharedExpertGate{}, stream);
}

void moe_group_rows(const int32_t* ids, int64_t n, int k, int n_expert, int32_t* pos, int32_t* src, int32_t* offsets,
                    cudaStream_t stream) {
    if (!ids || !pos || !src || !offsets) throw_error("moe_group_rows: null pointer");
    if (n < 1 || k < 1 || n_expert < 1 || n_expert > kMaxExperts || n * k > 0x7fffffff)
        throw_error("moe_group_rows: shape out of range");
    moe_group_kernel<<<1, kGroupThreads, 0, stream>>>(ids, n * k, k, n_expert, pos, src, offsets);
    QUERN_CUDA_CHECK_LAUNCH();
}

void moe_weighted_sum(const float* y, const float* weights, int k, int64_t n, float* out, cudaStream_t stream) {
    if (!y || !weights || !out) throw_error("moe_weighted_sum: null pointer");
    if (k < 1 || n < 1) throw_error("moe_weighted_sum: empty input");
    const auto blocks = static_cast<unsigned>((n + 255) / 256);
    launch_pdl(moe_weighted_sum_kernel, dim3(blocks), dim3(256), 0, stream, y, weights, k, n, out);
    QUERN_CUDA_CHECK_LAUNCH();
}

}  // namespace quern::cuda
