// Block layouts of GGML's quantized types, byte for byte as GGUF stores them
// (ggml-common.h). Each block holds `QK*` consecutive elements of one row.
// fp16 fields are raw IEEE binary16 bits (uint16_t); see core/fp16.h.
//
// Dequantization formulas (per element j of a block):
//   Q4_0: (q - 8) * d                 q = 4-bit, low nibbles are elements 0..15, high 16..31
//   Q4_1: q * d + m
//   Q5_0: (q - 16) * d                q = 4 bits from qs | 1 bit from qh (bit j)
//   Q5_1: q * d + m
//   Q8_0: q * d                       q signed 8-bit
//   Q8_1: q * d                       s = d * sum(q) (activation type)
//   MXFP4: e2m1(q) * 2^(e - 127)      q = E2M1 nibble, low nibbles are elements 0..15,
//                                     high 16..31; e = E8M0 scale (OCP MX v1.0)
//   K-quants: 256-element super-blocks of sub-blocks with 6-bit (Q3_K..Q5_K)
//   or 4-bit (Q2_K) / 8-bit (Q6_K) sub-block scales; see src/quant/reference.cpp.
//
// quern's own weight-only layouts (not GGML's; FP8 and NVFP4 checkpoints are
// repacked into them at load, src/model/hf_quant.cpp; quant/fp8.h defines the
// minifloats):
//   F8_E4M3_B32: e4m3(q) * d                   q = OCP E4M3 code, d = f32 scale
//   NVFP4:       e2m1(q) * (e4m3(sc[j / 16]) * d)   the product in brackets
//                rounded to f32 first (as NVIDIA's model optimizer computes the
//                per-block scale); q = E2M1 nibble, element 2i in the low
//                nibble of qs[i], 2i + 1 in the high one; d = the tensor's f32
//                global scale, repeated in every block.
#pragma once
#include <cstdint>

namespace quern {

inline constexpr int QK4_0 = 32;
inline constexpr int QK4_1 = 32;
inline constexpr int QK5_0 = 32;
inline constexpr int QK5_1 = 32;
inline constexpr int QK8_0 = 32;
inline constexpr int QK8_1 = 32;
inline constexpr int QK_K = 256;
inline constexpr int K_SCALE_SIZE = 12;

struct block_q4_0 {
    uint16_t d;
    uint8_t qs[QK4_0 / 2];
};
static_assert(sizeof(block_q4_0) == 18);

struct block_q4_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qs[QK4_1 / 2];
};
static_assert(sizeof(block_q4_1) == 20);

struct block_q5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
};
static_assert(sizeof(block_q5_0) == 22);

struct block_q5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
};
static_assert(sizeof(block_q5_1) == 24);

struct block_q8_0 {
    uint16_t d;
    int8_t qs[QK8_0];
};
static_assert(sizeof(block_q8_0) == 34);

struct block_q8_1 {
    uint16_t d;  // delta
    uint16_t s;  // d * sum(qs)
    int8_t qs[QK8_1];
};
static_assert(sizeof(block_q8_1) == 36);

// MXFP4 (OCP Microscaling, FP4 E2M1 elements with an E8M0 block scale; the
// experts of gpt-oss): ggml's block_mxfp4. Hugging Face checkpoints store the
// same codes with element 2i in the low nibble of byte i and the scales in a
// tensor of their own; the loader repacks them into this layout.
inline constexpr int QK_MXFP4 = 32;
struct block_mxfp4 {
    uint8_t e;
    uint8_t qs[QK_MXFP4 / 2];
};
static_assert(sizeof(block_mxfp4) == 17);

// 2-bit: 16 sub-blocks of 16; scales[i] low nibble = scale, high nibble = min.
struct block_q2_K {
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    uint16_t d;
    uint16_t dmin;
};
static_assert(sizeof(block_q2_K) == 84);

// 3-bit: 16 sub-blocks of 16; hmask holds the high bit; 6-bit scales packed in 12 bytes.
struct block_q3_K {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
};
static_assert(sizeof(block_q3_K) == 110);

// 4-bit: 8 sub-blocks of 32; 6-bit scales and mins packed in 12 bytes.
struct block_q4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
};
static_assert(sizeof(block_q4_K) == 144);

// 5-bit: as Q4_K plus one high bit per element in qh.
struct block_q5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};
static_assert(sizeof(block_q5_K) == 176);

// 6-bit: 16 sub-blocks of 16; low 4 bits in ql, high 2 bits in qh; int8 scales.
struct block_q6_K {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;
};
static_assert(sizeof(block_q6_K) == 210);

// 8-bit intermediate type for K-quant dot products (activations).
struct block_q8_K {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];  // sum of qs in groups of 16
};
static_assert(sizeof(block_q8_K) == 292);

// FP8 weights: 32 OCP E4M3 codes (element order) and their f32 scale. One
// scale per 32 elements holds any FP8 checkpoint scaling whose blocks are
// whole multiples of 32 columns: per tensor, per output channel, 128x128 blocks.
inline constexpr int QK_F8 = 32;
struct block_f8_b32 {
    float d;
    uint8_t qs[QK_F8];
};
static_assert(sizeof(block_f8_b32) == 36);

// NVFP4 weights: 64 E2M1 codes in 4 groups of 16, each group with its E4M3
// scale sc[g], and the tensor's f32 global scale d (the checkpoint's
// weight_scale_2) copied into every block so that a row is self-contained.
inline constexpr int QK_NVFP4 = 64;
inline constexpr int NVFP4_GROUP = 16;
struct block_nvfp4 {
    float d;
    uint8_t sc[QK_NVFP4 / NVFP4_GROUP];
    uint8_t qs[QK_NVFP4 / 2];
};
static_assert(sizeof(block_nvfp4) == 40);

}  // namespace quern
