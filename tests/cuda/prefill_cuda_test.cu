// The prefill kernels of the CUDA backend (gemm.h, ops.h "prefill") against
// CPU references on fresh random data.
//
// Needs a GPU at run time: every test skips cleanly (GTEST_SKIP) without one.
// Outputs are poisoned (NaN bits) before each call; every element the call
// must write is checked finite and within tolerance, and the elements it must
// not write (row padding past N, past the strides) must keep the poison.
// Tolerances:
//   dequantize_weight_bf16  |w − ref| <= 2^-8·|ref| per element, ref =
//       dequantize_row_ref (one BF16 rounding: 8 significant bits).
//   PrefillGemm  |y − ref| <= (2^-7 + K·2^-23)·Σ_k|x_k·w_k| + 1e-6, ref =
//       the double product of the float activations and dequantize_row_ref's
//       weights: BF16 rounds each factor once (relative 2^-8 each, 2^-7 for
//       the product), fp32 accumulation adds at most ~K·2^-24 relative
//       (doubled for slack). A bound, not a typical error: random rounding
//       errors stay far below it.
//   prefill_rope_kv_store  q and the f32 cache's k within 1e-5 (relative to
//       the row's largest element, + 1e-6) of cpu::rope; the f16 cache within
//       one fp16 ulp; v bit-exact (f32) / the fp16 rounding of v (f16).
//   prefill_attention  |o − ref| <= 2e-5 against cpu::attention on the same
//       (fp16-rounded) cache values; outputs are convex combinations of V in
//       [-1, 1], so the bound is absolute. The tensor-core path (f16 cache,
//       heads of 64 / 128: ops_flash.cu) rounds q·scale and the softmax
//       weights to f16 (relative 2^-11 each): 2e-3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/bq_gemm.h"
#include "backend/cuda/context.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/grouped_gemm.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_flash.h"
#include "backend/cuda/weights.h"
#include "core/dtype.h"
#include "core/fp16.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "quant/fp8.h"
#include "quant/reference.h"
#include "gemm_test_util.h"

using namespace quern;
using quern::test::bf16_to_float;
using quern::test::HostMatrix;
using quern::test::on_device;
using quern::test::random_matrix;
using quern::test::upload;

namespace {

bool have_gpu() { return cuda::CudaContext::device_count() > 0; }
#define REQUIRE_GPU() \
    if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU"

/// The row map of a paged pass from its device arrays (positions, table
/// offsets, block tables) and the block size; the rest left at its default.
cuda::PagedRows paged_rows(const cuda::DeviceBuffer& pos, const cuda::DeviceBuffer& toff,
                           const cuda::DeviceBuffer& tables, int block_size) {
    cuda::PagedRows pr;
    pr.pos = pos.as<int32_t>();
    pr.table_off = toff.as<int32_t>();
    pr.tables = tables.as<int32_t>();
    pr.block_size = block_size;
    return pr;
}

/// Offsets of groups of the given sizes, back to back: sizes.size() + 1
/// entries from 0 (the `off` argument of the grouped expert GEMMs).
std::vector<int32_t> group_offsets(const std::vector<int32_t>& sizes) {
    std::vector<int32_t> off(sizes.size() + 1, 0);
    for (size_t e = 0; e < sizes.size(); ++e) off[e + 1] = off[e] + sizes[e];
    return off;
}

// Every type the CUDA backend uploads (the five of the brief first).
const DType kGemmTypes[] = {DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::F16,  DType::BF16,
                            DType::F32,  DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                            DType::Q2_K, DType::Q3_K, DType::Q5_K, DType::F8_E4M3_B32, DType::NVFP4};

TEST(CudaPrefill, DequantizeBf16MatchesReference) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    std::mt19937 rng(101);
    for (DType t : kGemmTypes) {
        ASSERT_TRUE(cuda::gemm_weight_type_supported(t)) << dtype_name(t);
        const int64_t N = 37, K = 512;
        HostMatrix m = random_matrix(t, N, K, rng);
        cuda::DeviceWeight w = upload(ctx, m);
        // rows 5 .. 5+29 (a range not starting at 0), poisoned output with a guard row
        const int64_t row0 = 5, rows = 29;
        cuda::DeviceBuffer out(static_cast<size_t>((rows + 1) * K) * 2);
        out.fill_bytes(0xFF, ctx.stream());
        cuda::dequantize_weight_bf16(w, row0, rows, out.as<uint16_t>(), ctx.stream());
        std::vector<uint16_t> got(static_cast<size_t>((rows + 1) * K));
        out.download(got.data(), got.size() * 2, ctx.stream());
        int bad = 0;
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t k = 0; k < K; ++k) {
                const float g = bf16_to_float(got[static_cast<size_t>(r * K + k)]);
                const float ref = m.deq[static_cast<size_t>((row0 + r) * K + k)];
                if (!(std::fabs(g - ref) <= std::ldexp(std::fabs(ref), -8) * (1.0f + 0x1p-10f)) && bad++ < 5)
                    ADD_FAILURE() << dtype_name(t) << " row " << row0 + r << " element " << k << ": " << g
                                  << " vs " << ref;
            }
        for (int64_t k = 0; k < K; ++k) EXPECT_EQ(got[static_cast<size_t>(rows * K + k)], 0xFFFF) << "guard row written";
        EXPECT_EQ(bad, 0) << dtype_name(t);
    }
}

TEST(CudaPrefill, DequantizeRejectsBadArguments) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    std::mt19937 rng(5);
    HostMatrix m = random_matrix(DType::Q8_0, 4, 64, rng);
    cuda::DeviceWeight w = upload(ctx, m);
    cuda::DeviceBuffer out(4 * 64 * 2);
    EXPECT_THROW(cuda::dequantize_weight_bf16(w, 2, 3, out.as<uint16_t>(), ctx.stream()), std::runtime_error);
    EXPECT_THROW(cuda::dequantize_weight_bf16(w, 0, 1, nullptr, ctx.stream()), std::runtime_error);
    EXPECT_FALSE(cuda::gemm_weight_type_supported(DType::Q8_K));
    EXPECT_FALSE(cuda::gemm_weight_type_supported(DType::I32));
}

// Y = X · Wᵀ for the 8B projection shapes scaled down (q|k|v 6144 × 4096,
// gate|up 28672 × 4096, down 4096 × 14336 → /8 .. /16), an odd N, and odd
// numbers of rows; the last case forces weight tiles of a few rows.
TEST(CudaPrefill, GemmMatchesDoubleReference) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    std::mt19937 rng(202);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    struct Shape {
        int64_t N, K;
        int64_t tile;  // max_tile_elems of the PrefillGemm (0: default)
    };
    const Shape shapes[] = {{768, 256, 0}, {1792, 256, 0}, {256, 1024, 0}, {300, 512, 0}, {300, 512, 512 * 7}};
    for (DType t : kGemmTypes) {
        for (const Shape& sh : shapes) {
            HostMatrix m = random_matrix(t, sh.N, sh.K, rng);
            cuda::DeviceWeight w = upload(ctx, m);
            cuda::PrefillGemm gemm(33, sh.K, sh.tile > 0 ? sh.tile : int64_t{64} << 20);
            for (int64_t n : {1, 7, 33}) {
                const int64_t ldx = sh.K + 3, ldy = sh.N + 5;  // strides wider than the rows
                std::vector<float> x(static_cast<size_t>(n * ldx));
                for (auto& v : x) v = nd(rng);
                cuda::DeviceBuffer dx(x.size() * 4), dy(static_cast<size_t>(n * ldy) * 4);
                dx.upload(x.data(), x.size() * 4, ctx.stream());
                dy.fill_bytes(0xFF, ctx.stream());
                gemm.run(w, dx.as<float>(), ldx, n, dy.as<float>(), ldy, ctx.stream());
                std::vector<float> y(static_cast<size_t>(n * ldy));
                dy.download(y.data(), y.size() * 4, ctx.stream());
                int bad = 0;
                for (int64_t r = 0; r < n; ++r) {
                    for (int64_t j = 0; j < sh.N; ++j) {
                        double ref = 0, mag = 0;
                        for (int64_t k = 0; k < sh.K; ++k) {
                            const double p = static_cast<double>(x[static_cast<size_t>(r * ldx + k)]) *
                                             m.deq[static_cast<size_t>(j * sh.K + k)];
                            ref += p;
                            mag += std::fabs(p);
                        }
                        const float g = y[static_cast<size_t>(r * ldy + j)];
                        const double tol = (std::ldexp(1.0, -7) + static_cast<double>(sh.K) * std::ldexp(1.0, -23)) * mag + 1e-6;
                        if (!(std::fabs(g - ref) <= tol) && bad++ < 5)
                            ADD_FAILURE() << dtype_name(t) << " N " << sh.N << " K " << sh.K << " n " << n << " row "
                                          << r << " col " << j << ": " << g << " vs " << ref << " (tol " << tol << ")";
                    }
                    for (int64_t j = sh.N; j < ldy; ++j) {
                        uint32_t bits;
                        std::memcpy(&bits, &y[static_cast<size_t>(r * ldy + j)], 4);
                        if (bits != 0xFFFFFFFFu && bad++ < 5) ADD_FAILURE() << "padding written at row " << r;
                    }
                }
                EXPECT_EQ(bad, 0) << dtype_name(t) << " N " << sh.N << " K " << sh.K << " n " << n;
            }
        }
    }
}

