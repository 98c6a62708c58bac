// Hugging Face checkpoint → Model (see hf_model.h). The architecture's tensor
// table (model/arch/) names each tensor as transformers' state dict holds it
// (as save_pretrained writes it: one 2-D tensor per expert) and the GGUF name
// the program binds it under.
#include "model/hf_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/fp16.h"
#include "formats/safetensors.h"
#include "model/arch/arch.h"
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

/// One tensor of the checkpoint the architecture's table names.
struct Want {
    std::string hf;              // name in the checkpoint
    std::string gguf;            // name the forward pass binds
    std::vector<int64_t> shape;  // as stored, outermost first
    bool add_one = false;        // a norm weight used as 1 + w
    bool neg_exp = false;        // stored as log(−a), used as a
    bool floats = false;         // a Vector entry: widened to F32
    int64_t elements() const {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        return n;
    }
    std::vector<int64_t> ne;     // the model's shape (innermost first)
};

/// The tensors a checkpoint of config `c` holds, from its architecture's
/// table: matrices and vectors as named, expert banks one tensor per expert
/// (bound under llama.cpp's per-expert names, blk.N.ffn_gate.E.weight, ...).
std::vector<Want> expected_tensors(const ModelConfig& c) {
    const ArchDef* def = find_arch(c.arch);
    if (!def) fail("model architecture '{}' is not supported", c.arch);
    TensorTable table;
    def->tensors(c, table);
    std::vector<Want> w;
    for (const TensorEntry& e : table.entries()) {
        if (e.hf.empty()) continue;  // derived from the config
        const std::vector<int64_t> stored = e.hf_shape.empty() ? std::vector<int64_t>(e.shape.rbegin(), e.shape.rend())
                                                               : e.hf_shape;
        if (e.kind == TensorKind::Experts) {
            for (int64_t x = 0; x < e.n_expert; ++x)
                w.push_back({fmt::format(fmt::runtime(e.hf), x), fmt::format(fmt::runtime(e.gguf_expert), x), stored,
                             false, false, false, {}});
        } else {
            w.push_back({e.hf, e.gguf, stored, e.hf_add_one, e.hf_neg_exp, e.kind == TensorKind::Vector, e.shape});
        }
    }
    return w;
}

/// Tensors a checkpoint may hold that quern has no use for.
bool ignorable(const std::string& name, const ModelConfig& c) {
    if (ends_with(name, ".rotary_emb.inv_freq")) return true;  // a buffer older checkpoints saved
    // A multimodal wrapper's vision tower; a multi-token-prediction head the
    // config does not declare (Qwen3-Next style), or its blocks past the
    // first (quern drafts with one, as llama.cpp does).
    if (name.starts_with("model.visual.")) return true;
    if (c.has_recurrent_state() && name.starts_with("mtp.") &&
        (c.n_nextn == 0 || (name.starts_with("mtp.layers.") && !name.starts_with("mtp.layers.0."))))
        return true;
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

std::map<std::string, std::string> hf_chat_templates(const std::string& dir) {
    std::map<std::string, std::string> t;
    std::error_code ec;
    const fs::path cfg = fs::path(dir) / "tokenizer_config.json";
    if (fs::exists(cfg, ec)) {
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(read_text(cfg.string()));
        } catch (const nlohmann::json::exception& e) {
            fail("{}: not valid JSON ({})", cfg.string(), e.what());
        }
        const nlohmann::json ct = j.is_object() ? j.value("chat_template", nlohmann::json()) : nlohmann::json();
        if (ct.is_string()) t[""] = ct.get<std::string>();
        if (ct.is_array())
            for (const auto& e : ct)
                if (e.is_object() && e.value("name", nlohmann::json()).is_string() &&
                    e.value("template", nlohmann::json()).is_string()) {
                    const std::string n = e["name"].get<std::string>();
                    t[n == "default" ? "" : n] = e["template"].get<std::string>();
                }
    }
    const fs::path jinja = fs::path(dir) / "chat_template.jinja";  // newer transformers save it here
    if (!t.count("") && fs::exists(jinja, ec)) t[""] = read_text(jinja.string());
    return t;
}

std::unique_ptr<Model> load_hf_model(const std::string& path) {
    const HfFolder folder = resolve_hf_folder(path);
    ModelConfig cfg = ModelConfig::from_hf_config(read_text(folder.config), folder.config);
    if (cfg.name.empty() || fs::path(cfg.name).is_absolute()) cfg.name = fs::path(folder.dir).filename().string();
    const HfQuantConfig quant = read_hf_quant_config(read_text(folder.config), folder.config, folder.dir);
    auto st = std::make_shared<SafetensorsModel>(SafetensorsModel::open(folder.weights));
    const std::string where = st->index_path().empty() ? st->files().front()->path() : st->index_path();
    // A config may declare a multi-token-prediction head that the checkpoint
    // was saved without (transformers' save_pretrained drops it): no drafts.
    if (cfg.n_nextn > 0 && !st->find(hf_quant_stored_name(quant, *st, "mtp.fc.weight"))) cfg.n_nextn = 0;

    WeightStore w;
    std::set<std::string> used;
    for (Want& want : expected_tensors(cfg)) {
        const SafetensorsModel::Entry* e = st->find(hf_quant_stored_name(quant, *st, want.hf));
        if (!e && want.hf.starts_with("model.")) {  // a multimodal wrapper's text model: model.language_model.*
            const std::string wrapped = "model.language_model." + want.hf.substr(6);
            if ((e = st->find(hf_quant_stored_name(quant, *st, wrapped)))) want.hf = wrapped;
        }
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
        if (want.floats) {
            // Norm weights, biases, small tables: widened to F32 (the ops read floats).
            const int64_t n = want.elements();
            auto buf = std::shared_ptr<float[]>(new float[static_cast<size_t>(n)]);
            const uint8_t* src = e->file->data(info);
            const size_t es = static_cast<size_t>(dtype_info(info.type).type_size);
            for (int64_t i = 0; i < n; ++i) buf[static_cast<size_t>(i)] = to_f32(info.type, src + static_cast<size_t>(i) * es);
            if (want.add_one)
                for (int64_t i = 0; i < n; ++i) buf[static_cast<size_t>(i)] += 1.0f;  // Gemma's (1 + w)
            if (want.neg_exp)
                for (int64_t i = 0; i < n; ++i) buf[static_cast<size_t>(i)] = -std::exp(buf[static_cast<size_t>(i)]);
            std::array<int64_t, 4> ne{1, 1, 1, 1};
            for (size_t d = 0; d < want.ne.size() && d < 4; ++d) ne[d] = want.ne[d];
            w.add(Tensor::contiguous(DType::F32, {ne[0], ne[1], ne[2], ne[3]}, buf.get(), want.gguf),
                  std::shared_ptr<const void>(buf, buf.get()));
        } else {
            w.add(std::move(t), st);
        }
    }
    if (const ArchDef* def = find_arch(cfg.arch); def && def->hf_load) def->hf_load(cfg, *st, w, used);
    for (const auto& e : st->tensors())
        if (!used.count(e.info->name) && !ignorable(e.info->name, cfg) &&
            !(quant.kind != HfQuantKind::None && hf_quant_unused_tensor(e.info->name)))
            fail("tensor '{}' in {} is not part of a {} model with this config ({}); refusing to ignore it",
                 e.info->name, e.file->path(), cfg.arch, folder.config);
    return Model::from_weights(cfg, std::move(w));
}

}  // namespace quern
