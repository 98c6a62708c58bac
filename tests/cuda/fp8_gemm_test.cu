// fp8_gemm (fp8_gemm.h: the W8A8 GEMM on TMA and wgmma) against the double
// product of the same E4M3 codes and scales, on fresh random data; and the
// argument checks of the tensor-map encoder (tma.h), which need no GPU.
//
// The GEMM tests need a GPU that runs the sm_90a code and skip cleanly
// (GTEST_SKIP) without one. Outputs are poisoned (NaN bits) before each
// call; every element the call must write is checked within tolerance, and
// every other one must keep the poison.
// Data: normal values of per-row magnitudes quantized per row to E4M3
// (quantize_fp8_rows, as the engine quantizes weights and activations).
// Tolerance: the products of codes are exact, and the slices' sums are
// added in fp32, but inside each k32 step the tensor cores align the
// products to the largest and keep about 13 bits below it (cuBLASLt's FP8
// GEMM has the same): |y − ref| <= 2^-12 · sx · sw · Σ_k |qx·qw| (+1e-30
// for all-zero terms), 2^-10 for sums of one sign, whose truncations do not
// cancel. A wrong index or scale is off by the order of the terms
// themselves. (Codes drawn uniformly over every exponent put most of a
// step's sum in one or two products and the truncation of the rest at up
// to ~2^-10 of it: not what a quantized row looks like.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/fp8_gemm.h"
#include "backend/cuda/tma.h"
#include "quant/fp8.h"

using namespace quern;

