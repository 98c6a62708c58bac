// CUDA row ops (src/backend/cuda/ops.h) vs the CPU: sampling against the
// CPU Sampler, embedding rows (get_row, get_row_norm) and argmax.
//
// Needs a GPU at run time: every test skips cleanly (GTEST_SKIP) where
// CudaContext::device_count() is 0. Outputs are poisoned as in
// ops_cuda_test.cu. Tolerances:
//   get_row    bit-exact against dequantize_row_ref.
//   argmax     exact index; argmax_advance also the control block, the
//              token array and the mapped host slot exactly.
//   get_row_norm  x bit-exact as get_row; both quantized levels byte for byte
//              as quantize_activation of x·w; partial sums within 1e-5.
//   sample     the CPU Sampler's token for the same logits, history and draw.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/context.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/ops.h"
#include "core/dtype.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "quant/blocks.h"
#include "quant/reference.h"
#include "runtime/sampler.h"
#include "ops_test_util.h"

using namespace quern;
using namespace quern::cuda;
using namespace quern::cuda::test;

namespace {

// ------------------------------------------------------------------ sampling

// sample_token against the CPU Sampler with the same parameters, history and
// draw: the same token, for many seeds, with ties at the top-k threshold
// (logits on a coarse grid), penalties, and every cut of the chain.
TEST_F(OpsCuda, SampleTokenMatchesSampler) {
    struct SCase {
        int n_vocab;
        SamplingParams sp;
        bool coarse;  // logits on a 0.25 grid: many equal values
    };
    std::vector<SCase> cases;
    auto sp = [](float t, int k, float p, float minp, float rp, float pres, float freq, int last) {
        SamplingParams s;
        s.temperature = t, s.top_k = k, s.top_p = p, s.min_p = minp, s.repeat_penalty = rp;
        s.presence_penalty = pres, s.frequency_penalty = freq, s.repeat_last_n = last;
        return s;
    };
    cases.push_back({50000, sp(0.8f, 40, 0.95f, 0.05f, 1.0f, 0, 0, 64), false});   // the CLI defaults
    cases.push_back({50000, sp(1.5f, 1024, 1.0f, 0.0f, 1.0f, 0, 0, 64), false});   // wide: k only
    cases.push_back({4096, sp(0.7f, 300, 0.9f, 0.0f, 1.0f, 0, 0, 64), true});      // ties at the threshold
    cases.push_back({4096, sp(1.0f, 50, 1.0f, 0.1f, 1.3f, 0.5f, 0.2f, 64), false}); // penalties
    cases.push_back({4096, sp(0.0f, 40, 1.0f, 0.0f, 1.2f, 0.3f, 0.1f, 32), true});  // greedy after penalties
    cases.push_back({128256, sp(0.6f, 1, 1.0f, 0.0f, 1.0f, 0, 0, 64), false});    // k = 1
    cases.push_back({1000, sp(2.0f, 1000, 0.5f, 0.0f, 1.1f, 0, 0, 0), true});      // k = n_vocab, window 0
    std::mt19937 rng(99);
    int checked = 0;
    for (const auto& c : cases) {
        for (int trial = 0; trial < 40; ++trial) {
            std::normal_distribution<float> nd(0.0f, 3.0f);
            std::vector<float> logits(static_cast<size_t>(c.n_vocab));
            for (auto& l : logits) l = c.coarse ? std::round(nd(rng) * 4.0f) / 4.0f : nd(rng);
            // History: 100 tokens, many repeats, some among the likely ones.
            std::vector<int32_t> hist(100);
            std::uniform_int_distribution<int> pick(0, c.n_vocab - 1), few(0, 9);
            for (auto& t : hist) t = few(rng) < 5 ? static_cast<int32_t>(few(rng)) : static_cast<int32_t>(pick(rng));
            SamplingParams p = c.sp;
            p.seed = 1000u + static_cast<uint64_t>(trial);
            Sampler cpu(p, c.n_vocab), draws(p, c.n_vocab);
            for (int32_t t : hist) cpu.accept(t);
            const int32_t want = cpu.sample(logits.data());
            DeviceSampling ds{p.temperature, p.top_k,          p.top_p,
                              p.min_p,       p.repeat_penalty, p.presence_penalty,
                              p.frequency_penalty, p.repeat_last_n, p.temperature > 0 ? draws.draw() : 0.0};
            ASSERT_TRUE(device_sampling_supported(p.top_k, p.repeat_last_n, true));
            auto dl = up(logits), dt = up(hist), dp = up(std::vector<int32_t>{static_cast<int32_t>(hist.size()) - 1});
            DeviceBuffer dsp(sizeof(DeviceSampling));
            dsp.upload(&ds, sizeof ds, st());
            auto dout = poisoned<int32_t>(1);
            sample_token(dl.as<float>(), c.n_vocab, dt.as<int32_t>(), dp.as<int32_t>(), static_cast<int>(hist.size()),
                         dsp.as<DeviceSampling>(), dout.as<int32_t>(), st());
            const int32_t got = down<int32_t>(dout, 1)[0];
            ASSERT_EQ(got, want) << "case vocab " << c.n_vocab << " T " << p.temperature << " k " << p.top_k << " p "
                                 << p.top_p << " min_p " << p.min_p << " trial " << trial;
            ++checked;
        }
    }
    EXPECT_EQ(checked, 7 * 40);
    EXPECT_FALSE(device_sampling_supported(0, 64, false));     // top-k off: host
    EXPECT_FALSE(device_sampling_supported(40, -1, true));     // whole-history penalties: host
    EXPECT_TRUE(device_sampling_supported(40, -1, false));
}

// ------------------------------------------------------------------ embedding rows

void put_f16(uint8_t* p, float v) {
    const uint16_t h = fp32_to_fp16(v);
    std::memcpy(p, &h, 2);
}

std::vector<uint8_t> random_table(DType t, int64_t rows, int64_t dim, std::mt19937& rng) {
    std::vector<uint8_t> w(row_size(t, dim) * static_cast<size_t>(rows));
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
    std::uniform_real_distribution<float> d(0.002f, 0.02f), g(-1.0f, 1.0f);
    const auto& info = dtype_info(t);
    const size_t nb = w.size() / static_cast<size_t>(info.type_size);
    for (size_t i = 0; i < nb; ++i) {
        uint8_t* b = w.data() + i * static_cast<size_t>(info.type_size);
        switch (t) {
            case DType::Q8_0: put_f16(b, d(rng)); break;
            case DType::Q4_K:
                put_f16(b, d(rng) * 0.1f);
                put_f16(b + 2, d(rng) * 0.1f);
                break;
            case DType::Q6_K: put_f16(b + offsetof(block_q6_K, d), d(rng) * 0.1f); break;
            // FP8 / NVFP4: a sane f32 d; every code random, E4M3 NaN codes
            // (in weights and NVFP4 group scales) included: NaN on both sides.
            case DType::F8_E4M3_B32:
            case DType::NVFP4: {
                const float v = d(rng);
                std::memcpy(b, &v, 4);  // d at offset 0 in both blocks
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

TEST_F(OpsCuda, GetRow) {
    for (DType t : {DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::F16, DType::BF16, DType::F32, DType::F8_E4M3_B32,
                    DType::NVFP4}) {
        for (int64_t dim : {256, 4096}) {
            const int64_t rows = 50;
            auto table = random_table(t, rows, dim, rng_);
            auto dt = up(table);
            for (int id : {0, 17, 49, 1000, -3}) {
                const std::string what = std::string(dtype_info(t).name) + " dim " + std::to_string(dim) + " id " +
                                         std::to_string(id);
                auto did = up(std::vector<int32_t>{id});
                auto dout = poisoned<float>(dim);
                get_row(t, dt.data(), rows, dim, did.as<int32_t>(), dout.as<float>(), st());
                const int eff = id < 0 ? 0 : (id >= rows ? static_cast<int>(rows - 1) : id);
                std::vector<float> ref(static_cast<size_t>(dim));
                dequantize_row_ref(t, table.data() + row_size(t, dim) * static_cast<size_t>(eff), ref.data(), dim);
                auto got = down<float>(dout, dim);
                for (int64_t i = 0; i < dim; ++i) {
                    const float a = got[static_cast<size_t>(i)], b = ref[static_cast<size_t>(i)];
                    ASSERT_TRUE(a == b || (std::isnan(a) && std::isnan(b))) << what << " element " << i << " " << a
                                                                            << " vs " << b;
                }
                expect_guard(dout, dim);
            }
        }
    }
}

// get_row_norm: x as get_row (bit-exact), the partial sums of x² per 32
// elements, and both levels of x ⊙ w byte for byte as quantize_activation
// makes them from the same floats (x·w rounded to float on the host).
TEST_F(OpsCuda, GetRowNorm) {
    for (DType t : {DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::F16, DType::BF16, DType::F32}) {
        for (int64_t dim : {256, 4096}) {
            const int64_t rows = 20;
            auto table = random_table(t, rows, dim, rng_);
            auto dt = up(table);
            auto w = randv(dim, rng_, 0.5f, 1.5f);
            auto dw = up(w);
            for (int id : {3, 19, 25}) {
                const std::string what = std::string(dtype_info(t).name) + " dim " + std::to_string(dim) + " id " +
                                         std::to_string(id);
                auto did = up(std::vector<int32_t>{id});
                auto dx = poisoned<float>(dim);
                auto dss = poisoned<float>(dim / 32);
                QuantizedActivation a(dim, 2), b(dim, 2);
                a.buffer().fill_bytes(0xFF, st());
                get_row_norm(t, dt.data(), rows, dim, did.as<int32_t>(), dx.as<float>(), dw.as<float>(), a.q(),
                             a.info(), a.q2(), a.info2(), dss.as<float>(), st());
                const int eff = std::min<int>(id, static_cast<int>(rows - 1));
                std::vector<float> ref(static_cast<size_t>(dim));
                dequantize_row_ref(t, table.data() + row_size(t, dim) * static_cast<size_t>(eff), ref.data(), dim);
                const auto gx = down<float>(dx, dim);
                for (int64_t i = 0; i < dim; ++i) ASSERT_EQ(gx[static_cast<size_t>(i)], ref[static_cast<size_t>(i)]) << what << " x " << i;
                expect_guard(dx, dim);
                const auto gss = down<float>(dss, dim / 32);
                for (int64_t k = 0; k < dim / 32; ++k) {
                    double want = 0.0;
                    for (int64_t i = 32 * k; i < 32 * k + 32; ++i) want += static_cast<double>(ref[static_cast<size_t>(i)]) * ref[static_cast<size_t>(i)];
                    ASSERT_LE(std::fabs(gss[static_cast<size_t>(k)] - want), 1e-5 * want + 1e-30) << what << " part " << k;
                }
                expect_guard(dss, dim / 32);
                std::vector<float> xw(static_cast<size_t>(dim));
                for (size_t i = 0; i < xw.size(); ++i) xw[i] = ref[i] * w[i];
                auto dxw = up(xw);
                quantize_activation(*ctx_, dxw.as<float>(), b);
                const auto bytes = static_cast<int64_t>(2 * a.level_bytes());
                const auto ga = down<uint8_t>(a.buffer(), bytes), gb = down<uint8_t>(b.buffer(), bytes);
                ASSERT_EQ(0, std::memcmp(ga.data(), gb.data(), ga.size())) << what;
            }
        }
    }
    DeviceBuffer b(1 << 12);
    float* f = b.as<float>();
    EXPECT_THROW(get_row_norm(DType::F32, f, 1, 48, b.as<int32_t>(), f, f, b.as<int8_t>(), b.as<ActBlockInfo>(),
                              nullptr, nullptr, f, st()),
                 std::exception);  // dim not a multiple of 32
    EXPECT_THROW(get_row_norm(DType::F32, f, 1, 64, b.as<int32_t>(), f, nullptr, b.as<int8_t>(),
                              b.as<ActBlockInfo>(), nullptr, nullptr, f, st()),
                 std::exception);
}

// ------------------------------------------------------------------ argmax

TEST_F(OpsCuda, Argmax) {
    for (int64_t n : {1, 7, 1000, 128256, 300000}) {
        for (int variant = 0; variant < 3; ++variant) {
            auto x = randv(n, rng_, -10.0f, 10.0f);
            int64_t want = 0;
            if (variant == 1 && n > 3) {  // ties: the lower index wins
                x[static_cast<size_t>(n / 3)] = 50.0f;
                x[static_cast<size_t>(n / 2)] = 50.0f;
                x[static_cast<size_t>(n - 1)] = 50.0f;
            }
            if (variant == 2 && n > 1) x[0] = std::numeric_limits<float>::quiet_NaN();  // skipped
            bool first = true;
            for (int64_t i = 0; i < n; ++i) {
                const float v = x[static_cast<size_t>(i)];
                if (std::isnan(v)) continue;
                if (first || v > x[static_cast<size_t>(want)]) want = i, first = false;
            }
            auto dx = up(x);
            DeviceBuffer scratch(argmax_scratch_bytes(n));
            auto dout = poisoned<int32_t>(1);
            argmax(dx.as<float>(), n, scratch.data(), dout.as<int32_t>(), st());
            auto got = down<int32_t>(dout, 1);
            ASSERT_EQ(got[0], want) << "n " << n << " variant " << variant;
        }
    }
}

// argmax_advance ends a greedy step: the argmax into ctl->sampled, then
// advance_decode_position's update (a prompt position takes the uploaded
// token, a free one the sampled token, a full cache only moves pos), and the
// token in the mapped host slot of the evaluated position.
TEST_F(OpsCuda, ArgmaxAdvance) {
    const int64_t n = 128256;
    const int n_ctx = 16;
    int32_t* host = nullptr;
    ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&host), 2 * sizeof(int32_t), cudaHostAllocMapped), cudaSuccess);
    int32_t* host_dev = nullptr;
    ASSERT_EQ(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_dev), host, 0), cudaSuccess);
    struct Case {
        int pos, fixed;
        bool fold;  // argmax_advance, or argmax then advance_decode_position
    };
    for (const Case c : {Case{4, 9, true}, Case{8, 9, true}, Case{11, 9, true}, Case{15, 9, true}, Case{6, 3, false},
                         Case{2, 5, false}}) {
        auto x = randv(n, rng_, -10.0f, 10.0f);
        const int64_t want = (c.pos * 7919) % n;
        x[static_cast<size_t>(want)] = 20.0f;
        std::vector<int32_t> toks(static_cast<size_t>(n_ctx + 1));
        for (size_t i = 0; i < toks.size(); ++i) toks[i] = 1000 + static_cast<int32_t>(i);
        auto dx = up(x), dtok = up(toks);
        auto dctl = up(std::vector<DecodeControl>{DecodeControl{c.pos, 77, c.fixed, -1}});
        DeviceBuffer scratch(argmax_scratch_bytes(n));
        host[0] = host[1] = -5;
        auto* ctl = dctl.as<DecodeControl>();
        if (c.fold) {
            argmax_advance(dx.as<float>(), n, scratch.data(), ctl, dtok.as<int32_t>(), n_ctx, host_dev, st());
        } else {
            argmax(dx.as<float>(), n, scratch.data(), &ctl->sampled, st());
            advance_decode_position(ctl, dtok.as<int32_t>(), n_ctx, st(), host_dev);
        }
        const auto got = down<DecodeControl>(dctl, 1)[0];
        const auto gt = down<int32_t>(dtok, n_ctx + 1);
        const std::string what = "pos " + std::to_string(c.pos) + " fixed " + std::to_string(c.fixed);
        const int np = c.pos + 1;
        EXPECT_EQ(got.sampled, want) << what;
        EXPECT_EQ(got.pos, np) << what;
        EXPECT_EQ(host[c.pos & 1], want) << what;
        EXPECT_EQ(host[(c.pos + 1) & 1], -5) << what << ": the other slot";
        auto wt = toks;
        int32_t cur = 77;
        if (np < n_ctx) {
            if (np < c.fixed) {
                cur = toks[static_cast<size_t>(np)];
            } else {
                cur = static_cast<int32_t>(want);
                wt[static_cast<size_t>(np)] = cur;
            }
        }
        EXPECT_EQ(got.cur, cur) << what;
        EXPECT_EQ(got.fixed, c.fixed) << what;
        EXPECT_EQ(gt, wt) << what;
    }
    cudaFreeHost(host);
    DeviceBuffer b(64);
    EXPECT_THROW(argmax_advance(b.as<float>(), 8, b.data(), nullptr, b.as<int32_t>(), 4, nullptr, st()),
                 std::exception);
}

