// Hugging Face model folders: config.json + safetensors weights (one file or
// shards with model.safetensors.index.json) → a Model.
#pragma once
#include <map>
#include <memory>
#include <string>

#include "model/model.h"

namespace quern {

/// Where the parts of a Hugging Face model folder are.
struct HfFolder {
    std::string dir;      ///< the folder
    std::string config;   ///< dir/config.json
    std::string weights;  ///< what SafetensorsModel::open reads: the folder, or the file / index the user named
};

/// True when `path` names a Hugging Face model folder or a file inside one: a
/// folder holding config.json, a config.json, a *.safetensors file or a
/// *.safetensors.index.json. Never throws.
bool is_hf_model_path(const std::string& path);

/// Resolves a folder, its config.json, or a safetensors file or index inside
/// it. Throws quern::Error when the folder has no config.json.
HfFolder resolve_hf_folder(const std::string& path);

/// Loads a Hugging Face checkpoint of model_type llama, qwen2, qwen3, gemma2,
/// gemma3_text, mixtral, qwen3_moe or phi3 (ModelConfig::from_hf_config) for
/// the CPU forward pass. Experts stay one 2-D tensor each
/// (blk.N.ffn_{gate,up,down}.E.weight); Phi-3's fused qkv_proj and
/// gate_up_proj stay fused (blk.N.attn_qkv.weight, blk.N.ffn_up.weight).
/// Gemma's RMSNorm weights w (stored as w, used as 1 + w by transformers'
/// Gemma2RMSNorm / Gemma3RMSNorm) are loaded as 1 + w, the convention of
/// llama.cpp's GGUF files, so both sources run the same forward pass. Weight matrices
/// stay in the memory-mapped safetensors files (F32, F16 or BF16, used as
/// stored: a PyTorch [out, in] row-major matrix is ne = {in, out}); FP8 and
/// NVFP4 matrices of quantized checkpoints (config.json quantization_config or
/// hf_quant_config.json: hf_quant.h) are repacked with their scales into the
/// weight-only F8_E4M3_B32 / NVFP4 types (or F32 where their shape does not
/// allow it), their activation and KV-cache scales left unused; norm
/// weights and biases are widened to F32; llama3/linear RoPE scaling stays in
/// the config (ModelConfig::rope_freq_factors). Tensors get llama.cpp's GGUF names
/// (model.layers.N.self_attn.q_proj.weight → blk.N.attn_q.weight, ...). q/k
/// rows are not permuted: the model uses NeoX-ordered RoPE, as transformers'
/// rotate_half does.
/// Throws quern::Error naming the tensor and the file for a missing tensor, a
/// wrong shape (shown outermost first, as stored), a dtype other than F32,
/// F16 or BF16 (or the quantized ones of the checkpoint's scheme), a missing
/// or misshapen scale tensor, a tensor the architecture does not use, and
/// (through the safetensors reader) malformed or truncated files; naming the
/// key and the file for a quantization scheme quern cannot run.
std::unique_ptr<Model> load_hf_model(const std::string& path);

/// The chat templates of folder `dir` by name ("" the default):
/// tokenizer_config.json's chat_template (a string, or a list of {"name",
/// "template"} objects), else chat_template.jinja. quern::Error for a
/// tokenizer_config.json that is not JSON.
std::map<std::string, std::string> hf_chat_templates(const std::string& dir);

}  // namespace quern
