// FP8 and NVFP4 Hugging Face checkpoints (tests/data/hf/{llama,qwen3}/{fp8_*,nvfp4},
// made by tools/make_hf_golden.py's numpy reference quantizers; their logits
// are checked in hf_golden_test.cpp):
//   - every quantized weight, as quern loads and repacks it, decodes to exactly
//     the float32 values of the reference's dequantization (an FNV-1a 64 hash
//     of the row-major [N][K] float32 bytes recorded in golden.json), in the
//     expected quern type;
//   - the serving engine's batched pass gives a sequence the same logits alone
//     and among others (the weight-only types keep the GEMM family's batch
//     invariance);
//   - the other configurations producers write for the same layouts
//     (ModelOpt FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO with 2-D or 4-D scales,
//     W4A16_NVFP4 under a nested "quantization" object, compressed-tensors'
//     block strategy) load to the same model;
//   - a missing or misshapen scale tensor, an unknown quant_method or
//     quant_algo, an activation scheme quern cannot run and FP8 weights without
//     a quantization config fail at load with one error naming the tensor or key
//     and the file;
//   - `quern run -m FOLDER` runs a quantized folder on the CPU; `--device
//     cuda` refuses these fixtures for their head size (16: the GPU attention
//     takes 32, 64, 128, 256) or for want of a GPU / CUDA build, saying to
//     use --device cpu — not for their weight types, which the CUDA backend
//     runs (tests/cuda/session_cuda_test.cpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "hf_test_util.h"
#include "model/hf_model.h"
#include "quant/reference.h"
#include "runtime/batch_runner.h"
#include "runtime/paged_kv.h"
#include "runtime/verify.h"

using namespace quern;
using namespace quern::hf_test;

