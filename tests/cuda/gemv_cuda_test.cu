// CUDA decode GEMV and activation quantizer vs the CPU scalar reference.
//
// Needs a GPU at run time: every test that touches the device skips cleanly
// (GTEST_SKIP) where CudaContext::device_count() is 0, so the binary builds
// and passes on CI machines without one.
//
// Reference: W dequantized with dequantize_row_ref. For the integer path x is
// quantized with quantize_row_ref(Q8_1) — the device quantizer is checked to
// give the same int8 values — and dequantized with the fp32 scale
// d = amax/127 the device keeps; products are summed in double. The kernel
// differs from the reference only in fp32 rounding and summation order, so
// the tolerance is 2e-5 · Σ|w_k x_k| per output (a single wrong element of
// typical size is several times larger for the K used here). Outputs are
// poisoned (NaN bits) first, with a guard zone past N that must stay intact.
// Which activation a type takes (gemv_takes_quantized_activation): the
// quantized one for Q4_0 .. Q6_K and NVFP4, float x for F32, F16, BF16 and
// the weight-only F8_E4M3_B32 (reference: x itself).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/weights.h"
#include "core/dtype.h"
#include "core/fp16.h"
#include "core/tensor.h"
#include "backend/cuda/minifloat.cuh"
#include "quant/blocks.h"
#include "quant/fp8.h"
#include "quant/reference.h"
#include "gemv_test_util.h"

using namespace quern;
using namespace quern::cuda;
using quern::gemv_test::dequantized_activation;
using quern::gemv_test::gaussian_weights;

namespace {

constexpr uint32_t kPoison = 0xFFFFFFFFu;  // a NaN
constexpr int64_t kGuard = 64;             // floats past N that must keep the poison

void put_f16(uint8_t* p, float v) {
    const uint16_t h = fp32_to_fp16(v);
    std::memcpy(p, &h, 2);
}

void put_f32(uint8_t* p, float v) { std::memcpy(p, &v, 4); }

// Random bits everywhere, then sensible fp16 scales (so every code, every
// 6-bit scale and every sign pattern occurs). FP8 / NVFP4: f32 scales in
// the same range; E4M3 weight codes random but never NaN (0x7F, 0xFF become
// ±448); NVFP4's E4M3 group scales random over 2^-3 .. 15 (positive, as
// ModelOpt writes them; every E2M1 code occurs).
std::vector<uint8_t> random_blocks(DType t, int64_t N, int64_t K, std::mt19937& rng) {
    const size_t rb = row_size(t, K);
    std::vector<uint8_t> w(rb * static_cast<size_t>(N));
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
    std::uniform_real_distribution<float> d(0.002f, 0.02f), m(-0.1f, 0.1f), g(-1.0f, 1.0f);
    const auto& info = dtype_info(t);
    const size_t n_blocks = w.size() / static_cast<size_t>(info.type_size);
    for (size_t i = 0; i < n_blocks; ++i) {
        uint8_t* b = w.data() + i * static_cast<size_t>(info.type_size);
        switch (t) {
            case DType::Q8_0: put_f16(b, d(rng)); break;
            case DType::Q4_1:
                put_f16(b, d(rng));
                put_f16(b + 2, m(rng));
                break;
            case DType::Q4_K:
                put_f16(b, d(rng) * 0.1f);
                put_f16(b + 2, d(rng) * 0.1f);
                break;
            case DType::Q6_K: put_f16(b + offsetof(block_q6_K, d), d(rng) * 0.1f); break;
            case DType::Q4_0:
            case DType::Q5_0: put_f16(b, d(rng)); break;
            case DType::Q5_1:
                put_f16(b, d(rng));
                put_f16(b + 2, m(rng));
                break;
            case DType::Q5_K:
                put_f16(b, d(rng) * 0.1f);
                put_f16(b + 2, d(rng) * 0.1f);
                break;
            case DType::Q2_K:
                put_f16(b + offsetof(block_q2_K, d), d(rng));
                put_f16(b + offsetof(block_q2_K, dmin), d(rng));
                break;
            case DType::Q3_K: put_f16(b + offsetof(block_q3_K, d), d(rng) * 0.1f); break;
            case DType::F8_E4M3_B32:
                put_f32(b + offsetof(block_f8_b32, d), d(rng));
                for (int j = 0; j < QK_F8; ++j) {
                    uint8_t& c = b[offsetof(block_f8_b32, qs) + j];
                    if ((c & 0x7F) == 0x7F) c ^= 1;  // NaN -> ±448
                }
                break;
            case DType::NVFP4: {
                std::uniform_int_distribution<int> sc(0x20, 0x57);  // E4M3 2^-3 .. 15
                put_f32(b + offsetof(block_nvfp4, d), d(rng));
                for (int g4 = 0; g4 < QK_NVFP4 / NVFP4_GROUP; ++g4)
                    b[offsetof(block_nvfp4, sc) + g4] = static_cast<uint8_t>(sc(rng));
                break;
            }
            case DType::F16: put_f16(b, g(rng)); break;
            case DType::BF16: {
                const uint16_t h = fp32_to_bf16(g(rng));
                std::memcpy(b, &h, 2);
                break;
            }
            case DType::F32: {
                const float v = g(rng);
                std::memcpy(b, &v, 4);
                break;
            }
            default: break;
        }
    }
    return w;
}

// Activations: Gaussian with a per-32 scale spread, exact zeros, one all-zero block.
// (An earlier version wrote past x for K % 32 != 0: AddressSanitizer on the H200 found it.)
std::vector<float> random_activation(int64_t K, std::mt19937& rng) {
    std::vector<float> x(static_cast<size_t>(K));
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::uniform_real_distribution<float> sc(0.05f, 4.0f);
    for (int64_t i = 0; i < K; i += 32) {  // K need not be a multiple of 32 (float weights)
        const float s = sc(rng);
        for (int64_t j = i; j < std::min(i + 32, K); ++j) x[static_cast<size_t>(j)] = s * g(rng);
    }
    x[0] = 0.0f;
    if (K >= 64)
        for (int j = 32; j < 64; ++j) x[static_cast<size_t>(j)] = 0.0f;
    return x;
}


template <class T>
DeviceBuffer to_device(const std::vector<T>& v, CudaContext& ctx) {
    DeviceBuffer b(v.size() * sizeof(T));
    b.upload(v.data(), v.size() * sizeof(T), ctx.stream());
    return b;
}

class CudaTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (CudaContext::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
        ctx_ = std::make_unique<CudaContext>(0);
    }
    std::unique_ptr<CudaContext> ctx_;
};

