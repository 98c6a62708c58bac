// Split-K GQA decode attention ("flash-decoding") over the device KV cache.
// API: ops.h (decode_attention).
//
// attn_split_kernel<HD, T, G>
//   Shapes:  q: n_head × HD floats; caches: n_ctx rows × n_head_kv × HD T
//            (T = float or __half), rows of n_head_kv·HD elements;
//            part_o: [n_head][n_splits][HD] floats, part_ml: [n_head][n_splits][2]
//            floats {max score, Σ exp(score − max)}.
//   Grid:    (n_splits, n_head_kv) blocks of 128 threads (4 warps); block
//            (s, hk) handles positions [256s, 256s + 256) ∩ [0, pos] for the
//            g = n_head/n_head_kv query heads hk·g .. hk·g + g − 1 (G: g
//            rounded up to a power of two, the register/shared arrays' size),
//            reading each K and V row once for all g heads.
//            1. q·scale for the g heads → shared, then registers (HD/32 per lane).
//            2. Scores: warp w takes positions w, w+4, ... (4 rows in flight
//               per warp); a K row is split over the lanes (HD/32 contiguous
//               elements each, one 4- to 16-byte load), g dot products
//               finished by warp shuffles → shared sc[g][256].
//            3. Per head: chunk max m and p = exp(score − m) (in place), l = Σ p.
//            4. Output: HD/2 threads per V row (2 elements each), 128/(HD/2)
//               rows at once, 4 deep; o_j += p_j(t)·v(t); row groups summed
//               through shared memory → part_o, part_ml.
//   Align:   cache base pointers 16-byte aligned (cudaMalloc gives 256).
//   Bound:   bandwidth of the K/V reads at long context (2·L·n_head_kv·HD·
//            sizeof(T) bytes per layer); latency below a few thousand positions.
//
// attn_combine_kernel<HD>
//   Grid:    one block of HD threads per query head. M = max_s m_s,
//            w_s = exp(m_s − M), out = Σ_s w_s·o_s / Σ_s w_s·l_s over the
//            ceil((pos+1)/256) chunks that exist.
//   Bound:   latency (reads n_splits·(HD+2) floats per head).
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace quern::cuda {
namespace {

using detail::block_max;
using detail::block_sum;
using detail::warp_max;
using detail::warp_sum;

constexpr int kAttnThreads = 128;
constexpr int kUnroll = 4;

template <int N>
__device__ __forceinline__ void load_row(const float* p, float (&o)[N]) {
    if constexpr (N == 4) {
        const float4 v = *reinterpret_cast<const float4*>(p);
        o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
    } else {
        static_assert(N == 2);
        const float2 v = *reinterpret_cast<const float2*>(p);
        o[0] = v.x, o[1] = v.y;
    }
}
template <int N>
__device__ __forceinline__ void load_row(const __half* p, float (&o)[N]) {
    if constexpr (N == 4) {
        const uint2 u = *reinterpret_cast<const uint2*>(p);
        const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
        const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
        o[0] = a.x, o[1] = a.y, o[2] = b.x, o[3] = b.y;
    } else {
        static_assert(N == 2);
        const float2 a = __half22float2(*reinterpret_cast<const __half2*>(p));
        o[0] = a.x, o[1] = a.y;
    }
}

__device__ __forceinline__ int clamp_pos(const int32_t* pos_ptr, int n_ctx) {
    const int p = *pos_ptr;
    return p < 0 ? 0 : (p >= n_ctx ? n_ctx - 1 : p);
}

template <int HD, class T, int G>
__global__ void __launch_bounds__(kAttnThreads) attn_split_kernel(const float* __restrict__ q,
                                                                  const T* __restrict__ kc, const T* __restrict__ vc,
                                                                  const int32_t* __restrict__ pos_ptr, int n_ctx,
                                                                  int n_head_kv, int g, float scale, int n_splits,
                                                                  float* __restrict__ part_o,
                                                                  float* __restrict__ part_ml) {
    constexpr int C = kAttnChunk;
    constexpr int EPL = HD / 32;                 // K elements per lane
    constexpr int TPR = HD / 2;                  // threads per V row
    constexpr int RP = kAttnThreads / TPR;       // V rows at once
    constexpr int NW = kAttnThreads / 32;
    __shared__ float qs[G][HD];
    __shared__ float sc[G][C];
    __shared__ float ml[G][2];
    __shared__ float2 red[RP][G][TPR];

    const int L = clamp_pos(pos_ptr, n_ctx) + 1;
    const int s = blockIdx.x, hk = blockIdx.y;
    const int t0 = s * C;
    if (t0 >= L) return;
    const int n = min(C, L - t0);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int h0 = hk * g;
    for (int idx = tid; idx < G * HD; idx += kAttnThreads)
        qs[idx / HD][idx % HD] = idx < g * HD ? q[static_cast<int64_t>(h0) * HD + idx] * scale : 0.0f;
    __syncthreads();

    const int64_t rs = static_cast<int64_t>(n_head_kv) * HD;  // cache row stride (elements)
    // ---- scores
    {
        float qr[G][EPL];
#pragma unroll
        for (int j = 0; j < G; ++j)
#pragma unroll
            for (int e = 0; e < EPL; ++e) qr[j][e] = qs[j][lane * EPL + e];
        const T* kb = kc + static_cast<int64_t>(t0) * rs + static_cast<int64_t>(hk) * HD + lane * EPL;
        for (int t = warp; t < n; t += NW * kUnroll) {
            float kf[kUnroll][EPL];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int tt = t + NW * u;
                if (tt < n) {
                    load_row<EPL>(kb + tt * rs, kf[u]);
                } else {
#pragma unroll
                    for (int e = 0; e < EPL; ++e) kf[u][e] = 0.0f;
                }
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int tt = t + NW * u;
#pragma unroll
                for (int j = 0; j < G; ++j) {
                    float d = 0.0f;
#pragma unroll
                    for (int e = 0; e < EPL; ++e) d = fmaf(qr[j][e], kf[u][e], d);
                    d = warp_sum(d);
                    if (lane == 0 && tt < n) sc[j][tt] = d;
                }
            }
        }
    }
    __syncthreads();
    // ---- chunk softmax statistics
    for (int j = warp; j < g; j += NW) {
        float m = -INFINITY;
        for (int i = lane; i < n; i += 32) m = fmaxf(m, sc[j][i]);
        m = warp_max(m);
        float l = 0.0f;
        for (int i = lane; i < n; i += 32) {
            const float p = expf(sc[j][i] - m);
            sc[j][i] = p;
            l += p;
        }
        l = warp_sum(l);
        if (lane == 0) ml[j][0] = m, ml[j][1] = l;
    }
    __syncthreads();
    // ---- p · V
    const int rg = tid / TPR, c = tid % TPR;
    float2 acc[G];
#pragma unroll
    for (int j = 0; j < G; ++j) acc[j] = make_float2(0.0f, 0.0f);
    const T* vb = vc + static_cast<int64_t>(t0) * rs + static_cast<int64_t>(hk) * HD + 2 * c;
    for (int t = rg; t < n; t += RP * kUnroll) {
        float vv[kUnroll][2];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int tt = t + RP * u;
            if (tt < n) {
                load_row<2>(vb + tt * rs, vv[u]);
            } else {
                vv[u][0] = vv[u][1] = 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int tt = t + RP * u;
            if (tt < n) {
#pragma unroll
                for (int j = 0; j < G; ++j) {
                    const float p = sc[j][tt];  // j >= g: zero rows of q give finite, unused values
                    acc[j].x = fmaf(p, vv[u][0], acc[j].x);
                    acc[j].y = fmaf(p, vv[u][1], acc[j].y);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < G; ++j) red[rg][j][c] = acc[j];
    __syncthreads();
    for (int idx = tid; idx < g * TPR; idx += kAttnThreads) {
        const int j = idx / TPR, cc = idx % TPR;
        float2 o = red[0][j][cc];
#pragma unroll
        for (int r = 1; r < RP; ++r) o.x += red[r][j][cc].x, o.y += red[r][j][cc].y;
        const int64_t slot = static_cast<int64_t>(h0 + j) * n_splits + s;
        reinterpret_cast<float2*>(part_o + slot * HD)[cc] = o;
    }
    if (tid < g) {
        const int64_t slot = static_cast<int64_t>(h0 + tid) * n_splits + s;
        part_ml[2 * slot] = ml[tid][0];
        part_ml[2 * slot + 1] = ml[tid][1];
    }
}

template <int HD>
__global__ void attn_combine_kernel(const float* __restrict__ part_o, const float* __restrict__ part_ml,
                                    const int32_t* __restrict__ pos_ptr, int n_ctx, int n_splits,
                                    float* __restrict__ out) {
    extern __shared__ float wsh[];  // n_splits weights
    __shared__ float red[32];
    const int h = blockIdx.x;
    const int L = clamp_pos(pos_ptr, n_ctx) + 1;
    const int na = (L + kAttnChunk - 1) / kAttnChunk;
    const float* ml = part_ml + static_cast<int64_t>(h) * n_splits * 2;
    float m = -INFINITY;
    for (int s = threadIdx.x; s < na; s += blockDim.x) m = fmaxf(m, ml[2 * s]);
    const float M = block_max(m, red);
    float den = 0.0f;
    for (int s = threadIdx.x; s < na; s += blockDim.x) {
        const float w = expf(ml[2 * s] - M);
        wsh[s] = w;
        den += w * ml[2 * s + 1];
    }
    den = block_sum(den, red);  // its barriers also publish wsh
    const float* po = part_o + static_cast<int64_t>(h) * n_splits * HD;
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < na; ++s) acc = fmaf(wsh[s], po[static_cast<int64_t>(s) * HD + d], acc);
        out[static_cast<int64_t>(h) * HD + d] = acc / den;
    }
}

int n_splits_for(int n_ctx) { return (n_ctx + kAttnChunk - 1) / kAttnChunk; }

template <int HD, class T, int G>
void launch_split(const float* q, const void* kc, const void* vc, const int32_t* pos, int n_ctx, int n_head_kv,
                  int g, float scale, int n_splits, float* po, float* pml, cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned>(n_splits), static_cast<unsigned>(n_head_kv));
    attn_split_kernel<HD, T, G><<<grid, kAttnThreads, 0, stream>>>(q, static_cast<const T*>(kc),
                                                                   static_cast<const T*>(vc), pos, n_ctx, n_head_kv,
                                                                   g, scale, n_splits, po, pml);
}

template <int HD, class T>
void dispatch_g(const float* q, const void* kc, const void* vc, const int32_t* pos, int n_ctx, int n_head_kv, int g,
                float scale, int n_splits, float* po, float* pml, cudaStream_t stream) {
    if (g <= 1)
        launch_split<HD, T, 1>(q, kc, vc, pos, n_ctx, n_head_kv, g, scale, n_splits, po, pml, stream);
    else if (g <= 2)
        launch_split<HD, T, 2>(q, kc, vc, pos, n_ctx, n_head_kv, g, scale, n_splits, po, pml, stream);
    else if (g <= 4)
        launch_split<HD, T, 4>(q, kc, vc, pos, n_ctx, n_head_kv, g, scale, n_splits, po, pml, stream);
    else if (g <= 8)
        launch_split<HD, T, 8>(q, kc, vc, pos, n_ctx, n_head_kv, g, scale, n_splits, po, pml, stream);
    else
        launch_split<HD, T, 16>(q, kc, vc, pos, n_ctx, n_head_kv, g, scale, n_splits, po, pml, stream);
}

}  // namespace

