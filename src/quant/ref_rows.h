// Per-type scalar reference row functions behind quant/reference.h and the
// traits table (quant/traits.h). Each one validates k (a non-negative multiple
// of the type's block size, else quern::Error) so it is safe to call directly
// through a QuantTraits function pointer. Input and output blocks may sit at
// any byte address (blocks are copied with memcpy, never dereferenced in place).
#pragma once
#include <cstdint>
#include <cstring>

namespace quern::ref {

// ---- to float (dequantize), bit-exact with ggml's dequantize_row_*
void to_float_f32(const void* x, float* y, int64_t k);
void to_float_f16(const void* x, float* y, int64_t k);
void to_float_bf16(const void* x, float* y, int64_t k);
void to_float_q4_0(const void* x, float* y, int64_t k);
void to_float_q4_1(const void* x, float* y, int64_t k);
void to_float_q5_0(const void* x, float* y, int64_t k);
void to_float_q5_1(const void* x, float* y, int64_t k);
void to_float_q8_0(const void* x, float* y, int64_t k);
void to_float_q8_1(const void* x, float* y, int64_t k);
void to_float_q2_K(const void* x, float* y, int64_t k);
void to_float_q3_K(const void* x, float* y, int64_t k);
void to_float_q4_K(const void* x, float* y, int64_t k);
void to_float_q5_K(const void* x, float* y, int64_t k);
void to_float_q6_K(const void* x, float* y, int64_t k);
void to_float_q8_K(const void* x, float* y, int64_t k);
// quern's FP8 / NVFP4 weight layouts (reference_fp.cpp; quant/blocks.h)
void to_float_f8_b32(const void* x, float* y, int64_t k);
void to_float_nvfp4(const void* x, float* y, int64_t k);
// GGML's MXFP4 (reference_fp.cpp)
void to_float_mxfp4(const void* x, float* y, int64_t k);

// ---- from float (quantize), following ggml's quantize_row_*_ref
void from_float_f32(const float* x, void* y, int64_t k);
void from_float_f16(const float* x, void* y, int64_t k);
void from_float_bf16(const float* x, void* y, int64_t k);
void from_float_q4_0(const float* x, void* y, int64_t k);
void from_float_q4_1(const float* x, void* y, int64_t k);
void from_float_q5_0(const float* x, void* y, int64_t k);
void from_float_q5_1(const float* x, void* y, int64_t k);
void from_float_q8_0(const float* x, void* y, int64_t k);
void from_float_q8_1(const float* x, void* y, int64_t k);
void from_float_q8_K(const float* x, void* y, int64_t k);
// K-quant weight types (reference_kquants.cpp)
void from_float_q2_K(const float* x, void* y, int64_t k);
void from_float_q3_K(const float* x, void* y, int64_t k);
void from_float_q4_K(const float* x, void* y, int64_t k);
void from_float_q5_K(const float* x, void* y, int64_t k);
void from_float_q6_K(const float* x, void* y, int64_t k);
// ---- from float with importance weights: `imp` holds one weight per
// column of the row (k floats, an importance matrix's mean squared
// activations), as ggml's quantize_<type> with quant_weights
void from_float_weighted_q4_0(const float* x, void* y, int64_t k, const float* imp);
void from_float_weighted_q4_1(const float* x, void* y, int64_t k, const float* imp);
void from_float_weighted_q5_0(const float* x, void* y, int64_t k, const float* imp);
void from_float_weighted_q5_1(const float* x, void* y, int64_t k, const float* imp);
void from_float_weighted_q2_K(const float* x, void* y, int64_t k, const float* imp);
void from_float_weighted_q3_K(const float* x, void* y, int64_t k, const float* imp);
void from_float_weighted_q4_K(const float* x, void* y, int64_t k, const float* imp);
void from_float_weighted_q5_K(const float* x, void* y, int64_t k, const float* imp);
void from_float_weighted_q6_K(const float* x, void* y, int64_t k, const float* imp);
// quern's FP8 / NVFP4 weight layouts (reference_fp.cpp)
void from_float_f8_b32(const float* x, void* y, int64_t k);
void from_float_nvfp4(const float* x, void* y, int64_t k);
void from_float_mxfp4(const float* x, void* y, int64_t k);

/// Throws quern::Error unless k is a non-negative multiple of block_size.
void check_row_length(const char* type_name, int block_size, int64_t k);

/// ggml's nearest_int: round to nearest, ties to even, via the 1.5*2^23 trick.
/// Valid for |v| <= 4194303; outside that range the result is meaningless
/// (never undefined behaviour).
inline int nearest_int(float v) {
    const float t = v + 12582912.f;  // 1.5 * 2^23: the low mantissa bits now hold round(v) + 2^22
    int32_t i;
    std::memcpy(&i, &t, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/// The 6-bit scale/min of sub-block j (0..7) from Q4_K/Q5_K's 12-byte packing.
inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

}  // namespace quern::ref

