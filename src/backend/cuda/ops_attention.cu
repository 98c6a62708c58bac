// Split-K GQA decode attention ("flash-decoding") over the device KV cache.
// API: ops.h (decode_attention, decode_attention_rope).
//
// Split layout (graph-capturable: the grid depends on n_ctx only, the work on
// *pos read on the device):
//   The positions 0..L-1 (L = *pos + 1) are cut into kTile = 64-position tiles,
//   nt = ceil(L/64). The grid has S = min(kMaxSplits = 128, ceil(n_ctx/64))
//   splits per KV head; split s takes tps = ceil(nt/S) consecutive tiles
//   [s·tps, s·tps + tps) ∩ [0, nt), so na = ceil(nt/tps) splits are active
//   (short context: one tile each, up to 64·S positions; long context: S
//   splits of tps tiles). Blocks of splits >= na exit at once.
//
// attn_split_kernel<HD, T, G, ROPE, PRE>
//   Shapes:  q: n_head × HD floats; caches: n_ctx rows × n_head_kv × HD T
//            (T = float or __half), rows of n_head_kv·HD elements;
//            part_o: [n_head][S][HD] floats, part_ml: [n_head][S][2]
//            floats {max score, Σ exp(score − max)}.
//   Grid:    (S, n_head_kv · qsub) blocks of 256 threads (8 warps); block
//            (s, hk·qsub + i) handles split s for the gb = g/qsub query heads
//            hk·g + i·gb .. + gb − 1 of KV head hk (g = n_head/n_head_kv; G:
//            gb rounded up to a power of two, the register/shared arrays'
//            size), reading each K and V row once for its gb heads. qsub = g
//            (one query head per block) with AttentionExtras::one_split,
//            else 1.
//            Thread mapping: one 16-byte load covers EPL = 16/sizeof(T)
//            elements of a row; LPR = HD/EPL lanes share a row, a warp reads
//            RPW = 32/LPR rows per load, and a 64-row tile is NL = 64/(8·RPW)
//            loads per lane. The lane's q·scale slice (G × EPL floats) lives
//            in registers.
//            Per tile: all NL K loads and all NL V loads of the lane are
//            issued together (rows past L are not read: zero); g dot
//            products per row, reduced over the LPR lanes by shuffles →
//            shared sc[G][64] (−inf past L); warp j updates head j's running
//            max m and sum l (online softmax), turns sc into p = exp(s − m)
//            and publishes the rescale factor α = exp(m_old − m); each lane
//            then does acc[j][e] = α_j·acc[j][e] + Σ_rows p_j(row)·v(row, e).
//            End: acc summed over the warp's row groups (shuffles) and over
//            the 8 warps (shared memory, 4 heads at a time) → part_o, part_ml.
//   ROPE:    q and the new token's k, v arrive unrotated (the QKV GEMV's
//            output, decode_attention_rope): each block rotates its g query
//            heads while loading them (angles as cpu::rope up to float
//            rounding, rope_angle), and the blocks of the last active split —
//            whose tiles hold position *pos — rotate k and read k and v of
//            that row from shared memory; the first of them per KV head
//            (i = 0) also stores them in cache row *pos. This replaces a
//            separate rope_kv_store launch per layer.
//   One split: when na == 1 (L <= 64·tps, all short contexts) the block
//            divides by l itself, writes out and quantizes the output
//            projection's activation; attn_combine_kernel then only waits
//            (or, with one split in the grid, is not launched).
//            With AttentionExtras::one_split the grid has one split per KV
//            head (its block takes every tile in turn) and the combine is
//            not launched at all (the decode graph of positions < 128);
//            PRE = 2 there (where G·HD <= 1024, G <= 8): the second tile's
//            rows are requested before pdl_wait() with the first's, and the
//            softmax is online per warp (WSM): each warp keeps its own max
//            and sum over its rows in registers (no shared memory or barrier
//            in the tile loop) and the warps' (max, sum, acc) are merged once
//            at the end.
//   Order:   *pos is read, inactive blocks leave, the RoPE angles are
//            computed and the first tile's K/V rows before pos are loaded
//            before pdl_wait() (launch.cuh): *pos is written only by the
//            kernel that ends the previous step, those rows by earlier steps.
//   Align:   cache base pointers 16-byte aligned (cudaMalloc gives 256).
//   Bound:   bandwidth of the K/V reads at long context (2·L·n_head_kv·HD·
//            sizeof(T) bytes per layer); at short context latency: a chain
//            of dependent reads per block (*pos, q, then each tile's K/V past
//            the first — the second too with PRE = 2 — loaded in turn) plus
//            two launches (one with one_split).
//
// attn_combine_kernel<HD>
//   Grid:    one block of 256 threads per query head; reads only the na
//            active splits. M = max_s m_s, w_s = exp(m_s − M) (shared),
//            den = Σ_s w_s·l_s; thread (grp, c) sums w_s·o_s[4c..4c+3] over
//            the splits s ≡ grp (mod 256/(HD/4)) with float4 loads, groups
//            summed in shared memory; out = Σ / den.
//            With na == 1 it waits for the split kernel and leaves.
//   Bound:   latency (reads na·(HD+2) floats per head).
#include "backend/cuda/launch.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

#include <cstdlib>
#include <string>

