// Random quantized matrices and device buffers for the GEMM tests
// (prefill_cuda_test.cu, qw_gemm_test.cu).
#pragma once
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/weights.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "quant/reference.h"

namespace quern::test {

inline float bf16_to_float(uint16_t b) {
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

/// A device copy of v (uploaded on ctx's stream).
template <class T>
inline cuda::DeviceBuffer on_device(const std::vector<T>& v, cuda::CudaContext& ctx) {
    cuda::DeviceBuffer b(v.size() * sizeof(T));
    b.upload(v.data(), v.size() * sizeof(T), ctx.stream());
    return b;
}

/// A random N × K matrix of type t on the host (quantized by
/// quantize_row_ref) with its dequantized values.
struct HostMatrix {
    DType type;
    int64_t N, K;
    std::vector<uint8_t> bytes;
    std::vector<float> deq;  // N × K
};

inline HostMatrix random_matrix(DType t, int64_t N, int64_t K, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    HostMatrix m{t, N, K, std::vector<uint8_t>(row_size(t, K) * static_cast<size_t>(N)),
                 std::vector<float>(static_cast<size_t>(N * K))};
    std::vector<float> row(static_cast<size_t>(K));
    const size_t rb = row_size(t, K);
    for (int64_t r = 0; r < N; ++r) {
        for (auto& v : row) v = nd(rng) * 0.05f;
        row[static_cast<size_t>(rng() % K)] *= 20.0f;  // an outlier per row
        quantize_row_ref(t, row.data(), m.bytes.data() + static_cast<size_t>(r) * rb, K);
        dequantize_row_ref(t, m.bytes.data() + static_cast<size_t>(r) * rb, m.deq.data() + r * K, K);
    }
    return m;
}

inline cuda::DeviceWeight upload(cuda::CudaContext& ctx, HostMatrix& m) {
    return cuda::upload_weight(ctx, Tensor::contiguous(m.type, {m.K, m.N, 1, 1}, m.bytes.data(), "w"));
}

}  // namespace quern::test
