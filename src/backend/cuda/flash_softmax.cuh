// The online-softmax step of the tensor-core attention kernels (ops_flash.cu,
// ops_paged.cu; FlashAttention-2's rescaling), on the layout of an
// mma.m16n8 accumulator: lane 4g + c holds, per n-tile j of 8 keys, the
// scores of rows g (elements 0, 1) and g + 8 (elements 2, 3) at keys 2c and
// 2c + 1. Not part of the API.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/mma.cuh"

namespace quern::cuda::detail {

/// One tile of NJ n-tiles of scores s (masked keys already −inf): updates the
/// two rows' running maxima m (max over the quad of lanes sharing a row) and
/// this lane's partial sums l (l·corr + Σ e^{s − m}), returns in corr the
/// factors the rows' output accumulators must be scaled by, and in pf the
/// weights e^{s − m} rounded to f16 pairs (pf[j][0]: row g, pf[j][1]: row
/// g + 8), the A fragments of O += P·V. A row with no key so far keeps
/// m = −inf and gets weights 0 and corr 0 (no NaN).
template <int NJ>
__device__ __forceinline__ void online_softmax_step(const float (&s)[NJ][4], float (&m)[2], float (&l)[2],
                                                    float (&corr)[2], uint32_t (&pf)[NJ][2]) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
    }
    float base[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xFFFFFFFFu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xFFFFFFFFu, mx[h], 2));
        const float mn = fmaxf(m[h], mx[h]);
        base[h] = mn == -INFINITY ? 0.0f : mn;  // subtract 0 while no key: e^{−inf} = 0
        corr[h] = expf(m[h] - base[h]);         // 0 while m is −inf
        m[h] = mn;
    }
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        const float p0 = expf(s[j][0] - base[0]), p1 = expf(s[j][1] - base[0]);
        const float p2 = expf(s[j][2] - base[1]), p3 = expf(s[j][3] - base[1]);
        sum[0] += p0 + p1;
        sum[1] += p2 + p3;
        pf[j][0] = mma::pack_half2(p0, p1);
        pf[j][1] = mma::pack_half2(p2, p3);
    }
    l[0] = l[0] * corr[0] + sum[0];
    l[1] = l[1] * corr[1] + sum[1];
}

}  // namespace quern::cuda::detail
