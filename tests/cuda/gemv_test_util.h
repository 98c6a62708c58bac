// Helpers shared by the GEMV tests (gemv_cuda_test.cu, moe_cuda_test.cu).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
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

/// N rows of K Gaussian values through the reference quantizer of type t
/// (exact for the float types), in GGUF's row layout.
inline std::vector<uint8_t> gaussian_weights(DType t, int64_t N, int64_t K, std::mt19937& rng) {
    const size_t rb = row_size(t, K);
    std::vector<uint8_t> w(rb * static_cast<size_t>(N));
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t r = 0; r < N; ++r) {
        for (auto& v : row) v = g(rng);
        quantize_row_ref(t, row.data(), w.data() + static_cast<size_t>(r) * rb, K);
    }
    return w;
}

}  // namespace quern::gemv_test
