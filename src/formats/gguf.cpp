// GGUF reader and metadata values. The writer is in gguf_writer.cpp.
//
// Parsing discipline: every read goes through Parser::get/get_string, which
// check the bytes left before touching memory; every count read from the file
// is checked against the bytes left (times the smallest possible encoding of
// one element) before anything is reserved, so a malformed file can make us
// allocate at most a small multiple of its own size.
#include "formats/gguf.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>

#include <fmt/ranges.h>

#include "core/error.h"

namespace quern {

static_assert(std::endian::native == std::endian::little, "quern reads GGUF on little-endian hosts only");

namespace {

constexpr uint32_t kMaxKnownType = static_cast<uint32_t>(GgufType::FLOAT64);
// Smallest encodings: a key-value pair (8-byte key length, 1 key byte, 4-byte
// type, 1-byte value) and a tensor info (8+1 name, 4 n_dims, 8 one dim, 4 type,
// 8 offset).
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;

bool type_known(uint32_t t) { return t <= kMaxKnownType; }

/// Encoded size of a scalar type; 0 for STRING and ARRAY.
uint64_t scalar_size(GgufType t) {
    switch (t) {
        case GgufType::UINT8:
        case GgufType::INT8:
        case GgufType::BOOL: return 1;
        case GgufType::UINT16:
        case GgufType::INT16: return 2;
        case GgufType::UINT32:
        case GgufType::INT32:
        case GgufType::FLOAT32: return 4;
        case GgufType::UINT64:
        case GgufType::INT64:
        case GgufType::FLOAT64: return 8;
        case GgufType::STRING:
        case GgufType::ARRAY: return 0;
    }
    return 0;
}

/// Smallest number of bytes one value of type t can occupy in a file.
uint64_t min_encoded_size(GgufType t) {
    if (t == GgufType::STRING) return 8;
    if (t == GgufType::ARRAY) return 12;
    return scalar_size(t);
}

std::string_view plural_type_name(GgufType t) {
    switch (t) {
        case GgufType::STRING: return "strings";
        case GgufType::ARRAY: return "arrays";
        case GgufType::BOOL: return "bools";
        case GgufType::UINT8: return "uint8 values";
        case GgufType::INT8: return "int8 values";
        case GgufType::UINT16: return "uint16 values";
        case GgufType::INT16: return "int16 values";
        case GgufType::UINT32: return "uint32 values";
        case GgufType::INT32: return "int32 values";
        case GgufType::FLOAT32: return "float32 values";
        case GgufType::UINT64: return "uint64 values";
        case GgufType::INT64: return "int64 values";
        case GgufType::FLOAT64: return "float64 values";
    }
    return "values";
}

// Bounds-checked little-endian reader over the mapping. `ctx` names what is
// being parsed (a key, a tensor) for error messages.
class Parser {
public:
    Parser(const uint8_t* data, uint64_t size, const std::string& path) : p_(data), size_(size), path_(path) {}

    uint64_t pos() const { return pos_; }
    uint64_t left() const { return size_ - pos_; }
    void set_context(std::string ctx) { ctx_ = std::move(ctx); }

    template <class... Args>
    [[noreturn]] void error(fmt::format_string<Args...> f, Args&&... args) const {
        const std::string why = fmt::format(f, std::forward<Args>(args)...);
        if (ctx_.empty()) fail("gguf: '{}': {}", path_, why);
        fail("gguf: '{}': {}: {}", path_, ctx_, why);
    }

    void need(uint64_t n, std::string_view what) const {
        if (n > left())
            error("file truncated: {} ({} bytes at byte {}) runs past the end of the file (size {})", what, n,
                  pos_, size_);
    }

    template <class T>
    T get(std::string_view what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, p_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }

    std::string get_string(std::string_view what) {
        const uint64_t at = pos_;
        const auto n = get<uint64_t>(fmt::format("{} length", what));
        if (n > left())
            error("{} length {} (at byte {}) exceeds the {} bytes left in the file", what, n, at, left());
        std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(n));
        pos_ += n;
        return s;
    }

