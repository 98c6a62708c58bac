// GGUF reader and writer.
//
// Follows the GGUF specification (ggml/docs/gguf.md), versions 2 and 3:
//   header:   magic "GGUF" (4 bytes), uint32 version, uint64 tensor_count,
//             uint64 metadata_kv_count
//   metadata: kv_count × { gguf_string key, uint32 value_type, value }
//   tensors:  tensor_count × { gguf_string name, uint32 n_dims, uint64 ne[n_dims],
//             uint32 ggml_type, uint64 offset (relative to the data section) }
//   padding to general.alignment (default 32), then the data section.
// gguf_string = uint64 length + bytes (not NUL-terminated). All little-endian.
//
// The reader memory-maps the file and validates everything before use: every
// length and count against the bytes left in the file, every tensor's shape
// product and byte size against overflow, every tensor's data range against the
// file size and the alignment. Any violation throws quern::Error naming what
// (key or tensor), where (byte offset) and why. Beyond the specification's
// own rules the reader also rejects: empty keys and tensor names, duplicate
// keys or names, bool bytes other than 0/1, a general.alignment that is not a
// uint32 power of two, arrays nested deeper than kGgufMaxArrayDepth, and
// tensors whose data ranges overlap. Tensor offsets need not be in file order,
// and the padding after the last tensor may be missing.
#pragma once
#include <array>
#include <functional>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/mmap.h"
#include "core/tensor.h"

namespace quern {

/// Metadata value types (gguf_metadata_value_type).
enum class GgufType : uint32_t {
    UINT8 = 0,
    INT8 = 1,
    UINT16 = 2,
    INT16 = 3,
    UINT32 = 4,
    INT32 = 5,
    FLOAT32 = 6,
    BOOL = 7,
    STRING = 8,
    ARRAY = 9,
    UINT64 = 10,
    INT64 = 11,
    FLOAT64 = 12,
};
std::string_view gguf_type_name(GgufType t);

struct GgufValue;
/// An array value: element type plus elements (arrays may nest).
struct GgufArray {
    GgufType type = GgufType::UINT8;
    std::vector<GgufValue> items;

    bool operator==(const GgufArray& o) const;
};

/// One metadata value. Integers are widened to int64/uint64, floats to double;
/// `type` keeps the stored type so a writer can reproduce it.
struct GgufValue {
    GgufType type = GgufType::UINT8;
    std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray> v;

    bool is_integer() const;
    bool is_float() const;
    /// Numeric value as int64 (integers only; throws quern::Error otherwise or
    /// when a uint64 does not fit).
    int64_t as_int() const;
    /// Numeric value as double (integers and floats).
    double as_double() const;
    const std::string& as_string() const;  // throws unless STRING
    bool as_bool() const;                  // throws unless BOOL
    const GgufArray& as_array() const;     // throws unless ARRAY
    /// Short human-readable rendering (arrays abbreviated after `max_items`).
    std::string to_string(size_t max_items = 8) const;

    /// Deep equality (type and value; FLOAT values compare as doubles).
    bool operator==(const GgufValue& o) const;
};

/// Value constructors. Integer kinds (UINT8..INT64) are range-checked by the
/// writer when the file is written; gguf_uint/gguf_int take the stored type.
GgufValue gguf_uint(GgufType t, uint64_t v);
GgufValue gguf_int(GgufType t, int64_t v);
GgufValue gguf_float(GgufType t, double v);  // FLOAT32 or FLOAT64
GgufValue gguf_bool(bool v);
GgufValue gguf_string(std::string v);
GgufValue gguf_array(GgufType elem, std::vector<GgufValue> items);

/// Type as written in listings: "uint32", "string", "array[string]",
/// "array[array[int32]]" (nested element types taken from the first item).
std::string gguf_value_type_string(const GgufValue& v);

/// Keys longer than this are rejected (the GGUF specification's limit).
inline constexpr uint64_t kGgufMaxKeyLength = 65535;
/// Arrays may nest at most this deep (an array of arrays has depth 2).
inline constexpr int kGgufMaxArrayDepth = 16;

struct GgufKV {
    std::string key;
    GgufValue value;
};

/// One tensor info entry, validated.
struct GgufTensorInfo {
    std::string name;
    DType type = DType::F32;
    int n_dims = 0;
    std::array<int64_t, 4> ne{1, 1, 1, 1};
    uint64_t offset = 0;   // absolute byte offset of the data in the file
    uint64_t nbytes = 0;   // bytes of data
};

/// A GGUF file opened read-only and memory-mapped.
class GgufFile {
public:
    /// Opens and validates `path`. Throws quern::Error on any malformed input.
    explicit GgufFile(const std::string& path);

