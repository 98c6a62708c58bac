// An architecture family as quern knows it: how its hyper-parameters are
// read (GGUF keys, Hugging Face config.json), which tensors it has (one
// table for both sources) and the layer program it computes. Each family is
// one file in this folder defining an ArchDef; registry.cpp lists them.
// docs/adding-an-architecture.md walks through one.
#pragma once
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/program.h"
#include "model/config.h"
#include "model/tensor_table.h"

namespace quern {

class GgufFile;
class GgufWriter;
class SafetensorsModel;
class WeightStore;

/// Typed reads of a GGUF file's `{arch}.` keys (the prefix added here).
struct GgufKeys {
    const GgufFile& f;
    std::string prefix;  ///< "llama.", "gemma3.", ...
    int64_t get_int(std::string_view key) const;
    int64_t get_int(std::string_view key, int64_t def) const;
    double get_float(std::string_view key, double def) const;
    bool get_bool(std::string_view key, bool def) const;
    std::string get_string(std::string_view key, std::string_view def) const;
    bool has_tensor(std::string_view name) const;
};

/// Typed reads of a config.json; every error names the key and the file.
struct HfKeys {
    const nlohmann::json& j;
    const std::string& where;

    bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }
    int64_t get_int(const char* key) const;
    int64_t get_int(const char* key, int64_t def) const;
    double get_float(const nlohmann::json& obj, const char* key, const std::string& path) const;
    double get_float(const char* key, double def) const;
    bool get_bool(const char* key, bool def) const;
    std::string get_string(const char* key, const std::string& def) const;
};

/// Defaults of config.json keys that transformers' config classes set per
/// family (read before the family's hook runs).
struct HfDefaults {
    int64_t head_dim = 0;           ///< 0: hidden_size / num_attention_heads
    int64_t n_ctx = 2048;           ///< max_position_embeddings
    bool tie_embeddings = false;    ///< tie_word_embeddings
    double rope_theta = 10000.0;
    /// rope_parameters may give full_attention and sliding_attention their
    /// own values (transformers 5, Gemma); rope_local: the sliding layers'
    /// rope_theta becomes ModelConfig::rope_base_local.
    bool per_layer_rope = false;
    bool rope_local = false;
    double partial_rotary = 1.0;    ///< partial_rotary_factor when the config omits it (Qwen3.5: 0.25)
    bool no_intermediate = false;   ///< intermediate_size may be absent (every FFN an expert layer; the hook sets n_ff)
};

struct ArchDef {
    std::string_view name;                   ///< general.architecture (ModelConfig::arch)
    std::vector<std::string_view> hf_types;  ///< config.json model_type values it reads
    /// What the family's GGUF files say beyond the keys every family shares
    /// (read by ModelConfig::from_gguf before the hook).
    void (*gguf_config)(const GgufKeys& k, ModelConfig& c);
    HfDefaults hf_defaults;
    /// The same for config.json (`model_type` is the key's value: families
    /// that read several tell them apart by it). Runs before the RoPE keys
    /// are read.
    void (*hf_config)(const HfKeys& k, const std::string& model_type, ModelConfig& c);
    /// config.json model_type values the family knows but does not run,
    /// each with the reason given in the error.
    std::vector<std::pair<std::string_view, std::string_view>> hf_refused;
    /// Every tensor of a model with config `c`.
    void (*tensors)(const ModelConfig& c, TensorTable& t);
    /// The layer program over the bound tensors.
    Program (*build)(const ModelConfig& c, const BoundWeights& w);
    /// The family's own `{arch}.` keys of a GGUF file for `c` (as llama.cpp's
    /// converter writes them; the inverse of gguf_config), after the shared
    /// ones (synthetic models: model/synth.cpp).
    void (*gguf_write)(const ModelConfig& c, GgufWriter& w, const std::string& prefix);
    /// The draft program of the model's NextN head (ModelConfig::n_nextn >
    /// 0): tokens x_{p+1} with the trunk's Program::hidden row of position
    /// p as its given rows (OpKind::Input), at position p, one KV-cache
    /// layer; its logits predict x_{p+2} and its Program::hidden feeds the
    /// next draft step. Null for families without one.
    Program (*build_draft)(const ModelConfig& c, const BoundWeights& w) = nullptr;
    /// The family's GGUF files store q and k rows permuted for interleaved
    /// RoPE pairs (llama.cpp's converter permutes the checkpoint's rows);
    /// writing a checkpoint as GGUF must do the same (model/hf_to_gguf.h).
    bool gguf_permutes_qk = false;
    /// Loads the checkpoint tensors the table leaves to the family (entries
    /// with no Hugging Face name whose checkpoint layout is the family's own:
    /// gpt-oss's stacked, interleaved or MXFP4 expert banks) into `w` under
    /// their GGUF names, adding every checkpoint tensor it read to `used`.
    /// Null: the table names every checkpoint tensor.
    void (*hf_load)(const ModelConfig& c, const SafetensorsModel& st, WeightStore& w,
                    std::set<std::string>& used) = nullptr;
};

/// The family with this general.architecture, or null.
const ArchDef* find_arch(std::string_view name);
/// The family that reads this config.json model_type, or null.
const ArchDef* find_hf_arch(std::string_view model_type);
/// Why a model_type some family knows is refused, or "" (not refused).
std::string_view hf_refusal(std::string_view model_type);
/// "llama, qwen2, ..." for error messages (GGUF names, or config.json's).
std::string supported_archs(bool hf);

}  // namespace quern