// argmax_rows: each row's index equals argmax's on that row (rows with ties,
// a NaN, all NaN), rows at a stride past their length; nothing past m written.
TEST_F(OpsCuda, ArgmaxRowsMatchesArgmaxPerRow) {
    for (int64_t n : {1, 1000, 128256}) {
        const int64_t m = 7, ld = n + 5;
        auto x = randv(m * ld, rng_, -10.0f, 10.0f);
        const auto at = [&](int64_t r, int64_t i) -> float& { return x[static_cast<size_t>(r * ld + i)]; };
        if (n > 3) {
            at(1, n / 3) = at(1, n / 2) = at(1, n - 1) = 50.0f;  // ties: the lower index wins
            at(2, 0) = std::numeric_limits<float>::quiet_NaN();
            for (int64_t i = 0; i < n; ++i) at(3, i) = std::numeric_limits<float>::quiet_NaN();
            at(4, n - 1) = 1e30f;  // past the row: must not count
            at(4, n) = 2e30f;
        }
        auto dx = up(x);
        DeviceBuffer scratch(argmax_scratch_bytes(n));
        auto want = poisoned<int32_t>(1);
        auto dout = poisoned<int32_t>(static_cast<size_t>(m + 1));
        DeviceBuffer rscratch(argmax_rows_scratch_bytes(m));
        argmax_rows(dx.as<float>(), m, n, ld, rscratch.data(), dout.as<int32_t>(), st());
        const auto got = down<int32_t>(dout, static_cast<size_t>(m + 1));
        for (int64_t r = 0; r < m; ++r) {
            argmax(dx.as<float>() + r * ld, n, scratch.data(), want.as<int32_t>(), st());
            EXPECT_EQ(got[static_cast<size_t>(r)], down<int32_t>(want, 1)[0]) << "n " << n << " row " << r;
        }
        int32_t poison;
        std::memset(&poison, 0xFF, sizeof poison);
        EXPECT_EQ(got[static_cast<size_t>(m)], poison) << "written past the rows";
    }
    DeviceBuffer b(64);
    EXPECT_THROW(argmax_rows(b.as<float>(), 2, 8, 4, b.data(), b.as<int32_t>(), st()), std::exception);
    EXPECT_THROW(argmax_rows(nullptr, 2, 8, 8, b.data(), b.as<int32_t>(), st()), std::exception);
    EXPECT_THROW(argmax_rows(b.as<float>(), 2, 8, 8, nullptr, b.as<int32_t>(), st()), std::exception);
}


}  // namespace
