// Model hyper-parameters, read from GGUF metadata (`{arch}.*` keys as llama.cpp
// writes them; see ggml/docs/gguf.md "LLM" section).
#pragma once
#include <cstdint>
#include <string>

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
    bool rope_neox = false;      // NeoX pair ordering (false for llama)

    int64_t q_dim() const { return n_head * head_dim; }
    int64_t kv_dim() const { return n_head_kv * head_dim; }

    /// Reads and validates the hyper-parameters of a Llama-family GGUF file
    /// (general.architecture "llama"). Throws quern::Error naming the key for
    /// missing or inconsistent values, and for unsupported architectures.
    static ModelConfig from_gguf(const GgufFile& f);
    /// Checks internal consistency (positive sizes, head counts divide, ...).
    void validate() const;
};

}  // namespace quern
