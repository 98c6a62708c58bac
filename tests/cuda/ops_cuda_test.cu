// CUDA decode ops (src/backend/cuda/ops.h) vs the CPU ops (src/backend/cpu/ops.h).
//
// Needs a GPU at run time: every test skips cleanly (GTEST_SKIP) where
// CudaContext::device_count() is 0.
//
// Every output buffer is poisoned (NaN bits) before the kernel runs, with a
// guard zone past the end that must keep the poison; cache rows and table rows
// the kernel must not read are filled with NaN. Tolerances per kernel:
//   rms_norm   |y − ref| <= 1e-5·|ref| + 1e-6 (fp32 vs double sum of squares);
//              residual sum bit-exact.
//   quantized  int8 planes and block records bit-exact against a host
//              quantization (quantize_row_ref(Q8_1)'s arithmetic, scales kept
//              fp32) of the float row the kernel itself wrote.
//   swiglu     |h − ref| <= 1e-5·|ref| + 1e-6 (expf vs the CPU's exp).
//   add        bit-exact.
//   rope       |x − ref| <= 1e-5 (angles computed as the CPU does, in double;
//              FMA contraction in the rotation); f16 cache: within half an
//              fp16 ulp (plus 1e-5) of the reference; v rows bit-exact.
//   attention  |o − ref| <= 2e-5 (outputs are convex combinations of V in [-1, 1]);
//              fused with RoPE: the cache row it writes as rope, the output
//              <= 5e-5 against cpu::rope + cpu::attention, its Q8_1 row
//              bit-exact, and a second identical call bit-identical.
// Sampling, embedding rows and argmax: ops_rows_cuda_test.cu.
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
#include "ops_test_util.h"

using namespace quern;
using namespace quern::cuda;
using namespace quern::cuda::test;

namespace {

// ------------------------------------------------------------------ RMSNorm

TEST_F(OpsCuda, RmsNormQ8_1) {
    for (int64_t dim : {96, 4096, 8192}) {
        for (int64_t n : {1, 3}) {
            for (bool with_res : {false, true}) {
                const std::string what = "dim " + std::to_string(dim) + " n " + std::to_string(n) +
                                         (with_res ? " +res" : "");
                auto x = randv(n * dim, rng_, -3.0f, 3.0f);
                auto res = randv(n * dim, rng_);
                auto w = randv(dim, rng_, 0.5f, 1.5f);
                auto dx = up(x), dres = up(res), dw = up(w);
                auto dy = poisoned<float>(n * dim);
                auto dq = poisoned<int8_t>(n * dim);
                auto dinfo = poisoned<ActBlockInfo>(n * dim / 32);
                rms_norm_q8_1(dx.as<float>(), with_res ? dres.as<float>() : nullptr, dw.as<float>(),
                              dy.as<float>(), dq.as<int8_t>(), dinfo.as<ActBlockInfo>(), n, dim, 1e-5f, st());
                auto xs = x;
                if (with_res)
                    for (size_t i = 0; i < xs.size(); ++i) xs[i] += res[i];
                std::vector<float> ref(xs.size());
                cpu::rms_norm(xs.data(), w.data(), ref.data(), n, dim, 1e-5f);
                auto gx = down<float>(dx, n * dim);
                auto gy = down<float>(dy, n * dim);
                auto gq = down<int8_t>(dq, n * dim);
                auto gi = down<ActBlockInfo>(dinfo, n * dim / 32);
                for (size_t i = 0; i < xs.size(); ++i) ASSERT_EQ(gx[i], xs[i]) << what << " x " << i;
                for (size_t i = 0; i < ref.size(); ++i)
                    ASSERT_LE(std::fabs(gy[i] - ref[i]), 1e-5f * std::fabs(ref[i]) + 1e-6f)
                        << what << " y " << i << " got " << gy[i] << " want " << ref[i];
                for (int64_t r = 0; r < n; ++r) {
                    std::vector<float> row(gy.begin() + r * dim, gy.begin() + (r + 1) * dim);
                    expect_quantized(row, gq.data() + r * dim, gi.data() + r * dim / 32, dim,
                                     what + " row " + std::to_string(r));
                }
                expect_guard(dy, n * dim);
                // Quantized output only (y_out null) gives the same blocks.
                auto dx2 = up(xs);
                auto dq2 = poisoned<int8_t>(n * dim);
                auto di2 = poisoned<ActBlockInfo>(n * dim / 32);
                rms_norm_q8_1(dx2.as<float>(), nullptr, dw.as<float>(), nullptr, dq2.as<int8_t>(),
                              di2.as<ActBlockInfo>(), n, dim, 1e-5f, st());
                auto gq2 = down<int8_t>(dq2, n * dim);
                ASSERT_EQ(0, std::memcmp(gq2.data(), gq.data(), gq.size())) << what;
            }
        }
    }
}

// A weighted residual of k rows (an expert layer's outputs summed by the next
// norm) gives bit for bit what moe_weighted_sum's h added as a plain
// residual gives: x, y and the quantized blocks; both kernels (dim 40000
// takes the scalar one), one and several rows.
TEST_F(OpsCuda, RmsNormQ8_1WeightedResidual) {
    for (int64_t dim : {96, 2048, 40000})
        for (int64_t n : {1, 2})
            for (int k : {1, 9}) {
                const std::string what = "dim " + std::to_string(dim) + " n " + std::to_string(n) + " k " +
                                         std::to_string(k);
                auto x = randv(n * dim, rng_, -3.0f, 3.0f);
                auto rows = randv(n * k * dim, rng_);
                auto rw = randv(n * k, rng_, 0.0f, 1.0f);
                auto w = randv(dim, rng_, 0.5f, 1.5f);
                auto drows = up(rows), drw = up(rw), dw = up(w);
                auto dh = poisoned<float>(n * dim);
                for (int64_t r = 0; r < n; ++r)
                    moe_weighted_sum(drows.as<float>() + r * k * dim, drw.as<float>() + r * k, k, dim,
                                     dh.as<float>() + r * dim, st());
                auto dx1 = up(x), dx2 = up(x);
                auto dy1 = poisoned<float>(n * dim), dy2 = poisoned<float>(n * dim);
                QuantizedActivation q1(n * dim, 2), q2(n * dim, 2);
                rms_norm_q8_1(dx1.as<float>(), dh.as<float>(), dw.as<float>(), dy1.as<float>(), q1.q(), q1.info(), n,
                              dim, 1e-6f, st(), q1.q2(), q1.info2());
                rms_norm_q8_1(dx2.as<float>(), drows.as<float>(), dw.as<float>(), dy2.as<float>(), q2.q(), q2.info(),
                              n, dim, 1e-6f, st(), q2.q2(), q2.info2(), drw.as<float>(), k);
                const auto x1 = down<float>(dx1, n * dim), x2 = down<float>(dx2, n * dim);
                const auto y1 = down<float>(dy1, n * dim), y2 = down<float>(dy2, n * dim);
                ASSERT_EQ(0, std::memcmp(x1.data(), x2.data(), x1.size() * 4)) << what << " x";
                ASSERT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4)) << what << " y";
                const auto bytes = static_cast<int64_t>(2 * q1.level_bytes());  // what the two levels hold
                const auto b1 = down<uint8_t>(q1.buffer(), bytes), b2 = down<uint8_t>(q2.buffer(), bytes);
                ASSERT_EQ(0, std::memcmp(b1.data(), b2.data(), b1.size())) << what << " quantized";
            }
    auto d = poisoned<float>(64);
    EXPECT_THROW(rms_norm_q8_1(d.as<float>(), d.as<float>(), d.as<float>(), nullptr, nullptr, nullptr, 1, 32, 1e-6f,
                               st(), nullptr, nullptr, nullptr, 2),
                 std::runtime_error);
}

