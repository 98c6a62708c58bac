// Row-wise and elementwise decode kernels: RMSNorm (+ residual) fused with
// the Q8_1 quantizer, SwiGLU fused with the quantizer, residual add. API and
// formats: ops.h.
#include "backend/cuda/launch.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

#include <algorithm>

namespace quern::cuda {
namespace {

using detail::block_sum;
using detail::quantize_block_q8_1_l2;

// rms_norm_q8_1_vec_kernel<KMAX>  (the path for aligned rows, dim <= 32768)
//   Shapes:  as rms_norm_q8_1_kernel below.
//   Grid:    one block per row of min(1024, dim/4 rounded up to 32) threads.
//            Thread t owns the float4 chunks c = t + k·blockDim (k < KMAX),
//            elements 4c..4c+3: pass 1 loads x (+ residual, stored back) and w
//            for all its chunks at once and keeps them in registers; fp32 sum
//            of squares, one block reduction; pass 2 computes y = (x·scale)·w
//            from the registers. A Q8_1 block (32 elements) is 8 consecutive
//            chunks = 8 lanes of one warp: amax and the half sums by 3-step
//            shuffles, 4 int8 stored as one 32-bit word.
//   Align:   x, residual, w, y 16-byte aligned, xq 4-byte aligned (checked on
//            the host; otherwise rms_norm_q8_1_kernel runs).
//   Bound:   latency (one DRAM round trip per pass-1 load set, two barriers).
//
// quantize_chunk_q8_1: the Q8_1 block of 8 lanes (lane & 7 = chunk within the
// block) holding 4 elements each, with the scale d; same arithmetic as
// quantize_block_q8_1_with. Every lane of the warp must call it (inactive
// lanes with zeros, no store).
__device__ __forceinline__ void quantize_chunk_q8_1(const float (&v)[4], float d, bool active, int lane, int64_t b,
                                                    int8_t* __restrict__ xq, ActBlockInfo* __restrict__ xinfo,
                                                    int64_t half_k, float (&qf)[4]) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        q[e] = min(max(static_cast<int>(roundf(v[e] * id)), -127), 127);
        qf[e] = static_cast<float>(q[e]);
    }
    int half = q[0] + q[1] + q[2] + q[3];
#pragma unroll
    for (int off = 2; off > 0; off >>= 1) half += __shfl_xor_sync(0xFFFFFFFFu, half, off);  // lanes 0-3 / 4-7
    const int other = __shfl_xor_sync(0xFFFFFFFFu, half, 4);
    if (!active) return;
    const int gl = lane & 7;  // elements 4gl..4gl+3 of the block: plane gl>>2, bytes 4(gl&3)..
    const uint32_t packed = (static_cast<uint32_t>(q[0]) & 0xFFu) | ((static_cast<uint32_t>(q[1]) & 0xFFu) << 8) |
                            ((static_cast<uint32_t>(q[2]) & 0xFFu) << 16) | (static_cast<uint32_t>(q[3]) << 24);
    *reinterpret_cast<uint32_t*>(xq + (gl >> 2) * half_k + 16 * b + 4 * (gl & 3)) = packed;
    if (gl == 0) xinfo[b] = ActBlockInfo{d, static_cast<float>(half + other) * d, half, other};
}