// Runs y = W x on the device (poisoned output with a guard zone); returns y.
// With levels = 2 (quantized x only) the activation is two-level and
// *xr receives what the kernels read: d1·q1 + d2·q2 per element, from the
// device's own quantization (checked against the host's in test_session_cuda).
std::vector<float> run_gemv(CudaContext& ctx, const DeviceWeight& W, const std::vector<float>& x, bool float_act,
                            int config, int levels = 1, std::vector<float>* xr = nullptr) {
    const int64_t N = W.N;
    DeviceBuffer xd = to_device(x, ctx);
    DeviceBuffer yd(static_cast<size_t>(N + kGuard) * sizeof(float));
    yd.fill_bytes(0xFF, ctx.stream());
    GemvOptions opt;
    opt.config = config;
    if (float_act) {
        gemv(ctx, W, xd.as<float>(), yd.as<float>(), opt);
    } else {
        QuantizedActivation xq(W.K, levels);
        quantize_activation(ctx, xd.as<float>(), xq);
        gemv(ctx, W, xq, yd.as<float>(), opt);
        ctx.synchronize();
        if (xr) {
            std::vector<uint8_t> a(xq.buffer().size());
            xq.buffer().download(a.data(), a.size(), ctx.stream());
            ctx.synchronize();
            const int64_t K = W.K;
            xr->assign(static_cast<size_t>(K), 0.0f);
            for (int l = 0; l < levels; ++l) {
                const uint8_t* lv = a.data() + static_cast<size_t>(l) * xq.level_bytes();
                std::vector<ActBlockInfo> info(static_cast<size_t>(K / 32));
                std::memcpy(info.data(), lv + K, info.size() * sizeof(ActBlockInfo));
                for (int64_t k = 0; k < K; ++k) {
                    const int8_t q = static_cast<int8_t>(lv[(k % 32 >= 16 ? K / 2 : 0) + 16 * (k / 32) + k % 16]);
                    (*xr)[static_cast<size_t>(k)] += info[static_cast<size_t>(k / 32)].d * static_cast<float>(q);
                }
            }
        }
    }
    ctx.synchronize();
    std::vector<float> y(static_cast<size_t>(N + kGuard));
    yd.download(y.data(), y.size() * sizeof(float), ctx.stream());
    for (int64_t i = N; i < N + kGuard; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &y[static_cast<size_t>(i)], 4);
        EXPECT_EQ(bits, kPoison) << "y[" << i << "] past N = " << N << " was written";
    }
    y.resize(static_cast<size_t>(N));
    return y;
}

struct Case {
    int64_t N, K;
};

// Compares every output with the reference; returns the number of failures.
int check_against_reference(DType t, const std::vector<uint8_t>& w, int64_t N, int64_t K, const std::vector<float>& xr,
                            const std::vector<float>& y) {
    const size_t rb = row_size(t, K);
    std::vector<float> wr(static_cast<size_t>(K));
    int bad = 0;
    for (int64_t r = 0; r < N; ++r) {
        dequantize_row_ref(t, w.data() + static_cast<size_t>(r) * rb, wr.data(), K);
        double ref = 0.0, mag = 0.0;
        for (int64_t k = 0; k < K; ++k) {
            const double p = static_cast<double>(wr[static_cast<size_t>(k)]) * xr[static_cast<size_t>(k)];
            ref += p;
            mag += std::fabs(p);
        }
        const double tol = 2e-5 * mag + 1e-30;
        const float got = y[static_cast<size_t>(r)];
        if (!(std::fabs(got - ref) <= tol)) {
            if (bad < 5)
                ADD_FAILURE() << "y[" << r << "] = " << got << ", reference " << ref << " (tol " << tol << ", sum|p| "
                              << mag << ")";
            ++bad;
        }
    }
    return bad;
}

void gemv_case(CudaContext& ctx, DType t, bool float_act, const Case& c, bool gaussian, int config, uint32_t seed,
               int levels = 1) {
    SCOPED_TRACE(::testing::Message() << dtype_name(t) << (float_act ? " float-x" : " q8-x") << " levels " << levels
                                      << " N=" << c.N
                                      << " K=" << c.K << (gaussian ? " gaussian" : " random-bits") << " config "
                                      << config << " (" << gemv_config_name(config) << ")");
    std::mt19937 rng(seed);
    const bool quantized = dtype_is_quantized(t);
    std::vector<uint8_t> w = (gaussian && quantized) ? gaussian_weights(t, c.N, c.K, rng) : random_blocks(t, c.N, c.K, rng);
    const std::vector<float> x = random_activation(c.K, rng);
    Tensor T = Tensor::contiguous(t, {c.K, c.N, 1, 1}, w.data(), "w");
    DeviceWeight W = upload_weight(ctx, T);
    ASSERT_EQ(W.bytes(), w.size());
    std::vector<float> x2;
    const std::vector<float> y = run_gemv(ctx, W, x, float_act, config, levels, levels == 2 ? &x2 : nullptr);
    const std::vector<float> xr = float_act ? x : levels == 2 ? x2 : dequantized_activation(x);
    EXPECT_EQ(check_against_reference(t, w, c.N, c.K, xr, y), 0);
}