// bq_gemm (bq_gemm.h) on every type with a small-batch layout against the
// double product of the exact weights (dequantize_row_ref) and the BF16
// activations, and against the BF16 cuBLASLt path: token counts across the
// kernel's tile widths (1..64), the whole matrix and a row range starting
// at a tile (an expert of a bank; the padding past `rows` keeps its poison),
// K short enough for one split and long enough for several (summed over a
// thread block cluster), every form of 17-64 rows the device has.
// Tolerance: the weights are formed in BF16 from BF16 scale and offset
// (errors ≤ 2^-8 of |w|+|o| each, random in sign), so per element
// |y − ref| <= 2^-5·sqrt(Σ_k (x_k·gmax_k)^2) + 1e-5 (gmax_k: the largest
// |w| of k's 32-element group in that row; ~13 standard deviations of the
// expected error), and over the whole product rms(y − ref) <= 2^-7·rms(ref).
TEST(CudaPrefill, BqGemmMatchesReferenceAndCublas) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    {
        // Where the wgmma forms exist, the default is the per-shape choice.
        const int f0 = cuda::bq_gemm_form();
        cuda::bq_gemm_set_form(2);
        const bool wgmma = cuda::bq_gemm_form() == 2;
        cuda::bq_gemm_set_form(f0);
        if (wgmma && !std::getenv("QUERN_CUDA_BQ_WGMMA")) EXPECT_EQ(f0, 1) << "default bq_gemm form";
        std::printf("bq_gemm: default form %d, wgmma forms %s\n", f0, wgmma ? "available" : "not built or no sm_90a");
    }
    std::mt19937 rng(211);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q4_K, DType::Q5_0, DType::Q5_1, DType::Q5_K, DType::Q6_K}) {
        // K of 4, 12 (not a multiple of every split count) and 64 chunks.
        for (const auto& [N, K] : {std::pair<int64_t, int64_t>{200, 256}, {90, 768}, {130, 4096}}) {
            ASSERT_TRUE(cuda::bq_supported(t, K)) << dtype_name(t);
            HostMatrix m = random_matrix(t, N, K, rng);
            cuda::DeviceWeight w = upload(ctx, m);
            cuda::DeviceWeight wc = upload(ctx, m);  // no bq layout: the cuBLASLt path
            cuda::make_resident_bq(w, ctx.stream());
            ASSERT_NE(w.bq, nullptr);
            EXPECT_EQ(w.bq_bits, (t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q4_K) ? 4 : 8);
            cuda::PrefillGemm gemm(64, K, int64_t{64} << 20);
            std::vector<float> gmax(static_cast<size_t>(N * K));
            for (int64_t j = 0; j < N; ++j)
                for (int64_t k0 = 0; k0 < K; k0 += 32) {
                    float mx = 0;
                    for (int64_t k = k0; k < k0 + 32; ++k) mx = std::max(mx, std::fabs(m.deq[static_cast<size_t>(j * K + k)]));
                    for (int64_t k = k0; k < k0 + 32; ++k) gmax[static_cast<size_t>(j * K + k)] = mx;
                }
            // Every form of 17-64 rows (the mma.sync kernels and each wgmma
            // configuration where the device has them).
            struct FormGuard {  // the default form again however the loop ends
                int f = cuda::bq_gemm_form();
                ~FormGuard() { cuda::bq_gemm_set_form(f); }
            } guard;
            for (int form = 0; form <= cuda::kBqLastForm; ++form)
            for (int64_t n : {1, 8, 9, 17, 32, 33, 64}) {
                if (form > 0 && n <= 16) continue;
                cuda::bq_gemm_set_form(form);
                if (cuda::bq_gemm_form() != form) continue;  // no wgmma on this device
                for (const auto& [row0, rows] : {std::pair<int64_t, int64_t>{0, N}, {64, N - 69}}) {
                    const int64_t ldy = rows + 3;
                    std::vector<float> x(static_cast<size_t>(n * K));
                    for (auto& v : x) v = nd(rng);
                    cuda::DeviceBuffer dx = on_device(x, ctx), dy(static_cast<size_t>(n * ldy) * 4),
                                       dc(static_cast<size_t>(n * ldy) * 4);
                    const uint16_t* xb = gemm.to_bf16(dx.as<float>(), K, n, K, ctx.stream());
                    dy.fill_bytes(0xFF, ctx.stream());
                    cuda::bq_gemm(w, row0, rows, xb, n, dy.as<float>(), ldy, ctx.stream());
                    gemm.run_bf16_rows(wc, row0, rows, xb, n, dc.as<float>(), ldy, ctx.stream());
                    std::vector<float> y(static_cast<size_t>(n * ldy)), yc(y.size());
                    dy.download(y.data(), y.size() * 4, ctx.stream());
                    dc.download(yc.data(), yc.size() * 4, ctx.stream());
                    int bad = 0;
                    double e2 = 0, ec2 = 0, r2 = 0;
                    for (int64_t r = 0; r < n; ++r) {
                        for (int64_t j = 0; j < rows; ++j) {
                            double ref = 0, mag2 = 0;
                            for (int64_t k = 0; k < K; ++k) {
                                const double xv = bf16_to_float(fp32_to_bf16(x[static_cast<size_t>(r * K + k)]));
                                const size_t wi = static_cast<size_t>((row0 + j) * K + k);
                                ref += xv * m.deq[wi];
                                mag2 += (xv * gmax[wi]) * (xv * gmax[wi]);
                            }
                            const float g = y[static_cast<size_t>(r * ldy + j)], c = yc[static_cast<size_t>(r * ldy + j)];
                            const double tol = std::ldexp(1.0, -5) * std::sqrt(mag2) + 1e-5;
                            e2 += (g - ref) * (g - ref);
                            ec2 += (g - c) * (g - c);
                            r2 += ref * ref;
                            if ((!(std::fabs(g - ref) <= tol) || !(std::fabs(g - c) <= 2 * tol)) && bad++ < 5)
                                ADD_FAILURE() << dtype_name(t) << " K " << K << " n " << n << " rows " << row0 << "+"
                                              << rows << " form " << form << " at " << r << "," << j << ": " << g << " vs " << ref
                                              << " (cuBLASLt " << c << ", tol " << tol << ")";
                        }
                        for (int64_t j = rows; j < ldy; ++j) {
                            uint32_t bits;
                            std::memcpy(&bits, &y[static_cast<size_t>(r * ldy + j)], 4);
                            if (bits != 0xFFFFFFFFu && bad++ < 5) ADD_FAILURE() << "padding written at row " << r;
                        }
                    }
                    EXPECT_LE(std::sqrt(e2), std::ldexp(1.0, -7) * std::sqrt(r2))
                        << dtype_name(t) << " K " << K << " n " << n << " rows " << row0 << "+" << rows << " form " << form;
                    EXPECT_LE(std::sqrt(ec2), std::ldexp(1.0, -7) * std::sqrt(r2))
                        << dtype_name(t) << " K " << K << " n " << n << " (against cuBLASLt)";
                    EXPECT_EQ(bad, 0) << dtype_name(t) << " K " << K << " n " << n << " rows " << row0 << "+" << rows
                                      << " form " << form;
                }
            }
        }
    }
    // Refusals: types without a layout, shapes out of range, no layout made.
    HostMatrix f16 = random_matrix(DType::F16, 64, 256, rng);
    cuda::DeviceWeight wf = upload(ctx, f16);
    EXPECT_FALSE(cuda::bq_supported(DType::Q8_0, 256));
    EXPECT_FALSE(cuda::bq_supported(DType::Q4_0, 96));
    EXPECT_THROW(cuda::make_resident_bq(wf, ctx.stream()), std::runtime_error);
    HostMatrix q4 = random_matrix(DType::Q4_K, 64, 256, rng);
    cuda::DeviceWeight wq = upload(ctx, q4);
    cuda::DeviceBuffer dx(static_cast<size_t>(65 * 256) * 2), dy(static_cast<size_t>(65 * 64) * 4);
    EXPECT_THROW(cuda::bq_gemm(wq, 0, 64, dx.as<uint16_t>(), 1, dy.as<float>(), 64, ctx.stream()), std::runtime_error);
    cuda::make_resident_bq(wq, ctx.stream());
    EXPECT_THROW(cuda::bq_gemm(wq, 0, 64, dx.as<uint16_t>(), 65, dy.as<float>(), 64, ctx.stream()), std::runtime_error);
    EXPECT_THROW(cuda::bq_gemm(wq, 8, 56, dx.as<uint16_t>(), 1, dy.as<float>(), 64, ctx.stream()), std::runtime_error);
    EXPECT_THROW(cuda::bq_gemm(wq, 16, 56, dx.as<uint16_t>(), 1, dy.as<float>(), 64, ctx.stream()), std::runtime_error);
}

// bq_gemm_glu (gate and up products and the gated unit in one launch)
// against the double reference act(Σ x·G)·(Σ x·U) on fresh random data:
// one fused [gate | up] weight and two separate ones, SiLU and GELU, 1-32
// rows, every form, K with and without splits; the error bound is the bq
// test's per product carried through the activation (|act'| <= 1.2) plus
// the BF16 rounding of h. Padding columns of h stay poisoned.
TEST(CudaPrefill, BqGemmGluMatchesReference) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    std::mt19937 rng(307);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    struct FormGuard {
        int f = cuda::bq_gemm_form();
        ~FormGuard() { cuda::bq_gemm_set_form(f); }
    } guard;
    // Layouts: one [gate | up] weight (F = 144: 9 tiles, a partial block of
    // pair tiles), two weights of 136 rows (a partial last tile), and one
    // weight whose gate starts at row 16 ([16 other rows | gate | up]).
    const char* const layouts[] = {"fused", "pair", "offset"};
    for (DType t : {DType::Q4_K, DType::Q4_0, DType::Q6_K, DType::Q5_K}) {
        for (const int64_t K : {int64_t{256}, int64_t{768}, int64_t{1536}}) {  // 1536: up to 6 K splits
            for (int lay = 0; lay < 3; ++lay) {
                const bool one = lay != 1;  // gate and up in one weight
                const int64_t F = one ? 144 : 136, g0 = lay == 2 ? 16 : 0;
                HostMatrix mg = random_matrix(t, one ? g0 + 2 * F : F, K, rng);
                HostMatrix mu = one ? mg : random_matrix(t, F, K, rng);
                cuda::DeviceWeight wg = upload(ctx, mg);
                cuda::DeviceWeight wu = one ? cuda::DeviceWeight() : upload(ctx, mu);
                cuda::make_resident_bq(wg, ctx.stream());
                if (!one) cuda::make_resident_bq(wu, ctx.stream());
                const cuda::DeviceWeight& up = one ? wg : wu;
                const int64_t up0 = one ? g0 + F : 0;
                const std::vector<float> gmg = quern::test::group_max(mg), gmu = quern::test::group_max(mu);
                cuda::PrefillGemm gemm(32, K, int64_t{64} << 20);
                for (int form : {0, 1, 4})
                    for (int64_t n : {1, 8, 9, 16, 17, 32})
                        for (const bool gelu : {false, true}) {
                            cuda::bq_gemm_set_form(form);
                            if (cuda::bq_gemm_form() != form) continue;  // no wgmma on this device
                            if (form > 0 && n <= 16) continue;
                            ASSERT_TRUE(cuda::bq_glu_supported(wg, up, n));
                            const int64_t ldh = F + 5;
                            std::vector<float> x(static_cast<size_t>(n * K));
                            for (auto& v : x) v = nd(rng);
                            cuda::DeviceBuffer dx = on_device(x, ctx), dh(static_cast<size_t>(n * ldh) * 2);
                            const uint16_t* xb = gemm.to_bf16(dx.as<float>(), K, n, K, ctx.stream());
                            dh.fill_bytes(0xFF, ctx.stream());
                            cuda::bq_gemm_glu(wg, g0, up, up0, F, xb, n, dh.as<uint16_t>(), ldh, gelu, ctx.stream());
                            std::vector<uint16_t> h(static_cast<size_t>(n * ldh));
                            dh.download(h.data(), h.size() * 2, ctx.stream());
                            const int bad = quern::test::count_glu_mismatches(
                                h, n, ldh, F, x, mg, gmg, g0, mu, gmu, up0, gelu,
                                std::string(dtype_name(t)) + " K " + std::to_string(K) + " " + layouts[lay] +
                                    " form " + std::to_string(form) + " n " + std::to_string(n));
                            EXPECT_EQ(bad, 0) << dtype_name(t) << " K " << K << " " << layouts[lay] << " form " << form
                                              << " n " << n;
                        }
            }
        }
    }
    // Refusals: layouts of different widths, too many rows, misaligned rows.
    HostMatrix a = random_matrix(DType::Q4_K, 64, 256, rng), b = random_matrix(DType::Q6_K, 64, 256, rng);
    cuda::DeviceWeight wa = upload(ctx, a), wb = upload(ctx, b);
    cuda::make_resident_bq(wa, ctx.stream());
    cuda::make_resident_bq(wb, ctx.stream());
    cuda::DeviceBuffer dx(static_cast<size_t>(33 * 256) * 2), dh(static_cast<size_t>(33 * 64) * 2);
    EXPECT_FALSE(cuda::bq_glu_supported(wa, wb, 8));
    EXPECT_FALSE(cuda::bq_glu_supported(wa, wa, 33));
    EXPECT_THROW(cuda::bq_gemm_glu(wa, 0, wb, 0, 64, dx.as<uint16_t>(), 8, dh.as<uint16_t>(), 64, false, ctx.stream()),
                 std::runtime_error);
    EXPECT_THROW(cuda::bq_gemm_glu(wa, 0, wa, 0, 64, dx.as<uint16_t>(), 33, dh.as<uint16_t>(), 64, false, ctx.stream()),
                 std::runtime_error);
    EXPECT_THROW(cuda::bq_gemm_glu(wa, 0, wa, 8, 32, dx.as<uint16_t>(), 8, dh.as<uint16_t>(), 64, false, ctx.stream()),
                 std::runtime_error);
    EXPECT_THROW(cuda::bq_gemm_glu(wa, 0, wa, 16, 64, dx.as<uint16_t>(), 8, dh.as<uint16_t>(), 64, false, ctx.stream()),
                 std::runtime_error);
}

// bq_gemm_grouped (one launch over all experts of a bank) equals bq_gemm
// on each expert's rows and its group of activation rows: groups of 0, 1,
// 3, 17 and 70 rows (one and several token tiles), for a 4-bit and a 6-bit
// bank; rows outside the groups' outputs keep their poison. The two differ
// only in the fp32 summation order (bq_gemm may split K), so within
// 2^-18 · Σ_k |x_k·w_k| + 1e-6.
TEST(CudaPrefill, BqGemmGroupedMatchesPerExpert) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    std::mt19937 rng(213);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t NE = 5, rows = 80, K = 512;
    const std::vector<int32_t> sizes = {3, 0, 70, 17, 1};
    const std::vector<int32_t> off = group_offsets(sizes);
    const int64_t total = off[NE], ldy = rows + 5;
    for (DType t : {DType::Q4_K, DType::Q6_K}) {
        HostMatrix m = random_matrix(t, NE * rows, K, rng);
        cuda::DeviceWeight w = upload(ctx, m);
        cuda::make_resident_bq(w, ctx.stream());
        std::vector<float> x(static_cast<size_t>(total * K));
        for (auto& v : x) v = nd(rng);
        cuda::PrefillGemm gemm(total, K, int64_t{16} << 20);
        cuda::DeviceBuffer dx = on_device(x, ctx), doff = on_device(off, ctx);
        const uint16_t* xb = gemm.to_bf16(dx.as<float>(), K, total, K, ctx.stream());
        cuda::DeviceBuffer dy(static_cast<size_t>(total * ldy) * 4), de(static_cast<size_t>(total * ldy) * 4);
        dy.fill_bytes(0xFF, ctx.stream());
        de.fill_bytes(0xFF, ctx.stream());
        cuda::bq_gemm_grouped(w, rows, doff.as<int32_t>(), NE, 70, xb, dy.as<float>(), ldy, ctx.stream());
        for (int64_t e = 0; e < NE; ++e)  // bq_gemm takes at most kBqMaxRows rows at a time
            for (int64_t r0 = 0; r0 < sizes[static_cast<size_t>(e)]; r0 += cuda::kBqMaxRows) {
                const int64_t o = off[static_cast<size_t>(e)] + r0;
                cuda::bq_gemm(w, e * rows, rows, xb + o * K,
                              std::min<int64_t>(cuda::kBqMaxRows, sizes[static_cast<size_t>(e)] - r0),
                              de.as<float>() + o * ldy, ldy, ctx.stream());
            }
        std::vector<float> y(static_cast<size_t>(total * ldy)), ye(y.size());
        dy.download(y.data(), y.size() * 4, ctx.stream());
        de.download(ye.data(), ye.size() * 4, ctx.stream());
        int bad = 0;
        for (int64_t e = 0; e < NE; ++e)
            for (int64_t r = off[static_cast<size_t>(e)]; r < off[static_cast<size_t>(e) + 1]; ++r) {
                for (int64_t j = 0; j < rows; ++j) {
                    double mag = 0;
                    for (int64_t k = 0; k < K; ++k)
                        mag += std::fabs(static_cast<double>(x[static_cast<size_t>(r * K + k)]) *
                                         m.deq[static_cast<size_t>((e * rows + j) * K + k)]);
                    const float g = y[static_cast<size_t>(r * ldy + j)], c = ye[static_cast<size_t>(r * ldy + j)];
                    if (!(std::fabs(g - c) <= std::ldexp(mag, -18) + 1e-6) && bad++ < 5)
                        ADD_FAILURE() << dtype_name(t) << " expert " << e << " row " << r << "," << j << ": " << g
                                      << " vs " << c;
                }
                for (int64_t j = rows; j < ldy; ++j) {
                    uint32_t bits;
                    std::memcpy(&bits, &y[static_cast<size_t>(r * ldy + j)], 4);
                    if (bits != 0xFFFFFFFFu && bad++ < 5) ADD_FAILURE() << "padding written at row " << r;
                }
            }
        EXPECT_EQ(bad, 0) << dtype_name(t);
    }
    // Refusals: no layout, rows not a multiple of 16, experts past the bank.
    HostMatrix q4 = random_matrix(DType::Q4_K, 64, 256, rng);
    cuda::DeviceWeight wq = upload(ctx, q4);
    cuda::DeviceBuffer dx(static_cast<size_t>(8 * 256) * 2), dy(static_cast<size_t>(8 * 64) * 4), doff(64);
    EXPECT_THROW(cuda::bq_gemm_grouped(wq, 32, doff.as<int32_t>(), 2, 4, dx.as<uint16_t>(), dy.as<float>(), 64,
                                       ctx.stream()),
                 std::runtime_error);
    cuda::make_resident_bq(wq, ctx.stream());
    EXPECT_THROW(cuda::bq_gemm_grouped(wq, 24, doff.as<int32_t>(), 2, 4, dx.as<uint16_t>(), dy.as<float>(), 64,
                                       ctx.stream()),
                 std::runtime_error);
    EXPECT_THROW(cuda::bq_gemm_grouped(wq, 32, doff.as<int32_t>(), 3, 4, dx.as<uint16_t>(), dy.as<float>(), 64,
                                       ctx.stream()),
                 std::runtime_error);
}

