// GGUF writer (version 3): validates values and tensors as they are added,
// then lays out header, metadata, tensor infos, padding and aligned data.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "formats/gguf.h"

namespace quern {

namespace {

using Bytes = std::vector<uint8_t>;

void put(Bytes& b, const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
}
template <class T>
void put_le(Bytes& b, T v) {
    put(b, &v, sizeof v);
}
void put_string(Bytes& b, std::string_view s) {
    put_le<uint64_t>(b, s.size());
    put(b, s.data(), s.size());
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/// Integer payload of a value (either integer alternative), widened.
bool int_payload(const GgufValue& v, __int128& out) {
    if (const auto* u = std::get_if<uint64_t>(&v.v)) {
        out = *u;
        return true;
    }
    if (const auto* i = std::get_if<int64_t>(&v.v)) {
        out = *i;
        return true;
    }
    return false;
}

bool int_range(GgufType t, __int128& lo, __int128& hi) {
    switch (t) {
        case GgufType::UINT8: lo = 0, hi = std::numeric_limits<uint8_t>::max(); return true;
        case GgufType::INT8: lo = std::numeric_limits<int8_t>::min(), hi = std::numeric_limits<int8_t>::max(); return true;
        case GgufType::UINT16: lo = 0, hi = std::numeric_limits<uint16_t>::max(); return true;
        case GgufType::INT16: lo = std::numeric_limits<int16_t>::min(), hi = std::numeric_limits<int16_t>::max(); return true;
        case GgufType::UINT32: lo = 0, hi = std::numeric_limits<uint32_t>::max(); return true;
        case GgufType::INT32: lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max(); return true;
        case GgufType::UINT64: lo = 0, hi = std::numeric_limits<uint64_t>::max(); return true;
        case GgufType::INT64: lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max(); return true;
        default: return false;
    }
}

/// Checks that a value can be written: its payload matches its type, integers
/// fit, array items all have the array's element type, nesting is bounded.
void check_value(const std::string& key, const GgufValue& v, int depth) {
    if (static_cast<uint32_t>(v.type) > static_cast<uint32_t>(GgufType::FLOAT64))
        fail("gguf writer: key '{}': unknown value type {}", key, static_cast<uint32_t>(v.type));
    __int128 lo = 0, hi = 0, x = 0;
    if (int_range(v.type, lo, hi)) {
        if (!int_payload(v, x)) fail("gguf writer: key '{}': {} value does not hold an integer", key, gguf_type_name(v.type));
        if (x < lo || x > hi)
            fail("gguf writer: key '{}': value {} does not fit in {}", key, v.to_string(), gguf_type_name(v.type));
        return;
    }
    switch (v.type) {
        case GgufType::FLOAT32:
        case GgufType::FLOAT64:
            if (!std::holds_alternative<double>(v.v))
                fail("gguf writer: key '{}': {} value does not hold a double", key, gguf_type_name(v.type));
            return;
        case GgufType::BOOL:
            if (!std::holds_alternative<bool>(v.v)) fail("gguf writer: key '{}': bool value does not hold a bool", key);
            return;
        case GgufType::STRING:
            if (!std::holds_alternative<std::string>(v.v))
                fail("gguf writer: key '{}': string value does not hold a string", key);
            return;
        case GgufType::ARRAY: {
            const auto* a = std::get_if<GgufArray>(&v.v);
            if (!a) fail("gguf writer: key '{}': array value does not hold an array", key);
            if (depth + 1 > kGgufMaxArrayDepth)
                fail("gguf writer: key '{}': arrays nested more than {} deep", key, kGgufMaxArrayDepth);
            if (static_cast<uint32_t>(a->type) > static_cast<uint32_t>(GgufType::FLOAT64))
                fail("gguf writer: key '{}': unknown array element type {}", key, static_cast<uint32_t>(a->type));
            for (size_t i = 0; i < a->items.size(); ++i) {
                if (a->items[i].type != a->type)
                    fail("gguf writer: key '{}': item {} has type {} in an array of {}", key, i,
                         gguf_type_name(a->items[i].type), gguf_type_name(a->type));
                check_value(key, a->items[i], depth + 1);
            }
            return;
        }
        default: return;
    }
}

/// Appends the payload of a checked value (no type tag).
void put_value(Bytes& b, const GgufValue& v) {
    __int128 x = 0;
    switch (v.type) {
        case GgufType::UINT8: int_payload(v, x); put_le(b, static_cast<uint8_t>(x)); return;
        case GgufType::INT8: int_payload(v, x); put_le(b, static_cast<int8_t>(x)); return;
        case GgufType::UINT16: int_payload(v, x); put_le(b, static_cast<uint16_t>(x)); return;
        case GgufType::INT16: int_payload(v, x); put_le(b, static_cast<int16_t>(x)); return;
        case GgufType::UINT32: int_payload(v, x); put_le(b, static_cast<uint32_t>(x)); return;
        case GgufType::INT32: int_payload(v, x); put_le(b, static_cast<int32_t>(x)); return;
        case GgufType::UINT64: int_payload(v, x); put_le(b, static_cast<uint64_t>(x)); return;
        case GgufType::INT64: int_payload(v, x); put_le(b, static_cast<int64_t>(x)); return;
        case GgufType::FLOAT32: put_le(b, static_cast<float>(std::get<double>(v.v))); return;
        case GgufType::FLOAT64: put_le(b, std::get<double>(v.v)); return;
        case GgufType::BOOL: put_le<uint8_t>(b, std::get<bool>(v.v) ? 1 : 0); return;
        case GgufType::STRING: put_string(b, std::get<std::string>(v.v)); return;
        case GgufType::ARRAY: {
            const auto& a = std::get<GgufArray>(v.v);
            put_le(b, static_cast<uint32_t>(a.type));
            put_le<uint64_t>(b, a.items.size());
            for (const auto& item : a.items) put_value(b, item);
            return;
        }
    }
}

bool valid_alignment(uint64_t a) { return a != 0 && (a & (a - 1)) == 0 && a <= (1u << 30); }

}  // namespace

void GgufWriter::set(std::string key, GgufValue value) {
    if (key.empty()) fail("gguf writer: empty key");
    if (key.size() > kGgufMaxKeyLength)
        fail("gguf writer: key of {} bytes exceeds the GGUF limit of {}", key.size(), kGgufMaxKeyLength);
    for (const auto& kv : kv_)
        if (kv.key == key) fail("gguf writer: duplicate key '{}'", key);
    check_value(key, value, 0);
    if (key == "general.alignment") {
        if (value.type != GgufType::UINT32) fail("gguf writer: general.alignment must be a uint32");
        __int128 x = 0;
        int_payload(value, x);  // range-checked to uint32 above
        const auto a = static_cast<uint64_t>(x);
        if (!valid_alignment(a)) fail("gguf writer: alignment {} is not a power of two (1 .. 2^30)", a);
        alignment_ = static_cast<uint32_t>(a);
    }
    kv_.push_back(GgufKV{std::move(key), std::move(value)});
}

void GgufWriter::set_u32(std::string key, uint32_t v) { set(std::move(key), gguf_uint(GgufType::UINT32, v)); }
void GgufWriter::set_i32(std::string key, int32_t v) { set(std::move(key), gguf_int(GgufType::INT32, v)); }
void GgufWriter::set_f32(std::string key, float v) { set(std::move(key), gguf_float(GgufType::FLOAT32, v)); }
void GgufWriter::set_bool(std::string key, bool v) { set(std::move(key), gguf_bool(v)); }
void GgufWriter::set_string(std::string key, std::string v) { set(std::move(key), gguf_string(std::move(v))); }

void GgufWriter::set_string_array(std::string key, std::vector<std::string> v) {
    std::vector<GgufValue> items;
    items.reserve(v.size());
    for (auto& s : v) items.push_back(gguf_string(std::move(s)));
    set(std::move(key), gguf_array(GgufType::STRING, std::move(items)));
}

void GgufWriter::set_f32_array(std::string key, const std::vector<float>& v) {
    std::vector<GgufValue> items;
    items.reserve(v.size());
    for (float f : v) items.push_back(gguf_float(GgufType::FLOAT32, f));
    set(std::move(key), gguf_array(GgufType::FLOAT32, std::move(items)));
}

void GgufWriter::set_i32_array(std::string key, const std::vector<int32_t>& v) {
    std::vector<GgufValue> items;
    items.reserve(v.size());
    for (int32_t i : v) items.push_back(gguf_int(GgufType::INT32, i));
    set(std::move(key), gguf_array(GgufType::INT32, std::move(items)));
}

void GgufWriter::set_bool_array(std::string key, const std::vector<bool>& v) {
    std::vector<GgufValue> items;
    items.reserve(v.size());
    for (bool b : v) items.push_back(gguf_bool(b));
    set(std::move(key), gguf_array(GgufType::BOOL, std::move(items)));
}

void GgufWriter::set_alignment(uint32_t alignment) {
    if (!valid_alignment(alignment))
        fail("gguf writer: alignment {} is not a power of two (1 .. 2^30)", alignment);
    alignment_ = alignment;
    for (auto& kv : kv_)
        if (kv.key == "general.alignment") {
            kv.value = gguf_uint(GgufType::UINT32, alignment);
            return;
        }
    kv_.push_back(GgufKV{"general.alignment", gguf_uint(GgufType::UINT32, alignment)});
}

GgufWriter::PendingTensor GgufWriter::checked(std::string name, DType type, std::array<int64_t, 4> ne,
                                               int n_dims) const {
    if (name.empty()) fail("gguf writer: empty tensor name");
    for (const auto& t : tensors_)
        if (t.name == name) fail("gguf writer: duplicate tensor name '{}'", name);
    if (n_dims < 1 || n_dims > 4) fail("gguf writer: tensor '{}': n_dims {} is out of range 1..4", name, n_dims);
    int64_t n_el = 1;
    for (int d = 0; d < 4; ++d) {
        if (ne[d] < 0) fail("gguf writer: tensor '{}': ne[{}] = {} is negative", name, d, ne[d]);
        if (d >= n_dims && ne[d] != 1)
            fail("gguf writer: tensor '{}': ne[{}] = {} but n_dims is {}", name, d, ne[d], n_dims);
        if (__builtin_mul_overflow(n_el, std::max<int64_t>(ne[d], 1), &n_el))
            fail("gguf writer: tensor '{}': element count overflows", name);
    }
    if (!dtype_is_ggml_id(static_cast<uint32_t>(type)))
        fail("gguf writer: tensor '{}': type {} has no GGML type id and cannot be stored in GGUF", name,
             dtype_name(type));
    const auto& info = dtype_info(type);
    if (ne[0] % info.block_size != 0)
        fail("gguf writer: tensor '{}': ne[0] = {} is not a multiple of the {} block size {}", name, ne[0], info.name,
             info.block_size);
    uint64_t nbytes = 0;
    const uint64_t row = static_cast<uint64_t>(ne[0] / info.block_size) * static_cast<uint64_t>(info.type_size);
    const uint64_t rows = static_cast<uint64_t>(ne[1]) * static_cast<uint64_t>(ne[2]) * static_cast<uint64_t>(ne[3]);
    if (__builtin_mul_overflow(row, rows, &nbytes)) fail("gguf writer: tensor '{}': byte size overflows", name);
    return PendingTensor{std::move(name), type, ne, n_dims, nullptr, nbytes, nullptr};
}

void GgufWriter::add_tensor(std::string name, DType type, std::array<int64_t, 4> ne, int n_dims, const void* data) {
    PendingTensor t = checked(std::move(name), type, ne, n_dims);
    if (!data && t.nbytes != 0) fail("gguf writer: tensor '{}': no data", t.name);
    t.data = data;
    tensors_.push_back(std::move(t));
}

void GgufWriter::add_tensor(std::string name, DType type, std::array<int64_t, 4> ne, int n_dims,
                            std::function<void(uint8_t* out)> fill) {
    PendingTensor t = checked(std::move(name), type, ne, n_dims);
    if (!fill) fail("gguf writer: tensor '{}': no data", t.name);
    t.fill = std::move(fill);
    tensors_.push_back(std::move(t));
}

void GgufWriter::write(const std::string& path,
                       const std::function<void(uint64_t done, uint64_t total)>& progress) const {
    const uint64_t align = alignment_;
    Bytes head;
    head.reserve(1 << 16);
    put(head, "GGUF", 4);
    put_le<uint32_t>(head, 3);
    put_le<uint64_t>(head, tensors_.size());
    put_le<uint64_t>(head, kv_.size());
    for (const auto& kv : kv_) {
        put_string(head, kv.key);
        put_le(head, static_cast<uint32_t>(kv.value.type));
        put_value(head, kv.value);
    }
    uint64_t data_size = 0;
    for (const auto& t : tensors_) {
        put_string(head, t.name);
        put_le<uint32_t>(head, static_cast<uint32_t>(t.n_dims));
        for (int d = 0; d < t.n_dims; ++d) put_le<uint64_t>(head, static_cast<uint64_t>(t.ne[d]));
        put_le(head, static_cast<uint32_t>(t.type));
        put_le<uint64_t>(head, data_size);
        data_size = align_up(data_size + t.nbytes, align);  // every tensor padded, as ggml expects
    }
    head.resize(align_up(head.size(), align), 0);
    const uint64_t total = head.size() + data_size;

    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) fail("gguf writer: cannot create '{}': {}", path, std::strerror(errno));
    uint64_t done = 0, reported = 0;
    auto report = [&] {
        if (progress) progress(done, total);
        reported = done;
    };
    auto write_bytes = [&](const void* p, size_t n) {
        if (n && std::fwrite(p, 1, n, f) != n) {
            const int e = errno;
            std::fclose(f);
            std::remove(path.c_str());
            fail("gguf writer: writing '{}' failed at byte {}: {}", path, done, std::strerror(e));
        }
        done += n;
    };
    write_bytes(head.data(), head.size());
    report();
    static const uint8_t zeros[4096] = {};
    constexpr size_t kChunk = size_t{64} << 20;
    std::vector<uint8_t> filled;
    for (const auto& t : tensors_) {
        const auto* p = static_cast<const uint8_t*>(t.data);
        if (t.fill) {
            filled.assign(static_cast<size_t>(t.nbytes), 0);
            try {
                t.fill(filled.data());
            } catch (...) {
                std::fclose(f);
                std::remove(path.c_str());
                throw;
            }
            p = filled.data();
        }
        for (uint64_t off = 0; off < t.nbytes; off += kChunk) {
            write_bytes(p + off, static_cast<size_t>(std::min<uint64_t>(kChunk, t.nbytes - off)));
            report();
        }
        for (uint64_t pad = align_up(t.nbytes, align) - t.nbytes; pad > 0;) {
            const size_t n = static_cast<size_t>(std::min<uint64_t>(pad, sizeof zeros));
            write_bytes(zeros, n);
            pad -= n;
        }
    }
    if (std::fflush(f) != 0 || std::ferror(f)) {
        const int e = errno;
        std::fclose(f);
        std::remove(path.c_str());
        fail("gguf writer: writing '{}' failed: {}", path, std::strerror(e));
    }
    if (std::fclose(f) != 0) {
        const int e = errno;
        std::remove(path.c_str());
        fail("gguf writer: closing '{}' failed: {}", path, std::strerror(e));
    }
    if (reported != done) report();  // the final padding
}

}  // namespace quern
