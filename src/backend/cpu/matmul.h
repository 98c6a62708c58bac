// CPU matrix products of a (possibly quantized) weight matrix with float
// activations: the hot path of every forward pass.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace quern::cpu {

/// y = x · Wᵀ for a batch of n activation rows.
///   W: ne[0] = K (row length, contiguous), ne[1] = M rows, any type with a
///      CPU kernel (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K,
///      MXFP4, and the weight-only F8_E4M3_B32 and NVFP4 of FP8 / NVFP4
///      checkpoints).
///   x: n rows of K floats, row stride K.
///   y: n rows of M floats, row stride ldy >= M.
/// Activations are quantized to the weight type's 8-bit partner (Q8_0, Q8_1
/// or Q8_K) when that is the fast path, then integer dot products are used.
/// F8_E4M3_B32 / NVFP4 weights are decoded to f32 inside the float kernels
/// and meet the f32 activations as F32 weights would (kernels.h).
/// Work is split over `pool`. Throws quern::Error for unsupported types or
/// shapes that are not whole blocks.
void matmul(const Tensor& W, const float* x, int64_t n, float* y, int64_t ldy, ThreadPool& pool);

/// Kernel family of a matmul. The two families of quantized kernels round
/// differently; within each, every output element is computed the same way
/// whatever the number of rows n, the other rows of the batch and the thread
/// count, so a caller that needs a row's result to be independent of the batch
/// (the serving engine: a request gives the same text alone or among others)
/// forces one family for every row:
///   Gemv:   the fused GEMV kernels (consecutive calls of at most 11 rows);
///           fastest for one or two rows, memory-bound.
///   Gemm:   the GEMM arithmetic, computed by the decode kernel (weight rows
///           across the vector lanes: full vector width from one row up)
///           below 512 rows and by the register-tiled GEMM from there (AVX2
///           and AVX-512; the scalar level has one kernel for everything).
///   Decode, Tile: the GEMM family through one kernel only (for tests and
///           benchmarks).
///   Auto:   GEMV below 12 rows, Gemm from there (the fastest choice for one
///           sequence; not batch-invariant).
/// Float weights (F32/F16/BF16) and the weight-only F8_E4M3_B32 / NVFP4 have
/// one family; every path but Auto uses its tiled kernel for every n (Auto
/// takes a row-at-a-time kernel below 4 rows).
enum class MatmulPath { Auto, Gemv, Gemm, Decode, Tile };
void matmul(const Tensor& W, const float* x, int64_t n, float* y, int64_t ldy, ThreadPool& pool, MatmulPath path);

/// Splits k floats into their 8-bit quantization in blocks of type `act`
/// (Q8_0, Q8_1 or Q8_K; bytes identical to quantize_row_ref) and the float
/// residual x - dequantize(q). Uses the fastest quantizer the CPU has.
void quantize_act_with_residual(DType act, const float* x, int64_t k, void* q, float* residual);

}  // namespace quern::cpu