TEST_F(OpsCuda, RmsNormMatchesQuantizeActivation) {
    // One row through rms_norm_q8_1 vs rms_norm's float output through quantize_activation:
    // the formats must be interchangeable for the GEMV.
    const int64_t dim = 4096;
    auto x = randv(dim, rng_, -2.0f, 2.0f);
    auto w = randv(dim, rng_, 0.5f, 1.5f);
    auto dx = up(x), dw = up(w);
    auto dy = poisoned<float>(dim);
    QuantizedActivation a(dim), b(dim);
    rms_norm_q8_1(dx.as<float>(), nullptr, dw.as<float>(), dy.as<float>(), a.q(), a.info(), 1, dim, 1e-6f, st());
    quantize_activation(*ctx_, dy.as<float>(), b);
    const size_t bytes = static_cast<size_t>(dim) + static_cast<size_t>(dim / 32) * sizeof(ActBlockInfo);
    auto ga = down<uint8_t>(a.buffer(), static_cast<int64_t>(bytes));
    auto gb = down<uint8_t>(b.buffer(), static_cast<int64_t>(bytes));
    ASSERT_EQ(0, std::memcmp(ga.data(), gb.data(), bytes));
}

// ------------------------------------------------------------------ SwiGLU, add

TEST_F(OpsCuda, SwigluQ8_1) {
    for (bool gelu : {false, true})
    for (int64_t count : {96, 14336}) {
        auto g = randv(count, rng_, -6.0f, 6.0f);
        auto u = randv(count, rng_, -2.0f, 2.0f);
        auto dg = up(g), du = up(u);
        auto dh = poisoned<float>(count);
        auto dq = poisoned<int8_t>(count);
        auto di = poisoned<ActBlockInfo>(count / 32);
        swiglu_q8_1(dg.as<float>(), du.as<float>(), dh.as<float>(), dq.as<int8_t>(), di.as<ActBlockInfo>(), count,
                    st(), nullptr, nullptr, gelu);
        std::vector<float> ref(static_cast<size_t>(count));
        if (gelu) cpu::geglu_tanh(g.data(), u.data(), ref.data(), count);
        else cpu::swiglu(g.data(), u.data(), ref.data(), count);
        auto gh = down<float>(dh, count);
        for (size_t i = 0; i < ref.size(); ++i)
            ASSERT_LE(std::fabs(gh[i] - ref[i]), 1e-5f * std::fabs(ref[i]) + 1e-6f)
                << "count " << count << " i " << i << " got " << gh[i] << " want " << ref[i];
        auto gq = down<int8_t>(dq, count);
        auto gi = down<ActBlockInfo>(di, count / 32);
        expect_quantized(gh, gq.data(), gi.data(), count, "swiglu " + std::to_string(count));
        expect_guard(dh, count);
    }
}