    GgufValue get_scalar(GgufType t) {
        switch (t) {
            case GgufType::UINT8: return {t, static_cast<uint64_t>(get<uint8_t>("uint8 value"))};
            case GgufType::INT8: return {t, static_cast<int64_t>(get<int8_t>("int8 value"))};
            case GgufType::UINT16: return {t, static_cast<uint64_t>(get<uint16_t>("uint16 value"))};
            case GgufType::INT16: return {t, static_cast<int64_t>(get<int16_t>("int16 value"))};
            case GgufType::UINT32: return {t, static_cast<uint64_t>(get<uint32_t>("uint32 value"))};
            case GgufType::INT32: return {t, static_cast<int64_t>(get<int32_t>("int32 value"))};
            case GgufType::UINT64: return {t, get<uint64_t>("uint64 value")};
            case GgufType::INT64: return {t, get<int64_t>("int64 value")};
            case GgufType::FLOAT32: return {t, static_cast<double>(get<float>("float32 value"))};
            case GgufType::FLOAT64: return {t, get<double>("float64 value")};
            case GgufType::BOOL: {
                const uint64_t at = pos_;
                const auto b = get<uint8_t>("bool value");
                if (b > 1) error("bool value {} (at byte {}) is neither 0 nor 1", b, at);
                return {t, b == 1};
            }
            case GgufType::STRING:
            case GgufType::ARRAY: break;
        }
        error("internal: {} is not a scalar type", static_cast<uint32_t>(t));
    }

    /// Reads a value of type t; `depth` is the number of arrays around it.
    GgufValue get_value(GgufType t, int depth) {
        if (t == GgufType::STRING) return {t, get_string("string value")};
        if (t == GgufType::ARRAY) return {t, get_array(depth + 1)};
        return get_scalar(t);
    }

private:
    GgufArray get_array(int depth) {
        const uint64_t at = pos_;
        if (depth > kGgufMaxArrayDepth)
            error("arrays nested more than {} deep (at byte {})", kGgufMaxArrayDepth, at);
        const auto raw = get<uint32_t>("array element type");
        if (!type_known(raw)) error("unknown array element type {} (at byte {})", raw, at);
        const auto et = static_cast<GgufType>(raw);
        const auto n = get<uint64_t>("array length");
        const uint64_t min = min_encoded_size(et);
        if (n > left() / min)
            error("array of {} {} (at byte {}) cannot fit: each takes at least {} bytes and only {} bytes are left",
                  n, plural_type_name(et), at, min, left());
        GgufArray a;
        a.type = et;
        a.items.reserve(static_cast<size_t>(n));
        if (et == GgufType::STRING) {
            for (uint64_t i = 0; i < n; ++i) a.items.push_back(GgufValue{et, get_string("string value")});
        } else if (et == GgufType::ARRAY) {
            for (uint64_t i = 0; i < n; ++i) a.items.push_back(GgufValue{et, get_array(depth + 1)});
        } else {
            for (uint64_t i = 0; i < n; ++i) a.items.push_back(get_scalar(et));
        }
        return a;
    }

    const uint8_t* p_;
    uint64_t size_;
    uint64_t pos_ = 0;
    const std::string& path_;
    std::string ctx_;
};

// Quoted string for display, control characters escaped, shortened to `max`
// bytes on a UTF-8 character boundary.
std::string quote(std::string_view s, size_t max) {
    std::string out = "\"";
    size_t end = s.size();
    if (end > max) {
        end = max;
        while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
    }
    for (size_t i = 0; i < end; ++i) {
        const auto c = static_cast<unsigned char>(s[i]);
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\t': out += "\\t"; break;
            case '\r': out += "\\r"; break;
            default:
                if (c < 0x20 || c == 0x7f)
                    out += fmt::format("\\x{:02x}", c);
                else
                    out += static_cast<char>(c);
        }
    }
    out += '"';
    if (end < s.size()) out += fmt::format("...({} bytes)", s.size());
    return out;
}