// dq_gemm_grouped (every expert of a bank in one launch, weights decoded to
// BF16 in the kernel) for every weight type: against the double product of
// the dequantized weights (PrefillGemm's bound, see the top of the file) and
// against one PrefillGemm per expert on the same rows, which rounds the same
// BF16 factors and differs only in the order of the fp32 sums. Groups of 0,
// 1, 3, 17 and 70 rows (two token tiles), 80 rows per expert (a partial row
// block), K = 512 and, where the type allows, 96 (a partial last step), 64
// and 32 (one step, full and partial).
TEST(CudaPrefill, DqGemmGroupedMatchesReference) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    std::mt19937 rng(307);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t NE = 5, rows = 80;
    const std::vector<int32_t> sizes = {3, 0, 70, 17, 1};
    const std::vector<int32_t> off = group_offsets(sizes);
    const int64_t total = off[NE], ldy = rows + 8;
    for (DType t : kGemmTypes) {
        for (int64_t K : {int64_t{512}, int64_t{96}, int64_t{64}, int64_t{32}}) {
            if (K % dtype_info(t).block_size != 0) continue;
            ASSERT_TRUE(cuda::dq_grouped_supported(t, K)) << dtype_name(t);
            HostMatrix m = random_matrix(t, NE * rows, K, rng);
            cuda::DeviceWeight w = upload(ctx, m);
            std::vector<float> x(static_cast<size_t>(total * K));
            for (auto& v : x) v = nd(rng);
            cuda::PrefillGemm gemm(total, K, int64_t{16} << 20);
            cuda::DeviceBuffer dx = on_device(x, ctx), doff = on_device(off, ctx);
            const uint16_t* xb = gemm.to_bf16(dx.as<float>(), K, total, K, ctx.stream());
            cuda::DeviceBuffer dy(static_cast<size_t>(total * ldy) * 4), de(static_cast<size_t>(total * ldy) * 4);
            dy.fill_bytes(0xFF, ctx.stream());
            de.fill_bytes(0xFF, ctx.stream());
            // Token tiles of 64 rows (mean 18) and 128 (a mean of 100 asks
            // for them), alternating over the K of each type.
            const int64_t mean = (static_cast<int>(t) + K / 32) % 2 ? 100 : 18;
            const bool qw = cuda::PrefillGemm::uses_qw(w, 70);
            cuda::dq_gemm_grouped(w, rows, doff.as<int32_t>(), NE, 70, mean, xb, dy.as<float>(), ldy, ctx.stream());
            for (int64_t e = 0; e < NE; ++e) {
                const int64_t o = off[static_cast<size_t>(e)];
                if (sizes[static_cast<size_t>(e)] > 0)
                    gemm.run_bf16_rows(w, e * rows, rows, xb + o * K, sizes[static_cast<size_t>(e)], de.as<float>() + o * ldy,
                                       ldy, ctx.stream());
            }
            std::vector<float> y(static_cast<size_t>(total * ldy)), ye(y.size());
            dy.download(y.data(), y.size() * 4, ctx.stream());
            de.download(ye.data(), ye.size() * 4, ctx.stream());
            int bad = 0;
            for (int64_t e = 0; e < NE; ++e)
                for (int64_t r = off[static_cast<size_t>(e)]; r < off[static_cast<size_t>(e) + 1]; ++r) {
                    for (int64_t j = 0; j < rows; ++j) {
                        double ref = 0, mag = 0;
                        for (int64_t k = 0; k < K; ++k) {
                            const double p = static_cast<double>(x[static_cast<size_t>(r * K + k)]) *
                                             m.deq[static_cast<size_t>((e * rows + j) * K + k)];
                            ref += p;
                            mag += std::fabs(p);
                        }
                        const float g = y[static_cast<size_t>(r * ldy + j)], c = ye[static_cast<size_t>(r * ldy + j)];
                        const double tol = (0x1p-7 + static_cast<double>(K) * 0x1p-23) * mag + 1e-6;
                        if (!(std::fabs(g - ref) <= tol) && bad++ < 5)
                            ADD_FAILURE() << dtype_name(t) << " K " << K << " expert " << e << " row " << r << "," << j
                                          << ": " << g << " vs reference " << ref;
                        // PrefillGemm rounds the weights to BF16 as dq does, unless it
                        // multiplies them from their resident layout (qw_gemm: its own
                        // scale rounding): then both only meet the reference's bound.
                        const double tol_c = qw ? 2 * tol : std::ldexp(mag, -16) + 1e-6;
                        if (!(std::fabs(g - c) <= tol_c) && bad++ < 5)
                            ADD_FAILURE() << dtype_name(t) << " K " << K << " expert " << e << " row " << r << "," << j
                                          << ": " << g << " vs PrefillGemm " << c;
                    }
                    for (int64_t j = rows; j < ldy; ++j) {
                        uint32_t bits;
                        std::memcpy(&bits, &y[static_cast<size_t>(r * ldy + j)], 4);
                        if (bits != 0xFFFFFFFFu && bad++ < 5) ADD_FAILURE() << "padding written at row " << r;
                    }
                }
            EXPECT_EQ(bad, 0) << dtype_name(t) << " K " << K << " mean " << mean;
        }
    }
    // Refusals: rows of K % 32 != 0, experts past the bank, misaligned
    // activations, a grid past its limit.
    HostMatrix f = random_matrix(DType::F32, 64, 48, rng);
    cuda::DeviceWeight wf = upload(ctx, f);
    EXPECT_FALSE(cuda::dq_grouped_supported(DType::F32, 48));
    cuda::DeviceBuffer dx(static_cast<size_t>(8 * 256) * 2 + 16), dy(static_cast<size_t>(8 * 64) * 4), doff(64);
    EXPECT_THROW(cuda::dq_gemm_grouped(wf, 32, doff.as<int32_t>(), 2, 4, 1, dx.as<uint16_t>(), dy.as<float>(), 64,
                                       ctx.stream()),
                 std::runtime_error);
    HostMatrix q8 = random_matrix(DType::Q8_0, 64, 256, rng);
    cuda::DeviceWeight wq = upload(ctx, q8);
    EXPECT_THROW(cuda::dq_gemm_grouped(wq, 32, doff.as<int32_t>(), 3, 4, 1, dx.as<uint16_t>(), dy.as<float>(), 64,
                                       ctx.stream()),
                 std::runtime_error);
    EXPECT_THROW(cuda::dq_gemm_grouped(wq, 32, doff.as<int32_t>(), 2, 4, 1, dx.as<uint16_t>() + 1, dy.as<float>(), 64,
                                       ctx.stream()),
                 std::runtime_error);
    EXPECT_THROW(cuda::dq_gemm_grouped(wq, 32, doff.as<int32_t>(), 2, int64_t{1} << 40, 1, dx.as<uint16_t>(),
                                       dy.as<float>(), 64, ctx.stream()),
                 std::runtime_error);
}

