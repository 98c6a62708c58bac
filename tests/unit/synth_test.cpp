// Synthetic models: llama.cpp's Q4_K_M tensor choices, a GGUF file that the
// `gguf` Python package reads back identically, and a model that runs; for
// every preset a test-sized copy whose file has the preset's config, only
// keys and tensor names llama.cpp's tables know, computes what the in-memory
// model computes, and fails to load, naming it, without its architecture's
// telltale tensor.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "quant/reference.h"

using namespace quern;

TEST(Synth, Q4KMTypesFollowLlamaCpp) {
    // 30 layers: use_more_bits(i) for i < 3, i >= 26, (i - 3) % 3 == 2
    EXPECT_EQ(synth_tensor_type("Q4_K_M", "blk.0.attn_v.weight", 0, 30, 1536), DType::Q6_K);
    EXPECT_EQ(synth_tensor_type("Q4_K_M", "blk.4.attn_v.weight", 4, 30, 1536), DType::Q4_K);
    EXPECT_EQ(synth_tensor_type("Q4_K_M", "blk.5.ffn_down.weight", 5, 30, 1536), DType::Q6_K);
    EXPECT_EQ(synth_tensor_type("Q4_K_M", "blk.29.ffn_down.weight", 29, 30, 1536), DType::Q6_K);
    EXPECT_EQ(synth_tensor_type("Q4_K_M", "blk.10.attn_q.weight", 10, 30, 4096), DType::Q4_K);
    EXPECT_EQ(synth_tensor_type("Q4_K_M", "output.weight", -1, 30, 4096), DType::Q6_K);
    // rows that are not whole 256-blocks fall back as llama.cpp does
    EXPECT_EQ(synth_tensor_type("Q4_K_M", "blk.10.attn_q.weight", 10, 30, 576), DType::Q5_0);
    EXPECT_EQ(synth_tensor_type("Q4_K_M", "output.weight", -1, 30, 576), DType::Q8_0);
    EXPECT_EQ(synth_tensor_type("Q8_0", "blk.1.ffn_up.weight", 1, 30, 576), DType::Q8_0);
    EXPECT_THROW(synth_tensor_type("Q9_Z", "x", 0, 1, 256), Error);
    EXPECT_THROW(synth_preset("nope"), Error);
}

// Scheme names in any case; a GGUF file is offered only what it can hold.
TEST(Synth, SchemeNames) {
    EXPECT_EQ(synth_scheme("q4_k_m", true), "Q4_K_M");
    EXPECT_EQ(synth_scheme("f32", true), "F32");
    EXPECT_EQ(synth_scheme("Bf16", true), "BF16");
    EXPECT_EQ(synth_scheme("nvfp4", false), "NVFP4");
    EXPECT_EQ(synth_tensor_type("q4_k_m", "output.weight", -1, 30, 4096), DType::Q6_K);
    EXPECT_EQ(synth_tensor_type("f32", "blk.1.ffn_up.weight", 1, 30, 576), DType::F32);
    EXPECT_EQ(synth_file_type("q5_k_m"), 17u);
    auto message = [](const std::string& scheme, bool gguf) -> std::string {
        try {
            synth_scheme(scheme, gguf);
        } catch (const Error& e) {
            return e.what();
        }
        return "";
    };
    for (const char* bad : {"Q9_Z", "Q8_K", "Q8_1", "F8_E4M3_B32", "nvfp4"}) {
        const std::string m = message(bad, true);
        ASSERT_FALSE(m.empty()) << bad;
        EXPECT_NE(m.find("Q4_K_M"), std::string::npos) << m;
        EXPECT_NE(m.find("F32"), std::string::npos) << m;
        EXPECT_EQ(m.find("NVFP4,"), std::string::npos) << m;  // not offered (named only when asked for)
        EXPECT_EQ(m.find("F8_E4M3_B32,"), std::string::npos) << m;
    }
    EXPECT_NE(message("nvfp4", true).find("a GGUF file cannot hold"), std::string::npos);
    const std::string mem = message("Q9_Z", false);
    EXPECT_NE(mem.find("F8_E4M3_B32, NVFP4"), std::string::npos) << mem;
}

