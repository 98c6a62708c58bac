// The fixture and helpers of the CUDA decode-op tests (ops_cuda_test.cu,
// ops_rows_cuda_test.cu): poisoned device buffers with a guard zone, uploads
// and downloads on the context's stream, random rows, and the check of a
// quantized (Q8_1) activation row against a host quantization.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/ops.h"

namespace quern::cuda::test {

inline constexpr int64_t kGuard = 64;  // elements past the end that must keep the poison

inline bool is_poison(float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return u == 0xFFFFFFFFu;
}

class OpsCuda : public ::testing::Test {
protected:
    void SetUp() override {
        if (CudaContext::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
        ctx_ = std::make_unique<CudaContext>(0);
    }
    cudaStream_t st() { return ctx_->stream(); }

    template <class T>
    DeviceBuffer up(const std::vector<T>& v) {
        DeviceBuffer b(v.size() * sizeof(T));
        if (!v.empty()) b.upload(v.data(), v.size() * sizeof(T), st());
        return b;
    }
    /// A poisoned device buffer of n elements of T plus the guard zone.
    template <class T>
    DeviceBuffer poisoned(int64_t n) {
        DeviceBuffer b(static_cast<size_t>(n + kGuard) * sizeof(T));
        b.fill_bytes(0xFF, st());
        return b;
    }
    template <class T>
    std::vector<T> down(const DeviceBuffer& b, int64_t n) {
        ctx_->synchronize();
        std::vector<T> v(static_cast<size_t>(n));
        b.download(v.data(), v.size() * sizeof(T), st());
        return v;
    }
    void expect_guard(const DeviceBuffer& b, int64_t n_floats) {
        auto all = down<float>(b, n_floats + kGuard);
        for (int64_t i = n_floats; i < n_floats + kGuard; ++i)
            ASSERT_TRUE(is_poison(all[static_cast<size_t>(i)])) << "guard element " << i - n_floats << " overwritten";
    }

    std::unique_ptr<CudaContext> ctx_;
    std::mt19937 rng_{1234};
};

inline std::vector<float> randv(int64_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = d(rng);
    return v;
}

/// Checks (q planes, records) of one row of K elements against a host
/// quantization of y (the float row the device produced).
inline void expect_quantized(const std::vector<float>& y, const int8_t* q, const ActBlockInfo* info, int64_t K,
                      const std::string& what) {
    for (int64_t b = 0; b < K / 32; ++b) {
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(y[static_cast<size_t>(32 * b + i)]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum[2] = {0, 0};
        for (int i = 0; i < 32; ++i) {
            const int qv = static_cast<int>(std::roundf(y[static_cast<size_t>(32 * b + i)] * id));
            sum[i / 16] += qv;
            const int8_t got = q[(i / 16) * (K / 2) + 16 * b + (i % 16)];
            ASSERT_EQ(got, qv) << what << " block " << b << " element " << i;
        }
        const ActBlockInfo& r = info[b];
        ASSERT_EQ(r.d, d) << what << " block " << b;
        ASSERT_EQ(r.sum_lo, sum[0]) << what << " block " << b;
        ASSERT_EQ(r.sum_hi, sum[1]) << what << " block " << b;
        ASSERT_EQ(r.s, static_cast<float>(sum[0] + sum[1]) * d) << what << " block " << b;
    }
}

}  // namespace quern::cuda::test
