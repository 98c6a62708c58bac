#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "formats/gguf.h"
#include "model/arch/arch.h"

namespace quern {

std::vector<float> yarn_freq_factors(double base, int64_t rope_dim, double factor, double orig_ctx, double beta_fast,
                                     double beta_slow, bool truncate) {
    if (!(factor > 0) || !(orig_ctx > 0) || !(base > 1) || rope_dim <= 0 || rope_dim % 2 != 0)
        fail("YaRN needs factor > 0, an original context > 0, a RoPE base > 1 and an even rope dimension (got {}, {}, "
             "{}, {})",
             factor, orig_ctx, base, rope_dim);
    const double d = static_cast<double>(rope_dim);
    // The pair index whose wavelength fits `turns` rotations into orig_ctx.
    const auto dim_of = [&](double turns) {
        return d * std::log(orig_ctx / (turns * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
    };
    double lo = dim_of(beta_fast), hi = dim_of(beta_slow);
    if (truncate) lo = std::floor(lo), hi = std::ceil(hi);
    lo = std::max(lo, 0.0);
    hi = std::min(hi, d - 1);
    if (lo == hi) hi += 0.001;  // as transformers does: no zero-width ramp
    std::vector<float> f(static_cast<size_t>(rope_dim / 2));
    for (int64_t i = 0; i < rope_dim / 2; ++i) {
        const double ramp = std::clamp((static_cast<double>(i) - lo) / (hi - lo), 0.0, 1.0);
        const double extrapolate = 1.0 - ramp;  // 1: the pair keeps its frequency
        f[static_cast<size_t>(i)] = static_cast<float>(1.0 / ((1.0 - extrapolate) / factor + extrapolate));
    }
    return f;
}

float yarn_attn_factor(double factor) {
    return factor <= 1.0 ? 1.0f : static_cast<float>(0.1 * std::log(factor) + 1.0);
}

float ModelConfig::qk_scale() const {
    const float s = attn_scale > 0.0f ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
    return s * rope_attn_factor * rope_attn_factor;
}

int64_t GgufKeys::get_int(std::string_view key) const { return f.get_int(prefix + std::string(key)); }
int64_t GgufKeys::get_int(std::string_view key, int64_t def) const { return f.get_int(prefix + std::string(key), def); }
double GgufKeys::get_float(std::string_view key, double def) const {
    return f.get_float(prefix + std::string(key), def);
}
bool GgufKeys::get_bool(std::string_view key, bool def) const { return f.get_bool(prefix + std::string(key), def); }
std::string GgufKeys::get_string(std::string_view key, std::string_view def) const {
    return f.get_string(prefix + std::string(key), def);
}
bool GgufKeys::has_tensor(std::string_view name) const { return f.find_tensor(name) != nullptr; }

namespace {

// {arch}.rope.scaling.* as llama.cpp reads them (llama-model.cpp, with
// llama-context.cpp's YaRN magnitude: 1 + 0.1 · ln(factor) times
// rope.scaling.attn_factor): linear and YaRN here; LongRoPE (Phi-3) and
// families that scale some layers only (Gemma 3) in their own hooks.
void read_rope_scaling(const GgufKeys& k, ModelConfig& c) {
    const std::string type = k.get_string("rope.scaling.type", "none");
    if (type == "none" || type == "longrope") return;
    const double factor = k.get_float("rope.scaling.factor", 0.0);
    if (!(factor > 0)) fail("gguf key '{}rope.scaling.factor' must be positive for {} scaling, got {}", k.prefix, type, factor);
    if (type == "linear") {
        c.rope_freq_factors.assign(static_cast<size_t>(std::max<int64_t>(c.rope_dim / 2, 0)), static_cast<float>(factor));
    } else if (type == "yarn") {
        if (k.get_float("rope.scaling.yarn_log_multiplier", 0.0) != 0.0)
            fail("gguf key '{}rope.scaling.yarn_log_multiplier' (DeepSeek's YaRN variant) is not supported", k.prefix);
        if (k.get_float("rope.scaling.yarn_ext_factor", 1.0) != 1.0)
            fail("gguf key '{}rope.scaling.yarn_ext_factor' other than 1 is not supported", k.prefix);
        c.rope_yarn_factor = static_cast<float>(factor);
        c.rope_orig_ctx = k.get_int("rope.scaling.original_context_length");
        c.yarn_beta_fast = static_cast<float>(k.get_float("rope.scaling.yarn_beta_fast", 32.0));
        c.yarn_beta_slow = static_cast<float>(k.get_float("rope.scaling.yarn_beta_slow", 1.0));
        c.rope_freq_factors = yarn_freq_factors(c.rope_base, c.rope_dim, factor, static_cast<double>(c.rope_orig_ctx),
                                                c.yarn_beta_fast, c.yarn_beta_slow, true);
        c.rope_attn_factor =
            yarn_attn_factor(factor) * static_cast<float>(k.get_float("rope.scaling.attn_factor", 1.0));
    } else {
        fail("gguf key '{}rope.scaling.type' = '{}' is not supported (none, linear, yarn)", k.prefix, type);
    }
}

}  // namespace

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
    ModelConfig c;
    c.arch = f.get_string("general.architecture");
    const ArchDef* def = find_arch(c.arch);
    if (!def) fail("model architecture '{}' is not supported yet (supported: {})", c.arch, supported_archs(false));
    c.name = f.get_string("general.name", "");
    const GgufKeys k{f, c.arch + "."};
    // The keys every family has, as llama.cpp writes them (llama-model.cpp).
    c.n_embd = k.get_int("embedding_length");
    c.n_layer = k.get_int("block_count");
    c.n_head = k.get_int("attention.head_count");
    c.n_head_kv = k.get_int("attention.head_count_kv", c.n_head);
    // Expert models may give their experts' width apart (qwen3moe); llama's
    // experts (Mixtral) have feed_forward_length.
    c.n_ff_exp = k.get_int("expert_feed_forward_length", 0);
    c.n_ff = c.n_ff_exp > 0 ? k.get_int("feed_forward_length", c.n_ff_exp) : k.get_int("feed_forward_length");
    c.n_ctx_train = k.get_int("context_length", 4096);
    c.pooling_type = k.get_int("pooling_type", -1);
    if (c.n_head <= 0) fail("gguf key '{}attention.head_count' must be positive, got {}", k.prefix, c.n_head);
    c.head_dim = k.get_int("attention.key_length", c.n_embd / c.n_head);
    const int64_t vdim = k.get_int("attention.value_length", c.head_dim);
    if (vdim != c.head_dim) fail("key length {} != value length {} is not supported", c.head_dim, vdim);
    c.rope_dim = k.get_int("rope.dimension_count", c.head_dim);
    c.rope_base = static_cast<float>(k.get_float("rope.freq_base", 10000.0));
    c.rms_eps = static_cast<float>(k.get_float("attention.layer_norm_rms_epsilon", 1e-5));
    if (const auto* t = f.find_tensor("token_embd.weight")) c.n_vocab = t->ne[1];
    else fail("tensor 'token_embd.weight' is missing");
    c.rope_neox = false;
    // Mixture of experts (llama.cpp's build_moe_ffn with softmax gating).
    c.n_expert = k.get_int("expert_count", 0);
    if (c.n_expert > 0) {
        c.n_expert_used = k.get_int("expert_used_count");
        if (c.n_ff_exp == 0) c.n_ff_exp = c.n_ff;
        c.expert_weights_norm = k.get_bool("expert_weights_norm", true);
        const int64_t shared = k.get_int("expert_shared_count", 0);
        if (shared != 0) fail("gguf key '{}expert_shared_count' = {}: shared experts are not supported", k.prefix, shared);
    } else {
        c.n_ff_exp = 0;
    }
    read_rope_scaling(k, c);
    def->gguf_config(k, c);
    c.validate();
    return c;
}

void ModelConfig::write_gguf(GgufWriter& w) const {
    const ArchDef* def = find_arch(arch);
    if (!def) fail("cannot write a GGUF file of unknown architecture '{}'", arch);
    const std::string a = arch + ".";  // llama.cpp's key prefix: the architecture
    w.set_string("general.architecture", arch);
    w.set_string("general.name", name);
    w.set_u32(a + "context_length", static_cast<uint32_t>(n_ctx_train));
    w.set_u32(a + "embedding_length", static_cast<uint32_t>(n_embd));
    w.set_u32(a + "block_count", static_cast<uint32_t>(n_layer + n_nextn));
    w.set_u32(a + "feed_forward_length", static_cast<uint32_t>(n_ff));
    w.set_u32(a + "attention.head_count", static_cast<uint32_t>(n_head));
    w.set_u32(a + "attention.head_count_kv", static_cast<uint32_t>(n_head_kv));
    w.set_f32(a + "rope.freq_base", rope_base);
    w.set_f32(a + "attention.layer_norm_rms_epsilon", rms_eps);
    if (sliding_window > 0) w.set_u32(a + "attention.sliding_window", static_cast<uint32_t>(sliding_window));
    w.set_u32(a + "vocab_size", static_cast<uint32_t>(n_vocab));
    if (rope_yarn_factor > 0.0f) {
        w.set_string(a + "rope.scaling.type", "yarn");
        w.set_f32(a + "rope.scaling.factor", rope_yarn_factor);
        w.set_u32(a + "rope.scaling.original_context_length", static_cast<uint32_t>(rope_orig_ctx));
        w.set_f32(a + "rope.scaling.yarn_beta_fast", yarn_beta_fast);
        w.set_f32(a + "rope.scaling.yarn_beta_slow", yarn_beta_slow);
    }
    if (moe()) {
        w.set_u32(a + "expert_count", static_cast<uint32_t>(n_expert));
        w.set_u32(a + "expert_used_count", static_cast<uint32_t>(n_expert_used));
        w.set_bool(a + "expert_weights_norm", expert_weights_norm);
    }
    def->gguf_write(*this, w, a);  // the family's own keys
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
    if (!swa_layers.empty() && static_cast<int64_t>(swa_layers.size()) != n_layer)
        fail("{} sliding-window layer flags for {} layers", swa_layers.size(), n_layer);
    if (sliding_window < 0) fail("sliding window {} must not be negative", sliding_window);
    if (!recurrent_layers.empty() && static_cast<int64_t>(recurrent_layers.size()) != n_layer)
        fail("{} linear-attention layer flags for {} layers", recurrent_layers.size(), n_layer);
    if (has_recurrent_state()) {
        pos("ssm conv_kernel", ssm_conv_kernel);
        pos("ssm state_size", ssm_state_size);
        pos("ssm group_count", ssm_group_count);
        pos("ssm time_step_rank", ssm_time_step_rank);
        pos("ssm inner_size", ssm_inner_size);
        if (ssm_time_step_rank % ssm_group_count != 0 || ssm_inner_size % ssm_time_step_rank != 0)
            fail("linear attention: {} value heads ({} elements in all) must split evenly over {} key heads", ssm_time_step_rank,
                 ssm_inner_size, ssm_group_count);
    }
    if (n_expert < 0 || n_expert > 4096) fail("expert count {} is out of range", n_expert);
    if (n_expert > 0) {
        if (n_expert_used <= 0 || n_expert_used > n_expert)
            fail("experts used per token {} must be in [1, {}]", n_expert_used, n_expert);
        pos("n_ff_exp", n_ff_exp);
    }
    if (attn_scale < 0.0f || attn_softcap < 0.0f || final_softcap < 0.0f || embd_scale < 0.0f || rope_base_local < 0.0f)
        fail("attention scale, soft-caps, embedding scale and local RoPE base must not be negative");
    if (longrope() || !rope_factors_short.empty()) {
        const auto half = static_cast<size_t>(rope_dim / 2);
        if (rope_factors_short.size() != half || rope_factors_long.size() != half)
            fail("LongRoPE needs {} short and {} long factors (rope_dim / 2), got {} and {}", half, half,
                 rope_factors_short.size(), rope_factors_long.size());
        for (const auto* v : {&rope_factors_short, &rope_factors_long})
            for (float f : *v)
                if (!(f > 0.0f)) fail("LongRoPE factors must be positive, got {}", f);
        if (rope_dim != head_dim) fail("LongRoPE with a partial rotation (rope_dim {} < head_dim {}) is not supported", rope_dim, head_dim);
        if (rope_orig_ctx <= 0) fail("LongRoPE needs the original context length, got {}", rope_orig_ctx);
        if (!rope_freq_factors.empty()) fail("LongRoPE cannot be combined with other RoPE frequency factors");
    }
    if (!(rope_attn_factor > 0.0f)) fail("the RoPE attention factor must be positive, got {}", rope_attn_factor);
}

}  // namespace quern
