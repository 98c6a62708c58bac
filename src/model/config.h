// Model hyper-parameters, read from GGUF metadata (`{arch}.*` keys as llama.cpp
// writes them; see ggml/docs/gguf.md "LLM" section) or from a Hugging Face
// config.json (hf_config.cpp).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace quern {

class GgufFile;
class GgufWriter;

/// YaRN's per-pair RoPE frequency divisors (rope_dim / 2 of them, as
/// ModelConfig::rope_freq_factors): pair i of base^(-2i/rope_dim) keeps its
/// frequency (extrapolation) below the correction range, turns `factor` times
/// slower (interpolation) above it, and blends linearly inside it; the range
/// is where pairs make beta_fast and beta_slow turns over orig_ctx positions,
/// floored and ceiled when `truncate` (llama.cpp always; transformers unless
/// rope_parameters.truncate is false). transformers' _compute_yarn_parameters;
/// ggml's rope_yarn.
std::vector<float> yarn_freq_factors(double base, int64_t rope_dim, double factor, double orig_ctx, double beta_fast,
                                     double beta_slow, bool truncate);
/// YaRN's magnitude scale of cos and sin: 0.1 · ln(factor) + 1 (1 when
/// factor <= 1).
float yarn_attn_factor(double factor);

struct ModelConfig {
    std::string arch = "llama";  // general.architecture
    std::string name;            // general.name
    int64_t n_vocab = 0;         // rows of token_embd
    int64_t n_embd = 0;          // {arch}.embedding_length
    int64_t n_layer = 0;         // {arch}.block_count (less the NextN blocks)
    // Multi-token-prediction (NextN) blocks after the trunk: a draft head
    // for speculative decoding ({arch}.nextn_predict_layers; HF
    // mtp_num_hidden_layers). 0 when the file holds none.
    int64_t n_nextn = 0;
    int64_t n_head = 0;          // {arch}.attention.head_count
    int64_t n_head_kv = 0;       // {arch}.attention.head_count_kv (default n_head)
    int64_t n_ff = 0;            // {arch}.feed_forward_length
    int64_t head_dim = 0;        // {arch}.attention.key_length (default n_embd / n_head)
    int64_t rope_dim = 0;        // {arch}.rope.dimension_count (default head_dim)
    int64_t n_ctx_train = 0;     // {arch}.context_length
    float rope_base = 10000.0f;  // {arch}.rope.freq_base
    float rms_eps = 1e-5f;       // {arch}.attention.layer_norm_rms_epsilon
    bool rope_neox = false;      // NeoX pair ordering (false for llama GGUF files, true for HF checkpoints)
    bool qkv_bias = false;       // q/k/v projections add a bias (qwen2; llama attention_bias)
    bool out_bias = false;       // the attention output projection adds a bias (llama attention_bias)
    bool qk_norm = false;        // per-head RMSNorm of q and k before RoPE (qwen3)
    bool tie_embeddings = false; // the output projection is the token embedding (HF tie_word_embeddings)
    /// How the model pools its rows into one embedding ({arch}.pooling_type:
    /// 0 none, 1 mean, 2 cls, 3 last, 4 rank; -1 when the file says nothing).
    int64_t pooling_type = -1;
    /// The program hands out every row after the output norm as its hidden
    /// rows (Program::hidden): what embeddings pool. Set for the embedding
    /// program only (Model::embedding_program).
    bool hidden_rows = false;
    /// Per-pair RoPE frequency divisors (rope_dim / 2 floats, as llama.cpp's
    /// rope_freqs.weight): pair i turns at p * base^(-2i/rope_dim) / f[i].
    /// Empty: all 1. Filled from config.json's rope_scaling (llama3, linear).
    std::vector<float> rope_freq_factors;

    // LongRoPE (Phi-3 128k-context models, Phi-3.5; transformers' "longrope",
    // formerly "su"): pair i turns at p · base^(-2i/rope_dim) / f[i] with f the
    // short factors, or the long ones for a forward pass whose last position
    // reaches rope_orig_ctx (transformers' rule: its sequence is longer than
    // original_max_position_embeddings); cos and sin are multiplied by
    // rope_attn_factor, which for a full rotation is the q·k scale times its
    // square (qk_scale()). Empty factors: no LongRoPE.
    std::vector<float> rope_factors_short, rope_factors_long;
    int64_t rope_orig_ctx = 0;
    float rope_attn_factor = 1.0f;
    bool longrope() const { return !rope_factors_long.empty(); }

    // YaRN (Peng et al. 2023; gpt-oss, long-context Qwen): kept as the
    // per-pair divisors of rope_freq_factors and the magnitude scale of
    // rope_attn_factor (yarn_freq_factors); the parameters themselves stay
    // for writing GGUF keys back. rope_yarn_factor 0: no YaRN.
    float rope_yarn_factor = 0.0f;
    float yarn_beta_fast = 32.0f, yarn_beta_slow = 1.0f;