namespace {

nlohmann::json golden(const std::string& arch) {
    std::ifstream f(kDir + arch + "/golden.json");
    return nlohmann::json::parse(f);
}

/// The GGUF name quern binds a llama/qwen3 projection under.
std::string gguf_name(const std::string& hf) {
    static const std::map<std::string, std::string> kProj{
        {"self_attn.q_proj", "attn_q"},  {"self_attn.k_proj", "attn_k"}, {"self_attn.v_proj", "attn_v"},
        {"self_attn.o_proj", "attn_output"}, {"mlp.gate_proj", "ffn_gate"}, {"mlp.up_proj", "ffn_up"},
        {"mlp.down_proj", "ffn_down"}};
    const std::string pre = "model.layers.";
    const size_t dot = hf.find('.', pre.size());
    const std::string layer = hf.substr(pre.size(), dot - pre.size());
    const std::string module = hf.substr(dot + 1, hf.size() - dot - 1 - std::string(".weight").size());
    return "blk." + layer + "." + kProj.at(module) + ".weight";
}

std::string slurp(const fs::path& p) {
    std::ifstream f(p);
    return std::string((std::istreambuf_iterator<char>(f)), {});
}

uint64_t fnv1a64(const uint8_t* p, size_t n, uint64_t h = 0xCBF29CE484222325ull) {
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}

struct QuantCase {
    std::string arch, variant;
    DType type;  // what the weights become (where their shape allows it)
};

void PrintTo(const QuantCase& c, std::ostream* os) { *os << c.arch << "_" << c.variant; }

class HfQuant : public ::testing::TestWithParam<QuantCase> {};

// Each quantized weight decodes (dequantize_row_ref of its quern type) to the
// reference's float32 values, bit for bit.
TEST_P(HfQuant, WeightsDecodeExactlyAsTheReference) {
    const QuantCase& c = GetParam();
    const nlohmann::json ck = golden(c.arch)["checkpoints"][c.variant];
    ASSERT_TRUE(ck.value("quantized", false));
    auto model = load_hf_model(kDir + c.arch + "/" + c.variant);
    int n = 0;
    for (const auto& [hf, want] : ck["dequantized_fnv1a64"].items()) {
        const Tensor* t = model->weights().find(gguf_name(hf));
        ASSERT_NE(t, nullptr) << hf;
        const int64_t K = t->ne[0], N = t->ne[1];
        // quern's blocks hold whole rows of 32 (FP8) / 64 (NVFP4) elements; others load as F32
        const DType expect = K % dtype_info(c.type).block_size == 0 ? c.type : DType::F32;
        EXPECT_EQ(t->type, expect) << hf << " K=" << K;
        std::vector<float> row(static_cast<size_t>(K));
        uint64_t h = 0xCBF29CE484222325ull;
        for (int64_t r = 0; r < N; ++r) {
            dequantize_row_ref(t->type, t->row(r), row.data(), K);
            h = fnv1a64(reinterpret_cast<const uint8_t*>(row.data()), row.size() * 4, h);
        }
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
        EXPECT_EQ(std::string(hex), want.get<std::string>()) << hf << " (" << dtype_name(t->type) << ")";
        ++n;
    }
    EXPECT_EQ(n, 14);  // 7 projections x 2 layers
}

// A prompt and a second sequence in one batch: the first sequence's logits are
// bit-identical to its logits alone (engine batch invariance).
TEST_P(HfQuant, BatchedSequencesMatchAlone) {
    const QuantCase& c = GetParam();
    const nlohmann::json g = golden(c.arch);
    const std::vector<int32_t> toks = g["tokens"].get<std::vector<int32_t>>();
    auto model = load_hf_model(kDir + c.arch + "/" + c.variant);
    const auto& cfg = model->config();
    const int64_t V = cfg.n_vocab, n = 9;
    ThreadPool pool(2);
    auto run = [&](bool with_other) {
        auto runner = make_cpu_batch_runner(*model, pool);
        auto kv = runner->make_kv_pool(4, 16, "test");
        std::vector<int32_t> blocks{0, 1}, other_blocks{2, 3};
        std::vector<float> a(static_cast<size_t>(V)), b(static_cast<size_t>(V));
        SeqBatch s[2];
        s[0].tokens = toks.data();
        s[0].n = n;
        s[0].block_table = blocks.data();
        s[0].n_past = 0;
        s[0].logits = a.data();
        s[1].tokens = toks.data() + 5;
        s[1].n = 13;
        s[1].block_table = other_blocks.data();
        s[1].n_past = 0;
        s[1].logits = b.data();
        runner->forward_batch(s, with_other ? 2 : 1, *kv);
        return a;
    };
    const std::vector<float> alone = run(false), batched = run(true);
    EXPECT_EQ(0, std::memcmp(alone.data(), batched.data(), alone.size() * sizeof(float)));
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, HfQuant,
                         ::testing::Values(QuantCase{"llama", "fp8_block", DType::F8_E4M3_B32},
                                           QuantCase{"llama", "fp8_channel", DType::F8_E4M3_B32},
                                           QuantCase{"llama", "fp8_tensor", DType::F8_E4M3_B32},
                                           QuantCase{"llama", "nvfp4", DType::NVFP4},
                                           QuantCase{"llama", "nvfp4_ct", DType::NVFP4},
                                           QuantCase{"qwen3", "fp8_block", DType::F8_E4M3_B32},
                                           QuantCase{"qwen3", "nvfp4", DType::NVFP4}),
                         [](const auto& info) { return info.param.arch + "_" + info.param.variant; });

// ---------------------------------------------------------------- edited copies of the fixtures

class HfQuantCopy : public HfCheckpointCopy {
protected:
    /// Rewrites config.json of `d` through `edit`.
    static void edit_config(const fs::path& d, const std::function<void(nlohmann::json&)>& edit,
                            const std::string& file = "config.json") {
        nlohmann::json cfg = nlohmann::json::parse(std::ifstream(d / file));
        edit(cfg);
        std::ofstream(d / file, std::ios::trunc) << cfg.dump(2);
    }
};

/// Logits of the last of a few fixture tokens.
std::vector<float> last_logits(const fs::path& folder) {
    auto model = load_hf_model(folder.string());
    const std::vector<int32_t> toks = golden("llama")["tokens"].get<std::vector<int32_t>>();
    ThreadPool pool(2);
    KvCache cache = model->make_cache(16);
    std::vector<float> out(static_cast<size_t>(model->config().n_vocab));
    model->forward(toks.data(), 7, cache, out.data(), false, pool);
    return out;
}

/// Renames every tensor of `d`/model.safetensors ending in `from` to end in `to`.
void rename_suffix(const fs::path& d, const std::string& from, const std::string& to) {
    StFile s = read_st(d / "model.safetensors");
    nlohmann::ordered_json h;
    for (auto& [k, v] : s.header.items()) {
        const bool m = k.size() > from.size() && k.compare(k.size() - from.size(), from.size(), from) == 0;
        h[m ? k.substr(0, k.size() - from.size()) + to : k] = v;
    }
    s.header = h;
    write_st(d / "model.safetensors", s);
}

// The other ways producers describe the same checkpoints load to the same
// model: ModelOpt's FP8_PER_CHANNEL_PER_TOKEN for a per-channel FP8 one,
// FP8_PB_WO (weight_scale [N/128, K/128] or [N/128, 1, K/128, 1]) and
// compressed-tensors' block strategy for fine-grained FP8 ones, W4A16_NVFP4
// under a nested "quantization" object for NVFP4.
TEST_F(HfQuantCopy, EquivalentConfigurationsLoadAlike) {
    {
        const fs::path d = copy("llama", "fp8_channel");
        const std::vector<float> want = last_logits(d);
        edit_config(d, [](nlohmann::json& c) {
            c["quantization_config"] = {{"quant_method", "modelopt"}, {"quant_algo", "FP8_PER_CHANNEL_PER_TOKEN"}};
        });
        EXPECT_EQ(last_logits(d), want) << "FP8_PER_CHANNEL_PER_TOKEN";
    }
    {
        const fs::path d = copy("llama", "fp8_block");  // 128x128 blocks: one per matrix of this model
        const std::vector<float> want = last_logits(d);
        rename_suffix(d, ".weight_scale_inv", ".weight_scale");
        edit_config(d, [](nlohmann::json& c) {
            c["quantization_config"] = {{"quant_method", "modelopt"}, {"quant_algo", "FP8_PB_WO"}};
        });
        EXPECT_EQ(last_logits(d), want) << "FP8_PB_WO";
        StFile s = read_st(d / "model.safetensors");
        for (auto& [k, v] : s.header.items())
            if (k.size() > 13 && k.compare(k.size() - 13, 13, ".weight_scale") == 0) v["shape"] = {1, 1, 1, 1};
        write_st(d / "model.safetensors", s);
        EXPECT_EQ(last_logits(d), want) << "FP8_PB_WO, 4-D scales";
    }
    {
        const fs::path d = copy("qwen3", "fp8_block");  // [32, 32] blocks
        const std::vector<float> want = last_logits(d);
        rename_suffix(d, ".weight_scale_inv", ".weight_scale");
        edit_config(d, [](nlohmann::json& c) {
            c["quantization_config"] = nlohmann::json::parse(R"({"quant_method": "compressed-tensors",
                "format": "float-quantized", "ignore": ["lm_head"], "config_groups": {"group_0": {"targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "symmetric": true, "strategy": "block",
                            "block_structure": [32, 32], "dynamic": false},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 32,
                                      "dynamic": true}}}})");
        });
        EXPECT_EQ(last_logits(d), want) << "compressed-tensors block";
    }
    {
        const fs::path d = copy("llama", "nvfp4");
        const std::vector<float> want = last_logits(d);
        edit_config(d, [](nlohmann::json& c) {
            c["quantization_config"] = {{"quant_method", "modelopt"},
                                        {"quantization", {{"quant_algo", "W4A16_NVFP4"}, {"group_size", 16}}}};
        });
        EXPECT_EQ(last_logits(d), want) << "W4A16_NVFP4";
        fs::remove(d / "hf_quant_config.json");  // config.json alone suffices
        EXPECT_EQ(last_logits(d), want) << "without hf_quant_config.json";
        // compressed-tensors NVFP4 (weight_packed, a dividing weight_global_scale;
        // tools/nvfp4_modelopt_to_ct.py): the same weights, bit for bit
        EXPECT_EQ(last_logits(copy("llama", "nvfp4_ct")), want) << "compressed-tensors NVFP4";
    }
    {
        // ue8m0 block scales (DeepSeek-V3.1 style) are stored as F32 like float ones
        const fs::path d = copy("llama", "fp8_block", "_ue8m0");
        const std::vector<float> want = last_logits(d);
        edit_config(d, [](nlohmann::json& c) { c["quantization_config"]["scale_fmt"] = "ue8m0"; });
        EXPECT_EQ(last_logits(d), want) << "scale_fmt ue8m0";
    }
}

