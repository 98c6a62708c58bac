// Qwen2 / Qwen2.5, Qwen3 and Qwen3-MoE: the Llama block with NeoX-ordered
// RoPE, plus biases on the q, k and v projections (Qwen2), or a per-head
// RMSNorm of queries and keys before RoPE (Qwen3), with every FFN a top-k
// mixture of SwiGLU experts (Qwen3-MoE). llama.cpp's llm_build_qwen2 /
// qwen3 / qwen3moe; transformers' Qwen2ForCausalLM, Qwen3ForCausalLM,
// Qwen3MoeForCausalLM. The program is the Llama family's (build_llama): the
// biases and q/k norms come with the config.
#include "model/arch/blocks.h"

namespace quern::arch {

namespace {

void gguf_qwen2(const GgufKeys&, ModelConfig& c) {
    c.rope_neox = true;
    c.qkv_bias = true;
}

void gguf_qwen3(const GgufKeys& k, ModelConfig& c) {
    c.rope_neox = true;
    c.qk_norm = true;
    if (c.arch == "qwen3moe") {
        if (c.n_expert == 0) fail("gguf key '{}expert_count' is missing or 0 (a qwen3moe file needs experts)", k.prefix);
        c.n_ff_exp = k.get_int("expert_feed_forward_length");  // required: the experts' width
    }
}

void hf_config(const HfKeys& k, const std::string& model_type, ModelConfig& c) {
    hf_require_silu(k);
    hf_full_attention(k);
    if (model_type == "qwen2") {
        c.qkv_bias = true;  // Qwen2Attention: q/k/v with bias, o without
        c.out_bias = false;
    } else {
        c.qk_norm = true;
    }
    if (model_type == "qwen3_moe") {
        // Qwen3MoeSparseMoeBlock in every layer: num_experts of width
        // moe_intermediate_size, renormalised when norm_topk_prob.
        hf_experts(k, c);
        c.n_ff_exp = k.get_int("moe_intermediate_size");
        c.expert_weights_norm = k.get_bool("norm_topk_prob", false);
        if (k.get_int("decoder_sparse_step", 1) != 1)
            fail("{}: decoder_sparse_step != 1 (dense layers between sparse ones) is not supported", k.where);
        if (k.has("mlp_only_layers") && !(k.j["mlp_only_layers"].is_array() && k.j["mlp_only_layers"].empty()))
            fail("{}: mlp_only_layers {} (dense layers in a MoE model) are not supported", k.where,
                 k.j["mlp_only_layers"].dump());
    }
}

void gguf_write_qwen2(const ModelConfig& c, GgufWriter& w, const std::string& a) { gguf_write_heads(c, w, a); }

void gguf_write_qwen3(const ModelConfig& c, GgufWriter& w, const std::string& a) {
    gguf_write_heads(c, w, a, /*key_length=*/true);  // Qwen3Config gives head_dim
    if (c.moe()) w.set_u32(a + "expert_feed_forward_length", static_cast<uint32_t>(c.n_ff_exp));
}

void tensors(const ModelConfig& c, TensorTable& t) {
    table_llama(c, t, {"mlp.", "gate.weight", "gate_proj.weight", "up_proj.weight", "down_proj.weight"});
}

constexpr HfDefaults kQwenHf{.head_dim = 0, .n_ctx = 32768};
constexpr HfDefaults kQwen3Hf{.head_dim = 128, .n_ctx = 32768};

}  // namespace

extern const ArchDef kQwen2{"qwen2", {"qwen2"}, gguf_qwen2, kQwenHf, hf_config, {}, tensors, build_llama, gguf_write_qwen2};
extern const ArchDef kQwen3{"qwen3", {"qwen3"}, gguf_qwen3, kQwen3Hf, hf_config, {}, tensors, build_llama, gguf_write_qwen3};
extern const ArchDef kQwen3Moe{"qwen3moe", {"qwen3_moe"}, gguf_qwen3, kQwen3Hf, hf_config, {},
                               tensors,    build_llama,   gguf_write_qwen3};

}  // namespace quern::arch
