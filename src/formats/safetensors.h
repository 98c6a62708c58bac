// Safetensors reader: one file (SafetensorsFile) or a Hugging Face checkpoint
// of one or more files (SafetensorsModel).
//
// The format (huggingface/safetensors, README "Format"), all little-endian:
//   bytes [0, 8)        uint64 N, the size of the header
//   bytes [8, 8 + N)    the header: UTF-8 JSON, one object mapping
//                         tensor name -> {"dtype": "BF16", "shape": [d0, d1, ...],
//                                         "data_offsets": [begin, end]}
//                       plus an optional "__metadata__": {string: string}.
//                       Writers may pad it with trailing spaces.
//   bytes [8 + N, EOF)  the data buffer. Offsets are relative to its start;
//                       shapes are row-major, outermost dimension first
//                       (PyTorch's order); end - begin = numel × dtype size.
//
// Validation follows the reference implementation (the Rust `safetensors`
// crate) and is stricter where it is silent. Rejected, each with a
// quern::Error naming the file, the tensor and the reason:
//   - a file shorter than 8 bytes; N > 100,000,000 (kSafetensorsMaxHeader) or
//     N > file size - 8;
//   - a header that is not valid JSON or not an object; duplicate keys in any
//     object (the JSON parser would otherwise keep one silently); nesting
//     deeper than a header can have;
//   - "__metadata__" that is not an object of strings (null counts as absent);
//   - a tensor entry that is not an object, lacks dtype/shape/data_offsets or
//     has any other key; an empty tensor name;
//   - a dtype outside F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U8 BOOL;
//   - shape entries that are not non-negative integers (int64); a shape whose
//     element count (zero dimensions counted as 1) or byte size overflows 64 bits;
//   - data_offsets that are not two non-negative integers begin <= end;
//     end - begin != numel × dtype size; a range past the end of the data
//     buffer (a truncated file);
//   - ranges that overlap, leave a hole, or leave bytes after the last tensor:
//     as in the reference, the tensors must cover the data buffer exactly.
// The order of tensors in the header and of their ranges need not agree.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/mmap.h"
#include "core/tensor.h"

namespace quern {

/// Largest header accepted, in bytes (the reference implementation's limit).
inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

/// A safetensors dtype string and what quern makes of it.
struct SafetensorsDType {
    std::string_view name;  // as written in headers: "BF16", "F8_E4M3", ...
    int size;               // bytes per element
    DType type;             // quern's type for it
};

/// The dtype named `name` (case-sensitive, as the format spells it), or
/// nullptr when quern does not read it.
const SafetensorsDType* safetensors_dtype(std::string_view name);
/// "F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U8, BOOL".
std::string safetensors_supported_dtypes();

/// One tensor of a file, validated.
struct SafetensorsTensorInfo {
    std::string name;
    std::string dtype;           // the header's string, e.g. "BF16"
    DType type = DType::F32;     // quern's type for it
    std::vector<int64_t> shape;  // as stored: outermost first; empty for a scalar
    uint64_t numel = 0;          // product of shape (1 for a scalar)
    uint64_t offset = 0;         // absolute byte offset of the data in the file
    uint64_t nbytes = 0;         // numel × dtype size

    /// Shape innermost first, as quern's Tensor::ne: {shape[r-1], ..., shape[0], 1...}.
    /// Throws quern::Error (naming the tensor) when the rank exceeds 4.
    std::array<int64_t, 4> ne() const;
};

/// A .safetensors file opened read-only, memory-mapped and validated (see the
/// list above). Tensor data stays in the mapping for the object's lifetime; its
/// alignment is whatever the file gives (Hugging Face's writer pads the header
/// to 8 bytes and orders tensors by element size, so data is aligned to its
/// element size in files it wrote; check before casting the pointer elsewhere).
class SafetensorsFile {
public:
    /// Opens and validates `path`. Throws quern::Error on any malformed input.
    explicit SafetensorsFile(const std::string& path);

