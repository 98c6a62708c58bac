#include "core/dtype.h"

#include <array>
#include <cctype>
#include <string>

#include "core/error.h"

namespace quern {

namespace {
// Block sizes and byte sizes follow ggml's block definitions (ggml-common.h),
// and for quern's own F8_E4M3_B32 / NVFP4 the structs of src/quant/blocks.h,
// which static_asserts the same numbers against them.
constexpr std::array<DTypeInfo, 27> kTypes{{
    {DType::F32, "F32", 1, 4},
    {DType::F16, "F16", 1, 2},
    {DType::Q4_0, "Q4_0", 32, 18},
    {DType::Q4_1, "Q4_1", 32, 20},
    {DType::Q5_0, "Q5_0", 32, 22},
    {DType::Q5_1, "Q5_1", 32, 24},
    {DType::Q8_0, "Q8_0", 32, 34},
    {DType::Q8_1, "Q8_1", 32, 36},
    {DType::Q2_K, "Q2_K", 256, 84},
    {DType::Q3_K, "Q3_K", 256, 110},
    {DType::Q4_K, "Q4_K", 256, 144},
    {DType::Q5_K, "Q5_K", 256, 176},
    {DType::Q6_K, "Q6_K", 256, 210},
    {DType::Q8_K, "Q8_K", 256, 292},
    {DType::I8, "I8", 1, 1},
    {DType::I16, "I16", 1, 2},
    {DType::I32, "I32", 1, 4},
    {DType::I64, "I64", 1, 8},
    {DType::F64, "F64", 1, 8},
    {DType::BF16, "BF16", 1, 2},
    {DType::MXFP4, "MXFP4", 32, 17},
    {DType::U8, "U8", 1, 1},
    {DType::BOOL, "BOOL", 1, 1},
    {DType::F8_E4M3, "F8_E4M3", 1, 1},
    {DType::F8_E5M2, "F8_E5M2", 1, 1},
    {DType::F8_E4M3_B32, "F8_E4M3_B32", 32, 36},  // quern's layouts: quant/blocks.h
    {DType::NVFP4, "NVFP4", 64, 40},
}};
}  // namespace

const DTypeInfo* dtype_info(uint32_t id) {
    for (const auto& t : kTypes)
        if (static_cast<uint32_t>(t.type) == id) return &t;
    return nullptr;
}

const DTypeInfo& dtype_info(DType t) {
    const DTypeInfo* i = dtype_info(static_cast<uint32_t>(t));
    if (!i) fail("internal: unknown dtype id {}", static_cast<uint32_t>(t));
    return *i;
}

std::string_view dtype_name(DType t) { return dtype_info(t).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
    std::string up(name);
    for (auto& c : up) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    for (const auto& t : kTypes)
        if (t.name == up) return t.type;
    return std::nullopt;
}

size_t row_size(DType t, int64_t n) {
    const auto& i = dtype_info(t);
    if (n < 0 || n % i.block_size != 0)
        fail("row of {} elements is not a whole number of {} blocks ({} elements each)", n, i.name,
             i.block_size);
    return static_cast<size_t>(n / i.block_size) * static_cast<size_t>(i.type_size);
}

}  // namespace quern