TEST_F(HfQuantCopy, TheFixturesLoad) {
    for (const char* v : {"fp8_block", "fp8_channel", "fp8_tensor", "nvfp4", "nvfp4_ct"})
        EXPECT_EQ(load_error(copy("llama", v)), "");
}

TEST_F(HfQuantCopy, MissingScaleTensorIsNamedWithTheFile) {
    const fs::path d = copy("llama", "fp8_block");
    StFile s = read_st(d / "model.safetensors");
    const std::string name = "model.layers.1.mlp.up_proj.weight_scale_inv";
    s.header["model.layers.1.mlp.up_proj.weight_scale_inx"] = s.header[name];
    s.header.erase(name);
    write_st(d / "model.safetensors", s);
    const std::string e = load_error(d);
    EXPECT_NE(e.find("'" + name + "' is missing"), std::string::npos) << e;
    EXPECT_NE(e.find("'model.layers.1.mlp.up_proj.weight'"), std::string::npos) << e;
    EXPECT_NE(e.find((d / "model.safetensors").string()), std::string::npos) << e;

    // NVFP4: the global scale
    const fs::path n = copy("llama", "nvfp4");
    StFile t = read_st(n / "model.safetensors");
    const std::string g = "model.layers.0.self_attn.o_proj.weight_scale_2";
    t.header["model.layers.0.self_attn.o_proj.weight_scale_3"] = t.header[g];
    t.header.erase(g);
    write_st(n / "model.safetensors", t);
    const std::string e2 = load_error(n);
    EXPECT_NE(e2.find("'" + g + "' is missing"), std::string::npos) << e2;
    EXPECT_NE(e2.find((n / "model.safetensors").string()), std::string::npos) << e2;

    // compressed-tensors NVFP4: the dividing global scale, and a zero one
    const fs::path c = copy("llama", "nvfp4_ct");
    StFile u = read_st(c / "model.safetensors");
    const std::string cg = "model.layers.1.mlp.gate_proj.weight_global_scale";
    u.header["model.layers.1.mlp.gate_proj.weight_global_scalx"] = u.header[cg];
    u.header.erase(cg);
    write_st(c / "model.safetensors", u);
    const std::string e3 = load_error(c);
    EXPECT_NE(e3.find("'" + cg + "' is missing"), std::string::npos) << e3;
    EXPECT_NE(e3.find("'model.layers.1.mlp.gate_proj.weight'"), std::string::npos) << e3;
}

