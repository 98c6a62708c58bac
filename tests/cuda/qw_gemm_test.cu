// qw_gemm (qw_gemm.h: the GEMM on the resident quantized weights) against
// the double product of the exact weights (dequantize_row_ref) and the BF16
// activations, on fresh random data.
//
// Needs a GPU that runs the sm_90a code: skips cleanly (GTEST_SKIP) without
// one. Outputs are poisoned (NaN bits) before each call; every element the
// call must write is checked finite and within tolerance, the padding past
// `rows` must keep the poison.
// Tolerance (as bq_gemm's, whose numerics it shares): each weight is formed
// in BF16 from a BF16 scale and offset (errors ≤ 2^-8 of |w| + |o| each,
// random in sign), so per element |y − ref| <= 2^-5·sqrt(Σ_k (x_k·gmax_k)^2)
// + 1e-5 (gmax_k: the largest |w| of k's 32-element group in that row), and
// over the whole product rms(y − ref) <= 2^-7·rms(ref).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/qw_gemm.h"
#include "core/dtype.h"
#include "core/fp16.h"
#include "gemm_test_util.h"

using namespace quern;
using quern::test::bf16_to_float;
using quern::test::count_glu_mismatches;
using quern::test::group_max;
using quern::test::HostMatrix;
using quern::test::on_device;
using quern::test::random_matrix;
using quern::test::upload;