constexpr size_t kMaxShownStringBytes = 120;

}  // namespace

// ---------------------------------------------------------------- values

std::string_view gguf_type_name(GgufType t) {
    switch (t) {
        case GgufType::UINT8: return "uint8";
        case GgufType::INT8: return "int8";
        case GgufType::UINT16: return "uint16";
        case GgufType::INT16: return "int16";
        case GgufType::UINT32: return "uint32";
        case GgufType::INT32: return "int32";
        case GgufType::FLOAT32: return "float32";
        case GgufType::BOOL: return "bool";
        case GgufType::STRING: return "string";
        case GgufType::ARRAY: return "array";
        case GgufType::UINT64: return "uint64";
        case GgufType::INT64: return "int64";
        case GgufType::FLOAT64: return "float64";
    }
    return "unknown";
}

std::string gguf_value_type_string(const GgufValue& v) {
    if (v.type != GgufType::ARRAY) return std::string(gguf_type_name(v.type));
    const auto* a = std::get_if<GgufArray>(&v.v);
    if (!a) return "array";
    if (a->type == GgufType::ARRAY && !a->items.empty())
        return "array[" + gguf_value_type_string(a->items.front()) + "]";
    return fmt::format("array[{}]", gguf_type_name(a->type));
}

bool GgufArray::operator==(const GgufArray& o) const { return type == o.type && items == o.items; }
bool GgufValue::operator==(const GgufValue& o) const { return type == o.type && v == o.v; }

GgufValue gguf_uint(GgufType t, uint64_t v) { return {t, v}; }
GgufValue gguf_int(GgufType t, int64_t v) { return {t, v}; }
GgufValue gguf_float(GgufType t, double v) { return {t, v}; }
GgufValue gguf_bool(bool v) { return {GgufType::BOOL, v}; }
GgufValue gguf_string(std::string v) { return {GgufType::STRING, std::move(v)}; }
GgufValue gguf_array(GgufType elem, std::vector<GgufValue> items) {
    return {GgufType::ARRAY, GgufArray{elem, std::move(items)}};
}

bool GgufValue::is_integer() const {
    switch (type) {
        case GgufType::UINT8:
        case GgufType::INT8:
        case GgufType::UINT16:
        case GgufType::INT16:
        case GgufType::UINT32:
        case GgufType::INT32:
        case GgufType::UINT64:
        case GgufType::INT64: return std::holds_alternative<uint64_t>(v) || std::holds_alternative<int64_t>(v);
        default: return false;
    }
}

bool GgufValue::is_float() const {
    return (type == GgufType::FLOAT32 || type == GgufType::FLOAT64) && std::holds_alternative<double>(v);
}

int64_t GgufValue::as_int() const {
    if (is_integer()) {
        if (const auto* i = std::get_if<int64_t>(&v)) return *i;
        const uint64_t u = std::get<uint64_t>(v);
        if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            fail("gguf: {} value {} does not fit in int64", gguf_type_name(type), u);
        return static_cast<int64_t>(u);
    }
    fail("gguf: value of type {} is not an integer", gguf_value_type_string(*this));
}

double GgufValue::as_double() const {
    if (is_float()) return std::get<double>(v);
    if (is_integer()) {
        if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
        return static_cast<double>(std::get<uint64_t>(v));
    }
    fail("gguf: value of type {} is not a number", gguf_value_type_string(*this));
}

const std::string& GgufValue::as_string() const {
    if (type == GgufType::STRING)
        if (const auto* s = std::get_if<std::string>(&v)) return *s;
    fail("gguf: value of type {} is not a string", gguf_value_type_string(*this));
}

bool GgufValue::as_bool() const {
    if (type == GgufType::BOOL)
        if (const auto* b = std::get_if<bool>(&v)) return *b;
    fail("gguf: value of type {} is not a bool", gguf_value_type_string(*this));
}

