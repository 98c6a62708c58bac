// Prefill attention on the tensor cores (FlashAttention-2's tiling: Dao,
// "FlashAttention-2: Faster Attention with Better Parallelism and Work
// Partitioning", 2023), for an f16 KV cache and heads of 64, 128 or 256. API and
// semantics: prefill_attention in ops.h, which routes these cases here.
// Heads of 256 (Gemma, Qwen3.5's attention layers) take the same kernel with
// 32-key tiles: 64-key ones would need ~300 registers a thread for S, the
// query fragments and O together.
//
// prefill_flash_kernel<HD, SOFTCAP>
//   Shapes:  q: n rows at stride ldq floats, n_head·HD each (rotated,
//            unscaled); k_cache / v_cache: rows of n_head_kv·HD halves, the
//            row of position p at p; out: n rows at stride ldo floats.
//   Grid:    (n_head, ceil(n / 64)) blocks of 4 warps; block (h, t) takes
//            query rows 64t .. 64t+63 of head h (the tiles with the most keys
//            are launched first), warp w rows 64t+16w .. +15. KV head
//            h / (n_head / n_head_kv).
//   Math:    each warp holds its 16 scaled query rows as f16 A fragments
//            (mma.m16n8k16); the block walks its keys kTile(HD) at a time (64;
//            32 for heads of 256): K and V
//            tiles are copied to shared memory (rows padded by 8 halves, so
//            that fragment loads and ldmatrix hit 32 distinct banks),
//            S = Q·Kᵀ (16 × tile per warp, fp32 accumulators), the mask
//            (causal, window, end of the context) and the soft-cap on S,
//            the online softmax in fp32 (row max and sum over the quad of
//            lanes sharing a row), P rounded to f16 and reused in registers
//            as the A fragments of O += P·V (V's B fragments by ldmatrix
//            .trans), O rescaled per tile, divided by the row sum at the end.
//   Numerics: q·scale and P are rounded to f16 (11 significant bits); K and
//            V are the cache's f16 values; every product is accumulated in
//            fp32. Masked keys get −inf before the max, and a row with no key
//            yet keeps its running max at −inf without producing NaN.
//   Bound:   tensor-core throughput for long contexts; K/V tiles come from L2
//            (a KV head's tiles are read by each of its query heads).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/flash_softmax.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_flash.h"

namespace quern::cuda {
namespace {

constexpr int kBr = 64;     // query rows per block (16 per warp)
/// Keys per tile: 64, or 32 for heads of 256 (registers: see the top).
__host__ __device__ constexpr int kTile(int hd) { return hd > 128 ? 32 : 64; }
constexpr int kWarps = 4;
constexpr int kPad = 8;     // halves of padding per shared-memory row

using mma::ldmatrix_x4_trans;
using mma::pack_half2;

template <int HD, bool SOFTCAP>
__global__ void __launch_bounds__(32 * kWarps)
    prefill_flash_kernel(const float* __restrict__ q, int64_t ldq, const __half* __restrict__ kc,
                         const __half* __restrict__ vc, int n, int pos0, int n_head, int n_head_kv, float scale,
                         int window, float softcap, float* __restrict__ out, int64_t ldo) {
    constexpr int LD = HD + kPad;  // shared row stride in halves
    constexpr int KS = HD / 16;    // k-steps of Q·Kᵀ
    constexpr int NT = HD / 8;     // n-tiles of O
    constexpr int kBc = kTile(HD);
    __shared__ __align__(16) __half ks[kBc * LD];
    __shared__ __align__(16) __half vs[kBc * LD];

    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tg = lane & 3;  // the fragment's row group and thread-in-group
    const int h = static_cast<int>(blockIdx.x);
    const int tile = static_cast<int>(gridDim.y - 1 - blockIdx.y);  // the longest tiles first
    const int hk = h / (n_head / n_head_kv);
    const int r0 = tile * kBr + warp * 16;  // this warp's first row
    const int64_t kv_stride = static_cast<int64_t>(n_head_kv) * HD;

    // Query rows g and g+8 of the warp as A fragments (scaled, f16).
    uint32_t qa[KS][4];
    {
        const int ra = min(r0 + g, n - 1), rb = min(r0 + g + 8, n - 1);
        const float* qa_row = q + static_cast<int64_t>(ra) * ldq + static_cast<int64_t>(h) * HD;
        const float* qb_row = q + static_cast<int64_t>(rb) * ldq + static_cast<int64_t>(h) * HD;
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
            const int c = kk * 16 + 2 * tg;
            const float2 a0 = *reinterpret_cast<const float2*>(qa_row + c);
            const float2 a1 = *reinterpret_cast<const float2*>(qb_row + c);
            const float2 a2 = *reinterpret_cast<const float2*>(qa_row + c + 8);
            const float2 a3 = *reinterpret_cast<const float2*>(qb_row + c + 8);
            qa[kk][0] = pack_half2(a0.x * scale, a0.y * scale);
            qa[kk][1] = pack_half2(a1.x * scale, a1.y * scale);
            qa[kk][2] = pack_half2(a2.x * scale, a2.y * scale);
            qa[kk][3] = pack_half2(a3.x * scale, a3.y * scale);
        }
    }