// Types whose GEMVs read the quantized activation, and those reading float x.
const DType kQuantTypes[] = {DType::Q8_0, DType::Q4_1, DType::Q4_K, DType::Q6_K, DType::Q4_0,
                             DType::Q5_0, DType::Q5_1, DType::Q5_K, DType::Q2_K, DType::Q3_K, DType::NVFP4};
const DType kFloatTypes[] = {DType::F32, DType::F16, DType::BF16, DType::F8_E4M3_B32};

std::vector<Case> cases_for(DType t) {
    const int64_t bs = dtype_info(t).block_size > 1 ? dtype_info(t).block_size : 8;
    // N not a multiple of any rows-per-block; K from one block to more
    // units than one trip of the widest configuration covers (and not a
    // multiple of it: 33024 = 1032 units of 32, 516 of 64 (Q2_K, Q3_K),
    // 2064 of 16 (F8_E4M3_B32)). Every K is a multiple of 64 (NVFP4's block)
    // except the second for 32-element blocks (bs + 256: an odd block count).
    return {{1, 256},   {7, bs * 3 > 256 ? bs * 3 : 256 + bs}, {67, 4096 + 256}, {130, 14336}, {5, 2048 * 3 + 256},
            {3, 33024}};
}

}  // namespace

// ---------------------------------------------------------------- no GPU needed

TEST(CudaContextNoGpu, BadDeviceIndexThrows) {
    const int n = CudaContext::device_count();
    EXPECT_GE(n, 0);
    EXPECT_THROW(CudaContext ctx(n), std::runtime_error);  // quern::Error
    EXPECT_THROW(CudaContext ctx(-1), std::runtime_error);
}

TEST(CudaContextNoGpu, ActivationKindPerType) {
    for (DType t : kQuantTypes) EXPECT_TRUE(gemv_takes_quantized_activation(t)) << dtype_name(t);
    for (DType t : kFloatTypes) EXPECT_FALSE(gemv_takes_quantized_activation(t)) << dtype_name(t);
    EXPECT_FALSE(gemv_takes_quantized_activation(DType::Q8_K));  // no kernel
    for (DType t : kQuantTypes) EXPECT_TRUE(cuda_weight_type_supported(t)) << dtype_name(t);
    for (DType t : kFloatTypes) EXPECT_TRUE(cuda_weight_type_supported(t)) << dtype_name(t);
    for (DType t : {DType::F8_E4M3_B32, DType::NVFP4}) {
        EXPECT_GE(gemv_default_config(t, 4096, 4096, !gemv_takes_quantized_activation(t)), 0);
        EXPECT_LT(gemv_default_config(t, 4096, 4096, !gemv_takes_quantized_activation(t)), gemv_config_count());
    }
}

// The register-level minifloat decoders (minifloat.cuh; host build of the
// same functions, __byte_perm emulated) against quant/fp8.h, every code.
TEST(CudaContextNoGpu, MinifloatDecodersMatchReference) {
    // E2M1: every 16-bit half-word of four codes -> four int8 = 2·e2m1.
    for (uint32_t v = 0; v < 0x10000u; ++v) {
        const uint32_t r = mf::e2m1x4_to_s8x4(v | 0xABCD0000u);  // the upper half is ignored
        for (int j = 0; j < 4; ++j) {
            const uint8_t code = static_cast<uint8_t>((v >> (4 * j)) & 0xFu);
            const auto got = static_cast<int8_t>(static_cast<uint8_t>(r >> (8 * j)));
            ASSERT_EQ(static_cast<float>(got), 2.0f * fp4_e2m1_to_float(code)) << "half-word " << v << " element " << j;
        }
    }
    for (uint32_t c = 0; c < 16; ++c) EXPECT_EQ(mf::e2m1_to_float(c), fp4_e2m1_to_float(static_cast<uint8_t>(c))) << c;
    // E4M3: every pair position, every code (NaN codes give NaN).
    for (uint32_t c = 0; c < 256; ++c) {
        const float ref = fp8_e4m3_to_float(static_cast<uint8_t>(c));
        const float2 lo = mf::e4m3x2_to_float2(c | 0x3800u), hi = mf::e4m3x2_to_float2((c << 8) | 0x38u);
        const float one = mf::e4m3_to_float(c);
        for (float got : {lo.x, hi.y, one}) {
            if (std::isnan(ref)) EXPECT_TRUE(std::isnan(got)) << "code " << c;
            else EXPECT_EQ(got, ref) << "code " << c;
        }
        EXPECT_EQ(lo.y, 1.0f);  // 0x38 = 1.0
        EXPECT_EQ(hi.x, 1.0f);
    }
}

TEST(CudaContextNoGpu, ConfigTable) {
    ASSERT_GT(gemv_config_count(), 0);
    for (int i = 0; i < gemv_config_count(); ++i) EXPECT_STRNE(gemv_config_name(i), "?");
    EXPECT_STREQ(gemv_config_name(gemv_config_count()), "?");
}

// ---------------------------------------------------------------- activation quantizer