// The row form (an expert bank's per-slot [gate | up] rows at stride 2F,
// F = 80: rows that do not start on a 32-element block) gives exactly the
// flat form's outputs on the gathered gates and ups; rows that do not tile
// count are refused.
TEST_F(OpsCuda, SwigluQ8_1Rows) {
    constexpr int64_t F = 80, slots = 6, count = F * slots;
    auto gu = randv(2 * count, rng_, -6.0f, 6.0f);
    std::vector<float> g, u;
    for (int64_t r = 0; r < slots; ++r) {
        g.insert(g.end(), gu.begin() + r * 2 * F, gu.begin() + r * 2 * F + F);
        u.insert(u.end(), gu.begin() + r * 2 * F + F, gu.begin() + (r + 1) * 2 * F);
    }
    auto dgu = up(gu), dg = up(g), du = up(u);
    auto dh = poisoned<float>(count), dh2 = poisoned<float>(count);
    auto dq = poisoned<int8_t>(count), dq2 = poisoned<int8_t>(count);
    auto di = poisoned<ActBlockInfo>(count / 32), di2 = poisoned<ActBlockInfo>(count / 32);
    swiglu_q8_1(dgu.as<float>(), dgu.as<float>() + F, dh.as<float>(), dq.as<int8_t>(), di.as<ActBlockInfo>(), count,
                st(), nullptr, nullptr, kGateSiLU, F, 2 * F);
    swiglu_q8_1(dg.as<float>(), du.as<float>(), dh2.as<float>(), dq2.as<int8_t>(), di2.as<ActBlockInfo>(), count,
                st());
    const auto h = down<float>(dh, count), h2 = down<float>(dh2, count);
    ASSERT_EQ(0, std::memcmp(h.data(), h2.data(), h.size() * sizeof(float)));
    const auto q = down<int8_t>(dq, count), q2 = down<int8_t>(dq2, count);
    ASSERT_EQ(0, std::memcmp(q.data(), q2.data(), q.size()));
    expect_guard(dh, count);
    EXPECT_THROW(swiglu_q8_1(dgu.as<float>(), dgu.as<float>() + F, dh.as<float>(), nullptr, nullptr, count, st(),
                             nullptr, nullptr, kGateSiLU, 7 * 11, 2 * F),
                 std::runtime_error);
    EXPECT_THROW(swiglu_q8_1(dgu.as<float>(), dgu.as<float>() + F, dh.as<float>(), nullptr, nullptr, count, st(),
                             nullptr, nullptr, kGateSiLU, F, F - 1),
                 std::runtime_error);
}

// scale_softcap against cpu::scale and cpu::softcap.
TEST_F(OpsCuda, ScaleSoftcap) {
    for (float cap : {0.0f, 30.0f, 5.0f})
        for (int64_t count : {1, 4096, 128257}) {
            auto x = randv(count, rng_, -200.0f, 200.0f);
            auto dx = poisoned<float>(count);
            dx.upload(x.data(), x.size() * 4, st());
            const float sc = cap > 0.0f ? 1.0f : 45.25f;
            scale_softcap(dx.as<float>(), count, sc, cap, st());
            auto ref = x;
            cpu::scale(ref.data(), count, sc);
            if (cap > 0.0f) cpu::softcap(ref.data(), count, cap);
            auto got = down<float>(dx, count);
            for (size_t i = 0; i < ref.size(); ++i)
                ASSERT_LE(std::fabs(got[i] - ref[i]), 2e-6f * std::fabs(ref[i]) + 1e-6f)
                    << "cap " << cap << " count " << count << " i " << i << " got " << got[i] << " want " << ref[i];
            expect_guard(dx, count);
        }
    EXPECT_THROW(scale_softcap(nullptr, 4, 1.0f, 0.0f, st()), std::runtime_error);
}

TEST_F(OpsCuda, AddInplace) {
    for (int64_t count : {4096, 4099, 1}) {
        auto y = randv(count, rng_), x = randv(count, rng_);
        auto dy = poisoned<float>(count);
        dy.upload(y.data(), y.size() * 4, st());
        auto dx = up(x);
        add_inplace(dy.as<float>(), dx.as<float>(), count, st());
        auto gy = down<float>(dy, count);
        for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(gy[i], y[i] + x[i]) << count << " " << i;
        expect_guard(dy, count);
    }
    // Misaligned pointers take the scalar path.
    const int64_t count = 1000;
    auto y = randv(count + 1, rng_), x = randv(count + 1, rng_);
    auto dy = up(y), dx = up(x);
    add_inplace(dy.as<float>() + 1, dx.as<float>() + 1, count, st());
    auto gy = down<float>(dy, count + 1);
    ASSERT_EQ(gy[0], y[0]);
    for (int64_t i = 1; i <= count; ++i) ASSERT_EQ(gy[static_cast<size_t>(i)], y[static_cast<size_t>(i)] + x[static_cast<size_t>(i)]);
}

// ------------------------------------------------------------------ RoPE + KV write

struct RopeCase {
    int n_head, n_head_kv, head_dim, rope_dim;
    bool neox, freq;
    KvType kv;
};