namespace quern::cuda {
namespace {

using detail::block_max;
using detail::block_sum;
using detail::warp_max;
using detail::warp_sum;

constexpr int kAttnThreads = 256;
constexpr int kNW = kAttnThreads / 32;
constexpr int kTile = 64;
constexpr int kMaxSplits = 128;
constexpr int kCombineThreads = 256;

// 16 bytes of a cache row → floats.
__device__ __forceinline__ void cvt16(const uint4& u, float (&o)[4], const float*) {
    o[0] = __uint_as_float(u.x), o[1] = __uint_as_float(u.y), o[2] = __uint_as_float(u.z), o[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ void cvt16(const uint4& u, float (&o)[8], const __half*) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        __half2 h;
        memcpy(&h, &w[i], 4);
        const float2 f = __half22float2(h);
        o[2 * i] = f.x, o[2 * i + 1] = f.y;
    }
}

__device__ __forceinline__ int clamp_pos(const int32_t* pos_ptr, int n_ctx) {
    const int p = *pos_ptr;
    return p < 0 ? 0 : (p >= n_ctx ? n_ctx - 1 : p);
}

// Where the attention output goes when one split covers the context (the
// split kernel then finishes the job itself): out, and the output
// projection's quantized activation (xq null: none; xq2 null: one level).
struct AttnOut {
    float* out;
    int8_t* xq;
    ActBlockInfo* xinfo;
    int8_t* xq2;
    ActBlockInfo* xinfo2;
};

struct SplitPlan {
    int nt, tps, na;
};
__device__ __forceinline__ SplitPlan split_plan(int L, int n_splits) {
    SplitPlan p;
    p.nt = (L + kTile - 1) / kTile;
    p.tps = (p.nt + n_splits - 1) / n_splits;
    p.na = (p.nt + p.tps - 1) / p.tps;
    return p;
}

// Parameters of the fused RoPE + KV-cache write (attn_split_kernel with ROPE).
struct RopeStore {
    const float* k;         // the new token's keys, n_head_kv × HD floats, not rotated
    const float* v;         // its values
    const float* inv_freq;  // rope_dim/2 floats (cpu::rope_inv_freq)
    int rope_dim;
    int neox;
    AttentionExtras ex;     // biases, q/k norms, window (ops.h)
    bool early = false;     // trigger the successor before the wait (the decode step sets it)
};

// Rotates the g heads of xs (rows of HD floats in shared memory) in place by
// the angle table and multiplies every element by `mul`; each pair belongs to
// one thread. Same arithmetic as rotated().
template <int HD, int NT>
__device__ __forceinline__ void rotate_rows(float* xs, int rows, int rope_dim, int neox, const float* cs,
                                            const float* sn, float mul) {
    const int half = rope_dim / 2;
    for (int idx = static_cast<int>(threadIdx.x); idx < rows * HD; idx += NT) {
        const int j = idx / HD, e = idx % HD;
        float* x = xs + j * HD;
        if (e >= rope_dim) {
            x[e] *= mul;
        } else if (e < half) {
            const int i0 = neox ? e : 2 * e, i1 = neox ? e + half : 2 * e + 1;
            const float a = x[i0], b = x[i1], c = cs[e], sv = sn[e];
            x[i0] = (a * c - b * sv) * mul;
            x[i1] = (a * sv + b * c) * mul;
        }
    }
}

// Per-head RMSNorm in place: rows of HD floats, weight w (HD floats), as
// cpu::rms_norm (mean of squares, eps, then x·scale·w); one warp per row.
template <int HD, int NW>
__device__ __forceinline__ void rms_norm_rows(float* xs, int rows, const float* w, float eps) {
    const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
    for (int j = warp; j < rows; j += NW) {
        float* x = xs + j * HD;
        float ss = 0.0f;
        for (int e = lane; e < HD; e += 32) ss += x[e] * x[e];
        ss = detail::warp_sum(ss);
        const float sc = 1.0f / sqrtf(ss / static_cast<float>(HD) + eps);
        for (int e = lane; e < HD; e += 32) x[e] = x[e] * sc * w[e];
    }
}

// Element e of a head after rotation by the angle table (cs, sn); x: the
// head's HD unrotated floats. As cpu::rope: pairs (2i, 2i+1) or, neox,
// (i, i + rope_dim/2) for i < rope_dim/2; elements past rope_dim pass through.
__device__ __forceinline__ float rotated(const float* x, int e, int rope_dim, int neox, const float* cs,
                                         const float* sn) {
    if (e >= rope_dim) return x[e];
    const int half = rope_dim / 2;
    int i, i0, i1;
    if (neox) {
        i = e < half ? e : e - half;
        i0 = i, i1 = i + half;
    } else {
        i = e >> 1;
        i0 = 2 * i, i1 = 2 * i + 1;
    }
    const float a = x[i0], b = x[i1], c = cs[i], s = sn[i];
    return e == i0 ? a * c - b * s : a * s + b * c;
}

// rope_angle: ops_common.cuh (shared with the prefill kernels).
using detail::rope_angle;

template <int HD, class T, int G, bool ROPE, int PRE, bool WSM = false>
__global__ void __launch_bounds__(kAttnThreads) attn_split_kernel(const float* __restrict__ q,
                                                                  T* __restrict__ kc, T* __restrict__ vc,
                                                                  const RopeStore rope,
                                                                  const int32_t* __restrict__ pos_ptr, int n_ctx,
                                                                  int n_head_kv, int g, int qsub, float scale,
                                                                  int n_splits, float* __restrict__ part_o,
                                                                  float* __restrict__ part_ml,
                                                                  float* __restrict__ out, int8_t* __restrict__ xq,
                                                                  ActBlockInfo* __restrict__ xinfo,
                                                                  int8_t* __restrict__ xq2,
                                                                  ActBlockInfo* __restrict__ xinfo2) {
    constexpr int EPL = 16 / static_cast<int>(sizeof(T));
    // Lanes per key row: the row's HD / EPL vectors, rounded up to a power
    // of two (heads of 96: 12 of 16 lanes hold data, the rest add zeros).
    constexpr int LPD = HD / EPL;
    constexpr int LPR = LPD <= 4 ? 4 : LPD <= 8 ? 8 : LPD <= 16 ? 16 : 32;
    constexpr int RPW = 32 / LPR;
    static_assert(HD % EPL == 0 && LPD <= 32);
    constexpr int NL = kTile / (kNW * RPW);
    constexpr int GB = G < 4 ? G : (HD >= 256 ? 2 : 4);  // heads per pass of the final reduction
    static_assert(NL >= 1 && kTile % (kNW * RPW) == 0);
    __shared__ float qs[G][HD];
    __shared__ float sc[G][kTile];
    __shared__ float st_m[G], st_l[G], st_a[G];
    __shared__ float red[kNW][GB][HD];
    __shared__ float cs[ROPE ? HD / 2 : 1], sn[ROPE ? HD / 2 : 1];
    __shared__ __align__(16) T kn[ROPE ? HD : EPL], vn[ROPE ? HD : EPL];
    __shared__ float kraw[ROPE ? HD : 1];

    // The decode position is written only by the step's last kernel
    // (advance_decode_position), which has completed before this launch
    // (launch.cuh: a kernel starts after its predecessor's predecessor has
    // completed), so it is read before pdl_wait(); blocks of inactive splits
    // leave without waiting (the active ones keep the launch ordered).
    const int L = clamp_pos(pos_ptr, n_ctx) + 1;
    const SplitPlan plan = split_plan(L, n_splits);
    const int s = blockIdx.x, hk = blockIdx.y / qsub, sub = blockIdx.y % qsub;
    if (s >= plan.na) return;
    // Sliding window: keys lo..pos only; tiles wholly before lo are skipped
    // (the first tile processed holds lo, so every processed tile has a key).
    const int window = ROPE ? rope.ex.window : 0;
    const int lo = window > 0 ? max(0, L - window) : 0;
    const int tile1 = min(plan.nt, s * plan.tps + plan.tps);
    const int tile0 = max(s * plan.tps, lo / kTile);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int h0 = (hk * qsub + sub) * g;
    const int pos = L - 1;
    const int64_t rs = static_cast<int64_t>(n_head_kv) * HD;  // cache row stride (elements)
    // The cache row of position p: p, or through the block table of a paged
    // cache (AttentionExtras::block_table; written before the launch).
    const int32_t* const tbl = ROPE ? rope.ex.block_table : nullptr;
    const int bsh = ROPE ? rope.ex.block_shift : 0;
    const auto cache_row = [&](int p) -> int64_t {
        if (!tbl) return p;
        return (static_cast<int64_t>(__ldg(tbl + (p >> bsh))) << bsh) | (p & ((1 << bsh) - 1));
    };
    // With ROPE, the split holding position pos (the last active one) stores
    // the new token's rotated K and its V in row pos, and reads that row from
    // shared memory below.
    const bool owns_new = ROPE && s == plan.na - 1;
    const int cl = lane % LPR;          // column group of the lane: elements cl·EPL ..
    const int rsub = lane / LPR;        // row within the warp's RPW rows
    const bool on = cl < LPD;           // the lane holds a vector of the row
    const int64_t col = static_cast<int64_t>(hk) * HD + cl * EPL;
    // K and V rows of a tile. Rows before pos were written by earlier steps
    // and are read-only for the whole step, so the first tile's are loaded
    // before pdl_wait(), overlapping the QKV projection's tail; row pos (this
    // launch's store with ROPE, the predecessor's without) after it.
    // PRE = 2 (one split per KV head at short context): the second tile's
    // rows too, so a two-tile context waits for memory once.
    uint4 kr[NL], vr[NL], kr2[PRE == 2 ? NL : 1], vr2[PRE == 2 ? NL : 1];
    const auto load_rows = [&](int t0, int n, uint4* kd, uint4* vd) {
#pragma unroll
        for (int u = 0; u < NL; ++u) {
            const int row = (u * kNW + warp) * RPW + rsub;
            if (on && row < n && t0 + row < pos && t0 + row >= lo) {
                const int64_t off = cache_row(t0 + row) * rs + col;
                kd[u] = __ldg(reinterpret_cast<const uint4*>(kc + off));
                vd[u] = __ldg(reinterpret_cast<const uint4*>(vc + off));
            } else {
                kd[u] = vd[u] = make_uint4(0u, 0u, 0u, 0u);
            }
        }
    };
    if (tile0 < tile1) load_rows(tile0 * kTile, min(kTile, L - tile0 * kTile), kr, vr);
    if constexpr (PRE == 2)
        if (tile0 + 1 < tile1) load_rows((tile0 + 1) * kTile, min(kTile, L - (tile0 + 1) * kTile), kr2, vr2);
    if constexpr (ROPE) {
        // The angles depend on pos and the constant inv_freq only: computed
        // while the QKV projection finishes.
        for (int i = tid; i < rope.rope_dim / 2; i += kAttnThreads) rope_angle(pos, rope.inv_freq[i], &cs[i], &sn[i]);
        pdl_wait_trigger(rope.early);
        __syncthreads();
        const AttentionExtras& ex = rope.ex;
        if (ex.q_bias || ex.q_norm) {
            // Staged: q (+ bias) and the new k (+ bias) into shared memory,
            // per-head RMSNorm, then rotation in place (cpu order: bias, norm, RoPE).
            for (int idx = tid; idx < G * HD; idx += kAttnThreads) {
                const int j = idx / HD;
                const int64_t gi = static_cast<int64_t>(h0) * HD + idx;
                qs[j][idx % HD] = j < g ? q[gi] + (ex.q_bias ? ex.q_bias[gi] : 0.0f) : 0.0f;
            }
            if (owns_new)
                for (int e = tid; e < HD; e += kAttnThreads) {
                    const int64_t gi = static_cast<int64_t>(hk) * HD + e;
                    kraw[e] = rope.k[gi] + (ex.k_bias ? ex.k_bias[gi] : 0.0f);
                }
            __syncthreads();
            if (ex.q_norm) {
                rms_norm_rows<HD, kNW>(&qs[0][0], g, ex.q_norm, ex.norm_eps);
                if (owns_new && warp == kNW - 1) {  // a warp the q rows leave idle when g < kNW
                    float ss = 0.0f;
                    for (int e = lane; e < HD; e += 32) ss += kraw[e] * kraw[e];
                    ss = detail::warp_sum(ss);
                    const float sck = 1.0f / sqrtf(ss / static_cast<float>(HD) + ex.norm_eps);
                    for (int e = lane; e < HD; e += 32) kraw[e] = kraw[e] * sck * ex.k_norm[e];
                }
                __syncthreads();
            }
            rotate_rows<HD, kAttnThreads>(&qs[0][0], g, rope.rope_dim, rope.neox, cs, sn, scale);
            if (owns_new) rotate_rows<HD, kAttnThreads>(kraw, 1, rope.rope_dim, rope.neox, cs, sn, 1.0f);
            __syncthreads();
        } else {
            for (int idx = tid; idx < G * HD; idx += kAttnThreads) {
                const int j = idx / HD, e = idx % HD;
                qs[j][e] = j < g ? rotated(q + static_cast<int64_t>(h0 + j) * HD, e, rope.rope_dim, rope.neox, cs, sn) *
                                       scale
                                 : 0.0f;
            }
            if (owns_new)
                for (int e = tid; e < HD; e += kAttnThreads)
                    kraw[e] = rotated(rope.k + static_cast<int64_t>(hk) * HD, e, rope.rope_dim, rope.neox, cs, sn);
        }
        if (owns_new) {
            for (int e = tid; e < HD; e += kAttnThreads) {
                const int64_t gi = static_cast<int64_t>(hk) * HD + e;
                const T kt = detail::from_f32<T>(kraw[e]);
                const T vt = detail::from_f32<T>(rope.v[gi] + (rope.ex.v_bias ? rope.ex.v_bias[gi] : 0.0f));
                const int64_t off = cache_row(pos) * rs + static_cast<int64_t>(hk) * HD + e;
                if (sub == 0) {  // one block of the KV head stores the row
                    kc[off] = kt;
                    vc[off] = vt;
                }
                kn[e] = kt;
                vn[e] = vt;
            }
        }
    } else {
        pdl_wait();
        pdl_trigger();
        for (int idx = tid; idx < G * HD; idx += kAttnThreads)
            qs[idx / HD][idx % HD] = idx < g * HD ? q[static_cast<int64_t>(h0) * HD + idx] * scale : 0.0f;
    }
    if (tid < G) st_m[tid] = -INFINITY, st_l[tid] = 0.0f;
    __syncthreads();

    float qr[G][EPL];
#pragma unroll
    for (int j = 0; j < G; ++j)
#pragma unroll
        for (int e = 0; e < EPL; ++e) qr[j][e] = on ? qs[j][cl * EPL + e] : 0.0f;
    float acc[G][EPL];
#pragma unroll
    for (int j = 0; j < G; ++j)
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[j][e] = 0.0f;
    // q·k of head j for the row whose EPL elements this lane holds, summed
    // over the row's LPR lanes (every one of them gets the score).
    const auto row_score = [&](const float (&kf)[EPL], int j) {
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) d = fmaf(qr[j][e], kf[e], d);
#pragma unroll
        for (int off = LPR / 2; off > 0; off >>= 1) d += __shfl_xor_sync(0xFFFFFFFFu, d, off);
        return d;
    };
    // WSM: the warp's running max and sum per head (the same in every lane).
    float wm[G], wl[G];
#pragma unroll
    for (int j = 0; j < G; ++j) wm[j] = -INFINITY, wl[j] = 0.0f;

