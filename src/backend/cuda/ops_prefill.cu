// Row-batched kernels of the prefill path (API: ops.h, "Prefill"): RoPE and
// the KV-cache write for n consecutive positions, causal GQA attention of n
// query rows against the cache, and the FFN gating on rows. Launched with
// plain stream order (no PDL): the prefill is not captured in a graph and is
// dominated by its GEMMs.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backend/cuda/context.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/ops_flash.h"
#include "backend/cuda/ops_paged.h"
#include "backend/cuda/ops_rows.cuh"

namespace quern::cuda {
namespace {

using detail::ContiguousRows;
using detail::from_f32;
using detail::PagedMap;
using detail::rope_head;
using detail::to_f32;
using detail::warp_sum;

constexpr int kMaxHeadDim = 256;

// prefill_rope_kv_kernel<T>
//   Shapes:  qkv: n rows at stride ld floats, each [q (n_head·HD) | k
//            (n_head_kv·HD) | v (n_head_kv·HD)] as the QKV projection left
//            them; k_cache / v_cache: n_ctx rows of n_head_kv·HD T.
//   Grid:    (n_head + n_head_kv, n) blocks of one warp: block (h, r) takes
//            head h of row r (h < n_head: a query head, else KV head
//            h − n_head with its value). The warp stages the head in shared
//            memory (HD ≤ 256 floats), adds the bias, applies the per-head
//            RMSNorm (one warp sum), rotates pair by pair (lane i: pairs i,
//            i+32, ...; angles by rope_angle as the decode kernel, from the
//            row's table: map.freq), then writes q back in place or k and v
//            to the row's cache row.
//   Bound:   latency / memory (a few loads and stores per element).
template <class T, class Map>
__global__ void __launch_bounds__(32) prefill_rope_kv_kernel(float* __restrict__ qkv, int64_t ld, const Map map,
                                                            T* __restrict__ kc, T* __restrict__ vc, int n_head,
                                                            int n_head_kv, int hd, const float* __restrict__ inv_freq,
                                                            int rope_dim, int neox, AttentionExtras ex) {
    __shared__ float xs[kMaxHeadDim];
    const int lane = static_cast<int>(threadIdx.x);
    const int h = static_cast<int>(blockIdx.x);
    const int r = static_cast<int>(blockIdx.y);
    const int pos = map.pos(r);
    const bool is_q = h < n_head;
    const int hk = h - n_head;
    float* row = qkv + static_cast<int64_t>(r) * ld;
    const int64_t q_dim = static_cast<int64_t>(n_head) * hd, kv_dim = static_cast<int64_t>(n_head_kv) * hd;
    const int64_t off = is_q ? static_cast<int64_t>(h) * hd : q_dim + static_cast<int64_t>(hk) * hd;
    const float* bias = is_q ? ex.q_bias : ex.k_bias;
    const float* nw = is_q ? ex.q_norm : ex.k_norm;
    const int64_t boff = is_q ? static_cast<int64_t>(h) * hd : static_cast<int64_t>(hk) * hd;
    rope_head(xs, row + off, bias ? bias + boff : nullptr, nw, ex.norm_eps, hd, pos, map.freq(r, inv_freq), rope_dim,
              neox, lane);
    if (is_q) {
        for (int e = lane; e < hd; e += 32) row[off + e] = xs[e];
        return;
    }
    const int64_t crow = map.cache_row(r, pos) * kv_dim + static_cast<int64_t>(hk) * hd;
    const int64_t voff = q_dim + kv_dim + static_cast<int64_t>(hk) * hd;
    for (int e = lane; e < hd; e += 32) {
        kc[crow + e] = from_f32<T>(xs[e]);
        vc[crow + e] = from_f32<T>(row[voff + e] + (ex.v_bias ? ex.v_bias[boff + e] : 0.0f));
    }
}

constexpr int kPrefillAttnWarps = 4;

// Dot product of the HD floats qs (shared memory, read by broadcast) with one
// cache row of HD elements of T (16-byte aligned: whole vectors).
template <int HD, class T>
__device__ __forceinline__ float dot_row(const float* qs, const T* __restrict__ kr) {
    float s = 0.0f;
    if constexpr (sizeof(T) == 2) {
#pragma unroll 4
        for (int e = 0; e < HD; e += 8) {
            const uint4 u = *reinterpret_cast<const uint4*>(kr + e);
            const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const float2 f = __half22float2(h[t]);
                s = fmaf(qs[e + 2 * t], f.x, s);
                s = fmaf(qs[e + 2 * t + 1], f.y, s);
            }
        }
    } else {
#pragma unroll 4
        for (int e = 0; e < HD; e += 4) {
            const float4 f = *reinterpret_cast<const float4*>(kr + e);
            s = fmaf(qs[e], f.x, s);
            s = fmaf(qs[e + 1], f.y, s);
            s = fmaf(qs[e + 2], f.z, s);
            s = fmaf(qs[e + 3], f.w, s);
        }
    }
    return s;
}

// prefill_attention_kernel<HD, T, SOFTCAP>
//   Shapes:  q: n rows at stride ldq floats, n_head·HD each (rotated);
//            k_cache / v_cache: rows of n_head_kv·HD T, position p at row p;
//            out: n rows at stride ldo floats, n_head·HD each.
//   Grid:    (n_head, ceil(n / 4)) blocks of 4 warps; warp w of block (h, b)
//            computes query row r = 4b + w (position pos0 + r) of head h
//            against KV head h / (n_head / n_head_kv). The warp stages its
//            scaled q in shared memory and walks the keys lo .. pos0+r (lo =
//            0, or pos0+r−window+1 with a window) 32 at a time: lane l scores
//            key j0 + l with a whole-row dot product (its own 16-byte loads
//            of the K row), one warp max and one warp sum per 32 keys update
//            the online softmax (running max, rescaled sum) in fp32, then
//            the 32 weights are broadcast in turn (shuffles) while every lane
//            accumulates its E = HD/32 output elements from the coalesced V
//            rows.
//   Align:   cache rows 16-byte aligned (HD·sizeof(T) is a multiple of 16 and
//            the cache base is).
//   Cost:    O(n · (pos0 + n) · n_head · HD) FMAs and as many K/V element
//            reads (mostly from L2: a KV head's rows are shared by its query
//            heads and rows, but not staged in shared memory); simple rather
//            than fast — a tiled tensor-core kernel is the next step for
//            long prompts.
//   Bound:   L2 bandwidth / latency of the K and V reads.
template <int HD, class T, bool SOFTCAP, class Map>
__global__ void __launch_bounds__(32 * kPrefillAttnWarps)
    prefill_attention_kernel(const float* __restrict__ q, int64_t ldq, const T* __restrict__ kc,
                             const T* __restrict__ vc, int n, const Map map, int n_head, int n_head_kv, float scale,
                             int window, float softcap, float* __restrict__ out, int64_t ldo) {
    constexpr int E = HD / 32;
    __shared__ float qsh[kPrefillAttnWarps][HD];
    const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
    const int r = static_cast<int>(blockIdx.y) * kPrefillAttnWarps + warp;
    if (r >= n) return;  // whole warps leave; no block-wide barrier follows
    const int h = static_cast<int>(blockIdx.x);
    const int hk = h / (n_head / n_head_kv);
    const int pos = map.pos(r);
    const int lo = window > 0 ? max(0, pos - window + 1) : 0;
    float* qs = qsh[warp];
    const float* qr = q + static_cast<int64_t>(r) * ldq + static_cast<int64_t>(h) * HD;
    for (int e = lane; e < HD; e += 32) qs[e] = qr[e] * scale;
    __syncwarp();
    const int64_t kv_stride = static_cast<int64_t>(n_head_kv) * HD;
    const T* kbase = kc + static_cast<int64_t>(hk) * HD;
    const T* vbase = vc + static_cast<int64_t>(hk) * HD + lane * E;
    float acc[E];
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int j0 = lo; j0 <= pos; j0 += 32) {
        const int j = j0 + lane;
        const int nt = min(32, pos - j0 + 1);  // keys in this step (warp-uniform)
        float s = -INFINITY;
        if (lane < nt) {
            s = dot_row<HD, T>(qs, kbase + map.cache_row(r, j) * kv_stride);
            if constexpr (SOFTCAP) s = softcap * tanhf(s / softcap);
        }
        const float m_new = fmaxf(m, detail::warp_max(s));  // finite: lane 0 always has a key
        const float corr = expf(m - m_new);                  // 0 on the first step (m = −inf)
        const float p = lane < nt ? expf(s - m_new) : 0.0f;
        l = l * corr + warp_sum(p);
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] *= corr;
        const auto accumulate = [&](int t) {
            const float pt = __shfl_sync(0xFFFFFFFFu, p, t);
            const T* vr = vbase + map.cache_row(r, j0 + t) * kv_stride;
#pragma unroll
            for (int e = 0; e < E; ++e) acc[e] = fmaf(pt, to_f32(vr[e]), acc[e]);
        };
        if (nt == 32) {  // a full step: unrolled, so that several V rows are in flight at once
#pragma unroll 8
            for (int t = 0; t < 32; ++t) accumulate(t);
        } else {
            for (int t = 0; t < nt; ++t) accumulate(t);
        }
        m = m_new;
    }
    const float inv = 1.0f / l;  // l >= 1: the key at `pos` is always seen
    float* o = out + static_cast<int64_t>(r) * ldo + static_cast<int64_t>(h) * HD + lane * E;
