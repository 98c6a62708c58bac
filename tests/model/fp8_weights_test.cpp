// fp8_per_channel_weights (--gpu-weights fp8 on the CPU side): which tensors
// become FP8, that every converted row is quantize_fp8_rows of the source
// row's values with its one scale in every block, that the rest is left as it
// was, and that the converted model runs close to the original.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <algorithm>
#include <vector>

#include "core/fp16.h"
#include "core/thread_pool.h"
#include "model/fp8_weights.h"
#include "model/model.h"
#include "model/synth.h"
#include "quant/blocks.h"
#include "quant/fp8.h"
#include "quant/reference.h"
#include "runtime/session.h"
#include "runtime/verify.h"

using namespace quern;

namespace {

TEST(Fp8Weights, WhichTensorsAreLayerMatrices) {
    for (const char* n : {"blk.0.attn_q.weight", "blk.12.attn_qkv.weight", "blk.3.attn_output.weight",
                          "blk.1.ffn_gate.weight", "blk.1.ffn_up.weight", "blk.1.ffn_down.weight",
                          "blk.2.ffn_gate_exps.weight", "blk.2.ffn_down_exps.weight", "blk.2.ffn_up.7.weight"})
        EXPECT_TRUE(is_fp8_layer_matrix(n)) << n;
    for (const char* n : {"token_embd.weight", "output.weight", "blk.0.ffn_gate_inp.weight", "blk.0.attn_norm.weight",
                          "blk.0.attn_q.bias", "blk.0.attn_q_norm.weight", "output_norm.weight", "rope_freqs.weight"})
        EXPECT_FALSE(is_fp8_layer_matrix(n)) << n;
}

TEST(Fp8Weights, RowsFollowTheCpuRecipeAndTheModelRuns) {
    ThreadPool pool(2);
    for (const char* preset : {"llama3-1b", "qwen3-30b-a3b"}) {
        SynthModel sm = make_synthetic(synth_tiny(synth_preset(preset)), "Q4_K_M", 31);
        auto model = Model::from_weights(sm.cfg, std::move(sm.weights));
        WeightStore f = fp8_per_channel_weights(model->weights(), pool);
        int converted = 0;
        for (const auto& [name, t] : model->weights().all()) {
            const Tensor* c = f.find(name);
            ASSERT_NE(c, nullptr) << name;
            EXPECT_EQ(c->ne, t.ne) << name;
            if (!is_fp8_layer_matrix(name)) {
                EXPECT_EQ(c->type, t.type) << name;
                EXPECT_EQ(c->data, t.data) << name;  // the same bytes, not a copy
                continue;
            }
            ++converted;
            ASSERT_EQ(c->type, DType::F8_E4M3_B32) << name;
            const int64_t K = t.ne[0], rows = t.nrows();
            std::vector<float> v(static_cast<size_t>(K));
            std::vector<uint8_t> q(static_cast<size_t>(K));
            for (int64_t r : {int64_t{0}, rows / 2, rows - 1}) {
                const int64_t i1 = r % t.ne[1], i2 = (r / t.ne[1]) % t.ne[2], i3 = r / (t.ne[1] * t.ne[2]);
                dequantize_row_ref(t.type, t.row(i1, i2, i3), v.data(), K);
                float scale = 0;
                quantize_fp8_rows(v.data(), 1, K, q.data(), &scale);
                const auto* b = reinterpret_cast<const block_f8_b32*>(static_cast<const uint8_t*>(c->data) +
                                                                      static_cast<size_t>(r) * c->row_bytes());
                for (int64_t j = 0; j < K / QK_F8; ++j) {
                    EXPECT_EQ(b[j].d, scale) << name << " row " << r;
                    EXPECT_EQ(0, std::memcmp(b[j].qs, q.data() + j * QK_F8, QK_F8)) << name << " row " << r;
                }
            }
        }
        EXPECT_GT(converted, 0) << preset;
        auto fm = Model::from_weights(model->config(), std::move(f));
        auto a = make_cpu_session(*model, 64, pool), b = make_cpu_session(*fm, 64, pool);
        std::vector<int32_t> ids(12);
        for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 41 + 3) % 500);
        const int64_t V = model->config().n_vocab;
        std::vector<float> la(static_cast<size_t>(V)), lb(la.size());
        a->eval(ids.data(), 12, la.data());
        b->eval(ids.data(), 12, lb.data());
        const double cs = cosine_similarity(la.data(), lb.data(), V);
        std::printf("%s: FP8 per-channel weights vs Q4_K_M logits cosine %.6f\n", preset, cs);
        EXPECT_GE(cs, 0.99) << preset;
    }
}