    for (int tile = tile0; tile < tile1; ++tile) {
        const int t0 = tile * kTile;
        const int n = min(kTile, L - t0);
        if (tile != tile0) {
            if (PRE == 2 && tile == tile0 + 1) {
#pragma unroll
                for (int u = 0; u < NL; ++u) kr[u] = kr2[u], vr[u] = vr2[u];
            } else {
                load_rows(t0, n, kr, vr);
            }
        }
#pragma unroll
        for (int u = 0; u < NL; ++u) {
            const int row = (u * kNW + warp) * RPW + rsub;
            if (on && t0 + row == pos) {
                if constexpr (ROPE) {  // written above by this block (the owner of pos)
                    kr[u] = *reinterpret_cast<const uint4*>(&kn[cl * EPL]);
                    vr[u] = *reinterpret_cast<const uint4*>(&vn[cl * EPL]);
                } else {
                    const int64_t off = static_cast<int64_t>(pos) * rs + col;
                    kr[u] = __ldg(reinterpret_cast<const uint4*>(kc + off));
                    vr[u] = __ldg(reinterpret_cast<const uint4*>(vc + off));
                }
            }
        }
        if constexpr (WSM) {
            // Online softmax per warp over the warp's own rows, in registers:
            // no shared memory and no barrier inside the tile loop.
            float sw[NL][G];
#pragma unroll
            for (int u = 0; u < NL; ++u) {
                const int row = (u * kNW + warp) * RPW + rsub;
                float kf[EPL];
                cvt16(kr[u], kf, static_cast<const T*>(nullptr));
                const bool valid = row < n && t0 + row >= lo;
#pragma unroll
                for (int j = 0; j < G; ++j) {
                    float d = row_score(kf, j);
                    if (ROPE && rope.ex.softcap > 0.0f) d = rope.ex.softcap * tanhf(d / rope.ex.softcap);
                    sw[u][j] = valid ? d : -INFINITY;
                }
            }
#pragma unroll
            for (int j = 0; j < G; ++j) {
                float mt = sw[0][j];
#pragma unroll
                for (int u = 1; u < NL; ++u) mt = fmaxf(mt, sw[u][j]);
#pragma unroll
                for (int off = LPR; off < 32; off <<= 1) mt = fmaxf(mt, __shfl_xor_sync(0xFFFFFFFFu, mt, off));
                const float mn = fmaxf(wm[j], mt);
                const float a = mn == -INFINITY ? 1.0f : expf(wm[j] - mn);
                float lt = 0.0f;
#pragma unroll
                for (int u = 0; u < NL; ++u) {
                    sw[u][j] = sw[u][j] == -INFINITY ? 0.0f : expf(sw[u][j] - mn);
                    lt += sw[u][j];
                }
#pragma unroll
                for (int off = LPR; off < 32; off <<= 1) lt += __shfl_xor_sync(0xFFFFFFFFu, lt, off);
                wl[j] = wl[j] * a + lt;
                wm[j] = mn;
#pragma unroll
                for (int e = 0; e < EPL; ++e) acc[j][e] *= a;
            }
#pragma unroll
            for (int u = 0; u < NL; ++u) {
                float vf[EPL];
                cvt16(vr[u], vf, static_cast<const T*>(nullptr));
#pragma unroll
                for (int j = 0; j < G; ++j)
#pragma unroll
                    for (int e = 0; e < EPL; ++e) acc[j][e] = fmaf(sw[u][j], vf[e], acc[j][e]);
            }
        } else {
            // ---- scores
#pragma unroll
            for (int u = 0; u < NL; ++u) {
                const int row = (u * kNW + warp) * RPW + rsub;
                float kf[EPL];
                cvt16(kr[u], kf, static_cast<const T*>(nullptr));
#pragma unroll
                for (int j = 0; j < G; ++j) {
                    const float d = row_score(kf, j);
                    if (cl == 0) sc[j][row] = row < n && t0 + row >= lo ? d : -INFINITY;
                }
            }
            __syncthreads();
            // ---- online softmax statistics, one warp per head
            for (int j = warp; j < g; j += kNW) {
                float s0 = sc[j][lane], s1 = sc[j][lane + 32];
                if (ROPE && rope.ex.softcap > 0.0f) {  // soft-cap: s -> cap·tanh(s/cap); masked scores stay −inf
                    const float cap = rope.ex.softcap;
                    if (s0 > -INFINITY) s0 = cap * tanhf(s0 / cap);
                    if (s1 > -INFINITY) s1 = cap * tanhf(s1 / cap);
                }
                const float mt = warp_max(fmaxf(s0, s1));
                const float mo = st_m[j];
                const float mn = fmaxf(mo, mt);
                const float p0 = expf(s0 - mn), p1 = expf(s1 - mn);
                sc[j][lane] = p0;
                sc[j][lane + 32] = p1;
                const float lt = warp_sum(p0 + p1);
                if (lane == 0) {
                    const float a = expf(mo - mn);  // 0 on the first tile (mo = −inf)
                    st_a[j] = a;
                    st_m[j] = mn;
                    st_l[j] = st_l[j] * a + lt;
                }
            }
            __syncthreads();
            // ---- p · V
#pragma unroll
            for (int j = 0; j < G; ++j) {
                const float a = j < g ? st_a[j] : 0.0f;
#pragma unroll
                for (int e = 0; e < EPL; ++e) acc[j][e] *= a;
            }
#pragma unroll
            for (int u = 0; u < NL; ++u) {
                const int row = (u * kNW + warp) * RPW + rsub;
                float vf[EPL];
                cvt16(vr[u], vf, static_cast<const T*>(nullptr));
#pragma unroll
                for (int j = 0; j < G; ++j) {
                    const float p = j < g ? sc[j][row] : 0.0f;  // rows past L: p = 0 and v = 0
#pragma unroll
                    for (int e = 0; e < EPL; ++e) acc[j][e] = fmaf(p, vf[e], acc[j][e]);
                }
            }
            __syncthreads();  // sc and st_a are rewritten by the next tile
        }
    }
    // ---- reduce acc over the warp's row groups, then over the warps
#pragma unroll
    for (int j = 0; j < G; ++j)
#pragma unroll
        for (int e = 0; e < EPL; ++e)
#pragma unroll
            for (int off = LPR; off < 32; off <<= 1) acc[j][e] += __shfl_xor_sync(0xFFFFFFFFu, acc[j][e], off);
    if constexpr (WSM) {
        // The warps' (max, sum) pairs → the block's M and L per head (st_m,
        // st_l, as the shared-memory path leaves them); each warp's acc is
        // rescaled by exp(m_w − M) before the sum over warps below.
        __shared__ float w_m[kNW][G], w_l[kNW][G];
        if (lane == 0)
#pragma unroll
            for (int j = 0; j < G; ++j) w_m[warp][j] = wm[j], w_l[warp][j] = wl[j];
        __syncthreads();
#pragma unroll
        for (int j = 0; j < G; ++j) {
            float M = w_m[0][j];
#pragma unroll
            for (int w = 1; w < kNW; ++w) M = fmaxf(M, w_m[w][j]);
            const float f = wm[j] == -INFINITY ? 0.0f : expf(wm[j] - M);
#pragma unroll
            for (int e = 0; e < EPL; ++e) acc[j][e] *= f;
            if (tid == j) {
                float Ls = 0.0f;
#pragma unroll
                for (int w = 0; w < kNW; ++w) Ls += w_m[w][j] == -INFINITY ? 0.0f : w_l[w][j] * expf(w_m[w][j] - M);
                st_m[j] = M;
                st_l[j] = Ls;
            }
        }
    }
#pragma unroll
    for (int jb = 0; jb < G; jb += GB) {
        if (jb >= g) break;  // uniform
        if (rsub == 0 && on) {
#pragma unroll
            for (int jj = 0; jj < GB; ++jj)
#pragma unroll
                for (int e = 0; e < EPL; ++e) red[warp][jj][cl * EPL + e] = acc[jb + jj][e];
        }
        __syncthreads();
        for (int idx = tid; idx < GB * HD; idx += kAttnThreads) {
            const int jj = idx / HD, d = idx % HD;  // a warp's 32 idx share jj (HD % 32 == 0)
            if (jb + jj < g) {
                float o = 0.0f;
#pragma unroll
                for (int w = 0; w < kNW; ++w) o += red[w][jj][d];
                const int hq = h0 + jb + jj;
                if (plan.na == 1) {
                    // One active split: the combine step's arithmetic here
                    // (its weight is exp(0) = 1), and the output projection's
                    // activation quantized by this warp's 32 elements.
                    const float v = o / st_l[jb + jj];
                    out[static_cast<int64_t>(hq) * HD + d] = v;
                    if (xq)
                        detail::quantize_block_q8_1_l2(v, lane, (static_cast<int64_t>(hq) * HD + d) / 32, xq, xinfo,
                                                       xq2, xinfo2, static_cast<int64_t>(n_head_kv) * qsub * g * HD / 2);
                } else {
                    const int64_t slot = static_cast<int64_t>(hq) * n_splits + s;
                    part_o[slot * HD + d] = o;
                }
            }
        }
        __syncthreads();
    }
    if (tid < g && plan.na > 1) {
        const int64_t slot = static_cast<int64_t>(h0 + tid) * n_splits + s;
        part_ml[2 * slot] = st_m[tid];
        part_ml[2 * slot + 1] = st_l[tid];
    }
}

template <int HD>
__global__ void __launch_bounds__(kCombineThreads) attn_combine_kernel(const float* __restrict__ part_o,
                                                                       const float* __restrict__ part_ml,
                                                                       const int32_t* __restrict__ pos_ptr,
                                                                       int n_ctx, int n_splits,
                                                                       float* __restrict__ out,
                                                                       int8_t* __restrict__ xq,
                                                                       ActBlockInfo* __restrict__ xinfo,
                                                                       int8_t* __restrict__ xq2,
                                                                       ActBlockInfo* __restrict__ xinfo2, bool early) {
    constexpr int C4 = HD / 4;                       // float4 columns
    constexpr int NG = kCombineThreads / C4;         // split groups
    __shared__ float wsh[kMaxSplits];
    __shared__ float red[32];
    __shared__ float4 osum[NG][C4];
    const int h = blockIdx.x, tid = threadIdx.x;
    const int L = clamp_pos(pos_ptr, n_ctx) + 1;  // before the wait: see attn_split_kernel
    const int na = split_plan(L, n_splits).na;
    pdl_wait_trigger(early);
    if (na == 1) return;  // the split kernel wrote the output (after the wait: keeps the launches ordered)
    const float* ml = part_ml + static_cast<int64_t>(h) * n_splits * 2;
    const float ms = tid < na ? ml[2 * tid] : -INFINITY;  // na <= kMaxSplits <= kCombineThreads
    const float ls = tid < na ? ml[2 * tid + 1] : 0.0f;
    const float M = block_max(ms, red);
    const float w = tid < na ? expf(ms - M) : 0.0f;
    if (tid < kMaxSplits) wsh[tid] = w;
    const float den = block_sum(w * ls, red);  // its barriers also publish wsh
    const int grp = tid / C4, c = tid % C4;  // threads past NG·C4 (heads of 96) idle
    const float4* po = reinterpret_cast<const float4*>(part_o + static_cast<int64_t>(h) * n_splits * HD);
    float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (grp < NG) {
#pragma unroll 4
        for (int s = grp; s < na; s += NG) {
            const float4 o = po[static_cast<int64_t>(s) * C4 + c];
            const float ws = wsh[s];
            a.x = fmaf(ws, o.x, a.x), a.y = fmaf(ws, o.y, a.y), a.z = fmaf(ws, o.z, a.z), a.w = fmaf(ws, o.w, a.w);
        }
        osum[grp][c] = a;
    }
    __syncthreads();
    if (tid < HD) {
        const float* os = reinterpret_cast<const float*>(&osum[0][0]);
        float r = 0.0f;
#pragma unroll
        for (int gi = 0; gi < NG; ++gi) r += os[gi * HD + tid];
        const float v = r / den;
        out[static_cast<int64_t>(h) * HD + tid] = v;
        // Fused activation quantization for the output projection: warp w of
        // the first HD threads holds Q8_1 block h·HD/32 + w of the row.
        if (xq)
            detail::quantize_block_q8_1_l2(v, tid & 31, static_cast<int64_t>(h) * (HD / 32) + (tid >> 5), xq, xinfo,
                                           xq2, xinfo2, static_cast<int64_t>(gridDim.x) * HD / 2);
    }
}

int n_splits_for(int n_ctx) {
    const int tiles = (n_ctx + kTile - 1) / kTile;
    return tiles < kMaxSplits ? tiles : kMaxSplits;
}

template <int HD, class T, int G, bool ROPE>
void launch_split(const float* q, void* kc, void* vc, const RopeStore& rope, const int32_t* pos, int n_ctx,
                  int n_head_kv, int g, int qsub, float scale, int n_splits, float* po, float* pml, const AttnOut& out,
                  cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned>(n_splits), static_cast<unsigned>(n_head_kv * qsub));
    // PRE = 2 where the second tile's registers fit without spilling (ptxas:
    // up to 8 query heads per block and 1024 query elements).
    // With one split (the short-context graph) also the per-warp online
    // softmax (WSM): no barrier inside the tile loop. With many splits the
    // shared-memory form is faster (WSM computes each exp in all LPR lanes
    // of a row: Llama-3-8B at depth 4096 392 against 475 tok/s).
    auto kernel = attn_split_kernel<HD, T, G, ROPE, 1>;
    if constexpr (ROPE && G <= 8 && G * HD <= 1024)
        if (n_splits == 1) kernel = attn_split_kernel<HD, T, G, ROPE, 2, true>;
    launch_pdl(kernel, grid, dim3(kAttnThreads), 0, stream, q, static_cast<T*>(kc),
               static_cast<T*>(vc), rope, pos, n_ctx, n_head_kv, g, qsub, scale, n_splits, po, pml, out.out, out.xq,
               out.xinfo, out.xq2, out.xinfo2);
}

