// ModelConfig from a Hugging Face config.json: the keys of transformers'
// LlamaConfig, Qwen2Config, Qwen3Config, Gemma2Config and Gemma3TextConfig,
// with their documented defaults for optional keys, and the llama3 / linear
// RoPE scalings turned into per-pair frequency divisors (the values llama.cpp
// stores as rope_freqs.weight).
#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>

#include "core/error.h"
#include "model/config.h"

namespace quern {

namespace {

using json = nlohmann::json;

/// Typed reads of config.json keys; every error names the key and the file.
struct Keys {
    const json& j;
    const std::string& where;

    bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }

    int64_t get_int(const char* key) const {
        if (!has(key)) fail("{}: key '{}' is missing", where, key);
        const json& v = j[key];
        if (!v.is_number_integer()) fail("{}: key '{}' must be an integer, got {}", where, key, v.dump());
        return v.get<int64_t>();
    }
    int64_t get_int(const char* key, int64_t def) const { return has(key) ? get_int(key) : def; }

    double get_float(const json& obj, const char* key, const std::string& path) const {
        if (!obj.contains(key) || obj[key].is_null()) fail("{}: key '{}' is missing", where, path);
        const json& v = obj[key];
        if (!v.is_number()) fail("{}: key '{}' must be a number, got {}", where, path, v.dump());
        return v.get<double>();
    }
    double get_float(const char* key, double def) const { return has(key) ? get_float(j, key, key) : def; }

    bool get_bool(const char* key, bool def) const {
        if (!has(key)) return def;
        if (!j[key].is_boolean()) fail("{}: key '{}' must be true or false, got {}", where, key, j[key].dump());
        return j[key].get<bool>();
    }
    std::string get_string(const char* key, const std::string& def) const {
        if (!has(key)) return def;
        if (!j[key].is_string()) fail("{}: key '{}' must be a string, got {}", where, key, j[key].dump());
        return j[key].get<std::string>();
    }
};

/// Frequency divisors of Llama 3.1's RoPE scaling (Meta's reference
/// `apply_scaling`; transformers' `_compute_llama3_parameters`): with
/// wavelength w = 2π / θ_i of pair i, pairs with w < L / high_freq_factor keep
/// their frequency, pairs with w > L / low_freq_factor turn `factor` times
/// slower, and those between are interpolated by
/// s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor):
/// θ_i' = (1 - s) θ_i / factor + s θ_i. Returns θ_i / θ_i' per pair
/// (L = original_max_position_embeddings).
std::vector<float> llama3_freq_factors(const Keys& k, const json& rs, const std::string& prefix, double base,
                                       int64_t rope_dim) {
    const double factor = k.get_float(rs, "factor", prefix + "factor");
    const double low = k.get_float(rs, "low_freq_factor", prefix + "low_freq_factor");
    const double high = k.get_float(rs, "high_freq_factor", prefix + "high_freq_factor");
    const double old_ctx = k.get_float(rs, "original_max_position_embeddings", prefix + "original_max_position_embeddings");
    if (!(factor > 0) || !(low > 0) || !(high > low) || !(old_ctx > 0))
        fail("{}: llama3 rope scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
             "original_max_position_embeddings > 0 (got {}, {}, {}, {})",
             k.where, factor, low, high, old_ctx);
    const double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
    std::vector<float> f(static_cast<size_t>(rope_dim / 2));
    for (int64_t i = 0; i < rope_dim / 2; ++i) {
        const double theta = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rope_dim));
        const double wavelen = 2.0 * std::numbers::pi / theta;
        double scaled;
        if (wavelen < high_wavelen) {
            scaled = theta;
        } else if (wavelen > low_wavelen) {
            scaled = theta / factor;
        } else {
            const double s = (old_ctx / wavelen - low) / (high - low);
            scaled = (1.0 - s) * theta / factor + s * theta;
        }
        f[static_cast<size_t>(i)] = static_cast<float>(theta / scaled);
    }
    return f;
}

}  // namespace