// The GPU FP8 prefill's activation recipe: every value is bf16(x) rounded to
// E4M3 under the row's scale absmax(bf16 row)/448 — within half an E4M3 step
// (2^-4 relative for normals; 2^-10 · scale for subnormals) of bf16(x) —
// and the row's largest value is kept exactly (it maps to 448).
TEST(Fp8Weights, ActivationRowsRoundToFp8PerRow) {
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t K = 96, rows = 3;
    std::vector<float> x(static_cast<size_t>(rows * K)), y(x.size());
    for (auto& v : x) v = nd(rng);
    x[7] = 1000.0f;            // an outlier: row 0's scale is set by it
    x[K + 3] = -50.0f;         // row 1 by this one
    for (int64_t k = 0; k < K; ++k) x[static_cast<size_t>(2 * K + k)] = 0.0f;  // an all-zero row
    round_fp8_activation_rows(x.data(), rows, K, y.data());
    for (int64_t r = 0; r < rows; ++r) {
        float amax = 0;
        for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(bf16_to_fp32(fp32_to_bf16(x[size_t(r * K + k)]))));
        const float scale = amax > 0 ? amax / 448.0f : 1.0f;
        for (int64_t k = 0; k < K; ++k) {
            const float b = bf16_to_fp32(fp32_to_bf16(x[size_t(r * K + k)])), v = y[size_t(r * K + k)];
            const double tol = std::max(std::fabs(b) * std::ldexp(1.0, -4), std::ldexp(1.0, -10) * scale) * 1.0001;
            EXPECT_LE(std::fabs(v - b), tol) << "row " << r << " col " << k;
            // On the grid: v / scale is an E4M3 value.
            EXPECT_EQ(fp8_e4m3_to_float(float_to_fp8_e4m3(v / scale)), v / scale) << "row " << r << " col " << k;
        }
    }
    EXPECT_EQ(y[7], bf16_to_fp32(fp32_to_bf16(1000.0f)));
    for (int64_t k = 0; k < K; ++k) EXPECT_EQ(y[size_t(2 * K + k)], 0.0f);
}

// ModelOptions::fp8_activation_rows: passes of at least that many rows round
// the FP8 products' activations (the logits move, slightly); smaller passes
// and models without FP8 matrices are untouched.
TEST(Fp8Weights, ActivationRoundingFollowsTheRowThreshold) {
    ThreadPool pool(2);
    SynthModel sm = make_synthetic(synth_tiny(synth_preset("llama3-1b")), "Q8_0", 37);
    auto model = Model::from_weights(sm.cfg, std::move(sm.weights));
    auto fm = Model::from_weights(model->config(), fp8_per_channel_weights(model->weights(), pool));
    const int64_t V = model->config().n_vocab;
    std::vector<int32_t> ids(10);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 29 + 7) % 500);
    const auto logits = [&](Model& m, int64_t threshold, int64_t n) {
        ModelOptions o = m.options();
        o.fp8_activation_rows = threshold;
        m.set_options(o);
        auto s = make_cpu_session(m, 64, pool);
        std::vector<float> l(static_cast<size_t>(V));
        s->eval(ids.data(), n, l.data());
        return l;
    };
    const auto plain = logits(*fm, 0, 10), rounded = logits(*fm, 8, 10), below = logits(*fm, 11, 10);
    const double c = cosine_similarity(plain.data(), rounded.data(), V);
    std::printf("FP8 activations vs float activations on FP8 weights: logits cosine %.7f\n", c);
    EXPECT_LT(c, 1.0 - 1e-9);
    EXPECT_GE(c, 0.99);
    EXPECT_EQ(plain, below);
    EXPECT_EQ(logits(*model, 0, 10), logits(*model, 8, 10));  // no FP8 matrices: nothing to round
}

}  // namespace