TEST_F(CudaTest, QuantizeQ8_1MatchesReference) {
    std::mt19937 rng(1234);
    for (int64_t K : {32, 256, 4096, 14336 + 32}) {
        SCOPED_TRACE(::testing::Message() << "K=" << K);
        std::vector<float> x = random_activation(K, rng);
        // rounding ties: values that land on .5 after scaling by 127/amax
        if (K >= 128)
            for (int j = 0; j < 32; ++j) x[static_cast<size_t>(64 + j)] = j == 0 ? 127.0f : static_cast<float>(j) + 0.5f;
        std::vector<uint8_t> ref(row_size(DType::Q8_1, K));
        quantize_row_ref(DType::Q8_1, x.data(), ref.data(), K);

        DeviceBuffer xd = to_device(x, *ctx_);
        QuantizedActivation xq(K);
        xq.buffer().fill_bytes(0xAB, ctx_->stream());
        quantize_activation(*ctx_, xd.as<float>(), xq);
        ctx_->synchronize();
        std::vector<int8_t> q(static_cast<size_t>(K));
        std::vector<ActBlockInfo> info(static_cast<size_t>(K / 32));
        xq.buffer().download(q.data(), q.size(), ctx_->stream());
        xq.buffer().download(info.data(), info.size() * sizeof(ActBlockInfo), ctx_->stream(), static_cast<size_t>(K));

        int bad = 0;
        for (int64_t b = 0; b < K / 32 && bad < 5; ++b) {
            block_q8_1 r;
            std::memcpy(&r, ref.data() + b * sizeof(block_q8_1), sizeof r);
            for (int j = 0; j < 32; ++j) {
                const int8_t got = q[static_cast<size_t>((j / 16) * (K / 2) + 16 * b + (j % 16))];
                if (got != r.qs[j] && bad++ < 5)
                    ADD_FAILURE() << "block " << b << " q[" << j << "] = " << int(got) << ", reference " << int(r.qs[j]);
            }
            const ActBlockInfo& in = info[static_cast<size_t>(b)];
            const float d = in.d, s = in.s;
            if (fp32_to_fp16(d) != r.d && bad++ < 5) ADD_FAILURE() << "block " << b << " d = " << d;
            if (fp32_to_fp16(s) != r.s && bad++ < 5) ADD_FAILURE() << "block " << b << " s = " << s;
            int lo = 0, hi = 0;
            for (int j = 0; j < 16; ++j) lo += r.qs[j], hi += r.qs[16 + j];
            if (s != static_cast<float>(lo + hi) * d && bad++ < 5) ADD_FAILURE() << "block " << b << " s != sum(q) * d";
            if ((in.sum_lo != lo || in.sum_hi != hi) && bad++ < 5)
                ADD_FAILURE() << "block " << b << " half sums " << in.sum_lo << ", " << in.sum_hi << ", reference " << lo
                              << ", " << hi;
        }
        EXPECT_EQ(bad, 0);
    }
}

// ---------------------------------------------------------------- GEMV vs reference, every configuration

TEST_F(CudaTest, QuantizedGemvAllConfigs) {
    uint32_t seed = 1;
    for (DType t : kQuantTypes)
        for (int config = 0; config < gemv_config_count(); ++config)
            for (const Case& c : cases_for(t)) gemv_case(*ctx_, t, false, c, false, config, seed++);
}

// Two-level activations (the decode default): every configuration against
// the activation the kernels read (level 2's scale is level 1's / 254, so
// Ops may add both levels' integer sums before scaling, as Q4_K's dot2 does);
// and that activation must be far closer to x than one level.
TEST_F(CudaTest, QuantizedGemvTwoLevelsAllConfigs) {
    uint32_t seed = 500;
    for (DType t : kQuantTypes)
        for (int config = 0; config < gemv_config_count(); ++config)
            for (const Case& c : cases_for(t)) gemv_case(*ctx_, t, false, c, false, config, seed++, 2);
    std::mt19937 rng(9);
    const int64_t K = 4096;
    const std::vector<float> x = random_activation(K, rng);
    std::vector<uint8_t> w = random_blocks(DType::Q8_0, 1, K, rng);
    DeviceWeight W = upload_weight(*ctx_, Tensor::contiguous(DType::Q8_0, {K, 1, 1, 1}, w.data(), "w"));
    std::vector<float> x2;
    run_gemv(*ctx_, W, x, false, -1, 2, &x2);
    const std::vector<float> x1 = dequantized_activation(x);
    for (int64_t b = 0; b < K / 32; ++b) {
        float amax = 0, e1 = 0, e2 = 0;
        for (int64_t k = 32 * b; k < 32 * b + 32; ++k) {
            const size_t i = static_cast<size_t>(k);
            amax = std::max(amax, std::fabs(x[i]));
            e1 = std::max(e1, std::fabs(x1[i] - x[i]));
            e2 = std::max(e2, std::fabs(x2[i] - x[i]));
        }
        EXPECT_LE(e1, amax / 254.0f * 1.0001f) << "block " << b;
        EXPECT_LE(e2, amax / (254.0f * 254.0f) * 1.01f) << "block " << b;  // d2/2 = amax/(127·254·2)
    }
}

TEST_F(CudaTest, QuantizedGemvGaussianWeights) {
    uint32_t seed = 100;
    for (DType t : kQuantTypes)
        for (const Case& c : {Case{67, 4096 + 256}, Case{33, 14336}}) gemv_case(*ctx_, t, false, c, true, -1, seed++);
}

