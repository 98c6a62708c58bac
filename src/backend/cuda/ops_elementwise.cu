// Row-wise and elementwise decode kernels: RMSNorm (+ residual) fused with
// the Q8_1 quantizer, SwiGLU fused with the quantizer, residual add. API and
// formats: ops.h.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace quern::cuda {
namespace {

using detail::block_sum;
using detail::quantize_block_q8_1;

// rms_norm_q8_1_kernel
//   Shapes:  x, residual, y: n rows × dim floats; w: dim floats;
//            xq: n × [2][dim/32][16] int8; xinfo: n × dim/32 records.
//   Grid:    one block of kNormThreads per row. Pass 1: each thread strides
//            over the row (residual added and stored back), fp32 sum of
//            squares, block reduction. Pass 2: warp w takes 32-element blocks
//            w, w+8, ...; lane i computes y[32b+i] = (x·scale)·w (the CPU's
//            order) and the warp quantizes the block.
//   Align:   none beyond 4-byte floats (scalar, coalesced accesses).
//   Bound:   latency (dim ≤ ~16k: ≤ 200 KB per row, one block per row).
constexpr int kNormThreads = 256;

__global__ void rms_norm_q8_1_kernel(float* x, const float* __restrict__ residual, const float* __restrict__ w,
                                     float* __restrict__ y, int8_t* __restrict__ xq, ActBlockInfo* __restrict__ xinfo,
                                     int64_t dim, float eps) {
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    float* xr = x + r * dim;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = xr[i];
        if (residual) {
            v += residual[r * dim + i];
            xr[i] = v;
        }
        ss += v * v;
    }
    ss = block_sum(ss, red);  // ends with __syncthreads: the stores to xr are visible
    const float scale = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t n_blocks = dim / 32;
    for (int64_t b = warp; b < n_blocks; b += nw) {
        const int64_t i = 32 * b + lane;
        const float v = xr[i] * scale * w[i];
        if (y) y[r * dim + i] = v;
        if (xq) quantize_block_q8_1(v, lane, b, xq + r * dim, xinfo + r * n_blocks, dim / 2);
    }
}

// swiglu_q8_1_kernel
//   Shapes:  gate, up, h: count floats; xq/xinfo: one row of count elements.
//   Grid:    one warp per 32-element block (lane i: element 32b+i), 256
//            threads per block, ceil(count/256) blocks.
//   Bound:   latency (count ≤ ~50k: 8 bytes in, ~5.3 out per element).
__global__ void swiglu_q8_1_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                                   float* __restrict__ h, int8_t* __restrict__ xq, ActBlockInfo* __restrict__ xinfo,
                                   int64_t n_blocks, int64_t half_k) {
    const int64_t b = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (b >= n_blocks) return;  // whole warps leave together
    const int64_t i = 32 * b + lane;
    const float g = gate[i];
    const float v = g / (1.0f + expf(-g)) * up[i];
    if (h) h[i] = v;
    if (xq) quantize_block_q8_1(v, lane, b, xq, xinfo, half_k);
}

// add_kernel / add4_kernel
//   Shapes:  y, x: count floats (add4: count/4 float4, both 16-byte aligned).
//   Grid:    grid-stride loop, 256 threads, ≤ 4 blocks per SM worth of blocks.
//   Bound:   bandwidth (12 bytes per element), latency for decode sizes.
__global__ void add_kernel(float* __restrict__ y, const float* __restrict__ x, int64_t count) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        y[i] += x[i];
}
__global__ void add4_kernel(float4* __restrict__ y, const float4* __restrict__ x, int64_t count4) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count4;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        float4 a = y[i];
        const float4 b = x[i];
        a.x += b.x;
        a.y += b.y;
        a.z += b.z;
        a.w += b.w;
        y[i] = a;
    }
}

unsigned grid_for(int64_t items, int threads) {
    const int64_t g = (items + threads - 1) / threads;
    return static_cast<unsigned>(g < 1 ? 1 : (g > 4096 ? 4096 : g));
}

}  // namespace

void rms_norm_q8_1(float* x, const float* residual, const float* w, float* y_out, int8_t* xq, ActBlockInfo* xinfo,
                   int64_t n, int64_t dim, float eps, cudaStream_t stream) {
    if (n < 1 || dim < 32 || dim % 32 != 0 || n > 0x7FFFFFFF)
        throw_error("rms_norm_q8_1: need n >= 1 and dim a positive multiple of 32");
    if (!x || !w) throw_error("rms_norm_q8_1: x and w are required");
    if ((xq == nullptr) != (xinfo == nullptr)) throw_error("rms_norm_q8_1: give both xq and xinfo, or neither");
    rms_norm_q8_1_kernel<<<static_cast<unsigned>(n), kNormThreads, 0, stream>>>(x, residual, w, y_out, xq, xinfo, dim,
                                                                                eps);
    QUERN_CUDA_CHECK_LAUNCH();
}

void swiglu_q8_1(const float* gate, const float* up, float* h_out, int8_t* xq, ActBlockInfo* xinfo, int64_t count,
                 cudaStream_t stream) {
    if (count < 32 || count % 32 != 0) throw_error("swiglu_q8_1: count must be a positive multiple of 32");
    if (!gate || !up) throw_error("swiglu_q8_1: gate and up are required");
    if ((xq == nullptr) != (xinfo == nullptr)) throw_error("swiglu_q8_1: give both xq and xinfo, or neither");
    const int64_t n_blocks = count / 32;
    const unsigned grid = static_cast<unsigned>((n_blocks * 32 + 255) / 256);
    swiglu_q8_1_kernel<<<grid, 256, 0, stream>>>(gate, up, h_out, xq, xinfo, n_blocks, count / 2);
    QUERN_CUDA_CHECK_LAUNCH();
}

void add_inplace(float* y, const float* x, int64_t count, cudaStream_t stream) {
    if (count < 0) throw_error("add_inplace: negative count");
    if (count == 0) return;
    const bool vec = count % 4 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(x) % 16 == 0;
    if (vec)
        add4_kernel<<<grid_for(count / 4, 256), 256, 0, stream>>>(reinterpret_cast<float4*>(y),
                                                                  reinterpret_cast<const float4*>(x), count / 4);
    else
        add_kernel<<<grid_for(count, 256), 256, 0, stream>>>(y, x, count);
    QUERN_CUDA_CHECK_LAUNCH();
}

}  // namespace quern::cuda