#pragma unroll
    for (int e = 0; e < E; ++e) o[e] = acc[e] * inv;
}

// glu_rows_kernel<GELU, Out>
//   Shapes:  gu: n rows at stride ld floats, [gate (n_ff) | up (n_ff)];
//            out: n rows at stride ldo of Out (float, or BF16 bit patterns
//            for the down projection's GEMM input).
//   Grid:    one thread per output element, grid-stride, 256 per block.
//   Math:    as swiglu_q8_1: act(g)·up (ACT: a GateAct).
//   Bound:   memory.
template <int ACT, class Out>
__global__ void __launch_bounds__(256) glu_rows_kernel(const float* __restrict__ gu, int64_t ld, int64_t n,
                                                       int64_t n_ff, Out* __restrict__ out, int64_t ldo) {
    const int64_t total = n * n_ff;
    for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
         t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = t / n_ff, i = t % n_ff;
        const float v = detail::glu_value(gu[r * ld + i], gu[r * ld + n_ff + i], ACT);
        if constexpr (sizeof(Out) == 2) out[r * ldo + i] = detail::bf16_bits(v);
        else out[r * ldo + i] = v;
    }
}

// rms_norm_bf16_reg_kernel<PER, VEC>
//   As rms_norm_bf16_kernel for dim <= 512·PER, one block of 512 threads per
//   row with the row in registers: thread t loads elements VEC·(t + 512·k)
//   .. +VEC−1 (k < PER/VEC; VEC = 4: 16-byte loads, dim % 4 == 0 and
//   16-byte aligned rows) of x, residual and w at once, stores the sums back,
//   reduces the squares and writes the outputs from the registers — no
//   loop-carried memory round trips (the loop of rms_norm_bf16_kernel may
//   not hoist its loads past the stores to x, so each of its steps waits for
//   memory; at the few rows of a decode step that latency was the kernel's
//   whole cost), and w is in registers before the block sum.
//   Bound:   latency at decode row counts (one read of x, residual and w,
//            one write of x and out).
template <int PER, int VEC>
__global__ void __launch_bounds__(512) rms_norm_bf16_reg_kernel(float* __restrict__ x, const float* __restrict__ residual,
                                                                const float* __restrict__ w, uint16_t* __restrict__ out,
                                                                int64_t dim, float eps) {
    static_assert(VEC == 1 || VEC == 4, "scalar or 16-byte pieces");
    constexpr int NV = PER / VEC;
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    float* xr = x + r * dim;
    const float* rr = residual ? residual + r * dim : nullptr;
    float v[NV][VEC], g[NV][VEC];
    const auto load = [&](const float* p, int64_t i, float (&d)[VEC]) {
        if constexpr (VEC == 4) {
            const float4 t = *reinterpret_cast<const float4*>(p + i);
            d[0] = t.x, d[1] = t.y, d[2] = t.z, d[3] = t.w;
        } else {
            d[0] = p[i];
        }
    };
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int64_t i = VEC * (threadIdx.x + 512 * k);
#pragma unroll
        for (int e = 0; e < VEC; ++e) v[k][e] = g[k][e] = 0.0f;
        if (i < dim) {
            load(xr, i, v[k]);
            load(w, i, g[k]);
        }
    }
    if (rr) {
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int64_t i = VEC * (threadIdx.x + 512 * k);
            if (i >= dim) continue;
            float t[VEC];
            load(rr, i, t);
#pragma unroll
            for (int e = 0; e < VEC; ++e) v[k][e] += t[e];
            if constexpr (VEC == 4) *reinterpret_cast<float4*>(xr + i) = make_float4(v[k][0], v[k][1], v[k][2], v[k][3]);
            else xr[i] = v[k][0];
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k)
#pragma unroll
        for (int e = 0; e < VEC; ++e) ss += v[k][e] * v[k][e];
    ss = detail::block_sum(ss, red);
    const float scale = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int64_t i = VEC * (threadIdx.x + 512 * k);
        if (i >= dim) continue;
        uint16_t o[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) o[e] = detail::bf16_bits(v[k][e] * scale * g[k][e]);
        if constexpr (VEC == 4)
            *reinterpret_cast<uint2*>(out + r * dim + i) = make_uint2(o[0] | static_cast<uint32_t>(o[1]) << 16,
                                                                      o[2] | static_cast<uint32_t>(o[3]) << 16);
        else out[r * dim + i] = o[0];
    }
}

