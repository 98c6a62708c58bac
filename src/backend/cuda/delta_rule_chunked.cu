// The gated delta rule over a prompt's rows in chunks of 64, on the tensor
// cores (delta_rule.h: delta_rule_chunked). The math is the token-by-token
// recurrence's (delta_rule_kernel, cpu::delta_rule_tokens), regrouped as the
// WY / UT-transform form of the chunked delta rule (Yang et al., "Gated Delta
// Networks", 2024): within a chunk of rows t = 0..63 with cumulative log decay
// γ_t, β_t and incoming state S0 (head_k × head_v),
//   L[i][j] = β_i e^(γ_i − γ_j) k_i·k_j (i > j)      T = (I + L)⁻¹
//   U = T (β ⊙ V)       W = T (β e^γ ⊙ K)           V' = U − W S0
//   O = (e^γ ⊙ Q) S0 + A V',   A[i][j] = e^(γ_i − γ_j) q_i·k_j (i ≥ j)
//   S = e^(γ_63) S0 + (e^(γ_63 − γ) ⊙ K)ᵀ V'
// (V' row t is the token recurrence's β_t (v_t − S_{t−1}ᵀk_t) after decay.)
// Every product is mma.m16n8k8 in TF32 with fp32 accumulators; T comes from
// inverting the four 16 × 16 diagonal blocks of I + L by substitution, then
// the blocks below them, block row by block row.
//
// One block of 8 warps per (sequence, value head, group of value columns)
// carries its columns of the state in shared memory through the sequence's
// chunks; every matrix of the chunk is in shared memory too (rows padded by 4
// floats: the fragment reads of rows and of columns both hit 32 distinct
// banks). Heads of 128 take 207 KiB whole, 159 KiB in halves, 135 KiB in
// quarters: one block an SM.
#include "backend/cuda/context.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/delta_rule.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/tuning.h"

#include <string>

namespace quern::cuda {

namespace {

constexpr int kRows = 64;           // rows per chunk
constexpr int kThreads = 256;       // 8 warps
constexpr int kPadT = kRows + 4;    // row stride of the 64 × 64 matrices (floats)

/// The block's shared memory (offsets in floats) for heads of D × D, DC of
/// the value columns.
template <int D, int DC>
struct Smem {
    static constexpr int P = D + 4;   // row stride of the 64 × D matrices
    static constexpr int PV = DC + 4;  // row stride of the 64 × DC and D × DC ones
    static constexpr int k = 0;                    // K rows (64 × D)
    static constexpr int q = k + kRows * P;        // Q rows, then W
    static constexpr int v = q + kRows * P;        // V rows (the block's columns), then V'
    static constexpr int t = v + kRows * PV;       // L, then T (64 × 64)
    static constexpr int a = t + kRows * kPadT;    // A (64 × 64)
    static constexpr int s = a + kRows * kPadT;    // the state's columns (D × DC, row i a key element)
    static constexpr int dinv = s + D * PV;        // the diagonal blocks of T (4 × 16 × 16)
    static constexpr int x = dinv + 4 * 256;       // a block row's partial products (3 × 16 × 16)
    static constexpr int gam = x + 3 * 256;        // γ_t
    static constexpr int eg = gam + kRows;         // e^γ_t
    static constexpr int f = eg + kRows;           // e^(γ_63 − γ_t)
    static constexpr int beta = f + kRows;         // β_t
    static constexpr int total = beta + kRows;
};

/// acc[t] += A · B over one warp's 16 × 8·NT tile: A(i, k) = a(i, k) for the
/// tile's rows i < 16, B(k, n) = b(k, n) for its columns n < 8·NT, k < kdim
/// (a multiple of 8). Inputs rounded to TF32.
template <int NT, class FA, class FB>
__device__ __forceinline__ void warp_mma(float (&acc)[NT][4], int kdim, const FA& a, const FB& b) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    for (int k0 = 0; k0 < kdim; k0 += 8) {
        const uint32_t af[4] = {mma::to_tf32(a(g, k0 + c)), mma::to_tf32(a(g + 8, k0 + c)),
                                mma::to_tf32(a(g, k0 + c + 4)), mma::to_tf32(a(g + 8, k0 + c + 4))};
#pragma unroll
        for (int t = 0; t < NT; ++t)
            mma::mma_tf32(acc[t], af, mma::to_tf32(b(k0 + c, 8 * t + g)), mma::to_tf32(b(k0 + c + 4, 8 * t + g)));
    }
}

/// f(i, n, element) for every element of one warp's 16 × 8·NT accumulator
/// tile (i < 16 its row, n < 8·NT its column).
template <int NT, class F>
__device__ __forceinline__ void warp_each(float (&acc)[NT][4], const F& f) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) f(g + 8 * (e >> 1), 8 * t + 2 * c + (e & 1), acc[t][e]);
}