// Not a test: the throughput of bq_gemm against the BF16 copy + cuBLASLt
// path and the FP8 path (per-row E4M3 weights and activations, cuBLASLt) on
// Llama-3-8B's matrix shapes (random blocks with sane scales), printed per
// shape and token count. Run with
// --gtest_also_run_disabled_tests --gtest_filter='*BqGemmThroughput*'.
TEST(CudaPrefill, DISABLED_BqGemmThroughput) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    std::mt19937 rng(5);
    struct Shape {
        const char* name;
        int64_t N, K;
        DType t;
    };
    const Shape shapes[] = {{"q/wo", 4096, 4096, DType::Q4_K},     {"k/v", 1024, 4096, DType::Q4_K},
                            {"gate/up", 14336, 4096, DType::Q4_K}, {"down", 4096, 14336, DType::Q4_K},
                            {"down6", 4096, 14336, DType::Q6_K},   {"head6", 128256, 4096, DType::Q6_K}};
    cuda::PrefillGemm gemm(64, 14336, int64_t{64} << 20);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    // µs per call of f: the mean of 20 calls after 3 to warm up.
    const auto time = [&](auto&& f) {
        for (int i = 0; i < 3; ++i) f();
        cudaEventRecord(e0, ctx.stream());
        for (int i = 0; i < 20; ++i) f();
        cudaEventRecord(e1, ctx.stream());
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        return 1e3 * ms / 20;
    };
    // QUERN_BQ_BENCH_SHAPE=name and QUERN_BQ_BENCH_N=n keep one shape and
    // one row count (for profiling a single kernel).
    const char* only_shape = std::getenv("QUERN_BQ_BENCH_SHAPE");
    const char* only_n = std::getenv("QUERN_BQ_BENCH_N");
    for (const Shape& sh : shapes) {
        if (only_shape && std::string(only_shape) != sh.name) continue;
        const size_t rb = row_size(sh.t, sh.K);
        std::vector<uint8_t> bytes(rb * static_cast<size_t>(sh.N));
        for (auto& b : bytes) b = static_cast<uint8_t>(rng());
        const auto bb = static_cast<size_t>(dtype_info(sh.t).type_size);
        for (size_t o = 0; o < bytes.size(); o += bb) {  // fp16 1.0 / 0.01 for d (and dmin)
            const size_t at = sh.t == DType::Q6_K ? o + 208 : o;
            bytes[at] = 0x00, bytes[at + 1] = 0x3C;
            if (sh.t == DType::Q4_K) bytes[o + 2] = 0x1F, bytes[o + 3] = 0x21;
        }
        // Enough copies of each form that a round of them (≥ 160 MB) does
        // not fit in the L2 cache (50 MB on an H200): every call reads its
        // weights from memory, as the layers of a model do.
        const auto copies = [](double b) { return static_cast<size_t>(std::clamp(std::ceil(160e6 / b), 1.0, 24.0)); };
        const Tensor src = Tensor::contiguous(sh.t, {sh.K, sh.N, 1, 1}, bytes.data(), "w");
        std::vector<cuda::DeviceWeight> wq, wc, wf;
        for (size_t i = 0; i < copies(0.7 * static_cast<double>(sh.N * sh.K)); ++i) {
            wq.push_back(cuda::upload_weight(ctx, src));
            cuda::make_resident_bq(wq.back(), ctx.stream());
        }
        for (size_t i = 0; i < copies(static_cast<double>(sh.N * sh.K)); ++i) {
            cuda::DeviceWeight q = cuda::upload_weight(ctx, src);
            wf.push_back(cuda::to_fp8_rows(q, ctx.stream()));  // --gpu-weights fp8
        }
        for (size_t i = 0; i < copies(2.0 * static_cast<double>(sh.N * sh.K)); ++i) {
            wc.push_back(cuda::upload_weight(ctx, src));
            cuda::make_resident_bf16(wc.back(), ctx.stream());
        }
        std::vector<uint16_t> xh(static_cast<size_t>(64 * sh.K), 0x3C00);
        cuda::DeviceBuffer dx = on_device(xh, ctx), dy(static_cast<size_t>(64 * sh.N) * 4);
        for (int64_t n : {1, 8, 16, 24, 32, 48, 64}) {
            if (only_n && std::atoi(only_n) != n) continue;
            size_t iq = 0, ic = 0, iff = 0;
            // bq in every form the device has (n > 16), the fastest shown
            // first, then each one.
            const int form0 = cuda::bq_gemm_form();
            std::string forms;
            double tq = 1e30;
            for (int form = 0; form <= (n > 16 ? cuda::kBqLastForm : 0); ++form) {
                cuda::bq_gemm_set_form(form);
                if (cuda::bq_gemm_form() != form) break;
                const double t = time([&] {
                    cuda::bq_gemm(wq[iq++ % wq.size()], 0, sh.N, dx.as<uint16_t>(), n, dy.as<float>(), sh.N,
                                  ctx.stream());
                });
                tq = std::min(tq, t);
                char b[32];
                std::snprintf(b, sizeof b, " f%d %.1f", form, t);
                forms += b;
            }
            cuda::bq_gemm_set_form(form0);
            const double tb = time([&] {
                gemm.run_bf16_rows(wc[ic++ % wc.size()], 0, sh.N, dx.as<uint16_t>(), n, dy.as<float>(), sh.N,
                                   ctx.stream());
            });
            const double tf = time([&] {
                gemm.run_bf16_rows(wf[iff++ % wf.size()], 0, sh.N, dx.as<uint16_t>(), n, dy.as<float>(), sh.N,
                                   ctx.stream());
            });
            const double bq_b = static_cast<double>(cuda::bq_bytes(wq[0])), bf_b = 2.0 * static_cast<double>(sh.N * sh.K),
                         f8_b = static_cast<double>(sh.N * sh.K + 4 * sh.N);
            std::printf("%-8s %-5s n %2lld  bq %7.1f us %5.0f GB/s | bf16 %7.1f us %5.0f GB/s | fp8 %7.1f us %5.0f GB/s |%s\n",
                        sh.name, std::string(dtype_name(sh.t)).c_str(), static_cast<long long>(n), tq,
                        bq_b / tq * 1e-3, tb, bf_b / tb * 1e-3, tf, f8_b / tf * 1e-3, forms.c_str());
        }
    }
    // The gate|up pair with its gating (bq_gemm_glu) against the product
    // and glu_rows_bf16, on Llama-3-8B's fused [gate | up] (QUERN_BQ_BENCH_SHAPE=glu).
    if (!only_shape || std::string(only_shape) == "glu") {
        const int64_t F = 14336, K = 4096;
        HostMatrix m = random_matrix(DType::Q4_K, 2 * F, K, rng);
        std::vector<cuda::DeviceWeight> ws;
        for (int i = 0; i < 3; ++i) {
            ws.push_back(upload(ctx, m));
            cuda::make_resident_bq(ws.back(), ctx.stream());
        }
        std::vector<uint16_t> xh(static_cast<size_t>(32 * K), 0x3C00);
        cuda::DeviceBuffer dx = on_device(xh, ctx), dy(static_cast<size_t>(32 * 2 * F) * 4), dh(static_cast<size_t>(32 * F) * 2);
        const int form0 = cuda::bq_gemm_form();
        for (int64_t n : {8, 16, 32}) {
            size_t it = 0;
            std::string line;
            for (int form : {0, 1}) {
                cuda::bq_gemm_set_form(form);
                if (cuda::bq_gemm_form() != form) break;
                const double tg = time([&] {
                    cuda::bq_gemm_glu(ws[it % 3], 0, ws[it % 3], F, F, dx.as<uint16_t>(), n, dh.as<uint16_t>(), F, false,
                                      ctx.stream());
                    ++it;
                });
                const double tp = time([&] {
                    cuda::bq_gemm(ws[it % 3], 0, 2 * F, dx.as<uint16_t>(), n, dy.as<float>(), 2 * F, ctx.stream());
                    cuda::glu_rows_bf16(dy.as<float>(), 2 * F, n, F, dh.as<uint16_t>(), false, ctx.stream());
                    ++it;
                });
                char b[96];
                std::snprintf(b, sizeof b, " | f%d glu %.1f us %5.0f GB/s, product + glu_rows %.1f", form, tg,
                              static_cast<double>(cuda::bq_bytes(ws[0])) / tg * 1e-3, tp);
                line += b;
            }
            cuda::bq_gemm_set_form(form0);
            std::printf("gate_up  Q4_K  n %2lld%s\n", static_cast<long long>(n), line.c_str());
        }
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

// run_bf16_rows on one expert's rows of a bank (rows 3·64 .. 4·64 of 5·64,
// and a range crossing tiles) equals the same rows of the whole product:
// the same BF16 products, summed in fp32 by possibly other cuBLASLt kernels
// (other shapes and alignments), so within K·2^-22 of Σ|x·w|.
TEST(CudaPrefill, GemmOnARowRangeMatchesTheWholeMatrix) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    std::mt19937 rng(203);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int variant = 0; variant < 4; ++variant) {
        // Q4_K, Q8_0, F16, and Q8_0 converted to FP8 with per-row scales (the
        // FP8 GEMM on row ranges: the codes' and the scales' row offsets).
        const DType t = variant == 0 ? DType::Q4_K : variant == 2 ? DType::F16 : DType::Q8_0;
        const bool fp8 = variant == 3;
        const int64_t N = 320, K = 256, n = 19;
        HostMatrix m = random_matrix(t, N, K, rng);
        cuda::DeviceWeight w = fp8 ? cuda::to_fp8_rows(upload(ctx, m), ctx.stream()) : upload(ctx, m);
        cuda::PrefillGemm gemm(n, K, K * 96);  // tiles of 96 rows: the ranges cross tile edges
        std::vector<float> x(static_cast<size_t>(n * K));
        for (auto& v : x) v = nd(rng);
        cuda::DeviceBuffer dx(x.size() * 4), dall(static_cast<size_t>(n * N) * 4), dpart(static_cast<size_t>(n * (N + 8)) * 4);  // ldy up to N + 8
        dx.upload(x.data(), x.size() * 4, ctx.stream());
        const uint16_t* xb = gemm.to_bf16(dx.as<float>(), K, n, K, ctx.stream());
        gemm.run_bf16(w, xb, n, dall.as<float>(), N, ctx.stream());
        std::vector<float> all(static_cast<size_t>(n * N)), part(static_cast<size_t>(n * (N + 8)));
        dall.download(all.data(), all.size() * 4, ctx.stream());
        // FP8: ranges of whole 16-row groups (cuBLASLt's FP8 kernels want
        // them; the session's expert ranges are multiples of 32 rows).
        using Range = std::pair<int64_t, int64_t>;
        const std::vector<Range> ranges = fp8 ? std::vector<Range>{{192, 64}, {48, 208}, {0, 320}, {304, 16}}
                                              : std::vector<Range>{{192, 64}, {50, 200}, {0, 320}, {319, 1}};
        for (const auto& [row0, rows] : ranges) {
            // An odd output stride; cuBLASLt's FP8 kernels want 16-byte aligned
            // ones (so do the session's: 2·F or E floats).
            const int64_t ld = fp8 ? (rows + 3) / 4 * 4 + 4 : rows + 3;
            dpart.fill_bytes(0xFF, ctx.stream());
            gemm.run_bf16_rows(w, row0, rows, xb, n, dpart.as<float>(), ld, ctx.stream());
            dpart.download(part.data(), part.size() * 4, ctx.stream());
            int bad = 0;
            for (int64_t r = 0; r < n; ++r)
                for (int64_t j = 0; j < rows; ++j) {
                    double mag = 0;
                    for (int64_t k = 0; k < K; ++k)
                        mag += std::fabs(static_cast<double>(bf16_to_float(fp32_to_bf16(x[static_cast<size_t>(r * K + k)]))) *
                                         m.deq[static_cast<size_t>((row0 + j) * K + k)]);
                    const double d = std::fabs(part[static_cast<size_t>(r * ld + j)] -
                                               static_cast<double>(all[static_cast<size_t>(r * N + row0 + j)]));
                    const double tol = fp8 ? std::ldexp(1.0, -10) * mag + 1e-6
                                           : static_cast<double>(K) * std::ldexp(1.0, -22) * mag + 1e-7;
                    if (!(d <= tol) && bad++ < 5)
                        ADD_FAILURE() << dtype_name(t) << (fp8 ? " (FP8)" : "") << " rows " << row0 << "+" << rows
                                      << " at " << r << "," << j;
                }
            EXPECT_EQ(bad, 0) << dtype_name(t) << (fp8 ? " (FP8)" : "");
        }
        if (fp8) EXPECT_EQ(gemm.fp8_fallbacks(), 0);
        EXPECT_THROW(gemm.run_bf16_rows(w, 300, 21, xb, n, dpart.as<float>(), 21, ctx.stream()), std::runtime_error);
    }
}

// The expert prefill's data movement: gather_rows_bf16 copies the rows the
// index names (repeats and any order), moe_weighted_sum_rows sums each row's
// slots from the grouped rows pos names, in slot order, as the CPU loop.
TEST(CudaPrefill, MoeGatherAndWeightedSumRows) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    std::mt19937 rng(204);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t n = 13, K = 72, k = 3, m = n * k, dim = 96;
    std::vector<uint16_t> x(static_cast<size_t>(n * K));
    for (auto& v : x) v = static_cast<uint16_t>(rng());
    std::vector<int32_t> src(static_cast<size_t>(m)), pos(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) src[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + 3) % n);
    for (int64_t i = 0; i < m; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>((i * 11 + 5) % m);  // a permutation
    std::vector<float> y(static_cast<size_t>(m * dim)), w(static_cast<size_t>(m));
    for (auto& v : y) v = nd(rng);
    for (auto& v : w) v = std::fabs(nd(rng));
    cuda::DeviceBuffer dx = on_device(x, ctx), dsrc = on_device(src, ctx), dpos = on_device(pos, ctx),
                       dy = on_device(y, ctx), dw = on_device(w, ctx), dg(static_cast<size_t>(m * K + 8) * 2),
                       dout(static_cast<size_t>(n * dim + 8) * 4);
    dg.fill_bytes(0xFF, ctx.stream());
    dout.fill_bytes(0xFF, ctx.stream());
    cuda::gather_rows_bf16(dx.as<uint16_t>(), K, dsrc.as<int32_t>(), m, dg.as<uint16_t>(), ctx.stream());
    cuda::moe_weighted_sum_rows(dy.as<float>(), dpos.as<int32_t>(), dw.as<float>(), n, static_cast<int>(k), dim,
                                dout.as<float>(), ctx.stream());
    std::vector<uint16_t> g(static_cast<size_t>(m * K + 8));
    std::vector<float> out(static_cast<size_t>(n * dim + 8));
    dg.download(g.data(), g.size() * 2, ctx.stream());
    dout.download(out.data(), out.size() * 4, ctx.stream());
    for (int64_t i = 0; i < m; ++i)
        for (int64_t e = 0; e < K; ++e)
            ASSERT_EQ(g[static_cast<size_t>(i * K + e)], x[static_cast<size_t>(src[static_cast<size_t>(i)] * K + e)])
                << "gathered row " << i;
    for (size_t i = static_cast<size_t>(m * K); i < g.size(); ++i) EXPECT_EQ(g[i], 0xFFFF) << "written past m rows";
    for (int64_t r = 0; r < n; ++r)
        for (int64_t i = 0; i < dim; ++i) {
            float acc = w[static_cast<size_t>(r * k)] * y[static_cast<size_t>(pos[static_cast<size_t>(r * k)] * dim + i)];
            for (int64_t j = 1; j < k; ++j)
                acc += w[static_cast<size_t>(r * k + j)] * y[static_cast<size_t>(pos[static_cast<size_t>(r * k + j)] * dim + i)];
            // (the host may contract w·y + acc into one fused multiply-add)
            ASSERT_NEAR(out[static_cast<size_t>(r * dim + i)], acc, 1e-5f * (std::fabs(acc) + 1.0f)) << "row " << r << " [" << i << "]";
        }
    for (size_t i = static_cast<size_t>(n * dim); i < out.size(); ++i) EXPECT_TRUE(std::isnan(out[i]));
}

// --gpu-weights fp8: to_fp8_rows gives, code for code, what the CPU's
// quantize_fp8_rows gives on dequantize_row_ref's values (one scale per row,
// in every block scale of the row and once in row_scale), for block and
// float types.
TEST(CudaPrefill, Fp8RowConversionMatchesTheCpuRecipe) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    std::mt19937 rng(301);
    for (DType t : {DType::Q4_K, DType::Q8_0, DType::Q6_K, DType::F16, DType::BF16, DType::F32, DType::NVFP4}) {
        const int64_t N = 37, K = 512;
        HostMatrix m = random_matrix(t, N, K, rng);
        if (t == DType::Q8_0) std::fill(m.deq.begin(), m.deq.begin() + K, 0.0f);  // an all-zero row: scale 1
        if (t == DType::Q8_0) {
            std::vector<float> zero(static_cast<size_t>(K), 0.0f);
            quantize_row_ref(t, zero.data(), m.bytes.data(), K);
        }
        cuda::DeviceWeight w = upload(ctx, m);
        cuda::DeviceWeight f = cuda::to_fp8_rows(w, ctx.stream());
        ASSERT_EQ(f.type, DType::F8_E4M3_B32);
        ASSERT_TRUE(f.fp8_row_scaled);
        std::vector<uint8_t> q(static_cast<size_t>(N * K));
        std::vector<float> sc(static_cast<size_t>(N * K / 32));
        QUERN_CUDA_CHECK(cudaMemcpy(q.data(), f.q, q.size(), cudaMemcpyDeviceToHost));
        QUERN_CUDA_CHECK(cudaMemcpy(sc.data(), f.s, sc.size() * 4, cudaMemcpyDeviceToHost));
        std::vector<float> row_scale(static_cast<size_t>(N));
        ASSERT_NE(f.row_scale, nullptr);
        QUERN_CUDA_CHECK(cudaMemcpy(row_scale.data(), f.row_scale, row_scale.size() * 4, cudaMemcpyDeviceToHost));
        std::vector<uint8_t> rq(q.size());
        std::vector<float> rs(static_cast<size_t>(N));
        quantize_fp8_rows(m.deq.data(), N, K, rq.data(), rs.data());
        int bad = 0;
        for (int64_t r = 0; r < N; ++r) {
            if (row_scale[static_cast<size_t>(r)] != rs[static_cast<size_t>(r)] && bad++ < 5)
                ADD_FAILURE() << dtype_name(t) << " row " << r << " row scale " << row_scale[static_cast<size_t>(r)]
                              << " vs " << rs[static_cast<size_t>(r)];
            for (int64_t b = 0; b < K / 32; ++b)
                if (sc[static_cast<size_t>(r * (K / 32) + b)] != rs[static_cast<size_t>(r)] && bad++ < 5)
                    ADD_FAILURE() << dtype_name(t) << " row " << r << " scale " << sc[static_cast<size_t>(r * (K / 32) + b)]
                                  << " vs " << rs[static_cast<size_t>(r)];
            for (int64_t k = 0; k < K; ++k)
                if (q[static_cast<size_t>(r * K + k)] != rq[static_cast<size_t>(r * K + k)] && bad++ < 5)
                    ADD_FAILURE() << dtype_name(t) << " row " << r << " [" << k << "] code "
                                  << int(q[static_cast<size_t>(r * K + k)]) << " vs " << int(rq[static_cast<size_t>(r * K + k)]);
        }
        EXPECT_EQ(bad, 0) << dtype_name(t);
    }
}