// rms_norm_bf16_kernel
//   Shapes:  x, residual: n rows × dim floats; w: dim floats; out: n × dim
//            BF16 (the next GEMM's input).
//   Grid:    one block of 256 threads per row: x += residual (stored back),
//            fp32 sum of squares, block reduction, then out = bf16((x·scale)·w)
//            with rms_norm_q8_1's scale and order.
//   Bound:   memory (4 + 4 + 4 + 2 bytes per element).
__global__ void __launch_bounds__(256) rms_norm_bf16_kernel(float* __restrict__ x, const float* __restrict__ residual,
                                                            const float* __restrict__ w, uint16_t* __restrict__ out,
                                                            int64_t dim, float eps) {
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    float* xr = x + r * dim;
    const float ss = detail::add_residual_sum_squares(xr, residual ? residual + r * dim : nullptr, dim, red);
    const float scale = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) out[r * dim + i] = detail::bf16_bits(xr[i] * scale * w[i]);
}

template <int HD, class T, class Map>
void launch_attn(const float* q, int64_t ldq, const void* kc, const void* vc, int n, const Map& map, int n_head,
                 int n_head_kv, float scale, int window, float softcap, float* out, int64_t ldo, cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned>(n_head), static_cast<unsigned>((n + kPrefillAttnWarps - 1) / kPrefillAttnWarps));
    const dim3 block(32 * kPrefillAttnWarps);
    if (softcap > 0.0f)
        prefill_attention_kernel<HD, T, true, Map><<<grid, block, 0, stream>>>(
            q, ldq, static_cast<const T*>(kc), static_cast<const T*>(vc), n, map, n_head, n_head_kv, scale, window,
            softcap, out, ldo);
    else
        prefill_attention_kernel<HD, T, false, Map><<<grid, block, 0, stream>>>(
            q, ldq, static_cast<const T*>(kc), static_cast<const T*>(vc), n, map, n_head, n_head_kv, scale, window,
            softcap, out, ldo);
}