TEST(Synth, FileReadsBackInGgufPythonAndRuns) {
    const auto dir = std::filesystem::temp_directory_path() / ("quern-synth-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "smollm2-q4km.gguf").string();
    SynthModel m = make_synthetic(synth_preset("smollm2-135m"), "Q4_K_M", 7);
    write_synthetic_gguf(m, path);

    GgufFile f(path);
    EXPECT_EQ(f.tensors().size(), m.order.size());
    EXPECT_EQ(f.get_int("llama.block_count"), 30);
    EXPECT_EQ(f.get_int("general.file_type"), 15);
    EXPECT_EQ(static_cast<int64_t>(f.get_string_array("tokenizer.ggml.tokens").size()), 49152);

    // Independent reader: the gguf package.
    if (std::system("python3 -c 'import gguf, numpy' 2>/dev/null") == 0) {
        const std::string out = (dir / "summary.json").string();
        const std::string cmd = std::string("python3 ") + QUERN_SOURCE_DIR + "/tests/python/synth_check.py " + path + " > " + out;
        ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
        std::ifstream in(out);
        const auto j = nlohmann::json::parse(in);
        EXPECT_EQ(j["arch"], "llama");
        EXPECT_EQ(j["block_count"], 30);
        EXPECT_EQ(j["n_vocab_tokens"], 49152);
        ASSERT_EQ(j["tensors"].size(), m.order.size());
        std::vector<float> row;
        for (const auto& info : f.tensors()) {
            const auto& t = j["tensors"][info.name];
            EXPECT_EQ(t["type"].get<int>(), static_cast<int>(info.type)) << info.name;
            EXPECT_EQ(t["ne"][0].get<int64_t>(), info.ne[0]) << info.name;
            row.resize(static_cast<size_t>(info.ne[0]));
            dequantize_row_ref(info.type, f.data(info), row.data(), info.ne[0]);
            double sum = 0;
            for (float v : row) sum += v;
            EXPECT_NEAR(t["row0_sum"].get<double>(), sum, 1e-6 * (1 + std::fabs(sum))) << info.name;
        }
    } else if (std::getenv("CI")) {
        ADD_FAILURE() << "python3 with gguf and numpy is needed in CI";
    }

    // And it runs: finite logits from the file and from the in-memory weights alike.
    auto model = Model::from_gguf(std::make_shared<GgufFile>(path));
    ThreadPool pool(0);
    KvCache cache = model->make_cache(32);
    std::vector<float> logits(static_cast<size_t>(model->config().n_vocab));
    std::vector<int32_t> ids{1, 300, 4000, 20000};
    model->forward(ids.data(), 4, cache, logits.data(), false, pool);
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
    std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------- every preset, test-sized

namespace {

std::string tmp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() / ("quern-synth-" + std::to_string(::getpid()) + "-" + name)).string();
}

/// Logits of the last of `ids` (finite checked by the caller).
std::vector<float> last_logits(Model& m, const std::vector<int32_t>& ids) {
    ThreadPool pool(0);
    KvCache cache = m.make_cache(64);
    std::vector<float> out(static_cast<size_t>(m.config().n_vocab));
    m.forward(ids.data(), static_cast<int64_t>(ids.size()), cache, out.data(), false, pool);
    return out;
}

/// A tensor each architecture cannot do without and that the others lack or
/// name alike: removing it must make loading fail naming it.
std::string arch_tensor(const ModelConfig& c) {
    if (c.arch == "phi3") return "blk.1.attn_qkv.weight";
    if (c.has_recurrent_state()) return "blk.0.ssm_conv1d.weight";
    if (c.arch == "gemma2" || c.arch == "gemma3") return "blk.1.post_ffw_norm.weight";
    if (c.qk_norm) return "blk.1.attn_k_norm.weight";
    if (c.moe()) return "blk.1.ffn_down_exps.weight";
    return "blk.1.ffn_gate.weight";
}

}  // namespace

class SynthPresets : public ::testing::TestWithParam<std::string> {};

