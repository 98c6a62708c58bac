// Helpers shared by the GEMV tests (gemv_cuda_test.cu, moe_cuda_test.cu).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "quant/blocks.h"
#include "quant/reference.h"

namespace quern::gemv_test {

/// The device's view of one quantized activation level: quantize_row_ref's
/// Q8_1 int8 values times the fp32 d = amax/127 the device computes (not the
/// block's fp16-rounded d). x: K floats, K a multiple of 32.
inline std::vector<float> dequantized_activation(const std::vector<float>& x) {
    const int64_t K = static_cast<int64_t>(x.size());
    std::vector<uint8_t> q(row_size(DType::Q8_1, K));
    quantize_row_ref(DType::Q8_1, x.data(), q.data(), K);
    std::vector<float> out(x.size());
    for (int64_t b = 0; b < K / 32; ++b) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[static_cast<size_t>(32 * b + j)]));
        const float d = amax / 127;
        block_q8_1 blk;
        std::memcpy(&blk, q.data() + b * sizeof(block_q8_1), sizeof blk);
        for (int j = 0; j < 32; ++j) out[static_cast<size_t>(32 * b + j)] = static_cast<float>(blk.qs[j]) * d;
    }
    return out;
}

}  // namespace quern::gemv_test