template <class T, class Map>
void dispatch_attn(int hd, const float* q, int64_t ldq, const void* kc, const void* vc, int n, const Map& map, int n_head,
                   int n_head_kv, float scale, int window, float softcap, float* out, int64_t ldo,
                   cudaStream_t stream) {
    switch (hd) {
        case 32: launch_attn<32, T>(q, ldq, kc, vc, n, map, n_head, n_head_kv, scale, window, softcap, out, ldo, stream); break;
        case 64: launch_attn<64, T>(q, ldq, kc, vc, n, map, n_head, n_head_kv, scale, window, softcap, out, ldo, stream); break;
        case 96: launch_attn<96, T>(q, ldq, kc, vc, n, map, n_head, n_head_kv, scale, window, softcap, out, ldo, stream); break;
        case 128: launch_attn<128, T>(q, ldq, kc, vc, n, map, n_head, n_head_kv, scale, window, softcap, out, ldo, stream); break;
        case 256: launch_attn<256, T>(q, ldq, kc, vc, n, map, n_head, n_head_kv, scale, window, softcap, out, ldo, stream); break;
        default: throw_error("prefill_attention: head_dim must be 32, 64, 96, 128 or 256");
    }
}

unsigned grid_for(int64_t threads) {
    return static_cast<unsigned>(std::clamp<int64_t>((threads + 255) / 256, 1, 65535));
}

}  // namespace