    float o[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g+8: running max and sum
    const int pa = pos0 + r0 + g, pb = pa + 8;                         // their positions

    // The block's keys: from the first row's window start to its last row.
    const int last_row = min(tile * kBr + kBr - 1, n - 1);
    const int kv_hi = pos0 + last_row;  // inclusive
    const int kv_lo = window > 0 ? max(0, pos0 + tile * kBr - window + 1) : 0;

    for (int kv0 = kv_lo; kv0 <= kv_hi; kv0 += kBc) {
        // K and V tiles to shared memory, 16 bytes per copy; keys past the
        // last one are zeros (their scores are masked; V must not be NaN).
        __syncthreads();
        for (int i = tid; i < kBc * HD / 8; i += 32 * kWarps) {
            const int key = i / (HD / 8), c = (i % (HD / 8)) * 8;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
            if (kv0 + key <= kv_hi) {
                const int64_t off = static_cast<int64_t>(kv0 + key) * kv_stride + static_cast<int64_t>(hk) * HD + c;
                kv = *reinterpret_cast<const uint4*>(kc + off);
                vv = *reinterpret_cast<const uint4*>(vc + off);
            }
            *reinterpret_cast<uint4*>(ks + key * LD + c) = kv;
            *reinterpret_cast<uint4*>(vs + key * LD + c) = vv;
        }
        __syncthreads();
        if (kv0 > pos0 + r0 + 15) continue;  // every key of the tile is after the warp's last row (warp-uniform)

        // S = Q·Kᵀ: n-tiles of 8 keys.
        float s[kBc / 8][4];
#pragma unroll
        for (int j = 0; j < kBc / 8; ++j) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            const __half* kr = ks + (j * 8 + g) * LD + 2 * tg;
#pragma unroll
            for (int kk = 0; kk < KS; ++kk) {
                const uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr + kk * 16);
                const uint32_t b1 = *reinterpret_cast<const uint32_t*>(kr + kk * 16 + 8);
                mma::mma_f16(s[j], qa[kk], b0, b1);
            }
        }
        // Soft-cap and mask.
#pragma unroll
        for (int j = 0; j < kBc / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = kv0 + j * 8 + 2 * tg + (e & 1);
                const int p = e < 2 ? pa : pb;
                float v = s[j][e];
                if constexpr (SOFTCAP) v = softcap * tanhf(v / softcap);
                const bool ok = key <= p && key <= kv_hi && (window <= 0 || key > p - window);
                s[j][e] = ok ? v : -INFINITY;
            }
        }
        float corr[2];
        uint32_t pf[kBc / 8][2];  // P as f16 pairs: rows g (0) and g+8 (1) of each n-tile
        detail::online_softmax_step(s, m, l, corr, pf);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            o[j][0] *= corr[0];
            o[j][1] *= corr[0];
            o[j][2] *= corr[1];
            o[j][3] *= corr[1];
        }
        // O += P·V: k-steps of 16 keys (n-tiles 2t and 2t+1 of S form the A
        // fragment), two n-tiles of 8 head elements per ldmatrix.x4.trans.
