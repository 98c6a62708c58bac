#include "model/config.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "formats/gguf.h"

namespace quern {

float ModelConfig::qk_scale() const {
    const float s = attn_scale > 0.0f ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
    return s * rope_attn_factor * rope_attn_factor;
}

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
    ModelConfig c;
    c.arch = f.get_string("general.architecture");
    const bool gemma = c.arch == "gemma2" || c.arch == "gemma3";
    if (c.arch != "llama" && c.arch != "qwen2" && c.arch != "qwen3" && c.arch != "phi3" && c.arch != "qwen3moe" &&
        !gemma)
        fail("model architecture '{}' is not supported yet (supported: llama — Llama, Mistral, SmolLM, Mixtral; "
             "qwen2; qwen3; phi3; qwen3moe; gemma2, gemma3)",
             c.arch);
    c.name = f.get_string("general.name", "");
    const std::string a = c.arch + ".";
    c.n_embd = f.get_int(a + "embedding_length");
    c.n_layer = f.get_int(a + "block_count");
    c.n_head = f.get_int(a + "attention.head_count");
    c.n_head_kv = f.get_int(a + "attention.head_count_kv", c.n_head);
    if (c.arch == "qwen3moe") {
        c.n_ff_exp = f.get_int(a + "expert_feed_forward_length");
        c.n_ff = f.get_int(a + "feed_forward_length", c.n_ff_exp);
    } else {
        c.n_ff = f.get_int(a + "feed_forward_length");
    }
    c.n_ctx_train = f.get_int(a + "context_length", 4096);
    if (c.n_head <= 0) fail("gguf key '{}attention.head_count' must be positive, got {}", a, c.n_head);
    c.head_dim = f.get_int(a + "attention.key_length", c.n_embd / c.n_head);
    const int64_t vdim = f.get_int(a + "attention.value_length", c.head_dim);
    if (vdim != c.head_dim) fail("key length {} != value length {} is not supported", c.head_dim, vdim);
    c.rope_dim = f.get_int(a + "rope.dimension_count", c.head_dim);
    c.rope_base = static_cast<float>(f.get_float(a + "rope.freq_base", 10000.0));
    c.rms_eps = static_cast<float>(f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5));
    if (const auto* t = f.find_tensor("token_embd.weight")) c.n_vocab = t->ne[1];
    else fail("tensor 'token_embd.weight' is missing");
    c.rope_neox = false;
    // Mixture of experts (llama.cpp's build_moe_ffn with softmax gating): the
    // llama architecture's experts have width feed_forward_length.
    c.n_expert = f.get_int(a + "expert_count", 0);
    if (c.n_expert > 0) {
        c.n_expert_used = f.get_int(a + "expert_used_count");
        if (c.n_ff_exp == 0) c.n_ff_exp = c.n_ff;
        c.expert_weights_norm = f.get_bool(a + "expert_weights_norm", true);
        const int64_t shared = f.get_int(a + "expert_shared_count", 0);
        if (shared != 0) fail("gguf key '{}expert_shared_count' = {}: shared experts are not supported", a, shared);
    } else if (c.arch == "qwen3moe") {
        fail("gguf key '{}expert_count' is missing or 0 (a qwen3moe file needs experts)", a);
    }
    if (c.arch == "qwen3moe" || c.arch == "qwen3") {
        // llama.cpp: LLM_ARCH_QWEN3 / QWEN3MOE use NeoX RoPE and per-head q/k RMSNorm.
        c.rope_neox = true;
        c.qk_norm = true;
    }
    if (c.arch == "qwen2") {
        // llama.cpp: LLM_ARCH_QWEN2 uses NeoX RoPE and biases on q, k and v.
        c.rope_neox = true;
        c.qkv_bias = true;
    }
    if (c.arch == "phi3") {
        // llama.cpp: LLM_ARCH_PHI3 uses NeoX RoPE, a fused QKV projection
        // (attn_qkv) and gate/up in one ffn_up (gate rows first).
        c.rope_neox = true;
        c.fused_qkv = true;
        c.fused_gate_up = true;
        for (const char* t : {"rope_factors_long.weight", "rope_factors_short.weight"})
            if (f.find_tensor(t))
                fail("tensor '{}': Phi-3 LongRoPE (su) scaling is not supported (only plain RoPE: the 4k-context "
                     "Phi-3 models)",
                     t);
        c.sliding_window = f.get_int(a + "attention.sliding_window", 0);
        if (c.sliding_window < 0) fail("gguf key '{}attention.sliding_window' must not be negative", a);
        if (c.sliding_window > 0) c.swa_layers.assign(static_cast<size_t>(std::max<int64_t>(c.n_layer, 0)), 1);
    }
    if (gemma) {
        // llama.cpp: LLM_ARCH_GEMMA2 / LLM_ARCH_GEMMA3 use NeoX RoPE, scale the
        // embeddings by sqrt(n_embd), and norm both sides of each sub-block.
        c.rope_neox = true;
        c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
        c.post_norms = true;
        c.gelu_ffn = true;
        c.qk_norm = c.arch == "gemma3";
        // The 27B models scale queries by 1/sqrt(n_embd / n_head) (their
        // query_pre_attn_scalar), the others by 1/sqrt(head_dim).
        const bool big = (c.arch == "gemma2" && c.n_layer == 46) || (c.arch == "gemma3" && c.n_layer == 62);
        c.attn_scale = 1.0f / std::sqrt(static_cast<float>(big ? c.n_embd / c.n_head : c.head_dim));
        c.sliding_window = f.get_int(a + "attention.sliding_window", c.arch == "gemma2" ? 4096 : 0);
        const int64_t pattern = f.get_int(a + "attention.sliding_window_pattern", c.arch == "gemma2" ? 2 : 6);
        if (c.sliding_window < 0) fail("gguf key '{}attention.sliding_window' must not be negative", a);
        if (pattern <= 0) fail("gguf key '{}attention.sliding_window_pattern' must be positive, got {}", a, pattern);
        if (c.sliding_window > 0) {
            c.swa_layers.resize(static_cast<size_t>(std::max<int64_t>(c.n_layer, 0)));
            for (int64_t il = 0; il < c.n_layer; ++il) c.swa_layers[static_cast<size_t>(il)] = il % pattern < pattern - 1;
        }
        c.rope_base_local = static_cast<float>(
            f.get_float(a + "rope.freq_base_swa", c.arch == "gemma3" ? 10000.0 : static_cast<double>(c.rope_base)));
        if (c.arch == "gemma2") {
            c.attn_softcap = static_cast<float>(f.get_float(a + "attn_logit_softcapping", 50.0));
            c.final_softcap = static_cast<float>(f.get_float(a + "final_logit_softcapping", 30.0));
        }
        const std::string st = f.get_string(a + "rope.scaling.type", "none");
        const double factor = f.get_float(a + "rope.scaling.factor", 1.0);
        if (st == "linear" && factor != 1.0) {
            if (!(factor > 0)) fail("gguf key '{}rope.scaling.factor' must be positive, got {}", a, factor);
            c.rope_freq_factors.assign(static_cast<size_t>(std::max<int64_t>(c.rope_dim / 2, 0)), static_cast<float>(factor));
            c.rope_factors_global_only = c.arch == "gemma3";
        } else if (st != "none" && st != "linear") {
            fail("gguf key '{}rope.scaling.type' = '{}' is not supported for {}", a, st, c.arch);
        }
    }
    c.validate();
    return c;
}

