// Reference (scalar) encodings of the 8- and 4-bit float formats used by FP8
// and NVFP4 checkpoints and by FP8 GEMMs, and the scaling recipes built on
// them. These are the definitions the kernels are tested against.
//
// Formats (OCP "8-bit Floating Point Specification" (OFP8) v1.0, 2023, and the
// OCP Microscaling Formats (MX) v1.0 spec for E2M1):
//   E4M3 (E4M3FN): sign, 4 exponent bits (bias 7), 3 mantissa bits. No
//     infinities; S.1111.111 is NaN; largest finite 448; subnormals down to
//     2^-9. The encoder saturates to ±448 (a scaled value that overflows
//     stays the largest finite value instead of becoming NaN).
//   E5M2: sign, 5 exponent bits (bias 15), 2 mantissa bits; IEEE-style
//     infinities and NaNs; largest finite 57344; subnormals down to 2^-16.
//   E2M1 (FP4): sign, 2 exponent bits (bias 1), 1 mantissa bit; values
//     0, 0.5, 1, 1.5, 2, 3, 4, 6; no inf/NaN.
// All encoders round to nearest, ties to even, and keep subnormals (no flush
// to zero).
#pragma once
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace quern {

/// The value of every E4M3 byte (NaN for 0x7F and 0xFF), for decoders that
/// look codes up: sign, then mant · 2^-9 (exponent field 0, subnormal) or
/// (8 + mant) · 2^(field - 10). Equal to fp8_e4m3_to_float (fp8_test).
inline constexpr std::array<float, 256> kFp8E4M3Values = [] {
    std::array<float, 256> t{};
    for (int v = 0; v < 256; ++v) {
        const int mag = v & 0x7F, field = mag >> 3, mant = mag & 7;
        if (mag == 0x7F) {
            t[static_cast<size_t>(v)] = std::numeric_limits<float>::quiet_NaN();
            continue;
        }
        float x = static_cast<float>(field == 0 ? mant : 8 + mant);
        for (int e = field == 0 ? -9 : field - 10; e < 0; ++e) x *= 0.5f;  // exact: powers of two
        for (int e = field == 0 ? -9 : field - 10; e > 0; --e) x *= 2.0f;
        t[static_cast<size_t>(v)] = (v & 0x80) ? -x : x;
    }
    return t;
}();

/// E4M3 byte → float (exact). NaN codes (0x7F, 0xFF) give NaN.
float fp8_e4m3_to_float(uint8_t v);
/// float → E4M3: round to nearest even; |x| beyond 448 (and ±inf) saturates
/// to ±448; NaN → 0x7F.
uint8_t float_to_fp8_e4m3(float x);

/// E5M2 byte → float (exact), with ±inf and NaN.
float fp8_e5m2_to_float(uint8_t v);
/// float → E5M2: round to nearest even; overflow → ±inf (IEEE behaviour);
/// NaN → 0x7F.
uint8_t float_to_fp8_e5m2(float x);

/// E8M0 byte (an MX block scale: 8 exponent bits, bias 127, no sign or
/// mantissa) → 2^(e - 127), exact (0 gives the subnormal 2^-127); NaN for
/// 0xFF. Inline: the MXFP4 kernels call it once per block.
inline float e8m0_to_float(uint8_t e) {
    const uint32_t bits = e == 0 ? 0x00400000u : e == 0xFF ? 0x7FC00000u : static_cast<uint32_t>(e) << 23;
    return std::bit_cast<float>(bits);
}

/// E2M1 nibble (low 4 bits of v) → float.
float fp4_e2m1_to_float(uint8_t v);
/// float → E2M1 nibble: round to nearest even; |x| > 6 saturates to ±6.
uint8_t float_to_fp4_e2m1(float x);

/// FP8 with one scale per row (per output channel for weights, per token
/// for activations): for each of `rows` rows of `cols` floats (row-major,
/// innermost = cols), scale[r] = absmax(row)/448 (1 for an all-zero row) and
/// q[r][c] = E4M3(x[r][c] / scale[r]); x ≈ scale[r] · q. An FP8 GEMM then
/// multiplies the codes and applies both operands' scales as outer factors:
/// y[i][j] = sx[i] · sw[j] · Σ_k qx[i][k] · qw[j][k].
void quantize_fp8_rows(const float* x, int64_t rows, int64_t cols, uint8_t* q, float* scale);
/// One scale for the whole tensor (absmax/448): the recipe that per-row
/// scaling replaces; kept to show what it loses on outlier rows.
void quantize_fp8_tensor(const float* x, int64_t n, uint8_t* q, float* scale);

/// NVFP4 as NVIDIA's TensorRT Model Optimizer publishes it: for a row-major
/// weight [rows][cols] (cols % 16 == 0), element k of block b (16 elements)
/// is  w = e2m1(q) · e4m3(block_scale[b]) · global_scale,  two E2M1 codes per
/// byte (element 2i in the low nibble, 2i+1 in the high), one E4M3 block
/// scale per 16 elements, one FP32 global scale per tensor.
/// Reference quantizer: global_scale = amax(tensor) / (6 · 448) (1 if all
/// zero); block_scale = E4M3(block_amax / (6 · global_scale)); codes =
/// E2M1(w / (e4m3(block_scale) · global_scale)) (a zero block scale gives
/// zero codes). packed: rows · cols/2 bytes; block_scale: rows · cols/16.
void quantize_nvfp4(const float* w, int64_t rows, int64_t cols, uint8_t* packed, uint8_t* block_scale,
                    float* global_scale);
/// Dequantizes an NVFP4 tensor of the layout above into rows · cols floats.
void dequantize_nvfp4(const uint8_t* packed, const uint8_t* block_scale, float global_scale, int64_t rows,
                      int64_t cols, float* w);

/// The activations of the CUDA FP8 prefill, on the CPU: each of `rows` rows
/// of K floats (x, row-major) is rounded to BF16 (the GEMM input), then
/// quantized to E4M3 with one scale per row (quantize_fp8_rows: absmax/448)
/// and written back dequantized, scale · e4m3(code), to `out` (may be x).
void round_fp8_activation_rows(const float* x, int64_t rows, int64_t K, float* out);

}  // namespace quern