// The FP8 prefill GEMM (per-channel weights, per-token activations, both
// scales after the product) against (a) the exact product of the same codes
// and scales (2^-12 of Σ|terms|: FP8 MMA accumulation), and (b) the float
// product of the unquantized operands — cosine >= 0.999 for every row, with
// one activation row 1,000× the others (the outlier recipe of fp8_test.cpp).
TEST(CudaPrefill, Fp8GemmMatchesItsCodesAndSurvivesOutliers) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    std::mt19937 rng(302);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t N = 256, K = 1024, n = 24;
    HostMatrix m = random_matrix(DType::Q8_0, N, K, rng);
    cuda::DeviceWeight w = cuda::to_fp8_rows(upload(ctx, m), ctx.stream());
    std::vector<uint8_t> qw(static_cast<size_t>(N * K));
    std::vector<float> sw(static_cast<size_t>(N));
    quantize_fp8_rows(m.deq.data(), N, K, qw.data(), sw.data());
    std::vector<float> x(static_cast<size_t>(n * K));
    for (auto& v : x) v = nd(rng);
    for (int64_t k = 0; k < K; ++k) x[static_cast<size_t>(5 * K + k)] *= 1000.0f;  // the outlier token
    // The GEMM sees the BF16 rounding of x; so does the reference.
    for (auto& v : x) v = bf16_to_float(fp32_to_bf16(v));
    cuda::PrefillGemm gemm(n, K);
    cuda::DeviceBuffer dx(x.size() * 4), dy(static_cast<size_t>(n * N) * 4);
    dx.upload(x.data(), x.size() * 4, ctx.stream());
    dy.fill_bytes(0xFF, ctx.stream());
    gemm.run(w, dx.as<float>(), K, n, dy.as<float>(), N, ctx.stream());
    std::vector<float> y(static_cast<size_t>(n * N));
    dy.download(y.data(), y.size() * 4, ctx.stream());
    ASSERT_EQ(gemm.fp8_fallbacks(), 0) << "cuBLASLt offered no FP8 kernel: the weights went through BF16";
    std::vector<uint8_t> qx(x.size());
    std::vector<float> sx(static_cast<size_t>(n));
    quantize_fp8_rows(x.data(), n, K, qx.data(), sx.data());
    int bad = 0;
    for (int64_t r = 0; r < n; ++r) {
        std::vector<double> fl(static_cast<size_t>(N)), got(static_cast<size_t>(N));
        for (int64_t j = 0; j < N; ++j) {
            double codes = 0, mag = 0, f = 0;
            for (int64_t k = 0; k < K; ++k) {
                const double p = static_cast<double>(fp8_e4m3_to_float(qx[static_cast<size_t>(r * K + k)])) *
                                 fp8_e4m3_to_float(qw[static_cast<size_t>(j * K + k)]);
                codes += p;
                mag += std::fabs(p);
                f += static_cast<double>(x[static_cast<size_t>(r * K + k)]) * m.deq[static_cast<size_t>(j * K + k)];
            }
            const double s = static_cast<double>(sx[static_cast<size_t>(r)]) * sw[static_cast<size_t>(j)];
            // Hopper's FP8 MMA adds partial sums with fewer bits than fp32
            // between promotions: 2^-12 of Σ|terms| (an indexing or scale
            // error is of the order of the terms themselves).
            const double ref = codes * s, tol = std::ldexp(1.0, -12) * mag * s + 1e-6;
            const float g = y[static_cast<size_t>(r * N + j)];
            if (!(std::fabs(g - ref) <= tol) && bad++ < 5)
                ADD_FAILURE() << "row " << r << " col " << j << ": " << g << " vs " << ref << " (tol " << tol << ")";
            fl[static_cast<size_t>(j)] = f;
            got[static_cast<size_t>(j)] = g;
        }
        double dot = 0, na = 0, nb = 0;
        for (int64_t j = 0; j < N; ++j)
            dot += fl[static_cast<size_t>(j)] * got[static_cast<size_t>(j)], na += fl[static_cast<size_t>(j)] * fl[static_cast<size_t>(j)],
                nb += got[static_cast<size_t>(j)] * got[static_cast<size_t>(j)];
        EXPECT_GE(dot / std::sqrt(na * nb), 0.999) << "row " << r << (r == 5 ? " (the outlier token)" : "");
    }
    EXPECT_EQ(bad, 0);
}

TEST(CudaPrefill, GemmRejectsBadShapes) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    std::mt19937 rng(9);
    HostMatrix m = random_matrix(DType::Q8_0, 8, 64, rng);
    cuda::DeviceWeight w = upload(ctx, m);
    cuda::PrefillGemm gemm(4, 64);
    cuda::DeviceBuffer dx(4 * 64 * 4), dy(4 * 8 * 4);
    EXPECT_THROW(gemm.run(w, dx.as<float>(), 64, 5, dy.as<float>(), 8, ctx.stream()), std::runtime_error);   // n > max_n
    EXPECT_THROW(gemm.run(w, dx.as<float>(), 63, 4, dy.as<float>(), 8, ctx.stream()), std::runtime_error);   // ldx < K
    EXPECT_THROW(gemm.run(w, dx.as<float>(), 64, 4, dy.as<float>(), 7, ctx.stream()), std::runtime_error);   // ldy < N
    EXPECT_THROW(cuda::PrefillGemm(4, 64, 32), std::runtime_error);                                           // tile < one row
}

// prefill_rope_kv_store against cpu::rope, for both cache types, neox and
// not, with Qwen2's biases and Qwen3's q/k norms.
TEST(CudaPrefill, RopeKvStoreMatchesCpu) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    std::mt19937 rng(303);
    std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
    struct Case {
        int hd, rope_dim, n_head, n_head_kv;
        bool neox, bias, norm;
    };
    for (const Case& c : {Case{128, 128, 8, 2, false, false, false}, Case{64, 64, 4, 1, true, true, false},
                          Case{128, 64, 4, 4, true, false, true}, Case{256, 256, 2, 1, false, true, true}}) {
        for (cuda::KvType kvt : {cuda::KvType::F32, cuda::KvType::F16}) {
            const int n = 13, pos0 = 29, n_ctx = 64;
            const int qd = c.n_head * c.hd, kvd = c.n_head_kv * c.hd, ld = qd + 2 * kvd + 4;
            std::vector<float> qkv(static_cast<size_t>(n * ld)), bias(static_cast<size_t>(qd + 2 * kvd)),
                qn(static_cast<size_t>(c.hd)), kn(static_cast<size_t>(c.hd));
            for (auto& v : qkv) v = ud(rng);
            for (auto& v : bias) v = ud(rng);
            for (auto& v : qn) v = 0.5f + ud(rng) * 0.4f;
            for (auto& v : kn) v = 0.5f + ud(rng) * 0.4f;
            std::vector<float> inv(static_cast<size_t>(c.rope_dim / 2));
            cpu::rope_inv_freq(c.rope_dim, 10000.0f, nullptr, inv.data());
            const size_t es = kvt == cuda::KvType::F16 ? 2 : 4;
            cuda::DeviceBuffer dqkv(qkv.size() * 4), dbias(bias.size() * 4), dqn(qn.size() * 4), dkn(kn.size() * 4),
                dinv(inv.size() * 4), kc(static_cast<size_t>(n_ctx * kvd) * es), vc(static_cast<size_t>(n_ctx * kvd) * es);
            dqkv.upload(qkv.data(), qkv.size() * 4, ctx.stream());
            dbias.upload(bias.data(), bias.size() * 4, ctx.stream());
            dqn.upload(qn.data(), qn.size() * 4, ctx.stream());
            dkn.upload(kn.data(), kn.size() * 4, ctx.stream());
            dinv.upload(inv.data(), inv.size() * 4, ctx.stream());
            kc.fill_bytes(0xFF, ctx.stream());
            vc.fill_bytes(0xFF, ctx.stream());
            cuda::AttentionExtras ex;
            if (c.bias) {
                ex.q_bias = dbias.as<float>();
                ex.k_bias = ex.q_bias + qd;
                ex.v_bias = ex.q_bias + qd + kvd;
            }
            if (c.norm) {
                ex.q_norm = dqn.as<float>();
                ex.k_norm = dkn.as<float>();
            }
            ex.norm_eps = 1e-6f;
            cuda::prefill_rope_kv_store(dqkv.as<float>(), ld, n, pos0, kc.data(), vc.data(), kvt, n_ctx, c.n_head,
                                        c.n_head_kv, c.hd, dinv.as<float>(), c.rope_dim, c.neox, ex, ctx.stream());
            std::vector<float> gq(qkv.size());
            dqkv.download(gq.data(), gq.size() * 4, ctx.stream());
            std::vector<uint8_t> gk(kc.size()), gv(vc.size());
            kc.download(gk.data(), gk.size(), ctx.stream());
            vc.download(gv.data(), gv.size(), ctx.stream());
            const auto cache_at = [&](const std::vector<uint8_t>& b, size_t i) {
                if (es == 4) {
                    float f;
                    std::memcpy(&f, b.data() + 4 * i, 4);
                    return f;
                }
                uint16_t h;
                std::memcpy(&h, b.data() + 2 * i, 2);
                return fp16_to_fp32(h);
            };
            int bad = 0;
            for (int r = 0; r < n; ++r) {
                // Reference: bias, per-head norm (as cpu::rms_norm), cpu::rope at pos0 + r.
                std::vector<float> q(qkv.begin() + r * ld, qkv.begin() + r * ld + qd),
                    k(qkv.begin() + r * ld + qd, qkv.begin() + r * ld + qd + kvd),
                    v(qkv.begin() + r * ld + qd + kvd, qkv.begin() + r * ld + qd + 2 * kvd);
                if (c.bias) {
                    for (int i = 0; i < qd; ++i) q[static_cast<size_t>(i)] += bias[static_cast<size_t>(i)];
                    for (int i = 0; i < kvd; ++i) k[static_cast<size_t>(i)] += bias[static_cast<size_t>(qd + i)];
                    for (int i = 0; i < kvd; ++i) v[static_cast<size_t>(i)] += bias[static_cast<size_t>(qd + kvd + i)];
                }
                if (c.norm) {
                    const auto norm = [&](std::vector<float>& x, int heads, const std::vector<float>& w) {
                        for (int h = 0; h < heads; ++h) {
                            double ss = 0;
                            for (int e = 0; e < c.hd; ++e) ss += double(x[static_cast<size_t>(h * c.hd + e)]) * x[static_cast<size_t>(h * c.hd + e)];
                            const float sc = static_cast<float>(1.0 / std::sqrt(ss / c.hd + 1e-6));
                            for (int e = 0; e < c.hd; ++e)
                                x[static_cast<size_t>(h * c.hd + e)] = x[static_cast<size_t>(h * c.hd + e)] * sc * w[static_cast<size_t>(e)];
                        }
                    };
                    norm(q, c.n_head, qn);
                    norm(k, c.n_head_kv, kn);
                }
                const int32_t p = pos0 + r;
                cpu::rope(q.data(), &p, 1, c.n_head, c.hd, c.rope_dim, 10000.0f, c.neox, nullptr);
                cpu::rope(k.data(), &p, 1, c.n_head_kv, c.hd, c.rope_dim, 10000.0f, c.neox, nullptr);
                float amax = 0;
                for (float f : q) amax = std::max(amax, std::fabs(f));
                for (float f : k) amax = std::max(amax, std::fabs(f));
                const float tol = 1e-5f * amax + 1e-6f;
                for (int i = 0; i < qd; ++i) {
                    const float g = gq[static_cast<size_t>(r * ld + i)];
                    if (!(std::fabs(g - q[static_cast<size_t>(i)]) <= tol) && bad++ < 5)
                        ADD_FAILURE() << "q row " << r << " [" << i << "] " << g << " vs " << q[static_cast<size_t>(i)];
                }
                for (int i = 0; i < kvd; ++i) {
                    const size_t ci = static_cast<size_t>(p) * kvd + i;
                    const float gk_ = cache_at(gk, ci), gv_ = cache_at(gv, ci);
                    const float rk = k[static_cast<size_t>(i)], rv = v[static_cast<size_t>(i)];
                    const float ktol = es == 4 ? tol : tol + std::ldexp(std::fabs(rk), -10);
                    if (!(std::fabs(gk_ - rk) <= ktol) && bad++ < 5)
                        ADD_FAILURE() << "k row " << r << " [" << i << "] " << gk_ << " vs " << rk;
                    const float rv_ = es == 4 ? rv : fp16_to_fp32(fp32_to_fp16(rv));
                    if (gv_ != rv_ && bad++ < 5) ADD_FAILURE() << "v row " << r << " [" << i << "] " << gv_ << " vs " << rv_;
                }
            }
            // Cache rows outside pos0 .. pos0+n−1 keep their poison.
            for (int p : {pos0 - 1, pos0 + n}) {
                const float g = cache_at(gk, static_cast<size_t>(p) * kvd);
                EXPECT_TRUE(std::isnan(g)) << "cache row " << p << " written";
            }
            // The padding past q|k|v in each row is untouched.
            for (int r = 0; r < n; ++r)
                for (int i = qd + 2 * kvd; i < ld; ++i)
                    EXPECT_EQ(gq[static_cast<size_t>(r * ld + i)], qkv[static_cast<size_t>(r * ld + i)]);
            // k and v in qkv are left unchanged.
            for (int r = 0; r < n; ++r)
                for (int i = qd; i < qd + 2 * kvd; ++i)
                    if (gq[static_cast<size_t>(r * ld + i)] != qkv[static_cast<size_t>(r * ld + i)] && bad++ < 5)
                        ADD_FAILURE() << "k/v in qkv modified at row " << r;
            EXPECT_EQ(bad, 0) << "hd " << c.hd << (kvt == cuda::KvType::F16 ? " f16" : " f32");
        }
    }
}

