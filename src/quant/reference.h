// Scalar reference (de)quantization for every block type quern reads.
// These are the ground truth the SIMD and CUDA kernels are tested against;
// they favour clarity over speed.
//
// Row arguments: `k` is the number of elements and must be a multiple of the
// type's block size (dtype_info(t).block_size); otherwise quern::Error.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace quern {

/// Dequantizes k elements of type t at x into y (float). Supports F32, F16,
/// BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K.
/// Results are bit-exact with ggml's dequantize_row_* (and the `gguf` Python
/// package's gguf.quants.dequantize). Also quern's F8_E4M3_B32 and NVFP4
/// (quant/blocks.h; exact products, reference_fp.cpp).
void dequantize_row_ref(DType t, const void* x, float* y, int64_t k);

/// Quantizes k floats into blocks of type t at y. Activation types (Q8_0,
/// Q8_1, Q8_K) round exactly as ggml's quantize_row_*_ref; weight types use
/// ggml's reference algorithms for choosing scales.
void quantize_row_ref(DType t, const float* x, void* y, int64_t k);

/// Quantizes one row of k floats into type t under importance weights
/// (k floats: the mean square of the activation each column multiplies, an
/// importance matrix's entry; formats/imatrix.h), choosing scales as ggml's
/// quantize_<type> does with quant_weights, so that rows equal
/// llama-quantize --imatrix's. Q4_0/Q4_1/Q5_0/Q5_1 and Q2_K..Q6_K use the
/// weights; other types (Q8_0, F16, ...) and a null `importance` quantize as
/// quantize_row_ref.
void quantize_row_weighted(DType t, const float* x, void* y, int64_t k, const float* importance);

/// Whether quantize_row_ref / dequantize_row_ref support type t.
bool quant_ref_supports(DType t);

}  // namespace quern
