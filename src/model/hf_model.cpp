// Hugging Face checkpoint → Model (see hf_model.h). Tensor names follow
// transformers' LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM /
// Gemma2ForCausalLM / Gemma3ForCausalLM / MixtralForCausalLM /
// Qwen3MoeForCausalLM / Phi3ForCausalLM state dicts (as save_pretrained
// writes them: one 2-D tensor per expert); they are renamed to the
// GGUF names the llama forward pass binds.
#include "model/hf_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/fp16.h"
#include "formats/safetensors.h"
#include "model/hf_quant.h"

namespace quern {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, std::string_view suf) {
    return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

std::string read_text(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail("cannot read {}", path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

/// One tensor the architecture expects.
struct Want {
    std::string hf;             // name in the checkpoint
    std::string gguf;           // name the forward pass binds
    std::vector<int64_t> shape; // as stored, outermost first
};

/// True for the Gemma architectures, whose RMSNorms multiply by (1 + w):
/// their norm weights get the 1 added at load (as llama.cpp's converter does).
bool gemma_arch(const ModelConfig& c) { return c.arch == "gemma2" || c.arch == "gemma3"; }

/// The tensors of a llama / qwen2 / qwen3 / gemma2 / gemma3 / mixtral /
/// qwen3_moe / phi3 checkpoint with config `c`.
std::vector<Want> expected_tensors(const ModelConfig& c) {
    const int64_t E = c.n_embd, V = c.n_vocab, F = c.n_ff, Q = c.q_dim(), K = c.kv_dim();
    std::vector<Want> w{{"model.embed_tokens.weight", "token_embd.weight", {V, E}},
                        {"model.norm.weight", "output_norm.weight", {E}}};
    if (!c.tie_embeddings) w.push_back({"lm_head.weight", "output.weight", {V, E}});
    for (int64_t i = 0; i < c.n_layer; ++i) {
        const std::string p = fmt::format("model.layers.{}.", i), b = fmt::format("blk.{}.", i);
        auto add = [&](const std::string& hf, const std::string& gguf, std::vector<int64_t> shape) {
            w.push_back({p + hf, b + gguf, std::move(shape)});
        };
        add("input_layernorm.weight", "attn_norm.weight", {E});
        if (c.fused_qkv) {
            add("self_attn.qkv_proj.weight", "attn_qkv.weight", {Q + 2 * K, E});  // Phi3Attention
        } else {
            add("self_attn.q_proj.weight", "attn_q.weight", {Q, E});
            add("self_attn.k_proj.weight", "attn_k.weight", {K, E});
            add("self_attn.v_proj.weight", "attn_v.weight", {K, E});
        }
        add("self_attn.o_proj.weight", "attn_output.weight", {E, Q});
        if (c.qkv_bias) {
            add("self_attn.q_proj.bias", "attn_q.bias", {Q});
            add("self_attn.k_proj.bias", "attn_k.bias", {K});
            add("self_attn.v_proj.bias", "attn_v.bias", {K});
        }
        if (c.out_bias) add("self_attn.o_proj.bias", "attn_output.bias", {E});
        if (c.qk_norm) {
            add("self_attn.q_norm.weight", "attn_q_norm.weight", {c.head_dim});
            add("self_attn.k_norm.weight", "attn_k_norm.weight", {c.head_dim});
        }
        if (gemma_arch(c)) {
            // Gemma2DecoderLayer / Gemma3DecoderLayer: four norms per block.
            add("post_attention_layernorm.weight", "post_attention_norm.weight", {E});
            add("pre_feedforward_layernorm.weight", "ffn_norm.weight", {E});
            add("post_feedforward_layernorm.weight", "post_ffw_norm.weight", {E});
        } else {
            add("post_attention_layernorm.weight", "ffn_norm.weight", {E});
        }
        if (c.moe()) {
            // One 2-D tensor per expert, bound under llama.cpp's per-expert names
            // (blk.N.ffn_gate.E.weight, ...). Mixtral: block_sparse_moe with
            // w1 (gate), w3 (up), w2 (down); Qwen3-MoE: mlp with *_proj.
            const int64_t X = c.n_expert, Fe = c.n_ff_exp;
            const bool mixtral = c.arch == "llama";
            const std::string m = mixtral ? "block_sparse_moe." : "mlp.";
            add(m + "gate.weight", "ffn_gate_inp.weight", {X, E});
            for (int64_t e = 0; e < X; ++e) {
                const std::string x = fmt::format("{}experts.{}.", m, e);
                add(x + (mixtral ? "w1.weight" : "gate_proj.weight"), fmt::format("ffn_gate.{}.weight", e), {Fe, E});
                add(x + (mixtral ? "w3.weight" : "up_proj.weight"), fmt::format("ffn_up.{}.weight", e), {Fe, E});
                add(x + (mixtral ? "w2.weight" : "down_proj.weight"), fmt::format("ffn_down.{}.weight", e), {E, Fe});
            }
        } else if (c.fused_gate_up) {
            add("mlp.gate_up_proj.weight", "ffn_up.weight", {2 * F, E});  // Phi3MLP: gate rows, then up rows
            add("mlp.down_proj.weight", "ffn_down.weight", {E, F});
        } else {
            add("mlp.gate_proj.weight", "ffn_gate.weight", {F, E});
            add("mlp.up_proj.weight", "ffn_up.weight", {F, E});
            add("mlp.down_proj.weight", "ffn_down.weight", {E, F});
        }
    }
    return w;
}

/// Tensors a checkpoint may hold that quern has no use for.
bool ignorable(const std::string& name, const ModelConfig& c) {
    if (ends_with(name, ".rotary_emb.inv_freq")) return true;  // a buffer older checkpoints saved
    return c.tie_embeddings && name == "lm_head.weight";        // tied: transformers uses the embedding
}

float to_f32(DType t, const uint8_t* p) {
    switch (t) {
        case DType::F32: {
            float f;
            std::memcpy(&f, p, 4);
            return f;
        }
        case DType::F16: {
            uint16_t h;
            std::memcpy(&h, p, 2);
            return fp16_to_fp32(h);
        }
        default: {
            uint16_t h;
            std::memcpy(&h, p, 2);
            return bf16_to_fp32(h);
        }
    }
}

}  // namespace

bool is_hf_model_path(const std::string& path) {
    std::error_code ec;
    const fs::path p(path);
    if (fs::is_directory(p, ec)) return fs::exists(p / "config.json", ec);
    const std::string n = p.filename().string();
    return n == "config.json" || ends_with(n, ".safetensors") || ends_with(n, ".safetensors.index.json");
}

HfFolder resolve_hf_folder(const std::string& path) {
    std::error_code ec;
    const fs::path p(path);
    if (!fs::exists(p, ec)) fail("model path '{}' does not exist", path);
    HfFolder f;
    const bool dir = fs::is_directory(p, ec);
    const fs::path d = dir ? p : (p.has_parent_path() ? p.parent_path() : fs::path("."));
    f.dir = d.string();
    f.config = (d / "config.json").string();
    f.weights = (dir || p.filename() == "config.json") ? f.dir : path;
    if (!fs::exists(f.config, ec))
        fail("'{}' is not a Hugging Face model folder: {} is missing", path, f.config);
    return f;
}

std::unique_ptr<Model> load_hf_model(const std::string& path) {
    const HfFolder folder = resolve_hf_folder(path);
    ModelConfig cfg = ModelConfig::from_hf_config(read_text(folder.config), folder.config);
    if (cfg.name.empty() || fs::path(cfg.name).is_absolute()) cfg.name = fs::path(folder.dir).filename().string();
    const HfQuantConfig quant = read_hf_quant_config(read_text(folder.config), folder.config, folder.dir);
    auto st = std::make_shared<SafetensorsModel>(SafetensorsModel::open(folder.weights));
    const std::string where = st->index_path().empty() ? st->files().front()->path() : st->index_path();

    WeightStore w;
    std::set<std::string> used;
    const bool norm_plus_one = gemma_arch(cfg);
    for (const Want& want : expected_tensors(cfg)) {
        const SafetensorsModel::Entry* e = st->find(hf_quant_stored_name(quant, *st, want.hf));
        if (!e) fail("tensor '{}' is missing from {} (model_type {})", want.hf, where, cfg.arch);
        const SafetensorsTensorInfo& info = *e->info;
        const std::string& file = e->file->path();
        if (want.shape.size() == 2 && hf_is_quantized_weight(quant, *e, folder.config)) {
            // FP8 / NVFP4: repacked (with its scales) into a weight-only type.
            HfQuantWeight q = hf_load_quantized_weight(*st, quant, want.hf, want.shape[0], want.shape[1], want.gguf);
            used.insert(q.consumed.begin(), q.consumed.end());
            w.add(std::move(q.tensor), std::move(q.owner));
            continue;
        }
        if (info.shape != want.shape)
            fail("tensor '{}' in {} has shape [{}], expected [{}] for the config in {}", want.hf, file,
                 fmt::join(info.shape, ", "), fmt::join(want.shape, ", "), folder.config);
        if (info.type != DType::F32 && info.type != DType::F16 && info.type != DType::BF16)
            fail("tensor '{}' in {} has dtype {}; quern reads F32, F16 and BF16 weights (and the FP8 / NVFP4 "
                 "matrices of quantized checkpoints) from safetensors",
                 want.hf, file, info.dtype);
        used.insert(want.hf);
        Tensor t = e->file->tensor_view(info);
        t.name = want.gguf;
        if (want.shape.size() == 1) {
            // Norm weights and biases: widened to F32 (the ops read floats).
            const int64_t n = want.shape[0];
            auto buf = std::shared_ptr<float[]>(new float[static_cast<size_t>(n)]);
            const uint8_t* src = e->file->data(info);
            const size_t es = static_cast<size_t>(dtype_info(info.type).type_size);
            for (int64_t i = 0; i < n; ++i) buf[static_cast<size_t>(i)] = to_f32(info.type, src + static_cast<size_t>(i) * es);
            if (norm_plus_one && ends_with(want.gguf, "norm.weight"))
                for (int64_t i = 0; i < n; ++i) buf[static_cast<size_t>(i)] += 1.0f;  // Gemma's (1 + w)
            w.add(Tensor::contiguous(DType::F32, {n, 1, 1, 1}, buf.get(), want.gguf),
                  std::shared_ptr<const void>(buf, buf.get()));
        } else {
            w.add(std::move(t), st);
        }
    }
    for (const auto& e : st->tensors())
        if (!used.count(e.info->name) && !ignorable(e.info->name, cfg) &&
            !(quant.kind != HfQuantKind::None && hf_quant_unused_tensor(e.info->name)))
            fail("tensor '{}' in {} is not part of a {} model with this config ({}); refusing to ignore it",
                 e.info->name, e.file->path(), cfg.arch, folder.config);
    if (!cfg.rope_freq_factors.empty()) {
        const int64_t n = static_cast<int64_t>(cfg.rope_freq_factors.size());
        auto buf = std::shared_ptr<float[]>(new float[static_cast<size_t>(n)]);
        std::copy(cfg.rope_freq_factors.begin(), cfg.rope_freq_factors.end(), buf.get());
        w.add(Tensor::contiguous(DType::F32, {n, 1, 1, 1}, buf.get(), "rope_freqs.weight"),
              std::shared_ptr<const void>(buf, buf.get()));
    }
    return Model::from_weights(cfg, std::move(w));
}

}  // namespace quern
