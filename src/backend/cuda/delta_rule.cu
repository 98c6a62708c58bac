// Gated DeltaNet kernels (delta_rule.h). Launched with PDL (launch.cuh):
// each waits for its predecessor before it reads anything, so a decode
// step's conv and recurrence launch while the GEMV before them drains.
#include "backend/cuda/context.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/delta_rule.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/tuning.h"

#include <algorithm>
#include <cstdint>
#include <string>

namespace quern::cuda {

namespace {

/// The sequence of row r: the last s with row0[s] <= r (rows back to back).
__device__ int seq_of_row(const int32_t* row0, int n_seqs, int r) {
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (row0[mid] <= r) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/// One block per (row, head slot): slots [0, n_k) are q heads, [n_k, 2 n_k)
/// k heads, then the v heads; one thread per channel of the head. With
/// `shift` (every sequence has one row: a decode step) the thread that read
/// a channel's conv state also moves it on by the row, saving
/// delta_conv_state_kernel's launch.
__global__ void delta_conv_kernel(const float* __restrict__ x, float* __restrict__ xc, DeltaSeqs seqs, DeltaLayer L,
                                  int64_t C, bool shift) {
    pdl_wait();
    pdl_trigger();
    const int r = blockIdx.x, slot = blockIdx.y, t = threadIdx.x;
    const int nk = L.n_k_heads;
    const bool qk = slot < 2 * nk;
    const int width = qk ? L.head_k : L.head_v;
    const int64_t c0 = qk ? int64_t{slot} * L.head_k : 2 * int64_t{nk} * L.head_k + int64_t{slot - 2 * nk} * L.head_v;
    const int s = seq_of_row(seqs.row0, seqs.n_seqs, r);
    const int j = r - seqs.row0[s];  // the row's place in its sequence's rows of this pass
    const float* state = seqs.state[s];  // (shift: written below by this thread only)
    const int K = L.conv_kernel;
    float v = 0.0f;
    if (t < width) {
        const int64_t c = c0 + t;
        float acc = 0.0f;
        for (int tap = 0; tap < K; ++tap) {
            const int p = j - (K - 1) + tap;  // < 0: the conv state's row K - 1 + p
            const float in = p >= 0 ? x[(int64_t{seqs.row0[s]} + p) * C + c] : state[int64_t{K - 1 + p} * C + c];
            acc += in * L.conv[c * K + tap];
        }
        v = acc / (1.0f + expf(-acc));
        if (seqs.snap && j < seqs.n_rows[s] - 1) {  // the conv state after this row: rows j − K + 2 .. j
            float* snap = seqs.snap[s] + int64_t{j} * seqs.snap_stride;
            for (int i = 0; i < K - 1; ++i) {
                const int p = j - (K - 2) + i;
                snap[int64_t{i} * C + c] = p >= 0 ? x[(int64_t{seqs.row0[s]} + p) * C + c] : state[int64_t{K - 1 + p} * C + c];
            }
        }
        if (shift) {
            float* st = seqs.state[s];
            for (int i = 0; i < K - 2; ++i) st[int64_t{i} * C + c] = st[int64_t{i + 1} * C + c];
            st[int64_t{K - 2} * C + c] = x[int64_t{r} * C + c];
        }
    }
    if (qk) {
        __shared__ float part[32];
        float ss = v * v;
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if ((t & 31) == 0) part[t >> 5] = ss;
        __syncthreads();
        if (t < 32) {
            float w = t < (blockDim.x + 31) / 32 ? part[t] : 0.0f;
            for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
            if (t == 0) part[0] = w;
        }
        __syncthreads();
        const float scale = slot < nk ? rsqrtf(static_cast<float>(L.head_k)) : 1.0f;
        v *= 1.0f / sqrtf(part[0] + 1e-6f) * scale;
    }
    if (t < width) xc[int64_t{r} * C + c0 + t] = v;
}

/// Each sequence's conv state becomes the last K − 1 rows it has seen.
__global__ void delta_conv_state_kernel(const float* __restrict__ x, DeltaSeqs seqs, int K, int64_t C) {
    pdl_wait();
    pdl_trigger();
    const int s = blockIdx.x;
    const int64_t c = int64_t{blockIdx.y} * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float* state = seqs.state[s];
    const int n = seqs.n_rows[s];
    const int64_t r0 = seqs.row0[s];
    float keep[7];
    for (int t = 0; t < K - 1; ++t) {
        const int idx = n + t;  // in [state rows | the pass's rows]
        keep[t] = idx < K - 1 ? state[int64_t{idx} * C + c] : x[(r0 + idx - (K - 1)) * C + c];
    }
    for (int t = 0; t < K - 1; ++t) state[int64_t{t} * C + c] = keep[t];
}

/// One row of the gated delta rule on a block's part of a value head's state
/// (the layout of delta_rows_kernel below): decays the thread's DK / 8 rows
/// × 4 columns `st`, subtracts Sᵀk from v scaled by beta, adds k·dᵀ, and
/// writes (Sᵀq)'s 4 columns at y (rows part 0 only). q and k are the key
/// head's normalised rows in shared memory, read by every thread; red is the
/// block's [8][QB] reduction buffer. b and a: the row's beta and alpha
/// inputs. Synchronizes the block three times; every thread must call it.
template <int DK, int QB>
__device__ __forceinline__ void delta_row(float4 (&st)[DK / 8], const float* q, const float* k, float4 v, float b, float a,
                                          float a_coef, float dt_bias, float4 (*red)[QB], int rp, int quad, float* y) {
    constexpr int R = DK / 8;
    const float u = a + dt_bias;
    const float softplus = u > 20.0f ? u : log1pf(expf(u));
    const float decay = expf(a_coef * softplus), beta = 1.0f / (1.0f + expf(-b));
    float4 m{0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const float kk = k[rp * R + i];
        st[i].x *= decay, st[i].y *= decay, st[i].z *= decay, st[i].w *= decay;
        m.x += st[i].x * kk, m.y += st[i].y * kk, m.z += st[i].z * kk, m.w += st[i].w * kk;
    }
    red[rp][quad] = m;
    __syncthreads();
    float4 mem{0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int p = 0; p < 8; ++p) mem.x += red[p][quad].x, mem.y += red[p][quad].y, mem.z += red[p][quad].z, mem.w += red[p][quad].w;
    const float4 d{(v.x - mem.x) * beta, (v.y - mem.y) * beta, (v.z - mem.z) * beta, (v.w - mem.w) * beta};
    float4 o{0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const float kk = k[rp * R + i], qq = q[rp * R + i];
        st[i].x += kk * d.x, st[i].y += kk * d.y, st[i].z += kk * d.z, st[i].w += kk * d.w;
        o.x += st[i].x * qq, o.y += st[i].y * qq, o.z += st[i].z * qq, o.w += st[i].w * qq;
    }
    __syncthreads();  // every thread has read Sᵀk's parts
    red[rp][quad] = o;
    __syncthreads();
    if (rp == 0) {
        float4 sum{0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int p = 0; p < 8; ++p) sum.x += red[p][quad].x, sum.y += red[p][quad].y, sum.z += red[p][quad].z, sum.w += red[p][quad].w;
        *reinterpret_cast<float4*>(y) = sum;
    }
}

/// One block per (sequence, value head, group of DV / CG value columns),
/// 8 row parts × DV / CG / 4 column quads of threads: a thread holds DK / 8
/// key rows × 4 value columns of the state in registers (float4 loads along
/// a row: a warp reads whole 128-byte row segments), Sᵀk and Sᵀq summed over
/// the row parts in shared memory.
template <int DK, int DV, int CG>
__global__ void delta_rows_kernel(const float* __restrict__ xc, const float* __restrict__ ba, float* __restrict__ y,
                                  DeltaSeqs seqs, DeltaLayer L, int64_t C, int max_rows) {
    constexpr int NC = DV / CG, QB = NC / 4, R = DK / 8;
    const int s = blockIdx.x, h = blockIdx.y, t = threadIdx.x, quad = t % QB, rp = t / QB;
    if (seqs.n_rows[s] > max_rows) return;  // the chunked kernel's sequence
    const int j0 = static_cast<int>(blockIdx.z) * NC + 4 * quad;
    const int nk = L.n_k_heads, nv = L.n_v_heads;
    const int kh = L.kv_tiled ? h % nk : h / (nv / nk);
    const int64_t kd = int64_t{nk} * DK, VD = int64_t{nv} * DV;
    float* S = seqs.state[s] + int64_t{L.conv_kernel - 1} * C + int64_t{h} * DK * DV + j0;
    __shared__ float q[DK], k[DK];
    __shared__ float4 red[8][QB];
    float4 st[R];
    // The state is read before the PDL wait: no kernel of this pass or step
    // writes it before this one (the conv writes only the conv rows before
    // it), and everything of earlier passes has completed (launch.cuh), so
    // its load overlaps the predecessor's tail. The sequence arrays come
    // from host copies that precede the pass.
#pragma unroll
    for (int i = 0; i < R; ++i) st[i] = *reinterpret_cast<const float4*>(S + int64_t{rp * R + i} * DV);
    pdl_wait();
    pdl_trigger();
    const float a_coef = L.a_coef[h], dt_bias = L.dt_bias[h];
    const int r0 = seqs.row0[s], n = seqs.n_rows[s];
    for (int r = r0; r < r0 + n; ++r) {
        const float* row = xc + int64_t{r} * C;
        for (int i = t; i < DK; i += blockDim.x) {
            q[i] = row[int64_t{kh} * DK + i];
            k[i] = row[kd + int64_t{kh} * DK + i];
        }
        __syncthreads();
        const float4 v = *reinterpret_cast<const float4*>(row + 2 * kd + int64_t{h} * DV + j0);
        delta_row<DK, QB>(st, q, k, v, ba[int64_t{r} * 2 * nv + h], ba[int64_t{r} * 2 * nv + nv + h], a_coef, dt_bias,
                          red, rp, quad, y + int64_t{r} * VD + int64_t{h} * DV + j0);
        if (seqs.snap && r < r0 + n - 1) {  // the state after this row (DeltaSeqs::snap)
            float* P = seqs.snap[s] + int64_t{r - r0} * seqs.snap_stride + int64_t{L.conv_kernel - 1} * C +
                       int64_t{h} * DK * DV + j0;
#pragma unroll
            for (int i = 0; i < R; ++i) *reinterpret_cast<float4*>(P + int64_t{rp * R + i} * DV) = st[i];
        }
    }
#pragma unroll
    for (int i = 0; i < R; ++i) *reinterpret_cast<float4*>(S + int64_t{rp * R + i} * DV) = st[i];
}

/// One decode step (one row per sequence) of delta_conv and the token
/// recurrence in one launch. Blocks and threads as delta_rows_kernel's; each
/// block convolves its key head's q and k channels (every block of the key
/// head does, from the same inputs: the q / k L2 norms are the block's own
/// reductions) and its own value columns, into shared memory. A value
/// channel's conv state is moved on by the thread that read it; the key
/// head's q and k channels' by the last of its blocks to have read them
/// (counters[s·n_k + kh] counts them in, that block sets it back to 0).
template <int DK, int DV, int CG>
__global__ void delta_step_kernel(const float* __restrict__ x, const float* __restrict__ ba, float* __restrict__ y,
                                  DeltaSeqs seqs, DeltaLayer L, int64_t C, int* __restrict__ counters) {
    constexpr int NC = DV / CG, QB = NC / 4, R = DK / 8, NT = 8 * QB;
    const int s = blockIdx.x, h = blockIdx.y, t = threadIdx.x, quad = t % QB, rp = t / QB;
    const int c0 = static_cast<int>(blockIdx.z) * NC, j0 = c0 + 4 * quad;
    const int nk = L.n_k_heads, nv = L.n_v_heads, K = L.conv_kernel;
    const int kh = L.kv_tiled ? h % nk : h / (nv / nk);
    const int64_t kd = int64_t{nk} * DK, VD = int64_t{nv} * DV;
    float* cs = seqs.state[s];  // the conv state: K − 1 rows of C, then the heads
    float* S = cs + int64_t{K - 1} * C + int64_t{h} * DK * DV + j0;
    __shared__ float q[DK], k[DK], v[NC];
    __shared__ float red[2][NT / 32];
    __shared__ float4 red4[8][QB];
    __shared__ bool last;
    float4 st[R];
    // The state before the PDL wait, as delta_rows_kernel (the conv state
    // too: only this kernel of the step writes it).
#pragma unroll
    for (int i = 0; i < R; ++i) st[i] = *reinterpret_cast<const float4*>(S + int64_t{rp * R + i} * DV);
    pdl_wait();
    pdl_trigger();
    const int r = seqs.row0[s];
    const float* xr = x + int64_t{r} * C;
    // The conv and SiLU of q (items 0 .. DK), k (DK .. 2DK) and the block's
    // value columns (2DK ..), delta_conv_kernel's arithmetic.
    for (int i = t; i < 2 * DK + NC; i += NT) {
        const int64_t c = i < DK       ? int64_t{kh} * DK + i
                          : i < 2 * DK ? kd + int64_t{kh} * DK + (i - DK)
                                       : 2 * kd + int64_t{h} * DV + c0 + (i - 2 * DK);
        float acc = 0.0f;
        for (int tap = 0; tap < K - 1; ++tap) acc += cs[int64_t{tap} * C + c] * L.conv[c * K + tap];
        acc += xr[c] * L.conv[c * K + K - 1];
        const float val = acc / (1.0f + expf(-acc));
        if (i < DK) {
            q[i] = val;
        } else if (i < 2 * DK) {
            k[i - DK] = val;
        } else {
            v[i - 2 * DK] = val;
            for (int tap = 0; tap < K - 2; ++tap) cs[int64_t{tap} * C + c] = cs[int64_t{tap + 1} * C + c];
            cs[int64_t{K - 2} * C + c] = xr[c];
        }
    }
    __syncthreads();
    // q and k L2-normalised (q also by 1/sqrt(DK)).
    float sq = 0.0f, sk = 0.0f;
    for (int i = t; i < DK; i += NT) sq += q[i] * q[i], sk += k[i] * k[i];
    for (int o = 16; o > 0; o >>= 1) {
        sq += __shfl_xor_sync(0xffffffffu, sq, o);
        sk += __shfl_xor_sync(0xffffffffu, sk, o);
    }
    if ((t & 31) == 0) red[0][t >> 5] = sq, red[1][t >> 5] = sk;
    if (t == 0) {  // this block has read the key head's q / k conv state
        const int blocks = (nv / nk) * static_cast<int>(gridDim.z);
        last = atomicAdd(&counters[s * nk + kh], 1) == blocks - 1;
    }
    __syncthreads();
    sq = sk = 0.0f;
#pragma unroll
    for (int w = 0; w < NT / 32; ++w) sq += red[0][w], sk += red[1][w];
    const float iq = 1.0f / sqrtf(sq + 1e-6f) * rsqrtf(static_cast<float>(DK)), ik = 1.0f / sqrtf(sk + 1e-6f);
    for (int i = t; i < DK; i += NT) q[i] *= iq, k[i] *= ik;
    if (last) {  // every block of the key head has read its q / k conv state: move it on
        for (int i = t; i < 2 * DK; i += NT) {
            const int64_t c = i < DK ? int64_t{kh} * DK + i : kd + int64_t{kh} * DK + (i - DK);
            for (int tap = 0; tap < K - 2; ++tap) cs[int64_t{tap} * C + c] = cs[int64_t{tap + 1} * C + c];
            cs[int64_t{K - 2} * C + c] = xr[c];
        }
        if (t == 0) counters[s * nk + kh] = 0;
    }
    __syncthreads();
    // One row of delta_rows_kernel's recurrence.
    delta_row<DK, QB>(st, q, k, float4{v[4 * quad], v[4 * quad + 1], v[4 * quad + 2], v[4 * quad + 3]},
                      ba[int64_t{r} * 2 * nv + h], ba[int64_t{r} * 2 * nv + nv + h], L.a_coef[h], L.dt_bias[h], red4, rp,
                      quad, y + int64_t{r} * VD + int64_t{h} * DV + j0);
#pragma unroll
    for (int i = 0; i < R; ++i) *reinterpret_cast<float4*>(S + int64_t{rp * R + i} * DV) = st[i];
}

// Calls f.template operator()<DK, DV, CG>() for the layer's heads (32, 64
// or 128 each; check_delta_layer) and up to cg column groups a value head
// (4 from heads of 128 values, 2 from 64).
template <class F>
void with_heads(const DeltaLayer& L, int cg, F&& f) {
    const auto by_dv = [&]<int DK>() {
        const auto by_cg = [&]<int DV>() {
            if constexpr (DV >= 128) {
                if (cg >= 4) return f.template operator()<DK, DV, 4>();
            }
            if constexpr (DV >= 64) {
                if (cg >= 2) return f.template operator()<DK, DV, 2>();
            }
            return f.template operator()<DK, DV, 1>();
        };
        if (L.head_v == 32) return by_cg.template operator()<32>();
        if (L.head_v == 64) return by_cg.template operator()<64>();
        return by_cg.template operator()<128>();
    };
    if (L.head_k == 32) return by_dv.template operator()<32>();
    if (L.head_k == 64) return by_dv.template operator()<64>();
    return by_dv.template operator()<128>();
}

/// Column groups of the token kernels: enough blocks for every SM (a lone
/// sequence's 48 heads of the 27B shape take 4 blocks each), whole heads
/// once the sequences alone give 4 blocks an SM.
int token_col_groups(const DeltaSeqs& seqs, const DeltaLayer& L) {
    const int sms = CudaContext::current_sm_count();
    const int64_t heads = int64_t{seqs.n_seqs} * L.n_v_heads;
    return heads >= 4 * int64_t{sms} ? 1 : heads >= sms ? 2 : 4;
}

}  // namespace

void check_delta_layer(const DeltaLayer& L, const DeltaSeqs& seqs) {
    const auto ok_head = [](int d) { return d == 32 || d == 64 || d == 128; };
    if (!ok_head(L.head_k) || !ok_head(L.head_v))
        throw_error("delta rule: heads of " + std::to_string(L.head_k) + " x " + std::to_string(L.head_v) +
                    " (the GPU takes 32, 64 or 128 each)");
    if (L.conv_kernel < 2 || L.conv_kernel > 8)
        throw_error("delta rule: a conv of " + std::to_string(L.conv_kernel) + " taps (2 to 8)");
    if (L.n_k_heads < 1 || L.n_v_heads < L.n_k_heads || L.n_v_heads % L.n_k_heads != 0)
        throw_error("delta rule: " + std::to_string(L.n_v_heads) + " value heads over " + std::to_string(L.n_k_heads) +
                    " key heads");
    if (!L.conv || !L.a_coef || !L.dt_bias || !seqs.row0 || !seqs.n_rows || !seqs.state)
        throw_error("delta rule: a null parameter or sequence array");
}

void delta_conv(const float* x, float* xc, int64_t n, const DeltaSeqs& seqs, const DeltaLayer& L,
                cudaStream_t stream) {
    check_delta_layer(L, seqs);
    if (n <= 0 || seqs.n_seqs <= 0) return;
    const int64_t C = L.conv_dim();
    const int threads = std::max(L.head_k, L.head_v);
    const bool shift = n == seqs.n_seqs;  // rows >= 1 each: one per sequence
    launch_pdl(delta_conv_kernel, dim3(static_cast<unsigned>(n), static_cast<unsigned>(2 * L.n_k_heads + L.n_v_heads)),
               dim3(threads), 0, stream, x, xc, seqs, L, C, shift);
    QUERN_CUDA_CHECK_LAUNCH();
    if (shift) return;
    launch_pdl(delta_conv_state_kernel, dim3(static_cast<unsigned>(seqs.n_seqs), static_cast<unsigned>((C + 255) / 256)),
               dim3(256), 0, stream, x, seqs, L.conv_kernel, C);
    QUERN_CUDA_CHECK_LAUNCH();
}

namespace {

/// delta_rule_tokens after its checks.
void launch_tokens(const float* xc, const float* ba, float* y, const DeltaSeqs& seqs, const DeltaLayer& L,
                   int max_rows, cudaStream_t stream) {
    with_heads(L, token_col_groups(seqs, L), [&]<int DK, int DV, int CG>() {
        const dim3 grid(static_cast<unsigned>(seqs.n_seqs), static_cast<unsigned>(L.n_v_heads), CG);
        launch_pdl(delta_rows_kernel<DK, DV, CG>, grid, dim3(8 * (DV / CG / 4)), 0, stream, xc, ba, y, seqs, L,
                   L.conv_dim(), max_rows);
    });
    QUERN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void delta_rule_tokens(const float* xc, const float* ba, float* y, const DeltaSeqs& seqs, const DeltaLayer& L,
                       int max_rows, cudaStream_t stream) {
    check_delta_layer(L, seqs);
    if (seqs.n_seqs > 0) launch_tokens(xc, ba, y, seqs, L, max_rows, stream);
}

void delta_step(const float* x, const float* ba, float* y, const DeltaSeqs& seqs, const DeltaLayer& L, int* counters,
                cudaStream_t stream) {
    check_delta_layer(L, seqs);
    if (!counters) throw_error("delta_step: null counters");
    if (seqs.snap) throw_error("delta_step: snapshots of the state are the prompt passes' (delta_conv, delta_rule)");
    if (seqs.n_seqs <= 0) return;
    with_heads(L, token_col_groups(seqs, L), [&]<int DK, int DV, int CG>() {
        const dim3 grid(static_cast<unsigned>(seqs.n_seqs), static_cast<unsigned>(L.n_v_heads), CG);
        launch_pdl(delta_step_kernel<DK, DV, CG>, grid, dim3(8 * (DV / CG / 4)), 0, stream, x, ba, y, seqs, L,
                   L.conv_dim(), counters);
    });
    QUERN_CUDA_CHECK_LAUNCH();
}

void delta_rule(const float* xc, const float* ba, float* y, int64_t n, const DeltaSeqs& seqs, const DeltaLayer& L,
                cudaStream_t stream) {
    check_delta_layer(L, seqs);
    if (seqs.n_seqs <= 0) return;
    // A pass of one row per sequence (a decode step) has nothing to chunk.
    const int chunk_rows = tuning().delta_chunk_rows;
    if (n <= seqs.n_seqs || !delta_rule_chunked_supported(L) || chunk_rows <= 0 || n < chunk_rows || seqs.snap) {
        launch_tokens(xc, ba, y, seqs, L, INT32_MAX, stream);
        return;
    }
    launch_tokens(xc, ba, y, seqs, L, chunk_rows - 1, stream);
    delta_rule_chunked(xc, ba, y, seqs, L, chunk_rows, stream);
}

}  // namespace quern::cuda