// Float-x block types (F8_E4M3_B32) with weights from the reference
// quantizer, as FP8 checkpoints hold them (the float types need no such case).
TEST_F(CudaTest, FloatActivationGemvGaussianWeights) {
    uint32_t seed = 150;
    for (DType t : kFloatTypes) {
        if (!dtype_is_quantized(t)) continue;
        for (const Case& c : {Case{67, 4096 + 256}, Case{33, 14336}}) gemv_case(*ctx_, t, true, c, true, -1, seed++);
    }
}

// gemv_residual_norm + a GEMV with the DeferredNormScale against the unfused
// sequence (gemv, rms_norm_q8_1 with the residual, gemv) on the same device:
// the residual stream must agree to float rounding, the partial sums must be
// Σx² of the new x, and the consumer's output must agree up to the few
// activation codes the two roundings may put on different sides of .5
// (without the scale it would be off by the whole RMSNorm factor).
TEST_F(CudaTest, ResidualNormFoldedIntoGemvs) {
    uint32_t seed = 300;
    for (DType t : kQuantTypes)
        for (int levels : {1, 2})
            for (const Case& c : {Case{768, 1536}, Case{4096, 14336}}) {  // N: the next GEMV's K (K-quants: % 256)
                SCOPED_TRACE(::testing::Message() << dtype_name(t) << " levels " << levels << " N=" << c.N << " K=" << c.K);
                std::mt19937 rng(seed++);
                const int64_t N = c.N, K = c.K, N2 = 200;
                const float eps = 1e-5f;
                std::vector<uint8_t> w1 = gaussian_weights(t, N, K, rng), w2 = gaussian_weights(t, N2, N, rng);
                DeviceWeight W1 = upload_weight(*ctx_, Tensor::contiguous(t, {K, N, 1, 1}, w1.data(), "w1"));
                DeviceWeight W2 = upload_weight(*ctx_, Tensor::contiguous(t, {N, N2, 1, 1}, w2.data(), "w2"));
                const std::vector<float> a = random_activation(K, rng);
                std::vector<float> x = random_activation(N, rng), nw(static_cast<size_t>(N));
                std::uniform_real_distribution<float> u(0.5f, 1.5f);
                for (auto& v : nw) v = u(rng);
                DeviceBuffer ad = to_device(a, *ctx_), nwd = to_device(nw, *ctx_);
                DeviceBuffer xf = to_device(x, *ctx_), xu = to_device(x, *ctx_);
                QuantizedActivation aq(K, levels), nf(N, levels), nu(N, levels);
                quantize_activation(*ctx_, ad.as<float>(), aq);
                DeviceBuffer parts(static_cast<size_t>(N / 32 + kGuard) * 4), h(static_cast<size_t>(N) * 4),
                    xn(static_cast<size_t>(N) * 4), yf(static_cast<size_t>(N2) * 4), yu(static_cast<size_t>(N2) * 4);
                parts.fill_bytes(0xFF, ctx_->stream());
                yf.fill_bytes(0xFF, ctx_->stream());
                // fused
                gemv_residual_norm(*ctx_, W1, aq, xf.as<float>(), nwd.as<float>(), nf, parts.as<float>());
                gemv(*ctx_, W2, nf, yf.as<float>(),
                     DeferredNormScale{parts.as<float>(), static_cast<int>(N / 32), N, eps});
                // unfused
                gemv(*ctx_, W1, aq, h.as<float>());
                rms_norm_q8_1(xu.as<float>(), h.as<float>(), nwd.as<float>(), xn.as<float>(), nu.q(), nu.info(), 1, N,
                              eps, ctx_->stream(), nu.q2(), nu.info2());
                gemv(*ctx_, W2, nu, yu.as<float>());
                ctx_->synchronize();
                std::vector<float> hxf(static_cast<size_t>(N)), hxu(hxf.size()), hp(static_cast<size_t>(N / 32 + kGuard)),
                    hyf(static_cast<size_t>(N2)), hyu(hyf.size()), hh(hxf.size()), hxn(hxf.size());
                xf.download(hxf.data(), hxf.size() * 4, ctx_->stream());
                xu.download(hxu.data(), hxu.size() * 4, ctx_->stream());
                h.download(hh.data(), hh.size() * 4, ctx_->stream());
                xn.download(hxn.data(), hxn.size() * 4, ctx_->stream());
                parts.download(hp.data(), hp.size() * 4, ctx_->stream());
                yf.download(hyf.data(), hyf.size() * 4, ctx_->stream());
                yu.download(hyu.data(), hyu.size() * 4, ctx_->stream());
                int bad = 0;
                // x: the two paths' dot products differ in summation order only
                // (tolerance as check_against_reference: 2e-5 of Σ|w·a|).
                const size_t rb1 = row_size(t, K);
                std::vector<float> w1r(static_cast<size_t>(K));
                for (int64_t i = 0; i < N; ++i) {
                    dequantize_row_ref(t, w1.data() + static_cast<size_t>(i) * rb1, w1r.data(), K);
                    double mag = 0;
                    for (int64_t k = 0; k < K; ++k) mag += std::fabs(static_cast<double>(w1r[static_cast<size_t>(k)]) * a[static_cast<size_t>(k)]);
                    const double tol = 2e-5 * mag + 1e-6 * std::fabs(x[static_cast<size_t>(i)]) + 1e-30;
                    if (!(std::fabs(hxf[static_cast<size_t>(i)] - hxu[static_cast<size_t>(i)]) <= tol) && bad++ < 5)
                        ADD_FAILURE() << "x[" << i << "] fused " << hxf[static_cast<size_t>(i)] << " unfused " << hxu[static_cast<size_t>(i)];
                }
                for (int64_t b = 0; b < N / 32; ++b) {
                    double ss = 0;
                    for (int j = 0; j < 32; ++j) ss += static_cast<double>(hxf[static_cast<size_t>(32 * b + j)]) * hxf[static_cast<size_t>(32 * b + j)];
                    if (!(std::fabs(hp[static_cast<size_t>(b)] - ss) <= 1e-5 * ss + 1e-12) && bad++ < 5)
                        ADD_FAILURE() << "ss_parts[" << b << "] = " << hp[static_cast<size_t>(b)] << ", want " << ss;
                }
                for (int64_t i = N / 32; i < N / 32 + kGuard; ++i) {
                    uint32_t bits;
                    std::memcpy(&bits, &hp[static_cast<size_t>(i)], 4);
                    EXPECT_EQ(bits, kPoison) << "ss_parts[" << i << "] past N/32 was written";
                }
                // Consumer: both against the float product W2 · xn (xn from the unfused norm).
                const size_t rb = row_size(t, N);
                std::vector<float> wr(static_cast<size_t>(N));
                double e_f = 0, e_u = 0, mag_all = 0;
                for (int64_t r = 0; r < N2; ++r) {
                    dequantize_row_ref(t, w2.data() + static_cast<size_t>(r) * rb, wr.data(), N);
                    double ref = 0, mag = 0;
                    for (int64_t k = 0; k < N; ++k) {
                        const double p = static_cast<double>(wr[static_cast<size_t>(k)]) * hxn[static_cast<size_t>(k)];
                        ref += p;
                        mag += std::fabs(p);
                    }
                    e_f = std::max(e_f, std::fabs(hyf[static_cast<size_t>(r)] - ref) / mag);
                    e_u = std::max(e_u, std::fabs(hyu[static_cast<size_t>(r)] - ref) / mag);
                    mag_all += mag;
                }
                // Worst error relative to Σ|w·x|: the activation's quantization error
                // (~1/254 of a block's maximum per element with one level) for both.
                EXPECT_LE(e_f, levels == 1 ? 4e-3 : 1e-4) << "unfused " << e_u;
                EXPECT_LE(e_f, 2.0 * e_u + 2e-6) << "the fused path is less accurate than the unfused one";
                EXPECT_GT(mag_all, 0.0);
                EXPECT_EQ(bad, 0);
            }
    // Refused: float weights, N not a multiple of 32.
    std::vector<float> fw(32 * 64, 0.5f);
    DeviceWeight F = upload_weight(*ctx_, Tensor::contiguous(DType::F32, {32, 64, 1, 1}, fw.data(), "f"));
    std::mt19937 rng(7);
    std::vector<uint8_t> q40 = gaussian_weights(DType::Q8_0, 40, 32, rng);
    DeviceWeight Q = upload_weight(*ctx_, Tensor::contiguous(DType::Q8_0, {32, 40, 1, 1}, q40.data(), "q"));
    QuantizedActivation a32(32), n64(64);
    DeviceBuffer xb(64 * 4), pb(64 * 4);
    EXPECT_THROW(gemv_residual_norm(*ctx_, F, a32, xb.as<float>(), xb.as<float>(), n64, pb.as<float>()),
                 std::runtime_error);
    EXPECT_THROW(gemv_residual_norm(*ctx_, Q, a32, xb.as<float>(), xb.as<float>(), n64, pb.as<float>()),
                 std::runtime_error);
}