bool prefill_attention_head_dim_supported(int head_dim) {
    return head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128 || head_dim == 256;
}

namespace {

// The checks every RoPE + KV-store entry point makes (quern::Error naming fn).
void check_rope(const char* fn, const float* qkv, int64_t ld, int n, const void* k_cache, const void* v_cache,
                int n_head, int n_head_kv, int head_dim, const float* inv_freq, int rope_dim,
                const AttentionExtras& ex) {
    const std::string f(fn);
    if (!qkv || !k_cache || !v_cache || (rope_dim > 0 && !inv_freq)) throw_error(f + ": null pointer");
    if (n < 1 || n > 65535) throw_error(f + ": rows out of range");
    if (head_dim < 2 || head_dim > kMaxHeadDim || head_dim % 2 || rope_dim < 0 || rope_dim % 2 || rope_dim > head_dim)
        throw_error(f + ": bad head_dim / rope_dim");
    if (n_head < 1 || n_head_kv < 1 || n_head % n_head_kv) throw_error(f + ": n_head must be a multiple of n_head_kv");
    if (ld < static_cast<int64_t>(n_head + 2 * n_head_kv) * head_dim) throw_error(f + ": ld too small");
    if ((ex.q_bias == nullptr) != (ex.k_bias == nullptr) || (ex.q_bias == nullptr) != (ex.v_bias == nullptr) ||
        (ex.q_norm == nullptr) != (ex.k_norm == nullptr))
        throw_error(f + ": give all three biases or none, both norms or neither");
}

// rope_kv_store: the checks and the launch.
template <class Map>
void rope_kv_store(const char* fn, float* qkv, int64_t ld, int n, const Map& map, void* k_cache, void* v_cache,
                   KvType kv_type, int n_head, int n_head_kv, int head_dim, const float* inv_freq, int rope_dim,
                   bool neox, const AttentionExtras& ex, cudaStream_t stream) {
    check_rope(fn, qkv, ld, n, k_cache, v_cache, n_head, n_head_kv, head_dim, inv_freq, rope_dim, ex);
    const dim3 grid(static_cast<unsigned>(n_head + n_head_kv), static_cast<unsigned>(n));
    if (kv_type == KvType::F16)
        prefill_rope_kv_kernel<__half><<<grid, 32, 0, stream>>>(qkv, ld, map, static_cast<__half*>(k_cache),
                                                                static_cast<__half*>(v_cache), n_head, n_head_kv,
                                                                head_dim, inv_freq, rope_dim, neox ? 1 : 0, ex);
    else
        prefill_rope_kv_kernel<float><<<grid, 32, 0, stream>>>(qkv, ld, map, static_cast<float*>(k_cache),
                                                               static_cast<float*>(v_cache), n_head, n_head_kv,
                                                               head_dim, inv_freq, rope_dim, neox ? 1 : 0, ex);
    QUERN_CUDA_CHECK_LAUNCH();
}

// The checks both attention entry points make (quern::Error naming fn).
void check_attention(const char* fn, const float* q, int64_t ldq, const void* k_cache, const void* v_cache, int n,
                     int n_head, int n_head_kv, int head_dim, int window, float softcap, const float* out,
                     int64_t ldo) {
    const std::string f(fn);
    if (!q || !k_cache || !v_cache || !out) throw_error(f + ": null pointer");
    if (n < 1 || n > 65535 * kPrefillAttnWarps) throw_error(f + ": rows out of range");
    if (n_head < 1 || n_head_kv < 1 || n_head % n_head_kv) throw_error(f + ": n_head must be a multiple of n_head_kv");
    if (!prefill_attention_head_dim_supported(head_dim)) throw_error(f + ": head_dim must be 32, 64, 96, 128 or 256");
    if (ldq < static_cast<int64_t>(n_head) * head_dim || ldo < static_cast<int64_t>(n_head) * head_dim)
        throw_error(f + ": row stride too small");
    if (window < 0 || softcap < 0.0f) throw_error(f + ": negative window or softcap");
    if (reinterpret_cast<uintptr_t>(k_cache) % 16 || reinterpret_cast<uintptr_t>(v_cache) % 16)
        throw_error(f + ": the caches must be 16-byte aligned");
}

}  // namespace