template <int HD, class T, bool ROPE>
void dispatch_g(const float* q, void* kc, void* vc, const RopeStore& rope, const int32_t* pos, int n_ctx,
                int n_head_kv, int g, int qsub, float scale, int n_splits, float* po, float* pml, const AttnOut& out,
                cudaStream_t stream) {
    if (g <= 1)
        launch_split<HD, T, 1, ROPE>(q, kc, vc, rope, pos, n_ctx, n_head_kv, g, qsub, scale, n_splits, po, pml, out, stream);
    else if (g <= 2)
        launch_split<HD, T, 2, ROPE>(q, kc, vc, rope, pos, n_ctx, n_head_kv, g, qsub, scale, n_splits, po, pml, out, stream);
    else if (g <= 4)
        launch_split<HD, T, 4, ROPE>(q, kc, vc, rope, pos, n_ctx, n_head_kv, g, qsub, scale, n_splits, po, pml, out, stream);
    else if (g <= 8)
        launch_split<HD, T, 8, ROPE>(q, kc, vc, rope, pos, n_ctx, n_head_kv, g, qsub, scale, n_splits, po, pml, out, stream);
    else
        launch_split<HD, T, 16, ROPE>(q, kc, vc, rope, pos, n_ctx, n_head_kv, g, qsub, scale, n_splits, po, pml, out, stream);
}

