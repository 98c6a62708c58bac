// Helpers of the safetensors tests (safetensors_test.cpp and
// safetensors_malformed_test.cpp): a temporary folder removed at exit, a small
// safetensors writer, raw files, sharded checkpoints, and error capture.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

#include "core/error.h"
#include "formats/safetensors.h"

namespace st_test {

using namespace quern;
namespace fs = std::filesystem;
using OJson = nlohmann::ordered_json;

inline fs::path temp_dir() {
    static const fs::path dir = [] {
        fs::path d = fs::temp_directory_path() / ("quern_safetensors_test_" + std::to_string(::getpid()));
        fs::create_directories(d);
        return d;
    }();
    return dir;
}

class TempDirCleanup : public testing::Environment {
public:
    void TearDown() override {
        std::error_code ec;
        fs::remove_all(temp_dir(), ec);
    }
};
[[maybe_unused]] inline testing::Environment* const kCleanup = testing::AddGlobalTestEnvironment(new TempDirCleanup);

inline std::string temp_path(const std::string& name) { return (temp_dir() / name).string(); }

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& b, size_t n = SIZE_MAX) {
    std::error_code ec;
    fs::remove(path, ec);  // see gguf_test: rewriting through O_TRUNC is slow on ext4
    fs::create_directories(fs::path(path).parent_path(), ec);
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(std::min(n, b.size())));
    ASSERT_TRUE(f.good()) << path;
}

inline void write_text(const std::string& path, const std::string& s) {
    write_bytes(path, std::vector<uint8_t>(s.begin(), s.end()));
}

/// Raw file: 8-byte little-endian header size, the header text, the data.
inline std::vector<uint8_t> raw_file(const std::string& header, const std::vector<uint8_t>& data) {
    std::vector<uint8_t> b;
    b.reserve(8 + header.size() + data.size());
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(n >> (8 * i)));
    b.insert(b.end(), header.begin(), header.end());
    b.insert(b.end(), data.begin(), data.end());
    return b;
}

/// A small safetensors writer: tensors are laid out in the order added unless
/// `data_order` says otherwise; the header is padded with spaces to 8 bytes
/// as Hugging Face's writer does.
struct Writer {
    struct T {
        std::string name, dtype;
        std::vector<int64_t> shape;
        std::vector<uint8_t> bytes;
    };
    std::vector<T> tensors;
    std::vector<std::pair<std::string, std::string>> metadata;
    std::vector<size_t> data_order;  // indices into tensors; empty = as added

    template <class E>
    Writer& add(std::string name, std::string dtype, std::vector<int64_t> shape, const std::vector<E>& values) {
        std::vector<uint8_t> b(values.size() * sizeof(E));
        if (!b.empty()) std::memcpy(b.data(), values.data(), b.size());
        tensors.push_back({std::move(name), std::move(dtype), std::move(shape), std::move(b)});
        return *this;
    }

    OJson header() const {
        OJson h = OJson::object();
        if (!metadata.empty()) {
            OJson md = OJson::object();
            for (const auto& [k, v] : metadata) md[k] = v;
            h["__metadata__"] = md;
        }
        std::vector<size_t> order = data_order;
        if (order.empty())
            for (size_t i = 0; i < tensors.size(); ++i) order.push_back(i);
        std::vector<uint64_t> begin(tensors.size());
        uint64_t at = 0;
        for (size_t i : order) {
            begin[i] = at;
            at += tensors[i].bytes.size();
        }
        for (size_t i = 0; i < tensors.size(); ++i)
            h[tensors[i].name] = {{"dtype", tensors[i].dtype},
                                  {"shape", tensors[i].shape},
                                  {"data_offsets", {begin[i], begin[i] + tensors[i].bytes.size()}}};
        return h;
    }

    std::vector<uint8_t> data() const {
        std::vector<size_t> order = data_order;
        if (order.empty())
            for (size_t i = 0; i < tensors.size(); ++i) order.push_back(i);
        std::vector<uint8_t> d;
        for (size_t i : order) d.insert(d.end(), tensors[i].bytes.begin(), tensors[i].bytes.end());
        return d;
    }

    std::vector<uint8_t> build() const {
        std::string h = header().dump();
        while (h.size() % 8) h += ' ';
        return raw_file(h, data());
    }

    std::string write(const std::string& name) const {
        const std::string path = temp_path(name);
        write_bytes(path, build());
        return path;
    }
};

/// Loads bytes as a safetensors file; returns the quern::Error message or ""
/// if it loaded. Any other exception fails the test.
inline std::string load_error(const std::vector<uint8_t>& bytes, const std::string& name = "bad.safetensors") {
    const std::string path = temp_path(name);
    write_bytes(path, bytes);
    try {
        SafetensorsFile f(path);
        return "";
    } catch (const Error& e) {
        return e.what();
    }
}

