// Mixture-of-experts decode on the device: the routing of one token and the
// weighted sum of its experts' outputs (ops.h). Between them the expert
// GEMVs read the chosen ids from device memory (gemv_indexed, gemv.h), so a
// captured decode step routes every replay without the host.
//
// moe_route_kernel
//   Shapes:  logits: rows of n_expert floats; ids, weights: rows of k.
//   Grid:    one block of 256 threads per row; thread t handles experts t,
//            t + 256, ...
//   Math:    as moe_route (src/backend/cpu/moe_route.cpp) step by step: the max
//            (std::max_element's value: exact in any order), p_x =
//            exp(double(l_x − max)) (the float difference widened, as the
//            CPU), Σp in double (warp shuffles: the order differs from the
//            CPU's, a relative 1e-16 that reaches a float weight's last bit
//            about once in 10⁸), p_x /= Σ; slot j = the argmax of p over the
//            experts not yet taken, ties to the lower index (the CPU's
//            partial_sort comparator: descending p, then index), k rounds of
//            a block reduction; the chosen sum in slot order; w_j = float(p /
//            chosen or p). Only exp's last bit and the sum's may differ from
//            the CPU (CUDA's double exp is within 1 ulp), which can move a
//            weight by one float ulp and never changes the order of distinct
//            logits.
//   Bound:   latency (a few hundred bytes; k + 2 block reductions, where
//            ranking every expert against every other would take n_expert² /
//            256 double comparisons a thread, the bulk of a layer's routing).
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

constexpr int kRouteThreads = 256;

// The block's sum of d in double (detail::block_sum's form): warp shuffles,
// then one value a warp through shared memory. Every thread gets the result.
__device__ double route_block_sum(double d, double* red) {
    for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    const int t = static_cast<int>(threadIdx.x);
    if ((t & 31) == 0) red[t >> 5] = d;
    __syncthreads();
    d = 0;
    for (int w = 0; w < kRouteThreads / 32; ++w) d += red[w];
    return d;
}

__global__ void __launch_bounds__(kRouteThreads)
    moe_route_kernel(const float* __restrict__ logits, int n_expert, int k, bool renormalise,
                     int32_t* __restrict__ ids, float* __restrict__ weights, SharedExpertGate sh) {
    __shared__ double p[kMaxExperts];
    __shared__ int slot_of[kMaxExpertsUsed];
    __shared__ double red_key[2][kRouteThreads / 32];
    __shared__ int red_x[2][kRouteThreads / 32];
    __shared__ float red_max[32];
    __shared__ double red_sum[kRouteThreads / 32];
    __shared__ float red_gate[32];
    const int t = static_cast<int>(threadIdx.x);
    const int stride = k + (sh.w ? 1 : 0);
    logits += static_cast<int64_t>(blockIdx.x) * n_expert;  // block r: row r
    ids += static_cast<int64_t>(blockIdx.x) * stride;
    weights += static_cast<int64_t>(blockIdx.x) * stride;
    pdl_wait();
    pdl_trigger();
    if (sh.w) {  // slot k: the shared expert, weighted by sigmoid(w · x) (add_sigmoid_gated's arithmetic)
        const float* x = sh.x + static_cast<int64_t>(blockIdx.x) * sh.dim;
        float d = 0.0f;
        for (int64_t i = t; i < sh.dim; i += kRouteThreads) d += x[i] * sh.w[i];
        d = detail::block_sum(d, red_gate);
        if (t == 0) {
            ids[k] = n_expert;
            weights[k] = 1.0f / (1.0f + expf(-d));
        }
    }
    constexpr int kPer = kMaxExperts / kRouteThreads;  // experts t, t + 256, ... in registers
    float l[kPer];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        const int x = t + i * kRouteThreads;
        l[i] = x < n_expert ? logits[x] : -INFINITY;
        mx = fmaxf(mx, l[i]);  // fmaxf skips NaN
    }
    mx = detail::block_max(mx, red_max);  // fmaxf: NaN-free
    // std::max_element keeps a NaN first element and skips later NaNs.
    if (logits[0] != logits[0]) mx = logits[0];
    double part = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        const int x = t + i * kRouteThreads;
        if (x < n_expert) part += p[x] = exp(static_cast<double>(l[i] - mx));
    }
    const double sum = route_block_sum(part, red_sum);  // ends after a barrier: p is complete
    // NaN probabilities (from non-finite logits) rank below every number,
    // so a row never names an expert twice; experts past n_expert and those
    // already taken rank below NaN.
    double key[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        const int x = t + i * kRouteThreads;
        if (x < n_expert) p[x] /= sum;
        key[i] = x >= n_expert ? -INFINITY : p[x] == p[x] ? p[x] : -1.0;
    }
    // k rounds of a block-wide argmax (largest key, ties to the lower index):
    // slot j takes the expert of rank j.
    for (int j = 0; j < k; ++j) {
        double bk = -INFINITY;
        int bx = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < kPer; ++i)
            if (key[i] > bk) bk = key[i], bx = t + i * kRouteThreads;
        for (int o = 16; o > 0; o >>= 1) {
            const double ok = __shfl_xor_sync(0xffffffffu, bk, o);
            const int ox = __shfl_xor_sync(0xffffffffu, bx, o);
            if (ok > bk || (ok == bk && ox < bx)) bk = ok, bx = ox;
        }
        if ((t & 31) == 0) red_key[j & 1][t >> 5] = bk, red_x[j & 1][t >> 5] = bx;
        __syncthreads();  // the other buffer is free again: everyone read it before this barrier
        bk = red_key[j & 1][0], bx = red_x[j & 1][0];
        for (int w = 1; w < kRouteThreads / 32; ++w) {
            const double ok = red_key[j & 1][w];
            const int ox = red_x[j & 1][w];
            if (ok > bk || (ok == bk && ox < bx)) bk = ok, bx = ox;
        }
        if (t == 0) slot_of[j] = bx;
#pragma unroll
        for (int i = 0; i < kPer; ++i)
            if (t + i * kRouteThreads == bx) key[i] = -INFINITY;
    }
    if (t == 0) {
        double chosen = 0;
        for (int j = 0; j < k; ++j) chosen += p[slot_of[j]];
        for (int j = 0; j < k; ++j) {
            const int x = slot_of[j];
            ids[j] = x;
            weights[j] = static_cast<float>(renormalise ? p[x] / chosen : p[x]);
        }
    }
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
    launch_pdl(moe_route_kernel, dim3(static_cast<unsigned>(n)), dim3(kRouteThreads), 0, stream, logits, n_expert, k,
               renormalise, ids, weights, sh);
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