TEST_P(SynthPresets, TinyCopyWritesLoadsAndRuns) {
    const SynthPreset& full = synth_preset(GetParam());
    const SynthPreset p = synth_tiny(full);
    const ModelConfig& want = p.cfg;
    EXPECT_EQ(want.arch, full.cfg.arch);
    EXPECT_EQ(want.n_head / want.n_head_kv > 1, full.cfg.n_head / full.cfg.n_head_kv > 1);
    const std::string path = tmp_path(p.name + ".gguf");
    SynthModel m = make_synthetic(p, "Q4_K_M", 5);
    write_synthetic_gguf(m, path);

    // The file's config is the preset's.
    auto f = std::make_shared<GgufFile>(path);
    const ModelConfig got = ModelConfig::from_gguf(*f);
    EXPECT_EQ(got.arch, want.arch);
    EXPECT_EQ(got.n_vocab, want.n_vocab);
    EXPECT_EQ(got.n_embd, want.n_embd);
    EXPECT_EQ(got.n_layer, want.n_layer);
    EXPECT_EQ(got.n_head, want.n_head);
    EXPECT_EQ(got.n_head_kv, want.n_head_kv);
    EXPECT_EQ(got.n_ff, want.n_ff);
    EXPECT_EQ(got.head_dim, want.head_dim);
    EXPECT_EQ(got.rope_dim, want.rope_dim);
    EXPECT_EQ(got.n_ctx_train, want.n_ctx_train);
    EXPECT_EQ(got.rope_base, want.rope_base);
    EXPECT_EQ(got.rms_eps, want.rms_eps);
    EXPECT_EQ(got.rope_neox, want.rope_neox);
    EXPECT_EQ(got.qk_norm, want.qk_norm);
    EXPECT_EQ(got.qkv_bias, want.qkv_bias);
    EXPECT_FLOAT_EQ(got.embd_scale, want.embd_scale);
    EXPECT_FLOAT_EQ(got.qk_scale(), want.qk_scale());
    EXPECT_EQ(got.attn_softcap, want.attn_softcap);
    EXPECT_EQ(got.final_softcap, want.final_softcap);
    EXPECT_EQ(got.sliding_window, want.sliding_window);
    EXPECT_EQ(got.swa_layers, want.swa_layers);
    EXPECT_EQ(got.rope_base_local == 0 ? got.rope_base : got.rope_base_local,
              want.rope_base_local == 0 ? want.rope_base : want.rope_base_local);
    EXPECT_EQ(got.rope_freq_factors, want.rope_freq_factors);
    EXPECT_EQ(got.rope_factors_global_only, want.rope_factors_global_only);
    EXPECT_EQ(got.n_expert, want.n_expert);
    EXPECT_EQ(got.n_expert_used, want.n_expert_used);
    EXPECT_EQ(got.n_ff_exp, want.n_ff_exp);
    EXPECT_EQ(got.extra, want.extra);
    EXPECT_EQ(got.recurrent_layers, want.recurrent_layers);
    EXPECT_EQ(got.n_nextn, want.n_nextn);
    EXPECT_EQ(got.ssm_conv_kernel, want.ssm_conv_kernel);
    EXPECT_EQ(got.ssm_state_size, want.ssm_state_size);
    EXPECT_EQ(got.ssm_group_count, want.ssm_group_count);
    EXPECT_EQ(got.ssm_time_step_rank, want.ssm_time_step_rank);
    EXPECT_EQ(got.ssm_inner_size, want.ssm_inner_size);
    EXPECT_EQ(f->tensors().size(), m.order.size());
    EXPECT_EQ(f->find_tensor("output.weight") == nullptr, p.tied);

    // llama.cpp's tables (the gguf package) know every key and tensor name.
    if (std::system("python3 -c 'import gguf, numpy' 2>/dev/null") == 0) {
        const std::string out = tmp_path(p.name + ".json");
        const std::string cmd =
            std::string("python3 ") + QUERN_SOURCE_DIR + "/tests/python/synth_check.py " + path + " > " + out;
        ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
        const auto j = nlohmann::json::parse(std::ifstream(out));
        std::filesystem::remove(out);
        EXPECT_EQ(j["arch"], want.arch);
        EXPECT_EQ(j["block_count"], want.n_layer + want.n_nextn);  // llama.cpp counts the NextN blocks
        EXPECT_TRUE(j["unknown_keys"].empty()) << j["unknown_keys"].dump();
        EXPECT_TRUE(j["unknown_tensors"].empty()) << j["unknown_tensors"].dump();
        for (const auto& info : f->tensors())
            EXPECT_EQ(j["tensors"][info.name]["type"].get<int>(), static_cast<int>(info.type)) << info.name;
    } else if (std::getenv("CI")) {
        ADD_FAILURE() << "python3 with gguf and numpy is needed in CI";
    }

    // It runs, past the sliding window, and the file computes what the
    // in-memory model computes.
    const std::vector<int32_t> ids{1, 40, 300, 7, 99, 258, 12, 500, 3, 64, 128, 200};
    auto from_file = Model::from_gguf(f);
    const auto a = last_logits(*from_file, ids);
    for (float v : a) ASSERT_TRUE(std::isfinite(v));
    auto in_memory = Model::from_weights(p.cfg, std::move(m.weights));
    const auto b = last_logits(*in_memory, ids);
    EXPECT_EQ(a, b);
    float lo = a[0], hi = a[0];
    for (float v : a) lo = std::min(lo, v), hi = std::max(hi, v);
    EXPECT_GT(hi - lo, 1e-3f) << "logits do not depend on the token";
    std::filesystem::remove(path);
}