const GgufArray& GgufValue::as_array() const {
    if (type == GgufType::ARRAY)
        if (const auto* a = std::get_if<GgufArray>(&v)) return *a;
    fail("gguf: value of type {} is not an array", gguf_value_type_string(*this));
}

std::string GgufValue::to_string(size_t max_items) const {
    struct Visitor {
        GgufType type;
        size_t max_items;
        std::string operator()(uint64_t x) const { return fmt::format("{}", x); }
        std::string operator()(int64_t x) const { return fmt::format("{}", x); }
        std::string operator()(double x) const {
            // A float32 widened to double prints as its shortest float form.
            if (type == GgufType::FLOAT32) return fmt::format("{}", static_cast<float>(x));
            return fmt::format("{}", x);
        }
        std::string operator()(bool b) const { return b ? "true" : "false"; }
        std::string operator()(const std::string& s) const { return quote(s, kMaxShownStringBytes); }
        std::string operator()(const GgufArray& a) const {
            const size_t n = a.items.size();
            std::string out = "[";
            if (n > max_items) out += fmt::format("{} {}: ", n, plural_type_name(a.type));
            const size_t shown = std::min(n, max_items);
            for (size_t i = 0; i < shown; ++i) {
                if (i) out += ", ";
                out += a.items[i].to_string(max_items);
            }
            if (shown < n) out += shown ? ", ...]" : "...]";
            else out += "]";
            return out;
        }
    };
    return std::visit(Visitor{type, max_items}, v);
}

// ---------------------------------------------------------------- reader

