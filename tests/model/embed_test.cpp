// Embeddings (runtime/embed.h): the embedding program's hidden rows are the
// rows after the output norm — projected by the model's output matrix (and
// soft-capped, Gemma 2) they give transformers' golden logits at every
// position (tests/data/hf, made by
// tools/make_hf_golden.py) — and embed() pools them (last, mean, cls) into
// unit vectors.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "backend/cpu/executor.h"
#include "hf_test_util.h"
#include "quant/reference.h"
#include "runtime/embed.h"
#include "runtime/session.h"

using namespace quern;
using namespace quern::hf_test;

namespace {

class Embed : public ::testing::TestWithParam<const char*> {};

TEST_P(Embed, HiddenRowsGiveTransformersLogitsAndPoolToUnitVectors) {
    const std::string arch = GetParam();
    std::ifstream jf(kDir + arch + "/golden.json");
    const auto meta = nlohmann::json::parse(jf);
    const auto tokens = meta["tokens"].get<std::vector<int32_t>>();
    const int64_t n = static_cast<int64_t>(tokens.size()), V = meta["n_vocab"].get<int64_t>();
    const std::vector<float> ref = read_logits(kDir + arch + "/fp32.logits");
    auto model = load_hf_model(kDir + arch + "/" + meta["checkpoints"]["fp32"]["folder"].get<std::string>());
    const int64_t E = model->config().n_embd;
    ThreadPool pool(2);
    auto session = make_executor_session(*model, cpu::make_executor(model->embedding_program(), model->options(), pool), n);
    std::vector<float> rows(static_cast<size_t>(n * E));
    session->eval_rows(tokens.data(), n, nullptr, false, rows.data());
    // The output matrix (or the tied embeddings), as floats.
    const Tensor* out = model->weights().find("output.weight");
    if (!out) out = model->weights().find("token_embd.weight");
    ASSERT_NE(out, nullptr);
    ASSERT_EQ(out->ne[0], E);
    std::vector<float> w(static_cast<size_t>(V * E));
    for (int64_t v = 0; v < V; ++v) dequantize_row_ref(out->type, out->row<uint8_t>(v), w.data() + v * E, E);
    const float scale = meta.contains("logit_scale") ? meta["logit_scale"].get<float>() : 1.0f;
    double worst = 1.0;
    for (int64_t t = 0; t < n; ++t) {
        double dot = 0, a2 = 0, b2 = 0;
        for (int64_t v = 0; v < V; ++v) {
            double l = 0;
            for (int64_t i = 0; i < E; ++i) l += static_cast<double>(w[static_cast<size_t>(v * E + i)]) * rows[static_cast<size_t>(t * E + i)];
            l *= scale;
            const double cap = model->config().final_softcap;  // Gemma 2's logit soft-cap
            if (cap > 0) l = cap * std::tanh(l / cap);
            const double r = ref[static_cast<size_t>(t * V + v)];
            dot += l * r;
            a2 += l * l;
            b2 += r * r;
        }
        worst = std::min(worst, dot / std::sqrt(a2 * b2));
    }
    EXPECT_GT(worst, 0.9999) << arch;
    // Pooled: unit length; last and cls are their rows normalized; mean the
    // rows' average normalized.
    for (Pooling p : {Pooling::Last, Pooling::Mean, Pooling::Cls}) {
        const std::vector<float> e = embed(*model, tokens, p, pool);
        ASSERT_EQ(static_cast<int64_t>(e.size()), E);
        std::vector<double> want(static_cast<size_t>(E), 0.0);
        for (int64_t t = 0; t < n; ++t) {
            if ((p == Pooling::Last && t != n - 1) || (p == Pooling::Cls && t != 0)) continue;
            for (int64_t i = 0; i < E; ++i) want[static_cast<size_t>(i)] += rows[static_cast<size_t>(t * E + i)];
        }
        double norm = 0, len = 0;
        for (double x : want) norm += x * x;
        for (int64_t i = 0; i < E; ++i) {
            EXPECT_NEAR(e[static_cast<size_t>(i)], want[static_cast<size_t>(i)] / std::sqrt(norm), 1e-4) << arch << " " << i;
            len += static_cast<double>(e[static_cast<size_t>(i)]) * e[static_cast<size_t>(i)];
        }
        EXPECT_NEAR(len, 1.0, 1e-5);
    }
    EXPECT_THROW(embed(*model, {}, Pooling::Last, pool), Error);
}

INSTANTIATE_TEST_SUITE_P(Archs, Embed, ::testing::Values("llama", "qwen3", "gemma2", "qwen3_5"),
                         [](const auto& info) { return std::string(info.param); });

TEST(Embed, PoolingAsTheModelDeclares) {
    ModelConfig c;
    EXPECT_EQ(pooling_of(c), Pooling::Last);  // unset: a decoder's last row
    c.pooling_type = 1;
    EXPECT_EQ(pooling_of(c), Pooling::Mean);
    c.pooling_type = 2;
    EXPECT_EQ(pooling_of(c), Pooling::Cls);
    c.pooling_type = 3;
    EXPECT_EQ(pooling_of(c), Pooling::Last);
}

}  // namespace
