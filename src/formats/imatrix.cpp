#include "formats/imatrix.h"

#include <cmath>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "formats/gguf.h"

namespace quern {

std::vector<float> Imatrix::importance(const std::string& name) const {
    const auto it = entries.find(name);
    if (it == entries.end()) return {};
    const ImatrixEntry& e = it->second;
    const int64_t n = e.n_in();
    std::vector<float> out(e.sums.size());
    for (size_t m = 0; m < e.counts.size(); ++m) {
        const float count = e.counts[m];
        for (int64_t j = 0; j < n; ++j) {
            const size_t i = m * static_cast<size_t>(n) + static_cast<size_t>(j);
            out[i] = count > 0.0f ? e.sums[i] / count : 1.0f;
        }
    }
    return out;
}

namespace {

/// "blk.3.ffn_up_exps.weight" -> the names of its experts as tensors of
/// their own, "blk.3.ffn_up.E.weight"; empty for another name.
std::vector<std::string> expert_names(const std::string& name, int64_t n_expert) {
    const std::string suffix = "_exps.weight";
    if (n_expert < 2 || name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
        return {};
    const std::string base = name.substr(0, name.size() - suffix.size());
    std::vector<std::string> out;
    for (int64_t e = 0; e < n_expert; ++e) out.push_back(base + "." + std::to_string(e) + ".weight");
    return out;
}

}  // namespace

size_t Imatrix::importance_size(const std::string& name, int64_t n_expert) const {
    if (const auto it = entries.find(name); it != entries.end()) return it->second.sums.size();
    size_t n = 0;
    const std::vector<std::string> parts = expert_names(name, n_expert);
    for (const std::string& p : parts) {
        const auto it = entries.find(p);
        if (it == entries.end() || it->second.counts.size() != 1) return 0;
        n += it->second.sums.size();
    }
    return n;
}

std::vector<float> Imatrix::importance(const std::string& name, int64_t n_expert) const {
    if (entries.count(name) || importance_size(name, n_expert) == 0) return importance(name);
    std::vector<float> out;
    for (const std::string& p : expert_names(name, n_expert)) {
        const std::vector<float> part = importance(p);
        out.insert(out.end(), part.begin(), part.end());
    }
    return out;
}

namespace {

Imatrix read_gguf(const std::string& path) {
    GgufFile f(path);
    Imatrix m;
    if (const GgufValue* d = f.find("imatrix.datasets"); d && d->type == GgufType::ARRAY)
        m.datasets = f.get_string_array("imatrix.datasets");
    m.chunk_count = f.get_int("imatrix.chunk_count", 0);
    m.chunk_size = f.get_int("imatrix.chunk_size", 0);
    std::map<std::string, std::pair<const GgufTensorInfo*, const GgufTensorInfo*>> pairs;
    const auto strip = [](const std::string& s, const std::string& suffix, std::string& base) {
        if (s.size() <= suffix.size() || s.compare(s.size() - suffix.size(), suffix.size(), suffix) != 0) return false;
        base = s.substr(0, s.size() - suffix.size());
        return true;
    };
    for (const GgufTensorInfo& t : f.tensors()) {
        std::string base;
        if (strip(t.name, ".in_sum2", base)) pairs[base].first = &t;
        else if (strip(t.name, ".counts", base)) pairs[base].second = &t;
    }
    if (pairs.empty()) fail("'{}' has no importance data (no NAME.in_sum2 / NAME.counts tensors): not an imatrix", path);
    for (const auto& [name, p] : pairs) {
        const auto [sums, counts] = p;
        if (!sums || !counts) fail("'{}': '{}' has {} but no {}", path, name, sums ? "sums" : "counts", sums ? "counts" : "sums");
        if (sums->type != DType::F32 || counts->type != DType::F32)
            fail("'{}': the sums and counts of '{}' must be F32", path, name);
        const int64_t n_sums = sums->ne[0] * sums->ne[1] * sums->ne[2] * sums->ne[3];
        const int64_t n_counts = counts->ne[0] * counts->ne[1] * counts->ne[2] * counts->ne[3];
        if (n_counts < 1 || n_sums % n_counts != 0)
            fail("'{}': '{}' has {} sums for {} matrices", path, name, n_sums, n_counts);
        ImatrixEntry e;
        e.sums.resize(static_cast<size_t>(n_sums));
        std::memcpy(e.sums.data(), f.data(*sums), e.sums.size() * sizeof(float));
        e.counts.resize(static_cast<size_t>(n_counts));
        std::memcpy(e.counts.data(), f.data(*counts), e.counts.size() * sizeof(float));
        for (float& c : e.counts) c = static_cast<float>(std::lround(c));  // whole tokens, as llama.cpp reads them
        m.entries.emplace(name, std::move(e));
    }
    return m;
}

Imatrix read_dat(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot open '{}'", path);
    in.seekg(0, std::ios::end);
    const int64_t size = static_cast<int64_t>(in.tellg());
    in.seekg(0);
    const auto i32 = [&](const char* what) {
        int32_t v = 0;
        if (!in.read(reinterpret_cast<char*>(&v), sizeof v)) fail("'{}': truncated ({})", path, what);
        return v;
    };
    const int32_t n_entries = i32("the entry count");
    if (n_entries < 1 || n_entries > size / 16)
        fail("'{}' is neither a GGUF nor a .dat importance matrix (entry count {})", path, n_entries);
    Imatrix m;
    for (int32_t i = 0; i < n_entries; ++i) {
        const int32_t len = i32("a name length");
        if (len < 1 || len > 4096) fail("'{}': entry {} has a name of {} bytes", path, i, len);
        std::string name(static_cast<size_t>(len), '\0');
        if (!in.read(name.data(), len)) fail("'{}': truncated (the name of entry {})", path, i);
        const int32_t ncall = i32("a call count");
        const int32_t nval = i32("a value count");
        if (nval < 1 || static_cast<int64_t>(nval) * 4 > size) fail("'{}': entry '{}' has {} values", path, name, nval);
        ImatrixEntry e;
        e.sums.resize(static_cast<size_t>(nval));
        if (!in.read(reinterpret_cast<char*>(e.sums.data()), static_cast<std::streamsize>(nval) * 4))
            fail("'{}': truncated (the values of '{}')", path, name);
        // The values are mean squares times ncall: ncall as the count gives
        // them back (a count of 0 would mean "no data": keep them as they are).
        e.counts = {ncall > 0 ? static_cast<float>(ncall) : 1.0f};
        m.entries[name] = std::move(e);
    }
    int32_t chunks = 0;
    if (in.read(reinterpret_cast<char*>(&chunks), sizeof chunks)) {
        m.chunk_count = chunks;
        int32_t len = 0;
        if (in.read(reinterpret_cast<char*>(&len), sizeof len) && len > 0 && len <= 65536) {
            std::string dataset(static_cast<size_t>(len), '\0');
            if (in.read(dataset.data(), len)) m.datasets.push_back(dataset.c_str());
        }
    }
    return m;
}

}  // namespace

void Imatrix::accumulate(const std::string& name, int64_t n_mat, int64_t mat, const float* x, int64_t rows,
                         int64_t n_in) {
    ImatrixEntry& e = entries[name];
    if (e.counts.empty()) {
        e.sums.assign(static_cast<size_t>(n_mat * n_in), 0.0f);
        e.counts.assign(static_cast<size_t>(n_mat), 0.0f);
    }
    if (static_cast<int64_t>(e.counts.size()) != n_mat || e.n_in() != n_in || mat < 0 || mat >= n_mat)
        fail("importance matrix: '{}' seen as {} × {} and now as {} × {} (matrix {})", name, e.counts.size(), e.n_in(),
             n_mat, n_in, mat);
    // This call's rows are summed in double, then added to the float totals.
    std::vector<double> s(static_cast<size_t>(n_in), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * n_in;
        for (int64_t j = 0; j < n_in; ++j) s[static_cast<size_t>(j)] += static_cast<double>(xr[j]) * xr[j];
    }
    float* acc = e.sums.data() + mat * n_in;
    for (int64_t j = 0; j < n_in; ++j) acc[j] += static_cast<float>(s[static_cast<size_t>(j)]);
    e.counts[static_cast<size_t>(mat)] += static_cast<float>(rows);
}

Imatrix read_imatrix(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot open importance matrix '{}'", path);
    char magic[4] = {};
    in.read(magic, 4);
    return std::memcmp(magic, "GGUF", 4) == 0 ? read_gguf(path) : read_dat(path);
}

void write_imatrix(const std::string& path, const Imatrix& m) {
    GgufWriter w;
    w.set_string("general.type", "imatrix");
    w.set_string_array("imatrix.datasets", m.datasets);
    w.set_u32("imatrix.chunk_count", static_cast<uint32_t>(m.chunk_count));
    w.set_u32("imatrix.chunk_size", static_cast<uint32_t>(m.chunk_size));
    for (const auto& [name, e] : m.entries) {
        const int64_t n_mat = static_cast<int64_t>(e.counts.size());
        const int n_dims = n_mat > 1 ? 2 : 1;  // trailing dimensions of 1 are not written, as ggml does
        w.add_tensor(name + ".in_sum2", DType::F32, {e.n_in(), n_mat, 1, 1}, n_dims, e.sums.data());
        w.add_tensor(name + ".counts", DType::F32, {1, n_mat, 1, 1}, n_dims, e.counts.data());
    }
    w.write(path);
}

}  // namespace quern
