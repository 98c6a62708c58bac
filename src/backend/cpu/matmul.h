// CPU matrix products of a (possibly quantized) weight matrix with float
// activations: the hot path of every forward pass.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace quern::cpu {

/// y = x · Wᵀ for a batch of n activation rows.
///   W: ne[0] = K (row length, contiguous), ne[1] = M rows, any type with a
///      CPU kernel (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K).
///   x: n rows of K floats, row stride K.
///   y: n rows of M floats, row stride ldy >= M.
/// Activations are quantized to the weight type's 8-bit partner (Q8_0, Q8_1
/// or Q8_K) when that is the fast path, then integer dot products are used.
/// Work is split over `pool`. Throws quern::Error for unsupported types or
/// shapes that are not whole blocks.
void matmul(const Tensor& W, const float* x, int64_t n, float* y, int64_t ldy, ThreadPool& pool);

/// Kernel family of a quantized matmul: Auto picks by n (GEMV below 12
/// rows, GEMM from there). Each family computes every output element in an
/// order independent of the other rows of the batch, but the two families
/// round differently; a caller that needs a row's result to be independent of
/// the batch it was computed in (the serving engine: the same request gives
/// the same text alone or among others) forces one family per kind of row:
/// Gemv runs n rows as consecutive GEMV calls of at most 11 rows, Gemm uses
/// the GEMM kernels even for one row. Float weights ignore the choice.
enum class MatmulPath { Auto, Gemv, Gemm };
void matmul(const Tensor& W, const float* x, int64_t n, float* y, int64_t ldy, ThreadPool& pool, MatmulPath path);

/// Splits k floats into their 8-bit quantization in blocks of type `act`
/// (Q8_0, Q8_1 or Q8_K; bytes identical to quantize_row_ref) and the float
/// residual x - dequantize(q). Uses the fastest quantizer the CPU has.
void quantize_act_with_residual(DType act, const float* x, int64_t k, void* q, float* residual);

}  // namespace quern::cpu