/// T = (I + L)⁻¹ in place of L (sT, strictly lower, 64 × 64): the diagonal
/// blocks D_b = (I + L_bb)⁻¹ by substitution (a thread per column), then
/// block row by block row T_bj = −D_b Σ_{j ≤ k < b} L_bk T_kj.
__device__ void invert_unit_lower(float* sT, float* sDi, float* sX) {
    const int tid = threadIdx.x;
    if (tid < kRows) {
        const int b = tid >> 4, col = tid & 15;
        const float* Lb = sT + 16 * b * kPadT + 16 * b;
        float x[16];
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            float v = r == col ? 1.0f : 0.0f;
#pragma unroll
            for (int j = 0; j < r; ++j) v -= Lb[r * kPadT + j] * x[j];
            x[r] = v;
        }
#pragma unroll
        for (int r = 0; r < 16; ++r) sDi[b * 256 + r * 16 + col] = x[r];
    }
    __syncthreads();
    for (int i = tid; i < 4 * 256; i += kThreads) {
        const int b = i >> 8, r = (i >> 4) & 15, c = i & 15;
        sT[(16 * b + r) * kPadT + 16 * b + c] = sDi[i];
    }
    __syncthreads();
    for (int bi = 1; bi < 4; ++bi) {
        for (int i = tid; i < bi * 256; i += kThreads) {
            const int j = i >> 8, r = (i >> 4) & 15, c = i & 15;
            const float* Lrow = sT + (16 * bi + r) * kPadT;
            float acc = 0.0f;
            for (int k = 16 * j; k < 16 * bi; ++k) acc += Lrow[k] * sT[k * kPadT + 16 * j + c];
            sX[i] = acc;
        }
        __syncthreads();
        for (int i = tid; i < bi * 256; i += kThreads) {
            const int j = i >> 8, r = (i >> 4) & 15, c = i & 15;
            float acc = 0.0f;
#pragma unroll
            for (int k = 0; k < 16; ++k) acc += sDi[bi * 256 + r * 16 + k] * sX[j * 256 + k * 16 + c];
            sT[(16 * bi + r) * kPadT + 16 * j + c] = -acc;
        }
        __syncthreads();
    }
}

