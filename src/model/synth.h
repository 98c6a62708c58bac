// Synthetic models: the exact shapes and block layouts of real models, with
// random weights, for benchmarking shapes we have no weights for. Built in
// memory (`quern bench --synthetic`) or written as a GGUF file with a tokenizer
// (`quern synth`) that other engines load too.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace quern {

struct SynthPreset {
    std::string name;
    std::string description;
    ModelConfig cfg;
    bool tied = false;  // output projection shares token_embd
};

/// Named shapes from the published configs: smollm2-135m, llama3-1b,
/// llama3-8b, llama3-70b, qwen2-7b (arch qwen2: q/k/v biases), qwen3-30b-a3b (arch qwen3moe),
/// mixtral-8x7b (arch llama with experts), qwen3-8b (arch qwen3),
/// gemma2-2b (gemma2), gemma3-270m and gemma3-4b (gemma3), phi3-mini (phi3,
/// fused attn_qkv and gate/up), granite-3.1-2b (granite), gpt-oss-20b and
/// gpt-oss-120b (gpt-oss: sinks, alternating window, YaRN, biased experts;
/// scheme MXFP4_MOE as their GGUF files ship). Each config is the
/// one ModelConfig::from_gguf reads back from the file write_synthetic_gguf
/// writes for it.
const std::vector<SynthPreset>& synth_presets();
/// Throws quern::Error listing the known presets when `name` is not one.
const SynthPreset& synth_preset(const std::string& name);
/// A test-sized copy of a preset: the same architecture, flags and tensor
/// layout (fused projections, norms, experts, tied output, local/global layer
/// pattern from layer 0, RoPE scaling) with small dimensions: vocabulary 512,
/// width 256, at most 6 layers, at most 4 query heads (grouped-query presets keep
/// their group size where 4 heads allow it), head_dim 64 (rope_dim scaled alike), FFN width
/// 512, experts at most 8 (width 256, or the FFN width for the llama
/// architecture, whose experts have it) with at most 2 used, sliding window at
/// most 4 positions (so short sequences cross it), context at most 4096.
/// Named "<preset>-tiny". Width 256 keeps K-quants unfallen.
SynthPreset synth_tiny(const SynthPreset& p);

/// The canonical name of a quantization scheme given in any case ("q4_k_m" ->
/// "Q4_K_M", "f32" -> "F32"). Throws quern::Error listing the valid schemes
/// for an unknown one; with `gguf`, also for quern's own F8_E4M3_B32 / NVFP4
/// layouts (which only a model in memory can hold), listing what a GGUF file can.
std::string synth_scheme(const std::string& name, bool gguf);

/// The block type a weight gets under a quantization scheme (any case): a plain type
/// name ("Q8_0", "Q4_K", "F16", ...) applies to every 2-D weight; "Q4_K_M" and
/// "Q5_K_M" follow llama.cpp's per-tensor choices (and "MXFP4_MOE" its:
/// expert banks MXFP4, other matrices Q8_0) (attn_v and ffn_down of
/// some layers and the output in Q6_K, a fused attn_qkv in Q5_K / Q6_K, the
/// rest in Q4_K / Q5_K; make_synthetic gives a tied token_embd the output's
/// type). A K-quant that
/// does not divide the row length ne0 falls back as llama.cpp does (Q4_K→Q5_0,
/// Q5_K→Q5_1, Q6_K→Q8_0, Q2_K/Q3_K→Q4_0). Throws for unknown schemes.
DType synth_tensor_type(const std::string& scheme, const std::string& tensor_name, int64_t layer, int64_t n_layer,
                        int64_t ne0);
/// The GGUF general.file_type value for a scheme (llama_ftype numbering).
uint32_t synth_file_type(const std::string& scheme);

/// A synthetic model: config plus weights owned in memory.
struct SynthModel {
    ModelConfig cfg;
    WeightStore weights;
    std::vector<std::string> order;  // tensor names in file order
    std::string scheme;
    bool tied = false;
};

/// Builds random weights for every tensor of the family's table (model/arch/;
/// Gaussian, std 0.02, quantized with the reference
/// quantizers; a pool of distinct rows is reused across each tensor to keep
/// building fast; in 3-D expert banks the reused rows are picked by a hash of
/// the whole row index, so that no two experts are the same matrix). `progress(done, total)` is called per tensor.
SynthModel make_synthetic(const SynthPreset& p, const std::string& scheme, uint64_t seed,
                          const std::function<void(int64_t, int64_t)>& progress = {});

/// Writes `m` as a GGUF v3 file (quern::Error for weights of quern's own
/// F8_E4M3_B32 / NVFP4 layouts, which GGUF cannot hold) with {arch}.*
/// metadata as llama.cpp reads it — the keys every family has, then the
/// family's own (ArchDef::gguf_write, model/arch/) — the tensors in m.order
/// (the family's tensor table, llama.cpp's names), and a byte-level BPE
/// tokenizer (256 byte tokens, specials, reserved tokens up to n_vocab).
void write_synthetic_gguf(const SynthModel& m, const std::string& path,
                          const std::function<void(uint64_t, uint64_t)>& progress = {});

}  // namespace quern