GgufFile::GgufFile(const std::string& path) : file_(std::make_unique<MappedFile>(path)) {
    const uint8_t* base = file_->data();
    const uint64_t size = file_->size();
    Parser p(base, size, file_->path());

    // Header.
    p.set_context("header");
    if (size < 4) p.error("not a GGUF file: it is only {} bytes long", size);
    if (std::memcmp(base, "GGUF", 4) != 0) {
        // A safetensors file starts with an 8-byte little-endian header size, then '{'.
        if (size >= 9 && base[8] == '{' && base[6] == 0 && base[7] == 0)
            p.error("this is a safetensors file, not GGUF: quern runs GGUF models for now (quern inspect reads "
                    "safetensors)");
        p.error("not a GGUF file: bad magic {:02x} {:02x} {:02x} {:02x} at byte 0 (expected \"GGUF\" = 47 47 55 46)",
                base[0], base[1], base[2], base[3]);
    }
    p.get<uint32_t>("magic");
    version_ = p.get<uint32_t>("version");
    if (version_ != 2 && version_ != 3) {
        if (version_ != 0 && (version_ & 0xFFFFu) == 0)
            p.error("version field {:#x} at byte 4 looks byte-swapped: big-endian GGUF files are not supported",
                    version_);
        if (version_ == 1)
            p.error("GGUF version 1 (at byte 4) is not supported (only versions 2 and 3); "
                    "re-convert the model with a current llama.cpp");
        p.error("unsupported GGUF version {} at byte 4 (only versions 2 and 3 are supported)", version_);
    }
    const auto n_tensors = p.get<uint64_t>("tensor count");
    const auto n_kv = p.get<uint64_t>("metadata count");
    if (n_kv > p.left() / kMinKvBytes)
        p.error("metadata count {} at byte 16 is impossible: each entry takes at least {} bytes and only {} "
                "bytes are left",
                n_kv, kMinKvBytes, p.left());
    if (n_tensors > p.left() / kMinTensorInfoBytes)
        p.error("tensor count {} at byte 8 is impossible: each tensor info takes at least {} bytes and only {} "
                "bytes are left",
                n_tensors, kMinTensorInfoBytes, p.left());

    // Metadata.
    kv_.reserve(static_cast<size_t>(n_kv));
    std::vector<uint64_t> kv_at;
    kv_at.reserve(static_cast<size_t>(n_kv));
    for (uint64_t i = 0; i < n_kv; ++i) {
        const uint64_t at = p.pos();
        p.set_context(fmt::format("metadata entry {} of {} (at byte {})", i, n_kv, at));
        std::string key = p.get_string("key");
        if (key.empty()) p.error("empty key");
        if (key.size() > kGgufMaxKeyLength)
            p.error("key length {} exceeds the GGUF limit of {} bytes", key.size(), kGgufMaxKeyLength);
        p.set_context(fmt::format("key '{}' (at byte {})", printable(key), at));
        if (const auto it = kv_index_.find(key); it != kv_index_.end())
            p.error("duplicate key (first defined at byte {})", kv_at[it->second]);
        const uint64_t type_at = p.pos();
        const auto raw = p.get<uint32_t>("value type");
        if (!type_known(raw)) p.error("unknown value type {} (at byte {})", raw, type_at);
        GgufValue value = p.get_value(static_cast<GgufType>(raw), 0);
        kv_index_.emplace(key, kv_.size());
        kv_at.push_back(at);
        kv_.push_back(GgufKV{std::move(key), std::move(value)});
    }

    if (const auto it = kv_index_.find("general.alignment"); it != kv_index_.end()) {
        const GgufValue& a = kv_[it->second].value;
        p.set_context(fmt::format("key 'general.alignment' (at byte {})", kv_at[it->second]));
        if (a.type != GgufType::UINT32) p.error("must be a uint32, found {}", gguf_value_type_string(a));
        const uint64_t al = std::get<uint64_t>(a.v);
        if (al == 0 || (al & (al - 1)) != 0) p.error("alignment {} is not a nonzero power of two", al);
        alignment_ = al;
    }

    // Tensor infos.
    if (n_tensors > p.left() / kMinTensorInfoBytes) {
        p.set_context("header");
        p.error("tensor count {} at byte 8 is impossible: each tensor info takes at least {} bytes and only {} "
                "bytes are left after the metadata",
                n_tensors, kMinTensorInfoBytes, p.left());
    }
    tensors_.reserve(static_cast<size_t>(n_tensors));
    std::vector<uint64_t> info_at;
    info_at.reserve(static_cast<size_t>(n_tensors));
    for (uint64_t i = 0; i < n_tensors; ++i) {
        const uint64_t at = p.pos();
        p.set_context(fmt::format("tensor info {} of {} (at byte {})", i, n_tensors, at));
        GgufTensorInfo t;
        t.name = p.get_string("tensor name");
        if (t.name.empty()) p.error("empty tensor name");
        p.set_context(fmt::format("tensor '{}' (info at byte {})", printable(t.name), at));
        if (const auto it = tensor_index_.find(t.name); it != tensor_index_.end())
            p.error("duplicate tensor name (first defined at byte {})", info_at[it->second]);
        const uint64_t dims_at = p.pos();
        const auto n_dims = p.get<uint32_t>("n_dims");
        if (n_dims < 1 || n_dims > 4) p.error("n_dims {} (at byte {}) is out of range 1..4", n_dims, dims_at);
        t.n_dims = static_cast<int>(n_dims);
        for (uint32_t d = 0; d < n_dims; ++d) {
            const uint64_t ne_at = p.pos();
            const auto ne = p.get<uint64_t>("dimension");
            if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
                p.error("ne[{}] = {} (at byte {}) is negative", d, static_cast<int64_t>(ne), ne_at);
            t.ne[d] = static_cast<int64_t>(ne);
        }
        const uint64_t type_at = p.pos();
        const auto type_id = p.get<uint32_t>("tensor type");
        if (!dtype_is_ggml_id(type_id)) p.error("unknown tensor type id {} (at byte {})", type_id, type_at);
        const DTypeInfo* ti = dtype_info(type_id);
        t.type = ti->type;
        const uint64_t off_at = p.pos();
        t.offset = p.get<uint64_t>("data offset");  // relative until the data section is known

        const auto shape = fmt::format("[{}]", fmt::join(t.ne.begin(), t.ne.begin() + t.n_dims, ", "));
        // Zero dimensions count as 1 here so that every partial product (rows,
        // planes) is known to fit in int64 too.
        int64_t n_el = 1;
        for (int d = 0; d < 4; ++d)
            if (__builtin_mul_overflow(n_el, std::max<int64_t>(t.ne[d], 1), &n_el))
                p.error("shape {} has more elements than fit in 64 bits", shape);
        if (t.ne[0] % ti->block_size != 0)
            p.error("ne[0] = {} is not a multiple of the {} block size {}", t.ne[0], ti->name, ti->block_size);
        uint64_t row = 0;
        const uint64_t rows = static_cast<uint64_t>(t.ne[1]) * static_cast<uint64_t>(t.ne[2]) *
                              static_cast<uint64_t>(t.ne[3]);  // fits: checked above
        if (__builtin_mul_overflow(static_cast<uint64_t>(t.ne[0] / ti->block_size),
                                   static_cast<uint64_t>(ti->type_size), &row) ||
            __builtin_mul_overflow(row, rows, &t.nbytes))
            p.error("shape {} of type {} has a byte size that overflows 64 bits", shape, ti->name);
        if (t.offset % alignment_ != 0)
            p.error("data offset {} (at byte {}) is not a multiple of the alignment {}", t.offset, off_at,
                    alignment_);
        tensor_index_.emplace(t.name, tensors_.size());
        info_at.push_back(at);
        tensors_.push_back(std::move(t));
    }

    // Data section: aligned after the infos. p.pos() <= size, so no overflow.
    data_offset_ = (p.pos() + alignment_ - 1) / alignment_ * alignment_;
    for (size_t i = 0; i < tensors_.size(); ++i) {
        GgufTensorInfo& t = tensors_[i];
        p.set_context(fmt::format("tensor '{}' (info at byte {})", printable(t.name), info_at[i]));
        uint64_t begin = 0, end = 0;
        if (__builtin_add_overflow(data_offset_, t.offset, &begin) || __builtin_add_overflow(begin, t.nbytes, &end))
            p.error("data offset {} + {} bytes overflows 64 bits", t.offset, t.nbytes);
        if (end > size) p.error("data [{}, {}) extends past end of file (size {})", begin, end, size);
        t.offset = begin;
    }

    // No two tensors may share bytes.
    std::vector<size_t> order(tensors_.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
    size_t prev = SIZE_MAX;
    for (const size_t i : order) {
        const GgufTensorInfo& t = tensors_[i];
        if (t.nbytes == 0) continue;
        if (prev != SIZE_MAX) {
            const GgufTensorInfo& q = tensors_[prev];
            if (t.offset < q.offset + q.nbytes) {
                p.set_context(fmt::format("tensor '{}' (info at byte {})", printable(t.name), info_at[i]));
                p.error("data [{}, {}) overlaps the data [{}, {}) of tensor '{}'", t.offset, t.offset + t.nbytes,
                        q.offset, q.offset + q.nbytes, printable(q.name));
            }
        }
        prev = i;
    }
}

const GgufValue* GgufFile::find(std::string_view key) const {
    const auto it = kv_index_.find(std::string(key));
    return it == kv_index_.end() ? nullptr : &kv_[it->second].value;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
    const auto it = tensor_index_.find(std::string(name));
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Tensor GgufFile::tensor_view(const GgufTensorInfo& info) const {
    return Tensor::contiguous(info.type, info.ne, const_cast<uint8_t*>(data(info)), info.name);
}

namespace {

const GgufValue& require(const GgufFile& f, std::string_view key) {
    const GgufValue* v = f.find(key);
    if (!v) fail("gguf: '{}': missing key '{}'", f.path(), key);
    return *v;
}

[[noreturn]] void wrong_type(const GgufFile& f, std::string_view key, const GgufValue& v, std::string_view want) {
    fail("gguf: '{}': key '{}' has type {}, expected {}", f.path(), key, gguf_value_type_string(v), want);
}

int64_t to_int(const GgufFile& f, std::string_view key, const GgufValue& v) {
    if (!v.is_integer()) wrong_type(f, key, v, "an integer");
    if (const auto* u = std::get_if<uint64_t>(&v.v); u && *u > static_cast<uint64_t>(INT64_MAX))
        fail("gguf: '{}': key '{}': {} value {} does not fit in int64", f.path(), key, gguf_type_name(v.type), *u);
    return v.as_int();
}

double to_double(const GgufFile& f, std::string_view key, const GgufValue& v) {
    if (!v.is_integer() && !v.is_float()) wrong_type(f, key, v, "a number");
    return v.as_double();
}

const GgufArray& to_array(const GgufFile& f, std::string_view key, std::string_view want,
                          bool (*ok)(GgufType)) {
    const GgufValue& v = require(f, key);
    const auto* a = std::get_if<GgufArray>(&v.v);
    if (v.type != GgufType::ARRAY || !a || !ok(a->type)) wrong_type(f, key, v, want);
    return *a;
}

bool is_int_type(GgufType t) {
    return t != GgufType::FLOAT32 && t != GgufType::FLOAT64 && t != GgufType::BOOL && t != GgufType::STRING &&
           t != GgufType::ARRAY;
}

}  // namespace

int64_t GgufFile::get_int(std::string_view key) const { return to_int(*this, key, require(*this, key)); }

int64_t GgufFile::get_int(std::string_view key, int64_t def) const {
    const GgufValue* v = find(key);
    return v ? to_int(*this, key, *v) : def;
}

double GgufFile::get_float(std::string_view key) const { return to_double(*this, key, require(*this, key)); }

double GgufFile::get_float(std::string_view key, double def) const {
    const GgufValue* v = find(key);
    return v ? to_double(*this, key, *v) : def;
}

bool GgufFile::get_bool(std::string_view key, bool def) const {
    const GgufValue* v = find(key);
    if (!v) return def;
    if (v->type != GgufType::BOOL || !std::holds_alternative<bool>(v->v)) wrong_type(*this, key, *v, "bool");
    return std::get<bool>(v->v);
}

std::string GgufFile::get_string(std::string_view key) const {
    const GgufValue& v = require(*this, key);
    if (v.type != GgufType::STRING || !std::holds_alternative<std::string>(v.v)) wrong_type(*this, key, v, "string");
    return std::get<std::string>(v.v);
}

std::string GgufFile::get_string(std::string_view key, std::string_view def) const {
    return find(key) ? get_string(key) : std::string(def);
}

std::vector<std::string> GgufFile::get_string_array(std::string_view key) const {
    const GgufArray& a =
        to_array(*this, key, "array[string]", [](GgufType t) { return t == GgufType::STRING; });
    std::vector<std::string> out;
    out.reserve(a.items.size());
    for (const auto& item : a.items) out.push_back(item.as_string());
    return out;
}

std::vector<float> GgufFile::get_float_array(std::string_view key) const {
    const GgufArray& a = to_array(*this, key, "an array of numbers", [](GgufType t) {
        return t == GgufType::FLOAT32 || t == GgufType::FLOAT64 || is_int_type(t);
    });
    std::vector<float> out;
    out.reserve(a.items.size());
    for (const auto& item : a.items) out.push_back(static_cast<float>(item.as_double()));
    return out;
}

std::vector<bool> GgufFile::get_bool_array(std::string_view key) const {
    const GgufArray& a = to_array(*this, key, "array[bool]", [](GgufType t) { return t == GgufType::BOOL; });
    std::vector<bool> out;
    out.reserve(a.items.size());
    for (const auto& item : a.items) out.push_back(item.as_bool());
    return out;
}

std::vector<int64_t> GgufFile::get_int_array(std::string_view key) const {
    const GgufArray& a = to_array(*this, key, "an array of integers", is_int_type);
    std::vector<int64_t> out;
    out.reserve(a.items.size());
    for (const auto& item : a.items) out.push_back(to_int(*this, key, item));
    return out;
}

}  // namespace quern
