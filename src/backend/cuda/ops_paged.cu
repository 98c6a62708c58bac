// The grouped paged attention on the tensor cores: API in ops_paged.h, the
// kernel's contract below.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cuda/context.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/flash_softmax.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/ops_paged.h"
#include "backend/cuda/ops_rows.cuh"
#include "backend/cuda/tuning.h"

namespace quern::cuda {
namespace {

using detail::from_f32;
using detail::PagedMap;
using detail::rope_head;

// paged_grouped_attention_kernel<HD, SOFTCAP>
//   Shapes:  as prefill_attention_kernel with a PagedMap and an f16 cache
//            (HD 32, 64 or 128), for n_head / n_head_kv = g <= 16.
//   Grid:    (n_head_kv, n, nsplit) blocks of 2 warps: block (hk, r, z)
//            computes the g query heads of KV head hk for row r over the
//            keys lo .. pos(r), or with nsplit > 1 the z-th of nsplit equal
//            ranges of them (whole 32-key steps), leaving its unnormalized
//            sums, running max and sum in ws (paged_merge_kernel combines
//            them).
//   Math:    the g heads are the rows of mma.m16n8k16 A fragments (q·scale
//            in f16, rows past g zero), so one KV head's K and V rows serve
//            all its query heads in one product. The keys go 32 at a time:
//            the block stages the 32 K and V rows (padded by 8 halves: the
//            fragment loads and ldmatrix hit distinct banks) with 16-byte
//            cp.async, the next tile's copies in flight while the current
//            one is used; warp w takes keys 16w .. 16w+15 of each tile:
//            S = Q·Kᵀ (two n-tiles of 8 keys, fp32), keys past the range
//            masked, the soft-cap, the online softmax per head in fp32 (max
//            and sum over the quad of lanes sharing a head), P in f16 as the
//            A fragment of O += P·V (V's B fragments by ldmatrix.trans). The
//            two warps' (max, sum, O) are merged through shared memory at
//            the end.
//   Numerics: as prefill_flash_kernel: q·scale and P rounded to f16, K and V
//            the cache's f16 values, every product accumulated in fp32.
//   fold.on (paged_rope_attention): the warps ready the query heads from the
//            raw row (rope_head: bias, q norm, RoPE), and the block whose
//            range ends at the row's own position readies the KV head's key
//            the same way and writes it and the value to the row's cache row
//            before any copy of that position is issued — what
//            paged_rope_kv_store would have written, in the same launch.
//   Bound:   memory (each KV head's rows read once per row) at decode
//            lengths, with the tensor cores doing the arithmetic.
constexpr int kGroupWarps = 2;
constexpr int kGroupKeys = 16 * kGroupWarps;  // keys per staged tile
constexpr int kGroupMaxHeads = 16;            // g <= 16: one m16 fragment

template <int HD, bool SOFTCAP>
__global__ void __launch_bounds__(32 * kGroupWarps)
    paged_grouped_attention_kernel(const float* __restrict__ q, int64_t ldq, const __half* kc,
                                   const __half* vc, const PagedMap map, int n_head, int n_head_kv,
                                   float scale, int window, float softcap, float* __restrict__ out, int64_t ldo,
                                   int nsplit, float* __restrict__ ws, uint16_t* __restrict__ ob, const RopeFold fold) {
    constexpr int LD = HD + 8, C16 = HD / 8, KS = HD / 16, NT = HD / 8;
    static_assert(HD >= 32 && HD % 16 == 0, "heads of 32, 64 or 128");
    __shared__ float kx[HD];  // fold: the row's key for this KV head; at the end the second warp's max and sum
    __shared__ __align__(16) __half ksh[2][kGroupKeys][LD];
    __shared__ __align__(16) __half vsh[2][kGroupKeys][LD];
    // The heads' scaled queries are staged in the second V buffer (the first
    // tile's copies go to the first), and the second warp's O is handed over
    // in the K buffers at the end: shared memory for more blocks per SM.
    static_assert(sizeof(vsh[1]) >= sizeof(float) * kGroupMaxHeads * HD, "q staging fits a V buffer");
    auto qsh = reinterpret_cast<float(*)[HD]>(&vsh[1][0][0]);
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, tg = lane & 3;  // the fragment's row group (heads gq, gq + 8) and thread-in-group
    const int hk = static_cast<int>(blockIdx.x), r = static_cast<int>(blockIdx.y);
    const int g = n_head / n_head_kv;
    const int pos = map.pos(r);
    const int lo = window > 0 ? max(0, pos - window + 1) : 0;
    const int64_t kv_stride = static_cast<int64_t>(n_head_kv) * HD;
    // This block's keys k0 .. k1 (all of lo .. pos without a split).
    int k0 = lo, k1 = pos;
    if (nsplit > 1) {
        const int span = ((pos - lo + 1 + nsplit - 1) / nsplit + kGroupKeys - 1) / kGroupKeys * kGroupKeys;
        k0 = lo + static_cast<int>(blockIdx.z) * span;
        k1 = min(pos, k0 + span - 1);
    }
    const auto issue = [&](int j0, int b) {
        const int nt = min(kGroupKeys, k1 - j0 + 1);
        for (int c = tid; c < kGroupKeys * C16; c += 32 * kGroupWarps) {
            const int t = c / C16, part = c % C16;
            const int64_t off =
                t < nt ? map.cache_row(r, j0 + t) * kv_stride + static_cast<int64_t>(hk) * HD + part * 8 : 0;
            mma::cp_async16(&ksh[b][t][part * 8], kc + off, t < nt);  // zeros past the keys
            mma::cp_async16(&vsh[b][t][part * 8], vc + off, t < nt);
        }
        mma::cp_async_commit();
    };
    // fold: the block whose range ends at pos writes that key; its copy of
    // the tile holding pos waits for the barrier below when that is the
    // first tile (later tiles are issued after barriers anyway).
    const bool writer = fold.on && k0 <= pos && k1 == pos;
    const bool early = !(writer && pos < k0 + kGroupKeys);
    if (early && k0 <= k1) issue(k0, 0);
    const float* qrow = q + static_cast<int64_t>(r) * ldq;
    if (fold.on) {
        const float* freq = map.freq(r, fold.inv_freq);
        for (int j = warp; j < g; j += kGroupWarps) {
            const int h = hk * g + j;
            rope_head(qsh[j], qrow + static_cast<int64_t>(h) * HD, fold.ex.q_bias ? fold.ex.q_bias + h * HD : nullptr,
                      fold.ex.q_norm, fold.ex.norm_eps, HD, pos, freq, fold.rope_dim, fold.neox, lane);
            for (int e = lane; e < HD; e += 32) qsh[j][e] *= scale;
        }
        if (writer && warp == g % kGroupWarps) {
            const float* kr = qrow + static_cast<int64_t>(n_head + hk) * HD;
            const float* vr = qrow + static_cast<int64_t>(n_head + n_head_kv + hk) * HD;
            rope_head(kx, kr, fold.ex.k_bias ? fold.ex.k_bias + hk * HD : nullptr, fold.ex.k_norm, fold.ex.norm_eps, HD,
                      pos, freq, fold.rope_dim, fold.neox, lane);
            const int64_t crow = map.cache_row(r, pos) * kv_stride + static_cast<int64_t>(hk) * HD;
            for (int e = lane; e < HD; e += 32) {
                fold.kc[crow + e] = from_f32<__half>(kx[e]);
                fold.vc[crow + e] = from_f32<__half>(vr[e] + (fold.ex.v_bias ? fold.ex.v_bias[hk * HD + e] : 0.0f));
            }
        }
    } else {
        for (int idx = tid; idx < g * HD; idx += 32 * kGroupWarps) {
            const int j = idx / HD, e = idx % HD;
            qsh[j][e] = qrow[static_cast<int64_t>(hk * g + j) * HD + e] * scale;
        }
    }
    for (int idx = g * HD + tid; idx < kGroupMaxHeads * HD; idx += 32 * kGroupWarps) qsh[idx / HD][idx % HD] = 0.0f;
    __syncthreads();  // q is staged (also when this block has no keys); fold: the row's key and value are written
    if (!early && k0 <= k1) issue(k0, 0);
    uint32_t qa[KS][4];  // heads gq and gq + 8 as A fragments
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
        const int c = kk * 16 + 2 * tg;
        qa[kk][0] = mma::pack_half2(qsh[gq][c], qsh[gq][c + 1]);
        qa[kk][1] = mma::pack_half2(qsh[gq + 8][c], qsh[gq + 8][c + 1]);
        qa[kk][2] = mma::pack_half2(qsh[gq][c + 8], qsh[gq][c + 9]);
        qa[kk][3] = mma::pack_half2(qsh[gq + 8][c + 8], qsh[gq + 8][c + 9]);
    }
    __syncthreads();  // the queries are read before the loop copies keys into their buffer
    float o[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // heads gq and gq + 8: running max and sum
    int b = 0;
    for (int j0 = k0; j0 <= k1; j0 += kGroupKeys, b ^= 1) {
        if (j0 + kGroupKeys <= k1) issue(j0 + kGroupKeys, b ^ 1);
        else mma::cp_async_commit();
        mma::cp_async_wait<1>();  // this thread's copies of keys j0 .. are in
        __syncthreads();          // everyone's
        const int kw = j0 + 16 * warp;  // this warp's first key
        if (kw <= k1) {                 // warp-uniform
            float s[2][4];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
                const __half* kr = &ksh[b][16 * warp + j * 8 + gq][2 * tg];
#pragma unroll
                for (int kk = 0; kk < KS; ++kk) {
                    const uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr + kk * 16);
                    const uint32_t b1 = *reinterpret_cast<const uint32_t*>(kr + kk * 16 + 8);
                    mma::mma_f16(s[j], qa[kk], b0, b1);
                }
            }
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float v = s[j][e];
                    if constexpr (SOFTCAP) v = softcap * tanhf(v / softcap);
                    s[j][e] = kw + j * 8 + 2 * tg + (e & 1) <= k1 ? v : -INFINITY;
                }
            float corr[2];
            uint32_t pf[2][2];
            detail::online_softmax_step(s, m, l, corr, pf);
            const uint32_t a[4] = {pf[0][0], pf[0][1], pf[1][0], pf[1][1]};
            const __half* vrow = &vsh[b][16 * warp + (lane & 15)][(lane >> 4) * 8];
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                o[j][0] *= corr[0], o[j][1] *= corr[0], o[j][2] *= corr[1], o[j][3] *= corr[1];
                o[j + 1][0] *= corr[0], o[j + 1][1] *= corr[0], o[j + 1][2] *= corr[1], o[j + 1][3] *= corr[1];
                uint32_t b0, b1, b2, b3;
                mma::ldmatrix_x4_trans(b0, b1, b2, b3, vrow + j * 8);
                mma::mma_f16(o[j], a, b0, b1);
                mma::mma_f16(o[j + 1], a, b2, b3);
            }
        }
        __syncthreads();  // buffer b is consumed before the next copies into it
    }
    mma::cp_async_wait<0>();
