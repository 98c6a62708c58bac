// Pieces the decoder-only families share: tensor-table rows of the usual
// attention and FFN blocks (GGUF names as llama.cpp writes them, Hugging Face
// names as transformers' Llama-style state dicts hold them) and the program
// fragments built from them. Each family's file composes these.
#pragma once
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"
#include "model/arch/arch.h"

namespace quern::arch {

/// "blk.{il}.{s}" (GGUF) and "model.layers.{il}.{s}" (Hugging Face).
std::string blk(int64_t il, const char* s);
std::string hf_layer(int64_t il, const char* s);

/// token_embd (HF model.embed_tokens).
void table_embedding(const ModelConfig& c, TensorTable& t);
/// output_norm, output (absent in GGUF files with a tied head; in checkpoints
/// unless tie_word_embeddings) and rope_freqs (GGUF files with RoPE scaling).
void table_head(const ModelConfig& c, TensorTable& t);
/// Layer il's attention: attn_norm (input_layernorm), attn_q/k/v
/// (self_attn.q/k/v_proj) with their biases when c.qkv_bias, attn_output
/// (o_proj, + bias when c.out_bias), attn_q/k_norm when c.qk_norm. With
/// `fused_qkv` one attn_qkv (self_attn.qkv_proj) instead of q, k and v.
void table_attention(const ModelConfig& c, TensorTable& t, int64_t il, bool fused_qkv = false);
/// Layer il's gated FFN: ffn_gate, ffn_up, ffn_down (mlp.gate/up/down_proj);
/// with `fused_gate_up` one ffn_up of gate rows then up rows (mlp.gate_up_proj).
void table_ffn(const ModelConfig& c, TensorTable& t, int64_t il, bool fused_gate_up = false);
/// Layer il's expert FFN: the router ffn_gate_inp and the banks
/// ffn_{gate,up,down}_exps (per expert blk.il.ffn_gate.E, ...); Hugging Face
/// names under `hf_block` ("mlp." or "block_sparse_moe.") with the router
/// `hf_router` and the experts' matrices hf_gate / hf_up / hf_down.
void table_moe(const ModelConfig& c, TensorTable& t, int64_t il, const char* hf_block, const char* hf_router,
               const char* hf_gate, const char* hf_up, const char* hf_down);

/// Hugging Face names of an expert layer: the block ("mlp."), its router
/// and the experts' gate, up and down matrices (see table_moe).
struct HfMoeNames {
    const char *block, *router, *gate, *up, *down;
};
/// The Llama family's table: embedding; per layer attention, ffn_norm
/// (post_attention_layernorm) and a SwiGLU or expert FFN; head.
void table_llama(const ModelConfig& c, TensorTable& t, const HfMoeNames& moe);

/// The RoPE of layer il: c.rope_dim, its base (rope_base_local on local
/// layers when set), its frequency divisors (rope_freqs, or the config's,
/// none on local layers when they scale global layers only) and LongRoPE.
RopeSpec rope_spec(const ModelConfig& c, const BoundWeights& w, ProgramBuilder& b, int64_t il);
/// Layer il's attention op over [q | k | v]: heads, c.qk_scale(), soft-cap,
/// window, q/k norms when c.qk_norm.
AttentionSpec attention_spec(const ModelConfig& c, const BoundWeights& w, ProgramBuilder& b, int64_t il);

/// token_embd rows (× c.embd_scale when set).
Value embed(ProgramBuilder& b, const ModelConfig& c, const BoundWeights& w);
/// Q|K|V projection (attn_q/k/v with their biases, or the rows of attn_qkv),
/// attention (with `sinks`, n_head F32 logits, when given), output
/// projection (attn_output + bias) of layer il over the normed input h.
Value self_attention(ProgramBuilder& b, const ModelConfig& c, const BoundWeights& w, int64_t il, Value h,
                     bool fused_qkv = false, const Tensor* sinks = nullptr);
/// gate|up projection, act(gate) · up, down projection of layer il over h
/// (gate and up from the rows of a fused ffn_up with `fused_gate_up`).
Value gated_ffn(ProgramBuilder& b, const ModelConfig& c, const BoundWeights& w, int64_t il, Value h, GluAct act,
                bool fused_gate_up = false);
/// The expert FFN spec of layer il: router ffn_gate_inp, banks
/// ffn_{gate,up,down}_exps (3-D tensors seen as one view per expert, or the
/// per-expert tensors), c.n_expert experts, c.n_expert_used per token,
/// renormalised when c.expert_weights_norm; no biases.
MoeSpec moe_spec(ProgramBuilder& b, const ModelConfig& c, const BoundWeights& w, int64_t il, GluAct act);
/// The expert FFN of layer il over h (moe_spec's).
Value moe_ffn(ProgramBuilder& b, const ModelConfig& c, const BoundWeights& w, int64_t il, Value h, GluAct act);
/// The residual stream after layer il, traced as "blk.il".
void trace_layer(ProgramBuilder& b, int64_t il, Value x);
/// The output head: the selected rows of x, output_norm, the output matrix
/// (token_embd when tied), × logit_scale when not 1, soft-capped when
/// c.final_softcap; traced as "logits". Finishes the program.
Program output_head(ProgramBuilder& b, const ModelConfig& c, const BoundWeights& w, Value x, float logit_scale = 1.0f);

/// The Llama family's program (llama.cpp's llm_build_llama): pre-norm blocks
/// of attention and a SwiGLU FFN or expert FFN, each added to the residual
/// stream; run by llama, mixtral, qwen2, qwen3 and qwen3moe, whose biases and
/// q/k norms come with the config.
Program build_llama(const ModelConfig& c, const BoundWeights& w);

/// config.json checks the Llama-style families share: hidden_act silu;
/// full attention only (no use_sliding_window, layer_types all
/// full_attention); MistralConfig's one sliding_window for every layer;
/// the expert count (num_experts or num_local_experts) and
/// num_experts_per_tok, refusing shared experts.
void hf_require_silu(const HfKeys& k);
void hf_full_attention(const HfKeys& k);
void hf_uniform_window(const HfKeys& k, ModelConfig& c);
void hf_experts(const HfKeys& k, ModelConfig& c);
/// config.json's layer_types (sliding_attention / full_attention per layer)
/// into c.swa_layers; false when the key is absent (c untouched).
bool hf_layer_types(const HfKeys& k, ModelConfig& c);

/// GGUF keys of the heads as llama.cpp's converter writes them:
/// attention.key_length / value_length when `key_length` (the config gives
/// head_dim) or head_dim is not n_embd / n_head, rope.dimension_count unless
/// not `rope_dim`. gguf_write_llama: those alone (the Llama family's hook).
void gguf_write_heads(const ModelConfig& c, GgufWriter& w, const std::string& a, bool key_length = false,
                      bool rope_dim = true);
void gguf_write_llama(const ModelConfig& c, GgufWriter& w, const std::string& a);

/// A builder sized for c's KV cache (one cache layer per decoder layer).
ProgramBuilder make_builder(const ModelConfig& c);

}  // namespace quern::arch
