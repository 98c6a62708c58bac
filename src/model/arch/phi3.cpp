// Phi-3 / Phi-3.5: the Llama block with NeoX-ordered RoPE (partial rotation
// and LongRoPE scaling from config.json), one fused projection for q, k and v
// (attn_qkv / qkv_proj: q rows, then k, then v) and one for gate and up
// (ffn_up / gate_up_proj: gate rows, then up), used as their row slices, and
// a sliding window on every layer. llama.cpp's llm_build_phi3; transformers'
// Phi3ForCausalLM.
#include "model/arch/blocks.h"

namespace quern::arch {

namespace {

void gguf_config(const GgufKeys& k, ModelConfig& c) {
    c.rope_neox = true;
    for (const char* t : {"rope_factors_long.weight", "rope_factors_short.weight"})
        if (k.has_tensor(t))
            fail("tensor '{}': Phi-3 LongRoPE (su) scaling is not supported in GGUF files (only plain RoPE: the "
                 "4k-context Phi-3 models; Hugging Face folders run LongRoPE)",
                 t);
    c.sliding_window = k.get_int("attention.sliding_window", 0);
    if (c.sliding_window < 0) fail("gguf key '{}attention.sliding_window' must not be negative", k.prefix);
    if (c.sliding_window > 0) c.swa_layers.assign(static_cast<size_t>(std::max<int64_t>(c.n_layer, 0)), 1);
}

void hf_config(const HfKeys& k, const std::string&, ModelConfig& c) {
    hf_require_silu(k);
    hf_full_attention(k);
    hf_uniform_window(k, c);
}

void gguf_write(const ModelConfig& c, GgufWriter& w, const std::string& a) {
    gguf_write_heads(c, w, a);
    w.set_u32(a + "rope.scaling.original_context_length", static_cast<uint32_t>(c.n_ctx_train));
}

void tensors(const ModelConfig& c, TensorTable& t) {
    table_embedding(c, t);
    for (int64_t il = 0; il < c.n_layer; ++il) {
        table_attention(c, t, il, /*fused_qkv=*/true);
        t.vector(blk(il, "ffn_norm.weight"), hf_layer(il, "post_attention_layernorm.weight"), c.n_embd);
        table_ffn(c, t, il, /*fused_gate_up=*/true);
    }
    table_head(c, t);
}

Program build(const ModelConfig& c, const BoundWeights& w) {
    ProgramBuilder b = make_builder(c);
    Value x = embed(b, c, w);
    for (int64_t il = 0; il < c.n_layer; ++il) {
        b.set_layer(static_cast<int>(il));
        Value h = b.rms_norm(x, w.get(blk(il, "attn_norm.weight")), c.rms_eps);
        x = b.add(x, self_attention(b, c, w, il, h, /*fused_qkv=*/true));
        h = b.rms_norm(x, w.get(blk(il, "ffn_norm.weight")), c.rms_eps);
        x = b.add(x, gated_ffn(b, c, w, il, h, GluAct::SiLU, /*fused_gate_up=*/true));
        trace_layer(b, il, x);
    }
    return output_head(b, c, w, x);
}

}  // namespace

extern const ArchDef kPhi3{"phi3", {"phi3"}, gguf_config, {}, hf_config, {}, tensors, build, gguf_write};

}  // namespace quern::arch
