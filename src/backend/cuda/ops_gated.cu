// Per-group RMSNorm, the gated RMSNorm of a DeltaNet's decode step and the
// sigmoid-gated add of a shared expert (ops.h): the small row kernels of
// gated layers.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace quern::cuda {

namespace {

// rms_norm_groups_kernel
//   Grid:  one block per (row, group); threads stride over the group.
//   Math:  fp32 sum of squares (the CPU sums in double).
__global__ void rms_norm_groups_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                                       int64_t ldy, int64_t width, int64_t group, float eps) {
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    const int64_t g0 = int64_t{blockIdx.y} * group;
    const float* xr = x + r * width + g0;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < group; i += blockDim.x) ss += xr[i] * xr[i];
    ss = detail::block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(group) + eps);
    for (int64_t i = threadIdx.x; i < group; i += blockDim.x) y[r * ldy + g0 + i] = xr[i] * inv * w[i];
}

// gated_rms_norm_q8_1_kernel
//   Grid:  one block per group (a DeltaNet value head) of `group` threads
//          (a multiple of 32, ≤ 1024): thread i holds element g0 + i.
//   Math:  RMSNorm of the group as rms_norm_groups_kernel (fp32 sum of
//          squares, block_sum), then SiLU(z)·y as swiglu_q8_1 (glu_value),
//          quantized per 32 elements (one warp each) as swiglu_q8_1 does.
//   Bound: latency (a few KB).
__global__ void gated_rms_norm_q8_1_kernel(const float* __restrict__ y, const float* __restrict__ w,
                                           const float* __restrict__ z, float* __restrict__ h, int8_t* __restrict__ xq,
                                           ActBlockInfo* __restrict__ xinfo, int8_t* __restrict__ xq2,
                                           ActBlockInfo* __restrict__ xinfo2, int group, int64_t half_k, float eps) {
    __shared__ float red[32];
    pdl_wait_trigger(true);
    const int t = static_cast<int>(threadIdx.x);
    const int64_t i = static_cast<int64_t>(blockIdx.x) * group + t;
    const float v = y[i];
    const float ss = detail::block_sum(v * v, red);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(group) + eps);
    const float g = detail::glu_value(z[i], v * inv * w[t], kGateSiLU);
    if (h) h[i] = g;
    if (xq) detail::quantize_block_q8_1_l2(g, t & 31, i >> 5, xq, xinfo, xq2, xinfo2, half_k);
}

__device__ __forceinline__ float load_f(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_f(const uint16_t* p, int64_t i) {
    return __bfloat162float(__ushort_as_bfloat16(p[i]));
}

// add_sigmoid_gated_kernel
//   Grid:  one block of 256 threads per row: the dot product, then the add.
template <class X>
__global__ void add_sigmoid_gated_kernel(const X* __restrict__ x, const float* __restrict__ w,
                                         const float* __restrict__ y, float* __restrict__ out, int64_t dim) {
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    float d = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) d += load_f(x, r * dim + i) * w[i];
    d = detail::block_sum(d, red);
    const float g = 1.0f / (1.0f + expf(-d));
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) out[r * dim + i] += g * y[r * dim + i];
}

template <class X>
void launch_gated(const X* x, const float* w, const float* y, float* out, int64_t n, int64_t dim, cudaStream_t stream) {
    if (!x || !w || !y || !out) throw_error("add_sigmoid_gated: null pointer");
    if (n < 1 || n > 2147483647 || dim < 1) throw_error("add_sigmoid_gated: bad shape");
    add_sigmoid_gated_kernel<X><<<static_cast<unsigned>(n), 256, 0, stream>>>(x, w, y, out, dim);
    QUERN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rms_norm_groups(const float* x, const float* w, float* y, int64_t ldy, int64_t n, int64_t width, int64_t group,
                     float eps, cudaStream_t stream) {
    if (!x || !w || !y) throw_error("rms_norm_groups: null pointer");
    if (n < 1 || n > 2147483647 || group < 1 || width < group || width % group != 0 || ldy < width ||
        width / group > 65535)
        throw_error("rms_norm_groups: bad shape");
    const int threads = group >= 256 ? 256 : static_cast<int>((group + 31) / 32 * 32);
    rms_norm_groups_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(width / group)), threads, 0, stream>>>(
        x, w, y, ldy, width, group, eps);
    QUERN_CUDA_CHECK_LAUNCH();
}

void gated_rms_norm_q8_1(const float* y, const float* w, const float* z, float* h, int8_t* xq, ActBlockInfo* xinfo,
                         int8_t* xq2, ActBlockInfo* xinfo2, int64_t width, int64_t group, float eps,
                         cudaStream_t stream) {
    if (!y || !w || !z) throw_error("gated_rms_norm_q8_1: null pointer");
    if (group < 32 || group > 1024 || group % 32 != 0 || width < group || width % group != 0 || width / group > 65535)
        throw_error("gated_rms_norm_q8_1: bad shape");
    if ((xq == nullptr) != (xinfo == nullptr) || (xq2 == nullptr) != (xinfo2 == nullptr) || (xq2 && !xq))
        throw_error("gated_rms_norm_q8_1: give xq with xinfo, and a residual level only with a first");
    launch_pdl(gated_rms_norm_q8_1_kernel, dim3(static_cast<unsigned>(width / group)), dim3(static_cast<unsigned>(group)),
               0, stream, y, w, z, h, xq, xinfo, xq2, xinfo2, static_cast<int>(group), width / 2, eps);
    QUERN_CUDA_CHECK_LAUNCH();
}

void add_sigmoid_gated(const float* x, const float* w, const float* y, float* out, int64_t n, int64_t dim,
                       cudaStream_t stream) {
    launch_gated(x, w, y, out, n, dim, stream);
}

void add_sigmoid_gated(const uint16_t* x, const float* w, const float* y, float* out, int64_t n, int64_t dim,
                       cudaStream_t stream) {
    launch_gated(x, w, y, out, n, dim, stream);
}

}  // namespace quern::cuda
