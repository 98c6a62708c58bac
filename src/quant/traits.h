// One row of layout facts and reference functions per block type quern can
// (de)quantize. CPU and CUDA kernels read the same layout facts from here;
// the function pointers are the scalar references of quant/reference.h.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace quern {

struct QuantTraits {
    DType type;
    int block_size;  // elements per block (1 for F32/F16/BF16)
    int type_size;   // bytes per block
    /// Dequantizes k elements (k a multiple of block_size, else quern::Error).
    void (*to_float)(const void* x, float* y, int64_t k);
    /// Quantizes k floats (k a multiple of block_size, else quern::Error).
    void (*from_float)(const float* x, void* y, int64_t k);
    /// The activation type this weight type's dot product pairs with: Q8_0 for
    /// Q4_0/Q5_0/Q8_0/MXFP4, Q8_1 for Q4_1/Q5_1 (they need the block sum s), Q8_K for
    /// the K-quants, F32 for F32/F16/BF16 and the weight-only F8_E4M3_B32 and
    /// NVFP4 (their kernels take float activations; an activation format of
    /// their own would pair here when a W8A8 / W4A4 path joins). An activation
    /// type pairs with itself.
    DType vec_dot_type;
};

/// Traits of t; throws quern::Error if quern has no (de)quantizer for t.
const QuantTraits& quant_traits(DType t);
/// Traits of t, or nullptr if quern has no (de)quantizer for t.
const QuantTraits* find_quant_traits(DType t);

}  // namespace quern
