// Grouped GEMM of a mixture-of-experts bank on weights in their resident
// layout (weights.h), any type the prefill GEMM takes: every expert of the
// bank multiplied by its own group of token rows in one launch, the group
// offsets on the device (the prefill's MoE path routes and groups the rows
// there, so a chunk needs no host round trip per layer).
//
// The small-batch layouts of bq_gemm.h do the same for the 4- to 6-bit types
// (bq_gemm_grouped, reading 5.5 or 11 bits per weight); this path serves the
// banks that have none: Q8_0, F16 / BF16 / F32, the FP8 and NVFP4 of
// quantized checkpoints, Q2_K / Q3_K, and any bank whose bq layout did not
// fit in memory.
//
// Method: tiles of 64 weight rows × 64 elements are decoded in registers to
// BF16 (deq::unit_values: each value in fp32 as dequantize_row_ref computes
// it, then rounded once, exactly as dequantize_weight_bf16 does for the
// cuBLASLt path) into shared memory next to the group's BF16 activations
// (cp.async), and multiplied on the tensor cores (mma.m16n8k16, fp32
// accumulation). Two shared-memory stages: the next tile's loads are in
// flight while the current one is multiplied.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/weights.h"
#include "core/dtype.h"

namespace quern::cuda {

/// Whether dq_gemm_grouped takes weights of type t with rows of K elements:
/// every type gemm_weight_type_supported names, K % 32 == 0.
bool dq_grouped_supported(DType t, int64_t K);

/// The products of a mixture-of-experts bank in one launch, tokens grouped
/// by expert: for every expert e < n_expert and t < off[e+1] − off[e],
///   y[(off[e] + t)·ldy + j] = Σ_k xb[(off[e] + t)·w.K + k] · W[e·rows + j][k]
/// for j < rows (the rest of each y row untouched). W's values are rounded
/// to BF16 before the product (as PrefillGemm's dequantizing path), xb holds
/// BF16 bit patterns, sums in fp32.
///   w:        the bank, n_expert · rows rows or more, K % 32 == 0.
///   off:      n_expert + 1 int32 offsets on the device (off[0] = 0,
///             non-decreasing).
///   max_rows: at least the largest group (host side; sizes the grid, whose
///             blocks past a group's end leave at once).
///   mean_rows: the groups' mean size (host side, e.g. rows routed / experts):
///             picks the token tile (64 rows, or 128 above a mean of 96; any
///             value gives the same results).
///   xb:       grouped activation rows, row stride w.K, 16-byte aligned.
/// Errors (quern::Error): a type or K dq_grouped_supported refuses, a null
/// pointer, rows < 1, n_expert · rows > w.N, n_expert > 65535, ldy < rows,
/// max_rows out of range, xb misaligned.
void dq_gemm_grouped(const DeviceWeight& w, int64_t rows, const int32_t* off, int64_t n_expert, int64_t max_rows,
                     int64_t mean_rows, const uint16_t* xb, float* y, int64_t ldy, cudaStream_t stream);

}  // namespace quern::cuda