TEST_F(OpsCuda, RopeKvStore) {
    const int n_ctx = 40000;
    const RopeCase cases[] = {
        {32, 8, 128, 128, false, false, KvType::F32}, {32, 8, 128, 128, false, true, KvType::F16},
        {14, 2, 64, 64, true, false, KvType::F32},    {16, 4, 64, 32, true, true, KvType::F16},
        {8, 8, 128, 96, false, true, KvType::F32},
    };
    for (const auto& c : cases) {
        for (int pos : {0, 5, 4000, 32767, n_ctx - 1, n_ctx + 7}) {
            const std::string what = "heads " + std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv) +
                                     " hd " + std::to_string(c.head_dim) + " rope " + std::to_string(c.rope_dim) +
                                     (c.neox ? " neox" : " normal") + (c.freq ? " ff" : "") +
                                     (c.kv == KvType::F16 ? " f16" : " f32") + " pos " + std::to_string(pos);
            const int qn = c.n_head * c.head_dim, kn = c.n_head_kv * c.head_dim;
            auto q = randv(qn, rng_, -2.0f, 2.0f), k = randv(kn, rng_, -2.0f, 2.0f), v = randv(kn, rng_);
            auto ff = randv(c.rope_dim / 2, rng_, 1.0f, 8.0f);
            const int eff = std::min(pos, n_ctx - 1);
            const size_t esz = c.kv == KvType::F16 ? 2 : 4;
            // Cache: only rows eff-1 .. eff+1 exist in this test's view; all poisoned.
            DeviceBuffer kc(static_cast<size_t>(n_ctx + 1) * kn * esz), vc(static_cast<size_t>(n_ctx + 1) * kn * esz);
            kc.fill_bytes(0xFF, st());
            vc.fill_bytes(0xFF, st());
            auto dq = up(q), dk = up(k), dv = up(v), dff = up(ff);
            auto dpos = up(std::vector<int32_t>{pos});
            rope_kv_store(dq.as<float>(), dk.as<float>(), dv.as<float>(), kc.data(), vc.data(), c.kv,
                          dpos.as<int32_t>(), n_ctx, c.n_head, c.n_head_kv, c.head_dim, c.rope_dim, 10000.0f,
                          c.neox, c.freq ? dff.as<float>() : nullptr, st());
            auto rq = q, rk = k;
            const int32_t p = eff;
            cpu::rope(rq.data(), &p, 1, c.n_head, c.head_dim, c.rope_dim, 10000.0f, c.neox, c.freq ? ff.data() : nullptr);
            cpu::rope(rk.data(), &p, 1, c.n_head_kv, c.head_dim, c.rope_dim, 10000.0f, c.neox,
                      c.freq ? ff.data() : nullptr);
            auto gq = down<float>(dq, qn);
            for (int i = 0; i < qn; ++i)
                ASSERT_LE(std::fabs(gq[i] - rq[i]), 1e-5f) << what << " q " << i << " " << gq[i] << " vs " << rq[i];
            auto gk_in = down<float>(dk, kn);
            ASSERT_EQ(0, std::memcmp(gk_in.data(), k.data(), k.size() * 4)) << what << ": k input modified";
            // Rows eff-1, eff, eff+1 of both caches.
            const size_t row_bytes = static_cast<size_t>(kn) * esz;
            for (int r = eff - 1; r <= eff + 1; ++r) {
                if (r < 0) continue;
                std::vector<uint8_t> kr(row_bytes), vr(row_bytes);
                kc.download(kr.data(), row_bytes, st(), static_cast<size_t>(r) * row_bytes);
                vc.download(vr.data(), row_bytes, st(), static_cast<size_t>(r) * row_bytes);
                if (r != eff) {
                    for (size_t i = 0; i < row_bytes; ++i) {
                        ASSERT_EQ(kr[i], 0xFF) << what << " k row " << r << " written";
                        ASSERT_EQ(vr[i], 0xFF) << what << " v row " << r << " written";
                    }
                    continue;
                }
                for (int i = 0; i < kn; ++i) {
                    float gk, gv;
                    if (c.kv == KvType::F16) {
                        uint16_t hk, hv;
                        std::memcpy(&hk, kr.data() + 2 * i, 2);
                        std::memcpy(&hv, vr.data() + 2 * i, 2);
                        gk = fp16_to_fp32(hk);
                        gv = fp16_to_fp32(hv);
                        ASSERT_EQ(hv, fp32_to_fp16(v[i])) << what << " v " << i;
                        ASSERT_LE(std::fabs(gk - rk[i]), std::fabs(rk[i]) * (1.0f / 2048.0f) + 1e-5f)
                            << what << " k " << i << " " << gk << " vs " << rk[i];
                    } else {
                        std::memcpy(&gk, kr.data() + 4 * i, 4);
                        std::memcpy(&gv, vr.data() + 4 * i, 4);
                        ASSERT_EQ(gv, v[i]) << what << " v " << i;
                        ASSERT_LE(std::fabs(gk - rk[i]), 1e-5f) << what << " k " << i << " " << gk << " vs " << rk[i];
                    }
                }
            }
        }
    }
}

// ------------------------------------------------------------------ attention

struct AttnCase {
    int n_head, n_head_kv, head_dim;
    KvType kv;
    std::vector<int> positions;
};

