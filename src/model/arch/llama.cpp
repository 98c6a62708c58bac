// The Llama family (Llama 1/2/3, Mistral, SmolLM) and Mixtral (llama with
// experts): pre-norm decoder blocks of RMSNorm → GQA self-attention with RoPE
// → residual, RMSNorm → SwiGLU FFN (or a top-k mixture of SwiGLU experts) →
// residual; final RMSNorm and an output projection (the token embedding when
// tied). llama.cpp's llm_build_llama; transformers' LlamaForCausalLM,
// MistralForCausalLM, MixtralForCausalLM. GGUF llama files store q and k rows
// permuted for interleaved RoPE pairs; checkpoints keep transformers' order
// with rotate_half pairs (ModelConfig::rope_neox).
#include "model/arch/blocks.h"

namespace quern::arch {

namespace {

void gguf_config(const GgufKeys&, ModelConfig&) {}  // the shared keys say it all (experts included)

void hf_config(const HfKeys& k, const std::string& model_type, ModelConfig& c) {
    hf_require_silu(k);
    hf_full_attention(k);
    if (model_type == "mixtral") {
        // MixtralSparseMoeBlock: num_local_experts experts of width intermediate_size.
        hf_experts(k, c);
        c.n_ff_exp = c.n_ff;
        c.expert_weights_norm = true;
        hf_uniform_window(k, c);  // MistralConfig's sliding_window
    }
}

void tensors(const ModelConfig& c, TensorTable& t) {
    // MixtralSparseMoeBlock: w1 gate, w3 up, w2 down.
    table_llama(c, t, {"block_sparse_moe.", "gate.weight", "w1.weight", "w3.weight", "w2.weight"});
}

}  // namespace

Program build_llama(const ModelConfig& c, const BoundWeights& w) {
    ProgramBuilder b = make_builder(c);
    Value x = embed(b, c, w);
    for (int64_t il = 0; il < c.n_layer; ++il) {
        b.set_layer(static_cast<int>(il));
        Value h = b.rms_norm(x, w.get(blk(il, "attn_norm.weight")), c.rms_eps);
        x = b.add(x, self_attention(b, c, w, il, h));
        h = b.rms_norm(x, w.get(blk(il, "ffn_norm.weight")), c.rms_eps);
        x = b.add(x, c.moe() ? moe_ffn(b, c, w, il, h, GluAct::SiLU) : gated_ffn(b, c, w, il, h, GluAct::SiLU));
        trace_layer(b, il, x);
    }
    return output_head(b, c, w, x);
}

extern const ArchDef kLlama{"llama", {"llama", "mixtral"}, gguf_config, {}, hf_config, {}, tensors, build_llama, gguf_write_llama, nullptr, true};

}  // namespace quern::arch
