// gpt-oss on the CPU: the tiny random checkpoint of tests/data/hf/gpt_oss
// (tools/make_hf_golden.py: 4 layers alternating a 32-position window and
// full attention, sinks, YaRN, 8 biased experts with the clamped SwiGLU, 300
// tokens) as llama.cpp's converter writes it (tools/make_llamacpp_gguf.py:
// F32, and with the experts in MXFP4) against transformers' logits with
// llama.cpp's YaRN (truncated correction range); decoding token by token and
// the greedy continuation against transformers'; the synthetic presets'
// GGUF round trip. hf_golden_test.cpp has the Hugging Face folders.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "hf_test_util.h"
#include "model/hf_model.h"
#include "model/model.h"
#include "model/synth.h"
#include "runtime/session.h"
#include "runtime/verify.h"

using namespace quern;
using namespace quern::hf_test;
namespace fs = std::filesystem;

namespace {

nlohmann::json golden() {
    std::ifstream in(kDir + "gpt_oss/golden.json");
    return nlohmann::json::parse(in);
}

/// A GGUF file llama.cpp's converter wrote ("fp32" or "mxfp4"), its
/// reference logits (llama.cpp's YaRN) and the prompt.
struct GgufCase {
    std::unique_ptr<Model> model;
    std::vector<float> ref;
    std::vector<int32_t> tokens;
};

GgufCase load_gguf(const std::string& variant) {
    const nlohmann::json meta = golden();
    GgufCase c;
    c.tokens = meta["tokens"].get<std::vector<int32_t>>();
    c.ref = read_logits(kDir + "gpt_oss/" + meta["llamacpp_references"][variant].get<std::string>());
    c.model = Model::from_gguf(std::make_shared<GgufFile>(kDir + "gpt_oss/llamacpp-" + variant + ".gguf"));
    return c;
}

class GptOssGguf : public ::testing::TestWithParam<std::string> {};

TEST_P(GptOssGguf, LlamaCppFileMatchesTransformersAtEveryPosition) {
    GgufCase c = load_gguf(GetParam());
    const ModelConfig& cfg = c.model->config();
    EXPECT_EQ(cfg.arch, "gpt-oss");
    EXPECT_EQ(cfg.sliding_window, 32);
    EXPECT_EQ(cfg.window(0), 32);
    EXPECT_EQ(cfg.window(1), 0);
    EXPECT_FLOAT_EQ(cfg.rope_yarn_factor, 8.0f);
    if (GetParam() == "mxfp4") {
        const Tensor* t = c.model->weights().find("blk.0.ffn_gate_exps.weight");
        ASSERT_NE(t, nullptr);
        EXPECT_EQ(t->type, DType::MXFP4);
    }
    const int64_t n = static_cast<int64_t>(c.tokens.size()), V = cfg.n_vocab;
    ASSERT_EQ(n, 300);
    ThreadPool pool(2);
    KvCache cache = c.model->make_cache(n);
    std::vector<float> out(static_cast<size_t>(n * V));
    c.model->forward(c.tokens.data(), n, cache, out.data(), true, pool);
    double worst = 1.0;
    for (int64_t t = 0; t < n; ++t) {
        const double cs = cosine_similarity(out.data() + t * V, c.ref.data() + t * V, V);
        worst = std::min(worst, cs);
        EXPECT_GE(cs, 0.9999) << "position " << t;
        EXPECT_EQ(argmax(out.data() + t * V, V), argmax(c.ref.data() + t * V, V)) << "position " << t;
    }
    std::printf("gpt-oss llama.cpp %s GGUF: worst cosine 1 - %.2e\n", GetParam().c_str(), 1.0 - worst);
}

// Token by token (the decode path: one row per call, the sliding window
// reaching back over the cache) gives the one-pass logits.
TEST_P(GptOssGguf, DecodeTokenByTokenMatches) {
    GgufCase c = load_gguf(GetParam());
    const int64_t n = static_cast<int64_t>(c.tokens.size()), V = c.model->config().n_vocab;
    ThreadPool pool(2);
    auto s = make_cpu_session(*c.model, n, pool);
    std::vector<float> l(static_cast<size_t>(V));
    for (int64_t t = 0; t < n; ++t) {
        s->eval(&c.tokens[static_cast<size_t>(t)], 1, l.data());
        if (t % 23 != 0 && t != n - 1) continue;
        const float* r = c.ref.data() + t * V;
        EXPECT_GE(cosine_similarity(l.data(), r, V), 0.9999) << "position " << t;
        EXPECT_EQ(argmax(l.data(), V), argmax(r, V)) << "position " << t;
    }
}

INSTANTIATE_TEST_SUITE_P(Files, GptOssGguf, ::testing::Values("fp32", "mxfp4"),
                         [](const auto& info) { return info.param; });

// transformers' greedy continuation of the prompt (its YaRN untruncated, as
// the checkpoint's config asks): 16 tokens from the Hugging Face folder.
TEST(GptOss, GreedyContinuationIsTransformers) {
    const nlohmann::json meta = golden();
    const auto tokens = meta["tokens"].get<std::vector<int32_t>>();
    const auto want = meta["greedy"].get<std::vector<int32_t>>();
    auto model = load_hf_model(kDir + "gpt_oss/fp32");
    ThreadPool pool(2);
    auto s = make_cpu_session(*model, 512, pool);
    std::vector<float> l(static_cast<size_t>(model->config().n_vocab));
    s->eval(tokens.data(), static_cast<int64_t>(tokens.size()), l.data());
    std::vector<int32_t> got{static_cast<int32_t>(argmax(l.data(), static_cast<int64_t>(l.size())))};
    while (got.size() < want.size()) got.push_back(s->eval_greedy(got.back()));
    EXPECT_EQ(got, want);
}

// The Hugging Face folder and llama.cpp's GGUF of one checkpoint load the same
// expert banks: llama.cpp's converter splits the interleaved gate|up columns
// and transposes them, quern's loader does the same from the checkpoint.
TEST(GptOss, CheckpointAndGgufHoldTheSameExperts) {
    auto hf = load_hf_model(kDir + "gpt_oss/mxfp4");
    auto gg = Model::from_gguf(std::make_shared<GgufFile>(kDir + "gpt_oss/llamacpp-mxfp4.gguf"));
    for (const char* name : {"blk.1.ffn_gate_exps.weight", "blk.1.ffn_up_exps.weight", "blk.3.ffn_down_exps.weight",
                             "blk.2.ffn_up_exps.bias", "blk.0.ffn_down_exps.bias"}) {
        const Tensor* a = hf->weights().find(name);
        const Tensor* b = gg->weights().find(name);
        ASSERT_TRUE(a && b) << name;
        EXPECT_EQ(a->type, b->type) << name;
        for (int d = 0; d < 4; ++d) EXPECT_EQ(a->ne[d], b->ne[d]) << name;
        EXPECT_EQ(std::memcmp(a->data, b->data, a->nbytes()), 0) << name;
    }
}

// The synthetic presets: the real shapes, and a tiny MXFP4_MOE file that
// reads back to the same config (YaRN divisors and the window pattern
// included) and types (experts MXFP4, matrices Q8_0, biases and sinks F32).
TEST(GptOss, SyntheticPresetRoundTrips) {
    const SynthPreset& p = synth_preset("gpt-oss-20b");
    EXPECT_EQ(p.cfg.n_layer, 24);
    EXPECT_EQ(p.cfg.n_expert, 32);
    EXPECT_EQ(synth_preset("gpt-oss-120b").cfg.n_expert, 128);
    const SynthPreset tiny = synth_tiny(p);
    const SynthModel m = make_synthetic(tiny, "MXFP4_MOE", 7);
    const fs::path path = fs::temp_directory_path() / "quern_gpt_oss_tiny.gguf";
    write_synthetic_gguf(m, path.string());
    auto model = Model::from_gguf(std::make_shared<GgufFile>(path.string()));
    const ModelConfig& c = model->config();
    EXPECT_EQ(c.arch, "gpt-oss");
    EXPECT_EQ(c.swa_layers, tiny.cfg.swa_layers);
    EXPECT_EQ(c.rope_freq_factors, tiny.cfg.rope_freq_factors);
    EXPECT_FLOAT_EQ(c.rope_attn_factor, tiny.cfg.rope_attn_factor);
    EXPECT_FLOAT_EQ(c.qk_scale(), tiny.cfg.qk_scale());
    EXPECT_EQ(model->weights().find("blk.0.ffn_down_exps.weight")->type, DType::MXFP4);
    EXPECT_EQ(model->weights().find("blk.0.attn_q.weight")->type, DType::Q8_0);
    EXPECT_EQ(model->weights().find("blk.0.attn_sinks.weight")->type, DType::F32);
    ThreadPool pool(2);
    KvCache cache = model->make_cache(16);
    const std::vector<int32_t> ids{1, 2, 3, 4, 5, 6, 7, 8};
    std::vector<float> out(static_cast<size_t>(c.n_vocab));
    model->forward(ids.data(), 8, cache, out.data(), false, pool);
    for (float v : out) ASSERT_TRUE(std::isfinite(v));
    fs::remove(path);
}

}  // namespace
