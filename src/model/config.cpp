#include "model/config.h"

#include "core/error.h"
#include "formats/gguf.h"

namespace quern {

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
    ModelConfig c;
    c.arch = f.get_string("general.architecture");
    if (c.arch != "llama")
        fail("model architecture '{}' is not supported yet (supported: llama — Llama, Mistral, SmolLM)", c.arch);
    c.name = f.get_string("general.name", "");
    const std::string a = c.arch + ".";
    c.n_embd = f.get_int(a + "embedding_length");
    c.n_layer = f.get_int(a + "block_count");
    c.n_head = f.get_int(a + "attention.head_count");
    c.n_head_kv = f.get_int(a + "attention.head_count_kv", c.n_head);
    c.n_ff = f.get_int(a + "feed_forward_length");
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
}

}  // namespace quern