#pragma unroll
        for (int t = 0; t < kBc / 16; ++t) {
            const uint32_t a[4] = {pf[2 * t][0], pf[2 * t][1], pf[2 * t + 1][0], pf[2 * t + 1][1]};
            const __half* vrow = vs + (t * 16 + (lane & 15)) * LD + (lane >> 4) * 8;
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                uint32_t b0, b1, b2, b3;
                ldmatrix_x4_trans(b0, b1, b2, b3, vrow + j * 8);
                mma::mma_f16(o[j], a, b0, b1);
                mma::mma_f16(o[j + 1], a, b2, b3);
            }
        }
    }

    // The row sums over the quad, then O / l.
#pragma unroll
    for (int d = 1; d <= 2; d <<= 1) {
        l[0] += __shfl_xor_sync(0xFFFFFFFFu, l[0], d);
        l[1] += __shfl_xor_sync(0xFFFFFFFFu, l[1], d);
    }
    const float ia = 1.0f / l[0], ib = 1.0f / l[1];  // l >= 1: the key at the row's own position is seen
    const int ra = r0 + g, rb = r0 + g + 8;
    float* oa = out + static_cast<int64_t>(ra) * ldo + static_cast<int64_t>(h) * HD + 2 * tg;
    float* ob = out + static_cast<int64_t>(rb) * ldo + static_cast<int64_t>(h) * HD + 2 * tg;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        if (ra < n) *reinterpret_cast<float2*>(oa + j * 8) = make_float2(o[j][0] * ia, o[j][1] * ia);
        if (rb < n) *reinterpret_cast<float2*>(ob + j * 8) = make_float2(o[j][2] * ib, o[j][3] * ib);
    }
}

template <int HD>
void launch(const float* q, int64_t ldq, const void* kc, const void* vc, int n, int pos0, int n_head, int n_head_kv,
            float scale, int window, float softcap, float* out, int64_t ldo, cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned>(n_head), static_cast<unsigned>((n + kBr - 1) / kBr));
    const auto* k = static_cast<const __half*>(kc);
    const auto* v = static_cast<const __half*>(vc);
    if (softcap > 0.0f)
        prefill_flash_kernel<HD, true><<<grid, 32 * kWarps, 0, stream>>>(q, ldq, k, v, n, pos0, n_head, n_head_kv,
                                                                         scale, window, softcap, out, ldo);
    else
        prefill_flash_kernel<HD, false><<<grid, 32 * kWarps, 0, stream>>>(q, ldq, k, v, n, pos0, n_head, n_head_kv,
                                                                          scale, window, softcap, out, ldo);
}

}  // namespace

bool prefill_flash_supported(KvType kv_type, int head_dim, int64_t ldq, int64_t ldo) {
    // float2 loads of q and stores of out need even strides.
    return kv_type == KvType::F16 && (head_dim == 64 || head_dim == 128 || head_dim == 256) && ldq % 2 == 0 &&
           ldo % 2 == 0;
}

void prefill_flash_attention(const float* q, int64_t ldq, const void* k_cache, const void* v_cache, int n, int pos0,
                             int n_head, int n_head_kv, int head_dim, float scale, int window, float softcap,
                             float* out, int64_t ldo, cudaStream_t stream) {
    if (head_dim == 64)
        launch<64>(q, ldq, k_cache, v_cache, n, pos0, n_head, n_head_kv, scale, window, softcap, out, ldo, stream);
    else if (head_dim == 256)
        launch<256>(q, ldq, k_cache, v_cache, n, pos0, n_head, n_head_kv, scale, window, softcap, out, ldo, stream);
    else
        launch<128>(q, ldq, k_cache, v_cache, n, pos0, n_head, n_head_kv, scale, window, softcap, out, ldo, stream);
    QUERN_CUDA_CHECK_LAUNCH();
}

}  // namespace quern::cuda