// gemv_pair: Q4_K Q|K with Q6_K V (or a second Q4_K matrix) in one launch, bit for bit what two gemv
// launches with R4 T64 U2 compute (the fused pair's row arithmetic), with and
// without the deferred RMSNorm scale; other pairs fall back to two launches
// with the default configurations. Outputs poisoned past N.
TEST_F(CudaTest, GemvPairMatchesSeparateLaunches) {
    const int kR4T64U2 = 4;
    ASSERT_STREQ(gemv_config_name(kR4T64U2), "R4 T64 U2");
    uint32_t seed = 900;
    struct Pair {
        DType t1, t2;
        bool fused;
    };
    for (const Pair pr : {Pair{DType::Q4_K, DType::Q6_K, true}, Pair{DType::Q4_K, DType::Q4_K, true},
                          Pair{DType::Q6_K, DType::Q4_K, false}, Pair{DType::Q8_0, DType::Q6_K, false}})
        for (int levels : {1, 2})
            for (const Case& c : {Case{5120, 4096}, Case{640, 512}})
                for (bool scaled : {false, true}) {
                    const int64_t N1 = c.N, N2 = c.N / 5, K = c.K;
                    SCOPED_TRACE(::testing::Message() << dtype_name(pr.t1) << "+" << dtype_name(pr.t2) << " levels "
                                                      << levels << " N1=" << N1 << " N2=" << N2 << " K=" << K
                                                      << (scaled ? " scaled" : ""));
                    std::mt19937 rng(seed++);
                    std::vector<uint8_t> w1 = random_blocks(pr.t1, N1, K, rng), w2 = random_blocks(pr.t2, N2, K, rng);
                    DeviceWeight W1 = upload_weight(*ctx_, Tensor::contiguous(pr.t1, {K, N1, 1, 1}, w1.data(), "w1"));
                    DeviceWeight W2 = upload_weight(*ctx_, Tensor::contiguous(pr.t2, {K, N2, 1, 1}, w2.data(), "w2"));
                    const std::vector<float> x = random_activation(K, rng);
                    std::vector<float> sq(static_cast<size_t>(K / 32));
                    std::uniform_real_distribution<float> u(0.5f, 40.0f);
                    for (auto& v : sq) v = u(rng);
                    DeviceBuffer xd = to_device(x, *ctx_), pd = to_device(sq, *ctx_);
                    QuantizedActivation xq(K, levels);
                    quantize_activation(*ctx_, xd.as<float>(), xq);
                    const DeferredNormScale dn{pd.as<float>(), static_cast<int>(K / 32), K, 1e-5f};
                    DeviceBuffer y1(static_cast<size_t>(N1 + kGuard) * 4), y2(static_cast<size_t>(N2 + kGuard) * 4),
                        r1(static_cast<size_t>(N1) * 4), r2(static_cast<size_t>(N2) * 4);
                    y1.fill_bytes(0xFF, ctx_->stream());
                    y2.fill_bytes(0xFF, ctx_->stream());
                    gemv_pair(*ctx_, W1, y1.as<float>(), W2, y2.as<float>(), xq, scaled ? &dn : nullptr);
                    for (auto [W, y] : {std::pair{&W1, &r1}, std::pair{&W2, &r2}}) {
                        GemvOptions opt;
                        if (pr.fused) opt.config = kR4T64U2;
                        if (scaled) gemv(*ctx_, *W, xq, y->as<float>(), dn, opt);
                        else gemv(*ctx_, *W, xq, y->as<float>(), opt);
                    }
                    ctx_->synchronize();
                    for (auto [yb, rb, n] : {std::tuple{&y1, &r1, N1}, std::tuple{&y2, &r2, N2}}) {
                        std::vector<float> got(static_cast<size_t>(n + kGuard)), want(static_cast<size_t>(n));
                        yb->download(got.data(), got.size() * 4, ctx_->stream());
                        rb->download(want.data(), want.size() * 4, ctx_->stream());
                        int bad = 0;
                        for (int64_t i = 0; i < n; ++i)
                            if (std::memcmp(&got[static_cast<size_t>(i)], &want[static_cast<size_t>(i)], 4) != 0 &&
                                bad++ < 5)
                                ADD_FAILURE() << "y[" << i << "] = " << got[static_cast<size_t>(i)] << ", separate launch "
                                              << want[static_cast<size_t>(i)];
                        EXPECT_EQ(bad, 0);
                        for (int64_t i = n; i < n + kGuard; ++i) {
                            uint32_t bits;
                            std::memcpy(&bits, &got[static_cast<size_t>(i)], 4);
                            EXPECT_EQ(bits, kPoison) << "y[" << i << "] past N = " << n << " was written";
                        }
                    }
                }
    // Errors as gemv's: a float-activation weight, K mismatch.
    std::vector<float> fw(32 * 64, 0.5f);
    DeviceWeight F = upload_weight(*ctx_, Tensor::contiguous(DType::F32, {32, 64, 1, 1}, fw.data(), "f"));
    std::mt19937 rng(11);
    std::vector<uint8_t> q = random_blocks(DType::Q4_K, 8, 256, rng);
    DeviceWeight Q = upload_weight(*ctx_, Tensor::contiguous(DType::Q4_K, {256, 8, 1, 1}, q.data(), "q"));
    QuantizedActivation a32(32), a256(256);
    DeviceBuffer yb(64 * 4);
    EXPECT_THROW(gemv_pair(*ctx_, Q, yb.as<float>(), F, yb.as<float>(), a256), std::runtime_error);
    EXPECT_THROW(gemv_pair(*ctx_, Q, yb.as<float>(), Q, yb.as<float>(), a32), std::runtime_error);
}

