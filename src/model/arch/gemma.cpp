// Gemma 2 and Gemma 3 (text): embeddings scaled by sqrt(n_embd), an RMSNorm
// on both sides of each sub-block (post_attention_norm and post_ffw_norm
// before the residual adds), a GELU-tanh gated FFN, sliding-window attention
// on the local layers with their own RoPE base (Gemma 3), the query scale
// query_pre_attn_scalar^-1/2, soft-capped attention scores and logits
// (Gemma 2) and per-head q/k RMSNorm (Gemma 3). llama.cpp's
// llm_build_gemma2_iswa / gemma3_iswa; transformers' Gemma2DecoderLayer /
// Gemma3DecoderLayer. RMSNorm weights multiply as 1 + w: llama.cpp's converter
// has added the 1 in GGUF files, and checkpoints get it at load (hf_add_one).
#include <cmath>

#include "model/arch/blocks.h"

namespace quern::arch {

namespace {

void gguf_config(const GgufKeys& k, ModelConfig& c) {
    const bool g2 = c.arch == "gemma2";
    c.rope_neox = true;
    c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
    c.qk_norm = !g2;
    // The 27B models scale queries by 1/sqrt(n_embd / n_head) (their
    // query_pre_attn_scalar), the others by 1/sqrt(head_dim).
    const bool big = (g2 && c.n_layer == 46) || (!g2 && c.n_layer == 62);
    c.attn_scale = 1.0f / std::sqrt(static_cast<float>(big ? c.n_embd / c.n_head : c.head_dim));
    c.sliding_window = k.get_int("attention.sliding_window", g2 ? 4096 : 0);
    const int64_t pattern = k.get_int("attention.sliding_window_pattern", g2 ? 2 : 6);
    if (c.sliding_window < 0) fail("gguf key '{}attention.sliding_window' must not be negative", k.prefix);
    if (pattern <= 0) fail("gguf key '{}attention.sliding_window_pattern' must be positive, got {}", k.prefix, pattern);
    if (c.sliding_window > 0) {
        c.swa_layers.resize(static_cast<size_t>(std::max<int64_t>(c.n_layer, 0)));
        for (int64_t il = 0; il < c.n_layer; ++il) c.swa_layers[static_cast<size_t>(il)] = il % pattern < pattern - 1;
    }
    c.rope_base_local =
        static_cast<float>(k.get_float("rope.freq_base_swa", g2 ? static_cast<double>(c.rope_base) : 10000.0));
    if (g2) {
        c.attn_softcap = static_cast<float>(k.get_float("attn_logit_softcapping", 50.0));
        c.final_softcap = static_cast<float>(k.get_float("final_logit_softcapping", 30.0));
    }
    const std::string st = k.get_string("rope.scaling.type", "none");
    const double factor = k.get_float("rope.scaling.factor", 1.0);
    if (st == "linear" && factor != 1.0) {
        if (!(factor > 0)) fail("gguf key '{}rope.scaling.factor' must be positive, got {}", k.prefix, factor);
        c.rope_freq_factors.assign(static_cast<size_t>(std::max<int64_t>(c.rope_dim / 2, 0)), static_cast<float>(factor));
        c.rope_factors_global_only = !g2;
    } else if (st != "none" && st != "linear") {
        fail("gguf key '{}rope.scaling.type' = '{}' is not supported for {}", k.prefix, st, c.arch);
    }
}

void hf_config(const HfKeys& k, const std::string& model_type, ModelConfig& c) {
    const bool g2 = c.arch == "gemma2";
    // Gemma2Config / Gemma3TextConfig name it hidden_activation (hidden_act in older configs).
    const std::string act =
        k.has("hidden_activation") ? k.get_string("hidden_activation", "") : k.get_string("hidden_act", "gelu_pytorch_tanh");
    if (act != "gelu_pytorch_tanh" && act != "gelu_new")
        fail("{}: hidden_activation '{}' is not supported (quern computes gelu_pytorch_tanh)", k.where, act);
    c.qk_norm = !g2;
    // Embeddings × sqrt(hidden_size) (in the activation dtype: float here),
    // scores scaled by query_pre_attn_scalar^-1/2, optional soft-capping.
    c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
    const double qpas = k.get_float("query_pre_attn_scalar", 256.0);
    if (!(qpas > 0)) fail("{}: query_pre_attn_scalar must be positive, got {}", k.where, qpas);
    c.attn_scale = static_cast<float>(1.0 / std::sqrt(qpas));
    // Absent: the class default (Gemma2Config 50 / 30); null: no capping.
    const auto cap = [&](const char* key, double def) {
        return static_cast<float>(k.j.contains(key) && k.j[key].is_null() ? 0.0 : k.get_float(key, def));
    };
    c.attn_softcap = cap("attn_logit_softcapping", g2 ? 50.0 : 0.0);
    c.final_softcap = cap("final_logit_softcapping", g2 ? 30.0 : 0.0);
    if (c.attn_softcap < 0 || c.final_softcap < 0) fail("{}: soft-capping values must not be negative", k.where);
    if (k.get_bool("use_bidirectional_attention", false))
        fail("{}: use_bidirectional_attention = true is not supported (quern computes causal attention)", k.where);
    // Local layers: layer_types, else every layer but each
    // sliding_window_pattern-th (gemma2: 2, gemma3: 6).
    c.sliding_window = k.get_int("sliding_window", 4096);
    if (c.sliding_window <= 0) fail("{}: sliding_window must be positive, got {}", k.where, c.sliding_window);
    if (c.n_layer > 0 && c.n_layer <= (int64_t{1} << 20)) {
        c.swa_layers.assign(static_cast<size_t>(c.n_layer), 0);
        if (!hf_layer_types(k, c)) {
            const char* pk = k.has("sliding_window_pattern") ? "sliding_window_pattern" : "_sliding_window_pattern";
            const int64_t pattern = k.get_int(pk, g2 ? 2 : 6);
            if (pattern <= 0) fail("{}: {} must be positive, got {}", k.where, pk, pattern);
            for (int64_t il = 0; il < c.n_layer; ++il) c.swa_layers[static_cast<size_t>(il)] = (il + 1) % pattern != 0;
        }
    }
    if (!g2) {
        // Gemma 3's local layers turn at rope_local_base_freq (or
        // rope_parameters.sliding_attention's theta), unscaled.
        c.rope_base_local = static_cast<float>(k.get_float("rope_local_base_freq", 10000.0));
        c.rope_factors_global_only = true;
    }
}

void gguf_write(const ModelConfig& c, GgufWriter& w, const std::string& a) {
    // llama.cpp's converter: the head size always, no rope.dimension_count.
    gguf_write_heads(c, w, a, /*key_length=*/true, /*rope_dim=*/false);
    if (c.arch == "gemma2") {
        w.set_f32(a + "attn_logit_softcapping", c.attn_softcap);
        w.set_f32(a + "final_logit_softcapping", c.final_softcap);
    }
    if (c.arch == "gemma3" && !c.rope_freq_factors.empty()) {
        w.set_string(a + "rope.scaling.type", "linear");
        w.set_f32(a + "rope.scaling.factor", c.rope_freq_factors[0]);
    }
}

void tensors(const ModelConfig& c, TensorTable& t) {
    table_embedding(c, t);
    for (int64_t il = 0; il < c.n_layer; ++il) {
        table_attention(c, t, il);
        t.vector(blk(il, "post_attention_norm.weight"), hf_layer(il, "post_attention_layernorm.weight"), c.n_embd);
        t.vector(blk(il, "ffn_norm.weight"), hf_layer(il, "pre_feedforward_layernorm.weight"), c.n_embd);
        table_ffn(c, t, il);
        t.vector(blk(il, "post_ffw_norm.weight"), hf_layer(il, "post_feedforward_layernorm.weight"), c.n_embd);
    }
    table_head(c, t);
    for (TensorEntry& e : t.entries())  // Gemma2RMSNorm / Gemma3RMSNorm multiply by (1 + w)
        if (e.kind == TensorKind::Vector && e.gguf.ends_with("norm.weight")) e.hf_add_one = true;
}

Program build(const ModelConfig& c, const BoundWeights& w) {
    ProgramBuilder b = make_builder(c);
    Value x = embed(b, c, w);  // × sqrt(n_embd)
    for (int64_t il = 0; il < c.n_layer; ++il) {
        b.set_layer(static_cast<int>(il));
        Value h = b.rms_norm(x, w.get(blk(il, "attn_norm.weight")), c.rms_eps);
        Value a = self_attention(b, c, w, il, h);  // window, local RoPE, soft-cap, q/k norms by the config
        x = b.add(x, b.rms_norm(a, w.get(blk(il, "post_attention_norm.weight")), c.rms_eps));
        h = b.rms_norm(x, w.get(blk(il, "ffn_norm.weight")), c.rms_eps);
        Value f = gated_ffn(b, c, w, il, h, GluAct::GeluTanh);
        x = b.add(x, b.rms_norm(f, w.get(blk(il, "post_ffw_norm.weight")), c.rms_eps));
        trace_layer(b, il, x);
    }
    return output_head(b, c, w, x);  // soft-capped logits (Gemma 2)
}

constexpr HfDefaults kGemma2Hf{.head_dim = 256, .n_ctx = 8192, .tie_embeddings = true, .per_layer_rope = true};
constexpr HfDefaults kGemma3Hf{.head_dim = 256,
                               .n_ctx = 131072,
                               .tie_embeddings = true,
                               .rope_theta = 1000000.0,
                               .per_layer_rope = true,
                               .rope_local = true};

}  // namespace

extern const ArchDef kGemma2{"gemma2", {"gemma2"}, gguf_config, kGemma2Hf, hf_config, {}, tensors, build, gguf_write};
extern const ArchDef kGemma3{"gemma3",
                             {"gemma3_text"},
                             gguf_config,
                             kGemma3Hf,
                             hf_config,
                             {{"gemma3", "is the multimodal Gemma3ForConditionalGeneration; quern reads text-only "
                                         "checkpoints (model_type gemma3_text, Gemma3ForCausalLM)"}},
                             tensors,
                             build,
                             gguf_write};

}  // namespace quern::arch