TEST_F(OpsCuda, DecodeAttention) {
    ThreadPool pool(2);
    const AttnCase cases[] = {
        {32, 8, 128, KvType::F16, {0, 6, 255, 256, 1000, 4095, 32767}},
        {32, 8, 128, KvType::F32, {0, 255, 511, 3000}},
        {14, 2, 64, KvType::F16, {0, 100, 2047}},  // g = 7
        {16, 1, 64, KvType::F32, {300, 1500}},     // g = 16
        {8, 8, 128, KvType::F32, {77, 700}},       // g = 1
        {12, 4, 64, KvType::F16, {513}},           // g = 3
        {32, 8, 96, KvType::F16, {0, 63, 64, 700}},  // heads of 96 (Phi-3 mini): 12 of 16 lanes per row
        {32, 32, 96, KvType::F32, {5, 129}},          // heads of 96, f32 cache: 24 of 32 lanes
    };
    for (const auto& c : cases) {
        const int n_ctx = c.positions.back() + 1 + 300;  // rows past the last position are NaN
        const int64_t kn = static_cast<int64_t>(c.n_head_kv) * c.head_dim;
        const bool f16 = c.kv == KvType::F16;
        std::vector<float> kf = randv(n_ctx * kn, rng_), vf = randv(n_ctx * kn, rng_);
        std::vector<uint16_t> kh, vh;
        if (f16) {
            kh.resize(kf.size());
            vh.resize(vf.size());
            for (size_t i = 0; i < kf.size(); ++i) {
                kh[i] = fp32_to_fp16(kf[i]);
                vh[i] = fp32_to_fp16(vf[i]);
                kf[i] = fp16_to_fp32(kh[i]);  // the reference reads what the device holds
                vf[i] = fp16_to_fp32(vh[i]);
            }
        }
        const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
        const size_t esz = f16 ? 2 : 4;
        DeviceBuffer kc(static_cast<size_t>(n_ctx) * kn * esz), vc(static_cast<size_t>(n_ctx) * kn * esz);
        DeviceBuffer scratch(decode_attention_scratch_bytes(n_ctx, c.n_head, c.head_dim));
        for (int pos : c.positions) {
            const std::string what = "heads " + std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv) + " hd " +
                                     std::to_string(c.head_dim) + (f16 ? " f16" : " f32") + " pos " +
                                     std::to_string(pos);
            // Upload the cache with rows past pos set to NaN (they must not be read).
            const size_t live = static_cast<size_t>(pos + 1) * static_cast<size_t>(kn);
            kc.fill_bytes(0xFF, st());
            vc.fill_bytes(0xFF, st());
            if (f16) {
                kc.upload(kh.data(), live * 2, st());
                vc.upload(vh.data(), live * 2, st());
            } else {
                kc.upload(kf.data(), live * 4, st());
                vc.upload(vf.data(), live * 4, st());
            }
            scratch.fill_bytes(0xFF, st());
            // Peaky scores now and then: q scaled up.
            auto q = randv(static_cast<int64_t>(c.n_head) * c.head_dim, rng_, -4.0f, 4.0f);
            auto dq = up(q);
            auto dpos = up(std::vector<int32_t>{pos});
            auto dout = poisoned<float>(static_cast<int64_t>(c.n_head) * c.head_dim);
            decode_attention(dq.as<float>(), kc.data(), vc.data(), c.kv, dpos.as<int32_t>(), n_ctx, c.n_head,
                             c.n_head_kv, c.head_dim, scale, scratch.data(), dout.as<float>(), st());
            std::vector<float> ref(q.size());
            const int32_t p = pos;
            cpu::attention(q.data(), kf.data(), vf.data(), kn, &p, 1, c.n_head, c.n_head_kv, c.head_dim, scale,
                           ref.data(), pool);
            auto got = down<float>(dout, static_cast<int64_t>(q.size()));
            // Output is a convex combination of V values in [-1, 1]; fp32
            // summation in another order over up to 32k terms.
            for (size_t i = 0; i < ref.size(); ++i)
                ASSERT_LE(std::fabs(got[i] - ref[i]), 2e-5f) << what << " out " << i << " " << got[i] << " vs " << ref[i];
            expect_guard(dout, static_cast<int64_t>(q.size()));
        }
    }
}

struct AttnRopeCase {
    int n_head, n_head_kv, head_dim, rope_dim;
    bool neox, freq;
    KvType kv;
    std::vector<int> positions;
    bool bias = false;  // AttentionExtras: q/k/v biases
    bool norm = false;  // per-head q/k RMSNorm
    int window = 0;     // sliding window
    float softcap = 0;  // score soft-capping
};