TEST_F(CudaTest, FloatGemvAllConfigs) {
    uint32_t seed = 200;
    for (DType t : kFloatTypes)
        for (int config = 0; config < gemv_config_count(); ++config)
            for (const Case& c : cases_for(t)) gemv_case(*ctx_, t, true, c, false, config, seed++);
}

// One-hot x = e_k for every k of two super-blocks: y must be column k of W
// (times the quantized 1.0). Pinpoints a layout error to (row, element).
TEST_F(CudaTest, LayoutProbeOneHot) {
    std::mt19937 rng(77);
    const int64_t N = 40, K = 512;
    for (DType t : {DType::Q8_0, DType::Q4_1, DType::Q4_K, DType::Q6_K, DType::Q4_0, DType::Q5_0, DType::Q5_1,
                    DType::Q5_K, DType::Q2_K, DType::Q3_K, DType::F16, DType::BF16, DType::F32, DType::F8_E4M3_B32,
                    DType::NVFP4}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(t));
        const bool float_act = !gemv_takes_quantized_activation(t);
        std::vector<uint8_t> w = random_blocks(t, N, K, rng);
        DeviceWeight W = upload_weight(*ctx_, Tensor::contiguous(t, {K, N, 1, 1}, w.data(), "probe"));
        std::vector<float> wd(static_cast<size_t>(N * K));
        for (int64_t r = 0; r < N; ++r) dequantize_row_ref(t, w.data() + r * row_size(t, K), wd.data() + r * K, K);
        // Q4_1 / Q4_K (Q5_1, Q5_K, Q2_K) outputs are a difference of two terms (scale and min),
        // so the error scales with the weights' range, not with the result.
        double wmax = 0.0;
        for (float v : wd) wmax = std::max(wmax, static_cast<double>(std::fabs(v)));
        int bad = 0;
        for (int64_t k = 0; k < K && bad < 5; ++k) {
            std::vector<float> x(static_cast<size_t>(K), 0.0f);
            x[static_cast<size_t>(k)] = 1.0f;
            const float one = float_act ? 1.0f : 127.0f * (1.0f / 127);
            const std::vector<float> y = run_gemv(*ctx_, W, x, float_act, -1);
            for (int64_t r = 0; r < N; ++r) {
                const double ref = static_cast<double>(wd[static_cast<size_t>(r * K + k)]) * one;
                if (!(std::fabs(y[static_cast<size_t>(r)] - ref) <= 1e-6 * std::fabs(ref) + 2e-6 * wmax) && bad++ < 5)
                    ADD_FAILURE() << "row " << r << " element " << k << ": got " << y[static_cast<size_t>(r)]
                                  << ", W = " << ref;
            }
        }
        EXPECT_EQ(bad, 0);
    }
}