/// One block per (sequence, value head, group of D / G value columns) of
/// the sequences with at least min_rows rows; heads of D × D. The groups of
/// a head each compute the chunk's A, T and W (the same), and their own
/// columns of U, V', O and the state: G > 1 trades that repeated work for
/// more SMs when the heads alone would leave most idle.
template <int D, int G>
__global__ void __launch_bounds__(kThreads)
    delta_chunk_kernel(const float* __restrict__ xc, const float* __restrict__ ba, float* __restrict__ y,
                       DeltaSeqs seqs, DeltaLayer L, int64_t C, int min_rows) {
    constexpr int DC = D / G;
    using M = Smem<D, DC>;
    constexpr int P = M::P, PV = M::PV;
    constexpr int NO = DC / 16;  // n-tiles per warp of a 64 × DC product (4 row tiles × 2 column halves)
    constexpr int H = DC / 2;
    extern __shared__ float sm[];
    float *sK = sm + M::k, *sQ = sm + M::q, *sV = sm + M::v, *sT = sm + M::t, *sA = sm + M::a, *sS = sm + M::s;
    float *sG = sm + M::gam, *sE = sm + M::eg, *sF = sm + M::f, *sB = sm + M::beta;
    const int s = blockIdx.x, h = blockIdx.y, col0 = static_cast<int>(blockIdx.z) * DC;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int n = seqs.n_rows[s];
    if (n < min_rows) return;  // the token kernel's sequence
    const int nk = L.n_k_heads, nv = L.n_v_heads;
    const int kh = L.kv_tiled ? h % nk : h / (nv / nk);
    const int64_t kd = int64_t{nk} * D, VD = int64_t{nv} * D;
    float* Sg = seqs.state[s] + int64_t{L.conv_kernel - 1} * C + int64_t{h} * D * D + col0;
    for (int i = tid; i < D * DC; i += kThreads) sS[(i / DC) * PV + i % DC] = Sg[(i / DC) * D + i % DC];
    const float a_coef = L.a_coef[h], dt_bias = L.dt_bias[h];
    const int rt = warp & 3, half = warp >> 2;  // the warp's row tile and column half of a 64 × N product
    for (int c0 = 0; c0 < n; c0 += kRows) {
        const int len = min(kRows, n - c0);
        const int64_t rbase = int64_t{seqs.row0[s]} + c0;
        // The chunk's q and k rows and the block's columns of v (zeros past
        // its end: they add nothing to the state), β and the log decay (0
        // past the end).
        for (int i = tid; i < kRows * D / 4; i += kThreads) {
            const int t = i / (D / 4), c4 = 4 * (i % (D / 4));
            float4 q{0.0f, 0.0f, 0.0f, 0.0f}, k = q;
            if (t < len) {
                const float* row = xc + (rbase + t) * C;
                q = *reinterpret_cast<const float4*>(row + int64_t{kh} * D + c4);
                k = *reinterpret_cast<const float4*>(row + kd + int64_t{kh} * D + c4);
            }
            *reinterpret_cast<float4*>(sQ + t * P + c4) = q;
            *reinterpret_cast<float4*>(sK + t * P + c4) = k;
        }
        for (int i = tid; i < kRows * DC / 4; i += kThreads) {
            const int t = i / (DC / 4), c4 = 4 * (i % (DC / 4));
            float4 v{0.0f, 0.0f, 0.0f, 0.0f};
            if (t < len) v = *reinterpret_cast<const float4*>(xc + (rbase + t) * C + 2 * kd + int64_t{h} * D + col0 + c4);
            *reinterpret_cast<float4*>(sV + t * PV + c4) = v;
        }
        if (tid < kRows) {
            float lg = 0.0f, beta = 0.0f;
            if (tid < len) {
                const float* bar = ba + (rbase + tid) * 2 * nv;
                const float u = bar[nv + h] + dt_bias;
                lg = a_coef * (u > 20.0f ? u : log1pf(expf(u)));
                beta = 1.0f / (1.0f + expf(-bar[h]));
            }
            sG[tid] = lg;
            sB[tid] = beta;
        }
        __syncthreads();
        if (warp == 0) {  // γ: an inclusive scan, two rows a lane
            const float x0 = sG[2 * lane], x1 = sG[2 * lane + 1];
            float incl = x0 + x1;
            for (int o = 1; o < 32; o <<= 1) {
                const float up = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += up;
            }
            const float before = __shfl_up_sync(0xffffffffu, incl, 1);
            const float g0 = (lane ? before : 0.0f) + x0, g1 = incl;
            const float gC = __shfl_sync(0xffffffffu, incl, 31);
            sG[2 * lane] = g0;
            sG[2 * lane + 1] = g1;
            sE[2 * lane] = expf(g0);
            sE[2 * lane + 1] = expf(g1);
            sF[2 * lane] = expf(gC - g0);
            sF[2 * lane + 1] = expf(gC - g1);
        }
        __syncthreads();
        // A = Q Kᵀ and L = K Kᵀ, masked and decayed (tiles wholly above the
        // diagonal are zeros); O = (e^γ ⊙ Q) S0 in registers.
        {
            float acc_a[4][4] = {}, acc_l[4][4] = {};
            const float *qa = sQ + rt * 16 * P, *ka = sK + rt * 16 * P, *kb = sK + half * 32 * P;
            if (16 * rt + 15 >= 32 * half) {
                const auto bk = [&](int k, int j) { return kb[j * P + k]; };
                warp_mma<4>(acc_a, D, [&](int i, int k) { return qa[i * P + k]; }, bk);
                warp_mma<4>(acc_l, D, [&](int i, int k) { return ka[i * P + k]; }, bk);
            }
            warp_each(acc_a, [&](int i, int j, float& v) {
                const int r = 16 * rt + i, c = 32 * half + j;
                sA[r * kPadT + c] = r >= c ? v * expf(sG[r] - sG[c]) : 0.0f;
            });
            warp_each(acc_l, [&](int i, int j, float& v) {
                const int r = 16 * rt + i, c = 32 * half + j;
                sT[r * kPadT + c] = r > c ? v * sB[r] * expf(sG[r] - sG[c]) : 0.0f;
            });
        }
        float acc_o[NO][4] = {};
        {
            const float *qa = sQ + rt * 16 * P, *e = sE + rt * 16, *sb = sS + half * H;
            warp_mma<NO>(acc_o, D, [&](int i, int k) { return qa[i * P + k] * e[i]; },
                         [&](int k, int j) { return sb[k * PV + j]; });
        }
        __syncthreads();
        invert_unit_lower(sT, sm + M::dinv, sm + M::x);
        // U and W (T is lower triangular: a row tile needs its first
        // 16·(rt + 1) columns); W (64 × D) replaces Q.
        float acc_u[NO][4] = {};
        {
            constexpr int NW = D / 16;
            float acc_w[NW][4] = {};
            const float *ta = sT + rt * 16 * kPadT, *vb = sV + half * H, *kb = sK + half * (D / 2);
            const auto at = [&](int i, int k) { return ta[i * kPadT + k]; };
            warp_mma<NO>(acc_u, 16 * (rt + 1), at, [&](int k, int j) { return vb[k * PV + j] * sB[k]; });
            warp_mma<NW>(acc_w, 16 * (rt + 1), at, [&](int k, int j) { return kb[k * P + j] * sB[k] * sE[k]; });
            float* wq = sQ + rt * 16 * P + half * (D / 2);
            warp_each(acc_w, [&](int i, int j, float& v) { wq[i * P + j] = v; });
        }
        __syncthreads();
        // V' = U − W S0 replaces V.
        {
            const float *wa = sQ + rt * 16 * P, *sb = sS + half * H;
            warp_mma<NO>(acc_u, D, [&](int i, int k) { return -wa[i * P + k]; },
                         [&](int k, int j) { return sb[k * PV + j]; });
            float* vv = sV + rt * 16 * PV + half * H;
            warp_each(acc_u, [&](int i, int j, float& v) { vv[i * PV + j] = v; });
        }
        __syncthreads();
        // O += A V' to the output rows; the state moves to the chunk's end
        // (no warp reads S0 any more).
        {
            const float *aa = sA + rt * 16 * kPadT, *vb = sV + half * H;
            warp_mma<NO>(acc_o, 16 * (rt + 1), [&](int i, int k) { return aa[i * kPadT + k]; },
                         [&](int k, int j) { return vb[k * PV + j]; });
            float* yo = y + rbase * VD + int64_t{h} * D + col0 + half * H;
            warp_each(acc_o, [&](int i, int j, float& v) {
                const int r = 16 * rt + i;
                if (r < len) yo[int64_t{r} * VD + j] = v;
            });
        }
        {
            constexpr int RT = D / 16, NS = D * DC / 1024;  // state row tiles; n-tiles per warp
            const int srt = warp % RT, sc0 = (warp / RT) * 8 * NS;
            float acc_s[NS][4];
            float* so = sS + srt * 16 * PV + sc0;
            const float eC = sE[kRows - 1];
            warp_each(acc_s, [&](int i, int j, float& v) { v = so[i * PV + j] * eC; });
            const float *ka = sK + srt * 16, *vb = sV + sc0;
            warp_mma<NS>(acc_s, kRows, [&](int i, int k) { return ka[k * P + i] * sF[k]; },
                         [&](int k, int j) { return vb[k * PV + j]; });
            warp_each(acc_s, [&](int i, int j, float& v) { so[i * PV + j] = v; });
        }
        __syncthreads();
    }
    for (int i = tid; i < D * DC; i += kThreads) Sg[(i / DC) * D + i % DC] = sS[(i / DC) * PV + i % DC];
}

