// IBM Granite 3.x (dense): the Llama block with four multipliers — token
// embeddings × embedding_multiplier, each branch × residual_multiplier before
// its residual add, attention scores × attention_multiplier (in place of
// 1/sqrt(head_dim)), logits ÷ logits_scaling. llama.cpp's llm_build_granite
// ({arch}.embedding_scale, residual_scale, attention.scale, logit_scale);
// transformers' GraniteForCausalLM.
#include "model/arch/blocks.h"

namespace quern::arch {

namespace {

void gguf_config(const GgufKeys& k, ModelConfig& c) {
    // llama.cpp writes 0 for a multiplier the model does not have.
    c.embd_scale = static_cast<float>(k.get_float("embedding_scale", 0.0));
    c.attn_scale = static_cast<float>(k.get_float("attention.scale", 0.0));
    const double rs = k.get_float("residual_scale", 0.0);
    c.extra["residual_scale"] = rs == 0.0 ? 1.0f : static_cast<float>(rs);
    const double ls = k.get_float("logit_scale", 1.0);
    if (!(ls > 0.0)) fail("gguf key '{}logit_scale' must be positive, got {}", k.prefix, ls);
    c.extra["logit_scale"] = static_cast<float>(ls);
}

void hf_config(const HfKeys& k, const std::string&, ModelConfig& c) {
    hf_require_silu(k);
    hf_full_attention(k);
    const double em = k.get_float("embedding_multiplier", 1.0), am = k.get_float("attention_multiplier", 1.0);
    const double rm = k.get_float("residual_multiplier", 1.0), ls = k.get_float("logits_scaling", 1.0);
    if (!(em > 0 && am > 0 && rm > 0 && ls > 0))
        fail("{}: the Granite multipliers must be positive (embedding {}, attention {}, residual {}, logits {})",
             k.where, em, am, rm, ls);
    c.embd_scale = em == 1.0 ? 0.0f : static_cast<float>(em);
    c.attn_scale = static_cast<float>(am);
    c.extra["residual_scale"] = static_cast<float>(rm);
    c.extra["logit_scale"] = static_cast<float>(ls);
}

void gguf_write(const ModelConfig& c, GgufWriter& w, const std::string& a) {
    gguf_write_heads(c, w, a);
    if (c.embd_scale > 0.0f) w.set_f32(a + "embedding_scale", c.embd_scale);
    if (c.attn_scale > 0.0f) w.set_f32(a + "attention.scale", c.attn_scale);
    w.set_f32(a + "residual_scale", c.extra.at("residual_scale"));
    w.set_f32(a + "logit_scale", c.extra.at("logit_scale"));
}

void tensors(const ModelConfig& c, TensorTable& t) {
    table_embedding(c, t);
    for (int64_t il = 0; il < c.n_layer; ++il) {
        table_attention(c, t, il);
        t.vector(blk(il, "ffn_norm.weight"), hf_layer(il, "post_attention_layernorm.weight"), c.n_embd);
        table_ffn(c, t, il);
    }
    table_head(c, t);
}

Program build(const ModelConfig& c, const BoundWeights& w) {
    const float rs = c.extra.at("residual_scale");
    const auto branch = [&](ProgramBuilder& b, Value v) { return rs == 1.0f ? v : b.scale(v, rs); };
    ProgramBuilder b = make_builder(c);
    Value x = embed(b, c, w);  // × embedding_multiplier
    for (int64_t il = 0; il < c.n_layer; ++il) {
        b.set_layer(static_cast<int>(il));
        Value h = b.rms_norm(x, w.get(blk(il, "attn_norm.weight")), c.rms_eps);
        x = b.add(x, branch(b, self_attention(b, c, w, il, h)));  // scores × attention_multiplier (qk_scale)
        h = b.rms_norm(x, w.get(blk(il, "ffn_norm.weight")), c.rms_eps);
        x = b.add(x, branch(b, gated_ffn(b, c, w, il, h, GluAct::SiLU)));
        trace_layer(b, il, x);
    }
    return output_head(b, c, w, x, 1.0f / c.extra.at("logit_scale"));
}

}  // namespace

extern const ArchDef kGranite{"granite", {"granite"}, gguf_config, {}, hf_config, {}, tensors, build, gguf_write, nullptr, true};

}  // namespace quern::arch