namespace {

bool have_fp8_gemm() { return cuda::CudaContext::device_count() > 0 && cuda::fp8_gemm_supported(128); }
#define REQUIRE_FP8_GEMM() \
    if (!have_fp8_gemm()) GTEST_SKIP() << "no GPU running the sm_90a code"

constexpr uint32_t kPoison = 0xFFFFFFFFu;

struct Case {
    int64_t N, K, n, row0, rows, ldy;
};

void check_case(cuda::CudaContext& ctx, const Case& c, std::mt19937& rng, bool one_sign = false, bool splits = false) {
    SCOPED_TRACE("N " + std::to_string(c.N) + " K " + std::to_string(c.K) + " n " + std::to_string(c.n) + " rows " +
                 std::to_string(c.row0) + "+" + std::to_string(c.rows) + " ldy " + std::to_string(c.ldy) +
                 (splits ? " with K splits" : ""));
    // Codes as the engine makes them: normal values (rows of different
    // magnitudes) quantized per row with absmax / 448 (quantize_fp8_rows).
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> mag(0.01f, 10.0f);
    const auto make = [&](int64_t rows, std::vector<uint8_t>& q, std::vector<float>& sc, bool zero_row) {
        std::vector<float> v(static_cast<size_t>(rows * c.K));
        for (int64_t r = 0; r < rows; ++r) {
            const float m = mag(rng);
            for (int64_t k = 0; k < c.K; ++k) {
                const float x = nd(rng) * m;
                v[static_cast<size_t>(r * c.K + k)] = one_sign ? std::fabs(x) : x;
            }
        }
        // A row of zeros (scale 1, every code 0) must work too.
        if (zero_row) std::fill(v.begin() + c.K, v.begin() + 2 * c.K, 0.0f);
        q.resize(v.size());
        sc.resize(static_cast<size_t>(rows));
        quantize_fp8_rows(v.data(), rows, c.K, q.data(), sc.data());
    };
    std::vector<uint8_t> qw, qx;
    std::vector<float> sw, sx;
    make(c.N, qw, sw, false);
    make(c.n, qx, sx, c.n > 2);
    cuda::DeviceBuffer dqw(qw.size()), dqx(qx.size()), dsw(sw.size() * 4), dsx(sx.size() * 4),
        dy(static_cast<size_t>(c.n * c.ldy) * 4);
    dqw.upload(qw.data(), qw.size(), ctx.stream());
    dqx.upload(qx.data(), qx.size(), ctx.stream());
    dsw.upload(sw.data(), sw.size() * 4, ctx.stream());
    dsx.upload(sx.data(), sx.size() * 4, ctx.stream());
    dy.fill_bytes(0xFF, ctx.stream());
    // With scratch the small cases split K (few blocks): as many splits as
    // the GPU's SMs over the blocks allow, up to 8.
    const int64_t work_elems = splits ? 8 * c.n * c.rows : 0;
    cuda::DeviceBuffer work(static_cast<size_t>(std::max<int64_t>(work_elems, 1)) * 4);
    cuda::fp8_gemm(dqw.as<uint8_t>(), dsw.as<float>(), c.N, c.K, c.row0, c.rows, dqx.as<uint8_t>(), dsx.as<float>(),
                   c.n, dy.as<float>(), c.ldy, ctx.stream(), splits ? work.as<float>() : nullptr, work_elems);
    std::vector<float> y(static_cast<size_t>(c.n * c.ldy));
    dy.download(y.data(), y.size() * 4, ctx.stream());
    std::vector<double> fw(qw.size()), fx(qx.size());
    for (size_t i = 0; i < qw.size(); ++i) fw[i] = fp8_e4m3_to_float(qw[i]);
    for (size_t i = 0; i < qx.size(); ++i) fx[i] = fp8_e4m3_to_float(qx[i]);
    int bad = 0, touched = 0;
    for (int64_t r = 0; r < c.n; ++r)
        for (int64_t j = 0; j < c.ldy; ++j) {
            const float g = y[static_cast<size_t>(r * c.ldy + j)];
            if (j >= c.rows) {
                uint32_t bits = 0;
                std::memcpy(&bits, &g, 4);
                if (bits != kPoison && touched++ < 3) ADD_FAILURE() << "wrote past the product: row " << r << " col " << j;
                continue;
            }
            const double* xr = fx.data() + r * c.K;
            const double* wr = fw.data() + (c.row0 + j) * c.K;
            double dot = 0, mag = 0;
            for (int64_t k = 0; k < c.K; ++k) {
                dot += xr[k] * wr[k];
                mag += std::fabs(xr[k] * wr[k]);
            }
            const double s = static_cast<double>(sx[static_cast<size_t>(r)]) * sw[static_cast<size_t>(c.row0 + j)];
            const double ref = dot * s, tol = std::ldexp(1.0, one_sign ? -10 : -12) * mag * s + 1e-30;
            if (!(std::fabs(g - ref) <= tol) && bad++ < 5)
                ADD_FAILURE() << "row " << r << " col " << j << ": " << g << " vs " << ref << " (tol " << tol << ")";
        }
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(touched, 0);
}

// Every token tile (32, 64, 128 rows per block) with activation counts
// across and past it, K of one slice, of a partial last slice and of many
// slices (Llama-3-8B's down projection: 112), row ranges starting anywhere
// with N not a multiple of the block's 128 rows, output strides wider than
// the product; each with and without scratch for K splits.
TEST(Fp8Gemm, MatchesDoubleReference) {
    REQUIRE_FP8_GEMM();
    cuda::CudaContext ctx;
    std::mt19937 rng(811);
    const Case cases[] = {
        {256, 128, 1, 0, 256, 256},     {384, 1024, 5, 0, 384, 384},   {384, 1024, 32, 0, 384, 384},
        {384, 1024, 33, 0, 384, 390},   {256, 512, 64, 0, 256, 256},   {256, 512, 65, 64, 192, 200},
        {300, 272, 70, 17, 250, 260},   {130, 48, 3, 1, 129, 131},     {128, 14336, 40, 0, 128, 128},
        {512, 4096, 200, 128, 384, 384}, {200, 640, 129, 7, 193, 193},
    };
    for (const Case& c : cases) {
        check_case(ctx, c, rng);
        check_case(ctx, c, rng, false, /*splits=*/true);
    }
}

// Sums of one sign over long K (Llama-3-8B's down projection): every term
// positive, so the truncations inside each step add up instead of
// cancelling (~2^-11 of the sum). Without the fp32 adds per slice the
// accumulator itself would be truncated at every one of the 448 steps, of
// the order of 2^-6 of the sum: far outside the 2^-10 asked here.
TEST(Fp8Gemm, LongSumsOfOneSign) {
    REQUIRE_FP8_GEMM();
    cuda::CudaContext ctx;
    std::mt19937 rng(812);
    check_case(ctx, Case{256, 14336, 48, 0, 256, 256}, rng, /*one_sign=*/true);
    check_case(ctx, Case{256, 14336, 48, 0, 256, 256}, rng, true, /*splits=*/true);
}

TEST(Fp8Gemm, RejectsBadArguments) {
    REQUIRE_FP8_GEMM();
    cuda::CudaContext ctx;
    cuda::DeviceBuffer w(256 * 64), x(4 * 64), s(256 * 4), y(4 * 256 * 4);
    const auto* qw = w.as<uint8_t>();
    const auto* qx = x.as<uint8_t>();
    const auto* sc = s.as<float>();
    float* yy = y.as<float>();
    EXPECT_THROW(cuda::fp8_gemm(qw, sc, 256, 72, 0, 256, qx, sc, 4, yy, 256, ctx.stream()), std::runtime_error);  // K % 16
    EXPECT_THROW(cuda::fp8_gemm(qw, sc, 256, 64, 0, 256, qx, sc, 0, yy, 256, ctx.stream()), std::runtime_error);  // n = 0
    EXPECT_THROW(cuda::fp8_gemm(qw, sc, 256, 64, 8, 256, qx, sc, 4, yy, 256, ctx.stream()), std::runtime_error);  // past N
    EXPECT_THROW(cuda::fp8_gemm(qw, sc, 256, 64, 0, 256, qx, sc, 4, yy, 255, ctx.stream()), std::runtime_error);  // ldy
    EXPECT_THROW(cuda::fp8_gemm(qw + 1, sc, 255, 64, 0, 8, qx, sc, 4, yy, 8, ctx.stream()), std::runtime_error);  // align
    EXPECT_THROW(cuda::fp8_gemm(nullptr, sc, 256, 64, 0, 8, qx, sc, 4, yy, 8, ctx.stream()), std::runtime_error);
}

// The encoder's own checks come before any driver call: no GPU needed.
TEST(TensorMap, RejectsBadArguments) {
    alignas(256) static uint8_t buf[4096];
    const auto sw = CU_TENSOR_MAP_SWIZZLE_128B;
    EXPECT_THROW(cuda::tensor_map_2d_u8(buf + 8, 128, 8, 128, 128, 8, sw), std::runtime_error);   // base alignment
    EXPECT_THROW(cuda::tensor_map_2d_u8(buf, 128, 8, 120, 128, 8, sw), std::runtime_error);       // stride % 16
    EXPECT_THROW(cuda::tensor_map_2d_u8(buf, 128, 8, 112, 128, 8, sw), std::runtime_error);       // stride < cols
    EXPECT_THROW(cuda::tensor_map_2d_u8(buf, 128, 8, 128, 0, 8, sw), std::runtime_error);         // empty box
    EXPECT_THROW(cuda::tensor_map_2d_u8(buf, 512, 8, 512, 128, 300, sw), std::runtime_error);     // box over 256
    EXPECT_THROW(cuda::tensor_map_2d_u8(buf, 512, 8, 512, 256, 8, sw), std::runtime_error);       // wider than the swizzle
    EXPECT_THROW(cuda::tensor_map_2d_u8(nullptr, 128, 8, 128, 128, 8, sw), std::runtime_error);
}

}  // namespace