    uint32_t version() const { return version_; }
    uint64_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; }
    const std::string& path() const { return file_->path(); }
    uint64_t file_size() const { return file_->size(); }

    const std::vector<GgufKV>& metadata() const { return kv_; }
    const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

    /// Metadata lookup; nullptr when absent.
    const GgufValue* find(std::string_view key) const;
    /// Typed getters: throw quern::Error naming the key when it is missing (the
    /// non-defaulted forms) or has an incompatible type.
    int64_t get_int(std::string_view key) const;
    int64_t get_int(std::string_view key, int64_t def) const;
    double get_float(std::string_view key) const;
    double get_float(std::string_view key, double def) const;
    bool get_bool(std::string_view key, bool def) const;
    std::string get_string(std::string_view key) const;
    std::string get_string(std::string_view key, std::string_view def) const;
    /// Arrays of the named element kind; throw if missing or of another kind.
    std::vector<std::string> get_string_array(std::string_view key) const;
    std::vector<float> get_float_array(std::string_view key) const;
    std::vector<int64_t> get_int_array(std::string_view key) const;
    std::vector<bool> get_bool_array(std::string_view key) const;

    /// Tensor lookup; nullptr when absent.
    const GgufTensorInfo* find_tensor(std::string_view name) const;
    /// A CPU view of a tensor's data inside the mapping (contiguous strides).
    Tensor tensor_view(const GgufTensorInfo& info) const;
    const uint8_t* data(const GgufTensorInfo& info) const { return file_->data() + info.offset; }

private:
    std::unique_ptr<MappedFile> file_;
    uint32_t version_ = 0;
    uint64_t alignment_ = 32;
    uint64_t data_offset_ = 0;
    std::vector<GgufKV> kv_;
    std::vector<GgufTensorInfo> tensors_;
    std::unordered_map<std::string, size_t> kv_index_;      // key -> index in kv_
    std::unordered_map<std::string, size_t> tensor_index_;  // name -> index in tensors_
};

/// Builds a GGUF file (version 3) in memory-light streaming fashion: metadata
/// and tensor infos are collected, then write() lays out the header, the infos
/// and the aligned tensor data. Throws quern::Error on I/O errors or duplicate
/// keys / tensor names.
class GgufWriter {
public:
    void set(std::string key, GgufValue value);
    void set_u32(std::string key, uint32_t v);
    void set_i32(std::string key, int32_t v);
    void set_f32(std::string key, float v);
    void set_bool(std::string key, bool v);
    void set_string(std::string key, std::string v);
    void set_string_array(std::string key, std::vector<std::string> v);
    void set_f32_array(std::string key, const std::vector<float>& v);
    void set_i32_array(std::string key, const std::vector<int32_t>& v);
    void set_bool_array(std::string key, const std::vector<bool>& v);
    void set_alignment(uint32_t alignment);  // also writes general.alignment

    /// Adds a tensor; `data` must hold row_size(type, ne[0]) * rows bytes and
    /// stay valid until write() returns.
    void add_tensor(std::string name, DType type, std::array<int64_t, 4> ne, int n_dims, const void* data);
    /// Adds a tensor whose bytes `fill` writes into a buffer of its size when
    /// write() reaches it (one such buffer alive at a time: a converter need
    /// not hold the whole file in memory). An exception from `fill` removes
    /// the partly written file and propagates.
    void add_tensor(std::string name, DType type, std::array<int64_t, 4> ne, int n_dims,
                    std::function<void(uint8_t* out)> fill);

    /// Writes the file. `progress`, when set, is called with bytes written so far
    /// and the total.
    void write(const std::string& path,
               const std::function<void(uint64_t done, uint64_t total)>& progress = {}) const;

private:
    struct PendingTensor {
        std::string name;
        DType type;
        std::array<int64_t, 4> ne;
        int n_dims;
        const void* data;
        uint64_t nbytes;
        std::function<void(uint8_t*)> fill;  // or null: data holds the bytes
    };
    /// A tensor's entry after every check but its data's (quern::Error naming it).
    PendingTensor checked(std::string name, DType type, std::array<int64_t, 4> ne, int n_dims) const;
    std::vector<GgufKV> kv_;
    std::vector<PendingTensor> tensors_;
    uint32_t alignment_ = 32;
};

}  // namespace quern
