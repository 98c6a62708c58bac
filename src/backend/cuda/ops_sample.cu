// Token sampling on the device: the CPU Sampler's chain (runtime/sampler.h)
// on the logits of one decode step, so that a sampled (not only greedy) step
// hands the host a single token id. API: ops.h (sample_token).
//
// sample_kernel — one block of kThreads = 1024 threads.
//   1. Penalties over the window tokens[pos+1-W .. pos] (W = min(repeat_last_n,
//      pos+1)): thread t < W owns window entry t; the first occurrence of each
//      id counts its occurrences and applies l = l > 0 ? l/rp : l·rp, then
//      l -= n·frequency + presence, in place on the logits (as Sampler does
//      on its copy). W <= kMaxSampleWindow.
//   2. temperature <= 0: argmax (lowest index among equal maxima).
//   3. top-k: the k-th largest logit by a radix select over the order-preserving
//      32-bit keys of the floats (4 passes of 8 bits, a 256-bin shared
//      histogram each); then the k candidates — every key above the
//      threshold, and of the keys equal to it the lowest ids (an exclusive scan
//      over contiguous index ranges keeps index order) — into shared memory,
//      bitonic-sorted by (logit descending, id ascending), Sampler's order.
//   4. One thread then runs Sampler's sequential tail on the sorted list:
//      p_i = exp(l_i − l_0), Σ in double, top-p cut (cumulative p/Σ >= top_p),
//      min-p cut (p_i >= min_p·p_0), exp((l_i − l_0)/T), total in double,
//      r = u·total, the first i whose running sum exceeds r.
//   Given the same logits and the same draw u, the token equals Sampler's up to
//   the rounding of expf (1 ulp) at a cut or draw boundary.
//   NaN logits sort last (key 0). k <= kMaxSampleTopK.
//   Bound: latency; 4 passes over n_vocab floats (L2-resident after the first).
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/ops.h"

namespace quern::cuda {
namespace {

constexpr int kThreads = 1024;
static_assert(kMaxSampleTopK <= kThreads && kMaxSampleWindow <= kThreads);

__device__ __forceinline__ uint32_t order_key(float f) {
    const uint32_t u = __float_as_uint(f);
    if (f != f) return 0u;  // NaN: below everything
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix sum over the block (every thread passes v, gets the sum of
// the v of lower threads); total in *tot. `sh` holds 32 ints.
__device__ __forceinline__ int block_exclusive_scan(int v, int* sh, int* tot) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xFFFFFFFFu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) sh[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < (kThreads / 32) ? sh[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xFFFFFFFFu, w, o);
            if (lane >= o) w += y;
        }
        sh[lane] = w;  // inclusive prefix of warp totals
    }
    __syncthreads();
    const int before = (warp > 0 ? sh[warp - 1] : 0) + x - v;
    *tot = sh[kThreads / 32 - 1];
    return before;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(float* __restrict__ logits, int n,
                                                          const int32_t* __restrict__ tokens,
                                                          const int32_t* __restrict__ pos_ptr, int n_ctx,
                                                          const DeviceSampling* __restrict__ params,
                                                          int32_t* __restrict__ out) {
    pdl_wait();
    pdl_trigger();
    __shared__ DeviceSampling p;
    __shared__ unsigned hist[256];
    __shared__ int scan_sh[32];
    __shared__ uint32_t sel_prefix;
    __shared__ int sel_need;
    __shared__ float cl[kThreads];
    __shared__ int cid[kThreads];
    __shared__ float pr[kThreads];
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid == 0) p = *params;
    int pos = *pos_ptr;
    pos = pos < 0 ? 0 : (pos >= n_ctx ? n_ctx - 1 : pos);
    __syncthreads();

    // ---- 1. penalties
    const bool penalize = p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
    const int W = min(max(p.repeat_last_n, 0), pos + 1);
    if (penalize && tid < W) {
        const int start = pos + 1 - W;
        const int id = tokens[start + tid];
        if (id >= 0 && id < n) {
            bool first = true;
            int cnt = 0;
            for (int j = 0; j < W; ++j)
                if (tokens[start + j] == id) {
                    ++cnt;
                    if (j < tid) first = false;
                }
            if (first) {
                float l = logits[id];
                if (p.repeat_penalty != 1.0f) l = l > 0 ? l / p.repeat_penalty : l * p.repeat_penalty;
                l -= static_cast<float>(cnt) * p.frequency_penalty + p.presence_penalty;
                logits[id] = l;
            }
        }
    }
    __syncthreads();

    // ---- 2. greedy
    if (p.temperature <= 0.0f) {
        float bv = -INFINITY;
        int bi = 0x7FFFFFFF;
        for (int i = tid; i < n; i += kThreads) {
            const float v = logits[i];
            if (v > bv || (v == bv && i < bi)) bv = v, bi = i;  // NaN never wins
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, o);
            const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        if (lane == 0) best_v[warp] = bv, best_i[warp] = bi;
        __syncthreads();
        if (tid == 0) {
            float v = best_v[0];
            int i0 = best_i[0];
            for (int w = 1; w < kThreads / 32; ++w)
                if (best_v[w] > v || (best_v[w] == v && best_i[w] < i0)) v = best_v[w], i0 = best_i[w];
            *out = i0 < n ? i0 : 0;
        }
        return;
    }