TEST_P(SynthPresets, MissingTensorFailsNamingIt) {
    const SynthPreset p = synth_tiny(synth_preset(GetParam()));
    SynthModel m = make_synthetic(p, "Q8_0", 6);
    const std::string gone = arch_tensor(p.cfg);
    const auto it = std::find(m.order.begin(), m.order.end(), gone);
    ASSERT_NE(it, m.order.end()) << gone << " is not in the " << p.name << " layout";
    m.order.erase(it);
    const std::string path = tmp_path(p.name + "-missing.gguf");
    write_synthetic_gguf(m, path);
    try {
        Model::from_gguf(std::make_shared<GgufFile>(path));
        ADD_FAILURE() << p.name << " loaded without " << gone;
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("'" + gone + "' is missing"), std::string::npos) << e.what();
    }
    std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(All, SynthPresets,
                         ::testing::Values("smollm2-135m", "llama3-1b", "llama3-8b", "llama3-70b", "qwen2-7b",
                                           "qwen3-30b-a3b", "mixtral-8x7b", "qwen3-8b", "gemma2-2b", "gemma3-270m", "gemma3-4b",
                                           "phi3-mini", "granite-3.1-2b", "qwen3.5-27b", "qwen3.5-35b-a3b",
                                           "gpt-oss-20b", "gpt-oss-120b"),
                         [](const auto& info) {
                             std::string s = info.param;
                             for (char& ch : s)
                                 if (ch == '-' || ch == '.') ch = '_';
                             return s;
                         });

TEST(Synth, EveryPresetIsTested) {
    EXPECT_EQ(synth_presets().size(), 17u) << "add the new preset to SynthPresets' list";
}

TEST(Synth, Gemma3_270mQ4KMTypesAreLlamaCpps) {
    // The tensor types of llama.cpp's own Q4_K_M file of Gemma 3 270M: the
    // tied embedding takes the output's Q6_K (Q8_0: 640 is no multiple of
    // 256), rows of 640 fall back from Q4_K to Q5_0, attn_v and ffn_down of
    // 9 of the 18 layers get Q6_K (attn_v: Q8_0 by the same fallback).
    const SynthPreset& p = synth_preset("gemma3-270m");
    const auto& c = p.cfg;
    std::map<std::string, std::map<std::string, int>> count;  // tensor kind -> type -> count
    for (int64_t il = 0; il < c.n_layer; ++il)
        for (auto [kind, ne0] : std::vector<std::pair<std::string, int64_t>>{
                 {"attn_q", c.n_embd}, {"attn_k", c.n_embd}, {"attn_v", c.n_embd}, {"attn_output", c.q_dim()},
                 {"ffn_gate", c.n_embd}, {"ffn_up", c.n_embd}, {"ffn_down", c.n_ff}})
            ++count[kind][std::string(dtype_name(synth_tensor_type("Q4_K_M", fmt::format("blk.{}.{}.weight", il, kind), il,
                                                       c.n_layer, ne0)))];
    using M = std::map<std::string, int>;
    EXPECT_EQ(count["attn_q"], (M{{"Q5_0", 18}}));
    EXPECT_EQ(count["attn_k"], (M{{"Q5_0", 18}}));
    EXPECT_EQ(count["attn_v"], (M{{"Q5_0", 9}, {"Q8_0", 9}}));
    EXPECT_EQ(count["attn_output"], (M{{"Q4_K", 18}}));
    EXPECT_EQ(count["ffn_gate"], (M{{"Q5_0", 18}}));
    EXPECT_EQ(count["ffn_down"], (M{{"Q4_K", 9}, {"Q6_K", 9}}));
    // The tied embedding, as make_synthetic types it, on a tiny copy of the
    // same width (the full table would take 170 MB).
    SynthPreset tiny = synth_tiny(p);
    tiny.cfg.n_embd = 640;
    tiny.cfg.embd_scale = std::sqrt(640.0f);
    const SynthModel m = make_synthetic(tiny, "Q4_K_M", 1);
    EXPECT_EQ(m.weights.find("token_embd.weight")->type, DType::Q8_0);
    EXPECT_EQ(m.weights.find("output.weight"), nullptr);
    // Phi-3's fused QKV counts as attention V (llama.cpp 0c1e570's
    // llama_tensor_get_type): Q6_K in the layers given more bits only.
    EXPECT_EQ(synth_tensor_type("Q4_K_M", "blk.7.attn_qkv.weight", 7, 32, 3072), DType::Q4_K);
    EXPECT_EQ(synth_tensor_type("Q4_K_M", "blk.6.attn_qkv.weight", 6, 32, 3072), DType::Q6_K);
    EXPECT_EQ(synth_tensor_type("Q5_K_M", "blk.7.attn_qkv.weight", 7, 32, 3072), DType::Q5_K);
}