TEST_F(OpsCuda, DecodeAttentionRope) {
    ThreadPool pool(2);
    const AttnRopeCase cases[] = {
        {32, 8, 128, 128, false, false, KvType::F16, {0, 1, 63, 64, 100, 1000, 4095, 9000}},
        {32, 8, 128, 128, false, true, KvType::F32, {0, 70, 511}},
        {14, 2, 64, 64, true, false, KvType::F16, {0, 127, 2047}},  // g = 7, NeoX
        {16, 4, 64, 32, true, true, KvType::F32, {5, 300}},         // partial rotation
        {8, 8, 128, 96, false, false, KvType::F16, {64, 777}},      // g = 1
        // Architectures beyond Llama (AttentionExtras) and the other head sizes.
        {32, 8, 128, 128, true, false, KvType::F16, {0, 70, 1000}, true, true, 0},    // Qwen2 biases + Qwen3 norms
        {8, 2, 128, 64, true, false, KvType::F32, {100, 500}, true, false, 100},     // biases, window
        {8, 4, 64, 64, true, false, KvType::F16, {3, 63, 64, 200, 1000}, false, false, 7},  // window 7
        {16, 4, 32, 32, true, false, KvType::F16, {0, 5, 300}, false, true, 0},      // head_dim 32
        {16, 4, 32, 32, false, false, KvType::F32, {0, 64, 129}},                    // head_dim 32, f32
        {32, 32, 96, 96, true, false, KvType::F16, {0, 64, 300}, false, false, 0},   // head_dim 96 (Phi-3 mini)
        {32, 8, 96, 96, true, false, KvType::F32, {7, 200}, false, true, 0},         // head_dim 96, f32, norms
        {4, 1, 256, 256, true, false, KvType::F16, {0, 99, 700}, false, true, 0},    // head_dim 256 (Gemma 3)
        {8, 4, 256, 256, true, false, KvType::F16, {5, 300}, false, false, 4, 50.0f}, // Gemma 2: window, softcap
        {16, 8, 128, 128, true, false, KvType::F32, {70, 1000}, false, false, 0, 2.0f},  // a cap that bites
    };
    for (const auto& c : cases) {
        const int n_ctx = c.positions.back() + 1 + 100;
        const int qn = c.n_head * c.head_dim, kn = c.n_head_kv * c.head_dim;
        const bool f16 = c.kv == KvType::F16;
        const size_t esz = f16 ? 2 : 4;
        const size_t row_bytes = static_cast<size_t>(kn) * esz;
        // Cache contents for rows before pos: random, as the device holds them.
        std::vector<float> kf = randv(static_cast<int64_t>(n_ctx) * kn, rng_), vf = randv(static_cast<int64_t>(n_ctx) * kn, rng_);
        std::vector<uint8_t> kbytes(static_cast<size_t>(n_ctx) * row_bytes), vbytes(kbytes.size());
        for (size_t i = 0; i < kf.size(); ++i) {
            if (f16) {
                const uint16_t hk = fp32_to_fp16(kf[i]), hv = fp32_to_fp16(vf[i]);
                std::memcpy(kbytes.data() + 2 * i, &hk, 2);
                std::memcpy(vbytes.data() + 2 * i, &hv, 2);
                kf[i] = fp16_to_fp32(hk);
                vf[i] = fp16_to_fp32(hv);
            } else {
                std::memcpy(kbytes.data() + 4 * i, &kf[i], 4);
                std::memcpy(vbytes.data() + 4 * i, &vf[i], 4);
            }
        }
        auto ff = randv(c.rope_dim / 2, rng_, 1.0f, 8.0f);
        std::vector<float> inv(static_cast<size_t>(c.rope_dim / 2));
        cpu::rope_inv_freq(c.rope_dim, 10000.0f, c.freq ? ff.data() : nullptr, inv.data());
        auto dinv = up(inv);
        DeviceBuffer kc(static_cast<size_t>(n_ctx) * row_bytes), vc(static_cast<size_t>(n_ctx) * row_bytes);
        DeviceBuffer scratch(decode_attention_scratch_bytes(n_ctx, c.n_head, c.head_dim));
        scratch.fill_bytes(0xFF, st());
        const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
        for (int pos : c.positions) {
            const std::string what = "heads " + std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv) +
                                     " hd " + std::to_string(c.head_dim) + " rope " + std::to_string(c.rope_dim) +
                                     (c.neox ? " neox" : " normal") + (c.freq ? " ff" : "") + (f16 ? " f16" : " f32") +
                                     (c.bias ? " bias" : "") + (c.norm ? " qk-norm" : "") +
                                     (c.window ? " window " + std::to_string(c.window) : "") +
                                     (c.softcap > 0 ? " softcap" : "") + " pos " + std::to_string(pos);
            // Rows 0..pos-1 live, row pos and after poisoned (pos must be written, later rows never read).
            kc.fill_bytes(0xFF, st());
            vc.fill_bytes(0xFF, st());
            if (pos > 0) {
                kc.upload(kbytes.data(), static_cast<size_t>(pos) * row_bytes, st());
                vc.upload(vbytes.data(), static_cast<size_t>(pos) * row_bytes, st());
            }
            auto q = randv(qn, rng_, -3.0f, 3.0f), k = randv(kn, rng_, -2.0f, 2.0f), v = randv(kn, rng_);
            auto dq = up(q), dk = up(k), dv = up(v);
            // Extras: biases, norm weights; qb, kb, vb are what RoPE / the cache see.
            auto bq = randv(qn, rng_, -1.0f, 1.0f), bk = randv(kn, rng_, -1.0f, 1.0f), bv = randv(kn, rng_, -1.0f, 1.0f);
            auto wq = randv(c.head_dim, rng_, 0.5f, 1.5f), wk = randv(c.head_dim, rng_, 0.5f, 1.5f);
            auto dbq = up(bq), dbk = up(bk), dbv = up(bv), dwq = up(wq), dwk = up(wk);
            AttentionExtras ex;
            if (c.bias) ex.q_bias = dbq.as<float>(), ex.k_bias = dbk.as<float>(), ex.v_bias = dbv.as<float>();
            if (c.norm) ex.q_norm = dwq.as<float>(), ex.k_norm = dwk.as<float>();
            ex.norm_eps = 1e-6f;
            ex.window = c.window;
            ex.softcap = c.softcap;
            auto qb = q, kb = k, vb = v;
            if (c.bias) {
                for (int i = 0; i < qn; ++i) qb[static_cast<size_t>(i)] += bq[static_cast<size_t>(i)];
                for (int i = 0; i < kn; ++i) kb[static_cast<size_t>(i)] += bk[static_cast<size_t>(i)], vb[static_cast<size_t>(i)] += bv[static_cast<size_t>(i)];
            }
            if (c.norm) {
                cpu::rms_norm(qb.data(), wq.data(), qb.data(), c.n_head, c.head_dim, 1e-6f);
                cpu::rms_norm(kb.data(), wk.data(), kb.data(), c.n_head_kv, c.head_dim, 1e-6f);
            }
            auto dpos = up(std::vector<int32_t>{pos});
            auto dout = poisoned<float>(qn);
            auto dxq = poisoned<int8_t>(qn), dxq2 = poisoned<int8_t>(qn);
            auto dinfo = poisoned<ActBlockInfo>(qn / 32), dinfo2 = poisoned<ActBlockInfo>(qn / 32);
            auto call = [&] {
                decode_attention_rope(dq.as<float>(), dk.as<float>(), dv.as<float>(), kc.data(), vc.data(), c.kv,
                                      dpos.as<int32_t>(), n_ctx, c.n_head, c.n_head_kv, c.head_dim, dinv.as<float>(),
                                      c.rope_dim, c.neox, scale, scratch.data(), dout.as<float>(), st(),
                                      dxq.as<int8_t>(), dinfo.as<ActBlockInfo>(), dxq2.as<int8_t>(),
                                      dinfo2.as<ActBlockInfo>(), ex);
            };
            call();
            auto got = down<float>(dout, qn);
            // Inputs untouched.
            ASSERT_EQ(0, std::memcmp(down<float>(dq, qn).data(), q.data(), q.size() * 4)) << what << ": q modified";
            ASSERT_EQ(0, std::memcmp(down<float>(dk, kn).data(), k.data(), k.size() * 4)) << what << ": k modified";
            // Row pos: rotated k and v, as rope_kv_store writes them; row pos+1 untouched.
            auto rq = qb, rk = kb;
            const int32_t p = pos;
            cpu::rope(rq.data(), &p, 1, c.n_head, c.head_dim, c.rope_dim, 10000.0f, c.neox, c.freq ? ff.data() : nullptr);
            cpu::rope(rk.data(), &p, 1, c.n_head_kv, c.head_dim, c.rope_dim, 10000.0f, c.neox,
                      c.freq ? ff.data() : nullptr);
            std::vector<uint8_t> kr(row_bytes), vr(row_bytes), nk(row_bytes);
            kc.download(kr.data(), row_bytes, st(), static_cast<size_t>(pos) * row_bytes);
            vc.download(vr.data(), row_bytes, st(), static_cast<size_t>(pos) * row_bytes);
            kc.download(nk.data(), row_bytes, st(), static_cast<size_t>(pos + 1) * row_bytes);
            ctx_->synchronize();
            for (size_t i = 0; i < row_bytes; ++i) ASSERT_EQ(nk[i], 0xFF) << what << ": row pos+1 written";
            std::vector<float> kref(static_cast<size_t>(pos + 1) * kn), vref(kref.size());
            std::copy(kf.begin(), kf.begin() + static_cast<int64_t>(pos) * kn, kref.begin());
            std::copy(vf.begin(), vf.begin() + static_cast<int64_t>(pos) * kn, vref.begin());
            for (int i = 0; i < kn; ++i) {
                float gk, gv;
                if (f16) {
                    uint16_t hk, hv;
                    std::memcpy(&hk, kr.data() + 2 * i, 2);
                    std::memcpy(&hv, vr.data() + 2 * i, 2);
                    gk = fp16_to_fp32(hk), gv = fp16_to_fp32(hv);
                    ASSERT_EQ(hv, fp32_to_fp16(vb[i])) << what << " v " << i;
                    ASSERT_LE(std::fabs(gk - rk[i]), std::fabs(rk[i]) * (1.0f / 2048.0f) + 1e-5f)
                        << what << " k " << i << " " << gk << " vs " << rk[i];
                } else {
                    std::memcpy(&gk, kr.data() + 4 * i, 4);
                    std::memcpy(&gv, vr.data() + 4 * i, 4);
                    ASSERT_EQ(gv, vb[i]) << what << " v " << i;
                    ASSERT_LE(std::fabs(gk - rk[i]), 1e-5f * (1.0f + std::fabs(rk[i])))
                        << what << " k " << i << " " << gk << " vs " << rk[i];
                }
                kref[static_cast<size_t>(pos) * kn + i] = gk;  // the attention reference reads what the device stored
                vref[static_cast<size_t>(pos) * kn + i] = gv;
            }
            std::vector<float> ref(static_cast<size_t>(qn));
            cpu::attention(rq.data(), kref.data(), vref.data(), kn, &p, 1, c.n_head, c.n_head_kv, c.head_dim, scale,
                           ref.data(), pool, c.window, c.softcap);
            for (int i = 0; i < qn; ++i)
                ASSERT_LE(std::fabs(got[i] - ref[i]), 5e-5f) << what << " out " << i << " " << got[i] << " vs " << ref[i];
            expect_guard(dout, qn);
            auto gq8 = down<int8_t>(dxq, qn);
            auto ginfo = down<ActBlockInfo>(dinfo, qn / 32);
            expect_quantized(got, gq8.data(), ginfo.data(), qn, what + " Q8_1");
            // The same call again (row pos now in the cache too): identical output.
            call();
            auto again = down<float>(dout, qn);
            ASSERT_EQ(0, std::memcmp(again.data(), got.data(), got.size() * 4)) << what << ": second call differs";
            // One split per KV head (the short-context graph's form: every
            // tile in one block, no combine launch): the same attention.
            ex.one_split = 1;
            dout.fill_bytes(0xFF, st());
            dxq.fill_bytes(0xFF, st());
            dinfo.fill_bytes(0xFF, st());
            call();
            ex.one_split = 0;
            auto one = down<float>(dout, qn);
            for (int i = 0; i < qn; ++i)
                ASSERT_LE(std::fabs(one[i] - ref[i]), 5e-5f) << what << " one split, out " << i << " " << one[i]
                                                              << " vs " << ref[i];
            expect_guard(dout, qn);
            auto oq8 = down<int8_t>(dxq, qn);
            auto oinfo = down<ActBlockInfo>(dinfo, qn / 32);
            expect_quantized(one, oq8.data(), oinfo.data(), qn, what + " one split Q8_1");
            // A paged cache (the serving engine's sequences): blocks of 1,
            // 16 and 128 positions in shuffled order with no block in its own
            // place, the rows before pos where the table puts them,
            // everything else poisoned. The same rows read through the table
            // give the same output bit for bit, and the new row lands where
            // the table puts pos and nowhere else.
            for (int shift : {0, 4, 7}) {
                const int bsz = 1 << shift, nb = (n_ctx + bsz - 1) / bsz;
                std::vector<int32_t> table(static_cast<size_t>(nb));
                for (int b = 0; b < nb; ++b) table[static_cast<size_t>(b)] = b;
                std::shuffle(table.begin(), table.end(), rng_);
                for (int b = 0; b < nb; ++b)  // no fixed points: an ignored table cannot pass
                    if (table[static_cast<size_t>(b)] == b)
                        std::swap(table[static_cast<size_t>(b)], table[static_cast<size_t>((b + 1) % nb)]);
                const auto phys = [&](int r) {
                    return static_cast<size_t>(table[static_cast<size_t>(r >> shift)]) * bsz + (r & (bsz - 1));
                };
                std::vector<uint8_t> pkh(static_cast<size_t>(nb) * bsz * row_bytes, 0xFF), pvh(pkh.size(), 0xFF);
                for (int r = 0; r < pos; ++r) {
                    std::memcpy(pkh.data() + phys(r) * row_bytes, kbytes.data() + static_cast<size_t>(r) * row_bytes, row_bytes);
                    std::memcpy(pvh.data() + phys(r) * row_bytes, vbytes.data() + static_cast<size_t>(r) * row_bytes, row_bytes);
                }
                DeviceBuffer pk(pkh.size()), pv(pvh.size());
                pk.upload(pkh.data(), pkh.size(), st());
                pv.upload(pvh.data(), pvh.size(), st());
                auto dtable = up(table);
                const std::string pw = what + " paged, blocks of " + std::to_string(bsz);
                for (int split : {0, 1}) {  // the new row is stored again with the same bytes
                    dout.fill_bytes(0xFF, st());
                    AttentionExtras px = ex;
                    px.one_split = split;
                    px.block_table = dtable.as<int32_t>();
                    px.block_shift = shift;
                    decode_attention_rope(dq.as<float>(), dk.as<float>(), dv.as<float>(), pk.data(), pv.data(), c.kv,
                                          dpos.as<int32_t>(), n_ctx, c.n_head, c.n_head_kv, c.head_dim,
                                          dinv.as<float>(), c.rope_dim, c.neox, scale, scratch.data(),
                                          dout.as<float>(), st(), nullptr, nullptr, nullptr, nullptr, px);
                    auto paged = down<float>(dout, qn);
                    ASSERT_EQ(0, std::memcmp(paged.data(), (split ? one : got).data(), got.size() * 4))
                        << pw << (split ? ", one split" : "") << ": output differs";
                }
                std::memcpy(pkh.data() + phys(pos) * row_bytes, kr.data(), row_bytes);
                std::memcpy(pvh.data() + phys(pos) * row_bytes, vr.data(), row_bytes);
                std::vector<uint8_t> pkg(pkh.size()), pvg(pvh.size());
                pk.download(pkg.data(), pkg.size(), st());
                pv.download(pvg.data(), pvg.size(), st());
                ctx_->synchronize();
                ASSERT_TRUE(pkg == pkh) << pw << ": K rows other than the table's row of pos written, or that row wrong";
                ASSERT_TRUE(pvg == pvh) << pw << ": V rows other than the table's row of pos written, or that row wrong";
            }
        }
    }
}