void prefill_rope_kv_store(float* qkv, int64_t ld, int n, int pos0, void* k_cache, void* v_cache, KvType kv_type,
                           int n_ctx, int n_head, int n_head_kv, int head_dim, const float* inv_freq, int rope_dim,
                           bool neox, const AttentionExtras& ex, cudaStream_t stream) {
    if (pos0 < 0 || pos0 + n > n_ctx) throw_error("prefill_rope_kv_store: rows out of range");
    rope_kv_store("prefill_rope_kv_store", qkv, ld, n, ContiguousRows{pos0}, k_cache, v_cache, kv_type, n_head,
                  n_head_kv, head_dim, inv_freq, rope_dim, neox, ex, stream);
}

void prefill_attention(const float* q, int64_t ldq, const void* k_cache, const void* v_cache, KvType kv_type, int n,
                       int pos0, int n_ctx, int n_head, int n_head_kv, int head_dim, float scale, int window,
                       float softcap, float* out, int64_t ldo, cudaStream_t stream) {
    if (pos0 < 0 || pos0 + n > n_ctx) throw_error("prefill_attention: rows out of range");
    check_attention("prefill_attention", q, ldq, k_cache, v_cache, n, n_head, n_head_kv, head_dim, window, softcap, out,
                    ldo);
    // The tensor-core kernel where it applies.
    if (prefill_flash_supported(kv_type, head_dim, ldq, ldo) &&
        reinterpret_cast<uintptr_t>(q) % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0) {
        prefill_flash_attention(q, ldq, k_cache, v_cache, n, pos0, n_head, n_head_kv, head_dim, scale, window, softcap,
                                out, ldo, stream);
        return;
    }
    if (kv_type == KvType::F16)
        dispatch_attn<__half>(head_dim, q, ldq, k_cache, v_cache, n, ContiguousRows{pos0}, n_head, n_head_kv, scale,
                              window, softcap, out, ldo, stream);
    else
        dispatch_attn<float>(head_dim, q, ldq, k_cache, v_cache, n, ContiguousRows{pos0}, n_head, n_head_kv, scale,
                             window, softcap, out, ldo, stream);
    QUERN_CUDA_CHECK_LAUNCH();
}