// prefill_attention against cpu::attention: head sizes 64, 128 and 256 (and
// 32, 96: the scalar kernel), GQA 4:1 and 6:1, at the start of the cache and after 45 or 200 positions
// (several 32-key steps, partial ones), sliding windows and soft-capping,
// both cache types; for the tensor-core path, several 64-row query tiles and
// key tiles (64 keys; 32 for heads of 256), partial ones, and windows that leave whole key tiles masked
// for some rows of a tile.
TEST(CudaPrefill, AttentionMatchesCpu) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    ThreadPool pool(0);
    std::mt19937 rng(404);
    std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
    struct Case {
        int hd, n_head, n_head_kv, n, pos0, window;
        float softcap;
    };
    for (const Case& c : {Case{64, 8, 2, 33, 0, 0, 0.0f}, Case{128, 8, 2, 33, 0, 0, 0.0f}, Case{64, 8, 2, 33, 45, 0, 0.0f},
                          Case{128, 8, 2, 17, 45, 0, 0.0f}, Case{128, 8, 2, 33, 45, 16, 0.0f},
                          Case{64, 8, 2, 7, 45, 5, 0.0f}, Case{64, 4, 1, 33, 20, 0, 30.0f}, Case{32, 16, 4, 9, 3, 0, 0.0f},
                          Case{256, 4, 1, 33, 45, 8, 0.0f}, Case{128, 8, 8, 1, 45, 0, 0.0f},
                          Case{128, 32, 8, 40, 200, 0, 0.0f}, Case{64, 8, 2, 40, 200, 100, 0.0f},
                          Case{128, 8, 2, 150, 0, 0, 0.0f}, Case{64, 4, 1, 130, 70, 0, 0.0f},
                          Case{128, 8, 2, 200, 300, 100, 0.0f}, Case{64, 8, 4, 130, 0, 5, 0.0f},
                          Case{128, 4, 2, 97, 33, 0, 50.0f}, Case{96, 8, 2, 40, 30, 0, 0.0f},
                          Case{96, 32, 32, 20, 100, 16, 0.0f}, Case{256, 24, 4, 150, 70, 0, 0.0f},
                          Case{256, 8, 2, 97, 33, 0, 50.0f}, Case{256, 4, 2, 130, 200, 40, 0.0f}}) {
        for (cuda::KvType kvt : {cuda::KvType::F16, cuda::KvType::F32}) {
            const int n_ctx = c.pos0 + c.n + 3;
            const int qd = c.n_head * c.hd, kvd = c.n_head_kv * c.hd;
            const int64_t ldq = qd + 8, ldo = qd + 16;
            std::vector<float> q(static_cast<size_t>(c.n * ldq)), k(static_cast<size_t>(n_ctx * kvd)),
                v(static_cast<size_t>(n_ctx * kvd));
            for (auto& x : q) x = ud(rng) * 2.0f;
            for (auto& x : k) x = ud(rng);
            for (auto& x : v) x = ud(rng);
            const size_t es = kvt == cuda::KvType::F16 ? 2 : 4;
            std::vector<uint8_t> kb(k.size() * es), vb(v.size() * es);
            for (size_t i = 0; i < k.size(); ++i) {
                if (es == 2) {  // the reference reads the rounded values
                    const uint16_t hk = fp32_to_fp16(k[i]), hv = fp32_to_fp16(v[i]);
                    k[i] = fp16_to_fp32(hk);
                    v[i] = fp16_to_fp32(hv);
                    std::memcpy(kb.data() + 2 * i, &hk, 2);
                    std::memcpy(vb.data() + 2 * i, &hv, 2);
                } else {
                    std::memcpy(kb.data() + 4 * i, &k[i], 4);
                    std::memcpy(vb.data() + 4 * i, &v[i], 4);
                }
            }
            // Rows past pos0+n−1 must not be read: NaN there.
            for (int p = c.pos0 + c.n; p < n_ctx; ++p)
                for (int i = 0; i < kvd; ++i) {
                    const size_t at = static_cast<size_t>(p) * kvd + i;
                    std::memset(kb.data() + at * es, 0xFF, es);
                    std::memset(vb.data() + at * es, 0xFF, es);
                }
            cuda::DeviceBuffer dq(q.size() * 4), dk(kb.size()), dv(vb.size()), dout(static_cast<size_t>(c.n * ldo) * 4);
            dq.upload(q.data(), q.size() * 4, ctx.stream());
            dk.upload(kb.data(), kb.size(), ctx.stream());
            dv.upload(vb.data(), vb.size(), ctx.stream());
            dout.fill_bytes(0xFF, ctx.stream());
            const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
            cuda::prefill_attention(dq.as<float>(), ldq, dk.data(), dv.data(), kvt, c.n, c.pos0, n_ctx, c.n_head,
                                    c.n_head_kv, c.hd, scale, c.window, c.softcap, dout.as<float>(), ldo, ctx.stream());
            std::vector<float> got(static_cast<size_t>(c.n * ldo));
            dout.download(got.data(), got.size() * 4, ctx.stream());
            // Reference: contiguous q rows, positions pos0 + r.
            std::vector<float> qc(static_cast<size_t>(c.n * qd)), ref(static_cast<size_t>(c.n * qd));
            std::vector<int32_t> pos(static_cast<size_t>(c.n));
            for (int r = 0; r < c.n; ++r) {
                std::copy(q.begin() + r * ldq, q.begin() + r * ldq + qd, qc.begin() + r * qd);
                pos[static_cast<size_t>(r)] = c.pos0 + r;
            }
            cpu::attention(qc.data(), k.data(), v.data(), kvd, pos.data(), c.n, c.n_head, c.n_head_kv, c.hd, scale,
                           ref.data(), pool, c.window, c.softcap);
            const float tol = cuda::prefill_flash_supported(kvt, c.hd, ldq, ldo) ? 2e-3f : 2e-5f;
            int bad = 0;
            for (int r = 0; r < c.n; ++r) {
                for (int i = 0; i < qd; ++i) {
                    const float g = got[static_cast<size_t>(r * ldo + i)], e = ref[static_cast<size_t>(r * qd + i)];
                    if (!(std::fabs(g - e) <= tol) && bad++ < 5)
                        ADD_FAILURE() << "hd " << c.hd << " row " << r << " [" << i << "] " << g << " vs " << e;
                }
                for (int64_t i = qd; i < ldo; ++i) {
                    uint32_t bits;
                    std::memcpy(&bits, &got[static_cast<size_t>(r * ldo + i)], 4);
                    if (bits != 0xFFFFFFFFu && bad++ < 5) ADD_FAILURE() << "padding written at row " << r;
                }
            }
            EXPECT_EQ(bad, 0) << "hd " << c.hd << " heads " << c.n_head << "/" << c.n_head_kv << " n " << c.n
                              << " pos0 " << c.pos0 << " window " << c.window << " softcap " << c.softcap
                              << (kvt == cuda::KvType::F16 ? " f16" : " f32");
        }
    }
}

// paged_rope_kv_store with LongRoPE's per-row table (PagedRows::rope_long):
// rows flagged long rotate (q in place, k into the cache) exactly as with the
// long table given for every row, the others as with the short one; a flag
// array without its table is refused.
TEST(CudaPrefill, PagedRopeLongRowsTakeTheLongTable) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    std::mt19937 rng(811);
    std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
    const int hd = 32, n_head = 4, n_head_kv = 2, rope_dim = 16, bs = 16, n = 6;
    const int64_t ld = (n_head + 2 * n_head_kv) * hd, kvd = n_head_kv * hd;
    std::vector<float> qkv(static_cast<size_t>(n * ld));
    for (auto& x : qkv) x = ud(rng);
    std::vector<float> fshort(rope_dim / 2), flong(rope_dim / 2);
    for (int i = 0; i < rope_dim / 2; ++i) {
        fshort[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * i / rope_dim) / (1.0f + 0.1f * i);
        flong[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * i / rope_dim) / (1.0f + 2.0f * i);
    }
    const std::vector<int32_t> pos = {3, 17, 40, 41, 5, 63}, toff(n, 0), tabs = {2, 0, 3, 1}, flags = {0, 1, 1, 0, 1, 0};
    cuda::DeviceBuffer dpos = on_device(pos, ctx), doff = on_device(toff, ctx), dtab = on_device(tabs, ctx),
                       dflag = on_device(flags, ctx), dfs = on_device(fshort, ctx), dfl = on_device(flong, ctx);
    const auto run = [&](const float* table, bool per_row, std::vector<float>& q_out, std::vector<uint16_t>& k_out) {
        cuda::DeviceBuffer dq = on_device(qkv, ctx), dk(static_cast<size_t>(4 * bs * kvd) * 2),
                           dv(static_cast<size_t>(4 * bs * kvd) * 2);
        dk.fill_bytes(0, ctx.stream());
        dv.fill_bytes(0, ctx.stream());
        cuda::PagedRows pr = paged_rows(dpos, doff, dtab, bs);
        if (per_row) {
            pr.rope_long = dflag.as<int32_t>();
            pr.inv_freq_long = dfl.as<float>();
        }
        cuda::paged_rope_kv_store(dq.as<float>(), ld, n, pr, dk.data(), dv.data(), cuda::KvType::F16, n_head,
                                  n_head_kv, hd, table, rope_dim, false, cuda::AttentionExtras{}, ctx.stream());
        q_out.resize(qkv.size());
        k_out.resize(static_cast<size_t>(4 * bs * kvd));
        dq.download(q_out.data(), q_out.size() * 4, ctx.stream());
        dk.download(k_out.data(), k_out.size() * 2, ctx.stream());
    };
    std::vector<float> qs, ql, qm;
    std::vector<uint16_t> ks, kl, km;
    run(dfs.as<float>(), false, qs, ks);
    run(dfl.as<float>(), false, ql, kl);
    run(dfs.as<float>(), true, qm, km);
    for (int r = 0; r < n; ++r) {
        const bool lg = flags[static_cast<size_t>(r)] != 0;
        const auto& qw = lg ? ql : qs;
        const auto& kw = lg ? kl : ks;
        for (int64_t e = 0; e < ld; ++e)
            ASSERT_EQ(qm[static_cast<size_t>(r * ld + e)], qw[static_cast<size_t>(r * ld + e)]) << "row " << r;
        const int p = pos[static_cast<size_t>(r)];
        const int64_t crow = static_cast<int64_t>(tabs[static_cast<size_t>(p / bs)]) * bs + p % bs;
        for (int64_t e = 0; e < kvd; ++e)
            ASSERT_EQ(km[static_cast<size_t>(crow * kvd + e)], kw[static_cast<size_t>(crow * kvd + e)]) << "row " << r;
    }
    EXPECT_NE(qs, ql);  // the tables differ where it matters
    cuda::PagedRows bad;
    bad.pos = dpos.as<int32_t>();
    bad.table_off = doff.as<int32_t>();
    bad.tables = dtab.as<int32_t>();
    bad.rope_long = dflag.as<int32_t>();
    cuda::DeviceBuffer dq = on_device(qkv, ctx), dk(static_cast<size_t>(4 * bs * kvd) * 2);
    EXPECT_THROW(cuda::paged_rope_kv_store(dq.as<float>(), ld, n, bad, dk.data(), dk.data(), cuda::KvType::F16, n_head,
                                           n_head_kv, hd, dfs.as<float>(), rope_dim, false, cuda::AttentionExtras{},
                                           ctx.stream()),
                 std::runtime_error);
}