// Level 1 (d = amax/127 over the 8 lanes) and, when xq2 is not null, the
// residual v - d·q (fused multiply-add) with the scale d/kLevel2Ratio into the second level
// (two-level activation; gemv.h).
__device__ __forceinline__ void quantize_chunk_q8_1_l2(const float (&v)[4], bool active, int lane, int64_t b,
                                                       int8_t* __restrict__ xq, ActBlockInfo* __restrict__ xinfo,
                                                       int8_t* __restrict__ xq2, ActBlockInfo* __restrict__ xinfo2,
                                                       int64_t half_k) {
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
    for (int off = 4; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
    const float d = amax / 127.0f;
    float qf[4];
    quantize_chunk_q8_1(v, d, active, lane, b, xq, xinfo, half_k, qf);
    if (xq2) {  // the residual v - d·q by one fused multiply-add, as quantize_block_q8_1_l2
        const float r[4] = {fmaf(-d, qf[0], v[0]), fmaf(-d, qf[1], v[1]), fmaf(-d, qf[2], v[2]), fmaf(-d, qf[3], v[3])};
        quantize_chunk_q8_1(r, d / kLevel2Ratio, active, lane, b, xq2, xinfo2, half_k, qf);
    }
}

// The residual element i of a weighted sum of k rows of dim (rms_norm_q8_1's
// residual_k): w_0·r_0[i] + w_1·r_1[i] + ... in slot order, separate
// multiply and add (moe_weighted_sum_kernel's arithmetic).
__device__ __forceinline__ float weighted_rows(const float* __restrict__ rows, const float* __restrict__ w, int k,
                                               int64_t dim, int64_t i) {
    float acc = __fmul_rn(w[0], rows[i]);  // rounded as moe_weighted_sum stores it: no FMA with the add after
    for (int j = 1; j < k; ++j) acc = __fadd_rn(acc, __fmul_rn(w[j], rows[static_cast<int64_t>(j) * dim + i]));
    return acc;
}

// weighted_rows for elements 4c .. 4c + 3 (rows 16-byte aligned, dim % 4 == 0).
__device__ __forceinline__ float4 weighted_rows4(const float* __restrict__ rows, const float* __restrict__ w, int k,
                                                 int64_t dim, int c) {
    const float4* r4 = reinterpret_cast<const float4*>(rows);
    const int64_t dim4 = dim / 4;
    float4 v = r4[c];
    float4 acc = make_float4(__fmul_rn(w[0], v.x), __fmul_rn(w[0], v.y), __fmul_rn(w[0], v.z), __fmul_rn(w[0], v.w));
    for (int j = 1; j < k; ++j) {
        v = r4[j * dim4 + c];
        acc.x = __fadd_rn(acc.x, __fmul_rn(w[j], v.x));
        acc.y = __fadd_rn(acc.y, __fmul_rn(w[j], v.y));
        acc.z = __fadd_rn(acc.z, __fmul_rn(w[j], v.z));
        acc.w = __fadd_rn(acc.w, __fmul_rn(w[j], v.w));
    }
    return acc;
}

template <int KMAX>
__global__ void __launch_bounds__(1024) rms_norm_q8_1_vec_kernel(float* x, const float* __restrict__ residual,
                                                                 const float* __restrict__ w, float* __restrict__ y,
                                                                 int8_t* __restrict__ xq,
                                                                 ActBlockInfo* __restrict__ xinfo,
                                                                 int8_t* __restrict__ xq2,
                                                                 ActBlockInfo* __restrict__ xinfo2, int64_t dim,
                                                                 float eps, const float* __restrict__ rw, int rk) {
    pdl_wait();
    pdl_trigger();
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    const int nc = static_cast<int>(dim / 4);
    float4* xr = reinterpret_cast<float4*>(x + r * dim);
    const float4* rr = residual && rk == 0 ? reinterpret_cast<const float4*>(residual + r * dim) : nullptr;
    const float4* wr = reinterpret_cast<const float4*>(w);
    float4 xv[KMAX], wv[KMAX];
#pragma unroll
    for (int k = 0; k < KMAX; ++k) {
        const int c = threadIdx.x + k * blockDim.x;
        if (c < nc) {
            xv[k] = xr[c];
            wv[k] = wr[c];
        } else {
            xv[k] = wv[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
    if (rr || rk > 0) {
        const float* rows = residual + r * rk * dim;
#pragma unroll
        for (int k = 0; k < KMAX; ++k) {
            const int c = threadIdx.x + k * blockDim.x;
            if (c < nc) {
                float4 a;
                if (rr) {
                    a = rr[c];
                } else {
                    a = weighted_rows4(rows, rw + r * rk, rk, dim, c);
                }
                xv[k].x += a.x, xv[k].y += a.y, xv[k].z += a.z, xv[k].w += a.w;
                xr[c] = xv[k];
            }
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < KMAX; ++k)
        ss += xv[k].x * xv[k].x + xv[k].y * xv[k].y + xv[k].z * xv[k].z + xv[k].w * xv[k].w;
    ss = block_sum(ss, red);
    const float scale = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 0; k < KMAX; ++k) {
        const int c0 = k * blockDim.x;
        if (c0 >= nc) break;  // uniform over the block
        const int c = threadIdx.x + c0;
        const bool active = c < nc;
        const float v[4] = {xv[k].x * scale * wv[k].x, xv[k].y * scale * wv[k].y, xv[k].z * scale * wv[k].z,
                            xv[k].w * scale * wv[k].w};
        if (y && active) reinterpret_cast<float4*>(y + r * dim)[c] = make_float4(v[0], v[1], v[2], v[3]);
        if (xq)
            quantize_chunk_q8_1_l2(v, active, lane, c >> 3, xq + r * dim, xinfo + r * (dim / 32),
                                   xq2 ? xq2 + r * dim : nullptr, xq2 ? xinfo2 + r * (dim / 32) : nullptr, dim / 2);
    }
}

// rms_norm_q8_1_kernel  (fallback: unaligned pointers or dim > 32768)
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
                                     int8_t* __restrict__ xq2, ActBlockInfo* __restrict__ xinfo2, int64_t dim,
                                     float eps, const float* __restrict__ rw, int rk) {
    pdl_wait();
    pdl_trigger();
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    float* xr = x + r * dim;
    if (rk > 0)  // the weighted residual first; each thread's elements are its own in both loops
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
            xr[i] += weighted_rows(residual + r * rk * dim, rw + r * rk, rk, dim, i);
    const float ss =
        detail::add_residual_sum_squares(xr, residual && rk == 0 ? residual + r * dim : nullptr, dim, red);
    const float scale = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t n_blocks = dim / 32;
    for (int64_t b = warp; b < n_blocks; b += nw) {
        const int64_t i = 32 * b + lane;
        const float v = xr[i] * scale * w[i];
        if (y) y[r * dim + i] = v;
        if (xq)
            quantize_block_q8_1_l2(v, lane, b, xq + r * dim, xinfo + r * n_blocks, xq2 ? xq2 + r * dim : nullptr,
                                   xq2 ? xinfo2 + r * n_blocks : nullptr, dim / 2);
    }
}

// swiglu_q8_1_kernel
//   Shapes:  h: count floats; xq/xinfo: one row of count elements; gate, up:
//            rows of `width` floats at stride ld (element i: row i / width,
//            column i % width; one row when width == count).
//   Grid:    one warp per 32-element block (lane i: element 32b+i), 256
//            threads per block, ceil(count/256) blocks.
//   Bound:   latency (count ≤ ~50k: 8 bytes in, ~5.3 out per element).
// ACT: the GateAct (ops.h), detail::glu_value's arithmetic.
template <int ACT>
__global__ void swiglu_q8_1_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                                   float* __restrict__ h, int8_t* __restrict__ xq, ActBlockInfo* __restrict__ xinfo,
                                   int8_t* __restrict__ xq2, ActBlockInfo* __restrict__ xinfo2, int64_t n_blocks,
                                   int64_t half_k, int64_t width, int64_t ld, bool early) {
    pdl_wait_trigger(early);
    const int64_t b = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (b >= n_blocks) return;  // whole warps leave together
    const int64_t i = 32 * b + lane;
    const int64_t r = i / width, at = r * ld + (i - r * width);
    const float v = detail::glu_value(gate[at], up[at], ACT);
    if (h) h[i] = v;
    if (xq) quantize_block_q8_1_l2(v, lane, b, xq, xinfo, xq2, xinfo2, half_k);
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
                   int64_t n, int64_t dim, float eps, cudaStream_t stream, int8_t* xq2, ActBlockInfo* xinfo2,
                   const float* residual_w, int residual_k) {
    if (residual_k < 0 || (residual_k > 0 && (!residual || !residual_w)))
        throw_error("rms_norm_q8_1: a weighted residual needs its rows and weights");
    if (n < 1 || dim < 32 || dim % 32 != 0 || n > 0x7FFFFFFF)
        throw_error("rms_norm_q8_1: need n >= 1 and dim a positive multiple of 32");
    if (!x || !w) throw_error("rms_norm_q8_1: x and w are required");
    if ((xq == nullptr) != (xinfo == nullptr)) throw_error("rms_norm_q8_1: give both xq and xinfo, or neither");
    if ((xq2 == nullptr) != (xinfo2 == nullptr) || (xq2 && !xq))
        throw_error("rms_norm_q8_1: a residual level (xq2, xinfo2) needs both pointers and a first level");
    const auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool vec = dim <= 32768 && a16(x) && a16(w) && (!residual || a16(residual)) && (!y_out || a16(y_out)) &&
                     reinterpret_cast<uintptr_t>(xq) % 4 == 0 && reinterpret_cast<uintptr_t>(xq2) % 4 == 0;
    const unsigned grid = static_cast<unsigned>(n);
    if (vec) {
        const int64_t nc = dim / 4;
        const int threads = static_cast<int>(std::min<int64_t>(1024, (nc + 31) / 32 * 32));
        const int64_t kmax = (nc + threads - 1) / threads;
        if (kmax <= 1)
            launch_pdl(rms_norm_q8_1_vec_kernel<1>, dim3(grid), dim3(threads), 0, stream, x, residual, w, y_out, xq, xinfo,
                       xq2, xinfo2, dim, eps, residual_w, residual_k);
        else if (kmax <= 2)
            launch_pdl(rms_norm_q8_1_vec_kernel<2>, dim3(grid), dim3(threads), 0, stream, x, residual, w, y_out, xq, xinfo,
                       xq2, xinfo2, dim, eps, residual_w, residual_k);
        else if (kmax <= 4)
            launch_pdl(rms_norm_q8_1_vec_kernel<4>, dim3(grid), dim3(threads), 0, stream, x, residual, w, y_out, xq, xinfo,
                       xq2, xinfo2, dim, eps, residual_w, residual_k);
        else
            launch_pdl(rms_norm_q8_1_vec_kernel<8>, dim3(grid), dim3(threads), 0, stream, x, residual, w, y_out, xq, xinfo,
                       xq2, xinfo2, dim, eps, residual_w, residual_k);
    } else {
        launch_pdl(rms_norm_q8_1_kernel, dim3(grid), dim3(kNormThreads), 0, stream, x, residual, w, y_out, xq, xinfo, xq2,
                   xinfo2, dim, eps, residual_w, residual_k);
    }
    QUERN_CUDA_CHECK_LAUNCH();
}

void swiglu_q8_1(const float* gate, const float* up, float* h_out, int8_t* xq, ActBlockInfo* xinfo, int64_t count,
                 cudaStream_t stream, int8_t* xq2, ActBlockInfo* xinfo2, int act, int64_t width, int64_t ld) {
    if (count < 32 || count % 32 != 0) throw_error("swiglu_q8_1: count must be a positive multiple of 32");
    if (width == 0) width = ld = count;
    if (width < 1 || count % width != 0 || ld < width)
        throw_error("swiglu_q8_1: rows of " + std::to_string(width) + " at stride " + std::to_string(ld) +
                    " do not tile " + std::to_string(count) + " elements");
    if (!gate || !up) throw_error("swiglu_q8_1: gate and up are required");
    if ((xq == nullptr) != (xinfo == nullptr)) throw_error("swiglu_q8_1: give both xq and xinfo, or neither");
    if ((xq2 == nullptr) != (xinfo2 == nullptr) || (xq2 && !xq))
        throw_error("swiglu_q8_1: a residual level (xq2, xinfo2) needs both pointers and a first level");
    const int64_t n_blocks = count / 32;
    const unsigned grid = static_cast<unsigned>((n_blocks * 32 + 255) / 256);
    constexpr bool early = true;  // trigger the successor before the wait (launch.cuh)
    const auto launch = [&](auto kernel) {
        launch_pdl(kernel, dim3(grid), dim3(256), 0, stream, gate, up, h_out, xq, xinfo, xq2, xinfo2, n_blocks,
                   count / 2, width, ld, early);
    };
    if (act == kGateGelu) launch(swiglu_q8_1_kernel<kGateGelu>);
    else if (act == kGateSigmoid) launch(swiglu_q8_1_kernel<kGateSigmoid>);
    else launch(swiglu_q8_1_kernel<kGateSiLU>);
    QUERN_CUDA_CHECK_LAUNCH();
}

// scale_softcap_kernel: x = cap > 0 ? cap·tanh(s·x / cap) : s·x, grid-stride.
__global__ void scale_softcap_kernel(float* __restrict__ x, int64_t count, float s, float cap) {
    pdl_wait();
    pdl_trigger();
    const float inv = cap > 0.0f ? 1.0f / cap : 0.0f;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float v = x[i] * s;
        x[i] = cap > 0.0f ? cap * tanhf(v * inv) : v;
    }
}

void scale_softcap(float* x, int64_t count, float scale, float cap, cudaStream_t stream) {
    if (count < 0 || !x || cap < 0.0f) throw_error("scale_softcap: need x, count >= 0 and cap >= 0");
    if (count == 0) return;
    launch_pdl(scale_softcap_kernel, dim3(grid_for(count, 256)), dim3(256), 0, stream, x, count, scale, cap);
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