template <bool ROPE>
void attention_impl(const float* q, void* k_cache, void* v_cache, const RopeStore& rope, KvType kv_type,
                    const int32_t* pos, int n_ctx, int n_head, int n_head_kv, int head_dim, float scale,
                    void* scratch, float* out, cudaStream_t stream, int8_t* xq, ActBlockInfo* xinfo, int8_t* xq2,
                    ActBlockInfo* xinfo2, const char* fn) {
    const std::string f(fn);
    if ((xq == nullptr) != (xinfo == nullptr) || (xq2 == nullptr) != (xinfo2 == nullptr) || (xq2 && !xq))
        throw_error(f + ": give xq with xinfo (and xq2 with xinfo2, only with xq)");
    if (head_dim != 32 && head_dim != 64 && head_dim != 96 && head_dim != 128 && head_dim != 256)
        throw_error(f + ": head_dim must be 32, 64, 96, 128 or 256");
    if (head_dim == 256 && kv_type != KvType::F16) throw_error(f + ": head_dim 256 needs an f16 KV cache");
    if ((rope.ex.q_bias == nullptr) != (rope.ex.k_bias == nullptr) ||
        (rope.ex.q_bias == nullptr) != (rope.ex.v_bias == nullptr) ||
        (rope.ex.q_norm == nullptr) != (rope.ex.k_norm == nullptr) || rope.ex.window < 0 || rope.ex.softcap < 0.0f)
        throw_error(f + ": give all three biases or none, both norms or neither, and a window >= 0");
    if (n_ctx < 1 || n_head_kv < 1 || n_head < n_head_kv || n_head % n_head_kv != 0 || n_head / n_head_kv > 16)
        throw_error(f + ": need n_ctx >= 1 and n_head a multiple of n_head_kv, at most 16 times it");
    if (!q || !k_cache || !v_cache || !pos || !scratch || !out) throw_error(f + ": null pointer");
    if (reinterpret_cast<uintptr_t>(k_cache) % 16 != 0 || reinterpret_cast<uintptr_t>(v_cache) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(scratch) % 16 != 0)
        throw_error(f + ": caches and scratch must be 16-byte aligned");
    const int g = n_head / n_head_kv;
    // Blocks per KV head: with one split per KV head (the short-context
    // graph) one per query head, so the g heads' chains of dependent steps
    // run side by side (Llama-3-8B at positions < 128: +3% tok/s); with many
    // splits one (every block rereading the K/V rows g times costs more at
    // long context).
    const int qsub = rope.ex.one_split ? g : 1;
    const int gb = g / qsub;
    const int n_splits = rope.ex.one_split ? 1 : n_splits_for(n_ctx);
    float* po = static_cast<float*>(scratch);
    float* pml = po + static_cast<size_t>(n_head) * static_cast<size_t>(n_splits) * static_cast<size_t>(head_dim);
    const bool f16 = kv_type == KvType::F16;
    const AttnOut ao{out, xq, xinfo, xq2, xinfo2};
    switch (head_dim) {
        case 32:
            if (f16) dispatch_g<32, __half, ROPE>(q, k_cache, v_cache, rope, pos, n_ctx, n_head_kv, gb, qsub, scale, n_splits, po, pml, ao, stream);
            else dispatch_g<32, float, ROPE>(q, k_cache, v_cache, rope, pos, n_ctx, n_head_kv, gb, qsub, scale, n_splits, po, pml, ao, stream);
            break;
        case 64:
            if (f16) dispatch_g<64, __half, ROPE>(q, k_cache, v_cache, rope, pos, n_ctx, n_head_kv, gb, qsub, scale, n_splits, po, pml, ao, stream);
            else dispatch_g<64, float, ROPE>(q, k_cache, v_cache, rope, pos, n_ctx, n_head_kv, gb, qsub, scale, n_splits, po, pml, ao, stream);
            break;
        case 96:
            if (f16) dispatch_g<96, __half, ROPE>(q, k_cache, v_cache, rope, pos, n_ctx, n_head_kv, gb, qsub, scale, n_splits, po, pml, ao, stream);
            else dispatch_g<96, float, ROPE>(q, k_cache, v_cache, rope, pos, n_ctx, n_head_kv, gb, qsub, scale, n_splits, po, pml, ao, stream);
            break;
        case 128:
            if (f16) dispatch_g<128, __half, ROPE>(q, k_cache, v_cache, rope, pos, n_ctx, n_head_kv, gb, qsub, scale, n_splits, po, pml, ao, stream);
            else dispatch_g<128, float, ROPE>(q, k_cache, v_cache, rope, pos, n_ctx, n_head_kv, gb, qsub, scale, n_splits, po, pml, ao, stream);
            break;
        default:  // 256, f16 (checked above)
            dispatch_g<256, __half, ROPE>(q, k_cache, v_cache, rope, pos, n_ctx, n_head_kv, gb, qsub, scale, n_splits, po, pml, ao, stream);
            break;
    }
    QUERN_CUDA_CHECK_LAUNCH();
    if (n_splits == 1) return;  // one split: the split kernel wrote the output
    const dim3 cgrid(static_cast<unsigned>(n_head)), cblock(kCombineThreads);
    const bool ce = true;  // the combine triggers its successor before its wait (launch.cuh)
    switch (head_dim) {
        case 32: launch_pdl(attn_combine_kernel<32>, cgrid, cblock, 0, stream, po, pml, pos, n_ctx, n_splits, out, xq, xinfo, xq2, xinfo2, ce); break;
        case 64: launch_pdl(attn_combine_kernel<64>, cgrid, cblock, 0, stream, po, pml, pos, n_ctx, n_splits, out, xq, xinfo, xq2, xinfo2, ce); break;
        case 96: launch_pdl(attn_combine_kernel<96>, cgrid, cblock, 0, stream, po, pml, pos, n_ctx, n_splits, out, xq, xinfo, xq2, xinfo2, ce); break;
        case 128: launch_pdl(attn_combine_kernel<128>, cgrid, cblock, 0, stream, po, pml, pos, n_ctx, n_splits, out, xq, xinfo, xq2, xinfo2, ce); break;
        default: launch_pdl(attn_combine_kernel<256>, cgrid, cblock, 0, stream, po, pml, pos, n_ctx, n_splits, out, xq, xinfo, xq2, xinfo2, ce); break;
    }
    QUERN_CUDA_CHECK_LAUNCH();
}

}  // namespace

