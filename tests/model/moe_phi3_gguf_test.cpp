// Mixtral, Qwen3-MoE and Phi-3 from GGUF files: the tiny fp32 checkpoints of
// tests/data/hf written as GGUF files with llama.cpp's architecture names,
// keys and tensor layouts — Mixtral as arch "llama" with expert_count /
// expert_used_count, q/k rows permuted for llama's interleaved RoPE, experts
// stacked into 3-D blk.N.ffn_{gate,up,down}_exps (ne = {in, out, expert});
// Qwen3-MoE as "qwen3moe" with expert_feed_forward_length; Phi-3 as "phi3"
// with fused attn_qkv and gate/up in ffn_up; dense Qwen2 (q/k/v biases) and
// Qwen3 (q/k norms) as "qwen2" / "qwen3" — give transformers' logits at
// every position. Also: routing itself (softmax, top-k, renormalisation,
// grouping by expert) and the refusals of what quern does not compute.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/error.h"
#include "formats/gguf.h"
#include "model/hf_model.h"
#include "runtime/verify.h"
#include "backend/cpu/moe_route.h"

using namespace quern;
namespace fs = std::filesystem;

namespace {

const std::string kDir = std::string(QUERN_SOURCE_DIR) + "/tests/data/hf/";

/// Writes `m` (an fp32 model loaded from a Hugging Face folder) as a GGUF
/// file the way llama.cpp's converter lays it out; keeps the buffers it made
/// in `bufs` until written.
void write_gguf(const Model& m, const std::string& path) {
    const ModelConfig& c = m.config();
    GgufWriter w;
    const std::string a = c.arch + ".";
    w.set_string("general.architecture", c.arch);
    w.set_u32(a + "embedding_length", static_cast<uint32_t>(c.n_embd));
    w.set_u32(a + "block_count", static_cast<uint32_t>(c.n_layer));
    w.set_u32(a + "attention.head_count", static_cast<uint32_t>(c.n_head));
    w.set_u32(a + "attention.head_count_kv", static_cast<uint32_t>(c.n_head_kv));
    w.set_u32(a + "feed_forward_length", static_cast<uint32_t>(c.moe() && c.arch == "llama" ? c.n_ff_exp : c.n_ff));
    w.set_u32(a + "context_length", static_cast<uint32_t>(c.n_ctx_train));
    w.set_u32(a + "attention.key_length", static_cast<uint32_t>(c.head_dim));
    w.set_u32(a + "attention.value_length", static_cast<uint32_t>(c.head_dim));
    w.set_u32(a + "rope.dimension_count", static_cast<uint32_t>(c.rope_dim));
    w.set_f32(a + "rope.freq_base", c.rope_base);
    w.set_f32(a + "attention.layer_norm_rms_epsilon", c.rms_eps);
    if (c.sliding_window > 0) w.set_u32(a + "attention.sliding_window", static_cast<uint32_t>(c.sliding_window));
    if (c.moe()) {
        w.set_u32(a + "expert_count", static_cast<uint32_t>(c.n_expert));
        w.set_u32(a + "expert_used_count", static_cast<uint32_t>(c.n_expert_used));
        if (c.arch == "qwen3moe") w.set_u32(a + "expert_feed_forward_length", static_cast<uint32_t>(c.n_ff_exp));
        if (!c.expert_weights_norm) w.set_bool(a + "expert_weights_norm", false);
    }
    static std::vector<std::vector<float>> bufs;
    bufs.clear();
    bufs.reserve(m.weights().size());
    const std::regex expert(R"(blk\.(\d+)\.ffn_(gate|up|down)\.(\d+)\.weight)");
    for (const auto& [name, t] : m.weights().all()) {
        ASSERT_EQ(t.type, DType::F32) << name;
        std::smatch sm;
        if (std::regex_match(name, sm, expert)) {
            if (sm[3] != "0") continue;
            // Stack expert 0..X-1 into one 3-D tensor.
            const std::string stem = "blk." + sm[1].str() + ".ffn_" + sm[2].str();
            const int64_t per = t.nelements();
            auto& b = bufs.emplace_back(static_cast<size_t>(per * c.n_expert));
            for (int64_t e = 0; e < c.n_expert; ++e) {
                const Tensor* te = m.weights().find(stem + "." + std::to_string(e) + ".weight");
                ASSERT_NE(te, nullptr);
                std::memcpy(b.data() + e * per, te->data, static_cast<size_t>(per) * 4);
            }
            w.add_tensor(stem + "_exps.weight", DType::F32, {t.ne[0], t.ne[1], c.n_expert, 1}, 3, b.data());
            continue;
        }
        const bool qk = name.find("attn_q.weight") != std::string::npos || name.find("attn_k.weight") != std::string::npos;
        if (c.arch == "llama" && qk) {
            // llama.cpp's converter permutes q/k rows for the interleaved RoPE of
            // the llama architecture: row (h, 2i) = HF row (h, i), (h, 2i+1) = (h, i + d/2).
            auto& b = bufs.emplace_back(static_cast<size_t>(t.nelements()));
            const int64_t d = c.head_dim, K = t.ne[0];
            for (int64_t r = 0; r < t.ne[1]; ++r) {
                const int64_t h = r / d, j = r % d;
                const int64_t src = h * d + (j % 2 == 0 ? j / 2 : j / 2 + d / 2);
                std::memcpy(b.data() + r * K, static_cast<const float*>(t.data) + src * K, static_cast<size_t>(K) * 4);
            }
            w.add_tensor(name, DType::F32, t.ne, 2, b.data());
            continue;
        }
        w.add_tensor(name, DType::F32, t.ne, t.ne[1] == 1 ? 1 : 2, t.data);
    }
    w.write(path);
}

class MoePhi3Gguf : public ::testing::TestWithParam<std::string> {};

TEST_P(MoePhi3Gguf, LogitsMatchTransformers) {
    const std::string arch = GetParam();
    const nlohmann::json meta = nlohmann::json::parse(std::ifstream(kDir + arch + "/golden.json"));
    const auto tokens = meta["tokens"].get<std::vector<int32_t>>();
    const int64_t V = meta["n_vocab"].get<int64_t>(), n = static_cast<int64_t>(tokens.size());
    std::vector<float> ref(static_cast<size_t>(n * V));
    std::ifstream(kDir + arch + "/fp32.logits", std::ios::binary)
        .read(reinterpret_cast<char*>(ref.data()), static_cast<std::streamsize>(ref.size() * 4));

    auto hf = load_hf_model(kDir + arch + "/fp32");
    const fs::path path = fs::temp_directory_path() / ("quern_" + arch + "_" + std::to_string(::getpid()) + ".gguf");
    write_gguf(*hf, path.string());
    auto m = Model::from_gguf(std::make_shared<GgufFile>(path.string()));
    fs::remove(path);
    const ModelConfig &a = m->config(), &b = hf->config();
    EXPECT_EQ(a.arch, b.arch);
    EXPECT_EQ(a.n_expert, b.n_expert);
    EXPECT_EQ(a.n_expert_used, b.n_expert_used);
    EXPECT_EQ(a.n_ff_exp, b.n_ff_exp);
    EXPECT_EQ(a.expert_weights_norm, b.expert_weights_norm);
    EXPECT_EQ(a.rope_dim, b.rope_dim);
    EXPECT_EQ(a.qk_norm, b.qk_norm);
    EXPECT_EQ(a.qkv_bias, b.qkv_bias);
    EXPECT_EQ(a.window(0), b.window(0));
    EXPECT_EQ(a.rope_neox, arch != "mixtral");

    ThreadPool pool(2);
    KvCache cache = m->make_cache(64);
    std::vector<float> out(static_cast<size_t>(n * V));
    m->forward(tokens.data(), n, cache, out.data(), true, pool);
    for (int64_t t = 0; t < n; ++t)
        EXPECT_GE(cosine_similarity(out.data() + t * V, ref.data() + t * V, V), 0.9999) << arch << " position " << t;
}

INSTANTIATE_TEST_SUITE_P(Archs, MoePhi3Gguf, ::testing::Values("mixtral", "qwen3_moe", "phi3", "qwen2", "qwen3"));

TEST(MoeRouting, SoftmaxTopKAndRenormalisation) {
    // Logits of 2 rows over 4 experts.
    const float logits[8] = {1.0f, 3.0f, 2.0f, 0.0f, 0.5f, 0.5f, -1.0f, 0.5f};
    int32_t ex[4];
    float w[4];
    moe_route(logits, 2, 4, 2, false, ex, w);
    const double z = std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + 1.0;
    EXPECT_EQ(ex[0], 1);
    EXPECT_EQ(ex[1], 2);
    EXPECT_NEAR(w[0], std::exp(3.0) / z, 1e-6);
    EXPECT_NEAR(w[1], std::exp(2.0) / z, 1e-6);
    EXPECT_EQ(ex[2], 0);  // ties: the lower index first
    EXPECT_EQ(ex[3], 1);
    moe_route(logits, 2, 4, 2, true, ex, w);
    EXPECT_NEAR(w[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);  // softmax over the two chosen logits
    EXPECT_NEAR(w[0] + w[1], 1.0, 1e-6);
    EXPECT_NEAR(w[2], 0.5, 1e-6);
    std::vector<int64_t> off, ent;
    moe_group(ex, 2, 2, 4, off, ent);
    EXPECT_EQ(off, (std::vector<int64_t>{0, 1, 3, 4, 4}));
    EXPECT_EQ(ent, (std::vector<int64_t>{2, 0, 3, 1}));
}

TEST(MoeConfig, RefusalsNameTheKey) {
    auto err = [](const std::string& j) {
        try {
            ModelConfig::from_hf_config(j, "c/config.json");
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    const std::string base = R"("vocab_size": 256, "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2)";
    EXPECT_NE(err(R"({"model_type": "phi3", )" + base +
                  R"(, "rope_scaling": {"type": "longrope", "short_factor": [1], "long_factor": [1]}})")
                  .find("LongRoPE"),
              std::string::npos);
    EXPECT_NE(err(R"({"model_type": "qwen3_moe", )" + base +
                  R"(, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "mlp_only_layers": [1]})")
                  .find("mlp_only_layers"),
              std::string::npos);
    EXPECT_NE(err(R"({"model_type": "mixtral", )" + base + R"(, "num_local_experts": 2, "num_experts_per_tok": 3})")
                  .find("num_experts_per_tok"),
              std::string::npos);
    // Qwen3-30B-A3B's config.
    const ModelConfig q = ModelConfig::from_hf_config(
        R"({"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
            "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
            "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": true,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
            "tie_word_embeddings": false, "use_sliding_window": false})",
        "q/config.json");
    EXPECT_EQ(q.arch, "qwen3moe");
    EXPECT_EQ(q.n_expert, 128);
    EXPECT_EQ(q.n_expert_used, 8);
    EXPECT_EQ(q.n_ff_exp, 768);
    EXPECT_TRUE(q.expert_weights_norm);
    EXPECT_TRUE(q.qk_norm);
}

}  // namespace
