// Activation quantization for the integer GEMV path.
//
// quantize_q8_1_kernel
//   Shapes:  x: K floats (K % 32 == 0) -> xq: K int8 in two planes
//            [2][K/32][16] (plane p, block b, byte i = element 32b+16p+i),
//            xinfo: K/32 ActBlockInfo {d, s, Σq[0..15], Σq[16..31]}.
//   Grid:    one warp per 32-element block, lane i owns element 32b+i;
//            256 threads per block, ceil(K/256) blocks.
//   Math:    exactly quantize_row_ref(Q8_1): amax by warp max, d = amax/127
//            (IEEE division: this file is built without fast math),
//            id = d ? 1/d : 0, q = roundf(x·id) (half away from zero;
//            clamped to [-127, 127], which holds level 1's codes anyway),
//            s = float(Σq)·d. Two-level: the residual x - d·q (fp32) is
//            quantized into the second level with the fixed scale d/254
//            (gemv.h's kLevel2Ratio). d and s stay fp32 (the reference stores them as
//            fp16; fp16(d), fp16(s) equal its fields bit for bit). Half-block
//            sums by shuffles within each 16-lane half, then across halves.
//   Bound:   launch latency (K ≤ a few ten thousand: 4 bytes in, ~1.3 out per element).
#include "backend/cuda/launch.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/ops_common.cuh"

namespace quern::cuda {
namespace {

__global__ void quantize_q8_1_kernel(const float* __restrict__ x, int8_t* __restrict__ xq,
                                     ActBlockInfo* __restrict__ xinfo, int8_t* __restrict__ xq2,
                                     ActBlockInfo* __restrict__ xinfo2, int n_blocks, int64_t half_k) {
    pdl_wait();
    pdl_trigger();
    const int b = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    const int lane = static_cast<int>(threadIdx.x & 31);
    if (b >= n_blocks) return;  // whole warps leave together
    detail::quantize_block_q8_1_l2(x[32 * static_cast<int64_t>(b) + lane], lane, b, xq, xinfo, xq2, xinfo2, half_k);
}

}  // namespace

void launch_quantize_q8_1(const float* x, int8_t* xq, ActBlockInfo* xinfo, int64_t K, cudaStream_t stream,
                          int8_t* xq2, ActBlockInfo* xinfo2) {
    const int n_blocks = static_cast<int>(K / 32);
    if (n_blocks == 0) return;
    const unsigned grid = static_cast<unsigned>((static_cast<int64_t>(n_blocks) * 32 + 255) / 256);
    launch_pdl(quantize_q8_1_kernel, dim3(grid), dim3(256), 0, stream, x, xq, xinfo, xq2, xinfo2, n_blocks, K / 2);
}

}  // namespace quern::cuda