TEST_F(HfQuantCopy, WrongScaleShapeIsNamedWithTheFile) {
    const fs::path d = copy("qwen3", "fp8_block");  // [32, 32] blocks: gate_proj [64, 64] has a [2, 2] grid
    StFile s = read_st(d / "model.safetensors");
    const std::string name = "model.layers.0.mlp.gate_proj.weight_scale_inv";
    ASSERT_EQ(s.header[name]["shape"], nlohmann::json({2, 2}));
    s.header[name]["shape"] = {4, 1};  // same bytes
    write_st(d / "model.safetensors", s);
    std::string e = load_error(d);
    EXPECT_NE(e.find("'" + name + "'"), std::string::npos) << e;
    EXPECT_NE(e.find("shape [4, 1], expected [2, 2]"), std::string::npos) << e;
    EXPECT_NE(e.find((d / "model.safetensors").string()), std::string::npos) << e;

    // NVFP4 group scales: [N, K/16] of E4M3
    const fs::path n = copy("llama", "nvfp4");
    StFile t = read_st(n / "model.safetensors");
    const std::string sc = "model.layers.1.mlp.down_proj.weight_scale";
    ASSERT_EQ(t.header[sc]["shape"], nlohmann::json({64, 4}));
    t.header[sc]["shape"] = {128, 2};
    write_st(n / "model.safetensors", t);
    e = load_error(n);
    EXPECT_NE(e.find("'" + sc + "'"), std::string::npos) << e;
    EXPECT_NE(e.find("shape [128, 2], expected [64, 4]"), std::string::npos) << e;
    EXPECT_NE(e.find((n / "model.safetensors").string()), std::string::npos) << e;
}

TEST_F(HfQuantCopy, UnknownQuantMethodNamesTheKeyAndFile) {
    const fs::path d = copy("llama", "fp8_block");
    edit_config(d, [](nlohmann::json& c) { c["quantization_config"]["quant_method"] = "awq"; });
    std::string e = load_error(d);
    EXPECT_NE(e.find("quantization_config.quant_method 'awq' is not supported"), std::string::npos) << e;
    EXPECT_NE(e.find((d / "config.json").string()), std::string::npos) << e;

    // ModelOpt's hf_quant_config.json: an algorithm quern does not run
    const fs::path m = copy("llama", "fp8_tensor");
    edit_config(m, [](nlohmann::json& c) { c["quantization"]["quant_algo"] = "W4A8_AWQ"; }, "hf_quant_config.json");
    e = load_error(m);
    EXPECT_NE(e.find("quantization.quant_algo 'W4A8_AWQ' is not supported"), std::string::npos) << e;
    EXPECT_NE(e.find((m / "hf_quant_config.json").string()), std::string::npos) << e;
}