// paged_attention (both kernels: the grouped one and the scalar one) and
// paged_rope_kv_store's addressing, against cpu::attention on each
// sequence's own contiguous keys: three sequences whose blocks are shuffled
// through the pool (blocks no row may read are NaN), rows that are decode
// tokens and prompt chunks, GQA ratios 1 to 7, heads 32 to 256 (256: the
// scalar kernel only), windows and soft-capping.
TEST(CudaPrefill, PagedAttentionMatchesCpu) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    ThreadPool pool(0);
    std::mt19937 rng(505);
    std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
    struct Case {
        int hd, n_head, n_head_kv, window;
        float softcap;
    };
    const int bs = 16, n_blocks = 40;
    for (const Case& c : {Case{128, 32, 8, 0, 0.0f}, Case{64, 9, 3, 0, 0.0f}, Case{128, 28, 4, 0, 0.0f},
                          Case{64, 8, 8, 0, 0.0f}, Case{32, 16, 1, 0, 0.0f}, Case{128, 8, 2, 20, 0.0f},
                          Case{64, 8, 2, 0, 30.0f}, Case{256, 8, 4, 9, 50.0f}, Case{96, 32, 8, 0, 0.0f}}) {
        const int qd = c.n_head * c.hd, kvd = c.n_head_kv * c.hd;
        // Sequence lengths (positions filled) and the rows evaluated: (seq, pos).
        const std::vector<int> len = {150, 37, 70};
        std::vector<std::pair<int, int>> rows;
        for (int p = 120; p < 150; ++p) rows.push_back({0, p});  // a prompt chunk
        rows.push_back({1, 36});                                  // decode rows
        rows.push_back({2, 69});
        for (int p = 0; p < 5; ++p) rows.push_back({2, p});       // the start of a prompt
        // Blocks: a shuffled permutation of the pool.
        std::vector<int32_t> perm(n_blocks);
        for (int i = 0; i < n_blocks; ++i) perm[static_cast<size_t>(i)] = i;
        std::shuffle(perm.begin(), perm.end(), rng);
        std::vector<std::vector<int32_t>> table(3);
        int next = 0;
        for (int sq = 0; sq < 3; ++sq)
            for (int b = 0; b < (len[static_cast<size_t>(sq)] + bs - 1) / bs; ++b) table[static_cast<size_t>(sq)].push_back(perm[static_cast<size_t>(next++)]);
        // Pool contents: NaN everywhere, then each sequence's K/V (f16-rounded).
        std::vector<uint16_t> kp(static_cast<size_t>(n_blocks * bs * kvd), 0x7E00), vp(kp.size(), 0x7E00);
        std::vector<std::vector<float>> ks(3), vs(3);
        for (int sq = 0; sq < 3; ++sq) {
            auto& K = ks[static_cast<size_t>(sq)];
            auto& Vv = vs[static_cast<size_t>(sq)];
            K.resize(static_cast<size_t>(len[static_cast<size_t>(sq)] * kvd));
            Vv.resize(K.size());
            for (int p = 0; p < len[static_cast<size_t>(sq)]; ++p) {
                const int64_t row = static_cast<int64_t>(table[static_cast<size_t>(sq)][static_cast<size_t>(p / bs)]) * bs + p % bs;
                for (int i = 0; i < kvd; ++i) {
                    const uint16_t hk = fp32_to_fp16(ud(rng)), hv = fp32_to_fp16(ud(rng));
                    K[static_cast<size_t>(p * kvd + i)] = fp16_to_fp32(hk);
                    Vv[static_cast<size_t>(p * kvd + i)] = fp16_to_fp32(hv);
                    kp[static_cast<size_t>(row * kvd + i)] = hk;
                    vp[static_cast<size_t>(row * kvd + i)] = hv;
                }
            }
        }
        const int n = static_cast<int>(rows.size());
        const int64_t ldq = qd + 8, ldo = qd + 4;
        std::vector<float> q(static_cast<size_t>(n * ldq));
        for (auto& x : q) x = ud(rng) * 2.0f;
        std::vector<int32_t> pos(static_cast<size_t>(n)), toff(static_cast<size_t>(n)), tabs;
        std::vector<int32_t> off_of(3);
        for (int sq = 0; sq < 3; ++sq) {
            off_of[static_cast<size_t>(sq)] = static_cast<int32_t>(tabs.size());
            tabs.insert(tabs.end(), table[static_cast<size_t>(sq)].begin(), table[static_cast<size_t>(sq)].end());
        }
        for (int r = 0; r < n; ++r) {
            pos[static_cast<size_t>(r)] = rows[static_cast<size_t>(r)].second;
            toff[static_cast<size_t>(r)] = off_of[static_cast<size_t>(rows[static_cast<size_t>(r)].first)];
        }
        cuda::DeviceBuffer dq = on_device(q, ctx), dk = on_device(kp, ctx), dv = on_device(vp, ctx),
                           dpos = on_device(pos, ctx), doff = on_device(toff, ctx), dtab = on_device(tabs, ctx),
                           dout(static_cast<size_t>(n * ldo) * 4);
        const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
        // Reference, row by row over the row's own sequence.
        std::vector<float> ref(static_cast<size_t>(n * qd));
        for (int r = 0; r < n; ++r) {
            const int sq = rows[static_cast<size_t>(r)].first;
            std::vector<float> qr(q.begin() + r * ldq, q.begin() + r * ldq + qd);
            cpu::attention(qr.data(), ks[static_cast<size_t>(sq)].data(), vs[static_cast<size_t>(sq)].data(), kvd,
                           &pos[static_cast<size_t>(r)], 1, c.n_head, c.n_head_kv, c.hd, scale,
                           ref.data() + static_cast<size_t>(r) * qd, pool, c.window, c.softcap);
        }
        // The grouped kernel (within 2e-3: f16 queries and weights), the
        // scalar one (2e-5), and the grouped one with its keys split across
        // blocks (flash-decoding) and merged; each also with BF16 output (the
        // output projection's input: within one more BF16 rounding, 2^-8
        // relative, of the reference).
        cuda::DeviceBuffer dws(static_cast<size_t>(n * c.n_head * 8 * (c.hd + 2)) * 4);
        cuda::DeviceBuffer dob(static_cast<size_t>(n * qd + 16) * 2);
        for (int mode : {0, 1, 2}) {
            for (bool bf16 : {false, true}) {
                const bool scalar = mode == 1;
                const char* name = scalar ? " scalar" : mode ? " split" : " grouped";
                cuda::PagedRows pr = paged_rows(dpos, doff, dtab, bs);
                pr.scalar = scalar;
                if (mode == 2) {
                    pr.split_ws = dws.as<float>();
                    pr.split_ws_floats = static_cast<int64_t>(n) * c.n_head * 8 * (c.hd + 2);
                    pr.max_keys = *std::max_element(len.begin(), len.end());
                }
                if (bf16) pr.out_bf16 = dob.as<uint16_t>();
                dout.fill_bytes(0xFF, ctx.stream());
                dob.fill_bytes(0xFF, ctx.stream());
                cuda::paged_attention(dq.as<float>(), ldq, dk.data(), dv.data(), cuda::KvType::F16, n, pr, c.n_head,
                                      c.n_head_kv, c.hd, scale, c.window, c.softcap, dout.as<float>(), ldo, ctx.stream());
                std::vector<float> got(static_cast<size_t>(n * ldo));
                std::vector<uint16_t> gotb(static_cast<size_t>(n * qd + 16));
                dout.download(got.data(), got.size() * 4, ctx.stream());
                dob.download(gotb.data(), gotb.size() * 2, ctx.stream());
                int bad = 0;
                for (int r = 0; r < n; ++r) {
                    for (int i = 0; i < qd; ++i) {
                        const float e = ref[static_cast<size_t>(r * qd + i)];
                        const float g = bf16 ? bf16_to_float(gotb[static_cast<size_t>(r * qd + i)])
                                             : got[static_cast<size_t>(r * ldo + i)];
                        // The grouped kernel multiplies on the tensor cores with
                        // q·scale and the softmax weights in f16 (ops_paged.cu).
                        const float base = scalar ? 2e-5f : 2e-3f;
                        const float tol = bf16 ? base + std::ldexp(std::fabs(e), -8) : base;
                        if (!(std::fabs(g - e) <= tol) && bad++ < 5)
                            ADD_FAILURE() << "hd " << c.hd << name << (bf16 ? " bf16" : "") << " row " << r << " [" << i
                                          << "] " << g << " vs " << e;
                    }
                    for (int64_t i = qd; i < ldo && !bf16; ++i) {
                        uint32_t bits;
                        std::memcpy(&bits, &got[static_cast<size_t>(r * ldo + i)], 4);
                        if (bits != 0xFFFFFFFFu && bad++ < 5) ADD_FAILURE() << "padding written at row " << r;
                    }
                }
                for (size_t i = static_cast<size_t>(n * qd); i < gotb.size(); ++i)
                    if (gotb[i] != 0xFFFF && bad++ < 5) ADD_FAILURE() << "BF16 output written past n rows";
                EXPECT_EQ(bad, 0) << "hd " << c.hd << " heads " << c.n_head << "/" << c.n_head_kv << " window "
                                  << c.window << " softcap " << c.softcap << name << (bf16 ? " bf16" : "");
            }
        }
    }
}

// paged_rope_attention (RoPE, the KV write and the attention in one launch
// for decode rows) leaves the caches bit for bit as paged_rope_kv_store and
// gives paged_attention's output after it: one row per sequence, positions
// at the edges of the 32-key tiles (the writing block's first tile holding
// its own key or not), with and without key splits, BF16 or float output,
// biases and q/k norms, partial and NeoX rotation, LongRoPE rows, a window,
// soft-capping, and heads of 96 (the two-launch fallback).
TEST(CudaPrefill, PagedRopeAttentionEqualsTheTwoLaunches) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    std::mt19937 rng(907);
    std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
    struct Case {
        int hd, n_head, n_head_kv, rope_dim, window;
        bool neox, extras, longrope;
        float softcap;
    };
    const int bs = 16;
    const std::vector<int32_t> pos = {0, 31, 32, 33, 63, 64, 100, 150};
    const int n = static_cast<int>(pos.size()), per_seq = 10, n_blocks = n * per_seq + 4;
    for (const Case& c : {Case{128, 32, 8, 128, 0, false, false, false, 0.0f}, Case{64, 9, 3, 32, 0, true, true, true, 0.0f},
                          Case{32, 16, 1, 32, 20, false, false, false, 0.0f}, Case{64, 8, 2, 64, 0, true, false, false, 30.0f},
                          Case{96, 32, 8, 96, 0, false, true, false, 0.0f}}) {
        const int qd = c.n_head * c.hd, kvd = c.n_head_kv * c.hd;
        const int64_t ld = qd + 2 * kvd + 8, ldo = qd + 4;
        std::vector<float> qkv(static_cast<size_t>(n * ld));
        for (auto& x : qkv) x = ud(rng) * 2.0f;
        std::vector<int32_t> perm(n_blocks), toff(static_cast<size_t>(n)), flags(static_cast<size_t>(n));
        for (int i = 0; i < n_blocks; ++i) perm[static_cast<size_t>(i)] = i;
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int r = 0; r < n; ++r) toff[static_cast<size_t>(r)] = r * per_seq, flags[static_cast<size_t>(r)] = r % 3 == 1;
        std::vector<uint16_t> kp(static_cast<size_t>(n_blocks * bs * kvd)), vp(kp.size());
        for (auto& h : kp) h = fp32_to_fp16(ud(rng));
        for (auto& h : vp) h = fp32_to_fp16(ud(rng));
        std::vector<float> freq(static_cast<size_t>(c.rope_dim / 2)), flong(freq.size());
        for (int i = 0; i < c.rope_dim / 2; ++i) {
            freq[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * i / c.rope_dim);
            flong[static_cast<size_t>(i)] = freq[static_cast<size_t>(i)] / (1.0f + 0.5f * i);
        }
        std::vector<float> qb(static_cast<size_t>(qd)), kb(static_cast<size_t>(kvd)), vb(kb.size()),
            qn(static_cast<size_t>(c.hd)), kn(qn.size());
        for (auto* v : {&qb, &kb, &vb}) for (auto& x : *v) x = ud(rng) * 0.3f;
        for (auto* v : {&qn, &kn}) for (auto& x : *v) x = 1.0f + 0.5f * ud(rng);
        cuda::DeviceBuffer dpos = on_device(pos, ctx), doff = on_device(toff, ctx), dtab = on_device(perm, ctx),
                           dflag = on_device(flags, ctx), dfreq = on_device(freq, ctx), dfl = on_device(flong, ctx),
                           dqb = on_device(qb, ctx), dkb = on_device(kb, ctx), dvb = on_device(vb, ctx),
                           dqn = on_device(qn, ctx), dkn = on_device(kn, ctx);
        cuda::AttentionExtras ex;
        if (c.extras) {
            ex.q_bias = dqb.as<float>(), ex.k_bias = dkb.as<float>(), ex.v_bias = dvb.as<float>();
            ex.q_norm = dqn.as<float>(), ex.k_norm = dkn.as<float>();
        }
        const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
        cuda::DeviceBuffer dws(static_cast<size_t>(n * c.n_head * 8 * (c.hd + 2)) * 4);
        for (const bool split : {false, true})
            for (const bool bf16 : {false, true}) {
                struct Out {
                    std::vector<float> y;
                    std::vector<uint16_t> yb, k, v;
                };
                const auto run = [&](bool fold) {
                    cuda::DeviceBuffer dq = on_device(qkv, ctx), dk = on_device(kp, ctx), dv = on_device(vp, ctx),
                                       dy(static_cast<size_t>(n * ldo) * 4), dyb(static_cast<size_t>(n * qd) * 2);
                    dy.fill_bytes(0xFF, ctx.stream());
                    dyb.fill_bytes(0xFF, ctx.stream());
                    cuda::PagedRows pr = paged_rows(dpos, doff, dtab, bs);
                    pr.one_row_per_seq = true;
                    if (split) {
                        pr.split_ws = dws.as<float>();
                        pr.split_ws_floats = static_cast<int64_t>(n) * c.n_head * 8 * (c.hd + 2);
                        pr.max_keys = 151;
                    }
                    if (bf16) pr.out_bf16 = dyb.as<uint16_t>();
                    if (c.longrope) pr.rope_long = dflag.as<int32_t>(), pr.inv_freq_long = dfl.as<float>();
                    if (fold) {
                        cuda::paged_rope_attention(dq.as<float>(), ld, dk.data(), dv.data(), cuda::KvType::F16, n, pr,
                                                   c.n_head, c.n_head_kv, c.hd, scale, c.window, c.softcap,
                                                   dfreq.as<float>(), c.rope_dim, c.neox, ex, dy.as<float>(), ldo,
                                                   ctx.stream());
                    } else {
                        cuda::paged_rope_kv_store(dq.as<float>(), ld, n, pr, dk.data(), dv.data(), cuda::KvType::F16,
                                                  c.n_head, c.n_head_kv, c.hd, dfreq.as<float>(), c.rope_dim, c.neox, ex,
                                                  ctx.stream());
                        cuda::paged_attention(dq.as<float>(), ld, dk.data(), dv.data(), cuda::KvType::F16, n, pr, c.n_head,
                                              c.n_head_kv, c.hd, scale, c.window, c.softcap, dy.as<float>(), ldo,
                                              ctx.stream());
                    }
                    Out o{std::vector<float>(static_cast<size_t>(n * ldo)), std::vector<uint16_t>(static_cast<size_t>(n * qd)),
                          std::vector<uint16_t>(kp.size()), std::vector<uint16_t>(vp.size())};
                    dy.download(o.y.data(), o.y.size() * 4, ctx.stream());
                    dyb.download(o.yb.data(), o.yb.size() * 2, ctx.stream());
                    dk.download(o.k.data(), o.k.size() * 2, ctx.stream());
                    dv.download(o.v.data(), o.v.size() * 2, ctx.stream());
                    return o;
                };
                const Out a = run(false), b = run(true);
                const std::string what = "hd " + std::to_string(c.hd) + (split ? " split" : "") + (bf16 ? " bf16" : "");
                EXPECT_TRUE(a.k == b.k) << what << ": key cache differs";
                EXPECT_TRUE(a.v == b.v) << what << ": value cache differs";
                EXPECT_NE(a.k, kp) << what << ": no key written";
                int bad = 0;
                for (int r = 0; r < n; ++r)
                    for (int i = 0; i < qd; ++i) {
                        if (bf16) {
                            if (a.yb[static_cast<size_t>(r * qd + i)] != b.yb[static_cast<size_t>(r * qd + i)] && bad++ < 5)
                                ADD_FAILURE() << what << " row " << r << " [" << i << "]";
                        } else {
                            const float x = a.y[static_cast<size_t>(r * ldo + i)], y = b.y[static_cast<size_t>(r * ldo + i)];
                            if (!(std::fabs(x - y) <= 1e-6f) && bad++ < 5)
                                ADD_FAILURE() << what << " row " << r << " [" << i << "] " << y << " vs " << x;
                        }
                    }
                EXPECT_EQ(bad, 0) << what;
            }
    }
}