#pragma unroll
    for (int d = 1; d <= 2; d <<= 1) {
        l[0] += __shfl_xor_sync(0xFFFFFFFFu, l[0], d);
        l[1] += __shfl_xor_sync(0xFFFFFFFFu, l[1], d);
    }
    // The second warp hands its (max, sum, O) to the first through shared
    // memory (the K buffers and kx are free now).
    __syncthreads();
    static_assert(sizeof(ksh) >= sizeof(float) * kGroupMaxHeads * HD, "the hand-over fits the K buffers");
    auto osh = reinterpret_cast<float(*)[HD]>(&ksh[0][0][0]);
    if (warp == 1) {
        if (tg == 0) kx[gq] = m[0], kx[gq + 8] = m[1], kx[16 + gq] = l[0], kx[24 + gq] = l[1];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            *reinterpret_cast<float2*>(&osh[gq][j * 8 + 2 * tg]) = make_float2(o[j][0], o[j][1]);
            *reinterpret_cast<float2*>(&osh[gq + 8][j * 8 + 2 * tg]) = make_float2(o[j][2], o[j][3]);
        }
    }
    __syncthreads();
    if (warp != 0) return;
    // Merged per head: M = max of the two maxima; each side weighs e^{m − M}
    // (0 for a side without keys; a head no side saw keeps m = −inf, l = 0).
    const auto merge = [](float& m, float& l, float m2, float l2, float& c1, float& c2) {
        const float M = fmaxf(m, m2);
        c1 = M == -INFINITY ? 0.0f : expf(m - M);
        c2 = M == -INFINITY ? 0.0f : expf(m2 - M);
        l = l * c1 + l2 * c2;
        m = M;
    };
    float ca1, ca2, cb1, cb2;
    merge(m[0], l[0], kx[gq], kx[16 + gq], ca1, ca2);
    merge(m[1], l[1], kx[gq + 8], kx[24 + gq], cb1, cb2);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const float2 oa = *reinterpret_cast<const float2*>(&osh[gq][j * 8 + 2 * tg]);
        const float2 obb = *reinterpret_cast<const float2*>(&osh[gq + 8][j * 8 + 2 * tg]);
        o[j][0] = o[j][0] * ca1 + oa.x * ca2, o[j][1] = o[j][1] * ca1 + oa.y * ca2;
        o[j][2] = o[j][2] * cb1 + obb.x * cb2, o[j][3] = o[j][3] * cb1 + obb.y * cb2;
    }
    // Heads gq (fragment halves 0, 1) and gq + 8 (2, 3), those below g.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int j_head = gq + 8 * half;
        if (j_head >= g) continue;
        const int h = hk * g + j_head;
        const float mh = m[half], lh = l[half];
        if (nsplit > 1) {
            float* rec = ws + ((static_cast<int64_t>(r) * n_head + h) * nsplit + blockIdx.z) * (HD + 2);
#pragma unroll
            for (int j = 0; j < NT; ++j)
                *reinterpret_cast<float2*>(rec + j * 8 + 2 * tg) = make_float2(o[j][2 * half], o[j][2 * half + 1]);
            if (tg == 0) rec[HD] = mh, rec[HD + 1] = lh;
            continue;
        }
        const float inv = 1.0f / lh;  // l >= 1: the row's own key is in its range
        if (ob) {
            uint16_t* orow = ob + static_cast<int64_t>(r) * n_head * HD + static_cast<int64_t>(h) * HD + 2 * tg;
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                orow[j * 8] = detail::bf16_bits(o[j][2 * half] * inv);
                orow[j * 8 + 1] = detail::bf16_bits(o[j][2 * half + 1] * inv);
            }
            continue;
        }
        float* orow = out + static_cast<int64_t>(r) * ldo + static_cast<int64_t>(h) * HD + 2 * tg;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            orow[j * 8] = o[j][2 * half] * inv;
            orow[j * 8 + 1] = o[j][2 * half + 1] * inv;
        }
    }
}

