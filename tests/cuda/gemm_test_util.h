// Random quantized matrices and device buffers for the GEMM tests
// (prefill_cuda_test.cu, qw_gemm_test.cu).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cuda/context.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/weights.h"
#include "core/dtype.h"
#include "core/fp16.h"
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

/// The largest |w| of each weight's 32-element group, per weight (the
/// error bound of the GEMMs that form weights in BF16 from their group's
/// scale and offset).
inline std::vector<float> group_max(const HostMatrix& m) {
    std::vector<float> gm(m.deq.size());
    for (size_t i0 = 0; i0 + 32 <= gm.size(); i0 += 32) {
        float mx = 0;
        for (size_t i = i0; i < i0 + 32; ++i) mx = std::max(mx, std::fabs(m.deq[i]));
        for (size_t i = i0; i < i0 + 32; ++i) gm[i] = mx;
    }
    return gm;
}

/// A GLU output act(g)·u in double with its bound, for the GEMMs whose
/// gate and up products meet in one launch (bq_gemm_glu, qw_gemm_glu):
/// g = Σ_k x_k·G[grow][k], u likewise with U[urow]; act = SiLU, or GELU in
/// its tanh form. Each product may err by 2^-5·sqrt(Σ_k (x_k·gmax_k)^2) +
/// 1e-5 (gmax from group_max), carried through the activation (|act'| <=
/// 1.2), plus the BF16 rounding of the result. x: K floats, rounded to BF16
/// here as the kernels read them.
struct GluRef {
    double ref, tol;
};
inline GluRef glu_reference(const float* x, const HostMatrix& mg, const std::vector<float>& gmg, int64_t grow,
                            const HostMatrix& mu, const std::vector<float>& gmu, int64_t urow, bool gelu) {
    const int64_t K = mg.K;
    double g = 0, u = 0, mg2 = 0, mu2 = 0;
    for (int64_t k = 0; k < K; ++k) {
        const double xv = bf16_to_float(fp32_to_bf16(x[k]));
        const size_t ig = static_cast<size_t>(grow * K + k), iu = static_cast<size_t>(urow * K + k);
        g += xv * mg.deq[ig];
        u += xv * mu.deq[iu];
        mg2 += (xv * gmg[ig]) * (xv * gmg[ig]);
        mu2 += (xv * gmu[iu]) * (xv * gmu[iu]);
    }
    const double a = gelu ? 0.5 * g * (1.0 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)))
                          : g / (1.0 + std::exp(-g));
    const double ref = a * u;
    const double tg = std::ldexp(1.0, -5) * std::sqrt(mg2) + 1e-5;
    const double tu = std::ldexp(1.0, -5) * std::sqrt(mu2) + 1e-5;
    const double tol = 1.2 * (std::fabs(u) + tu) * tg + (std::fabs(a) + 1.2 * tg) * tu + std::ldexp(std::fabs(ref), -8) + 1e-5;
    return {ref, tol};
}

/// Checks a GLU launch's output h (n rows at stride ldh BF16, F values each,
/// the padding up to ldh still 0xFFFF) against glu_reference for gate rows
/// g0 + j of mg and up rows up0 + j of mu; x: n rows of K floats. Reports
/// the first five mismatches (prefixed by `what`) and returns their count.
inline int count_glu_mismatches(const std::vector<uint16_t>& h, int64_t n, int64_t ldh, int64_t F,
                                const std::vector<float>& x, const HostMatrix& mg, const std::vector<float>& gmg,
                                int64_t g0, const HostMatrix& mu, const std::vector<float>& gmu, int64_t up0,
                                bool gelu, const std::string& what) {
    const int64_t K = mg.K;
    int bad = 0;
    for (int64_t r = 0; r < n; ++r) {
        for (int64_t j = 0; j < F; ++j) {
            const auto [ref, tol] = glu_reference(x.data() + r * K, mg, gmg, g0 + j, mu, gmu, up0 + j, gelu);
            const float got = bf16_to_float(h[static_cast<size_t>(r * ldh + j)]);
            if (!(std::fabs(got - ref) <= tol) && bad++ < 5)
                ADD_FAILURE() << what << (gelu ? " gelu" : " silu") << " at " << r << "," << j << ": " << got
                              << " vs " << ref << " (tol " << tol << ")";
        }
        for (int64_t j = F; j < ldh; ++j)
            if (h[static_cast<size_t>(r * ldh + j)] != 0xFFFFu && bad++ < 5)
                ADD_FAILURE() << "padding written at row " << r;
    }
    return bad;
}

inline cuda::DeviceWeight upload(cuda::CudaContext& ctx, HostMatrix& m) {
    return cuda::upload_weight(ctx, Tensor::contiguous(m.type, {m.K, m.N, 1, 1}, m.bytes.data(), "w"));
}

}  // namespace quern::test
