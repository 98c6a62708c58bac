// Element / block types of tensors. The numeric values below
// kDTypeQuernBase are GGML's type ids as stored in GGUF tensor infos (ggml.h
// `enum ggml_type`), so a GGUF type id can be cast directly once validated
// with dtype_is_ggml_id(). Types GGML lacks (those of safetensors checkpoints:
// FP8, U8, BOOL; and quern's own weight layouts F8_E4M3_B32 and NVFP4, into
// which FP8 and NVFP4 checkpoints are repacked at load) take ids from
// kDTypeQuernBase up, far above GGML's range, so GGML can add types without a
// collision; they never appear in a GGUF file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace quern {

enum class DType : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    BF16 = 30,
    MXFP4 = 39,  // OCP MX FP4: 32 E2M1 codes, one E8M0 scale (block_mxfp4, 17 bytes; gpt-oss experts)
    // quern-only types (not GGML's; see kDTypeQuernBase)
    U8 = 1024,
    BOOL = 1025,     // one byte per element, 0 or 1 (not checked)
    F8_E4M3 = 1026,  // OCP FP8 E4M3FN: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no inf, NaN = S.1111.111
    F8_E5M2 = 1027,  // OCP FP8 E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like inf/NaN
    // quern's weight-only layouts of FP8 / NVFP4 checkpoints (quant/blocks.h):
    F8_E4M3_B32 = 1028,  // blocks of 32 E4M3 codes with one f32 scale: w = e4m3(q) * d (block_f8_b32, 36 bytes)
    NVFP4 = 1029,        // 64 E2M1 codes, 4 E4M3 scales (16 each), one f32 global scale (block_nvfp4, 40 bytes)
};

/// First id of the types GGML does not define. GGUF files never hold them.
inline constexpr uint32_t kDTypeQuernBase = 1024;

/// Layout facts of one type: a tensor row of n elements (n a multiple of
/// block_size) occupies n / block_size * type_size bytes.
struct DTypeInfo {
    DType type;
    std::string_view name;  // as GGML names it: "q4_K" is written "Q4_K" here
    int block_size;         // elements per block (1 for plain types)
    int type_size;          // bytes per block
};

/// Facts for a known type; nullptr for a type id quern does not know.
const DTypeInfo* dtype_info(uint32_t id);
/// Facts for a known type (asserts it is known).
const DTypeInfo& dtype_info(DType t);
inline bool dtype_is_known(uint32_t id) { return dtype_info(id) != nullptr; }
/// True for the ids of GGML types quern knows: those a GGUF tensor may have.
inline bool dtype_is_ggml_id(uint32_t id) { return id < kDTypeQuernBase && dtype_is_known(id); }
std::string_view dtype_name(DType t);
/// Parses a name such as "Q4_K" or "q4_k" or "f16"; nullopt if unknown.
std::optional<DType> dtype_from_name(std::string_view name);
inline bool dtype_is_quantized(DType t) { return dtype_info(t).block_size > 1; }

/// Bytes of one row of n elements. Throws quern::Error when n is not a multiple
/// of the block size.
size_t row_size(DType t, int64_t n);

}  // namespace quern