// paged_merge_kernel<HD>
//   Shapes:  ws: n rows × n_head heads × nsplit records of HD + 2 floats
//            (unnormalized sums, running max m, sum l); out as the
//            attention's.
//   Grid:    (n_head, n) blocks of one warp: out = Σ_z e^{m_z − M}·acc_z /
//            Σ_z e^{m_z − M}·l_z with M = max_z m_z (ranges without keys
//            have m = −inf and weigh nothing).
//   Bound:   latency (tiny).
template <int HD>
__global__ void __launch_bounds__(32) paged_merge_kernel(const float* __restrict__ ws, int n_head, int nsplit,
                                                         float* __restrict__ out, int64_t ldo, uint16_t* __restrict__ ob) {
    constexpr int E = HD / 32;
    const int lane = static_cast<int>(threadIdx.x), h = static_cast<int>(blockIdx.x), r = static_cast<int>(blockIdx.y);
    const float* rec = ws + (static_cast<int64_t>(r) * n_head + h) * nsplit * (HD + 2);
    float M = -INFINITY;
    for (int z = 0; z < nsplit; ++z) M = fmaxf(M, rec[z * (HD + 2) + HD]);
    float L = 0.0f, acc[E];
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.0f;
    for (int z = 0; z < nsplit; ++z) {
        const float mz = rec[z * (HD + 2) + HD];
        if (mz == -INFINITY) continue;
        const float wz = expf(mz - M);
        L += wz * rec[z * (HD + 2) + HD + 1];
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] += wz * rec[z * (HD + 2) + lane * E + e];
    }
    const float inv = 1.0f / L;  // L >= 1: the range holding the row's own key has weight e^0 · l >= 1
    if (ob) {
        uint16_t* o = ob + static_cast<int64_t>(r) * n_head * HD + static_cast<int64_t>(h) * HD + lane * E;
#pragma unroll
        for (int e = 0; e < E; ++e) o[e] = detail::bf16_bits(acc[e] * inv);
        return;
    }
    float* o = out + static_cast<int64_t>(r) * ldo + static_cast<int64_t>(h) * HD + lane * E;
