// Model hyper-parameters, read from GGUF metadata (`{arch}.*` keys as llama.cpp
// writes them; see ggml/docs/gguf.md "LLM" section) or from a Hugging Face
// config.json (hf_config.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace quern {

class GgufFile;

struct ModelConfig {
    std::string arch = "llama";  // general.architecture
    std::string name;            // general.name
    int64_t n_vocab = 0;         // rows of token_embd
    int64_t n_embd = 0;          // {arch}.embedding_length
    int64_t n_layer = 0;         // {arch}.block_count
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
    /// Per-pair RoPE frequency divisors (rope_dim / 2 floats, as llama.cpp's
    /// rope_freqs.weight): pair i turns at p * base^(-2i/rope_dim) / f[i].
    /// Empty: all 1. Filled from config.json's rope_scaling (llama3, linear).
    std::vector<float> rope_freq_factors;

    int64_t q_dim() const { return n_head * head_dim; }
    int64_t kv_dim() const { return n_head_kv * head_dim; }

    /// Reads and validates the hyper-parameters of a Llama-family GGUF file
    /// (general.architecture "llama"). Throws quern::Error naming the key for
    /// missing or inconsistent values, and for unsupported architectures.
    static ModelConfig from_gguf(const GgufFile& f);
    /// Reads a Hugging Face config.json (its text) for model_type llama,
    /// qwen2 or qwen3 (transformers' LlamaConfig, Qwen2Config, Qwen3Config):
    /// hidden_size, num_hidden_layers, num_attention_heads,
    /// num_key_value_heads, intermediate_size, head_dim, rope_theta (or
    /// rope_parameters.rope_theta), rms_norm_eps, max_position_embeddings,
    /// vocab_size, tie_word_embeddings, attention_bias, rope_scaling (none,
    /// "default", "linear" or "llama3"). RoPE is NeoX-ordered (HF's
    /// rotate_half). `where` names the file in errors. Throws quern::Error
    /// naming the key and the file for a missing or malformed key, an unknown
    /// model_type and every option quern does not compute (other rope
    /// scalings, sliding windows, activations other than silu, MLP biases).
    static ModelConfig from_hf_config(std::string_view json_text, const std::string& where);
    /// Checks internal consistency (positive sizes, head counts divide, ...).
    void validate() const;
};

}  // namespace quern
