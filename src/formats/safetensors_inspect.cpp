#include "formats/safetensors_inspect.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "formats/gguf_inspect.h"  // human_count, human_bytes

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

Totals totals(const SafetensorsModel& m) {
    Totals tot;
    for (const auto& e : m.tensors()) {
        const auto& t = *e.info;
        tot.parameters += t.numel;
        tot.bytes += t.nbytes;
        auto& pt = tot.by_type[t.dtype];
        ++pt.tensors;
        pt.parameters += t.numel;
        pt.bytes += t.nbytes;
    }
    return tot;
}

double bits_per_weight(uint64_t bytes, uint64_t params) {
    return params ? static_cast<double>(bytes) * 8.0 / static_cast<double>(params) : 0.0;
}

std::string shape_string(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

std::string file_name(const SafetensorsFile& f) { return std::filesystem::path(f.path()).filename().string(); }

size_t file_index(const SafetensorsModel& m, const SafetensorsFile* f) {
    for (size_t i = 0; i < m.files().size(); ++i)
        if (m.files()[i].get() == f) return i;
    return 0;
}

bool same_metadata_everywhere(const SafetensorsModel& m) {
    for (const auto& f : m.files())
        if (f->metadata() != m.files().front()->metadata()) return false;
    return true;
}

void metadata_text(std::string& out, const std::vector<std::pair<std::string, std::string>>& md) {
    size_t wk = 3;
    for (const auto& kv : md) wk = std::max(wk, kv.first.size());
    wk = std::min<size_t>(wk, 48);
    for (const auto& [k, v] : md) {
        // Quoted and escaped as JSON; invalid UTF-8 cannot occur (the parser rejects it).
        out += fmt::format("  {:<{}}  {}\n", k, wk, nlohmann::json(v).dump());
    }
}

}  // namespace

nlohmann::json safetensors_inspect_json(const SafetensorsModel& m) {
    using nlohmann::json;
    json j;
    j["format"] = "safetensors";
    j["index"] = m.index_path().empty() ? json(nullptr) : json(m.index_path());
    j["index_metadata"] = json::parse(m.index_metadata_json());
    json files = json::array();
    for (const auto& f : m.files()) {
        json md = json::object();
        for (const auto& [k, v] : f->metadata()) md[k] = v;
        files.push_back({{"path", f->path()},
                         {"size", f->file_size()},
                         {"header_size", f->header_size()},
                         {"data_offset", f->data_offset()},
                         {"tensors", f->tensors().size()},
                         {"metadata", md}});
    }
    j["files"] = std::move(files);
    j["shape_order"] = "outermost first (as stored)";
    json ts = json::array();
    for (const auto& e : m.tensors()) {
        const auto& t = *e.info;
        json row = {{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}};
        if (t.shape.size() <= 4) {
            const auto ne = t.ne();
            row["ne"] = std::vector<int64_t>(ne.begin(), ne.begin() + static_cast<std::ptrdiff_t>(t.shape.size()));
        }
        row["elements"] = t.numel;
        row["bytes"] = t.nbytes;
        row["file"] = file_index(m, e.file);
        row["offset"] = t.offset;
        ts.push_back(std::move(row));
    }
    j["tensors"] = std::move(ts);
    const Totals tot = totals(m);
    json by = json::object();
    for (const auto& [name, pt] : tot.by_type)
        by[name] = {{"tensors", pt.tensors}, {"parameters", pt.parameters}, {"bytes", pt.bytes}};
    j["totals"] = {{"tensors", m.tensors().size()},
                   {"parameters", tot.parameters},
                   {"bytes", tot.bytes},
                   {"bits_per_weight", bits_per_weight(tot.bytes, tot.parameters)},
                   {"by_type", by}};
    return j;
}

std::string safetensors_inspect_text(const SafetensorsModel& m) {
    std::string out;
    const bool sharded = !m.index_path().empty();
    if (sharded) {
        out += fmt::format("index:     {}\n", m.index_path());
        out += fmt::format("format:    safetensors, {} shard{}\n", m.files().size(), m.files().size() == 1 ? "" : "s");
        out += fmt::format("index metadata: {}\n", m.index_metadata_json());
        out += "\nfiles:\n";
        for (const auto& f : m.files())
            out += fmt::format("  {}  {} bytes ({}), header {} bytes, {} tensors\n", file_name(*f), f->file_size(),
                               human_bytes(f->file_size()), f->header_size(), f->tensors().size());
    } else {
        const auto& f = *m.files().front();
        out += fmt::format("file:      {} ({} bytes, {})\n", f.path(), f.file_size(), human_bytes(f.file_size()));
        out += fmt::format("format:    safetensors, header {} bytes, tensor data at byte {}\n", f.header_size(),
                           f.data_offset());
    }

    if (same_metadata_everywhere(m)) {
        const auto& md = m.files().front()->metadata();
        out += fmt::format("\nmetadata ({} key{}{}):\n", md.size(), md.size() == 1 ? "" : "s",
                           m.files().size() > 1 ? ", the same in every shard" : "");
        metadata_text(out, md);
    } else {
        for (const auto& f : m.files()) {
            out += fmt::format("\nmetadata of {} ({} keys):\n", file_name(*f), f->metadata().size());
            metadata_text(out, f->metadata());
        }
    }

    out += fmt::format("\ntensors ({}; shape as stored, outermost first):\n", m.tensors().size());
    size_t wn = 4, ws = 5, wy = 5, wb = 5, wf = 4;
    for (const auto& e : m.tensors()) {
        wn = std::max(wn, e.info->name.size());
        ws = std::max(ws, shape_string(e.info->shape).size());
        wy = std::max(wy, e.info->dtype.size());
        wb = std::max(wb, std::to_string(e.info->nbytes).size());
        wf = std::max(wf, file_name(*e.file).size());
    }
    wn = std::min<size_t>(wn, 64);
    const auto row = [&](std::string_view name, std::string_view dtype, std::string_view shape, std::string_view bytes,
                         std::string_view file, std::string_view offset) {
        std::string r = fmt::format("  {:<{}}  {:<{}}  {:<{}}  {:>{}}  ", name, wn, dtype, wy, shape, ws, bytes, wb);
        if (sharded) r += fmt::format("{:<{}}  ", file, wf);
        return r + std::string(offset) + "\n";
    };
    out += row("name", "dtype", "shape", "bytes", "file", "offset");
    for (const auto& e : m.tensors()) {
        const auto& t = *e.info;
        out += row(t.name, t.dtype, shape_string(t.shape), std::to_string(t.nbytes), file_name(*e.file),
                   std::to_string(t.offset));
    }

    const Totals tot = totals(m);
    out += fmt::format("\ntotals:    {} tensors, {} parameters ({}), {} bytes ({}), {:.2f} bits per weight\n",
                       m.tensors().size(), tot.parameters, human_count(tot.parameters), tot.bytes,
                       human_bytes(tot.bytes), bits_per_weight(tot.bytes, tot.parameters));
    for (const auto& [name, pt] : tot.by_type)
        out += fmt::format("  {:<7} {:>5} tensors  {:>14} parameters  {:>14} bytes  {:.2f} bits per weight\n", name,
                           pt.tensors, pt.parameters, pt.bytes, bits_per_weight(pt.bytes, pt.parameters));
    return out;
}

}  // namespace quern
