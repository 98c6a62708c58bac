// Gemma from GGUF files: the tiny Gemma 2 / Gemma 3 checkpoints of
// tests/data/hf written as GGUF files the way llama.cpp's converter writes
// them (its key names; norm weights with Gemma's 1 already added; no
// rope_freqs tensor, the scaling given by keys) load to the same config and
// give transformers' logits. llama.cpp derives the query scale from head_dim
// and cannot express the fixtures' query_pre_attn_scalar, so that one value
// is checked and then replaced. Also: ModelConfig::from_hf_config's Gemma
// defaults and transformers 4.x keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/gguf.h"
#include "model/hf_model.h"
#include "runtime/verify.h"

using namespace quern;
namespace fs = std::filesystem;

namespace {

const std::string kDir = std::string(QUERN_SOURCE_DIR) + "/tests/data/hf/";

/// Writes `m` (a model loaded from a Hugging Face folder) as a GGUF file with
/// llama.cpp's Gemma keys; `pattern` is the sliding-window pattern of its layers.
void write_gguf(const Model& m, int64_t pattern, const std::string& path) {
    const ModelConfig& c = m.config();
    GgufWriter w;
    const std::string a = c.arch + ".";
    w.set_string("general.architecture", c.arch);
    w.set_u32(a + "embedding_length", static_cast<uint32_t>(c.n_embd));
    w.set_u32(a + "block_count", static_cast<uint32_t>(c.n_layer));
    w.set_u32(a + "attention.head_count", static_cast<uint32_t>(c.n_head));
    w.set_u32(a + "attention.head_count_kv", static_cast<uint32_t>(c.n_head_kv));
    w.set_u32(a + "feed_forward_length", static_cast<uint32_t>(c.n_ff));
    w.set_u32(a + "context_length", static_cast<uint32_t>(c.n_ctx_train));
    w.set_u32(a + "attention.key_length", static_cast<uint32_t>(c.head_dim));
    w.set_u32(a + "attention.value_length", static_cast<uint32_t>(c.head_dim));
    w.set_f32(a + "rope.freq_base", c.rope_base);
    w.set_f32(a + "attention.layer_norm_rms_epsilon", c.rms_eps);
    w.set_u32(a + "attention.sliding_window", static_cast<uint32_t>(c.sliding_window));
    w.set_u32(a + "attention.sliding_window_pattern", static_cast<uint32_t>(pattern));
    if (c.arch == "gemma2") {
        w.set_f32(a + "attn_logit_softcapping", c.attn_softcap);
        w.set_f32(a + "final_logit_softcapping", c.final_softcap);
    }
    if (!c.rope_freq_factors.empty()) {
        w.set_string(a + "rope.scaling.type", "linear");
        w.set_f32(a + "rope.scaling.factor", c.rope_freq_factors[0]);
    }
    for (const auto& [name, t] : m.weights().all()) {
        if (name == "rope_freqs.weight") continue;  // llama.cpp's Gemma files have none
        const int n_dims = t.ne[1] == 1 ? 1 : 2;
        w.add_tensor(name, t.type, t.ne, n_dims, t.data);
    }
    w.write(path);
}

struct Case {
    std::string arch;
    int64_t pattern;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.arch; }

class GemmaGguf : public ::testing::TestWithParam<Case> {};

TEST_P(GemmaGguf, SameConfigAndTransformersLogits) {
    const Case& cs = GetParam();
    auto hf = load_hf_model(kDir + cs.arch + "/fp32");
    const ModelConfig& h = hf->config();
    const fs::path path = fs::temp_directory_path() / ("quern_gemma_gguf_" + cs.arch + ".gguf");
    write_gguf(*hf, cs.pattern, path.string());
    auto file = std::make_shared<GgufFile>(path.string());
    ModelConfig g = ModelConfig::from_gguf(*file);
    EXPECT_EQ(g.arch, h.arch);
    EXPECT_EQ(g.swa_layers, h.swa_layers);
    EXPECT_EQ(g.sliding_window, h.sliding_window);
    EXPECT_EQ(g.embd_scale, h.embd_scale);
    EXPECT_EQ(g.attn_softcap, h.attn_softcap);
    EXPECT_EQ(g.final_softcap, h.final_softcap);
    EXPECT_EQ(g.rope_base, h.rope_base);
    EXPECT_EQ(g.rope_base_local > 0 ? g.rope_base_local : g.rope_base,
              h.rope_base_local > 0 ? h.rope_base_local : h.rope_base);
    EXPECT_EQ(g.rope_freq_factors, h.rope_freq_factors);
    EXPECT_EQ(g.rope_factors_global_only, h.rope_factors_global_only);
    EXPECT_EQ(g.qk_norm, h.qk_norm);
    EXPECT_TRUE(g.rope_neox);
    EXPECT_FLOAT_EQ(g.attn_scale, 1.0f / std::sqrt(static_cast<float>(g.head_dim)));  // llama.cpp's rule
    g.attn_scale = h.attn_scale;  // the fixture's query_pre_attn_scalar

    // The file's weights, as Model::from_gguf binds them (the scaling keys'
    // factors come with the config).
    auto from_file = Model::from_gguf(file);
    WeightStore ws;
    for (const auto& [name, t] : from_file->weights().all()) {
        Tensor copy = t;
        ws.add(copy, std::shared_ptr<const void>(file, nullptr));
    }
    auto model = Model::from_weights(g, std::move(ws));

    std::ifstream jf(kDir + cs.arch + "/golden.json");
    const auto meta = nlohmann::json::parse(jf);
    const auto tokens = meta["tokens"].get<std::vector<int32_t>>();
    const int64_t n = static_cast<int64_t>(tokens.size()), V = meta["n_vocab"].get<int64_t>();
    std::ifstream lf(kDir + cs.arch + "/fp32.logits", std::ios::binary);
    std::vector<float> ref(static_cast<size_t>(n * V));
    lf.read(reinterpret_cast<char*>(ref.data()), static_cast<std::streamsize>(ref.size() * 4));
    ThreadPool pool(2);
    KvCache cache = model->make_cache(n);
    std::vector<float> out(static_cast<size_t>(n * V));
    model->forward(tokens.data(), n, cache, out.data(), true, pool);
    for (int64_t t = 0; t < n; ++t) {
        const float* a = out.data() + t * V;
        const float* b = ref.data() + t * V;
        EXPECT_GE(cosine_similarity(a, b, V), 0.9999) << "position " << t;
        EXPECT_EQ(std::max_element(a, a + V) - a, std::max_element(b, b + V) - b) << "position " << t;
    }
    fs::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GemmaGguf, ::testing::Values(Case{"gemma2", 2}, Case{"gemma3", 3}),
                         [](const auto& info) { return info.param.arch; });

ModelConfig hf(const std::string& json) { return ModelConfig::from_hf_config(json, "config.json"); }

const char* kBase = R"("vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 12,
                       "num_attention_heads": 4, "num_key_value_heads": 1)";

