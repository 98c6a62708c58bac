// Grouped expert GEMM on weights in their resident layout (API, method and
// numerics: grouped_gemm.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "backend/cuda/tuning.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/gemm.h"
#include "backend/cuda/grouped_gemm.h"
#include "backend/cuda/mma.cuh"

namespace quern::cuda {
namespace {

using deq::DeqArgs;
using deq::unit_values;
using mma::cp_async16;
using mma::cp_async_commit;
using mma::cp_async_wait;
using mma::mma_bf16;

constexpr int kBM = 64;        // weight rows (outputs j) per block
constexpr int kBK = 64;        // elements per step (two 32-element units)
constexpr int kPad = 72;       // BF16 per staged row: 64 + 8 (144 bytes: conflict-free 32-bit fragment reads)
constexpr int kThreads = 128;  // 4 warps: 2 along the weight rows × 2 along the tokens

// Shared memory of a block with token tiles of 16·NT rows: two stages of
// weights (64 rows) and activations.
template <int NT>
constexpr int smem_bytes() {
    return 2 * (kBM + 16 * NT) * kPad * 2;
}

__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) {
    return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

__device__ __forceinline__ uint32_t lds32(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// dq_grouped_kernel<T, NT>
//   Shapes:  W: the bank's rows e·rows_e + j, K elements each (K % 32 == 0,
//            device layout of weights.h); x: grouped activation rows of K
//            BF16 (row stride K, 16-byte aligned); y: rows at stride ldy.
//   Grid:    (ceil(rows_e / 64), ceil(max_rows / BN), n_expert) blocks of
//            128 threads, BN = 16·NT token rows; block (b, t, e) computes
//            weight rows 64b .. 64b+63 of expert e against its group's token
//            rows off[e] + BN·t .. (at most BN; blocks past the group's end
//            leave at once). Warp w owns rows 32·(w & 1) .. +31 and tokens
//            8·NT·(w >> 1) .. : 2 × NT mma tiles of 16 × 8.
//   Steps:   per 64 elements of K, thread i decodes unit (i & 1) of weight
//            row i >> 1 (32 values, rounded to BF16) and the block copies the
//            step's activations with cp.async, into the stage not being
//            multiplied: the loads of step s+1 are issued before the products
//            of step s, their decoding and shared-memory stores after them;
//            one barrier per step. Rows past rows_e decode the expert's last
//            row and are never stored; units past K and token rows past the
//            group are zeros.
//   Bound:   memory for groups of a few rows (each expert's weights read once
//            per token tile), the decode and the tensor cores for large ones.
template <DType T, int NT>
__global__ void __launch_bounds__(kThreads) dq_grouped_kernel(DeqArgs a, int64_t rows_e, const int32_t* __restrict__ off,
                                                              const uint16_t* __restrict__ x, float* __restrict__ y,
                                                              int64_t ldy) {
    constexpr int BN = 16 * NT;
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t* const ws = smem;                  // [2][kBM][kPad]
    uint16_t* const xs = smem + 2 * kBM * kPad;  // [2][BN][kPad]
    const int64_t e = blockIdx.z, o0 = off[e], t0 = static_cast<int64_t>(blockIdx.y) * BN;
    const int64_t ne = off[e + 1] - o0;
    if (t0 >= ne) return;  // the whole block, before any barrier
    const int n = static_cast<int>(ne - t0 < BN ? ne - t0 : BN);
    const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kBM;
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int wm = warp & 1, wn = warp >> 1;
    const int64_t K = a.K, units = K / 32;
    const int steps = static_cast<int>((K + kBK - 1) / kBK);
    const int dr = tid >> 1, dh = tid & 1;  // this thread's decode row and unit
    const int64_t wrow = e * rows_e + (j0 + dr < rows_e ? j0 + dr : rows_e - 1);
    const uint16_t* xg = x + (o0 + t0) * K;

    // Activations of step `step` into stage `buf` (BN rows × 8 pieces of 16 bytes).
    const auto copy_x = [&](int buf, int step) {
#pragma unroll
        for (int it = 0; it < BN * 8 / kThreads; ++it) {
            const int i = tid + it * kThreads, r = i >> 3, piece = i & 7;
            const int64_t k = static_cast<int64_t>(step) * kBK + 8 * piece;
            const bool valid = r < n && k < K;
            cp_async16(&xs[(buf * BN + r) * kPad + 8 * piece], valid ? xg + r * K + k : x, valid);
        }
        cp_async_commit();
    };
    // The decoded unit of step `step` in v (a unit past K: the last one, zeroed at the store).
    const auto load_w = [&](int step, float (&v)[32]) {
        const int64_t u = 2 * static_cast<int64_t>(step) + dh;
        unit_values<T>(a, wrow, u < units ? u : units - 1, v);
    };
    const auto store_w = [&](int buf, int step, const float (&v)[32]) {
        const bool live = 2 * static_cast<int64_t>(step) + dh < units;
        uint32_t p[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) p[i] = live ? bf16_pair(v[2 * i], v[2 * i + 1]) : 0u;
        auto* dst = reinterpret_cast<uint4*>(&ws[(buf * kBM + dr) * kPad + 32 * dh]);
#pragma unroll
        for (int i = 0; i < 4; ++i) dst[i] = make_uint4(p[4 * i], p[4 * i + 1], p[4 * i + 2], p[4 * i + 3]);
    };

    float acc[2][NT][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;
    const auto multiply = [&](int b) {
        const uint16_t* W = ws + b * kBM * kPad;
        const uint16_t* X = xs + b * BN * kPad;
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
            uint32_t af[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                const uint16_t* A = W + (32 * wm + 16 * mt + g) * kPad + 16 * kk + 2 * c;
                af[mt][0] = lds32(A);
                af[mt][1] = lds32(A + 8 * kPad);
                af[mt][2] = lds32(A + 8);
                af[mt][3] = lds32(A + 8 * kPad + 8);
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const uint16_t* B = X + (8 * NT * wn + 8 * nt + g) * kPad + 16 * kk + 2 * c;
                const uint32_t b0 = lds32(B), b1 = lds32(B + 8);
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) mma_bf16(acc[mt][nt], af[mt], b0, b1);
            }
        }
    };

    {
        float v[32];
        copy_x(0, 0);
        load_w(0, v);
        store_w(0, 0, v);
    }
    cp_async_wait<0>();
    __syncthreads();
    for (int s = 0; s + 1 < steps; ++s) {
        const int b = s & 1;
        float v[32];
        copy_x(b ^ 1, s + 1);  // the other stage was released by the last barrier
        load_w(s + 1, v);
        multiply(b);
        store_w(b ^ 1, s + 1, v);
        cp_async_wait<0>();
        __syncthreads();
    }
    multiply((steps - 1) & 1);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int64_t j = j0 + 32 * wm + 16 * mt + g + (i >= 2 ? 8 : 0);
                const int r = 8 * NT * wn + 8 * nt + 2 * c + (i & 1);
                if (j < rows_e && r < n) y[(o0 + t0 + r) * ldy + j] = acc[mt][nt][i];
            }
}

template <DType T, int NT>
void launch_dq(const DeqArgs& a, int64_t rows, const int32_t* off, int64_t n_expert, int64_t max_rows,
               const uint16_t* xb, float* y, int64_t ldy, cudaStream_t stream) {
    constexpr int smem = smem_bytes<NT>();
    // Per call (cheap, and per device: a process may drive several GPUs).
    QUERN_CUDA_CHECK(cudaFuncSetAttribute(dq_grouped_kernel<T, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const dim3 grid(static_cast<unsigned>((rows + kBM - 1) / kBM),
                    static_cast<unsigned>((max_rows + 16 * NT - 1) / (16 * NT)), static_cast<unsigned>(n_expert));
    dq_grouped_kernel<T, NT><<<grid, kThreads, smem, stream>>>(a, rows, off, xb, y, ldy);
}

// Token tiles of 64 rows, or 128 where the groups average more than 96 rows
// (each expert's weights are then decoded half as often); Tuning::dq_tokens
// = 64 or 128 forces one.
template <DType T>
void launch_dq_n(const DeqArgs& a, int64_t rows, const int32_t* off, int64_t n_expert, int64_t max_rows,
                 int64_t mean_rows, const uint16_t* xb, float* y, int64_t ldy, cudaStream_t stream) {
    const int forced = tuning().dq_tokens;
    const bool wide = forced ? forced == 128 : mean_rows > 96;
    if (wide) launch_dq<T, 8>(a, rows, off, n_expert, max_rows, xb, y, ldy, stream);
    else launch_dq<T, 4>(a, rows, off, n_expert, max_rows, xb, y, ldy, stream);
}

}  // namespace

bool dq_grouped_supported(DType t, int64_t K) { return gemm_weight_type_supported(t) && K > 0 && K % 32 == 0; }

void dq_gemm_grouped(const DeviceWeight& w, int64_t rows, const int32_t* off, int64_t n_expert, int64_t max_rows,
                     int64_t mean_rows, const uint16_t* xb, float* y, int64_t ldy, cudaStream_t stream) {
    if (!dq_grouped_supported(w.type, w.K))
        throw_error(std::string("dq_gemm_grouped: no grouped GEMM for ") + std::string(dtype_name(w.type)) +
                    " weights with rows of " + std::to_string(w.K) + " elements");
    if (!w.q || !off || !xb || !y) throw_error("dq_gemm_grouped: null pointer");
    if (rows < 1 || n_expert < 1 || n_expert > 65535 || n_expert * rows > w.N || ldy < rows || max_rows < 0 ||
        max_rows > int64_t{65535} * 64 || (rows + kBM - 1) / kBM > int64_t{0x7FFFFFFF})
        throw_error("dq_gemm_grouped: shape out of range");
    if (reinterpret_cast<uintptr_t>(xb) % 16 != 0) throw_error("dq_gemm_grouped: activations must be 16-byte aligned");
    if (max_rows == 0) return;
    const DeqArgs a{static_cast<const uint8_t*>(w.q), static_cast<const uint8_t*>(w.q2),
                    static_cast<const uint8_t*>(w.s), static_cast<const uint8_t*>(w.s2), w.K};
    switch (w.type) {
#define QUERN_DQ_CASE(T) \
    case DType::T: launch_dq_n<DType::T>(a, rows, off, n_expert, max_rows, mean_rows, xb, y, ldy, stream); break;
        QUERN_DQ_CASE(F32) QUERN_DQ_CASE(F16) QUERN_DQ_CASE(BF16) QUERN_DQ_CASE(Q8_0) QUERN_DQ_CASE(Q4_0)
        QUERN_DQ_CASE(Q4_1) QUERN_DQ_CASE(Q5_0) QUERN_DQ_CASE(Q5_1) QUERN_DQ_CASE(Q4_K) QUERN_DQ_CASE(Q5_K)
        QUERN_DQ_CASE(Q6_K) QUERN_DQ_CASE(Q2_K) QUERN_DQ_CASE(Q3_K) QUERN_DQ_CASE(F8_E4M3_B32) QUERN_DQ_CASE(NVFP4)
#undef QUERN_DQ_CASE
        default: throw_error("dq_gemm_grouped: unreachable weight type");
    }
    QUERN_CUDA_CHECK_LAUNCH();
}

}  // namespace quern::cuda
