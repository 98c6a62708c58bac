// Register-level decoders of the minifloats in FP8 / NVFP4 weights, shared
// by the GEMV kernels (gemv_f8_e4m3.cu, gemv_nvfp4.cu) and the embedding
// lookup (ops_lookup.cu). __host__ __device__ so that the no-GPU tests can
// check them exhaustively against the scalar reference (quant/fp8.h).
//
// Formats (OCP "8-bit Floating Point Specification" v1.0 for E4M3FN; OCP
// Microscaling Formats v1.0 for E2M1, the element type of NVIDIA's NVFP4):
//   E4M3: sign, 4 exponent bits (bias 7), 3 mantissa bits; S.1111.111 is NaN;
//         every value (2^-9 .. 448) is exactly an f16.
//   E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit: 0, 0.5, 1, 1.5, 2,
//         3, 4, 6 — twice those are the integers 0, 1, 2, 3, 4, 6, 8, 12.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace quern::cuda::mf {

/// __byte_perm(x, y, s) on the device (a PRMT); the same function on the
/// host: byte n of the result = byte ((s >> 4n) & 7) of the 8 bytes {y, x}
/// (x the low word). Selector bits 3 of each nibble and 16..31 are ignored.
__host__ __device__ __forceinline__ uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    const uint64_t src = (static_cast<uint64_t>(y) << 32) | x;
    uint32_t r = 0;
    for (int n = 0; n < 4; ++n) r |= static_cast<uint32_t>((src >> (8 * ((s >> (4 * n)) & 7u))) & 0xFFu) << (8 * n);
    return r;
#endif
}

// Doubled E2M1 magnitudes of codes 0..7 as bytes (codes 0..3 in the low
// word, 4..7 in the high one), and their negations.
inline constexpr uint32_t kE2m1PosLo = 0x03020100u;  // 0, 1, 2, 3
inline constexpr uint32_t kE2m1PosHi = 0x0C080604u;  // 4, 6, 8, 12
inline constexpr uint32_t kE2m1NegLo = 0xFDFEFF00u;  // 0, -1, -2, -3
inline constexpr uint32_t kE2m1NegHi = 0xF4F8FAFCu;  // -4, -6, -8, -12

/// The four E2M1 codes in the low 16 bits of v (nibble j = element j; bit 3
/// of a nibble is its sign) -> four int8 values 2·e2m1 (−12 .. 12, exact) in
/// bytes 0..3, element order; bits 16..31 of v are ignored. Three byte
/// permutes: the magnitudes and their negations looked up by the low three
/// bits of each nibble, then per byte the one its sign bit picks.
__host__ __device__ __forceinline__ uint32_t e2m1x4_to_s8x4(uint32_t v) {
    const uint32_t idx = v & 0x7777u;
    const uint32_t pos = byte_perm(kE2m1PosLo, kE2m1PosHi, idx);
    const uint32_t neg = byte_perm(kE2m1NegLo, kE2m1NegHi, idx);
    const uint32_t pick = 0x3210u | ((v >> 1) & 0x4444u);  // byte j: j (pos) or j + 4 (neg)
    return byte_perm(pos, neg, pick);
}

/// One E2M1 code (low 4 bits of code) -> its float value (±0 .. ±6, exact).
__host__ __device__ __forceinline__ float e2m1_to_float(uint32_t code) {
    const float m = 0.5f * static_cast<float>(byte_perm(kE2m1PosLo, kE2m1PosHi, code & 7u) & 0xFFu);
    return (code & 8u) ? -m : m;
}

/// Two E4M3 codes in the low 16 bits of v (byte 0 = .x) -> their exact
/// values (cvt.rn.f16x2.e4m3x2 on sm_89 and later, then widened); NaN codes
/// (0x7F, 0xFF) give NaN.
__host__ __device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t v) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xFFFFu), __NV_E4M3);
    return __half22float2(__half2(h));
}

/// One E4M3 code -> its exact value (NaN codes give NaN).
__host__ __device__ __forceinline__ float e4m3_to_float(uint32_t code) {
    return e4m3x2_to_float2(code & 0xFFu).x;
}

}  // namespace quern::cuda::mf