ModelConfig ModelConfig::from_hf_config(std::string_view json_text, const std::string& where) {
    json j;
    try {
        j = json::parse(json_text);
    } catch (const json::exception& e) {
        fail("{}: not valid JSON ({})", where, e.what());
    }
    if (!j.is_object()) fail("{}: a config.json must be a JSON object", where);
    const Keys k{j, where};

    ModelConfig c;
    c.arch = k.get_string("model_type", "");
    if (c.arch.empty()) fail("{}: key 'model_type' is missing", where);
    if (c.arch == "gemma3")
        fail("{}: model_type 'gemma3' is the multimodal Gemma3ForConditionalGeneration; quern reads text-only "
             "checkpoints (model_type gemma3_text, Gemma3ForCausalLM)",
             where);
    const std::string model_type = c.arch;
    // The GGUF architecture names (llama.cpp runs Mixtral as "llama").
    if (c.arch == "gemma3_text") c.arch = "gemma3";
    if (c.arch == "mixtral") c.arch = "llama";
    if (c.arch == "qwen3_moe") c.arch = "qwen3moe";
    const bool gemma = c.arch == "gemma2" || c.arch == "gemma3";
    if (c.arch != "llama" && c.arch != "qwen2" && c.arch != "qwen3" && c.arch != "qwen3moe" && c.arch != "phi3" &&
        !gemma)
        fail("{}: model_type '{}' is not supported for Hugging Face folders yet (supported: llama, qwen2, qwen3, "
             "qwen3_moe, mixtral, phi3, gemma2, gemma3_text)",
             where, c.arch);
    const bool qwen = c.arch == "qwen2" || c.arch == "qwen3" || c.arch == "qwen3moe";
    const bool mixtral = model_type == "mixtral", phi3 = c.arch == "phi3";

    if (gemma) {
        // Gemma2Config / Gemma3TextConfig name it hidden_activation (hidden_act in older configs).
        const std::string act =
            k.has("hidden_activation") ? k.get_string("hidden_activation", "") : k.get_string("hidden_act", "gelu_pytorch_tanh");
        if (act != "gelu_pytorch_tanh" && act != "gelu_new")
            fail("{}: hidden_activation '{}' is not supported (quern computes gelu_pytorch_tanh)", where, act);
        c.gelu_ffn = true;
    } else {
        const std::string act = k.get_string("hidden_act", "silu");
        if (act != "silu") fail("{}: hidden_act '{}' is not supported (quern computes silu)", where, act);
    }

    c.n_vocab = k.get_int("vocab_size");
    c.n_embd = k.get_int("hidden_size");
    c.n_layer = k.get_int("num_hidden_layers");
    c.n_head = k.get_int("num_attention_heads");
    c.n_ff = k.get_int("intermediate_size");
    if (c.n_head <= 0) fail("{}: key 'num_attention_heads' must be positive, got {}", where, c.n_head);
    c.n_head_kv = k.get_int("num_key_value_heads", c.n_head);
    // Qwen3Config's head_dim defaults to 128, Gemma's to 256; LlamaConfig and Qwen2Config use hidden_size / heads.
    c.head_dim = k.get_int("head_dim", c.arch == "qwen3" || c.arch == "qwen3moe" ? 128
                                       : gemma                                    ? 256
                                                                                  : c.n_embd / c.n_head);
    c.rope_dim = c.head_dim;
    c.n_ctx_train = k.get_int("max_position_embeddings", qwen ? 32768 : c.arch == "gemma2" ? 8192
                                                                      : c.arch == "gemma3" ? 131072 : 2048);
    c.rms_eps = static_cast<float>(k.get_float("rms_norm_eps", 1e-6));
    c.rope_neox = true;  // transformers' rotate_half pairs (x[i], x[i + d/2]), and HF weights are not permuted
    c.tie_embeddings = k.get_bool("tie_word_embeddings", gemma);
    c.name = k.get_string("_name_or_path", "");

    // Attention and MLP biases.
    const bool attention_bias = k.get_bool("attention_bias", false);
    if (c.arch == "qwen2") {
        c.qkv_bias = true;  // Qwen2Attention: q/k/v with bias, o without
    } else {
        c.qkv_bias = attention_bias;
        c.out_bias = attention_bias;
    }
    if (k.get_bool("mlp_bias", false)) fail("{}: mlp_bias = true is not supported", where);
    c.qk_norm = c.arch == "qwen3" || c.arch == "qwen3moe" || c.arch == "gemma3";

    // Mixture of experts: MixtralSparseMoeBlock (num_local_experts experts of
    // width intermediate_size, top-k weights renormalised) and
    // Qwen3MoeSparseMoeBlock (num_experts of width moe_intermediate_size,
    // renormalised when norm_topk_prob).
    if (mixtral || c.arch == "qwen3moe") {
        const char* ek = k.has("num_experts") ? "num_experts" : "num_local_experts";
        c.n_expert = k.get_int(ek);
        c.n_expert_used = k.get_int("num_experts_per_tok");
        if (c.n_expert <= 0 || c.n_expert_used <= 0 || c.n_expert_used > c.n_expert)
            fail("{}: {} = {} and num_experts_per_tok = {} must satisfy 0 < num_experts_per_tok <= {}", where, ek,
                 c.n_expert, c.n_expert_used, ek);
        if (mixtral) {
            c.n_ff_exp = c.n_ff;
            c.expert_weights_norm = true;
        } else {
            c.n_ff_exp = k.get_int("moe_intermediate_size");
            c.expert_weights_norm = k.get_bool("norm_topk_prob", false);
            if (k.get_int("decoder_sparse_step", 1) != 1)
                fail("{}: decoder_sparse_step != 1 (dense layers between sparse ones) is not supported", where);
            if (k.has("mlp_only_layers") && !(j["mlp_only_layers"].is_array() && j["mlp_only_layers"].empty()))
                fail("{}: mlp_only_layers {} (dense layers in a MoE model) are not supported", where,
                     j["mlp_only_layers"].dump());
        }
        if (k.get_int("num_shared_experts", 0) != 0 || k.get_int("shared_expert_intermediate_size", 0) != 0)
            fail("{}: shared experts are not supported", where);
    }
    if (phi3) {
        // Phi3Attention: qkv_proj holds q, k and v; Phi3MLP: gate_up_proj holds gate and up.
        c.fused_qkv = true;
        c.fused_gate_up = true;
    }
    if ((mixtral || phi3) && k.has("sliding_window")) {
        // MistralConfig-style: one window for every layer (null: none).
        c.sliding_window = k.get_int("sliding_window");
        if (c.sliding_window <= 0) fail("{}: sliding_window must be positive or null, got {}", where, c.sliding_window);
        if (c.n_layer > 0 && c.n_layer <= (int64_t{1} << 20)) c.swa_layers.assign(static_cast<size_t>(c.n_layer), 1);
    }

    if (gemma) {
        // Gemma2Model / Gemma3TextModel: embeddings × sqrt(hidden_size) (in the
        // activation dtype: float here), norms after attention and FFN too,
        // scores scaled by query_pre_attn_scalar^-1/2, optional soft-capping.
        c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
        c.post_norms = true;
        const double qpas = k.get_float("query_pre_attn_scalar", 256.0);
        if (!(qpas > 0)) fail("{}: query_pre_attn_scalar must be positive, got {}", where, qpas);
        c.attn_scale = static_cast<float>(1.0 / std::sqrt(qpas));
        const bool g2 = c.arch == "gemma2";
        // Absent: the class default (Gemma2Config 50 / 30); null: no capping.
        auto cap = [&](const char* key, double def) {
            return static_cast<float>(j.contains(key) && j[key].is_null() ? 0.0 : k.get_float(key, def));
        };
        c.attn_softcap = cap("attn_logit_softcapping", g2 ? 50.0 : 0.0);
        c.final_softcap = cap("final_logit_softcapping", g2 ? 30.0 : 0.0);
        if (c.attn_softcap < 0 || c.final_softcap < 0) fail("{}: soft-capping values must not be negative", where);
        if (k.get_bool("use_bidirectional_attention", false))
            fail("{}: use_bidirectional_attention = true is not supported (quern computes causal attention)", where);
        // Local layers: layer_types, else every layer but each
        // sliding_window_pattern-th (gemma2: 2, gemma3: 6).
        c.sliding_window = k.get_int("sliding_window", 4096);
        if (c.sliding_window <= 0) fail("{}: sliding_window must be positive, got {}", where, c.sliding_window);
        if (c.n_layer > 0 && c.n_layer <= (int64_t{1} << 20)) {
            c.swa_layers.assign(static_cast<size_t>(c.n_layer), 0);
            if (k.has("layer_types")) {
                const json& lt = j["layer_types"];
                if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.n_layer)
                    fail("{}: key 'layer_types' must be an array of num_hidden_layers ({}) strings", where, c.n_layer);
                for (size_t il = 0; il < lt.size(); ++il) {
                    const std::string t = lt[il].is_string() ? lt[il].get<std::string>() : lt[il].dump();
                    if (t != "sliding_attention" && t != "full_attention")
                        fail("{}: layer_types entry '{}' is not supported (sliding_attention, full_attention)", where, t);
                    c.swa_layers[il] = t == "sliding_attention";
                }
            } else {
                const char* pk = k.has("sliding_window_pattern") ? "sliding_window_pattern" : "_sliding_window_pattern";
                const int64_t pattern = k.get_int(pk, g2 ? 2 : 6);
                if (pattern <= 0) fail("{}: {} must be positive, got {}", where, pk, pattern);
                for (int64_t il = 0; il < c.n_layer; ++il) c.swa_layers[static_cast<size_t>(il)] = (il + 1) % pattern != 0;
            }
        }
    }

    // Sliding-window attention (Qwen2/Qwen3 have the keys, off by default).
    if (!gemma && k.get_bool("use_sliding_window", false))
        fail("{}: use_sliding_window = true is not supported (quern computes full attention)", where);
    if (!gemma && k.has("layer_types")) {
        if (!j["layer_types"].is_array()) fail("{}: key 'layer_types' must be an array", where);
        for (const json& t : j["layer_types"])
            if (!t.is_string() || t.get<std::string>() != "full_attention")
                fail("{}: layer_types entry {} is not supported (quern computes full_attention layers)", where,
                     t.dump());
    }

    // RoPE: rope_theta and rope_scaling (transformers 4.x), or one
    // rope_parameters object holding both (transformers 5).
    // Gemma 3 gives each layer type its own: rope_parameters.full_attention
    // and .sliding_attention (transformers 5), or rope_theta + rope_scaling
    // for the global layers and rope_local_base_freq (4.x); the scaling
    // applies to the global layers only.
    double base = k.get_float("rope_theta", c.arch == "gemma3" ? 1000000.0 : 10000.0);
    json rs;
    std::string rs_key = "rope_scaling";
    if (c.arch == "gemma3") {
        c.rope_base_local = static_cast<float>(k.get_float("rope_local_base_freq", 10000.0));
        c.rope_factors_global_only = true;
    }
    if (k.has("rope_parameters") && j["rope_parameters"].is_object() &&
        (j["rope_parameters"].contains("full_attention") || j["rope_parameters"].contains("sliding_attention"))) {
        if (!gemma) fail("{}: per-layer-type rope_parameters are only read for Gemma", where);
        const json& rp = j["rope_parameters"];
        if (rp.contains("sliding_attention")) {
            const json& sl = rp["sliding_attention"];
            if (!sl.is_object()) fail("{}: key 'rope_parameters.sliding_attention' must be an object", where);
            const std::string t = sl.value("rope_type", std::string("default"));
            if (t != "default")
                fail("{}: rope_parameters.sliding_attention.rope_type '{}' is not supported (default)", where, t);
            if (sl.contains("rope_theta"))
                c.rope_base_local = static_cast<float>(
                    k.get_float(sl, "rope_theta", "rope_parameters.sliding_attention.rope_theta"));
        }
        if (rp.contains("full_attention")) {
            rs = rp["full_attention"];
            rs_key = "rope_parameters.full_attention";
            if (!rs.is_object()) fail("{}: key '{}' must be an object", where, rs_key);
            if (rs.contains("rope_theta")) base = k.get_float(rs, "rope_theta", rs_key + ".rope_theta");
        }
        if (c.arch == "gemma2") c.rope_base_local = 0.0f;  // one base for both layer types
    } else if (k.has("rope_parameters")) {
        rs = j["rope_parameters"];
        rs_key = "rope_parameters";
        if (!rs.is_object()) fail("{}: key 'rope_parameters' must be an object", where);
        if (rs.contains("rope_theta")) base = k.get_float(rs, "rope_theta", "rope_parameters.rope_theta");
    } else if (k.has("rope_scaling")) {
        rs = j["rope_scaling"];
        if (!rs.is_object()) fail("{}: key 'rope_scaling' must be an object or null", where);
    }
    if (!(base > 0)) fail("{}: rope_theta must be positive, got {}", where, base);
    // partial_rotary_factor (Phi3Config; rope_parameters in transformers 5):
    // only the first head_dim · factor elements of a head rotate.
    double partial = k.get_float("partial_rotary_factor", 1.0);
    if (rs.is_object() && rs.contains("partial_rotary_factor"))
        partial = k.get_float(rs, "partial_rotary_factor", rs_key + ".partial_rotary_factor");
    if (partial != 1.0) {
        if (!(partial > 0 && partial <= 1)) fail("{}: partial_rotary_factor must be in (0, 1], got {}", where, partial);
        c.rope_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * partial);
    }
    if (c.rope_base_local < 0 || (c.arch == "gemma3" && !(c.rope_base_local > 0)))
        fail("{}: the local RoPE base must be positive, got {}", where, c.rope_base_local);
    c.rope_base = static_cast<float>(base);
    if (rs.is_object()) {
        std::string type = "default";
        for (const char* key : {"rope_type", "type"})
            if (rs.contains(key) && rs[key].is_string()) {
                type = rs[key].get<std::string>();
                break;
            }
        const std::string prefix = rs_key + ".";
        if (phi3 && type != "default" && type != "longrope" && type != "su")
            fail("{}: {}rope_type '{}' is not supported for phi3 (default, longrope)", where, prefix, type);
        if (type == "longrope" || type == "su") {
            // As transformers' _compute_longrope_parameters: the original
            // context original_max_position_embeddings (in the RoPE object or
            // at the top level; else max_position_embeddings), factor as given
            // or max_position_embeddings / original, attention factor
            // sqrt(1 + ln(factor) / ln(original)) unless given (1 for factor <= 1).
            const auto factors = [&](const char* key) {
                const std::string kk = prefix + key;
                if (!rs.contains(key) || !rs[key].is_array()) fail("{}: key '{}' must be a list of numbers", where, kk);
                std::vector<float> v;
                for (const json& x : rs[key]) {
                    if (!x.is_number()) fail("{}: key '{}' must be a list of numbers", where, kk);
                    v.push_back(x.get<float>());
                }
                return v;
            };
            c.rope_factors_short = factors("short_factor");
            c.rope_factors_long = factors("long_factor");
            const double max_pos = k.get_float("max_position_embeddings", 0.0);
            double orig = max_pos;
            if (rs.contains("original_max_position_embeddings"))
                orig = k.get_float(rs, "original_max_position_embeddings", prefix + "original_max_position_embeddings");
            else if (k.has("original_max_position_embeddings"))
                orig = k.get_float("original_max_position_embeddings", 0.0);
            if (!(orig > 0)) fail("{}: LongRoPE needs original_max_position_embeddings (or max_position_embeddings)", where);
            const double factor = rs.contains("factor") && !rs["factor"].is_null()
                                      ? k.get_float(rs, "factor", prefix + "factor")
                                      : max_pos / orig;
            c.rope_orig_ctx = static_cast<int64_t>(orig);
            double af = factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(factor) / std::log(orig));
            if (rs.contains("attention_factor") && !rs["attention_factor"].is_null())
                af = k.get_float(rs, "attention_factor", prefix + "attention_factor");
            c.rope_attn_factor = static_cast<float>(af);
        } else if (type == "llama3") {
            if (c.rope_dim <= 0 || c.rope_dim % 2 != 0)
                fail("{}: head_dim {} must be positive and even", where, c.rope_dim);
            c.rope_freq_factors = llama3_freq_factors(k, rs, prefix, base, c.rope_dim);
        } else if (type == "linear") {
            const double factor = k.get_float(rs, "factor", prefix + "factor");
            if (!(factor > 0)) fail("{}: {}factor must be positive, got {}", where, prefix, factor);
            if (c.rope_dim > 0) c.rope_freq_factors.assign(static_cast<size_t>(c.rope_dim / 2), static_cast<float>(factor));
        } else if (type != "default") {
            fail("{}: {}rope_type '{}' is not supported (supported: default, linear, llama3)", where, prefix, type);
        }
    }
    if (c.n_head_kv <= 0 || c.n_head % c.n_head_kv != 0)
        fail("{}: num_attention_heads {} must be a multiple of num_key_value_heads {}", where, c.n_head, c.n_head_kv);
    try {
        c.validate();
    } catch (const Error& e) {
        fail("{}: {}", where, e.what());
    }
    return c;
}

}  // namespace quern