    // Gemma 2 / Gemma 3 (defaults leave the other architectures unchanged).
    float embd_scale = 0.0f;      ///< token embeddings are multiplied by this (0: not scaled); Gemma: sqrt(n_embd)
    float attn_scale = 0.0f;      ///< query·key scale (0: 1/sqrt(head_dim)); Gemma: query_pre_attn_scalar^-1/2
    float attn_softcap = 0.0f;    ///< > 0: scaled scores s become c·tanh(s/c) before the softmax (Gemma 2)
    float final_softcap = 0.0f;   ///< > 0: logits l become c·tanh(l/c) (Gemma 2)
    int64_t sliding_window = 0;   ///< keys a local layer's query sees, itself included (0: no local layers)
    std::vector<uint8_t> swa_layers;  ///< per layer: 1 = local (sliding-window) layer; empty: all global
    float rope_base_local = 0.0f; ///< RoPE base of local layers (0: rope_base)
    /// rope_freq_factors apply to global layers only (Gemma 3's linear RoPE
    /// scaling of its full-attention layers); local layers turn unscaled.
    bool rope_factors_global_only = false;

    // Mixture of experts (Mixtral, Qwen3-MoE): every layer's FFN is a bank of
    // n_expert SwiGLU experts of width n_ff_exp, of which a router picks
    // n_expert_used per token (0 experts: a dense FFN of width n_ff).
    int64_t n_expert = 0;         ///< {arch}.expert_count; HF num_local_experts / num_experts
    int64_t n_expert_used = 0;    ///< {arch}.expert_used_count; HF num_experts_per_tok
    int64_t n_ff_exp = 0;         ///< expert FFN width: {arch}.expert_feed_forward_length (qwen3moe) or
                                  ///< feed_forward_length (llama); HF moe_intermediate_size / intermediate_size
    /// The chosen experts' softmax probabilities are divided by their sum
    /// (Mixtral always; Qwen3-MoE when norm_topk_prob). false: used as they are.
    bool expert_weights_norm = true;
    bool moe() const { return n_expert > 0; }

    // Linear-attention (state-space) layers, as llama.cpp's ssm.* keys name
    // them: Gated DeltaNet (Qwen3.5) — a conv of ssm_conv_kernel taps, key
    // heads ssm_group_count of ssm_state_size, value heads
    // ssm_time_step_rank of ssm_inner_size / ssm_time_step_rank.
    std::vector<uint8_t> recurrent_layers;  ///< per layer: 1 = linear attention; empty: none
    int64_t ssm_conv_kernel = 0, ssm_state_size = 0, ssm_group_count = 0, ssm_time_step_rank = 0, ssm_inner_size = 0;
    bool recurrent(int64_t il) const {
        return !recurrent_layers.empty() && recurrent_layers[static_cast<size_t>(il)] != 0;
    }
    /// Whether a sequence carries recurrent state (truncating it recomputes).
    bool has_recurrent_state() const {
        for (uint8_t r : recurrent_layers)
            if (r) return true;
        return false;
    }
    /// Hyper-parameters of one family alone, by name: set and read by that
    /// family's file in model/arch/ (e.g. granite's "residual_scale").
    std::map<std::string, float> extra;

    /// The attention window of layer il in positions (0: the whole causal prefix).
    int64_t window(int64_t il) const {
        return !swa_layers.empty() && swa_layers[static_cast<size_t>(il)] ? sliding_window : 0;
    }
    /// The query·key scale: attn_scale, or 1/sqrt(head_dim) when it is 0;
    /// times rope_attn_factor² (LongRoPE scales the rotated q and k).
    float qk_scale() const;

    int64_t q_dim() const { return n_head * head_dim; }
    int64_t kv_dim() const { return n_head_kv * head_dim; }

    /// Reads and validates the hyper-parameters of a GGUF file: the keys
    /// every family has ({arch}.embedding_length, block_count,
    /// attention.head_count(_kv), feed_forward_length, key/value_length,
    /// rope.dimension_count, rope.freq_base, layer_norm_rms_epsilon,
    /// context_length, expert_count / expert_used_count /
    /// expert_feed_forward_length / expert_weights_norm) with llama.cpp's
    /// defaults, then the family's own (its ArchDef::gguf_config in
    /// model/arch/). Throws quern::Error naming the key for missing or
    /// inconsistent values, and for an architecture no family reads.
    static ModelConfig from_gguf(const GgufFile& f);
    /// Reads a Hugging Face config.json (its text): model_type picks the
    /// family (model/arch/), the keys of transformers' PretrainedConfig every
    /// family has (hidden_size, num_hidden_layers, num_attention_heads,
    /// num_key_value_heads, intermediate_size, head_dim, rms_norm_eps,
    /// max_position_embeddings, vocab_size, tie_word_embeddings,
    /// attention_bias) with the family's defaults, the family's own keys
    /// (ArchDef::hf_config), then RoPE: rope_theta, rope_scaling or
    /// rope_parameters (none, "default", "linear", "llama3", "longrope"/"su", "yarn";
    /// partial_rotary_factor). RoPE is NeoX-ordered (HF's rotate_half).
    /// `where` names the file in errors. Throws quern::Error naming the key
    /// and the file for a missing or malformed key, an unknown model_type and
    /// every option quern does not compute.
    static ModelConfig from_hf_config(std::string_view json_text, const std::string& where);
    /// Checks internal consistency (positive sizes, head counts divide, ...).
    void validate() const;
    /// Writes the GGUF keys from_gguf reads back into this config:
    /// general.architecture and general.name, the {arch}. keys every family
    /// shares, then the family's own (ArchDef::gguf_write). RoPE frequency
    /// factors are a tensor (rope_freqs.weight), not a key: the caller adds
    /// it. quern::Error for an architecture no family writes.
    void write_gguf(GgufWriter& w) const;
};

}  // namespace quern