TEST(GemmaHfConfig, DefaultsAndPatterns) {
    // Gemma 3 in transformers 4.x terms: sliding_window_pattern, rope_local_base_freq, rope_scaling.
    const ModelConfig g3 = hf(std::string("{") + kBase + R"(, "model_type": "gemma3_text", "sliding_window": 512,
        "sliding_window_pattern": 6, "rope_local_base_freq": 10000.0, "rope_theta": 1000000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0}})");
    EXPECT_EQ(g3.arch, "gemma3");
    EXPECT_EQ(g3.head_dim, 256);  // Gemma's default
    EXPECT_TRUE(g3.tie_embeddings && g3.qk_norm);
    for (int il = 0; il < 12; ++il) EXPECT_EQ(g3.window(il), il % 6 == 5 ? 0 : 512) << il;
    EXPECT_FLOAT_EQ(g3.rope_base, 1e6f);
    EXPECT_FLOAT_EQ(g3.rope_base_local, 1e4f);
    EXPECT_TRUE(g3.rope_factors_global_only);
    ASSERT_FALSE(g3.rope_freq_factors.empty());
    EXPECT_FLOAT_EQ(g3.rope_freq_factors[0], 8.0f);
    EXPECT_FLOAT_EQ(g3.attn_scale, 1.0f / 16.0f);  // query_pre_attn_scalar 256
    EXPECT_EQ(g3.attn_softcap, 0.0f);
    EXPECT_EQ(g3.final_softcap, 0.0f);
    EXPECT_FLOAT_EQ(g3.embd_scale, std::sqrt(32.0f));

    // Gemma 2: alternating layers from index 0, soft-capping on by default.
    const ModelConfig g2 = hf(std::string("{") + kBase + R"(, "model_type": "gemma2", "head_dim": 8,
        "query_pre_attn_scalar": 144})");
    for (int il = 0; il < 12; ++il) EXPECT_EQ(g2.window(il), il % 2 == 0 ? 4096 : 0) << il;
    EXPECT_FLOAT_EQ(g2.attn_softcap, 50.0f);
    EXPECT_FLOAT_EQ(g2.final_softcap, 30.0f);
    EXPECT_FLOAT_EQ(g2.attn_scale, 1.0f / 12.0f);
    EXPECT_EQ(g2.rope_base_local, 0.0f);  // one base for both layer types
    // null soft-capping switches it off
    EXPECT_EQ(hf(std::string("{") + kBase + R"(, "model_type": "gemma2", "attn_logit_softcapping": null})").attn_softcap,
              0.0f);
}

TEST(GemmaHfConfig, ErrorsNameTheKey) {
    auto err = [](const std::string& extra) {
        try {
            hf(std::string("{") + kBase + ", " + extra + "}");
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    EXPECT_NE(err(R"("model_type": "gemma3")").find("gemma3_text"), std::string::npos);
    EXPECT_NE(err(R"("model_type": "gemma2", "hidden_activation": "relu")").find("hidden_activation"),
              std::string::npos);
    EXPECT_NE(err(R"("model_type": "gemma2", "layer_types": ["sliding_attention"])").find("layer_types"),
              std::string::npos);
    EXPECT_NE(err(R"("model_type": "gemma3_text", "use_bidirectional_attention": true)").find("bidirectional"),
              std::string::npos);
    EXPECT_NE(err(R"("model_type": "gemma2", "sliding_window": 0)").find("sliding_window"), std::string::npos);
}

}  // namespace
