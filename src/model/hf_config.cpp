// ModelConfig from a Hugging Face config.json: the keys every family shares,
// with the family's defaults (ArchDef::hf_defaults), the family's own keys
// (its file in model/arch/), and the RoPE keys, with the llama3 / linear
// scalings turned into per-pair frequency divisors (the values llama.cpp
// stores as rope_freqs.weight) and LongRoPE's factor lists.
#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>

#include "core/error.h"
#include "model/arch/arch.h"
#include "model/config.h"

namespace quern {

using json = nlohmann::json;

int64_t HfKeys::get_int(const char* key) const {
    if (!has(key)) fail("{}: key '{}' is missing", where, key);
    const json& v = j[key];
    if (!v.is_number_integer()) fail("{}: key '{}' must be an integer, got {}", where, key, v.dump());
    return v.get<int64_t>();
}
int64_t HfKeys::get_int(const char* key, int64_t def) const { return has(key) ? get_int(key) : def; }

double HfKeys::get_float(const json& obj, const char* key, const std::string& path) const {
    if (!obj.contains(key) || obj[key].is_null()) fail("{}: key '{}' is missing", where, path);
    const json& v = obj[key];
    if (!v.is_number()) fail("{}: key '{}' must be a number, got {}", where, path, v.dump());
    return v.get<double>();
}
double HfKeys::get_float(const char* key, double def) const { return has(key) ? get_float(j, key, key) : def; }

bool HfKeys::get_bool(const char* key, bool def) const {
    if (!has(key)) return def;
    if (!j[key].is_boolean()) fail("{}: key '{}' must be true or false, got {}", where, key, j[key].dump());
    return j[key].get<bool>();
}
std::string HfKeys::get_string(const char* key, const std::string& def) const {
    if (!has(key)) return def;
    if (!j[key].is_string()) fail("{}: key '{}' must be a string, got {}", where, key, j[key].dump());
    return j[key].get<std::string>();
}

namespace {

/// Frequency divisors of Llama 3.1's RoPE scaling (Meta's reference
/// `apply_scaling`; transformers' `_compute_llama3_parameters`): with
/// wavelength w = 2π / θ_i of pair i, pairs with w < L / high_freq_factor keep
/// their frequency, pairs with w > L / low_freq_factor turn `factor` times
/// slower, and those between are interpolated by
/// s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor):
/// θ_i' = (1 - s) θ_i / factor + s θ_i. Returns θ_i / θ_i' per pair
/// (L = original_max_position_embeddings).
std::vector<float> llama3_freq_factors(const HfKeys& k, const json& rs, const std::string& prefix, double base,
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
    const HfKeys k{j, where};

    ModelConfig c;
    const std::string model_type = k.get_string("model_type", "");
    if (model_type.empty()) fail("{}: key 'model_type' is missing", where);
    // A multimodal wrapper (Qwen3.5's qwen3_5: a vision tower beside the text
    // model) keeps the text model's keys in text_config: quern reads those
    // (tie_word_embeddings may sit at the top).
    if (!find_hf_arch(model_type) && hf_refusal(model_type).empty() && k.has("text_config") &&
        j["text_config"].is_object()) {
        json t = j["text_config"];
        if (!t.contains("tie_word_embeddings") && j.contains("tie_word_embeddings"))
            t["tie_word_embeddings"] = j["tie_word_embeddings"];
        return from_hf_config(t.dump(), where + " (text_config)");
    }
    if (const std::string_view why = hf_refusal(model_type); !why.empty())
        fail("{}: model_type '{}' {}", where, model_type, why);
    const ArchDef* def = find_hf_arch(model_type);
    if (!def)
        fail("{}: model_type '{}' is not supported for Hugging Face folders yet (supported: {})", where, model_type,
             supported_archs(true));
    c.arch = std::string(def->name);  // the GGUF architecture name (llama.cpp runs Mixtral as "llama")
    const HfDefaults& d = def->hf_defaults;

    // The keys of transformers' PretrainedConfig every family here has.
    c.n_vocab = k.get_int("vocab_size");
    c.n_embd = k.get_int("hidden_size");
    c.n_layer = k.get_int("num_hidden_layers");
    c.n_head = k.get_int("num_attention_heads");
    c.n_ff = d.no_intermediate ? k.get_int("intermediate_size", 0) : k.get_int("intermediate_size");
    if (c.n_head <= 0) fail("{}: key 'num_attention_heads' must be positive, got {}", where, c.n_head);
    c.n_head_kv = k.get_int("num_key_value_heads", c.n_head);
    c.head_dim = k.get_int("head_dim", d.head_dim > 0 ? d.head_dim : c.n_embd / c.n_head);
    c.rope_dim = c.head_dim;
    c.n_ctx_train = k.get_int("max_position_embeddings", d.n_ctx);
    c.rms_eps = static_cast<float>(k.get_float("rms_norm_eps", 1e-6));
    c.rope_neox = true;  // transformers' rotate_half pairs (x[i], x[i + d/2]), and HF weights are not permuted
    c.tie_embeddings = k.get_bool("tie_word_embeddings", d.tie_embeddings);
    c.name = k.get_string("_name_or_path", "");
    const bool attention_bias = k.get_bool("attention_bias", false);
    c.qkv_bias = attention_bias;
    c.out_bias = attention_bias;
    if (k.get_bool("mlp_bias", false)) fail("{}: mlp_bias = true is not supported", where);
    def->hf_config(k, model_type, c);

    // RoPE: rope_theta and rope_scaling (transformers 4.x), or one
    // rope_parameters object holding both (transformers 5).
    // Gemma 3 gives each layer type its own: rope_parameters.full_attention
    // and .sliding_attention (transformers 5), or rope_theta + rope_scaling
    // for the global layers and rope_local_base_freq (4.x); the scaling
    // applies to the global layers only.
    double base = k.get_float("rope_theta", d.rope_theta);
    json rs;
    std::string rs_key = "rope_scaling";
    if (k.has("rope_parameters") && j["rope_parameters"].is_object() &&
        (j["rope_parameters"].contains("full_attention") || j["rope_parameters"].contains("sliding_attention"))) {
        if (!d.per_layer_rope) fail("{}: per-layer-type rope_parameters are not read for model_type '{}'", where, model_type);
        const json& rp = j["rope_parameters"];
        if (rp.contains("sliding_attention")) {
            const json& sl = rp["sliding_attention"];
            if (!sl.is_object()) fail("{}: key 'rope_parameters.sliding_attention' must be an object", where);
            const std::string t = sl.value("rope_type", std::string("default"));
            if (t != "default")
                fail("{}: rope_parameters.sliding_attention.rope_type '{}' is not supported (default)", where, t);
            if (d.rope_local && sl.contains("rope_theta"))
                c.rope_base_local = static_cast<float>(
                    k.get_float(sl, "rope_theta", "rope_parameters.sliding_attention.rope_theta"));
        }
        if (rp.contains("full_attention")) {
            rs = rp["full_attention"];
            rs_key = "rope_parameters.full_attention";
            if (!rs.is_object()) fail("{}: key '{}' must be an object", where, rs_key);
            if (rs.contains("rope_theta")) base = k.get_float(rs, "rope_theta", rs_key + ".rope_theta");
        }
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
    double partial = k.get_float("partial_rotary_factor", d.partial_rotary);
    if (rs.is_object() && rs.contains("partial_rotary_factor"))
        partial = k.get_float(rs, "partial_rotary_factor", rs_key + ".partial_rotary_factor");
    if (partial != 1.0) {
        if (!(partial > 0 && partial <= 1)) fail("{}: partial_rotary_factor must be in (0, 1], got {}", where, partial);
        c.rope_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * partial);
    }
    if (c.rope_base_local < 0 || (d.rope_local && !(c.rope_base_local > 0)))
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
        } else if (type == "yarn") {
            // transformers' _compute_yarn_parameters: factor (else
            // max_position_embeddings / original), beta_fast / beta_slow
            // (32 / 1), truncate (true), attention_factor (else 0.1 ln(factor) + 1,
            // or the mscale / mscale_all_dim ratio, which is refused).
            if (c.rope_dim <= 0 || c.rope_dim % 2 != 0)
                fail("{}: the rotated head width {} must be positive and even", where, c.rope_dim);
            for (const char* key : {"mscale", "mscale_all_dim"})
                if (rs.contains(key) && !rs[key].is_null())
                    fail("{}: key '{}{}' (DeepSeek's YaRN variant) is not supported", where, prefix, key);
            const double orig = k.get_float(rs, "original_max_position_embeddings", prefix + "original_max_position_embeddings");
            const double factor = rs.contains("factor") && !rs["factor"].is_null()
                                      ? k.get_float(rs, "factor", prefix + "factor")
                                      : k.get_float("max_position_embeddings", 0.0) / orig;
            const auto opt = [&](const char* key, double def) {
                return rs.contains(key) && !rs[key].is_null() ? k.get_float(rs, key, prefix + key) : def;
            };
            bool truncate = true;
            if (rs.contains("truncate") && !rs["truncate"].is_null()) {
                if (!rs["truncate"].is_boolean()) fail("{}: key '{}truncate' must be true or false", where, prefix);
                truncate = rs["truncate"].get<bool>();
            }
            c.rope_yarn_factor = static_cast<float>(factor);
            c.rope_orig_ctx = static_cast<int64_t>(orig);
            c.yarn_beta_fast = static_cast<float>(opt("beta_fast", 32.0));
            c.yarn_beta_slow = static_cast<float>(opt("beta_slow", 1.0));
            c.rope_freq_factors =
                yarn_freq_factors(base, c.rope_dim, factor, orig, c.yarn_beta_fast, c.yarn_beta_slow, truncate);
            c.rope_attn_factor = static_cast<float>(opt("attention_factor", yarn_attn_factor(factor)));
        } else if (type == "llama3") {
            if (c.rope_dim <= 0 || c.rope_dim % 2 != 0)
                fail("{}: head_dim {} must be positive and even", where, c.rope_dim);
            c.rope_freq_factors = llama3_freq_factors(k, rs, prefix, base, c.rope_dim);
        } else if (type == "linear") {
            const double factor = k.get_float(rs, "factor", prefix + "factor");
            if (!(factor > 0)) fail("{}: {}factor must be positive, got {}", where, prefix, factor);
            if (c.rope_dim > 0) c.rope_freq_factors.assign(static_cast<size_t>(c.rope_dim / 2), static_cast<float>(factor));
        } else if (type != "default") {
            fail("{}: {}rope_type '{}' is not supported (supported: default, linear, llama3, longrope, yarn)", where, prefix, type);
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