    const std::string& path() const { return file_->path(); }
    uint64_t file_size() const { return file_->size(); }
    uint64_t header_size() const { return header_size_; }  // N
    uint64_t data_offset() const { return 8 + header_size_; }

    /// "__metadata__" in file order (empty when absent).
    const std::vector<std::pair<std::string, std::string>>& metadata() const { return metadata_; }
    /// Value of a metadata key; nullopt when absent.
    std::optional<std::string> metadata_value(std::string_view key) const;

    /// Tensors in the order of their data in the file.
    const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
    /// Tensor lookup; nullptr when absent.
    const SafetensorsTensorInfo* find_tensor(std::string_view name) const;

    const uint8_t* data(const SafetensorsTensorInfo& t) const { return file_->data() + t.offset; }
    /// A contiguous CPU view inside the mapping: ne innermost first (the stored
    /// shape reversed), nb byte strides. Throws quern::Error for rank > 4.
    Tensor tensor_view(const SafetensorsTensorInfo& t) const;

private:
    std::unique_ptr<MappedFile> file_;
    uint64_t header_size_ = 0;
    std::vector<std::pair<std::string, std::string>> metadata_;
    std::vector<SafetensorsTensorInfo> tensors_;
    std::unordered_map<std::string, size_t> index_;  // name -> index in tensors_
};

/// A checkpoint: one .safetensors file, or the shards listed by a Hugging Face
/// index (`model.safetensors.index.json`:
///   {"metadata": {"total_size": BYTES, ...}, "weight_map": {tensor: shard file}}).
/// Every shard is opened once and stays mapped for the object's lifetime.
///
/// Index checks (quern::Error naming the index, the shard and the tensor):
/// valid JSON object, no duplicate keys; "weight_map" a non-empty object of
/// non-empty strings; shard names relative to the index's folder without ".."
/// components; every shard exists and is a valid file; every listed tensor is
/// in its shard; no shard holds a tensor the index does not list for it.
class SafetensorsModel {
public:
    /// Opens `path`:
    ///  - a folder: its model.safetensors.index.json, else its model.safetensors,
    ///    else its only *.safetensors.index.json, else its only *.safetensors;
    ///  - a file ending in ".json": that index;
    ///  - any other file: a single .safetensors file.
    /// Throws quern::Error when nothing fits or anything is malformed.
    static SafetensorsModel open(const std::string& path);
    /// A single file.
    static SafetensorsModel open_file(const std::string& path);
    /// A sharded checkpoint from its index.
    static SafetensorsModel open_index(const std::string& index_path);

    /// One tensor of the checkpoint: its shard and its entry there.
    struct Entry {
        const SafetensorsFile* file;
        const SafetensorsTensorInfo* info;
    };

    /// The index's path; empty for a single file.
    const std::string& index_path() const { return index_path_; }
    /// The index's "metadata" object as JSON text ("{}" when absent or single file).
    const std::string& index_metadata_json() const { return index_metadata_; }
    /// Shards in name order (one element for a single file).
    const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
    /// Every tensor, by shard (in files() order) and then by data offset.
    const std::vector<Entry>& tensors() const { return tensors_; }
    /// Lookup; nullptr when absent.
    const Entry* find(std::string_view name) const;
    /// The tensor's view (see SafetensorsFile::tensor_view). Throws quern::Error
    /// naming the tensor and the checkpoint when it is absent.
    Tensor view(std::string_view name) const;
    /// Sum of the tensors' bytes.
    uint64_t total_bytes() const;

private:
    void add_file_tensors(const SafetensorsFile& f);

    std::string index_path_;
    std::string index_metadata_ = "{}";
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::vector<Entry> tensors_;
    std::unordered_map<std::string, size_t> index_;  // name -> index in tensors_
};

/// True when `path` looks like a safetensors checkpoint rather than a GGUF
/// file: a folder, a name ending in ".safetensors" or ".json", or a file whose
/// first bytes are a plausible header size followed by '{'. Never throws.
bool looks_like_safetensors(const std::string& path);

}  // namespace quern
