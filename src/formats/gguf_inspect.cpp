#include "formats/gguf_inspect.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace quern {

namespace {

struct Totals {
    uint64_t parameters = 0;
    uint64_t bytes = 0;
    struct PerType {
        uint64_t tensors = 0, parameters = 0, bytes = 0;
    };
    std::map<std::string, PerType> by_type;
};

uint64_t n_elements(const GgufTensorInfo& t) {
    return static_cast<uint64_t>(t.ne[0]) * static_cast<uint64_t>(t.ne[1]) * static_cast<uint64_t>(t.ne[2]) *
           static_cast<uint64_t>(t.ne[3]);  // the reader checked that this fits
}

Totals totals(const GgufFile& f) {
    Totals tot;
    for (const auto& t : f.tensors()) {
        const uint64_t n = n_elements(t);
        tot.parameters += n;
        tot.bytes += t.nbytes;
        auto& pt = tot.by_type[std::string(dtype_name(t.type))];
        ++pt.tensors;
        pt.parameters += n;
        pt.bytes += t.nbytes;
    }
    return tot;
}

double bits_per_weight(uint64_t bytes, uint64_t params) {
    return params ? static_cast<double>(bytes) * 8.0 / static_cast<double>(params) : 0.0;
}

std::string shape_string(const GgufTensorInfo& t) {
    std::string s = "[";
    for (int d = 0; d < t.n_dims; ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
    return s + "]";
}

}  // namespace

std::string human_count(uint64_t n) {
    if (n >= 1000000000ull) return fmt::format("{:.2f}B", static_cast<double>(n) / 1e9);
    if (n >= 1000000ull) return fmt::format("{:.1f}M", static_cast<double>(n) / 1e6);
    if (n >= 1000ull) return fmt::format("{:.1f}K", static_cast<double>(n) / 1e3);
    return std::to_string(n);
}

std::string human_bytes(uint64_t n) {
    const double d = static_cast<double>(n);
    if (n >= (1ull << 30)) return fmt::format("{:.2f} GiB", d / (1ull << 30));
    if (n >= (1ull << 20)) return fmt::format("{:.1f} MiB", d / (1ull << 20));
    if (n >= (1ull << 10)) return fmt::format("{:.1f} KiB", d / (1ull << 10));
    return fmt::format("{} B", n);
}

nlohmann::json gguf_value_to_json(const GgufValue& v, size_t max_items, bool* truncated) {
    struct Visitor {
        size_t max_items;
        bool* truncated;
        nlohmann::json operator()(uint64_t x) const { return x; }
        nlohmann::json operator()(int64_t x) const { return x; }
        nlohmann::json operator()(double x) const { return x; }
        nlohmann::json operator()(bool b) const { return b; }
        nlohmann::json operator()(const std::string& s) const { return s; }
        nlohmann::json operator()(const GgufArray& a) const {
            nlohmann::json out = nlohmann::json::array();
            const size_t n = std::min(a.items.size(), max_items);
            if (n < a.items.size() && truncated) *truncated = true;
            for (size_t i = 0; i < n; ++i) out.push_back(gguf_value_to_json(a.items[i], max_items, truncated));
            return out;
        }
    };
    return std::visit(Visitor{max_items, truncated}, v.v);
}

nlohmann::json gguf_inspect_json(const GgufFile& f, size_t max_items) {
    using nlohmann::json;
    json j;
    j["file"] = {{"path", f.path()},
                 {"size", f.file_size()},
                 {"version", f.version()},
                 {"alignment", f.alignment()},
                 {"data_offset", f.data_offset()}};
    json md = json::array();
    for (const auto& kv : f.metadata()) {
        bool cut = false;
        json e = {{"key", kv.key}, {"type", gguf_value_type_string(kv.value)}};
        e["value"] = gguf_value_to_json(kv.value, max_items, &cut);
        if (const auto* a = std::get_if<GgufArray>(&kv.value.v)) e["count"] = a->items.size();
        if (cut) e["truncated"] = true;
        md.push_back(std::move(e));
    }
    j["metadata"] = std::move(md);
    json ts = json::array();
    for (const auto& t : f.tensors()) {
        json shape = json::array();
        for (int d = 0; d < t.n_dims; ++d) shape.push_back(t.ne[d]);
        ts.push_back({{"name", t.name},
                      {"type", dtype_name(t.type)},
                      {"shape", shape},
                      {"elements", n_elements(t)},
                      {"bytes", t.nbytes},
                      {"offset", t.offset}});
    }
    j["tensors"] = std::move(ts);
    const Totals tot = totals(f);
    json by = json::object();
    for (const auto& [name, pt] : tot.by_type)
        by[name] = {{"tensors", pt.tensors}, {"parameters", pt.parameters}, {"bytes", pt.bytes}};
    j["totals"] = {{"tensors", f.tensors().size()},
                   {"parameters", tot.parameters},
                   {"bytes", tot.bytes},
                   {"bits_per_weight", bits_per_weight(tot.bytes, tot.parameters)},
                   {"by_type", by}};
    return j;
}

std::string gguf_inspect_text(const GgufFile& f, size_t max_items) {
    std::string out;
    out += fmt::format("file:      {} ({} bytes, {})\n", f.path(), f.file_size(), human_bytes(f.file_size()));
    out += fmt::format("format:    GGUF version {}, alignment {}, tensor data at byte {}\n", f.version(),
                       f.alignment(), f.data_offset());

    out += fmt::format("\nmetadata ({} keys):\n", f.metadata().size());
    size_t wk = 3, wt = 4;
    std::vector<std::string> types;
    for (const auto& kv : f.metadata()) {
        types.push_back(gguf_value_type_string(kv.value));
        wk = std::max(wk, kv.key.size());
        wt = std::max(wt, types.back().size());
    }
    wk = std::min<size_t>(wk, 48);
    wt = std::min<size_t>(wt, 24);
    out += fmt::format("  {:<{}}  {:<{}}  {}\n", "key", wk, "type", wt, "value");
    for (size_t i = 0; i < f.metadata().size(); ++i) {
        const auto& kv = f.metadata()[i];
        out += fmt::format("  {:<{}}  {:<{}}  {}\n", kv.key, wk, types[i], wt, kv.value.to_string(max_items));
    }

    out += fmt::format("\ntensors ({}):\n", f.tensors().size());
    size_t wn = 4, ws = 5, wy = 4, wb = 5;
    for (const auto& t : f.tensors()) {
        wn = std::max(wn, t.name.size());
        ws = std::max(ws, shape_string(t).size());
        wy = std::max(wy, dtype_name(t.type).size());
        wb = std::max(wb, std::to_string(t.nbytes).size());
    }
    wn = std::min<size_t>(wn, 64);
    out += fmt::format("  {:<{}}  {:<{}}  {:<{}}  {:>{}}  {}\n", "name", wn, "type", wy, "shape", ws, "bytes", wb,
                       "offset");
    for (const auto& t : f.tensors())
        out += fmt::format("  {:<{}}  {:<{}}  {:<{}}  {:>{}}  {}\n", t.name, wn, dtype_name(t.type), wy,
                           shape_string(t), ws, t.nbytes, wb, t.offset);

    const Totals tot = totals(f);
    out += fmt::format("\ntotals:    {} tensors, {} parameters ({}), {} bytes ({}), {:.2f} bits per weight\n",
                       f.tensors().size(), tot.parameters, human_count(tot.parameters), tot.bytes,
                       human_bytes(tot.bytes), bits_per_weight(tot.bytes, tot.parameters));
    for (const auto& [name, pt] : tot.by_type)
        out += fmt::format("  {:<6} {:>5} tensors  {:>14} parameters  {:>14} bytes  {:.2f} bits per weight\n", name,
                           pt.tensors, pt.parameters, pt.bytes, bits_per_weight(pt.bytes, pt.parameters));
    return out;
}

}  // namespace quern