// ---------------------------------------------------------------- upload of views

TEST_F(CudaTest, UploadStridedRowsAnd3D) {
    std::mt19937 rng(5);
    for (DType t : {DType::Q8_0, DType::Q6_K, DType::F16, DType::Q5_0, DType::Q3_K, DType::F8_E4M3_B32, DType::NVFP4}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(t));
        const int64_t K = 512, N1 = 6, N2 = 3, N = N1 * N2;
        const size_t rb = row_size(t, K), pad = 38;
        std::vector<uint8_t> w = random_blocks(t, N, K, rng);
        std::vector<uint8_t> strided((rb + pad) * static_cast<size_t>(N), 0xA5);
        for (int64_t r = 0; r < N; ++r) std::memcpy(strided.data() + r * (rb + pad), w.data() + r * rb, rb);
        Tensor T = Tensor::contiguous(t, {K, N1, N2, 1}, strided.data(), "strided");
        T.nb[1] = rb + pad;
        T.nb[2] = T.nb[1] * static_cast<size_t>(N1);
        T.nb[3] = T.nb[2] * static_cast<size_t>(N2);
        DeviceWeight W = upload_weight(*ctx_, T);
        ASSERT_EQ(W.N, N);
        const bool float_act = !gemv_takes_quantized_activation(t);
        const std::vector<float> x = random_activation(K, rng);
        const std::vector<float> y = run_gemv(*ctx_, W, x, float_act, -1);
        EXPECT_EQ(check_against_reference(t, w, N, K, float_act ? x : dequantized_activation(x), y), 0);
    }
}

// ---------------------------------------------------------------- errors

TEST_F(CudaTest, BadArgumentsThrow) {
    std::mt19937 rng(9);
    std::vector<uint8_t> w5 = random_blocks(DType::Q4_1, 4, 256, rng);
    // unsupported type
    std::vector<uint8_t> q8k(row_size(DType::Q8_K, 256) * 4, 0);
    EXPECT_THROW(upload_weight(*ctx_, Tensor::contiguous(DType::Q8_K, {256, 4, 1, 1}, q8k.data(), "q8k")),
                 std::runtime_error);
    // F16 row not a multiple of 8 elements
    std::vector<uint8_t> h(2 * 12 * 2, 0);
    EXPECT_THROW(upload_weight(*ctx_, Tensor::contiguous(DType::F16, {12, 2, 1, 1}, h.data(), "f16")),
                 std::runtime_error);
    DeviceWeight W = upload_weight(*ctx_, Tensor::contiguous(DType::Q4_1, {256, 4, 1, 1}, w5.data(), "q4_1"));
    QuantizedActivation wrong_k(512);
    DeviceBuffer y(64 * sizeof(float));
    EXPECT_THROW(gemv(*ctx_, W, wrong_k, y.as<float>()), std::runtime_error);
    QuantizedActivation xq(256);
    GemvOptions bad;
    bad.config = gemv_config_count();
    EXPECT_THROW(gemv(*ctx_, W, xq, y.as<float>(), bad), std::runtime_error);
    EXPECT_THROW(QuantizedActivation(33), std::runtime_error);
    // quantized weights take no float x; float weights take no quantized x
    DeviceBuffer x(256 * sizeof(float));
    EXPECT_THROW(gemv(*ctx_, W, x.as<float>(), y.as<float>()), std::runtime_error);
    std::vector<uint8_t> f16 = random_blocks(DType::F16, 2, 256, rng);
    DeviceWeight WF = upload_weight(*ctx_, Tensor::contiguous(DType::F16, {256, 2, 1, 1}, f16.data(), "f16"));
    EXPECT_THROW(gemv(*ctx_, WF, xq, y.as<float>()), std::runtime_error);
    // F8_E4M3_B32 takes float x only, NVFP4 the quantized x only; NVFP4 rows
    // are whole 64-element blocks.
    std::vector<uint8_t> f8 = random_blocks(DType::F8_E4M3_B32, 2, 256, rng);
    DeviceWeight W8 = upload_weight(*ctx_, Tensor::contiguous(DType::F8_E4M3_B32, {256, 2, 1, 1}, f8.data(), "f8"));
    EXPECT_THROW(gemv(*ctx_, W8, xq, y.as<float>()), std::runtime_error);
    std::vector<uint8_t> f4 = random_blocks(DType::NVFP4, 2, 256, rng);
    DeviceWeight W4 = upload_weight(*ctx_, Tensor::contiguous(DType::NVFP4, {256, 2, 1, 1}, f4.data(), "nvfp4"));
    EXPECT_THROW(gemv(*ctx_, W4, x.as<float>(), y.as<float>()), std::runtime_error);
    QuantizedActivation a256(256), n64(64);
    EXPECT_THROW(gemv_residual_norm(*ctx_, W8, a256, y.as<float>(), y.as<float>(), n64, y.as<float>()),
                 std::runtime_error);
    Tensor odd = Tensor::contiguous(DType::NVFP4, {64, 2, 1, 1}, f4.data(), "nvfp4-odd");
    odd.ne[0] = 96;  // not a whole number of blocks (row_size would refuse it; upload must too)
    EXPECT_THROW(upload_weight(*ctx_, odd), std::runtime_error);
    ctx_->synchronize();
}