void ModelConfig::validate() const {
    auto pos = [](const char* what, int64_t v) {
        if (v <= 0 || v > (int64_t{1} << 31)) fail("model hyper-parameter {} = {} is out of range", what, v);
    };
    pos("n_vocab", n_vocab);
    pos("n_embd", n_embd);
    pos("n_layer", n_layer);
    pos("n_head", n_head);
    pos("n_head_kv", n_head_kv);
    pos("n_ff", n_ff);
    pos("head_dim", head_dim);
    pos("rope_dim", rope_dim);
    if (n_head % n_head_kv != 0) fail("n_head {} is not a multiple of n_head_kv {}", n_head, n_head_kv);
    if (rope_dim > head_dim || rope_dim % 2 != 0) fail("rope dimension {} must be even and <= head_dim {}", rope_dim, head_dim);
    if (!(rope_base > 0.0f)) fail("rope freq_base must be positive, got {}", rope_base);
    if (!(rms_eps > 0.0f)) fail("RMSNorm epsilon must be positive, got {}", rms_eps);
    if (!swa_layers.empty() && static_cast<int64_t>(swa_layers.size()) != n_layer)
        fail("{} sliding-window layer flags for {} layers", swa_layers.size(), n_layer);
    if (sliding_window < 0) fail("sliding window {} must not be negative", sliding_window);
    if (n_expert < 0 || n_expert > 4096) fail("expert count {} is out of range", n_expert);
    if (n_expert > 0) {
        if (n_expert_used <= 0 || n_expert_used > n_expert)
            fail("experts used per token {} must be in [1, {}]", n_expert_used, n_expert);
        pos("n_ff_exp", n_ff_exp);
    }
    if (attn_scale < 0.0f || attn_softcap < 0.0f || final_softcap < 0.0f || embd_scale < 0.0f || rope_base_local < 0.0f)
        fail("attention scale, soft-caps, embedding scale and local RoPE base must not be negative");
    if (longrope() || !rope_factors_short.empty()) {
        const auto half = static_cast<size_t>(rope_dim / 2);
        if (rope_factors_short.size() != half || rope_factors_long.size() != half)
            fail("LongRoPE needs {} short and {} long factors (rope_dim / 2), got {} and {}", half, half,
                 rope_factors_short.size(), rope_factors_long.size());
        for (const auto* v : {&rope_factors_short, &rope_factors_long})
            for (float f : *v)
                if (!(f > 0.0f)) fail("LongRoPE factors must be positive, got {}", f);
        if (rope_dim != head_dim) fail("LongRoPE with a partial rotation (rope_dim {} < head_dim {}) is not supported", rope_dim, head_dim);
        if (rope_orig_ctx <= 0) fail("LongRoPE needs the original context length, got {}", rope_orig_ctx);
        if (!rope_freq_factors.empty()) fail("LongRoPE cannot be combined with other RoPE frequency factors");
    }
    if (!(rope_attn_factor > 0.0f)) fail("the RoPE attention factor must be positive, got {}", rope_attn_factor);
}

}  // namespace quern
