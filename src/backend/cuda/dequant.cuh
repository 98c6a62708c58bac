// Device-side readers of the weight layouts in weights.h, shared by the
// kernels that decode quantized weights outside the GEMVs (the prefill
// dequantization in gemm.cu, the small-batch layouts in bq_gemm.cu).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace quern::cuda::deq {

/// Element i of an fp16 array, as float.
__device__ __forceinline__ float half_at(const void* p, int64_t i) {
    return __half2float(static_cast<const __half*>(p)[i]);
}

/// Fifth bit of element e (0..31) of a 32-element group in the "Q5 order" of
/// weights.h: byte k, bit i = element 4i+k, bit 4+i = element 16+4i+k.
__device__ __forceinline__ uint32_t q5_bit(uint32_t bits, int e) {
    const int h = e >> 4, i = (e & 15) >> 2, k = e & 3;
    return (bits >> (8 * k + 4 * h + i)) & 1u;
}

/// Low nibble of byte e (element e < 16) or high nibble of byte e − 16 of a
/// 16-byte chunk holding 32 four-bit values ("as Q4_1" in weights.h).
__device__ __forceinline__ uint32_t nib(const uint8_t* chunk, int e) {
    return e < 16 ? (chunk[e] & 0xFu) : (chunk[e - 16] >> 4);
}

/// Scale d·sc_j and min dmin·m_j of 32-element sub-block j (0..7) of a
/// Q4_K / Q5_K super-block, from its 16-byte device head (weights.h: fp16 d,
/// fp16 dmin, byte 4+j = sc_j | (m_j & 3) << 6, nibble j of bytes 12..15 =
/// m_j >> 2), in fp32 as dequantize_row_ref computes them.
__device__ __forceinline__ void k_scale_min(const uint8_t* head, int j, float& d1, float& m1) {
    const float d = half_at(head, 0), dmin = half_at(head, 1);
    const uint32_t b = head[4 + j];
    const uint32_t m_hi = (head[12 + j / 2] >> (4 * (j & 1))) & 0xFu;
    d1 = d * static_cast<float>(b & 63u);
    m1 = dmin * static_cast<float>(((b >> 6) & 3u) | (m_hi << 2));
}

/// The streams of one DeviceWeight (weights.h) and its row length K.
struct DeqArgs {
    const uint8_t* q;
    const uint8_t* q2;
    const uint8_t* s;
    const uint8_t* s2;
    int64_t K;
};

}  // namespace quern::cuda::deq
