#include "quant/traits.h"

#include <array>

#include "core/error.h"
#include "quant/blocks.h"
#include "quant/ref_rows.h"

namespace quern {

namespace {

// Block sizes (elements, bytes) as ggml defines the formats (ggml-common.h);
// the structs in blocks.h must agree byte for byte. F8_E4M3_B32 and NVFP4 are
// quern's (blocks.h) and must agree with core/dtype.cpp.
static_assert(QK4_0 == 32 && sizeof(block_q4_0) == 18);
static_assert(QK4_1 == 32 && sizeof(block_q4_1) == 20);
static_assert(QK5_0 == 32 && sizeof(block_q5_0) == 22);
static_assert(QK5_1 == 32 && sizeof(block_q5_1) == 24);
static_assert(QK8_0 == 32 && sizeof(block_q8_0) == 34);
static_assert(QK8_1 == 32 && sizeof(block_q8_1) == 36);
static_assert(QK_K == 256);
static_assert(sizeof(block_q2_K) == 2 * 2 + QK_K / 16 + QK_K / 4);                       // 84
static_assert(sizeof(block_q3_K) == 2 + QK_K / 4 + QK_K / 8 + 12);                        // 110
static_assert(sizeof(block_q4_K) == 2 * 2 + K_SCALE_SIZE + QK_K / 2);                     // 144
static_assert(sizeof(block_q5_K) == 2 * 2 + K_SCALE_SIZE + QK_K / 2 + QK_K / 8);          // 176
static_assert(sizeof(block_q6_K) == 2 + QK_K / 16 + 3 * QK_K / 4);                        // 210
static_assert(sizeof(block_q8_K) == sizeof(float) + QK_K + QK_K / 16 * sizeof(int16_t));  // 292
// quern's own layouts: an f32 scale, then codes (and NVFP4's E4M3 group scales).
static_assert(QK_F8 == 32 && sizeof(block_f8_b32) == 4 + QK_F8);                                    // 36
static_assert(QK_MXFP4 == 32 && sizeof(block_mxfp4) == 1 + QK_MXFP4 / 2);  // 17 (ggml's block_mxfp4)
static_assert(QK_NVFP4 == 64 && sizeof(block_nvfp4) == 4 + QK_NVFP4 / NVFP4_GROUP + QK_NVFP4 / 2);  // 40

template <class Block>
constexpr int bytes() {
    return static_cast<int>(sizeof(Block));
}

using namespace ref;
constexpr std::array<QuantTraits, 18> kTraits{{
    {DType::F32, 1, 4, to_float_f32, from_float_f32, DType::F32},
    {DType::F16, 1, 2, to_float_f16, from_float_f16, DType::F32},
    {DType::BF16, 1, 2, to_float_bf16, from_float_bf16, DType::F32},
    {DType::Q4_0, QK4_0, bytes<block_q4_0>(), to_float_q4_0, from_float_q4_0, DType::Q8_0},
    {DType::Q4_1, QK4_1, bytes<block_q4_1>(), to_float_q4_1, from_float_q4_1, DType::Q8_1},
    {DType::Q5_0, QK5_0, bytes<block_q5_0>(), to_float_q5_0, from_float_q5_0, DType::Q8_0},
    {DType::Q5_1, QK5_1, bytes<block_q5_1>(), to_float_q5_1, from_float_q5_1, DType::Q8_1},
    {DType::Q8_0, QK8_0, bytes<block_q8_0>(), to_float_q8_0, from_float_q8_0, DType::Q8_0},
    {DType::Q8_1, QK8_1, bytes<block_q8_1>(), to_float_q8_1, from_float_q8_1, DType::Q8_1},
    {DType::Q2_K, QK_K, bytes<block_q2_K>(), to_float_q2_K, from_float_q2_K, DType::Q8_K},
    {DType::Q3_K, QK_K, bytes<block_q3_K>(), to_float_q3_K, from_float_q3_K, DType::Q8_K},
    {DType::Q4_K, QK_K, bytes<block_q4_K>(), to_float_q4_K, from_float_q4_K, DType::Q8_K},
    {DType::Q5_K, QK_K, bytes<block_q5_K>(), to_float_q5_K, from_float_q5_K, DType::Q8_K},
    {DType::Q6_K, QK_K, bytes<block_q6_K>(), to_float_q6_K, from_float_q6_K, DType::Q8_K},
    {DType::Q8_K, QK_K, bytes<block_q8_K>(), to_float_q8_K, from_float_q8_K, DType::Q8_K},
    // weight-only: the matmul dequantizes inside its float kernels, activations stay f32
    {DType::F8_E4M3_B32, QK_F8, bytes<block_f8_b32>(), to_float_f8_b32, from_float_f8_b32, DType::F32},
    {DType::NVFP4, QK_NVFP4, bytes<block_nvfp4>(), to_float_nvfp4, from_float_nvfp4, DType::F32},
    // doubled E2M1 values are small integers: an integer dot product with Q8_0, as Q4_0
    {DType::MXFP4, QK_MXFP4, bytes<block_mxfp4>(), to_float_mxfp4, from_float_mxfp4, DType::Q8_0},
}};

}  // namespace

const QuantTraits* find_quant_traits(DType t) {
    for (const auto& tr : kTraits)
        if (tr.type == t) return &tr;
    return nullptr;
}

const QuantTraits& quant_traits(DType t) {
    if (const QuantTraits* tr = find_quant_traits(t)) return *tr;
    if (const DTypeInfo* info = dtype_info(static_cast<uint32_t>(t)))
        fail("no quantization traits for type {}: quern cannot (de)quantize it", info->name);
    fail("no quantization traits for unknown type id {}", static_cast<uint32_t>(t));
}

}  // namespace quern
