// Quantized Hugging Face checkpoints (FP8 and NVFP4) as weight-only quern
// types: which scheme a folder uses, and each quantized weight repacked into
// F8_E4M3_B32 or NVFP4 (quant/blocks.h) for the CPU matmul.
//
// Shapes of checkpoint tensors are written as stored, outermost first: [N, K]
// is a weight of N output rows of K inputs (quern's Tensor::ne = {K, N}).
//
// Schemes read (from config.json's "quantization_config", else ModelOpt's
// hf_quant_config.json {"producer": ..., "quantization": {...}}):
//   - quant_method "fp8" (transformers' fine-grained FP8, DeepSeek/Qwen-style):
//       weight F8_E4M3 [N, K]; weight_scale_inv (despite its name the factor:
//       w = code · scale) F32 [ceil(N/bn), ceil(K/bk)] for weight_block_size
//       [bn, bk], or one value when weight_block_size is null;
//       activation_scheme "dynamic" or "static" (activation_scale /
//       input_scale then present and unused).
//   - quant_method "compressed-tensors", format "float-quantized" or
//       "naive-quantized", weights {type float, num_bits 8, symmetric}:
//       weight F8_E4M3 [N, K]; weight_scale (F32/BF16/F16) of one value
//       (strategy "tensor"), [N, 1] ("channel") or [ceil(N/bn), ceil(K/bk)]
//       ("block", block_structure [bn, bk]); input_activations null or FP8
//       (input_scale, if static, unused).
//   - quant_method "modelopt" (config.json, keys flat or under "quantization")
//       or hf_quant_config.json, quant_algo:
//       "FP8": weight F8_E4M3, weight_scale F32 of one value, input_scale;
//       "FP8_PER_CHANNEL_PER_TOKEN": weight_scale [N];
//       "FP8_PB_WO": weight_scale [N/128, K/128] (or [N/128, 1, K/128, 1]);
//       "NVFP4" / "W4A16_NVFP4" (group_size 16): weight U8 [N, K/2], two E2M1
//       codes per byte, element 2i in the low nibble; weight_scale F8_E4M3
//       [N, K/16]; weight_scale_2 F32 global scale (one value); input_scale
//       (NVFP4) unused: w = e2m1(q) · f32(e4m3(weight_scale) · weight_scale_2).
// Weights stored in F32/F16/BF16 (lm_head, the ignore / exclude_modules
// lists) load as plain float weights: the stored dtype decides. Activation
// scales and FP8 KV-cache scales (input_scale, activation_scale, k_scale,
// v_scale) are left unused: quern runs these checkpoints weight-only, with
// f32 activations and its own KV cache.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "formats/safetensors.h"

namespace quern {

/// How a checkpoint's quantized weights are stored.
enum class HfQuantKind {
    None,        ///< not quantized
    Fp8Block,    ///< E4M3 codes, one scale per block_n x block_k block
    Fp8Channel,  ///< E4M3 codes, one scale per output row
    Fp8Tensor,   ///< E4M3 codes, one scale for the tensor
    Nvfp4,       ///< packed E2M1 pairs, E4M3 scale per 16, f32 global scale
    Mxfp4,       ///< gpt-oss: MXFP4 expert banks (the architecture's ArchDef::hf_load reads them); the rest float
};

/// The quantization scheme of a checkpoint folder.
struct HfQuantConfig {
    HfQuantKind kind = HfQuantKind::None;
    std::string file;          ///< where the scheme was read (config.json or hf_quant_config.json)
    std::string description;   ///< e.g. "fine-grained FP8 (weight_block_size [128, 128])"
    std::string scale_suffix;  ///< the scale beside "NAME.weight": "weight_scale_inv" or "weight_scale"
    int64_t block_n = 0, block_k = 0;  ///< Fp8Block: rows and columns per scale
    /// Nvfp4: where the codes are: "" = NAME.weight (ModelOpt), or the suffix
    /// replacing "weight" ("weight_packed": compressed-tensors).
    std::string packed_suffix;
    /// Nvfp4: the per-tensor global scale beside the weight, and whether it
    /// multiplies (ModelOpt weight_scale_2: w = code · scale · g) or divides
    /// (compressed-tensors weight_global_scale: w = code · scale / g).
    std::string global_suffix = "weight_scale_2";
    bool global_divides = false;
};

/// Reads the scheme of the folder `dir`: config.json's quantization_config
/// (`config_text`, read from `config_path`), else dir/hf_quant_config.json;
/// kind None when neither has one. Throws quern::Error naming the file and
/// the key for a scheme quern cannot run (another quant_method or quant_algo,
/// integer or 4-bit weights under an FP8 method, activation schemes other
/// than FP8 or none, scale formats other than float), with what to do.
HfQuantConfig read_hf_quant_config(const std::string& config_text, const std::string& config_path,
                                   const std::string& dir);

/// True for a tensor a weight-only path leaves unused (activation and KV-cache
/// scales: names ending in .input_scale, .activation_scale, .k_scale, .v_scale,
/// .input_global_scale).
bool hf_quant_unused_tensor(const std::string& name);

/// One quantized weight as a quern tensor.
struct HfQuantWeight {
    Tensor tensor;                        ///< ne = {K, N}: F8_E4M3_B32, NVFP4, or F32 (see below)
    std::shared_ptr<const void> owner;    ///< its bytes
    std::vector<std::string> consumed;    ///< the checkpoint tensors it was made of (weight and scales)
};

/// Whether `entry` (a matrix the architecture expects) is stored quantized
/// under `q`: F8_E4M3 for the FP8 schemes, U8 for NVFP4. Throws quern::Error
/// naming the tensor and file for an F8_E4M3 / U8 tensor that the scheme does
/// not explain (no quantization config, or the other format).
bool hf_is_quantized_weight(const HfQuantConfig& q, const SafetensorsModel::Entry& entry, const std::string& config_path);

/// The name under which the checkpoint stores the weight `hf_name`
/// ("....weight"): hf_name itself, or for compressed-tensors NVFP4
/// "....weight_packed" when only that exists.
std::string hf_quant_stored_name(const HfQuantConfig& q, const SafetensorsModel& st, const std::string& hf_name);

/// Builds the weight `hf_name` ("....weight", logical shape [N, K] outermost
/// first, as the architecture expects it) of a quantized checkpoint, with its
/// scales from `st`, named `name`. FP8 becomes F8_E4M3_B32 (the checkpoint's
/// scale copied into every 32-column block) when K and the scale blocks'
/// width are multiples of 32; NVFP4 becomes NVFP4 (the global scale copied into
/// every 64-element block) when K is a multiple of 64; otherwise the weight is
/// dequantized to F32 (exactly the values the quantized layouts decode to).
/// Throws quern::Error naming the tensor and its file for a missing scale, a
/// scale of the wrong shape or dtype, a packed weight of the wrong shape, NaN
/// codes or scales, with what to do.
HfQuantWeight hf_load_quantized_weight(const SafetensorsModel& st, const HfQuantConfig& q,
                                       const std::string& hf_name, int64_t N, int64_t K, const std::string& name);

}  // namespace quern
