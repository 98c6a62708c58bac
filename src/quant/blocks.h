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
//   K-quants: 256-element super-blocks of sub-blocks with 6-bit (Q3_K..Q5_K)
//   or 4-bit (Q2_K) / 8-bit (Q6_K) sub-block scales; see src/quant/reference.cpp.
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

}  // namespace quern