size_t decode_attention_scratch_bytes(int n_ctx, int n_head, int head_dim) {
    return static_cast<size_t>(n_head) * static_cast<size_t>(n_splits_for(n_ctx)) *
           static_cast<size_t>(head_dim + 2) * sizeof(float);
}

void decode_attention(const float* q, const void* k_cache, const void* v_cache, KvType kv_type, const int32_t* pos,
                      int n_ctx, int n_head, int n_head_kv, int head_dim, float scale, void* scratch, float* out,
                      cudaStream_t stream, int8_t* xq, ActBlockInfo* xinfo, int8_t* xq2, ActBlockInfo* xinfo2) {
    attention_impl<false>(q, const_cast<void*>(k_cache), const_cast<void*>(v_cache), RopeStore{}, kv_type, pos, n_ctx,
                          n_head, n_head_kv, head_dim, scale, scratch, out, stream, xq, xinfo, xq2, xinfo2,
                          "decode_attention");
}

void decode_attention_rope(const float* q, const float* k, const float* v, void* k_cache, void* v_cache,
                           KvType kv_type, const int32_t* pos, int n_ctx, int n_head, int n_head_kv, int head_dim,
                           const float* inv_freq, int rope_dim, bool neox, float scale, void* scratch, float* out,
                           cudaStream_t stream, int8_t* xq, ActBlockInfo* xinfo, int8_t* xq2, ActBlockInfo* xinfo2,
                           const AttentionExtras& ex) {
    if (!k || !v || (rope_dim > 0 && !inv_freq)) throw_error("decode_attention_rope: null pointer");
    if (rope_dim < 0 || rope_dim % 2 != 0 || rope_dim > head_dim)
        throw_error("decode_attention_rope: rope_dim must be even and at most head_dim");
    if (ex.block_shift < 0 || ex.block_shift > 24)
        throw_error("decode_attention_rope: block_shift must be in [0, 24] (blocks of 1 to 2^24 positions)");
    attention_impl<true>(q, k_cache, v_cache, RopeStore{k, v, inv_freq, rope_dim, neox ? 1 : 0, ex, true}, kv_type, pos, n_ctx,
                         n_head, n_head_kv, head_dim, scale, scratch, out, stream, xq, xinfo, xq2, xinfo2,
                         "decode_attention_rope");
}

}  // namespace quern::cuda