TEST_F(HfQuantCopy, SchemesQuernCannotRunNameTheKey) {
    const fs::path d = copy("llama", "fp8_channel");
    const std::string where = (d / "config.json").string();
    auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
        const fs::path c = dir_ / "cfg";
        fs::remove_all(c);
        fs::copy(d, c, fs::copy_options::recursive);
        edit_config(c, edit);
        return load_error(c);
    };
    std::string e = with([](nlohmann::json& c) {
        c["quantization_config"]["config_groups"]["group_0"]["input_activations"]["type"] = "int";
    });
    EXPECT_NE(e.find("quantization_config.config_groups.group_0.input_activations.type int"), std::string::npos) << e;
    e = with([](nlohmann::json& c) { c["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 4; });
    EXPECT_NE(e.find("weights.num_bits 4"), std::string::npos) << e;
    e = with([](nlohmann::json& c) { c["quantization_config"]["format"] = "pack-quantized"; });
    EXPECT_NE(e.find("quantization_config.format 'pack-quantized'"), std::string::npos) << e;
    e = with([](nlohmann::json& c) { c["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = "group"; });
    EXPECT_NE(e.find("weights.strategy 'group'"), std::string::npos) << e;
    // FP8 weights with no quantization config at all: the tensor and file are named
    e = with([](nlohmann::json& c) { c.erase("quantization_config"); });
    EXPECT_NE(e.find("'model.layers.0.self_attn.q_proj.weight'"), std::string::npos) << e;
    EXPECT_NE(e.find("no quantization_config"), std::string::npos) << e;
    const fs::path f = copy("llama", "fp8_block");
    edit_config(f, [](nlohmann::json& c) { c["quantization_config"]["activation_scheme"] = "per-tensor-int8"; });
    e = load_error(f);
    EXPECT_NE(e.find("quantization_config.activation_scheme 'per-tensor-int8'"), std::string::npos) << e;
    EXPECT_NE(e.find((f / "config.json").string()), std::string::npos) << e;
    const fs::path g = copy("llama", "fp8_block", "_e5m2");
    edit_config(g, [](nlohmann::json& c) { c["quantization_config"]["scale_fmt"] = "e5m2"; });
    e = load_error(g);
    EXPECT_NE(e.find("quantization_config.scale_fmt 'e5m2'"), std::string::npos) << e;
    // compressed-tensors: NVFP4 weights under the FP8 format name, and a group strategy for NVFP4
    const fs::path n = copy("llama", "nvfp4_ct");
    edit_config(n, [](nlohmann::json& c) { c["quantization_config"]["config_groups"]["group_0"]["format"] = "float-quantized"; });
    e = load_error(n);
    EXPECT_NE(e.find("weights.num_bits 4 with format 'float-quantized'"), std::string::npos) << e;
    const fs::path n2 = copy("llama", "nvfp4_ct", "_group");
    edit_config(n2, [](nlohmann::json& c) { c["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = "group"; });
    e = load_error(n2);
    EXPECT_NE(e.find("weights.strategy 'group'"), std::string::npos) << e;
}

// ---------------------------------------------------------------- quern run -m FOLDER

TEST_F(HfQuantCopy, QuernRunsAQuantizedFolder) {
    const std::string quern = std::string(QUERN_BINARY_DIR) + "/quern";
    if (!fs::exists(quern)) GTEST_SKIP() << quern << " is not built";
    const fs::path err = dir_ / "err.txt", out = dir_ / "out.txt";
    for (const char* v : {"fp8_block", "nvfp4"}) {
        const fs::path d = copy("llama", v);
        std::ofstream(d / "tokenizer.json") << byte_tokenizer_json();
        std::ofstream(d / "tokenizer_config.json") << R"({"add_bos_token": false})";
        const std::string base = "'" + quern + "' run -m '" + d.string() + "' -p 'hello' -n 6 --temp 0 --ignore-eos -t 2";
        int rc = std::system((base + " --device cpu >'" + out.string() + "' 2>'" + err.string() + "'").c_str());
        EXPECT_EQ(rc, 0) << v << ": " << slurp(err);
        EXPECT_FALSE(slurp(out).empty()) << v;
        rc = std::system((base + " --device cuda >'" + out.string() + "' 2>'" + err.string() + "'").c_str());
        EXPECT_NE(rc, 0) << v;
        const std::string text = slurp(err);
        EXPECT_NE(text.find("use --device cpu"), std::string::npos) << text;
        EXPECT_EQ(text.find("no kernels for"), std::string::npos) << text;  // FP8 / NVFP4 weights run on the GPU
    }
}

}  // namespace