TEST_F(OpsCuda, RejectsBadArguments) {
    DeviceBuffer b(1 << 16);
    float* f = b.as<float>();
    EXPECT_THROW(rms_norm_q8_1(f, nullptr, f, f, nullptr, nullptr, 1, 100, 1e-5f, st()), std::exception);
    EXPECT_THROW(decode_attention(f, f, f, KvType::F16, b.as<int32_t>(), 16, 8, 8, 80, 1.0f, f, f, st()),
                 std::exception);
    EXPECT_THROW(decode_attention(f, f, f, KvType::F16, b.as<int32_t>(), 16, 12, 8, 64, 1.0f, f, f, st()),
                 std::exception);
    EXPECT_THROW(decode_attention_rope(f, f, f, f, f, KvType::F16, b.as<int32_t>(), 16, 8, 8, 64, f, 66, false, 1.0f,
                                       f, f, st()),
                 std::exception);  // rope_dim > head_dim
    EXPECT_THROW(decode_attention_rope(f, nullptr, f, f, f, KvType::F16, b.as<int32_t>(), 16, 8, 8, 64, f, 64, false,
                                       1.0f, f, f, st()),
                 std::exception);
    EXPECT_THROW(get_row(DType::Q4_1, f, 1, 32, b.as<int32_t>(), f, st()), std::exception);
    EXPECT_THROW(swiglu_q8_1(f, f, f, nullptr, nullptr, 33, st()), std::exception);
}

}  // namespace
