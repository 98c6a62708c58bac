// Device helpers shared by the ops_*.cu kernels (not part of the API).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/gemv.h"
#include "backend/cuda/ops.h"

namespace quern::cuda::detail {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
    return v;
}

/// Quantizes one 32-element block held one element per lane (v of lane i =
/// element 32b+i) with the scale d into the QuantizedActivation format
/// (gemv.h): q = clamp(roundf(v/d), −127, 127) (half away from zero; 1/d by
/// IEEE division, the ops files are built without fast math), the record
/// {d, float(Σq)·d, Σq[0..15], Σq[16..31]}. xq: the row's two planes
/// ([2][K/32][16], plane stride half_k bytes); xinfo: the row's K/32 records.
/// Whole warp must call it. Returns this lane's code q (as a float).
__device__ __forceinline__ float quantize_block_q8_1_with(float v, float d, int lane, int64_t b,
                                                          int8_t* __restrict__ xq, ActBlockInfo* __restrict__ xinfo,
                                                          int64_t half_k) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q = min(max(static_cast<int>(roundf(v * id)), -127), 127);
    int half = q;
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) half += __shfl_xor_sync(0xFFFFFFFFu, half, off);
    const int other = __shfl_xor_sync(0xFFFFFFFFu, half, 16);
    xq[(lane >> 4) * half_k + 16 * b + (lane & 15)] = static_cast<int8_t>(q);
    if (lane == 0) xinfo[b] = ActBlockInfo{d, static_cast<float>(half + other) * d, half, other};
    return static_cast<float>(q);
}

/// Level 1 of one block, d = amax/127 as quantize_row_ref(Q8_1), and when
/// xq2 is not null the residual v − d·q (one fused multiply-add, rounded
/// once) quantized with the fixed scale d/kLevel2Ratio into (xq2, xinfo2):
/// a two-level activation (gemv.h).
__device__ __forceinline__ void quantize_block_q8_1_l2(float v, int lane, int64_t b, int8_t* __restrict__ xq,
                                                       ActBlockInfo* __restrict__ xinfo, int8_t* __restrict__ xq2,
                                                       ActBlockInfo* __restrict__ xinfo2, int64_t half_k) {
    const float d = warp_max(fabsf(v)) / 127.0f;
    const float q = quantize_block_q8_1_with(v, d, lane, b, xq, xinfo, half_k);
    if (xq2) quantize_block_q8_1_with(fmaf(-d, q, v), d / kLevel2Ratio, lane, b, xq2, xinfo2, half_k);
}

/// Sum over the thread block (blockDim.x a multiple of 32, at most 1024);
/// every thread gets the result. `red` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // red may still be read by a previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return warp_sum(v);
}

/// Row r of x (dim floats at x + r·dim) plus row r of residual when given
/// (stored back), and the block's sum of squares of the result (every thread
/// gets it; the stores are visible to the block on return). `red`: 32 floats
/// of shared memory. Scalar, coalesced accesses.
__device__ __forceinline__ float add_residual_sum_squares(float* xr, const float* __restrict__ residual_row,
                                                          int64_t dim, float* red) {
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = xr[i];
        if (residual_row) {
            v += residual_row[i];
            xr[i] = v;
        }
        ss += v * v;
    }
    return block_sum(ss, red);  // ends with __syncthreads
}

/// Round to nearest even BF16 (bit pattern; NaN stays NaN).
__device__ __forceinline__ uint16_t bf16_bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

/// The gated value act(g)·u from a gate g and a value u (GateAct, ops.h):
/// SiLU(g)·u = g/(1 + e^−g)·u, GELU(g)·u with GELU's tanh form, or
/// u/(1 + e^−g), as the CPU's swiglu / geglu / gate.
__device__ __forceinline__ float glu_value(float g, float u, int act) {
    if (act == 1) {
        constexpr float kSqrt2OverPi = 0.7978845608028654f;
        return 0.5f * g * (1.0f + tanhf(kSqrt2OverPi * (g + 0.044715f * g * g * g))) * u;
    }
    if (act == 2) return u / (1.0f + expf(-g));
    return g / (1.0f + expf(-g)) * u;
}

__device__ __forceinline__ float block_max(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : -INFINITY;
    return warp_max(v);
}

/// cos and sin of the angle double(pos) · inv_freq, as cpu::rope computes
/// them up to float rounding: the product and its reduction to [−π, π] in
/// double, then sincosf of the reduced angle (no slow path). Used by the
/// decode attention and the prefill RoPE so that both rotate identically.
__device__ __forceinline__ void rope_angle(int pos, float inv_freq, float* c, float* s) {
    const double a = static_cast<double>(pos) * static_cast<double>(inv_freq);
    const double r = fma(-6.283185307179586, rint(a * 0.15915494309189535), a);
    sincosf(static_cast<float>(r), s, c);
}

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
    return x;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) {
    return __float2half_rn(x);
}

/// advance_decode_position's update, by one thread (ops.h), for the step's
/// sampled token `sampled` (ctl->sampled): host_out (mapped host memory, or
/// null) gets it in slot pos & 1 of the position just evaluated.
__device__ __forceinline__ void advance_control(DecodeControl* ctl, int32_t* tokens, int n_ctx, int32_t* host_out,
                                                int32_t sampled) {
    const int pos = ctl->pos + 1;
    if (host_out) *reinterpret_cast<volatile int32_t*>(host_out + ((pos - 1) & 1)) = sampled;
    ctl->pos = pos;
    if (pos >= n_ctx) return;  // the cache is full; the host stops before using it
    if (pos < ctl->fixed) {
        ctl->cur = tokens[pos];
    } else {
        tokens[pos] = sampled;
        ctl->cur = sampled;
    }
}

}  // namespace quern::cuda::detail