template <int D, int G>
void launch(const float* xc, const float* ba, float* y, const DeltaSeqs& seqs, const DeltaLayer& L, int min_rows,
            cudaStream_t stream) {
    constexpr int smem = Smem<D, D / G>::total * static_cast<int>(sizeof(float));
    // Per call: the attribute is per device.
    QUERN_CUDA_CHECK(cudaFuncSetAttribute(delta_chunk_kernel<D, G>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const dim3 grid(static_cast<unsigned>(seqs.n_seqs), static_cast<unsigned>(L.n_v_heads), G);
    delta_chunk_kernel<D, G><<<grid, kThreads, smem, stream>>>(xc, ba, y, seqs, L, L.conv_dim(), min_rows);
    QUERN_CUDA_CHECK_LAUNCH();
}

/// Column groups per head for heads of 128: the most (4, 2, 1) whose blocks
/// the device's SMs hold at once — as many sequences as the pass has are
/// counted, though only the long ones run.
int pick_groups(const DeltaSeqs& seqs, const DeltaLayer& L) {
    const int sms = CudaContext::current_sm_count();
    const int64_t heads = int64_t{seqs.n_seqs} * L.n_v_heads;
    return heads * 4 <= sms ? 4 : heads * 2 <= sms ? 2 : 1;
}

}  // namespace

bool delta_rule_chunked_supported(const DeltaLayer& L) {
    return L.head_k == L.head_v && (L.head_k == 32 || L.head_k == 64 || L.head_k == 128);
}

void delta_rule_chunked(const float* xc, const float* ba, float* y, const DeltaSeqs& seqs, const DeltaLayer& L,
                        int min_rows, cudaStream_t stream, int col_groups) {
    check_delta_layer(L, seqs);
    if (!delta_rule_chunked_supported(L))
        throw_error("chunked delta rule: heads of " + std::to_string(L.head_k) + " x " + std::to_string(L.head_v) +
                    " (it takes square heads of 32, 64 or 128)");
    if (col_groups != 0 && col_groups != 1 && col_groups != 2 && col_groups != 4)
        throw_error("chunked delta rule: " + std::to_string(col_groups) + " column groups (0, 1, 2 or 4)");
    if (seqs.n_seqs <= 0) return;
    if (L.head_k != 128) col_groups = 1;
    else if (col_groups == 0) col_groups = tuning().delta_col_groups > 0 ? tuning().delta_col_groups : pick_groups(seqs, L);
    switch (L.head_k * 8 + col_groups) {
        case 32 * 8 + 1: launch<32, 1>(xc, ba, y, seqs, L, min_rows, stream); break;
        case 64 * 8 + 1: launch<64, 1>(xc, ba, y, seqs, L, min_rows, stream); break;
        case 128 * 8 + 1: launch<128, 1>(xc, ba, y, seqs, L, min_rows, stream); break;
        case 128 * 8 + 2: launch<128, 2>(xc, ba, y, seqs, L, min_rows, stream); break;
        default: launch<128, 4>(xc, ba, y, seqs, L, min_rows, stream); break;
    }
}

}  // namespace quern::cuda