#pragma unroll
    for (int e = 0; e < E; ++e) o[e] = acc[e] * inv;
}

template <int HD>
void launch_grouped(const float* q, int64_t ldq, const void* kc, const void* vc, int n, const PagedMap& map,
                    int n_head, int n_head_kv, float scale, int window, float softcap, float* out, int64_t ldo,
                    const RopeFold& fold, cudaStream_t stream) {
    // Split the keys when the rows' blocks would fill under a quarter of the
    // blocks that run at once (few rows), into no more blocks than run at
    // once: ranges of at least 64 keys, as many as the scratch holds. (H200,
    // llama3-8b at 32 and 64 sequences: unsplit is ~1% faster than 2 ranges,
    // 7-10% faster than 3, whose second wave of blocks runs nearly alone; on
    // an H100 at 128 and 256 sequences 2 and 4 ranges forced cost 5 and 10%
    // of the decode speed.)
    const PagedRows& pr = map.pr;
    int nsplit = 1;
    if (pr.split_ws && pr.max_keys > 64) {
        static const int per_sm = [] {
            int b = 0;
            if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, paged_grouped_attention_kernel<HD, false>,
                                                              32 * kGroupWarps, 0) != cudaSuccess) {
                (void)cudaGetLastError();
                b = 4;
            }
            return std::max(b, 1);
        }();
        const int64_t blocks = static_cast<int64_t>(n) * n_head_kv;
        const int64_t resident = static_cast<int64_t>(per_sm) * CudaContext::current_sm_count();
        const int64_t forced = tuning().paged_splits;  // N ranges (for measurements)
        const int64_t want =
            forced > 0 ? forced
            : 4 * blocks > resident
                ? 1
                : std::min((4 * CudaContext::current_sm_count() + blocks - 1) / blocks, resident / blocks);
        const int64_t fit = pr.split_ws_floats / (static_cast<int64_t>(n) * n_head * (HD + 2));
        nsplit = static_cast<int>(std::clamp<int64_t>(std::min({want, int64_t{pr.max_splits}, fit,
                                                                 int64_t{(pr.max_keys + 63) / 64}}),
                                                      1, 64));
    }
    const dim3 grid(static_cast<unsigned>(n_head_kv), static_cast<unsigned>(n), static_cast<unsigned>(nsplit)),
        block(32 * kGroupWarps);
    if (softcap > 0.0f)
        paged_grouped_attention_kernel<HD, true><<<grid, block, 0, stream>>>(
            q, ldq, static_cast<const __half*>(kc), static_cast<const __half*>(vc), map, n_head, n_head_kv, scale,
            window, softcap, out, ldo, nsplit, pr.split_ws, nsplit > 1 ? nullptr : pr.out_bf16, fold);
    else
        paged_grouped_attention_kernel<HD, false><<<grid, block, 0, stream>>>(
            q, ldq, static_cast<const __half*>(kc), static_cast<const __half*>(vc), map, n_head, n_head_kv, scale,
            window, softcap, out, ldo, nsplit, pr.split_ws, nsplit > 1 ? nullptr : pr.out_bf16, fold);
    if (nsplit > 1) {
        QUERN_CUDA_CHECK_LAUNCH();
        paged_merge_kernel<HD><<<dim3(static_cast<unsigned>(n_head), static_cast<unsigned>(n)), 32, 0, stream>>>(
            pr.split_ws, n_head, nsplit, out, ldo, pr.out_bf16);
    }
}

}  // namespace