void paged_rope_kv_store(float* qkv, int64_t ld, int n, const PagedRows& pr, void* k_cache, void* v_cache,
                         KvType kv_type, int n_head, int n_head_kv, int head_dim, const float* inv_freq, int rope_dim,
                         bool neox, const AttentionExtras& ex, cudaStream_t stream) {
    if (!pr.pos || !pr.table_off || !pr.tables || pr.block_size < 1)
        throw_error("paged_rope_kv_store: null row map or bad block size");
    if (pr.rope_long && !pr.inv_freq_long) throw_error("paged_rope_kv_store: rope_long without its table");
    rope_kv_store("paged_rope_kv_store", qkv, ld, n, PagedMap{pr}, k_cache, v_cache, kv_type, n_head, n_head_kv,
                  head_dim, inv_freq, rope_dim, neox, ex, stream);
}

void paged_attention(const float* q, int64_t ldq, const void* k_cache, const void* v_cache, KvType kv_type, int n,
                     const PagedRows& pr, int n_head, int n_head_kv, int head_dim, float scale, int window,
                     float softcap, float* out, int64_t ldo, cudaStream_t stream) {
    if (!pr.pos || !pr.table_off || !pr.tables || pr.block_size < 1)
        throw_error("paged_attention: null row map or bad block size");
    check_attention("paged_attention", q, ldq, k_cache, v_cache, n, n_head, n_head_kv, head_dim, window, softcap, out,
                    ldo);
    if (paged_grouped_applies(pr, kv_type, n, n_head, n_head_kv, head_dim)) {
        paged_grouped_attention(q, ldq, k_cache, v_cache, n, pr, n_head, n_head_kv, head_dim, scale, window, softcap,
                                out, ldo, RopeFold{}, stream);
        return;
    }
    if (kv_type == KvType::F16)
        dispatch_attn<__half>(head_dim, q, ldq, k_cache, v_cache, n, PagedMap{pr}, n_head, n_head_kv, scale, window,
                              softcap, out, ldo, stream);
    else
        dispatch_attn<float>(head_dim, q, ldq, k_cache, v_cache, n, PagedMap{pr}, n_head, n_head_kv, scale, window,
                             softcap, out, ldo, stream);
    QUERN_CUDA_CHECK_LAUNCH();
    if (pr.out_bf16) f32_to_bf16(out, ldo, n, static_cast<int64_t>(n_head) * head_dim, pr.out_bf16, stream);
}

void paged_rope_attention(float* qkv, int64_t ld, void* k_cache, void* v_cache, KvType kv_type, int n,
                          const PagedRows& pr, int n_head, int n_head_kv, int head_dim, float scale, int window,
                          float softcap, const float* inv_freq, int rope_dim, bool neox, const AttentionExtras& ex,
                          float* out, int64_t ldo, cudaStream_t stream) {
    if (!paged_grouped_applies(pr, kv_type, n, n_head, n_head_kv, head_dim)) {  // the two launches
        paged_rope_kv_store(qkv, ld, n, pr, k_cache, v_cache, kv_type, n_head, n_head_kv, head_dim, inv_freq, rope_dim,
                            neox, ex, stream);
        paged_attention(qkv, ld, k_cache, v_cache, kv_type, n, pr, n_head, n_head_kv, head_dim, scale, window, softcap,
                        out, ldo, stream);
        return;
    }
    if (!pr.pos || !pr.table_off || !pr.tables || pr.block_size < 1)
        throw_error("paged_rope_attention: null row map or bad block size");
    if (pr.rope_long && !pr.inv_freq_long) throw_error("paged_rope_attention: rope_long without its table");
    check_rope("paged_rope_attention", qkv, ld, n, k_cache, v_cache, n_head, n_head_kv, head_dim, inv_freq, rope_dim,
               ex);
    check_attention("paged_rope_attention", qkv, ld, k_cache, v_cache, n, n_head, n_head_kv, head_dim, window, softcap,
                    out, ldo);
    RopeFold fold;
    fold.on = true;
    fold.inv_freq = inv_freq;
    fold.rope_dim = rope_dim;
    fold.neox = neox ? 1 : 0;
    fold.ex = ex;
    fold.kc = static_cast<__half*>(k_cache);
    fold.vc = static_cast<__half*>(v_cache);
    paged_grouped_attention(qkv, ld, k_cache, v_cache, n, pr, n_head, n_head_kv, head_dim, scale, window, softcap, out,
                            ldo, fold, stream);
}

