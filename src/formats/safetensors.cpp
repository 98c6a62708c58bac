// Safetensors reader (format and checks: safetensors.h).
//
// The header is parsed with nlohmann::json through a callback that rejects
// duplicate keys and excessive nesting while parsing (the DOM parser would keep
// the last duplicate silently). Every number from the file is range-checked
// before use and every size product is overflow-checked, so a malformed file
// fails with a quern::Error before any tensor data is touched.
#include "formats/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <unordered_set>

#include "core/error.h"

namespace quern {

static_assert(std::endian::native == std::endian::little, "quern reads safetensors on little-endian hosts only");

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

constexpr SafetensorsDType kDTypes[] = {
    {"F64", 8, DType::F64},         {"F32", 4, DType::F32},         {"F16", 2, DType::F16},
    {"BF16", 2, DType::BF16},       {"F8_E4M3", 1, DType::F8_E4M3}, {"F8_E5M2", 1, DType::F8_E5M2},
    {"I64", 8, DType::I64},         {"I32", 4, DType::I32},         {"I16", 2, DType::I16},
    {"I8", 1, DType::I8},           {"U8", 1, DType::U8},           {"BOOL", 1, DType::BOOL},
};
// Dtypes of the format that quern does not read (named as such in errors).
constexpr std::string_view kOtherFormatDTypes[] = {"U64", "U32", "U16", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64"};

// The deepest a value may nest: header {} -> tensor entry {} -> shape [] (a
// fourth level is allowed so that a wrong shape gets a precise type error).
constexpr int kMaxHeaderDepth = 3;
constexpr int kMaxIndexDepth = 16;
// Arrays in a header are shapes and offset pairs; no tensor has this many dimensions.
constexpr size_t kMaxHeaderArrayItems = 1024;

/// Parses JSON text, rejecting duplicate keys in any object, nesting deeper
/// than `max_depth` and arrays of more than `max_items` items (which bounds
/// the memory a header of numbers can take). `where` prefixes every error
/// ("safetensors: 'f': header").
Json parse_strict(std::string_view text, const std::string& where, int max_depth, size_t max_items) {
    std::vector<std::unordered_set<std::string>> keys;  // one set per open object
    std::vector<size_t> items;                          // per open container: items so far (SIZE_MAX: object)
    std::string top_key;                                // the current top-level key
    const auto count_item = [&] {
        if (!items.empty() && items.back() != SIZE_MAX && ++items.back() > max_items)
            fail("{}: an array{} has more than {} items", where,
                 top_key.empty() ? "" : fmt::format(" in '{}'", printable(top_key)), max_items);
    };
    const auto cb = [&](int depth, Json::parse_event_t ev, Json& parsed) {
        using E = Json::parse_event_t;
        switch (ev) {
            case E::object_start:
            case E::array_start:
                if (depth > max_depth)
                    fail("{}: JSON nested deeper than {} levels{}", where, max_depth + 1,
                         top_key.empty() ? "" : fmt::format(" (in '{}')", printable(top_key)));
                count_item();
                items.push_back(ev == E::object_start ? SIZE_MAX : 0);
                if (ev == E::object_start) keys.emplace_back();
                break;
            case E::value: count_item(); break;
            case E::array_end:
                if (!items.empty()) items.pop_back();
                break;
            case E::object_end:
                if (!items.empty()) items.pop_back();
                if (!keys.empty()) keys.pop_back();
                break;
            case E::key: {
                const auto& k = parsed.get_ref<const std::string&>();
                if (depth == 1) top_key = k;
                if (!keys.empty() && !keys.back().insert(k).second) {
                    if (depth == 1) fail("{}: key '{}' appears twice", where, printable(k));
                    fail("{}: key '{}' appears twice in the entry of '{}'", where, printable(k), printable(top_key));
                }
                break;
            }
            default: break;
        }
        return true;
    };
    // The parser takes a NUL byte for the end of the input and would accept
    // anything after one; no valid JSON text contains a raw NUL.
    if (const void* z = text.empty() ? nullptr : std::memchr(text.data(), 0, text.size()))
        fail("{}: invalid JSON: NUL byte at offset {} of the text (padding must be spaces)", where,
             static_cast<const char*>(z) - text.data());
    try {
        return Json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
    } catch (const Json::exception& e) {
        fail("{}: invalid JSON: {}", where, e.what());
    }
}

/// A JSON value's kind for messages: "a string", "an array", "a negative integer"...
std::string kind(const Json& v) {
    if (v.is_number_unsigned()) return "a non-negative integer";
    if (v.is_number_integer()) return fmt::format("the negative integer {}", v.get<int64_t>());
    if (v.is_number_float()) return fmt::format("the floating-point number {}", v.dump());
    if (v.is_string()) return "a string";
    if (v.is_array()) return "an array";
    if (v.is_object()) return "an object";
    if (v.is_boolean()) return "a boolean";
    return "null";
}

/// A non-negative integer no larger than `max`, or a quern::Error saying
/// `what` is something else.
uint64_t get_uint(const Json& v, const std::string& ctx, const std::string& what, uint64_t max) {
    if (!v.is_number_unsigned()) fail("{}: {} is {}, expected a non-negative integer", ctx, what, kind(v));
    const auto u = v.get<uint64_t>();
    if (u > max) fail("{}: {} = {} is larger than {}", ctx, what, u, max);
    return u;
}

std::string shape_string(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

}  // namespace

const SafetensorsDType* safetensors_dtype(std::string_view name) {
    for (const auto& d : kDTypes)
        if (d.name == name) return &d;
    return nullptr;
}

std::string safetensors_supported_dtypes() {
    std::string s;
    for (const auto& d : kDTypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
    return s;
}

std::array<int64_t, 4> SafetensorsTensorInfo::ne() const {
    if (shape.size() > 4)
        fail("safetensors: tensor '{}' has {} dimensions {}; quern's tensor views hold at most 4", printable(name),
             shape.size(), shape_string(shape));
    std::array<int64_t, 4> out{1, 1, 1, 1};
    for (size_t i = 0; i < shape.size(); ++i) out[i] = shape[shape.size() - 1 - i];
    return out;
}

// ---------------------------------------------------------------- one file

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(std::make_unique<MappedFile>(path)) {
    const std::string where = fmt::format("safetensors: '{}'", file_->path());
    const uint64_t size = file_->size();
    if (size < 8)
        fail("{}: the file is {} bytes long, too short for the 8-byte header size (truncated, or not a "
             "safetensors file)",
             where, size);
    std::memcpy(&header_size_, file_->data(), 8);
    const uint64_t n = header_size_;
    if (n > kSafetensorsMaxHeader)
        fail("{}: header size {} (bytes 0..7) exceeds the limit of {} bytes (corrupt, or not a safetensors file)",
             where, n, kSafetensorsMaxHeader);
    if (n > size - 8)
        fail("{}: header size {} (bytes 0..7) runs past the end of the file ({} bytes): the file is truncated", where,
             n, size);
    const uint64_t data_size = size - 8 - n;
    const std::string_view text(reinterpret_cast<const char*>(file_->data() + 8), static_cast<size_t>(n));
    const Json header = parse_strict(text, where + ": header", kMaxHeaderDepth, kMaxHeaderArrayItems);
    if (!header.is_object()) fail("{}: the header is {}, expected a JSON object", where, kind(header));

    // Entries: validated one by one, in header order.
    struct Range {
        uint64_t begin, end;
    };
    std::vector<Range> ranges;
    for (const auto& [name, entry] : header.items()) {
        if (name == "__metadata__") {
            if (entry.is_null()) continue;
            if (!entry.is_object())
                fail("{}: '__metadata__' is {}, expected an object of strings", where, kind(entry));
            for (const auto& [k, v] : entry.items()) {
                if (!v.is_string())
                    fail("{}: '__metadata__' key '{}' is {}, expected a string", where, printable(k), kind(v));
                metadata_.emplace_back(k, v.get<std::string>());
            }
            continue;
        }
        const std::string ctx = fmt::format("{}: tensor '{}'", where, printable(name));
        if (name.empty()) fail("{}: a tensor has an empty name", where);
        if (!entry.is_object()) fail("{}: the entry is {}, expected an object", ctx, kind(entry));
        for (const auto& [k, v] : entry.items())
            if (k != "dtype" && k != "shape" && k != "data_offsets")
                fail("{}: unexpected key '{}' (an entry has only dtype, shape and data_offsets)", ctx, printable(k));
        for (const char* k : {"dtype", "shape", "data_offsets"})
            if (!entry.contains(k)) fail("{}: missing '{}'", ctx, k);

        SafetensorsTensorInfo t;
        t.name = name;
        const Json& dt = entry["dtype"];
        if (!dt.is_string()) fail("{}: 'dtype' is {}, expected a string such as \"BF16\"", ctx, kind(dt));
        t.dtype = dt.get<std::string>();
        const SafetensorsDType* d = safetensors_dtype(t.dtype);
        if (!d) {
            const bool known = std::find(std::begin(kOtherFormatDTypes), std::end(kOtherFormatDTypes), t.dtype) !=
                               std::end(kOtherFormatDTypes);
            fail("{}: {} dtype '{}' (quern reads {})", ctx, known ? "unsupported" : "unknown", printable(t.dtype),
                 safetensors_supported_dtypes());
        }
        t.type = d->type;

        const Json& sh = entry["shape"];
        if (!sh.is_array()) fail("{}: 'shape' is {}, expected an array of non-negative integers", ctx, kind(sh));
        // Zero dimensions count as 1 in the overflow check so that every
        // partial product (and so every stride of a view) fits in 64 bits too.
        uint64_t bound = static_cast<uint64_t>(d->size);
        t.numel = 1;
        for (size_t i = 0; i < sh.size(); ++i) {
            const uint64_t dim = get_uint(sh[i], ctx, fmt::format("shape[{}]", i),
                                          static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
            t.shape.push_back(static_cast<int64_t>(dim));
            if (__builtin_mul_overflow(bound, std::max<uint64_t>(dim, 1), &bound) ||
                bound > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
                fail("{}: shape {} of {} has a byte size that does not fit in 63 bits", ctx, printable(sh.dump(), 200),
                     t.dtype);
            t.numel *= dim;  // <= bound, so no overflow
        }
        t.nbytes = t.numel * static_cast<uint64_t>(d->size);

        const Json& off = entry["data_offsets"];
        if (!off.is_array() || off.size() != 2)
            fail("{}: 'data_offsets' is {}{}, expected [begin, end]", ctx, kind(off),
                 off.is_array() ? fmt::format(" of {} items", off.size()) : "");
        const uint64_t begin = get_uint(off[0], ctx, "data_offsets[0]", std::numeric_limits<uint64_t>::max());
        const uint64_t end = get_uint(off[1], ctx, "data_offsets[1]", std::numeric_limits<uint64_t>::max());
        if (begin > end) fail("{}: data_offsets [{}, {}] end before they begin", ctx, begin, end);
        if (end - begin != t.nbytes)
            fail("{}: data_offsets [{}, {}] span {} bytes, but shape {} of {} takes {} bytes", ctx, begin, end,
                 end - begin, shape_string(t.shape), t.dtype, t.nbytes);
        if (end > data_size)
            fail("{}: data_offsets [{}, {}] run past the end of the data buffer, which holds {} bytes (file bytes "
                 "[{}, {})): the file is truncated",
                 ctx, begin, end, data_size, 8 + n, size);
        t.offset = 8 + n + begin;
        tensors_.push_back(std::move(t));
        ranges.push_back({begin, end});
    }

    // The ranges must tile the data buffer: no overlap, no hole, nothing after.
    std::vector<size_t> order(tensors_.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return std::pair(ranges[a].begin, ranges[a].end) < std::pair(ranges[b].begin, ranges[b].end);
    });
    uint64_t covered = 0;
    size_t last = SIZE_MAX;  // the tensor whose range ends at `covered`
    for (const size_t i : order) {
        const Range& r = ranges[i];
        if (r.begin < covered)
            fail("{}: tensor '{}': data_offsets [{}, {}] overlap those of tensor '{}' [{}, {}]", where,
                 printable(tensors_[i].name), r.begin, r.end, printable(tensors_[last].name), ranges[last].begin,
                 ranges[last].end);
        if (r.begin > covered)
            fail("{}: tensor '{}': data_offsets [{}, {}] leave bytes [{}, {}) of the data buffer unused (a hole; "
                 "the format requires the tensors to cover the buffer exactly)",
                 where, printable(tensors_[i].name), r.begin, r.end, covered, r.begin);
        covered = r.end;
        last = i;
    }
    if (covered != data_size)
        fail("{}: the tensors cover {} bytes of the {}-byte data buffer; the {} bytes after them belong to no "
             "tensor",
             where, covered, data_size, data_size - covered);

    std::vector<SafetensorsTensorInfo> sorted;
    sorted.reserve(tensors_.size());
    for (const size_t i : order) sorted.push_back(std::move(tensors_[i]));
    tensors_ = std::move(sorted);
    index_.reserve(tensors_.size());
    for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
}

std::optional<std::string> SafetensorsFile::metadata_value(std::string_view key) const {
    for (const auto& [k, v] : metadata_)
        if (k == key) return v;
    return std::nullopt;
}

const SafetensorsTensorInfo* SafetensorsFile::find_tensor(std::string_view name) const {
    const auto it = index_.find(std::string(name));
    return it == index_.end() ? nullptr : &tensors_[it->second];
}

Tensor SafetensorsFile::tensor_view(const SafetensorsTensorInfo& t) const {
    return Tensor::contiguous(t.type, t.ne(), const_cast<uint8_t*>(data(t)), t.name);
}

// ---------------------------------------------------------------- checkpoints

void SafetensorsModel::add_file_tensors(const SafetensorsFile& f) {
    for (const auto& t : f.tensors()) {
        index_.emplace(t.name, tensors_.size());
        tensors_.push_back(Entry{&f, &t});
    }
}

SafetensorsModel SafetensorsModel::open_file(const std::string& path) {
    SafetensorsModel m;
    m.files_.push_back(std::make_unique<SafetensorsFile>(path));
    m.add_file_tensors(*m.files_.back());
    return m;
}

SafetensorsModel SafetensorsModel::open_index(const std::string& index_path) {
    const std::string where = fmt::format("safetensors index '{}'", index_path);
    Json index;
    {
        const MappedFile f(index_path);
        if (f.size() > kSafetensorsMaxHeader)
            fail("{}: the file is {} bytes, over the limit of {}", where, f.size(), kSafetensorsMaxHeader);
        index = parse_strict(std::string_view(reinterpret_cast<const char*>(f.data()), f.size()), where,
                             kMaxIndexDepth, SIZE_MAX);
    }
    if (!index.is_object()) fail("{}: the index is {}, expected a JSON object", where, kind(index));
    if (!index.contains("weight_map")) fail("{}: missing 'weight_map'", where);
    const Json& wm = index["weight_map"];
    if (!wm.is_object())
        fail("{}: 'weight_map' is {}, expected an object (tensor name -> shard file)", where, kind(wm));
    if (wm.empty()) fail("{}: 'weight_map' lists no tensors", where);

    SafetensorsModel m;
    m.index_path_ = index_path;
    if (index.contains("metadata")) {
        const Json& md = index["metadata"];
        if (!md.is_object() && !md.is_null()) fail("{}: 'metadata' is {}, expected an object", where, kind(md));
        if (md.is_object()) m.index_metadata_ = md.dump();
    }

    // shard file -> the tensors the index puts there, in index order.
    std::map<std::string, std::vector<std::string>> shards;
    for (const auto& [name, shard] : wm.items()) {
        const std::string ctx = fmt::format("{}: tensor '{}'", where, printable(name));
        if (name.empty()) fail("{}: 'weight_map' has an empty tensor name", where);
        if (!shard.is_string()) fail("{}: the shard is {}, expected a file name", ctx, kind(shard));
        const auto& file = shard.get_ref<const std::string&>();
        const fs::path p(file);
        const bool dotdot = std::any_of(p.begin(), p.end(), [](const fs::path& c) { return c == ".."; });
        if (file.empty() || p.is_absolute() || dotdot || file.find('\0') != std::string::npos)
            fail("{}: shard '{}' must be a file name relative to the index's folder, without '..'", ctx,
                 printable(file));
        shards[file].push_back(name);
    }

    const fs::path dir = fs::path(index_path).parent_path();
    for (const auto& [file, names] : shards) {  // all present before any is read
        std::error_code ec;
        if (!fs::exists(dir / file, ec))
            fail("{}: shard '{}' does not exist (expected at '{}'; the index maps {} tensor{} to it, e.g. '{}')", where,
                 printable(file), (dir / file).string(), names.size(), names.size() == 1 ? "" : "s",
                 printable(names.front()));
    }
    for (const auto& [file, names] : shards) {
        m.files_.push_back(std::make_unique<SafetensorsFile>((dir / file).string()));
        const SafetensorsFile& f = *m.files_.back();
        for (const auto& name : names)
            if (!f.find_tensor(name))
                fail("{}: tensor '{}' is mapped to shard '{}', which does not hold it", where, printable(name),
                     f.path());
        if (f.tensors().size() != names.size())
            for (const auto& t : f.tensors()) {
                const auto it = wm.find(t.name);
                if (it == wm.end() || it->get_ref<const std::string&>() != file)
                    fail("{}: shard '{}' holds tensor '{}', which the index {}", where, f.path(), printable(t.name),
                         it == wm.end() ? "does not list"
                                        : fmt::format("maps to shard '{}'", printable(it->get<std::string>())));
            }
        m.add_file_tensors(f);
    }
    return m;
}

SafetensorsModel SafetensorsModel::open(const std::string& path) {
    std::error_code ec;
    const fs::path p(path);
    if (!fs::exists(p, ec)) fail("safetensors: '{}' does not exist", path);
    if (!fs::is_directory(p, ec)) {
        const std::string name = p.filename().string();
        if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".json") == 0) return open_index(path);
        return open_file(path);
    }
    if (fs::exists(p / "model.safetensors.index.json", ec))
        return open_index((p / "model.safetensors.index.json").string());
    if (fs::exists(p / "model.safetensors", ec)) return open_file((p / "model.safetensors").string());
    std::vector<std::string> indexes, files;
    for (const auto& e : fs::directory_iterator(p, ec)) {
        const std::string n = e.path().filename().string();
        const auto ends = [&](std::string_view suf) {
            return n.size() >= suf.size() && n.compare(n.size() - suf.size(), suf.size(), suf) == 0;
        };
        if (ends(".safetensors.index.json")) indexes.push_back(n);
        else if (ends(".safetensors")) files.push_back(n);
    }
    if (ec) fail("safetensors: cannot list the folder '{}': {}", path, ec.message());
    std::sort(indexes.begin(), indexes.end());
    std::sort(files.begin(), files.end());
    if (indexes.size() == 1) return open_index((p / indexes[0]).string());
    if (indexes.empty() && files.size() == 1) return open_file((p / files[0]).string());
    std::string found;
    for (const auto& n : indexes.empty() ? files : indexes) found += (found.empty() ? "" : ", ") + n;
    if (found.empty())
        fail("safetensors: the folder '{}' holds no model.safetensors, model.safetensors.index.json or other "
             ".safetensors file",
             path);
    fail("safetensors: the folder '{}' holds no model.safetensors or model.safetensors.index.json, and several "
         "candidates ({}); pass the one to load",
         path, found);
}

const SafetensorsModel::Entry* SafetensorsModel::find(std::string_view name) const {
    const auto it = index_.find(std::string(name));
    return it == index_.end() ? nullptr : &tensors_[it->second];
}

Tensor SafetensorsModel::view(std::string_view name) const {
    const Entry* e = find(name);
    if (!e)
        fail("safetensors: tensor '{}' is not in '{}'", printable(name),
             index_path_.empty() ? files_.front()->path() : index_path_);
    return e->file->tensor_view(*e->info);
}

uint64_t SafetensorsModel::total_bytes() const {
    uint64_t n = 0;
    for (const auto& e : tensors_) n += e.info->nbytes;
    return n;
}

bool looks_like_safetensors(const std::string& path) {
    std::error_code ec;
    const fs::path p(path);
    if (fs::is_directory(p, ec)) return true;
    const std::string name = p.filename().string();
    for (std::string_view suf : {".safetensors", ".json"})
        if (name.size() >= suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0) return true;
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return false;
    unsigned char b[9] = {};
    const size_t got = std::fread(b, 1, sizeof b, f);
    std::fclose(f);
    if (got < 9 || std::memcmp(b, "GGUF", 4) == 0) return false;
    uint64_t n = 0;
    std::memcpy(&n, b, 8);
    const auto size = fs::file_size(p, ec);
    return !ec && n <= kSafetensorsMaxHeader && n <= size - 8 && b[8] == '{';
}

}  // namespace quern