namespace {

bool have_qw() {
    if (cuda::CudaContext::device_count() == 0) return false;
    return cuda::qw_supported(DType::Q4_K, 256);
}
#define REQUIRE_QW() \
    if (!have_qw()) GTEST_SKIP() << "no GPU running the sm_90a code"

struct ShapeGuard {  // the default kernel and shape again however a test ends
    ~ShapeGuard() {
        cuda::qw_gemm_set_shape(0, 0);
        cuda::qw_gemm_set_form(cuda::QwForm::kAuto);
    }
};

// The skinny kernel (8, 16, 32, 64 tokens per block by n; token groups of 64
// past that) and every shape of the tiled one (32, 64, 128 tokens per block × 1, 2 weight groups per
// warpgroup, and 256 × 1) on activation counts across and past the token tiles, the
// whole matrix and row ranges starting anywhere (the padding past `rows`
// keeps its poison), K of one split and of several (summed over a thread
// block cluster), N not a multiple of the block's rows.
TEST(QwGemm, MatchesDoubleReference) {
    REQUIRE_QW();
    cuda::CudaContext ctx;
    ShapeGuard guard;
    std::mt19937 rng(307);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (DType t : {DType::Q4_K, DType::Q6_K}) {
        for (const auto& [N, K] : {std::pair<int64_t, int64_t>{200, 256}, {300, 768}, {130, 4096}}) {
            ASSERT_TRUE(cuda::qw_supported(t, K));
            HostMatrix m = random_matrix(t, N, K, rng);
            cuda::DeviceWeight w = upload(ctx, m);
            cuda::PrefillGemm gemm(300, K, int64_t{64} << 20);
            const std::vector<float> gmax = group_max(m);
            for (int64_t n : {1, 7, 9, 16, 32, 33, 64, 65, 128, 129, 300}) {
                if (K == 4096 && n > 129) continue;  // the reference's cost
                std::vector<float> x(static_cast<size_t>(n * K));
                for (auto& v : x) v = nd(rng);
                cuda::DeviceBuffer dx = on_device(x, ctx);
                const uint16_t* xb = gemm.to_bf16(dx.as<float>(), K, n, K, ctx.stream());
                std::vector<double> ref(static_cast<size_t>(n * N)), tol(ref.size());
                for (int64_t r = 0; r < n; ++r)
                    for (int64_t j = 0; j < N; ++j) {
                        double s = 0, mag2 = 0;
                        for (int64_t k = 0; k < K; ++k) {
                            const double xv = bf16_to_float(fp32_to_bf16(x[static_cast<size_t>(r * K + k)]));
                            const size_t wi = static_cast<size_t>(j * K + k);
                            s += xv * m.deq[wi];
                            mag2 += (xv * gmax[wi]) * (xv * gmax[wi]);
                        }
                        ref[static_cast<size_t>(r * N + j)] = s;
                        tol[static_cast<size_t>(r * N + j)] = std::ldexp(1.0, -5) * std::sqrt(mag2) + 1e-5;
                    }
                for (int tokens : {0, 32, 64, 128, 256})  // 0: the skinny kernel
                    for (int groups : {1, 2}) {
                        if ((tokens == 256 || tokens == 0) && groups == 2) continue;  // one group at 256 tokens
                        cuda::qw_gemm_set_form(tokens == 0 ? cuda::QwForm::kSkinny : cuda::QwForm::kTiles);
                        cuda::qw_gemm_set_shape(tokens, groups);
                        for (const auto& [row0, rows] : {std::pair<int64_t, int64_t>{0, N}, {37, N - 69}}) {
                            const int64_t ldy = rows + 3;
                            cuda::DeviceBuffer dy(static_cast<size_t>(n * ldy) * 4);
                            dy.fill_bytes(0xFF, ctx.stream());
                            cuda::qw_gemm(w, row0, rows, xb, n, dy.as<float>(), ldy, ctx.stream());
                            std::vector<float> y(static_cast<size_t>(n * ldy));
                            dy.download(y.data(), y.size() * 4, ctx.stream());
                            int bad = 0;
                            double e2 = 0, r2 = 0;
                            for (int64_t r = 0; r < n; ++r) {
                                for (int64_t j = 0; j < rows; ++j) {
                                    const size_t ri = static_cast<size_t>(r * N + row0 + j);
                                    const float g = y[static_cast<size_t>(r * ldy + j)];
                                    e2 += (g - ref[ri]) * (g - ref[ri]);
                                    r2 += ref[ri] * ref[ri];
                                    if (!(std::fabs(g - ref[ri]) <= tol[ri]) && bad++ < 5)
                                        ADD_FAILURE() << dtype_name(t) << " K " << K << " n " << n << " rows " << row0
                                                      << "+" << rows << " shape " << tokens << "x" << groups << " at "
                                                      << r << "," << j << ": " << g << " vs " << ref[ri] << " (tol "
                                                      << tol[ri] << ")";
                                }
                                for (int64_t j = rows; j < ldy; ++j) {
                                    uint32_t bits;
                                    std::memcpy(&bits, &y[static_cast<size_t>(r * ldy + j)], 4);
                                    if (bits != 0xFFFFFFFFu && bad++ < 5) ADD_FAILURE() << "padding written at row " << r;
                                }
                            }
                            EXPECT_LE(std::sqrt(e2), std::ldexp(1.0, -7) * std::sqrt(r2))
                                << dtype_name(t) << " K " << K << " n " << n << " shape " << tokens << "x" << groups;
                            EXPECT_EQ(bad, 0) << dtype_name(t) << " K " << K << " n " << n << " rows " << row0 << "+"
                                              << rows << " shape " << tokens << "x" << groups;
                        }
                    }
            }
        }
    }
}

// Several matrices in one launch (qw_gemm_pieces: a layer's Q, K and V)
// write what a launch per matrix writes, each piece its own columns of y
// (the columns between pieces keep their poison); only the K splits, and so
// the fp32 summation order, may differ.
TEST(QwGemm, PiecesMatchOneLaunchPerMatrix) {
    REQUIRE_QW();
    cuda::CudaContext ctx;
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t K = 512;
    for (DType t : {DType::Q4_K, DType::Q6_K}) {
        std::vector<HostMatrix> hm;
        std::vector<cuda::DeviceWeight> dw;
        for (int64_t N : {300, 64, 130}) hm.push_back(random_matrix(t, N, K, rng));
        for (HostMatrix& m : hm) dw.push_back(upload(ctx, m));
        const cuda::QwPiece ps[3] = {{&dw[0], 0, 300, 0}, {&dw[1], 8, 48, 303}, {&dw[2], 0, 130, 353}};
        const int64_t ldy = 490;
        cuda::PrefillGemm gemm(200, K, int64_t{16} << 20);
        for (int64_t n : {5, 70, 200}) {
            std::vector<float> x(static_cast<size_t>(n * K));
            for (auto& v : x) v = nd(rng);
            cuda::DeviceBuffer dx = on_device(x, ctx);
            const uint16_t* xb = gemm.to_bf16(dx.as<float>(), K, n, K, ctx.stream());
            cuda::DeviceBuffer d1(static_cast<size_t>(n * ldy) * 4), d3(static_cast<size_t>(n * ldy) * 4);
            d1.fill_bytes(0xFF, ctx.stream());
            d3.fill_bytes(0xFF, ctx.stream());
            for (const cuda::QwPiece& p : ps)
                cuda::qw_gemm(*p.w, p.row0, p.rows, xb, n, d1.as<float>() + p.ycol, ldy, ctx.stream());
            cuda::qw_gemm_pieces(ps, 3, xb, n, d3.as<float>(), ldy, ctx.stream());
            std::vector<float> y1(static_cast<size_t>(n * ldy)), y3(y1.size());
            d1.download(y1.data(), y1.size() * 4, ctx.stream());
            d3.download(y3.data(), y3.size() * 4, ctx.stream());
            double r2 = 0;
            int64_t cnt = 0;
            for (float v : y1)
                if (std::isfinite(v)) r2 += static_cast<double>(v) * v, ++cnt;
            ASSERT_GT(cnt, 0);
            const double tol = 1e-4 * std::sqrt(r2 / static_cast<double>(cnt));
            int bad = 0;
            for (int64_t r = 0; r < n; ++r)
                for (int64_t j = 0; j < ldy; ++j) {
                    const size_t i = static_cast<size_t>(r * ldy + j);
                    const bool written = std::isfinite(y1[i]);
                    uint32_t bits;
                    std::memcpy(&bits, &y3[i], 4);
                    const bool ok = written ? std::fabs(y3[i] - y1[i]) <= tol : bits == 0xFFFFFFFFu;
                    if (!ok && bad++ < 5)
                        ADD_FAILURE() << dtype_name(t) << " n " << n << " at " << r << "," << j << ": " << y3[i]
                                      << " vs " << y1[i];
                }
            EXPECT_EQ(bad, 0) << dtype_name(t) << " n " << n;
        }
    }
    EXPECT_THROW(cuda::qw_gemm_pieces(nullptr, 1, nullptr, 1, nullptr, 1, ctx.stream()), std::runtime_error);
}

// qw_gemm_glu (gate and up products and the gated unit in one launch of the
// skinny kernel) against the double reference act(Σ x·G)·(Σ x·U) on fresh
// random data: one fused [gate | up] weight, two separate ones, and gate
// rows starting inside a weight; SiLU and GELU; 1-16 rows; K with one split
// and with several. The bound is the per
// product one above carried through the activation (|act'| <= 1.2) plus the
// BF16 rounding of h; padding columns of h keep their poison.
TEST(QwGemm, GluMatchesReference) {
    REQUIRE_QW();
    cuda::CudaContext ctx;
    std::mt19937 rng(41);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const char* const layouts[] = {"fused", "pair", "offset"};
    for (DType t : {DType::Q4_K, DType::Q6_K}) {
        for (const int64_t K : {int64_t{256}, int64_t{2048}}) {
            for (int lay = 0; lay < 3; ++lay) {
                const bool one = lay != 1;  // gate and up in one weight
                const int64_t F = one ? 144 : 136, g0 = lay == 2 ? 16 : 0;
                HostMatrix mg = random_matrix(t, one ? g0 + 2 * F : F, K, rng);
                HostMatrix mu = one ? mg : random_matrix(t, F, K, rng);
                cuda::DeviceWeight wg = upload(ctx, mg);
                cuda::DeviceWeight wu = one ? cuda::DeviceWeight() : upload(ctx, mu);
                const cuda::DeviceWeight& up = one ? wg : wu;
                const int64_t up0 = one ? g0 + F : 0;
                const std::vector<float> gmg = group_max(mg), gmu = group_max(mu);
                cuda::PrefillGemm gemm(64, K, int64_t{64} << 20);
                for (int64_t n : {1, 9, 16})
                    for (const bool gelu : {false, true}) {
                        ASSERT_TRUE(cuda::qw_glu_supported(wg, up, n));
                        const int64_t ldh = F + 5;
                        std::vector<float> x(static_cast<size_t>(n * K));
                        for (auto& v : x) v = nd(rng);
                        cuda::DeviceBuffer dx = on_device(x, ctx), dh(static_cast<size_t>(n * ldh) * 2);
                        const uint16_t* xb = gemm.to_bf16(dx.as<float>(), K, n, K, ctx.stream());
                        dh.fill_bytes(0xFF, ctx.stream());
                        cuda::qw_gemm_glu(wg, g0, up, up0, F, xb, n, dh.as<uint16_t>(), ldh, gelu, ctx.stream());
                        std::vector<uint16_t> h(static_cast<size_t>(n * ldh));
                        dh.download(h.data(), h.size() * 2, ctx.stream());
                        const int bad = count_glu_mismatches(
                            h, n, ldh, F, x, mg, gmg, g0, mu, gmu, up0, gelu,
                            std::string(dtype_name(t)) + " K " + std::to_string(K) + " " + layouts[lay] + " n " +
                                std::to_string(n));
                        EXPECT_EQ(bad, 0) << dtype_name(t) << " K " << K << " " << layouts[lay] << " n " << n;
                    }
            }
        }
    }
    // Refusals: two types, too many rows, ranges past a matrix.
    HostMatrix a = random_matrix(DType::Q4_K, 64, 256, rng), b = random_matrix(DType::Q6_K, 64, 256, rng);
    cuda::DeviceWeight wa = upload(ctx, a), wb = upload(ctx, b);
    cuda::DeviceBuffer dx(static_cast<size_t>(65 * 256) * 2), dh(static_cast<size_t>(65 * 64) * 2);
    const auto* xb = dx.as<uint16_t>();
    auto* hb = dh.as<uint16_t>();
    EXPECT_FALSE(cuda::qw_glu_supported(wa, wb, 8));
    EXPECT_THROW(cuda::qw_gemm_glu(wa, 0, wb, 0, 64, xb, 8, hb, 64, false, ctx.stream()), std::runtime_error);
    EXPECT_THROW(cuda::qw_gemm_glu(wa, 0, wa, 0, 64, xb, 17, hb, 64, false, ctx.stream()), std::runtime_error);
    EXPECT_THROW(cuda::qw_gemm_glu(wa, 0, wa, 8, 64, xb, 8, hb, 64, false, ctx.stream()), std::runtime_error);
    EXPECT_THROW(cuda::qw_gemm_glu(wa, 0, wa, 0, 64, xb, 8, hb, 63, false, ctx.stream()), std::runtime_error);
    EXPECT_THROW(cuda::qw_gemm_glu(wa, 0, wa, 0, 64, xb + 1, 8, hb, 64, false, ctx.stream()), std::runtime_error);
    ctx.synchronize();
}

// Refusals: types and row lengths it has no kernel for, shapes out of range,
// misaligned activations — each a quern::Error, nothing launched.
TEST(QwGemm, RejectsBadArguments) {
    REQUIRE_QW();
    cuda::CudaContext ctx;
    std::mt19937 rng(5);
    EXPECT_FALSE(cuda::qw_supported(DType::Q8_0, 256));
    EXPECT_FALSE(cuda::qw_supported(DType::Q4_K, 128));
    EXPECT_FALSE(cuda::qw_supported(DType::F16, 256));
    HostMatrix q8 = random_matrix(DType::Q8_0, 64, 256, rng);
    HostMatrix q4 = random_matrix(DType::Q4_K, 64, 256, rng);
    cuda::DeviceWeight w8 = upload(ctx, q8), w4 = upload(ctx, q4);
    cuda::DeviceBuffer dx(static_cast<size_t>(65 * 256) * 2 + 16), dy(static_cast<size_t>(65 * 64) * 4);
    const auto* xb = dx.as<uint16_t>();
    float* y = dy.as<float>();
    EXPECT_THROW(cuda::qw_gemm(w8, 0, 64, xb, 1, y, 64, ctx.stream()), std::runtime_error);
    EXPECT_THROW(cuda::qw_gemm(w4, 0, 64, xb, 0, y, 64, ctx.stream()), std::runtime_error);
    EXPECT_THROW(cuda::qw_gemm(w4, 1, 64, xb, 1, y, 64, ctx.stream()), std::runtime_error);
    EXPECT_THROW(cuda::qw_gemm(w4, 0, 64, xb, 1, y, 63, ctx.stream()), std::runtime_error);
    EXPECT_THROW(cuda::qw_gemm(w4, 0, 64, xb + 1, 1, y, 64, ctx.stream()), std::runtime_error);
    EXPECT_THROW(cuda::qw_gemm(w4, 0, 64, nullptr, 1, y, 64, ctx.stream()), std::runtime_error);
    EXPECT_NO_THROW(cuda::qw_gemm(w4, 0, 64, xb, 65, y, 64, ctx.stream()));
    ctx.synchronize();
}

}  // namespace