// get_rows equals get_row row by row, bit for bit (the prefill's embedding
// lookup against the decode step's), ids out of range clamped alike.
TEST(CudaPrefill, GetRowsMatchesGetRow) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    std::mt19937 rng(606);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t rows = 50, dim = 512, n = 9;
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::F8_E4M3_B32,
                    DType::NVFP4}) {
        if (!cuda::cuda_get_row_type_supported(t)) continue;
        const size_t rb = row_size(t, dim);
        std::vector<uint8_t> table(rb * rows);
        std::vector<float> row(static_cast<size_t>(dim));
        for (int64_t r = 0; r < rows; ++r) {
            for (auto& v : row) v = nd(rng);
            if (t == DType::F32) std::memcpy(table.data() + r * rb, row.data(), rb);
            else if (t == DType::F16)
                for (int64_t i = 0; i < dim; ++i) {
                    const uint16_t h = fp32_to_fp16(row[static_cast<size_t>(i)]);
                    std::memcpy(table.data() + r * rb + 2 * i, &h, 2);
                }
            else if (t == DType::BF16)
                for (int64_t i = 0; i < dim; ++i) {
                    uint32_t u;
                    std::memcpy(&u, &row[static_cast<size_t>(i)], 4);
                    const uint16_t h = static_cast<uint16_t>(u >> 16);
                    std::memcpy(table.data() + r * rb + 2 * i, &h, 2);
                }
            else quantize_row_ref(t, row.data(), table.data() + r * rb, dim);
        }
        const std::vector<int32_t> ids = {3, 0, 49, 17, 17, -5, 1000, 8, 25};
        cuda::DeviceBuffer dt(table.size()), did(ids.size() * 4), dout(static_cast<size_t>((n + 1) * dim) * 4),
            done(static_cast<size_t>(dim) * 4);
        dt.upload(table.data(), table.size(), ctx.stream());
        did.upload(ids.data(), ids.size() * 4, ctx.stream());
        dout.fill_bytes(0xFF, ctx.stream());
        cuda::get_rows(t, dt.data(), rows, dim, did.as<int32_t>(), n, dout.as<float>(), ctx.stream());
        std::vector<float> got(static_cast<size_t>((n + 1) * dim)), one(static_cast<size_t>(dim));
        dout.download(got.data(), got.size() * 4, ctx.stream());
        for (int64_t r = 0; r < n; ++r) {
            cuda::get_row(t, dt.data(), rows, dim, did.as<int32_t>() + r, done.as<float>(), ctx.stream());
            done.download(one.data(), one.size() * 4, ctx.stream());
            EXPECT_EQ(0, std::memcmp(one.data(), got.data() + r * dim, one.size() * 4))
                << dtype_name(t) << " row " << r << " (id " << ids[static_cast<size_t>(r)] << ")";
        }
        for (int64_t i = 0; i < dim; ++i) EXPECT_TRUE(std::isnan(got[static_cast<size_t>(n * dim + i)])) << "guard row written";
    }
}

TEST(CudaPrefill, GluRowsMatchesCpu) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    std::mt19937 rng(505);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    const int64_t n = 7, ff = 96, ld = 2 * ff + 4, ldo = ff + 2;
    std::vector<float> gu(static_cast<size_t>(n * ld));
    for (auto& v : gu) v = nd(rng);
    for (bool gelu : {false, true}) {
        cuda::DeviceBuffer dgu(gu.size() * 4), dout(static_cast<size_t>(n * ldo) * 4);
        dgu.upload(gu.data(), gu.size() * 4, ctx.stream());
        dout.fill_bytes(0xFF, ctx.stream());
        cuda::glu_rows(dgu.as<float>(), ld, n, ff, dout.as<float>(), ldo, gelu, ctx.stream());
        std::vector<float> got(static_cast<size_t>(n * ldo)), ref(static_cast<size_t>(ff));
        dout.download(got.data(), got.size() * 4, ctx.stream());
        for (int64_t r = 0; r < n; ++r) {
            const float* g = gu.data() + r * ld;
            if (gelu) cpu::geglu_tanh(g, g + ff, ref.data(), ff);
            else cpu::swiglu(g, g + ff, ref.data(), ff);
            for (int64_t i = 0; i < ff; ++i) {
                const float e = ref[static_cast<size_t>(i)];
                EXPECT_NEAR(got[static_cast<size_t>(r * ldo + i)], e, 1e-5f * std::fabs(e) + 1e-6f)
                    << (gelu ? "gelu" : "silu") << " row " << r << " [" << i << "]";
            }
            for (int64_t i = ff; i < ldo; ++i) EXPECT_TRUE(std::isnan(got[static_cast<size_t>(r * ldo + i)]));
        }
    }
}

// The BF16-output kernels that feed the prefill GEMMs directly: the FFN
// gating (glu_rows_bf16) against cpu::swiglu / geglu_tanh, and
// rms_norm_bf16 (residual added and stored back) against a double
// reference; each value within one BF16 rounding (2^-8 relative, doubled
// for the fp32 arithmetic), nothing written past n rows.
TEST(CudaPrefill, Bf16OutputNormAndGluMatchCpu) {
    REQUIRE_GPU();
    cuda::CudaContext ctx;
    std::mt19937 rng(606);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    const auto close = [](float g, double e) { return std::fabs(g - e) <= std::ldexp(std::fabs(e), -7) + 1e-30; };
    {
        const int64_t n = 5, ff = 200, ld = 2 * ff + 6;
        std::vector<float> gu(static_cast<size_t>(n * ld));
        for (auto& v : gu) v = nd(rng);
        for (bool gelu : {false, true}) {
            cuda::DeviceBuffer dgu(gu.size() * 4), dout(static_cast<size_t>((n + 1) * ff) * 2);
            dgu.upload(gu.data(), gu.size() * 4, ctx.stream());
            dout.fill_bytes(0xFF, ctx.stream());
            cuda::glu_rows_bf16(dgu.as<float>(), ld, n, ff, dout.as<uint16_t>(), gelu, ctx.stream());
            std::vector<uint16_t> got(static_cast<size_t>((n + 1) * ff));
            dout.download(got.data(), got.size() * 2, ctx.stream());
            std::vector<float> ref(static_cast<size_t>(ff));
            int bad = 0;
            for (int64_t r = 0; r < n; ++r) {
                const float* g = gu.data() + r * ld;
                if (gelu) cpu::geglu_tanh(g, g + ff, ref.data(), ff);
                else cpu::swiglu(g, g + ff, ref.data(), ff);
                for (int64_t i = 0; i < ff; ++i)
                    if (!close(bf16_to_float(got[static_cast<size_t>(r * ff + i)]), ref[static_cast<size_t>(i)]) &&
                        bad++ < 5)
                        ADD_FAILURE() << (gelu ? "gelu" : "silu") << " row " << r << " [" << i << "]";
            }
            for (int64_t i = n * ff; i < (n + 1) * ff; ++i)
                if (got[static_cast<size_t>(i)] != 0xFFFF && bad++ < 5) ADD_FAILURE() << "written past n rows";
            EXPECT_EQ(bad, 0);
        }
    }
    // Rows held in registers (16-byte pieces: 4096, 4160, 640; scalar: 4094,
    // 333, and 4096 with x and the residual one float off 16-byte alignment)
    // and longer ones (the looping kernel).
    for (const int64_t dim : {int64_t{4096}, int64_t{4096 + 64}, int64_t{4094}, int64_t{640}, int64_t{333}, int64_t{8192 + 96}})
    for (const int shift : {0, 1})
    for (bool residual : {false, true}) {
        if (shift && dim != 4096) continue;
        const int64_t n = 6;
        const float eps = 1e-5f;
        std::vector<float> x(static_cast<size_t>(n * dim)), res(x.size()), w(static_cast<size_t>(dim));
        for (auto& v : x) v = nd(rng);
        for (auto& v : res) v = nd(rng);
        for (auto& v : w) v = 1.0f + 0.3f * nd(rng);
        cuda::DeviceBuffer dx((x.size() + 4) * 4), dr((res.size() + 4) * 4), dw(w.size() * 4), dout(x.size() * 2 + 64);
        float* px = dx.as<float>() + shift;
        float* pr = dr.as<float>() + shift;
        const size_t off = static_cast<size_t>(shift) * 4;
        dx.upload(x.data(), x.size() * 4, ctx.stream(), off);
        dr.upload(res.data(), res.size() * 4, ctx.stream(), off);
        dw.upload(w.data(), w.size() * 4, ctx.stream());
        dout.fill_bytes(0xFF, ctx.stream());
        cuda::rms_norm_bf16(px, residual ? pr : nullptr, dw.as<float>(), dout.as<uint16_t>(), n, dim, eps, ctx.stream());
        std::vector<uint16_t> got(x.size() + 32);
        std::vector<float> xs(x.size());
        dout.download(got.data(), got.size() * 2, ctx.stream());
        dx.download(xs.data(), xs.size() * 4, ctx.stream(), off);
        int bad = 0;
        for (int64_t r = 0; r < n; ++r) {
            double ss = 0;
            for (int64_t i = 0; i < dim; ++i) {
                const size_t at = static_cast<size_t>(r * dim + i);
                const float v = residual ? x[at] + res[at] : x[at];
                if (xs[at] != v && bad++ < 5) ADD_FAILURE() << "x not updated at row " << r << " [" << i << "]";
                ss += static_cast<double>(v) * v;
            }
            const double scale = 1.0 / std::sqrt(ss / dim + eps);
            for (int64_t i = 0; i < dim; ++i) {
                const size_t at = static_cast<size_t>(r * dim + i);
                const double e = static_cast<double>(residual ? x[at] + res[at] : x[at]) * scale * w[static_cast<size_t>(i)];
                if (!close(bf16_to_float(got[at]), e) && bad++ < 5)
                    ADD_FAILURE() << "norm row " << r << " [" << i << "] " << bf16_to_float(got[at]) << " vs " << e;
            }
        }
        for (size_t i = x.size(); i < got.size(); ++i)
            if (got[i] != 0xFFFF && bad++ < 5) ADD_FAILURE() << "written past n rows";
        EXPECT_EQ(bad, 0) << (residual ? "with residual" : "no residual") << ", dim " << dim << ", shift " << shift;
    }
}

}  // namespace
