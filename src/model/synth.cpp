#include "model/synth.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"
#include "formats/gguf.h"
#include "model/arch/arch.h"
#include "quant/mix.h"
#include "quant/reference.h"
#include "tokenizer/unicode.h"

namespace quern {

namespace {

ModelConfig shape(std::string name, int64_t vocab, int64_t embd, int64_t layers, int64_t heads, int64_t kv_heads,
                  int64_t ff, int64_t ctx, float rope_base, float eps) {
    ModelConfig c;
    c.arch = "llama";
    c.name = std::move(name);
    c.n_vocab = vocab;
    c.n_embd = embd;
    c.n_layer = layers;
    c.n_head = heads;
    c.n_head_kv = kv_heads;
    c.n_ff = ff;
    c.head_dim = embd / heads;
    c.rope_dim = c.head_dim;
    c.n_ctx_train = ctx;
    c.rope_base = rope_base;
    c.rms_eps = eps;
    return c;
}

/// Qwen3-MoE shapes (llama.cpp arch "qwen3moe"): head_dim 128 whatever the
/// width, per-head q/k norms, NeoX RoPE, n_expert experts of width ff_exp.
ModelConfig qwen3moe_shape(std::string name, int64_t vocab, int64_t embd, int64_t layers, int64_t heads,
                           int64_t kv_heads, int64_t ff, int64_t ff_exp, int64_t experts, int64_t used, int64_t ctx) {
    ModelConfig c = shape(std::move(name), vocab, embd, layers, heads, kv_heads, ff, ctx, 1000000.0f, 1e-6f);
    c.arch = "qwen3moe";
    c.head_dim = 128;
    c.rope_dim = 128;
    c.rope_neox = true;
    c.qk_norm = true;
    c.n_expert = experts;
    c.n_expert_used = used;
    c.n_ff_exp = ff_exp;
    return c;
}

/// Qwen3.5 / 3.6 shapes (llama.cpp arch "qwen35", with experts "qwen35moe"):
/// three Gated DeltaNet layers (key heads nk of 128, value heads nv of 128,
/// conv kernel 4) per gated full-attention layer (heads of 256, a quarter
/// rotated), q/k norms; experts > 0: that many of width ff_exp, `used` per
/// token, plus a shared expert of width ff. Value heads in the converter's
/// tiled order, as GGUF files hold them.
ModelConfig qwen35_shape(std::string name, int64_t vocab, int64_t embd, int64_t layers, int64_t heads,
                         int64_t kv_heads, int64_t ff, int64_t nk, int64_t nv, int64_t experts = 0,
                         int64_t ff_exp = 0, int64_t used = 0) {
    ModelConfig c = shape(std::move(name), vocab, embd, layers, heads, kv_heads, ff, 262144, 10000000.0f, 1e-6f);
    c.arch = experts > 0 ? "qwen35moe" : "qwen35";
    c.head_dim = 256;
    c.rope_dim = 64;
    c.rope_neox = true;
    c.qk_norm = true;
    c.ssm_conv_kernel = 4;
    c.ssm_state_size = 128;
    c.ssm_group_count = nk;
    c.ssm_time_step_rank = nv;
    c.ssm_inner_size = nv * 128;
    for (int64_t il = 0; il < layers; ++il) c.recurrent_layers.push_back((il + 1) % 4 != 0);
    c.extra["v_heads_tiled"] = 1;
    c.n_nextn = 1;  // the released checkpoints carry one MTP block (llama.cpp's converter keeps it)
    c.n_expert = experts;
    c.n_expert_used = used;
    c.n_ff_exp = ff_exp;
    return c;
}

/// Mixtral shapes (llama.cpp arch "llama" with experts of width ff).
ModelConfig mixtral_shape(std::string name, int64_t vocab, int64_t embd, int64_t layers, int64_t heads,
                          int64_t kv_heads, int64_t ff, int64_t experts, int64_t used, int64_t ctx) {
    ModelConfig c = shape(std::move(name), vocab, embd, layers, heads, kv_heads, ff, ctx, 1000000.0f, 1e-5f);
    c.n_expert = experts;
    c.n_expert_used = used;
    c.n_ff_exp = ff;
    return c;
}

/// Dense Qwen3 shapes (llama.cpp arch "qwen3"): per-head q/k RMSNorm, NeoX
/// RoPE, head_dim 128 whatever the width (Qwen3Config).
ModelConfig qwen3_shape(std::string name, int64_t vocab, int64_t embd, int64_t layers, int64_t heads, int64_t kv_heads,
                        int64_t ff, int64_t ctx) {
    ModelConfig c = shape(std::move(name), vocab, embd, layers, heads, kv_heads, ff, ctx, 1000000.0f, 1e-6f);
    c.arch = "qwen3";
    c.head_dim = 128;
    c.rope_dim = 128;
    c.rope_neox = true;
    c.qk_norm = true;
    return c;
}

/// Gemma 2 / Gemma 3 shapes as ModelConfig::from_gguf reads them back:
/// NeoX RoPE, embeddings scaled by sqrt(n_embd), post-norms, GELU-tanh FFN,
/// query scale 1/sqrt(head_dim), local layers every layer but each
/// `pattern`-th (gemma2: pattern 2, even layers local; gemma3: pattern 6) with
/// a window of `window` keys; gemma2 soft-caps scores at 50 and logits at 30,
/// gemma3 has q/k norms and a local RoPE base of 10000. `linear` > 1: Gemma 3's
/// linear RoPE scaling of the global layers.
ModelConfig gemma_shape(std::string arch, std::string name, int64_t vocab, int64_t embd, int64_t layers, int64_t heads,
                        int64_t kv_heads, int64_t head_dim, int64_t ff, int64_t ctx, float rope_base, int64_t window,
                        float linear = 1.0f) {
    ModelConfig c = shape(std::move(name), vocab, embd, layers, heads, kv_heads, ff, ctx, rope_base, 1e-6f);
    c.arch = std::move(arch);
    const bool g3 = c.arch == "gemma3";
    c.head_dim = head_dim;
    c.rope_dim = head_dim;
    c.rope_neox = true;
    c.embd_scale = std::sqrt(static_cast<float>(embd));
    c.attn_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    c.qk_norm = g3;
    c.sliding_window = window;
    const int64_t pattern = g3 ? 6 : 2;
    c.swa_layers.resize(static_cast<size_t>(layers));
    for (int64_t il = 0; il < layers; ++il) c.swa_layers[static_cast<size_t>(il)] = il % pattern < pattern - 1;
    c.rope_base_local = g3 ? 10000.0f : rope_base;
    if (!g3) {
        c.attn_softcap = 50.0f;
        c.final_softcap = 30.0f;
    }
    if (linear != 1.0f) {
        c.rope_freq_factors.assign(static_cast<size_t>(head_dim / 2), linear);
        c.rope_factors_global_only = true;
    }
    return c;
}

/// Qwen2 shapes (llama.cpp arch "qwen2"): NeoX RoPE and biases on the q, k
/// and v projections (attn_q.bias, attn_k.bias, attn_v.bias, F32).
ModelConfig qwen2_shape(std::string name, int64_t vocab, int64_t embd, int64_t layers, int64_t heads, int64_t kv_heads,
                        int64_t ff, int64_t ctx) {
    ModelConfig c = shape(std::move(name), vocab, embd, layers, heads, kv_heads, ff, ctx, 1000000.0f, 1e-6f);
    c.arch = "qwen2";
    c.rope_neox = true;
    c.qkv_bias = true;
    return c;
}

/// Phi-3 shapes (llama.cpp arch "phi3"): fused attn_qkv and gate/up, NeoX
/// RoPE, a sliding window on every layer.
ModelConfig phi3_shape(std::string name, int64_t vocab, int64_t embd, int64_t layers, int64_t heads, int64_t kv_heads,
                       int64_t ff, int64_t ctx, int64_t window) {
    ModelConfig c = shape(std::move(name), vocab, embd, layers, heads, kv_heads, ff, ctx, 10000.0f, 1e-5f);
    c.arch = "phi3";
    c.rope_neox = true;
    c.sliding_window = window;
    c.swa_layers.assign(static_cast<size_t>(layers), 1);
    return c;
}

/// Granite 3 shapes (llama.cpp arch "granite"): the Llama block with its four
/// multipliers (embedding, residual, attention, logits).
ModelConfig granite_shape(std::string name, int64_t vocab, int64_t embd, int64_t layers, int64_t heads,
                          int64_t kv_heads, int64_t ff, int64_t ctx, float rope_base, float embedding, float residual,
                          float attention, float logits) {
    ModelConfig c = shape(std::move(name), vocab, embd, layers, heads, kv_heads, ff, ctx, rope_base, 1e-5f);
    c.arch = "granite";
    c.embd_scale = embedding;
    c.attn_scale = attention;
    c.extra["residual_scale"] = residual;
    c.extra["logit_scale"] = logits;
    return c;
}

/// gpt-oss shapes (llama.cpp arch "gpt-oss", the published configs): width
/// 2880, 64 query heads and 8 KV heads of 64, experts of width 2880 with 4
/// used per token, a 128-position window on even layers, q/k/v/o biases,
/// attention sinks, NeoX RoPE at base 150000 with YaRN (factor 32 over 4096
/// positions), the clamped SwiGLU (α 1.702, limit 7).
ModelConfig gpt_oss_shape(std::string name, int64_t layers, int64_t experts) {
    ModelConfig c = shape(std::move(name), 201088, 2880, layers, 64, 8, 2880, 131072, 150000.0f, 1e-5f);
    c.arch = "gpt-oss";
    c.head_dim = c.rope_dim = 64;
    c.rope_neox = true;
    c.qkv_bias = c.out_bias = true;
    c.n_expert = experts;
    c.n_expert_used = 4;
    c.n_ff_exp = 2880;
    c.expert_weights_norm = true;
    c.sliding_window = 128;
    c.swa_layers.resize(static_cast<size_t>(layers));
    for (int64_t il = 0; il < layers; il += 2) c.swa_layers[static_cast<size_t>(il)] = 1;
    c.rope_yarn_factor = 32.0f;
    c.rope_orig_ctx = 4096;
    c.rope_freq_factors = yarn_freq_factors(c.rope_base, c.rope_dim, 32.0, 4096.0, 32.0, 1.0, true);
    c.rope_attn_factor = yarn_attn_factor(32.0);
    c.extra["swiglu_alpha"] = 1.702f;
    c.extra["swiglu_limit"] = 7.0f;
    return c;
}

bool is_k_quant(DType t) {
    return t == DType::Q2_K || t == DType::Q3_K || t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
}

}  // namespace

const std::vector<SynthPreset>& synth_presets() {
    static const std::vector<SynthPreset> k{
        {"smollm2-135m", "SmolLM2-135M shape, untied output (163M parameters)",
         shape("synthetic smollm2-135m", 49152, 576, 30, 9, 3, 1536, 8192, 100000.0f, 1e-5f), false},
        {"llama3-1b", "Llama-3.2-1B shape, tied output (1.24B parameters)",
         shape("synthetic llama3-1b", 128256, 2048, 16, 32, 8, 8192, 131072, 500000.0f, 1e-5f), true},
        {"llama3-8b", "Llama-3-8B shape (8.03B parameters)",
         shape("synthetic llama3-8b", 128256, 4096, 32, 32, 8, 14336, 8192, 500000.0f, 1e-5f), false},
        {"llama3-70b", "Llama-3-70B / Llama-3.1-70B shape, 8192 positions (70.6B parameters)",
         shape("synthetic llama3-70b", 128256, 8192, 80, 64, 8, 28672, 8192, 500000.0f, 1e-5f), false},
        {"qwen2-7b", "Qwen2-7B shape: q/k/v biases, NeoX RoPE (7.6B parameters)",
         qwen2_shape("synthetic qwen2-7b", 152064, 3584, 28, 28, 4, 18944, 32768), false},
        {"qwen3-30b-a3b", "Qwen3-30B-A3B shape: 128 experts of width 768, 8 per token, q/k norms (30.5B parameters, "
                          "3.3B active)",
         qwen3moe_shape("synthetic qwen3-30b-a3b", 151936, 2048, 48, 32, 4, 6144, 768, 128, 8, 40960), false},
        {"mixtral-8x7b", "Mixtral-8x7B shape: 8 experts of width 14336, 2 per token (46.7B parameters, 12.9B active)",
         mixtral_shape("synthetic mixtral-8x7b", 32000, 4096, 32, 32, 8, 14336, 8, 2, 32768), false},
        {"qwen3-8b", "Qwen3-8B shape: q/k norms, head_dim 128 (8.19B parameters)",
         qwen3_shape("synthetic qwen3-8b", 151936, 4096, 36, 32, 8, 12288, 40960), false},
        {"gemma2-2b", "Gemma-2-2B shape: local/global layers (window 4096), soft-capping, tied output (2.61B "
                      "parameters)",
         gemma_shape("gemma2", "synthetic gemma2-2b", 256000, 2304, 26, 8, 4, 256, 9216, 8192, 10000.0f, 4096), true},
        {"gemma3-270m", "Gemma-3-270M shape: 5 local layers (window 512) per global one, q/k norms, tied output "
                        "(268M parameters)",
         gemma_shape("gemma3", "synthetic gemma3-270m", 262144, 640, 18, 4, 1, 256, 2048, 32768, 1000000.0f, 512),
         true},
        {"gemma3-4b", "Gemma-3-4B text shape: window 1024, linear RoPE scaling 8 on global layers, tied output (3.88B "
                      "parameters)",
         gemma_shape("gemma3", "synthetic gemma3-4b", 262208, 2560, 34, 8, 4, 256, 10240, 131072, 1000000.0f, 1024, 8.0f),
         true},
        {"phi3-mini", "Phi-3-mini-4k shape: fused attn_qkv and gate/up, window 2047 (3.82B parameters)",
         phi3_shape("synthetic phi3-mini", 32064, 3072, 32, 32, 32, 8192, 4096, 2047), false},
        {"qwen3.5-27b", "Qwen3.5-27B / Qwen3.6-27B text shape: 48 Gated DeltaNet layers (16 key, 48 value heads) "
                        "and 16 gated-attention layers (24 heads of 256, 4 KV heads)",
         qwen35_shape("synthetic qwen3.5-27b", 248320, 5120, 64, 24, 4, 17408, 16, 48), false},
        {"qwen3.5-35b-a3b", "Qwen3.5-35B-A3B / Qwen3.6-35B-A3B text shape: 30 Gated DeltaNet and 10 gated-attention "
                            "layers, 256 experts of width 512, 8 per token, a shared expert of 512",
         qwen35_shape("synthetic qwen3.5-35b-a3b", 248320, 2048, 40, 16, 2, 512, 16, 32, 256, 512, 8), false},
        {"gpt-oss-20b", "gpt-oss-20b shape: 24 layers of 32 experts (4 per token), attention sinks, window 128 on "
                        "every other layer, YaRN (20.9B parameters, 3.6B active)",
         gpt_oss_shape("synthetic gpt-oss-20b", 24, 32), false},
        {"gpt-oss-120b", "gpt-oss-120b shape: 36 layers of 128 experts (4 per token), otherwise as gpt-oss-20b "
                         "(116.8B parameters, 5.1B active)",
         gpt_oss_shape("synthetic gpt-oss-120b", 36, 128), false},
        {"granite-3.1-2b", "Granite-3.1-2B shape: embeddings x 12, branches x 0.22, scores x 1/64, logits / 8, tied "
                           "output (2.53B parameters)",
         granite_shape("synthetic granite-3.1-2b", 49155, 2048, 40, 32, 8, 8192, 131072, 5000000.0f, 12.0f, 0.22f,
                       0.015625f, 8.0f),
         true},
    };
    return k;
}

const SynthPreset& synth_preset(const std::string& name) {
    std::string names;
    for (const auto& p : synth_presets()) {
        if (p.name == name) return p;
        names += (names.empty() ? "" : ", ") + p.name;
    }
    fail("unknown synthetic preset '{}' (known: {})", name, names);
}

SynthPreset synth_tiny(const SynthPreset& p) {
    SynthPreset t = p;
    t.name = p.name + "-tiny";
    t.description = "test-sized " + p.name + " (its architecture and layout, small dimensions)";
    ModelConfig& c = t.cfg;
    const ModelConfig& o = p.cfg;
    c.name = o.name + " (tiny)";
    c.n_vocab = 512;
    c.n_embd = 256;
    c.n_layer = std::min<int64_t>(o.n_layer, 6);
    c.n_head = std::min<int64_t>(o.n_head, 4);
    c.n_head_kv = std::max<int64_t>(1, c.n_head / std::min(c.n_head, o.n_head / o.n_head_kv));
    c.head_dim = 64;
    c.rope_dim = c.head_dim * o.rope_dim / o.head_dim / 2 * 2;
    c.n_ff = 512;
    c.n_ctx_train = std::min<int64_t>(o.n_ctx_train, 4096);
    if (o.embd_scale > 0.0f) c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
    if (o.attn_scale > 0.0f) c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    if (o.sliding_window > 0) c.sliding_window = std::min<int64_t>(o.sliding_window, 4);
    if (!o.swa_layers.empty()) c.swa_layers.resize(static_cast<size_t>(c.n_layer));  // the pattern starts at layer 0
    if (o.rope_yarn_factor > 0.0f)  // YaRN's divisors depend on the rotated width
        c.rope_freq_factors = yarn_freq_factors(c.rope_base, c.rope_dim, o.rope_yarn_factor,
                                                static_cast<double>(o.rope_orig_ctx), o.yarn_beta_fast, o.yarn_beta_slow, true);
    else if (!o.rope_freq_factors.empty())
        c.rope_freq_factors.assign(static_cast<size_t>(c.rope_dim / 2), o.rope_freq_factors[0]);
    if (o.has_recurrent_state()) {  // 2 key heads and 4 value heads of 32; the layer pattern kept
        c.ssm_group_count = 2;
        c.ssm_state_size = 32;
        c.ssm_time_step_rank = 4;
        c.ssm_inner_size = 4 * 32;
        c.recurrent_layers.resize(static_cast<size_t>(c.n_layer));
    }
    if (o.moe()) {
        c.n_expert = std::min<int64_t>(o.n_expert, 8);
        c.n_expert_used = std::min<int64_t>(o.n_expert_used, 2);
        // llama-architecture experts have the FFN width (feed_forward_length).
        c.n_ff_exp = o.arch == "llama" ? c.n_ff : 256;
    }
    c.validate();
    return t;
}

namespace {
// The schemes, as listed to users; the quern-only layouts live in memory only.
constexpr const char* kGgufSchemes = "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4, F16, BF16, "
                                     "F32, or a mix: Q4_K_M, Q5_K_M, MXFP4_MOE";
constexpr const char* kMemorySchemes = "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4, F16, BF16, "
                                       "F32, F8_E4M3_B32, NVFP4, or a mix: Q4_K_M, Q5_K_M, MXFP4_MOE";
}  // namespace

std::string synth_scheme(const std::string& name, bool gguf) {
    std::string up = name;
    for (char& ch : up) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (up == "Q4_K_M" || up == "Q5_K_M" || up == "MXFP4_MOE") return up;
    const auto d = dtype_from_name(up);
    const bool quern_only = d && (*d == DType::F8_E4M3_B32 || *d == DType::NVFP4);
    if (!d || !quant_ref_supports(*d) || *d == DType::Q8_1 || *d == DType::Q8_K || (gguf && quern_only)) {
        if (gguf && quern_only)
            fail("quantization '{}' is quern's own layout, which a GGUF file cannot hold (quern bench --synthetic "
                 "PRESET --quant {} builds it in memory); write one of {}",
                 name, up, kGgufSchemes);
        fail("unknown quantization '{}' (use {})", name, gguf ? kGgufSchemes : kMemorySchemes);
    }
    return std::string(dtype_name(*d));
}

DType synth_tensor_type(const std::string& scheme_name, const std::string& name, int64_t layer, int64_t n_layer,
                        int64_t ne0) {
    const std::string scheme = synth_scheme(scheme_name, false);
    if (scheme == "Q4_K_M" || scheme == "Q5_K_M") {
        // llama-quantize's rules (quant/mix.h); one attention-V and one FFN-down
        // tensor per layer, so each is the layer's.
        MixModel m;
        m.n_layer = m.n_attention_v = n_layer;
        m.tied_embeddings = false;  // the mixes give a tied embedding the output's type elsewhere
        return mix_tensor_type(*file_type_from_name(scheme), m, name, ne0, layer, layer);
    }
    // llama.cpp's MXFP4_MOE (how gpt-oss GGUF files ship): expert banks in
    // MXFP4, the other matrices in Q8_0.
    if (scheme == "MXFP4_MOE") return name.find("_exps.") != std::string::npos ? DType::MXFP4 : DType::Q8_0;
    DType t = *dtype_from_name(scheme);
    if (is_k_quant(t) && ne0 % 256 != 0) {
        switch (t) {
            case DType::Q4_K: t = DType::Q5_0; break;
            case DType::Q5_K: t = DType::Q5_1; break;
            case DType::Q6_K: t = DType::Q8_0; break;
            default: t = DType::Q4_0; break;
        }
    }
    return t;
}

uint32_t synth_file_type(const std::string& scheme_name) {
    const std::string scheme = synth_scheme(scheme_name, false);
    if (scheme == "Q4_K_M") return 15;
    if (scheme == "Q5_K_M") return 17;
    if (scheme == "MXFP4_MOE") return 38;  // LLAMA_FTYPE_MOSTLY_MXFP4_MOE
    const auto d = dtype_from_name(scheme);
    if (!d) return 0;
    switch (*d) {
        case DType::F16: return 1;
        case DType::Q4_0: return 2;
        case DType::Q4_1: return 3;
        case DType::Q8_0: return 7;
        case DType::Q5_0: return 8;
        case DType::Q5_1: return 9;
        case DType::Q2_K: return 10;
        case DType::Q3_K: return 12;
        case DType::Q4_K: return 14;
        case DType::Q5_K: return 16;
        case DType::Q6_K: return 18;
        case DType::BF16: return 32;
        default: return 0;
    }
}

SynthModel make_synthetic(const SynthPreset& p, const std::string& scheme, uint64_t seed,
                          const std::function<void(int64_t, int64_t)>& progress) {
    SynthModel m;
    m.cfg = p.cfg;
    m.scheme = synth_scheme(scheme, false);
    m.tied = p.tied;
    const auto& c = m.cfg;
    // The architecture's tensor table in its GGUF layout (expert banks as one
    // 3-D tensor each), in table order; the output projection only when untied.
    const ArchDef* def = find_arch(c.arch);
    if (!def) fail("synthetic model of unknown architecture '{}'", c.arch);
    TensorTable table;
    def->tensors(c, table);
    struct Spec {
        std::string name;
        int64_t ne0, ne1;
        int64_t layer;
        bool norm;             // F32, around 1
        int64_t ne2 = 1;       // experts (3-D expert banks)
        bool f32 = false;      // kept in F32 (the router, as llama.cpp's quantizer keeps it)
        bool bias = false;     // F32, around 0 (ne0 values)
        bool negative = false; // F32, around −1 (stored as −exp(x): a decay rate)
    };
    std::vector<Spec> specs;
    for (const TensorEntry& e : table.entries()) {
        if (e.optional && (e.gguf != "output.weight" || p.tied)) continue;  // rope_freqs: the builder takes the config's factors
        const int64_t layer = tensor_layer(e.gguf);
        const bool bias = e.gguf.ends_with(".bias");
        const int64_t ne1 = e.shape.size() > 1 ? e.shape[1] : 1;
        specs.push_back({e.gguf, e.shape[0], ne1, layer, e.kind == TensorKind::Vector && !bias,
                         e.kind == TensorKind::Experts ? e.n_expert : 1, e.keep_float || e.kind == TensorKind::Vector, bias,
                         e.hf_neg_exp});
    }

    std::mt19937_64 rng(seed);
    std::normal_distribution<float> gauss(0.0f, 0.02f);
    constexpr int64_t kPool = 64;  // distinct rows per tensor
    std::vector<float> row;
    int64_t done = 0;
    for (const Spec& s : specs) {
        // A tied token embedding is also the output projection: llama.cpp's
        // mixes give it the output's type.
        const std::string as = p.tied && s.name == "token_embd.weight" ? "output.weight" : s.name;
        const DType t = s.norm || s.f32 ? DType::F32 : synth_tensor_type(scheme, as, s.layer, c.n_layer, s.ne0);
        const size_t rb = row_size(t, s.ne0);
        const int64_t rows = s.ne1 * s.ne2;
        auto buf = std::shared_ptr<uint8_t[]>(new uint8_t[rb * static_cast<size_t>(rows)]);
        if (s.norm || s.bias) {  // every value of the table (a conv1d's taps: ne0 × ne1)
            float* f = reinterpret_cast<float*>(buf.get());
            const float mean = s.negative ? -1.0f : s.norm ? 1.0f : 0.0f;
            for (int64_t i = 0; i < s.ne0 * s.ne1; ++i) f[i] = mean + gauss(rng);
        } else {
            const int64_t pool = std::min(kPool, rows);
            row.resize(static_cast<size_t>(s.ne0));
            for (int64_t r = 0; r < pool; ++r) {
                for (auto& v : row) v = gauss(rng);
                quantize_row_ref(t, row.data(), buf.get() + static_cast<size_t>(r) * rb, s.ne0);
            }
            for (int64_t r = pool; r < rows; ++r) {
                // Multiplicative hashing mod 64 sees only r mod 64, so every
                // expert of a 3-D bank (rows a multiple of 64 apart) would get
                // the same matrix; banks mix all bits of r (splitmix64's
                // finaliser) so that experts differ and routing matters.
                uint64_t h = static_cast<uint64_t>(r);
                if (s.ne2 > 1) {
                    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
                    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
                    h ^= h >> 31;
                } else {
                    h *= 2654435761u;
                }
                const uint64_t src = h % static_cast<uint64_t>(pool);
                std::memcpy(buf.get() + static_cast<size_t>(r) * rb, buf.get() + src * rb, rb);
            }
        }
        std::array<int64_t, 4> ne{s.ne0, s.ne1, s.ne2, 1};
        m.weights.add(Tensor::contiguous(t, ne, buf.get(), s.name), std::shared_ptr<const void>(buf, buf.get()));
        m.order.push_back(s.name);
        if (progress) progress(++done, static_cast<int64_t>(specs.size()));
    }
    return m;
}

void write_synthetic_gguf(const SynthModel& m, const std::string& path,
                          const std::function<void(uint64_t, uint64_t)>& progress) {
    const auto& c = m.cfg;
    for (const auto& name : m.order)
        if (const Tensor* t = m.weights.find(name); t && static_cast<uint32_t>(t->type) >= kDTypeQuernBase)
            fail("a GGUF file cannot hold tensor '{}' of quern's own {} layout (use it in memory: quern bench "
                 "--synthetic ... --quant {})",
                 name, dtype_name(t->type), m.scheme);
    GgufWriter w;
    c.write_gguf(w);
    w.set_u32("general.file_type", synth_file_type(m.scheme));
    w.set_u32("general.quantization_version", 2);

    // Byte-level BPE vocabulary: the 256 byte characters, three specials, then
    // reserved control tokens up to n_vocab. No merges: text encodes to bytes.
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    const auto& bm = unicode::ByteMap::get();
    for (int b = 0; b < 256; ++b) {
        tokens.emplace_back(bm.byte_to_utf8(static_cast<uint8_t>(b)));
        types.push_back(1);  // NORMAL
    }
    for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
        tokens.emplace_back(s);
        types.push_back(3);  // CONTROL
    }
    for (int64_t i = static_cast<int64_t>(tokens.size()); i < c.n_vocab; ++i) {
        tokens.push_back(fmt::format("<|reserved_{}|>", i));
        types.push_back(3);
    }
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "gpt-2");
    w.set_string_array("tokenizer.ggml.tokens", std::move(tokens));
    w.set_i32_array("tokenizer.ggml.token_type", types);
    w.set_string_array("tokenizer.ggml.merges", {});
    w.set_u32("tokenizer.ggml.bos_token_id", 257);
    w.set_u32("tokenizer.ggml.eos_token_id", 256);
    w.set_u32("tokenizer.ggml.padding_token_id", 256);
    w.set_bool("tokenizer.ggml.add_bos_token", false);

    for (const auto& name : m.order) {
        const Tensor* t = m.weights.find(name);
        const int n_dims = t->ne[2] > 1 ? 3 : t->ne[1] == 1 ? 1 : 2;
        w.add_tensor(name, t->type, t->ne, n_dims, t->data);
    }
    w.write(path, progress);
}

}  // namespace quern
