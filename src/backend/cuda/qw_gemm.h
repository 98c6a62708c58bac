// GEMM on the resident quantized weights for any number of activation rows
// ("qw"): Y = X · Wᵀ read straight from the device layout the decode GEMVs
// read (weights.h), so a batch needs no second copy of the model — neither
// the BF16 copies (gemm.h: 16 bits per weight) nor the bq layouts (bq_gemm.h:
// 5.5 or 11) — and each product reads the 4.5 (Q4_K) or 6.56 (Q6_K) bits
// per weight of the GGUF file once per 128 activation rows.
//
// Method (sm_90a only: wgmma): a block of two warpgroups multiplies 128 or
// 256 weight rows by 32, 64 or 128 activation rows over a range of K. Per
// chunk of 64 elements it copies the weight rows' quants and scales and the
// activation rows (BF16) into a ring of shared-memory stages (cp.async,
// three chunks ahead); each warp decodes its 16-row tiles into the A
// fragments of wgmma.m64nNk16 in registers (the integer-in-mantissa trick
// of bq_gemm.h: 128 + q as BF16 bits, then one HSUB2 and one HFMA2 per
// pair), and the warpgroup multiplies them by the staged activations (B
// from shared memory) while the next chunk is decoded. K may be split over
// a thread block cluster whose partial sums are added in a fixed order.
//
// Speed (one H100, Llama-3-8B's matrices, bench/batched-cuda-h200.md): not
// yet what the method allows. With the activations in wgmma's 128-byte
// swizzle (1.5x faster than the interleaved layout at 2048 rows): 0.5-1.0
// TB/s of the weights at 16 rows (the BF16 copies with cuBLASLt 2-2.7 TB/s
// of theirs) and 190-280 TFLOP/s at 2048 rows (copies 740-790). Measured
// limits: with no copies and no decoding at all a product of 16 rows still
// takes ~21 us where its weights need ~5, and at 2048 rows ~315 TFLOP/s —
// the chunk loop's fixed costs, not memory. So the batch runner takes it
// only with Tuning::qw (tuning.h).
//
// Numerics: as the bq path — each weight is formed in BF16 from its integer
// q and its group's scale rounded to BF16 (the offset folded so that it
// costs at most one more rounding, so_pair in bq_common.cuh), products of
// BF16 summed in fp32: within a few BF16 roundings of each weight of the
// exact product (tests/cuda/qw_gemm_test.cu bounds the error against the
// CPU's dequantize_row_ref values).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/weights.h"
#include "core/dtype.h"

namespace quern::cuda {

/// Whether qw_gemm takes weights of type t with rows of K elements on this
/// device: Q4_K or Q6_K, K % 256 == 0, and a device that runs the sm_90a
/// code (compute capability 9.0, a build with QUERN_CUDA_SM90A).
bool qw_supported(DType t, int64_t K);

/// y[r·ldy + j] = Σ_k xb[r·w.K + k] · W[row0 + j][k] for r < n, j < rows
/// (overwrites those outputs; the rest of each y row is untouched), from
/// w's resident layout. xb: n rows of w.K BF16 values (row stride w.K),
/// 16-byte aligned. Asynchronous on `stream`; no allocation (graph-safe).
/// Preconditions (else quern::Error): qw_supported(w.type, w.K), xb and y
/// not null, n >= 1, row0 >= 0, rows >= 1, row0 + rows <= w.N, ldy >= rows.
void qw_gemm(const DeviceWeight& w, int64_t row0, int64_t rows, const uint16_t* xb, int64_t n, float* y,
             int64_t ldy, cudaStream_t stream);

/// The kernel shape qw_gemm uses, for measurements (bench_gemm_cuda):
/// tokens 32, 64 or 128 activation rows per block (0: by n), groups 1 or 2
/// 64-row weight groups per warpgroup (0: by the shape). Out-of-range
/// values are clamped; set both to 0 to restore the default.
void qw_gemm_set_shape(int tokens, int groups);

}  // namespace quern::cuda