bool paged_grouped_applies(const PagedRows& pr, KvType kv_type, int n, int n_head, int n_head_kv, int head_dim) {
    const int g = n_head / n_head_kv;
    return !pr.scalar && kv_type == KvType::F16 && g <= kGroupMaxHeads &&
           n <= 65535 && (head_dim == 32 || head_dim == 64 || head_dim == 128);
}

void paged_grouped_attention(const float* q, int64_t ldq, const void* k_cache, const void* v_cache, int n,
                             const PagedRows& pr, int n_head, int n_head_kv, int head_dim, float scale, int window,
                             float softcap, float* out, int64_t ldo, const RopeFold& fold, cudaStream_t stream) {
    const PagedMap map{pr};
    switch (head_dim) {
        case 32: launch_grouped<32>(q, ldq, k_cache, v_cache, n, map, n_head, n_head_kv, scale, window, softcap, out, ldo, fold, stream); break;
        case 64: launch_grouped<64>(q, ldq, k_cache, v_cache, n, map, n_head, n_head_kv, scale, window, softcap, out, ldo, fold, stream); break;
        default: launch_grouped<128>(q, ldq, k_cache, v_cache, n, map, n_head, n_head_kv, scale, window, softcap, out, ldo, fold, stream); break;
    }
    QUERN_CUDA_CHECK_LAUNCH();
}

}  // namespace quern::cuda
