// Quantized Hugging Face checkpoints → quern's weight-only types (hf_quant.h).
// Conventions: transformers' FineGrainedFP8Config (quant_method "fp8"),
// compressed-tensors' float-quantized format, and NVIDIA's model optimizer
// (ModelOpt) unified checkpoints, as described in hf_quant.h.
#include "model/hf_quant.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "core/error.h"
#include "core/fp16.h"
#include "quant/blocks.h"
#include "quant/fp8.h"

namespace quern {

namespace fs = std::filesystem;

namespace {

using json = nlohmann::json;

constexpr const char* kWhatToDo =
    "quern runs FP8 checkpoints (quant_method fp8, compressed-tensors float-quantized, ModelOpt FP8) and ModelOpt "
    "and compressed-tensors NVFP4 weight-only (on the CPU and the GPU); use the unquantized (bf16) checkpoint or a GGUF file of the model instead";

std::string upper(std::string s) {
    for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
}
std::string lower(std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

bool ends_with(const std::string& s, std::string_view suf) {
    return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

/// Typed reads of one JSON object of a quantization config; errors name the
/// file and the key's path ("quantization_config.weight_block_size").
struct Obj {
    const json& j;
    std::string file, path;  // path: "quantization_config." and the like

    bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
    std::string key(const char* k) const { return path + k; }
    std::string str(const char* k, const std::string& def) const {
        if (!has(k)) return def;
        if (!j[k].is_string()) fail("{}: {} must be a string, got {}", file, key(k), j[k].dump());
        return j[k].get<std::string>();
    }
    std::string str(const char* k) const {
        if (!has(k)) fail("{}: {} is missing", file, key(k));
        return str(k, "");
    }
    int64_t integer(const char* k, int64_t def) const {
        if (!has(k)) return def;
        const json& v = j[k];
        if (v.is_number_integer()) return v.get<int64_t>();
        if (v.is_string()) {  // ModelOpt has written group_size as a string
            try {
                size_t used = 0;
                const int64_t x = std::stoll(v.get<std::string>(), &used);
                if (used == v.get<std::string>().size()) return x;
            } catch (const std::exception&) {
            }
        }
        fail("{}: {} must be an integer, got {}", file, key(k), v.dump());
    }
    bool boolean(const char* k, bool def) const {
        if (!has(k)) return def;
        if (!j[k].is_boolean()) fail("{}: {} must be true or false, got {}", file, key(k), j[k].dump());
        return j[k].get<bool>();
    }
    /// A nested object (nullptr when absent or null).
    const json* object(const char* k) const {
        if (!has(k)) return nullptr;
        if (!j[k].is_object()) fail("{}: {} must be an object, got {}", file, key(k), j[k].dump());
        return &j[k];
    }
    Obj sub(const json& o, const std::string& name) const { return Obj{o, file, path + name + "."}; }
    /// [a, b] of positive integers.
    std::pair<int64_t, int64_t> pair(const char* k) const {
        const json& v = j[k];
        if (!v.is_array() || v.size() != 2 || !v[0].is_number_integer() || !v[1].is_number_integer() ||
            v[0].get<int64_t>() <= 0 || v[1].get<int64_t>() <= 0)
            fail("{}: {} must be two positive integers [rows, columns], got {}", file, key(k), v.dump());
        return {v[0].get<int64_t>(), v[1].get<int64_t>()};
    }
};

// ---------------------------------------------------------------- fine-grained FP8 (quant_method "fp8")
HfQuantConfig parse_fine_grained_fp8(const Obj& q) {
    HfQuantConfig c;
    const std::string act = lower(q.str("activation_scheme", "dynamic"));
    if (act != "dynamic" && act != "static")
        fail("{}: {} '{}' is not one quern knows (dynamic or static); {}", q.file, q.key("activation_scheme"), act,
             kWhatToDo);
    if (const std::string f = lower(q.str("fmt", "e4m3")); f != "e4m3")
        fail("{}: {} '{}': quern reads E4M3 FP8 weights only; {}", q.file, q.key("fmt"), f, kWhatToDo);
    // ue8m0 (DeepSeek-V3.1 and later): the block scales are powers of two,
    // still stored as F32 tensors, so they read as any float scale.
    const std::string scale_fmt = lower(q.str("scale_fmt", "float"));
    if (scale_fmt != "float" && scale_fmt != "ue8m0")
        fail("{}: {} '{}': quern reads float and ue8m0 block scales stored as F32; {}", q.file, q.key("scale_fmt"),
             scale_fmt, kWhatToDo);
    if (const std::string e = lower(q.str("expert_dtype", "fp8")); e != "fp8")
        fail("{}: {} '{}': quern reads FP8 experts only; {}", q.file, q.key("expert_dtype"), e, kWhatToDo);
    c.scale_suffix = "weight_scale_inv";
    if (q.has("weight_block_size")) {
        std::tie(c.block_n, c.block_k) = q.pair("weight_block_size");
        c.kind = HfQuantKind::Fp8Block;
        c.description = fmt::format("fine-grained FP8 (weight_block_size [{}, {}]{})", c.block_n, c.block_k,
                                    scale_fmt == "ue8m0" ? ", ue8m0 scales" : "");
    } else {
        c.kind = HfQuantKind::Fp8Tensor;
        c.description = "fine-grained FP8 (one scale per tensor)";
    }
    return c;
}

// ---------------------------------------------------------------- compressed-tensors (FP8 float-quantized)
bool ct_format_ok(const std::string& f) {
    return f == "float-quantized" || f == "naive-quantized" || f == "nvfp4-pack-quantized";
}

HfQuantConfig parse_compressed_tensors(const Obj& q) {
    const std::string format = q.str("format", "float-quantized");
    if (!ct_format_ok(format))
        fail("{}: {} '{}' is not supported: quern reads compressed-tensors FP8 (float-quantized) and NVFP4 "
             "(nvfp4-pack-quantized) checkpoints; {}",
             q.file, q.key("format"), format, kWhatToDo);
    if (const json* sp = q.object("sparsity_config"); sp && !sp->empty()) {
        const Obj s = q.sub(*sp, "sparsity_config");
        const std::string f = s.str("format", "dense");
        if (f != "dense")
            fail("{}: {} '{}': sparse compressed weights are not supported; {}", q.file, s.key("format"), f,
                 kWhatToDo);
    }
    if (const json* t = q.object("transform_config"); t && !t->empty())
        fail("{}: {} is set: rotated (transformed) checkpoints are not supported; {}", q.file,
             q.key("transform_config"), kWhatToDo);
    const json* groups = q.object("config_groups");
    if (!groups || groups->empty()) fail("{}: {} is missing or empty", q.file, q.key("config_groups"));

    HfQuantConfig c;
    c.scale_suffix = "weight_scale";
    std::string first;  // the first group's weight scheme, which the others must share
    for (const auto& [gname, gv] : groups->items()) {
        if (!gv.is_object()) fail("{}: {} must be an object", q.file, q.key("config_groups.") + gname);
        const Obj g = q.sub(gv, "config_groups." + gname);
        const std::string gformat = g.str("format", format);
        if (!ct_format_ok(gformat)) fail("{}: {} '{}' is not supported; {}", q.file, g.key("format"), gformat, kWhatToDo);
        const json* wv = g.object("weights");
        if (!wv) fail("{}: {} is missing", q.file, g.key("weights"));
        const Obj w = g.sub(*wv, "weights");
        const std::string type = w.str("type", "int");
        const int64_t bits = w.integer("num_bits", 8);
        const bool fp4 = type == "float" && bits == 4;
        if (type != "float" || (bits != 8 && bits != 4))
            fail("{}: {} {} with {} {}: quern reads FP8 (type float, 8 bits) and NVFP4 (type float, 4 bits) "
                 "compressed-tensors weights only; {}",
                 q.file, w.key("type"), type, w.key("num_bits"), bits, kWhatToDo);
        if (fp4 != (gformat == "nvfp4-pack-quantized"))
            fail("{}: {} {} with format '{}': 4-bit float weights are read from nvfp4-pack-quantized checkpoints "
                 "and 8-bit ones from float-quantized ones; {}",
                 q.file, w.key("num_bits"), bits, gformat, kWhatToDo);
        if (!w.boolean("symmetric", true))
            fail("{}: {} is false: asymmetric FP8 weights are not supported; {}", q.file, w.key("symmetric"),
                 kWhatToDo);
        if (w.boolean("dynamic", false))
            fail("{}: {} is true: the checkpoint holds no weight scales; {}", q.file, w.key("dynamic"), kWhatToDo);
        const std::string strategy = w.str("strategy", "tensor");
        HfQuantConfig gc;
        if (fp4) {
            // NVFP4 (llm-compressor): E2M1 codes, one E4M3 scale per 16, one
            // F32 global scale that divides.
            if (strategy != "tensor_group")
                fail("{}: {} '{}': compressed-tensors NVFP4 weights use strategy tensor_group; {}", q.file,
                     w.key("strategy"), strategy, kWhatToDo);
            if (const int64_t gs = w.integer("group_size", 16); gs != 16)
                fail("{}: {} {}: NVFP4 has one scale per 16 elements; {}", q.file, w.key("group_size"), gs,
                     kWhatToDo);
            gc.kind = HfQuantKind::Nvfp4;
        } else if (strategy == "tensor") {
            gc.kind = HfQuantKind::Fp8Tensor;
        } else if (strategy == "channel") {
            gc.kind = HfQuantKind::Fp8Channel;
        } else if (strategy == "block") {
            gc.kind = HfQuantKind::Fp8Block;
            if (!w.has("block_structure")) fail("{}: {} is missing", q.file, w.key("block_structure"));
            std::tie(gc.block_n, gc.block_k) = w.pair("block_structure");
        } else {
            fail("{}: {} '{}' is not supported (tensor, channel or block); {}", q.file, w.key("strategy"), strategy,
                 kWhatToDo);
        }
        if (const json* av = g.object("input_activations")) {
            const Obj a = g.sub(*av, "input_activations");
            const std::string at = a.str("type", "int");
            const int64_t ab = a.integer("num_bits", 8);
            if (at != "float" || (ab != 8 && ab != 4))
                fail("{}: {} {} with {} {}: quern runs these checkpoints weight-only and accepts FP8 and FP4 "
                     "activation schemes only; {}",
                     q.file, a.key("type"), at, a.key("num_bits"), ab, kWhatToDo);
        }
        if (g.has("output_activations"))
            fail("{}: {} is set: output quantization is not supported; {}", q.file, g.key("output_activations"),
                 kWhatToDo);
        const std::string scheme = fmt::format("{} {} {}", strategy, gc.block_n, gc.block_k);
        if (first.empty()) {
            first = scheme;
            c.kind = gc.kind;
            c.block_n = gc.block_n;
            c.block_k = gc.block_k;
            c.description = gc.kind == HfQuantKind::Nvfp4 ? std::string("compressed-tensors NVFP4")
                            : gc.kind == HfQuantKind::Fp8Block
                                ? fmt::format("compressed-tensors FP8 (block [{}, {}])", gc.block_n, gc.block_k)
                                : fmt::format("compressed-tensors FP8 ({})", strategy);
            if (gc.kind == HfQuantKind::Nvfp4) {
                c.packed_suffix = "weight_packed";
                c.global_suffix = "weight_global_scale";
                c.global_divides = true;
            }
        } else if (scheme != first) {
            fail("{}: {} uses weight strategy '{}' unlike the first group; quern reads one FP8 scheme per "
                 "checkpoint; {}",
                 q.file, g.key("weights"), strategy, kWhatToDo);
        }
    }
    return c;
}

// ---------------------------------------------------------------- NVIDIA model optimizer
/// `q`: the object holding quant_algo (config.json's quantization_config, its
/// "quantization" object, or hf_quant_config.json's "quantization").
HfQuantConfig parse_modelopt(const Obj& q) {
    const std::string algo = upper(q.str("quant_algo"));
    HfQuantConfig c;
    c.scale_suffix = "weight_scale";
    if (algo == "FP8") {
        c.kind = HfQuantKind::Fp8Tensor;
        c.description = "ModelOpt FP8 (one scale per tensor)";
    } else if (algo == "FP8_PER_CHANNEL_PER_TOKEN") {
        c.kind = HfQuantKind::Fp8Channel;
        c.description = "ModelOpt FP8 (one scale per channel)";
    } else if (algo == "FP8_PB_WO") {
        c.kind = HfQuantKind::Fp8Block;
        c.block_n = c.block_k = 128;
        c.description = "ModelOpt FP8 (128x128 blocks)";
    } else if (algo == "NVFP4" || algo == "W4A16_NVFP4") {
        const int64_t gs = q.integer("group_size", 16);
        if (gs != 16)
            fail("{}: {} {}: NVFP4 has one scale per 16 elements; {}", q.file, q.key("group_size"), gs, kWhatToDo);
        c.kind = HfQuantKind::Nvfp4;
        c.description = "ModelOpt NVFP4";
    } else {
        fail("{}: {} '{}' is not supported (FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, NVFP4, W4A16_NVFP4); {}", q.file,
             q.key("quant_algo"), algo, kWhatToDo);
    }
    // kv_cache_quant_algo (FP8 / NVFP4) and kv_cache_scheme only ask for a
    // quantized KV cache; quern keeps its own and leaves k_scale / v_scale unused.
    return c;
}

HfQuantConfig parse_quantization_config(const Obj& q) {
    const std::string method = lower(q.str("quant_method"));
    if (method == "fp8") return parse_fine_grained_fp8(q);
    if (method == "mxfp4") {  // transformers' Mxfp4Config: the experts' _blocks / _scales, read by the architecture
        HfQuantConfig c;
        c.kind = HfQuantKind::Mxfp4;
        c.description = "MXFP4 experts";
        return c;
    }
    if (method == "compressed-tensors") return parse_compressed_tensors(q);
    if (method.rfind("modelopt", 0) == 0) {
        if (const json* inner = q.object("quantization")) return parse_modelopt(q.sub(*inner, "quantization"));
        return parse_modelopt(q);
    }
    fail("{}: {} '{}' is not supported; {}", q.file, q.key("quant_method"), method, kWhatToDo);
}

// ---------------------------------------------------------------- tensors
float scalar_at(const SafetensorsModel::Entry& e, uint64_t i) {
    const uint8_t* p = e.file->data(*e.info);
    switch (e.info->type) {
        case DType::F32: {
            float f;
            std::memcpy(&f, p + 4 * i, 4);
            return f;
        }
        case DType::F16: {
            uint16_t h;
            std::memcpy(&h, p + 2 * i, 2);
            return fp16_to_fp32(h);
        }
        case DType::BF16: {
            uint16_t h;
            std::memcpy(&h, p + 2 * i, 2);
            return bf16_to_fp32(h);
        }
        default: return kFp8E4M3Values[p[i]];  // F8_E4M3 (checked by the caller)
    }
}

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

/// The tensor `name`, which must exist beside the weight `weight`.
const SafetensorsModel::Entry& need(const SafetensorsModel& st, const std::string& name, const std::string& weight,
                                    const SafetensorsModel::Entry& w, const HfQuantConfig& q) {
    const SafetensorsModel::Entry* e = st.find(name);
    if (!e)
        fail("tensor '{}' is missing: the {} weight '{}' in {} needs it ({}); the checkpoint is incomplete, "
             "download or export it again",
             name, q.description, weight, w.file->path(), q.file);
    return *e;
}

void need_dtype(const SafetensorsModel::Entry& e, std::initializer_list<DType> ok, const char* what) {
    if (std::find(ok.begin(), ok.end(), e.info->type) != ok.end()) return;
    std::string names;
    for (DType t : ok) names += (names.empty() ? "" : " or ") + std::string(dtype_name(t));
    fail("tensor '{}' in {} has dtype {}; {} must be {} (the checkpoint does not follow its quantization config: "
         "use the checkpoint's own config files, or download it again)",
         e.info->name, e.file->path(), e.info->dtype, what, names);
}

void wrong_shape(const SafetensorsModel::Entry& e, const std::string& expected, const std::string& why) {
    fail("tensor '{}' in {} has shape {}, expected {} ({}); the weights do not match the quantization config: "
         "use the checkpoint's own config files, or download it again",
         e.info->name, e.file->path(), shape_str(e.info->shape), expected, why);
}

/// One f32 per scale-grid cell of an FP8 weight: gr x gc cells of bn x bk.
struct ScaleGrid {
    int64_t bn, bk, gr, gc;
    std::vector<float> s;
    float at(int64_t r, int64_t c) const { return s[static_cast<size_t>((r / bn) * gc + c / bk)]; }
};

ScaleGrid fp8_scales(const SafetensorsModel& st, const HfQuantConfig& q, const std::string& module,
                     const std::string& weight, const SafetensorsModel::Entry& w, int64_t N, int64_t K) {
    const std::string name = module + "." + q.scale_suffix;
    const SafetensorsModel::Entry& e = need(st, name, weight, w, q);
    need_dtype(e, {DType::F32, DType::BF16, DType::F16}, "an FP8 weight scale");
    const auto& sh = e.info->shape;
    ScaleGrid g{};
    switch (q.kind) {
        case HfQuantKind::Fp8Tensor:
            g = {N, K, 1, 1, {}};
            if (e.info->numel != 1) wrong_shape(e, "[] or [1]", "one scale for the tensor, " + q.description);
            break;
        case HfQuantKind::Fp8Channel:
            g = {1, K, N, 1, {}};
            if (!(sh == std::vector<int64_t>{N, 1} || sh == std::vector<int64_t>{N}))
                wrong_shape(e, fmt::format("[{}, 1]", N),
                            fmt::format("one scale per output row of '{}', {}", weight, q.description));
            break;
        default: {
            const int64_t gr = (N + q.block_n - 1) / q.block_n, gc = (K + q.block_k - 1) / q.block_k;
            g = {q.block_n, q.block_k, gr, gc, {}};
            if (!(sh == std::vector<int64_t>{gr, gc} || sh == std::vector<int64_t>{gr, 1, gc, 1}))
                wrong_shape(e, fmt::format("[{}, {}]", gr, gc),
                            fmt::format("one scale per {}x{} block of the [{}, {}] weight '{}', {} in {}", q.block_n,
                                        q.block_k, N, K, weight, q.description, q.file));
        }
    }
    g.s.resize(static_cast<size_t>(g.gr * g.gc));
    for (size_t i = 0; i < g.s.size(); ++i) {
        g.s[i] = scalar_at(e, i);
        if (!std::isfinite(g.s[i]))
            fail("tensor '{}' in {} holds a scale that is not finite ({} at index {}); the checkpoint is damaged", name,
                 e.file->path(), g.s[i], i);
    }
    return g;
}

[[noreturn]] void nan_code(const std::string& name, const std::string& file, int64_t r, int64_t c) {
    fail("tensor '{}' in {} holds an E4M3 NaN code at [{}, {}]; the checkpoint is damaged (re-export it)", name, file,
         r, c);
}

HfQuantWeight load_fp8(const SafetensorsModel& st, const HfQuantConfig& q, const std::string& weight,
                       const SafetensorsModel::Entry& w, int64_t N, int64_t K, const std::string& name) {
    if (w.info->shape != std::vector<int64_t>{N, K})
        wrong_shape(w, shape_str({N, K}), "the architecture's shape for this config");
    const std::string module = weight.substr(0, weight.size() - std::string(".weight").size());
    const ScaleGrid g = fp8_scales(st, q, module, weight, w, N, K);
    const uint8_t* codes = w.file->data(*w.info);
    for (int64_t r = 0; r < N; ++r)
        for (int64_t c = 0; c < K; ++c)
            if ((codes[r * K + c] & 0x7F) == 0x7F) nan_code(weight, w.file->path(), r, c);

    HfQuantWeight out;
    out.consumed = {weight, module + "." + q.scale_suffix};
    const bool blocks = K % QK_F8 == 0 && (g.bk % QK_F8 == 0 || g.bk >= K);
    const DType type = blocks ? DType::F8_E4M3_B32 : DType::F32;
    const size_t rb = row_size(type, K);
    auto buf = std::shared_ptr<uint8_t[]>(new uint8_t[rb * static_cast<size_t>(N)]);
    for (int64_t r = 0; r < N; ++r) {
        const uint8_t* in = codes + r * K;
        uint8_t* row = buf.get() + static_cast<size_t>(r) * rb;
        if (blocks) {
            for (int64_t b = 0; b < K / QK_F8; ++b) {
                block_f8_b32 blk;
                blk.d = g.at(r, b * QK_F8);
                std::memcpy(blk.qs, in + b * QK_F8, QK_F8);
                std::memcpy(row + b * sizeof(blk), &blk, sizeof(blk));
            }
        } else {
            for (int64_t c = 0; c < K; ++c) {
                const float v = kFp8E4M3Values[in[c]] * g.at(r, c);
                std::memcpy(row + 4 * c, &v, 4);
            }
        }
    }
    out.tensor = Tensor::contiguous(type, {K, N, 1, 1}, buf.get(), name);
    out.owner = std::shared_ptr<const void>(buf, buf.get());
    return out;
}

HfQuantWeight load_nvfp4(const SafetensorsModel& st, const HfQuantConfig& q, const std::string& weight,
                         const SafetensorsModel::Entry& w, int64_t N, int64_t K, const std::string& name) {
    if (K % NVFP4_GROUP != 0)
        fail("tensor '{}' in {}: NVFP4 needs rows of whole 16-element groups, the config gives {} columns", weight,
             w.file->path(), K);
    if (w.info->shape != std::vector<int64_t>{N, K / 2})
        wrong_shape(w, shape_str({N, K / 2}),
                    fmt::format("two E2M1 codes per byte of the [{}, {}] weight, {}", N, K, q.description));
    const std::string module = weight.substr(0, weight.size() - std::string(".weight").size());
    const SafetensorsModel::Entry& sc = need(st, module + ".weight_scale", weight, w, q);
    need_dtype(sc, {DType::F8_E4M3}, "an NVFP4 group scale");
    if (sc.info->shape != std::vector<int64_t>{N, K / NVFP4_GROUP})
        wrong_shape(sc, shape_str({N, K / NVFP4_GROUP}),
                    fmt::format("one E4M3 scale per 16 elements of the [{}, {}] weight '{}', {}", N, K, weight,
                                q.description));
    const SafetensorsModel::Entry& gs = need(st, module + "." + q.global_suffix, weight, w, q);
    need_dtype(gs, {DType::F32, DType::BF16, DType::F16}, "an NVFP4 global scale");
    if (gs.info->numel != 1) wrong_shape(gs, "[] or [1]", "one global scale for the tensor, " + q.description);
    const float stored = scalar_at(gs, 0);
    if (!std::isfinite(stored) || (q.global_divides && stored == 0.0f))
        fail("tensor '{}' in {} is {} ({}); the checkpoint is damaged", gs.info->name, gs.file->path(),
             q.global_divides ? "not finite or zero" : "not finite", stored);
    // quern's NVFP4 blocks multiply by their global scale: a divisor becomes its reciprocal.
    const float global = q.global_divides ? 1.0f / stored : stored;
    const uint8_t* codes = w.file->data(*w.info);
    const uint8_t* scales = sc.file->data(*sc.info);
    const int64_t G = K / NVFP4_GROUP;
    for (int64_t r = 0; r < N; ++r)
        for (int64_t j = 0; j < G; ++j)
            if ((scales[r * G + j] & 0x7F) == 0x7F) nan_code(sc.info->name, sc.file->path(), r, j);

    HfQuantWeight out;
    out.consumed = {w.info->name, sc.info->name, gs.info->name};
    const bool blocks = K % QK_NVFP4 == 0;
    const DType type = blocks ? DType::NVFP4 : DType::F32;
    const size_t rb = row_size(type, K);
    auto buf = std::shared_ptr<uint8_t[]>(new uint8_t[rb * static_cast<size_t>(N)]);
    for (int64_t r = 0; r < N; ++r) {
        const uint8_t* in = codes + r * (K / 2);
        const uint8_t* s = scales + r * G;
        uint8_t* row = buf.get() + static_cast<size_t>(r) * rb;
        if (blocks) {
            for (int64_t b = 0; b < K / QK_NVFP4; ++b) {
                block_nvfp4 blk;
                blk.d = global;
                std::memcpy(blk.sc, s + b * (QK_NVFP4 / NVFP4_GROUP), sizeof(blk.sc));
                std::memcpy(blk.qs, in + b * (QK_NVFP4 / 2), sizeof(blk.qs));
                std::memcpy(row + b * sizeof(blk), &blk, sizeof(blk));
            }
        } else {
            for (int64_t c = 0; c < K; ++c) {
                const float gscale = kFp8E4M3Values[s[c / NVFP4_GROUP]] * global;
                const uint8_t byte = in[c / 2];
                const float v = fp4_e2m1_to_float(c % 2 ? byte >> 4 : byte & 0xF) * gscale;
                std::memcpy(row + 4 * c, &v, 4);
            }
        }
    }
    out.tensor = Tensor::contiguous(type, {K, N, 1, 1}, buf.get(), name);
    out.owner = std::shared_ptr<const void>(buf, buf.get());
    return out;
}

}  // namespace

HfQuantConfig read_hf_quant_config(const std::string& config_text, const std::string& config_path,
                                   const std::string& dir) {
    json cfg;
    try {
        cfg = json::parse(config_text);
    } catch (const json::exception& e) {
        fail("{}: not valid JSON ({})", config_path, e.what());
    }
    HfQuantConfig c;
    if (cfg.is_object() && cfg.contains("quantization_config") && !cfg["quantization_config"].is_null()) {
        const json& q = cfg["quantization_config"];
        if (!q.is_object()) fail("{}: quantization_config must be an object, got {}", config_path, q.dump());
        c = parse_quantization_config(Obj{q, config_path, "quantization_config."});
        c.file = config_path;
        return c;
    }
    const fs::path hq = fs::path(dir) / "hf_quant_config.json";
    std::error_code ec;
    if (!fs::exists(hq, ec)) return c;
    std::ifstream f(hq, std::ios::binary);
    if (!f) fail("cannot read {}", hq.string());
    std::stringstream ss;
    ss << f.rdbuf();
    json j;
    try {
        j = json::parse(ss.str());
    } catch (const json::exception& e) {
        fail("{}: not valid JSON ({})", hq.string(), e.what());
    }
    if (!j.is_object()) fail("{}: must be a JSON object", hq.string());
    const Obj top{j, hq.string(), ""};
    const json* inner = top.object("quantization");
    if (!inner) fail("{}: key 'quantization' is missing", hq.string());
    c = parse_modelopt(top.sub(*inner, "quantization"));
    c.file = hq.string();
    return c;
}

bool hf_quant_unused_tensor(const std::string& name) {
    return ends_with(name, ".input_scale") || ends_with(name, ".activation_scale") || ends_with(name, ".k_scale") ||
           ends_with(name, ".v_scale") || ends_with(name, ".input_global_scale");
}

bool hf_is_quantized_weight(const HfQuantConfig& q, const SafetensorsModel::Entry& e, const std::string& config_path) {
    const DType t = e.info->type;
    if (t == DType::F32 || t == DType::F16 || t == DType::BF16) return false;
    if (t != DType::F8_E4M3 && t != DType::U8) return false;  // the caller refuses other dtypes
    if (q.kind == HfQuantKind::None)
        fail("tensor '{}' in {} has dtype {}, but {} has no quantization_config (nor is there an "
             "hf_quant_config.json): its scales cannot be known; use the checkpoint's original config files",
             e.info->name, e.file->path(), e.info->dtype, config_path);
    if (q.kind == HfQuantKind::Mxfp4)
        fail("tensor '{}' in {} has dtype {}; in an MXFP4 checkpoint only the expert banks' _blocks / _scales are "
             "quantized, and only for architectures that have them (gpt-oss)",
             e.info->name, e.file->path(), e.info->dtype);
    const bool fp4 = q.kind == HfQuantKind::Nvfp4;
    if ((t == DType::U8) != fp4)
        fail("tensor '{}' in {} has dtype {}, but the {} checkpoint ({}) stores its quantized weights as {}",
             e.info->name, e.file->path(), e.info->dtype, q.description, q.file, fp4 ? "U8" : "F8_E4M3");
    return true;
}

std::string hf_quant_stored_name(const HfQuantConfig& q, const SafetensorsModel& st, const std::string& hf_name) {
    if (q.packed_suffix.empty() || !ends_with(hf_name, ".weight") || st.find(hf_name)) return hf_name;
    const std::string packed = hf_name.substr(0, hf_name.size() - std::string("weight").size()) + q.packed_suffix;
    return st.find(packed) ? packed : hf_name;
}

HfQuantWeight hf_load_quantized_weight(const SafetensorsModel& st, const HfQuantConfig& q,
                                       const std::string& hf_name, int64_t N, int64_t K, const std::string& name) {
    const SafetensorsModel::Entry* w = st.find(hf_quant_stored_name(q, st, hf_name));
    if (!w) fail("internal: hf_load_quantized_weight: no tensor '{}'", hf_name);
    if (!ends_with(hf_name, ".weight"))
        fail("tensor '{}' in {} is stored quantized, which quern supports for the .weight of linear layers only",
             hf_name, w->file->path());
    if (q.kind == HfQuantKind::Nvfp4) return load_nvfp4(st, q, hf_name, *w, N, K, name);
    return load_fp8(st, q, hf_name, *w, N, K, name);
}

}  // namespace quern