void glu_rows_bf16(const float* gu, int64_t ld, int64_t n, int64_t n_ff, uint16_t* out, int act,
                   cudaStream_t stream) {
    if (!gu || !out) throw_error("glu_rows_bf16: null pointer");
    if (n < 1 || n_ff < 1 || ld < 2 * n_ff) throw_error("glu_rows_bf16: bad shape");
    const auto g = grid_for(n * n_ff);
    if (act == kGateGelu) glu_rows_kernel<kGateGelu><<<g, 256, 0, stream>>>(gu, ld, n, n_ff, out, n_ff);
    else if (act == kGateSigmoid) glu_rows_kernel<kGateSigmoid><<<g, 256, 0, stream>>>(gu, ld, n, n_ff, out, n_ff);
    else glu_rows_kernel<kGateSiLU><<<g, 256, 0, stream>>>(gu, ld, n, n_ff, out, n_ff);
    QUERN_CUDA_CHECK_LAUNCH();
}

void rms_norm_bf16(float* x, const float* residual, const float* w, uint16_t* out, int64_t n, int64_t dim, float eps,
                   cudaStream_t stream) {
    if (!x || !w || !out) throw_error("rms_norm_bf16: null pointer");
    if (n < 1 || n > 2147483647 || dim < 1) throw_error("rms_norm_bf16: bad shape");
    const auto grid = static_cast<unsigned>(n);
    const auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool vec = dim % 4 == 0 && a16(x) && a16(w) && (!residual || a16(residual)) &&
                     reinterpret_cast<uintptr_t>(out) % 8 == 0;
    const auto launch = [&](auto per) {
        constexpr int PER = decltype(per)::value;
        if (vec) rms_norm_bf16_reg_kernel<PER, 4><<<grid, 512, 0, stream>>>(x, residual, w, out, dim, eps);
        else rms_norm_bf16_reg_kernel<PER, 1><<<grid, 512, 0, stream>>>(x, residual, w, out, dim, eps);
    };
    if (dim <= 512 * 4) launch(std::integral_constant<int, 4>{});
    else if (dim <= 512 * 8) launch(std::integral_constant<int, 8>{});
    else if (dim <= 512 * 16) launch(std::integral_constant<int, 16>{});
    else rms_norm_bf16_kernel<<<grid, 256, 0, stream>>>(x, residual, w, out, dim, eps);
    QUERN_CUDA_CHECK_LAUNCH();
}

void glu_rows(const float* gu, int64_t ld, int64_t n, int64_t n_ff, float* out, int64_t ldo, int act,
              cudaStream_t stream) {
    if (!gu || !out) throw_error("glu_rows: null pointer");
    if (n < 1 || n_ff < 1 || ld < 2 * n_ff || ldo < n_ff) throw_error("glu_rows: bad shape");
    const auto g = grid_for(n * n_ff);
    if (act == kGateGelu) glu_rows_kernel<kGateGelu><<<g, 256, 0, stream>>>(gu, ld, n, n_ff, out, ldo);
    else if (act == kGateSigmoid) glu_rows_kernel<kGateSigmoid><<<g, 256, 0, stream>>>(gu, ld, n, n_ff, out, ldo);
    else glu_rows_kernel<kGateSiLU><<<g, 256, 0, stream>>>(gu, ld, n, n_ff, out, ldo);
    QUERN_CUDA_CHECK_LAUNCH();
}

}  // namespace quern::cuda