inline std::string open_error(const std::string& path) {
    try {
        SafetensorsModel::open(path);
        return "";
    } catch (const Error& e) {
        return e.what();
    }
}

inline void expect_contains(const std::string& msg, std::initializer_list<const char*> parts) {
    EXPECT_FALSE(msg.empty()) << "expected an error";
    for (const char* s : parts) EXPECT_NE(msg.find(s), std::string::npos) << "message lacks \"" << s << "\": " << msg;
}

/// The header of a valid two-tensor file with `mutate` applied, as a file.
inline std::string header_error(const std::function<void(OJson&)>& mutate, std::vector<uint8_t> data = {}) {
    OJson h = {{"w", {{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}}},
               {"b", {{"dtype", "I8"}, {"shape", {4}}, {"data_offsets", {24, 28}}}}};
    mutate(h);
    if (data.empty()) data.assign(28, 7);
    return load_error(raw_file(h.dump(), data));
}

/// Element i of type T at p. Tensor data in a safetensors file is aligned only
/// as the writer laid it out (the sample above is not), so tests read through memcpy.
template <class T>
T load(const void* p, size_t i = 0) {
    T v;
    std::memcpy(&v, static_cast<const uint8_t*>(p) + i * sizeof(T), sizeof(T));
    return v;
}

#define EXPECT_ERROR(msg, ...) expect_contains((msg), {__VA_ARGS__})

inline Writer sample() {
    Writer w;
    w.metadata = {{"format", "pt"}, {"note", "quern test \"quoted\""}};
    w.add<float>("model.layers.0.w", "F32", {2, 3}, {1, 2, 3, 4, 5, 6});
    w.add<uint16_t>("bf", "BF16", {4}, {0x3f80, 0x4000, 0xbf80, 0x0000});   // 1, 2, -1, 0
    w.add<uint16_t>("h", "F16", {2, 1, 2}, {0x3c00, 0x4000, 0xc000, 0x7c00});  // 1, 2, -2, inf
    w.add<double>("d", "F64", {}, {3.5});                                     // a scalar
    w.add<uint8_t>("e4m3", "F8_E4M3", {2, 2}, {0x38, 0x40, 0xb8, 0x7e});
    w.add<uint8_t>("e5m2", "F8_E5M2", {3}, {0x3c, 0x40, 0x7c});
    w.add<int64_t>("i64", "I64", {2}, {-1, 1LL << 40});
    w.add<int32_t>("i32", "I32", {1, 1, 1, 2}, {-7, 9});
    w.add<int16_t>("i16", "I16", {3}, {-300, 0, 300});
    w.add<int8_t>("i8", "I8", {2}, {-128, 127});
    w.add<uint8_t>("u8", "U8", {2, 2}, {0, 1, 254, 255});
    w.add<uint8_t>("mask", "BOOL", {3}, {1, 0, 1});
    w.add<float>("empty", "F32", {0, 5}, {});
    w.add<uint16_t>("conv", "BF16", {1, 2, 1, 1, 2}, {1, 2, 3, 4});  // rank 5
    w.data_order = {13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0};     // data in reverse of header order
    return w;
}

struct Sharded {
    std::string dir;
    Writer a, b;
};

inline Sharded write_sharded(const std::string& name, const std::optional<std::string>& index_override = std::nullopt) {
    Sharded s;
    s.dir = temp_path(name);
    s.a.metadata = {{"format", "pt"}};
    s.a.add<float>("embed.weight", "F32", {2, 2}, {1, 2, 3, 4});
    s.a.add<uint16_t>("layers.0.w", "BF16", {3}, {0x3f80, 0x4000, 0x4040});
    s.b.metadata = {{"format", "pt"}};
    s.b.add<float>("layers.1.w", "F32", {1, 2}, {5, 6});
    s.b.add<uint8_t>("lm_head.weight", "F8_E4M3", {2, 1}, {0x38, 0x40});
    write_bytes(s.dir + "/model-00001-of-00002.safetensors", s.a.build());
    write_bytes(s.dir + "/model-00002-of-00002.safetensors", s.b.build());
    const std::string index = !index_override ? R"({
        "metadata": {"total_size": 32},
        "weight_map": {
            "embed.weight": "model-00001-of-00002.safetensors",
            "layers.0.w": "model-00001-of-00002.safetensors",
            "layers.1.w": "model-00002-of-00002.safetensors",
            "lm_head.weight": "model-00002-of-00002.safetensors"
        }})"
                                              : *index_override;
    write_text(s.dir + "/model.safetensors.index.json", index);
    return s;
}

}  // namespace st_test