size_t decode_attention_scratch_bytes(int n_ctx, int n_head, int head_dim) {
    return static_cast<size_t>(n_head) * static_cast<size_t>(n_splits_for(n_ctx)) *
           static_cast<size_t>(head_dim + 2) * sizeof(float);
}

void decode_attention(const float* q, const void* k_cache, const void* v_cache, KvType kv_type, const int32_t* pos,
                      int n_ctx, int n_head, int n_head_kv, int head_dim, float scale, void* scratch, float* out,
                      cudaStream_t stream) {
    if (head_dim != 64 && head_dim != 128) throw_error("decode_attention: head_dim must be 64 or 128");
    if (n_ctx < 1 || n_head_kv < 1 || n_head < n_head_kv || n_head % n_head_kv != 0 || n_head / n_head_kv > 16)
        throw_error("decode_attention: need n_ctx >= 1 and n_head a multiple of n_head_kv, at most 16 times it");
    if (!q || !k_cache || !v_cache || !pos || !scratch || !out) throw_error("decode_attention: null pointer");
    if (reinterpret_cast<uintptr_t>(k_cache) % 16 != 0 || reinterpret_cast<uintptr_t>(v_cache) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(scratch) % 16 != 0)
        throw_error("decode_attention: caches and scratch must be 16-byte aligned");
    const int g = n_head / n_head_kv;
    const int n_splits = n_splits_for(n_ctx);
    float* po = static_cast<float*>(scratch);
    float* pml = po + static_cast<size_t>(n_head) * static_cast<size_t>(n_splits) * static_cast<size_t>(head_dim);
    const size_t smem = static_cast<size_t>(n_splits) * sizeof(float);
    if (smem > 48 * 1024) throw_error("decode_attention: n_ctx too large for the combine kernel (max 3M)");
    const bool f16 = kv_type == KvType::F16;
    if (head_dim == 64) {
        if (f16)
            dispatch_g<64, __half>(q, k_cache, v_cache, pos, n_ctx, n_head_kv, g, scale, n_splits, po, pml, stream);
        else
            dispatch_g<64, float>(q, k_cache, v_cache, pos, n_ctx, n_head_kv, g, scale, n_splits, po, pml, stream);
    } else {
        if (f16)
            dispatch_g<128, __half>(q, k_cache, v_cache, pos, n_ctx, n_head_kv, g, scale, n_splits, po, pml, stream);
        else
            dispatch_g<128, float>(q, k_cache, v_cache, pos, n_ctx, n_head_kv, g, scale, n_splits, po, pml, stream);
    }
    QUERN_CUDA_CHECK_LAUNCH();
    if (head_dim == 64)
        attn_combine_kernel<64><<<static_cast<unsigned>(n_head), 64, smem, stream>>>(po, pml, pos, n_ctx, n_splits, out);
    else
        attn_combine_kernel<128><<<static_cast<unsigned>(n_head), 128, smem, stream>>>(po, pml, pos, n_ctx, n_splits,
                                                                                       out);
    QUERN_CUDA_CHECK_LAUNCH();
}

}  // namespace quern::cuda