    // ---- 3. top-k: radix select of the k-th largest key
    const int k = p.top_k < n ? p.top_k : n;
    if (tid == 0) sel_prefix = 0u, sel_need = k;
    uint32_t mask = 0u;
    for (int shift = 24; shift >= 0; shift -= 8) {
        if (tid < 256) hist[tid] = 0u;
        __syncthreads();
        const uint32_t prefix = sel_prefix;
        for (int i = tid; i < n; i += kThreads) {
            const uint32_t key = order_key(logits[i]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            int need = sel_need, cum = 0, d = 255;
            for (; d > 0; --d) {
                if (cum + static_cast<int>(hist[d]) >= need) break;
                cum += static_cast<int>(hist[d]);
            }
            sel_need = need - cum;
            sel_prefix = prefix | (static_cast<uint32_t>(d) << shift);
        }
        mask |= 255u << shift;
        __syncthreads();
    }
    const uint32_t thr = sel_prefix;
    const int need_eq = sel_need;  // keys equal to thr to take, lowest ids first
    // Candidates in index order: thread t scans the contiguous range [t·chunk, (t+1)·chunk).
    const int chunk = (n + kThreads - 1) / kThreads;
    const int i0 = min(n, tid * chunk), i1 = min(n, i0 + chunk);
    int n_gt = 0, n_eq = 0;
    for (int i = i0; i < i1; ++i) {
        const uint32_t key = order_key(logits[i]);
        n_gt += key > thr;
        n_eq += key == thr;
    }
    int tot_gt = 0, tot_eq = 0;
    int off_gt = block_exclusive_scan(n_gt, scan_sh, &tot_gt);
    int off_eq = block_exclusive_scan(n_eq, scan_sh, &tot_eq);
    for (int i = i0; i < i1; ++i) {
        const float v = logits[i];
        const uint32_t key = order_key(v);
        if (key > thr) {
            cl[off_gt] = v;
            cid[off_gt] = i;
            ++off_gt;
        } else if (key == thr) {
            if (off_eq < need_eq) {
                cl[tot_gt + off_eq] = v;
                cid[tot_gt + off_eq] = i;
            }
            ++off_eq;
        }
    }
    __syncthreads();
    // Pad to kThreads and bitonic-sort by (logit desc, id asc); NaN last.
    if (tid >= k) cl[tid] = -INFINITY, cid[tid] = 0x7FFFFFFF;
    __syncthreads();
    for (int size = 2; size <= kThreads; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            const int j = tid ^ stride;
            if (j > tid) {
                const float a = cl[tid], b = cl[j];
                const int ia = cid[tid], ib = cid[j];
                const uint32_t ka = order_key(a), kb = order_key(b);
                // "a before b" in the final (descending) order
                const bool a_first = ka > kb || (ka == kb && ia < ib);
                const bool up = (tid & size) == 0;  // this pair's run sorts descending
                if (up ? !a_first : a_first) {
                    cl[tid] = b, cl[j] = a;
                    cid[tid] = ib, cid[j] = ia;
                }
            }
            __syncthreads();
        }
    }

    // ---- 4. Sampler's tail
    const float mx = cl[0];
    if (tid < k) pr[tid] = expf(cl[tid] - mx);
    __syncthreads();
    __shared__ int n_keep;
    if (tid == 0) {
        int nk = k;
        double sum = 0.0;
        for (int i = 0; i < nk; ++i) sum += pr[i];
        if (p.top_p < 1.0f) {
            double cum = 0.0;
            for (int i = 0; i < nk; ++i) {
                cum += pr[i] / sum;
                if (cum >= p.top_p) {
                    nk = i + 1;
                    break;
                }
            }
        }
        if (p.min_p > 0.0f) {
            int keep = 1;
            while (keep < nk && pr[keep] >= p.min_p * pr[0]) ++keep;
            nk = keep;
        }
        n_keep = nk;
    }
    __syncthreads();
    const int nk = n_keep;
    if (tid < nk) pr[tid] = expf((cl[tid] - mx) / p.temperature);
    __syncthreads();
    if (tid == 0) {
        double total = 0.0;
        for (int i = 0; i < nk; ++i) total += pr[i];
        const double r = p.u * total;
        double acc = 0.0;
        int pick = cid[nk - 1];
        for (int i = 0; i < nk; ++i) {
            acc += pr[i];
            if (r < acc) {
                pick = cid[i];
                break;
            }
        }
        *out = pick >= 0 && pick < n ? pick : 0;
    }
}

}  // namespace

void sample_token(float* logits, int64_t n_vocab, const int32_t* tokens, const int32_t* pos, int n_ctx,
                  const DeviceSampling* params, int32_t* out_id, cudaStream_t stream) {
    if (!logits || !tokens || !pos || !params || !out_id) throw_error("sample_token: null pointer");
    if (n_vocab < 1 || n_vocab > (int64_t{1} << 30) || n_ctx < 1) throw_error("sample_token: bad vocabulary or context size");
    launch_pdl(sample_kernel, dim3(1), dim3(kThreads), 0, stream, logits, static_cast<int>(n_vocab), tokens, pos, n_ctx,
               params, out_id);
    QUERN_CUDA_CHECK_LAUNCH();
}

bool device_sampling_supported(int top_k, int repeat_last_n, bool penalties) {
    return top_k >= 1 && top_k <= kMaxSampleTopK && (!penalties || (repeat_last_n >= 0 && repeat_last_n <= kMaxSampleWindow));
}

}  // namespace quern::cuda
