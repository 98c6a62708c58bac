// Device helpers of the row-batched attention kernels (ops_prefill.cu,
// ops_paged.cu; not part of the API): where a query row and the keys of a
// position live, and how one warp readies a head (bias, RMSNorm, RoPE).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace quern::cuda::detail {

// Where query row r sits and where the keys/values of a position live:
// one sequence's consecutive rows over its own cache (the prefill), or rows
// of several sequences over a paged cache (PagedRows, ops.h).
struct ContiguousRows {
    int pos0;
    __device__ __forceinline__ int pos(int r) const { return pos0 + r; }
    __device__ __forceinline__ int64_t cache_row(int, int p) const { return p; }
    __device__ __forceinline__ const float* freq(int, const float* inv_freq) const { return inv_freq; }
};
struct PagedMap {
    PagedRows pr;
    __device__ __forceinline__ int pos(int r) const { return pr.pos[r]; }
    __device__ __forceinline__ int64_t cache_row(int r, int p) const {
        return static_cast<int64_t>(pr.tables[pr.table_off[r] + p / pr.block_size]) * pr.block_size +
               p % pr.block_size;
    }
    __device__ __forceinline__ const float* freq(int r, const float* inv_freq) const {
        return pr.rope_long && pr.rope_long[r] ? pr.inv_freq_long : inv_freq;
    }
};

// One warp readies a head for attention: xs (shared, hd floats) = the head
// at src plus bias (when given), RMS-normed with weights nw (when given: one
// warp sum, eps), its first rope_dim elements rotated pair by pair at
// position pos (lane i: pairs i, i+32, ...; angles by rope_angle as the
// decode kernel; neox: pairs (i, i + rope_dim/2), else (2i, 2i+1)). Ends
// with __syncwarp; the whole warp calls it.
__device__ __forceinline__ void rope_head(float* xs, const float* __restrict__ src, const float* __restrict__ bias,
                                          const float* __restrict__ nw, float eps, int hd, int pos,
                                          const float* __restrict__ freq, int rope_dim, int neox, int lane) {
    for (int e = lane; e < hd; e += 32) xs[e] = src[e] + (bias ? bias[e] : 0.0f);
    __syncwarp();
    if (nw) {
        float ss = 0.0f;
        for (int e = lane; e < hd; e += 32) ss += xs[e] * xs[e];
        ss = warp_sum(ss);
        const float sc = 1.0f / sqrtf(ss / static_cast<float>(hd) + eps);
        for (int e = lane; e < hd; e += 32) xs[e] = xs[e] * sc * nw[e];
        __syncwarp();
    }
    const int half = rope_dim / 2;
    for (int i = lane; i < half; i += 32) {
        float c, s;
        rope_angle(pos, freq[i], &c, &s);
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        const float a = xs[i0], b = xs[i1];
        xs[i0] = a * c - b * s;
        xs[i1] = a * s + b * c;
    }
    __syncwarp();
}

}  // namespace quern::cuda::detail
