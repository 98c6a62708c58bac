// GGUF reader/writer tests: round trip, a malformed-file suite, a seeded
// mutation test, interop with the reference Python `gguf` package, the real
// default model, and the inspect report.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/gguf_inspect.h"

using namespace quern;
namespace fs = std::filesystem;

namespace {

// ---------------------------------------------------------------- helpers

fs::path temp_dir() {
    static const fs::path dir = [] {
        fs::path d = fs::temp_directory_path() / ("quern_gguf_test_" + std::to_string(::getpid()));
        fs::create_directories(d);
        return d;
    }();
    return dir;
}

// Removes the temporary directory when the test program ends.
class TempDirCleanup : public testing::Environment {
public:
    void TearDown() override {
        std::error_code ec;
        fs::remove_all(temp_dir(), ec);
    }
};
[[maybe_unused]] testing::Environment* const kCleanup = testing::AddGlobalTestEnvironment(new TempDirCleanup);

std::string temp_path(const std::string& name) { return (temp_dir() / name).string(); }

void write_bytes(const std::string& path, const std::vector<uint8_t>& b, size_t n = SIZE_MAX) {
    // Remove rather than truncate: ext4 flushes a file rewritten through
    // O_TRUNC on close (auto_da_alloc), which makes thousands of rewrites slow.
    std::error_code ec;
    fs::remove(path, ec);
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(std::min(n, b.size())));
    ASSERT_TRUE(f.good()) << path;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// Builds raw GGUF bytes field by field, for malformed files.
struct Raw {
    std::vector<uint8_t> b;
    Raw& bytes(const void* p, size_t n) {
        const auto* c = static_cast<const uint8_t*>(p);
        b.insert(b.end(), c, c + n);
        return *this;
    }
    Raw& u8(uint8_t v) { return bytes(&v, 1); }
    Raw& u32(uint32_t v) { return bytes(&v, 4); }
    Raw& u64(uint64_t v) { return bytes(&v, 8); }
    Raw& str(std::string_view s) { return u64(s.size()).bytes(s.data(), s.size()); }
    Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
        return bytes("GGUF", 4).u32(version).u64(n_tensors).u64(n_kv);
    }
    Raw& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(4).u32(v); }
    Raw& tensor(std::string_view name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
        str(name).u32(static_cast<uint32_t>(ne.size()));
        for (uint64_t x : ne) u64(x);
        return u32(type).u64(offset);
    }
    Raw& pad(size_t a) {
        while (b.size() % a) u8(0);
        return *this;
    }
    Raw& zeros(size_t n) {
        b.insert(b.end(), n, 0);
        return *this;
    }
    size_t size() const { return b.size(); }
};

/// Loads bytes as a GGUF file; returns the quern::Error message, or "" if it
/// loaded. Any other exception fails the test.
std::string load_error(const std::vector<uint8_t>& bytes, const std::string& name = "m.gguf") {
    const std::string path = temp_path(name);
    write_bytes(path, bytes);
    try {
        GgufFile f(path);
        return "";
    } catch (const Error& e) {
        return e.what();
    }
}

#define EXPECT_GGUF_ERROR(bytes, ...)                                                   \
    do {                                                                                \
        const std::string msg_ = load_error(bytes);                                     \
        EXPECT_FALSE(msg_.empty()) << "expected an error";                             \
        for (const char* s_ : {__VA_ARGS__}) EXPECT_NE(msg_.find(s_), std::string::npos) \
            << "message lacks \"" << s_ << "\": " << msg_;                              \
    } while (0)

// A file with every metadata type and tensors of several types.
struct SampleTensor {
    std::string name;
    DType type;
    std::array<int64_t, 4> ne;
    int n_dims;
    std::vector<uint8_t> bytes;
};
struct Sample {
    std::vector<GgufKV> kv;
    std::vector<SampleTensor> tensors;
    uint32_t alignment = 32;
};

GgufValue u(GgufType t, uint64_t v) { return gguf_uint(t, v); }
GgufValue i(GgufType t, int64_t v) { return gguf_int(t, v); }
GgufValue f32(float v) { return gguf_float(GgufType::FLOAT32, v); }
GgufValue str(std::string s) { return gguf_string(std::move(s)); }

Sample make_sample(uint32_t alignment = 32, uint32_t seed = 1, int n_tokens = 40) {
    using T = GgufType;
    Sample s;
    s.alignment = alignment;
    std::vector<GgufValue> tokens;
    for (int k = 0; k < n_tokens; ++k) tokens.push_back(str(k % 7 == 3 ? "" : "tok" + std::to_string(k) + "\xc4\xa0"));
    s.kv = {
        {"general.architecture", str("llama")},
        {"test.u8", u(T::UINT8, 255)},
        {"test.i8", i(T::INT8, -128)},
        {"test.u16", u(T::UINT16, 65535)},
        {"test.i16", i(T::INT16, -32768)},
        {"test.u32", u(T::UINT32, 4294967295u)},
        {"test.i32", i(T::INT32, std::numeric_limits<int32_t>::min())},
        {"test.f32", f32(1.5f)},
        {"test.f32.eps", f32(1e-5f)},
        {"test.u64", u(T::UINT64, std::numeric_limits<uint64_t>::max())},
        {"test.i64", i(T::INT64, std::numeric_limits<int64_t>::min())},
        {"test.f64", gguf_float(T::FLOAT64, 0.1)},
        {"test.bool.true", gguf_bool(true)},
        {"test.bool.false", gguf_bool(false)},
        {"test.str", str("h\xc3\xa9llo \xe2\x9c\x93\n\"quoted\"\\")},
        {"test.str.empty", str("")},
        {"test.arr.empty", gguf_array(T::INT32, {})},
        {"test.arr.strings", gguf_array(T::STRING, tokens)},
        {"test.arr.empty_strings", gguf_array(T::STRING, {str(""), str(""), str("x")})},
        {"test.arr.u8", gguf_array(T::UINT8, {u(T::UINT8, 0), u(T::UINT8, 255)})},
        {"test.arr.i16", gguf_array(T::INT16, {i(T::INT16, -5), i(T::INT16, 7)})},
        {"test.arr.u32", gguf_array(T::UINT32, {u(T::UINT32, 1), u(T::UINT32, 2), u(T::UINT32, 3)})},
        {"test.arr.f32", gguf_array(T::FLOAT32, {f32(0.5f), f32(-2.25f)})},
        {"test.arr.f64", gguf_array(T::FLOAT64, {gguf_float(T::FLOAT64, 1e300)})},
        {"test.arr.bool", gguf_array(T::BOOL, {gguf_bool(true), gguf_bool(false)})},
        {"test.arr.u64", gguf_array(T::UINT64, {u(T::UINT64, 1ull << 63)})},
        {"test.arr.i64", gguf_array(T::INT64, {i(T::INT64, -1)})},
        {"test.arr.nested",
         gguf_array(T::ARRAY, {gguf_array(T::INT32, {i(T::INT32, 1), i(T::INT32, 2), i(T::INT32, 3)}),
                               gguf_array(T::INT32, {}), gguf_array(T::STRING, {str("a"), str("")}),
                               gguf_array(T::ARRAY, {gguf_array(T::FLOAT32, {f32(3.5f)})})})},
        {"test.arr.nested_empty", gguf_array(T::ARRAY, {})},
    };
    if (alignment != 32) s.kv.push_back({"general.alignment", u(T::UINT32, alignment)});
    std::mt19937 rng(seed);
    auto add = [&](std::string name, DType type, std::array<int64_t, 4> ne, int n_dims) {
        SampleTensor t{std::move(name), type, ne, n_dims, {}};
        t.bytes.resize(row_size(type, ne[0]) * static_cast<size_t>(ne[1] * ne[2] * ne[3]));
        for (auto& x : t.bytes) x = static_cast<uint8_t>(rng());
        s.tensors.push_back(std::move(t));
    };
    add("tok.f32", DType::F32, {7, 1, 1, 1}, 1);
    add("w.f16", DType::F16, {3, 5, 1, 1}, 2);
    add("w.q4_k", DType::Q4_K, {256, 2, 1, 1}, 2);
    add("w.q8_0", DType::Q8_0, {64, 3, 2, 1}, 3);
    add("w.i8", DType::I8, {5, 1, 1, 2}, 4);
    add("empty.f32", DType::F32, {0, 1, 1, 1}, 1);
    return s;
}

void write_sample(const Sample& s, const std::string& path,
                  const std::function<void(uint64_t, uint64_t)>& progress = {}) {
    GgufWriter w;
    for (const auto& kv : s.kv) {
        if (kv.key == "general.alignment") continue;
        w.set(kv.key, kv.value);
    }
    if (s.alignment != 32) w.set_alignment(s.alignment);
    for (const auto& t : s.tensors) w.add_tensor(t.name, t.type, t.ne, t.n_dims, t.bytes.data());
    w.write(path, progress);
}

/// End of the furthest tensor data: a file cut anywhere before it must fail.
uint64_t data_end(const GgufFile& f) {
    uint64_t end = 0;
    for (const auto& t : f.tensors()) end = std::max(end, t.offset + t.nbytes);
    return end;
}

bool python_gguf_available() {
    static const bool ok = std::system("python3 -c 'import gguf, numpy' >/dev/null 2>&1") == 0;
    return ok;
}

}  // namespace

// ---------------------------------------------------------------- values

TEST(GgufValue, ToStringAndAccessors) {
    using T = GgufType;
    EXPECT_EQ(gguf_array(T::STRING, {str("a"), str("b"), str("c")}).to_string(2), R"([3 strings: "a", "b", ...])");
    EXPECT_EQ(gguf_array(T::INT32, {i(T::INT32, 1), i(T::INT32, -2)}).to_string(), "[1, -2]");
    EXPECT_EQ(gguf_array(T::ARRAY, {gguf_array(T::UINT8, {})}).to_string(), "[[]]");
    EXPECT_EQ(f32(1e-5f).to_string(), "1e-05");
    EXPECT_EQ(str("a\n\"b\"").to_string(), R"("a\n\"b\"")");
    EXPECT_EQ(gguf_bool(true).to_string(), "true");
    EXPECT_EQ(gguf_value_type_string(gguf_array(T::ARRAY, {gguf_array(T::INT32, {})})), "array[array[int32]]");
    EXPECT_EQ(u(T::UINT32, 7).as_int(), 7);
    EXPECT_EQ(i(T::INT8, -3).as_double(), -3.0);
    EXPECT_THROW(u(T::UINT64, 1ull << 63).as_int(), Error);
    EXPECT_THROW(str("x").as_int(), Error);
    EXPECT_THROW(u(T::UINT8, 1).as_string(), Error);
    EXPECT_THROW(str("x").as_array(), Error);
    EXPECT_THROW(str("x").as_bool(), Error);
    EXPECT_TRUE(f32(1.0f).is_float());
    EXPECT_FALSE(f32(1.0f).is_integer());
}

// ---------------------------------------------------------------- round trip

TEST(Gguf, RoundTripEveryTypeAndAlignment) {
    for (uint32_t alignment : {32u, 64u, 1u, 4096u}) {
        SCOPED_TRACE(alignment);
        const Sample s = make_sample(alignment);
        const std::string path = temp_path("roundtrip.gguf");
        std::vector<std::pair<uint64_t, uint64_t>> calls;
        write_sample(s, path, [&](uint64_t done, uint64_t total) { calls.emplace_back(done, total); });

        GgufFile f(path);
        EXPECT_EQ(f.version(), 3u);
        EXPECT_EQ(f.alignment(), alignment);
        EXPECT_EQ(f.data_offset() % alignment, 0u);
        ASSERT_FALSE(calls.empty());
        for (size_t k = 1; k < calls.size(); ++k) EXPECT_GE(calls[k].first, calls[k - 1].first);
        EXPECT_EQ(calls.back().first, f.file_size());
        EXPECT_EQ(calls.back().second, f.file_size());

        // Metadata: same keys, same order, same values (general.alignment last).
        ASSERT_EQ(f.metadata().size(), s.kv.size());
        for (size_t k = 0; k < s.kv.size(); ++k) {
            EXPECT_EQ(f.metadata()[k].key, s.kv[k].key);
            EXPECT_TRUE(f.metadata()[k].value == s.kv[k].value)
                << s.kv[k].key << ": " << f.metadata()[k].value.to_string() << " vs " << s.kv[k].value.to_string();
            EXPECT_EQ(f.find(s.kv[k].key), &f.metadata()[k].value);
        }

        ASSERT_EQ(f.tensors().size(), s.tensors.size());
        for (size_t k = 0; k < s.tensors.size(); ++k) {
            const auto& want = s.tensors[k];
            const auto& got = f.tensors()[k];
            SCOPED_TRACE(want.name);
            EXPECT_EQ(got.name, want.name);
            EXPECT_EQ(got.type, want.type);
            EXPECT_EQ(got.n_dims, want.n_dims);
            EXPECT_EQ(got.ne, want.ne);
            EXPECT_EQ(got.nbytes, want.bytes.size());
            EXPECT_EQ((got.offset - f.data_offset()) % alignment, 0u);
            if (!want.bytes.empty()) EXPECT_EQ(0, std::memcmp(f.data(got), want.bytes.data(), want.bytes.size()));
            EXPECT_EQ(f.find_tensor(want.name), &got);
            const Tensor v = f.tensor_view(got);
            EXPECT_EQ(v.nbytes(), want.bytes.size());
            EXPECT_EQ(v.data, f.data(got));
            EXPECT_EQ(v.name, want.name);
        }
        EXPECT_EQ(f.find("nope"), nullptr);
        EXPECT_EQ(f.find_tensor("nope"), nullptr);
        // The file ends with the last tensor's padding, as ggml expects.
        EXPECT_EQ(f.file_size() % alignment, 0u);
    }
}

TEST(Gguf, Getters) {
    const std::string path = temp_path("getters.gguf");
    write_sample(make_sample(), path);
    GgufFile f(path);
    EXPECT_EQ(f.get_int("test.u32"), 4294967295);
    EXPECT_EQ(f.get_int("test.i8"), -128);
    EXPECT_EQ(f.get_int("missing", 42), 42);
    EXPECT_DOUBLE_EQ(f.get_float("test.f32"), 1.5);
    EXPECT_DOUBLE_EQ(f.get_float("test.u8"), 255.0);
    EXPECT_DOUBLE_EQ(f.get_float("missing", 2.5), 2.5);
    EXPECT_TRUE(f.get_bool("test.bool.true", false));
    EXPECT_TRUE(f.get_bool("missing", true));
    EXPECT_EQ(f.get_string("general.architecture"), "llama");
    EXPECT_EQ(f.get_string("missing", "dflt"), "dflt");
    EXPECT_EQ(f.get_string_array("test.arr.strings").size(), 40u);
    EXPECT_EQ(f.get_float_array("test.arr.f32"), (std::vector<float>{0.5f, -2.25f}));
    EXPECT_EQ(f.get_int_array("test.arr.u32"), (std::vector<int64_t>{1, 2, 3}));
    EXPECT_TRUE(f.get_int_array("test.arr.empty").empty());

    auto expect_msg = [](auto&& fn, std::vector<std::string> subs) {
        try {
            fn();
            ADD_FAILURE() << "no error";
        } catch (const Error& e) {
            for (const auto& s : subs) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
        }
    };
    expect_msg([&] { f.get_int("missing.key"); }, {"missing key 'missing.key'", "getters.gguf"});
    expect_msg([&] { f.get_int("test.str"); }, {"key 'test.str'", "string", "integer"});
    expect_msg([&] { f.get_int("test.u64"); }, {"key 'test.u64'", "does not fit"});
    expect_msg([&] { f.get_string("test.u8"); }, {"key 'test.u8'", "uint8"});
    expect_msg([&] { f.get_bool("test.u8", false); }, {"key 'test.u8'", "bool"});
    expect_msg([&] { f.get_string_array("test.arr.u32"); }, {"key 'test.arr.u32'", "array[uint32]"});
    expect_msg([&] { f.get_int_array("test.arr.f32"); }, {"key 'test.arr.f32'"});
    expect_msg([&] { f.get_float_array("test.arr.strings"); }, {"key 'test.arr.strings'"});
    expect_msg([&] { f.get_float("test.arr.u8"); }, {"key 'test.arr.u8'", "number"});
}

// Tensors whose bytes are made while the file is written (one at a time):
// read back as filled; a fill that throws leaves no file behind.
TEST(GgufWriter, TensorsFilledWhileWriting) {
    const fs::path path = temp_dir() / "filled.gguf";
    GgufWriter w;
    std::vector<float> plain = {1, 2, 3, 4};
    w.add_tensor("plain", DType::F32, {4, 1, 1, 1}, 1, plain.data());
    w.add_tensor("filled", DType::F32, {3, 2, 1, 1}, 2, [](uint8_t* out) {
        for (int k = 0; k < 6; ++k) {
            const float v = 10.0f + static_cast<float>(k);
            std::memcpy(out + 4 * k, &v, 4);
        }
    });
    w.write(path.string());
    GgufFile f(path.string());
    const GgufTensorInfo* t = f.find_tensor("filled");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->nbytes, 24u);
    for (int k = 0; k < 6; ++k) {
        float v;
        std::memcpy(&v, f.data(*t) + 4 * k, 4);
        EXPECT_EQ(v, 10.0f + static_cast<float>(k));
    }
    EXPECT_EQ(0, std::memcmp(f.data(*f.find_tensor("plain")), plain.data(), 16));
    GgufWriter bad;
    bad.add_tensor("x", DType::F32, {4, 1, 1, 1}, 1, [](uint8_t*) { throw Error("no bytes today"); });
    const fs::path gone = temp_dir() / "gone.gguf";
    EXPECT_THROW(bad.write(gone.string()), Error);
    EXPECT_FALSE(fs::exists(gone));
}

TEST(GgufWriter, RejectsBadInput) {
    using T = GgufType;
    GgufWriter w;
    w.set_u32("a", 1);
    EXPECT_THROW(w.set_u32("a", 2), Error);
    EXPECT_THROW(w.set_u32("", 2), Error);
    EXPECT_THROW(w.set("b", u(T::UINT8, 300)), Error);
    EXPECT_THROW(w.set("b", i(T::UINT32, -1)), Error);
    EXPECT_THROW(w.set("b", i(T::INT8, 128)), Error);
    EXPECT_THROW(w.set("b", gguf_array(T::INT32, {u(T::UINT32, 1)})), Error);
    EXPECT_THROW(w.set("b", GgufValue{T::STRING, uint64_t{1}}), Error);
    EXPECT_THROW(w.set("b", GgufValue{static_cast<T>(13), uint64_t{1}}), Error);
    EXPECT_THROW(w.set("general.alignment", u(T::UINT32, 48)), Error);
    GgufValue deep = gguf_array(T::INT32, {});
    for (int d = 0; d < kGgufMaxArrayDepth; ++d) deep = gguf_array(T::ARRAY, {deep});
    EXPECT_THROW(w.set("deep", deep), Error);
    EXPECT_THROW(w.set_alignment(0), Error);
    EXPECT_THROW(w.set_alignment(24), Error);
    const float data[64] = {};
    w.add_tensor("t", DType::F32, {4, 1, 1, 1}, 1, data);
    EXPECT_THROW(w.add_tensor("t", DType::F32, {4, 1, 1, 1}, 1, data), Error);
    EXPECT_THROW(w.add_tensor("", DType::F32, {4, 1, 1, 1}, 1, data), Error);
    EXPECT_THROW(w.add_tensor("u", DType::F32, {4, 1, 1, 1}, 0, data), Error);
    EXPECT_THROW(w.add_tensor("u", DType::F32, {4, 1, 1, 1}, 5, data), Error);
    EXPECT_THROW(w.add_tensor("u", DType::F32, {4, 2, 1, 1}, 1, data), Error);
    EXPECT_THROW(w.add_tensor("u", DType::F32, {-4, 1, 1, 1}, 1, data), Error);
    EXPECT_THROW(w.add_tensor("u", DType::Q8_0, {33, 1, 1, 1}, 1, data), Error);
    EXPECT_THROW(w.add_tensor("u", DType::F32, {1ll << 62, 4, 1, 1}, 2, data), Error);
    EXPECT_THROW(w.add_tensor("u", DType::F32, {4, 1, 1, 1}, 1, nullptr), Error);
    EXPECT_THROW(w.write(temp_path("no/such/dir/x.gguf")), Error);
    // Replacing the alignment is allowed; the last value wins.
    w.set_alignment(64);
    w.set_alignment(128);
    const std::string path = temp_path("writer.gguf");
    w.write(path);
    GgufFile f(path);
    EXPECT_EQ(f.alignment(), 128u);
    EXPECT_EQ(f.metadata().size(), 2u);
}

TEST(Gguf, ReadsVersion2) {
    Raw r;
    r.header(1, 1, 2).kv_u32("a", 7).tensor("t", {4}, 0, 0).pad(32).zeros(16);
    EXPECT_EQ(load_error(r.b), "");
    GgufFile f(temp_path("m.gguf"));
    EXPECT_EQ(f.version(), 2u);
    EXPECT_EQ(f.get_int("a"), 7);
    EXPECT_EQ(f.tensors()[0].nbytes, 16u);
}

TEST(Gguf, LargeVocabIsFast) {
    // A tokenizer-sized file: 49,152 tokens, as many merges, token types.
    GgufWriter w;
    std::vector<std::string> tokens, merges;
    std::vector<int32_t> types;
    for (int k = 0; k < 49152; ++k) {
        tokens.push_back("token_" + std::to_string(k * 7919 % 100000));
        merges.push_back("a" + std::to_string(k) + " b");
        types.push_back(k % 5 ? 1 : 3);
    }
    w.set_string_array("tokenizer.ggml.tokens", tokens);
    w.set_string_array("tokenizer.ggml.merges", merges);
    w.set_i32_array("tokenizer.ggml.token_type", types);
    const std::string path = temp_path("vocab.gguf");
    w.write(path);
    double best_ms = 1e9;
    for (int rep = 0; rep < 3; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        GgufFile f(path);
        const auto t1 = std::chrono::steady_clock::now();
        best_ms = std::min(best_ms, std::chrono::duration<double, std::milli>(t1 - t0).count());
        ASSERT_EQ(f.get_string_array("tokenizer.ggml.tokens"), tokens);
    }
    std::printf("open with 2 x 49152 strings + 49152 ints: %.2f ms\n", best_ms);
#ifdef NDEBUG
    EXPECT_LT(best_ms, 100.0);
#endif
}

// ---------------------------------------------------------------- malformed files

TEST(GgufMalformed, TruncatedAtEveryLength) {
    const std::string full_path = temp_path("full.gguf");
    write_sample(make_sample(32, 7, 12), full_path);
    const std::vector<uint8_t> full = read_bytes(full_path);
    const uint64_t need = data_end(GgufFile(full_path));
    const std::string path = temp_path("trunc.gguf");
    int failures = 0;
    for (size_t n = 0; n <= full.size(); ++n) {
        write_bytes(path, full, n);
        try {
            GgufFile f(path);
            if (n < need) ADD_FAILURE() << "a file cut to " << n << " of " << full.size() << " bytes loaded";
        } catch (const Error& e) {
            if (n >= need) ADD_FAILURE() << "cut to " << n << " bytes: " << e.what();
            const std::string m = e.what();
            if (m.find("trunc.gguf") == std::string::npos && ++failures < 5) ADD_FAILURE() << "no path: " << m;
        }
    }
}

TEST(GgufMalformed, HeaderErrors) {
    EXPECT_GGUF_ERROR({}, "m.gguf", "only 0 bytes");
    EXPECT_GGUF_ERROR(Raw().bytes("GG", 2).b, "only 2 bytes");
    EXPECT_GGUF_ERROR(Raw().bytes("GGML", 4).u32(3).u64(0).u64(0).b, "bad magic 47 47 4d 4c", "byte 0");
    EXPECT_GGUF_ERROR(Raw().header(0, 0, 1).b, "version 1", "not supported");
    EXPECT_GGUF_ERROR(Raw().header(0, 0, 4).b, "version 4", "only versions 2 and 3");
    EXPECT_GGUF_ERROR(Raw().header(0, 0, 0x03000000).b, "big-endian");
    EXPECT_GGUF_ERROR(Raw().bytes("GGUF", 4).u32(3).u32(0).b, "truncated", "tensor count");
    EXPECT_GGUF_ERROR(Raw().header(0, 1ull << 60).b, "metadata count 1152921504606846976");
    EXPECT_GGUF_ERROR(Raw().header(1ull << 60, 0).b, "tensor count 1152921504606846976");
    EXPECT_GGUF_ERROR(Raw().header(~0ull, ~0ull).b, "count 18446744073709551615");
    // The tensor count is checked again against what is left after the metadata.
    EXPECT_GGUF_ERROR(Raw().header(2, 1).str("k").u32(8).str(std::string(60, 'x')).b, "tensor count 2",
                      "after the metadata");
    // A missing file is an error too.
    EXPECT_THROW(GgufFile(temp_path("does-not-exist.gguf")), Error);
}

TEST(GgufMalformed, MetadataErrors) {
    using T = GgufType;
    // Key at byte 24; its type at 33; its value at 37.
    EXPECT_GGUF_ERROR(Raw().header(0, 1).str("").u32(4).u32(1).b, "metadata entry 0 of 1 (at byte 24)", "empty key");
    EXPECT_GGUF_ERROR(Raw().header(0, 1).u64(1ull << 63).zeros(16).b, "key length 9223372036854775808 (at byte 24)",
                      "exceeds");
    EXPECT_GGUF_ERROR(Raw().header(0, 1).str(std::string(70000, 'k')).u32(4).u32(1).b, "key length 70000");
    EXPECT_GGUF_ERROR(Raw().header(0, 1).str("k").u32(8).u64(1ull << 63).b, "key 'k' (at byte 24)",
                      "string value length 9223372036854775808 (at byte 37)");
    EXPECT_GGUF_ERROR(Raw().header(0, 1).str("arr").u32(9).u32(0).u64(1ull << 60).b, "key 'arr'",
                      "array of 1152921504606846976 uint8 values (at byte 39)");
    EXPECT_GGUF_ERROR(Raw().header(0, 1).str("arr").u32(9).u32(8).u64(~0ull).u64(0).b,
                      "array of 18446744073709551615 strings");
    EXPECT_GGUF_ERROR(Raw().header(0, 1).str("arr").u32(9).u32(9).u64(1ull << 40).b, "array of 1099511627776 arrays");
    EXPECT_GGUF_ERROR(Raw().header(0, 1).str("k").u32(13).u32(0).b, "key 'k'", "unknown value type 13 (at byte 33)");
    EXPECT_GGUF_ERROR(Raw().header(0, 1).str("k").u32(~0u).u32(0).b, "unknown value type 4294967295");
    EXPECT_GGUF_ERROR(Raw().header(0, 1).str("k").u32(9).u32(77).u64(1).u32(0).b,
                      "unknown array element type 77 (at byte 37)");
    EXPECT_GGUF_ERROR(Raw().header(0, 1).str("k").u32(7).u8(2).b, "key 'k'", "bool value 2");
    EXPECT_GGUF_ERROR(Raw().header(0, 1).str("k").u32(4).u8(1).b, "key 'k'", "truncated", "uint32 value");
    EXPECT_GGUF_ERROR(Raw().header(0, 2).kv_u32("a", 1).kv_u32("a", 2).b, "key 'a' (at byte 41)", "duplicate key",
                      "first defined at byte 24");
    // A control character in a key is escaped in the message.
    EXPECT_GGUF_ERROR(Raw().header(0, 2).kv_u32("a\n", 1).kv_u32("a\n", 2).b, "key 'a\\x0a'");

    // Nesting: kGgufMaxArrayDepth levels load, one more does not.
    auto nested = [](int depth) {
        Raw r;
        r.header(0, 1).str("deep").u32(9);
        for (int d = 1; d < depth; ++d) r.u32(9).u64(1);
        r.u32(5).u64(0);
        return r.b;
    };
    EXPECT_EQ(load_error(nested(kGgufMaxArrayDepth)), "");
    EXPECT_GGUF_ERROR(nested(kGgufMaxArrayDepth + 1), "key 'deep'", "nested more than 16 deep");
    EXPECT_GGUF_ERROR(nested(100000), "nested more than 16 deep");
    (void)T::UINT8;
}

TEST(GgufMalformed, AlignmentErrors) {
    for (uint32_t a : {0u, 3u, 48u, 0x80000001u}) {
        SCOPED_TRACE(a);
        EXPECT_GGUF_ERROR(Raw().header(0, 1).kv_u32("general.alignment", a).b, "key 'general.alignment' (at byte 24)",
                          "not a nonzero power of two");
    }
    EXPECT_GGUF_ERROR(Raw().header(0, 1).str("general.alignment").u32(8).str("32").b, "general.alignment",
                      "must be a uint32, found string");
    EXPECT_GGUF_ERROR(Raw().header(0, 1).str("general.alignment").u32(10).u64(32).b, "found uint64");
    // A tensor offset that is not a multiple of the (custom) alignment.
    Raw r;
    r.header(1, 1).kv_u32("general.alignment", 64);
    const size_t info_at = r.size();
    r.tensor("t", {4}, 0, 32).pad(64).zeros(128);
    const std::string where = fmt::format("tensor 't' (info at byte {})", info_at);
    EXPECT_GGUF_ERROR(r.b, where.c_str(), "data offset 32", "not a multiple of the alignment 64");
}

TEST(GgufMalformed, TensorInfoErrors) {
    // Every file here has one tensor whose info starts at byte 24.
    auto one = [](std::vector<uint64_t> ne, uint32_t type, uint64_t offset = 0, size_t data = 64,
                  std::string name = "blk.0.attn_q.weight") {
        Raw r;
        r.header(1, 0).tensor(name, std::move(ne), type, offset).pad(32).zeros(data);
        return r.b;
    };
    EXPECT_EQ(load_error(one({16}, 0)), "");
    EXPECT_EQ(load_error(one({0, 5}, 0)), "");  // empty tensors are fine
    const char* where = "tensor 'blk.0.attn_q.weight' (info at byte 24)";
    EXPECT_GGUF_ERROR(one({}, 0), where, "n_dims 0", "out of range 1..4");
    EXPECT_GGUF_ERROR(one({1, 1, 1, 1, 1}, 0), where, "n_dims 5");
    EXPECT_GGUF_ERROR(one({static_cast<uint64_t>(-4)}, 0), where, "ne[0] = -4", "negative");
    EXPECT_GGUF_ERROR(one({4, 1ull << 63}, 0), where, "ne[1] = -9223372036854775808", "negative");
    EXPECT_GGUF_ERROR(one({1ull << 62, 4}, 0), where, "shape [4611686018427387904, 4]", "more elements than fit");
    EXPECT_GGUF_ERROR(one({0, 1ull << 62, 4}, 0), where, "more elements than fit");
    EXPECT_GGUF_ERROR(one({1ull << 62}, 28), where, "F64", "overflows 64 bits");
    EXPECT_GGUF_ERROR(one({16}, 99), where, "unknown tensor type id 99");
    EXPECT_GGUF_ERROR(one({16}, 4), where, "unknown tensor type id 4");  // Q4_2, removed from ggml
    EXPECT_GGUF_ERROR(one({33}, 8), where, "ne[0] = 33", "Q8_0 block size 32");
    EXPECT_GGUF_ERROR(one({16}, 0, 8), where, "data offset 8", "alignment 32");
    EXPECT_GGUF_ERROR(one({17}, 0), where, "data [96, 164) extends past end of file (size 160)");
    EXPECT_GGUF_ERROR(one({16}, 0, 64), where, "data [160, 224) extends past end of file (size 160)");
    EXPECT_GGUF_ERROR(one({16}, 0, ~uint64_t{31}), where, "overflows 64 bits");
    EXPECT_GGUF_ERROR(one({16}, 0, 0, 64, ""), "tensor info 0 of 1 (at byte 24)", "empty tensor name");
    Raw r;
    r.header(1, 0).str("tensor_name_long").u32(1).u64(4);  // the type and offset are missing
    EXPECT_GGUF_ERROR(r.b, "tensor 'tensor_name_long' (info at byte 24)", "truncated", "tensor type");
    EXPECT_GGUF_ERROR(Raw().header(1, 0).u64(1ull << 62).zeros(40).b, "tensor info 0 of 1",
                      "tensor name length 4611686018427387904");
}

TEST(GgufMalformed, DuplicateAndOverlappingTensors) {
    Raw dup;
    dup.header(2, 0).tensor("w", {8}, 0, 0);
    const size_t second = dup.size();
    dup.tensor("w", {8}, 0, 32).pad(32).zeros(64);
    const std::string where = fmt::format("tensor 'w' (info at byte {})", second);
    EXPECT_GGUF_ERROR(dup.b, where.c_str(), "duplicate tensor name", "first defined at byte 24");

    Raw same;
    same.header(2, 0).tensor("a", {8}, 0, 0).tensor("b", {8}, 0, 0).pad(32).zeros(64);
    EXPECT_GGUF_ERROR(same.b, "overlaps", "'a'", "'b'");

    Raw partial;  // a: [0, 64) relative, b: [32, 48)
    partial.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {4}, 0, 32).pad(32).zeros(64);
    EXPECT_GGUF_ERROR(partial.b, "tensor 'b'", "overlaps the data", "of tensor 'a'");

    Raw adjacent;  // touching is fine; order in the file need not follow the data
    adjacent.header(2, 0).tensor("a", {8}, 0, 32).tensor("b", {8}, 0, 0).pad(32).zeros(64);
    EXPECT_EQ(load_error(adjacent.b), "");
}

// ---------------------------------------------------------------- mutation

TEST(GgufMalformed, SeededMutationsNeverCrash) {
    const std::string base_path = temp_path("mut_base.gguf");
    write_sample(make_sample(32, 3, 6), base_path);
    const std::vector<uint8_t> base = read_bytes(base_path);
    const uint64_t header_end = GgufFile(base_path).data_offset();
    const std::string path = temp_path("mut.gguf");
    // QUERN_GGUF_MUTATIONS / QUERN_GGUF_SEED run a longer or different campaign.
    const char* env_n = std::getenv("QUERN_GGUF_MUTATIONS");
    const char* env_seed = std::getenv("QUERN_GGUF_SEED");
    std::mt19937_64 rng(env_seed ? std::strtoull(env_seed, nullptr, 10) : 20240611);
    const uint64_t interesting[] = {0, 1, 2, 3, 4, 5, 8, 9, 12, 13, 31, 32, 33, 255, 256, 0x7fffffff, 0x80000000,
                                    0xffffffff, 1ull << 32, 1ull << 60, 1ull << 62, 1ull << 63, ~0ull, ~0ull - 31};
    int loaded = 0, rejected = 0;
    const int kVariants = env_n ? std::atoi(env_n) : 4000;
    for (int v = 0; v < kVariants; ++v) {
        std::vector<uint8_t> b = base;
        const int n_mut = 1 + static_cast<int>(rng() % 4);
        for (int m = 0; m < n_mut; ++m) {
            // Mostly hit the parsed part (header, metadata, infos).
            const size_t limit = (rng() % 8) ? header_end : b.size();
            const size_t at = static_cast<size_t>(rng() % limit);
            switch (rng() % 5) {
                case 0: b[at] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
                case 1: b[at] = static_cast<uint8_t>(rng()); break;
                case 2: {  // an interesting 4- or 8-byte little-endian value
                    const uint64_t x = interesting[rng() % std::size(interesting)];
                    const size_t w = (rng() % 2) ? 8 : 4;
                    for (size_t k = 0; k < w && at + k < b.size(); ++k) b[at + k] = static_cast<uint8_t>(x >> (8 * k));
                    break;
                }
                case 3: b.erase(b.begin() + static_cast<long>(at), b.begin() + static_cast<long>(std::min(b.size(), at + 1 + rng() % 16))); break;
                default: b.insert(b.begin() + static_cast<long>(at), 1 + rng() % 16, static_cast<uint8_t>(rng())); break;
            }
            if (b.empty()) b.push_back(0);
        }
        write_bytes(path, b);
        try {
            GgufFile f(path);
            ++loaded;
            // Touch everything a caller might: values, views, every data byte.
            size_t sum = 0;
            for (const auto& kv : f.metadata()) sum += kv.value.to_string().size();
            for (const auto& t : f.tensors()) {
                const Tensor view = f.tensor_view(t);
                sum += view.nbytes();
                for (uint64_t k = 0; k < t.nbytes; ++k) sum += f.data(t)[k];
            }
            sum += gguf_inspect_text(f).size();
            EXPECT_GT(sum, 0u);
        } catch (const Error& e) {
            ++rejected;
            ASSERT_NE(std::string(e.what()).find("mut.gguf"), std::string::npos) << e.what();
        }
    }
    std::printf("mutations: %d loaded, %d rejected\n", loaded, rejected);
    EXPECT_GT(loaded, 0);
    EXPECT_GT(rejected, kVariants / 4);
}

// ---------------------------------------------------------------- interop with the Python gguf package

namespace {

nlohmann::json typed_json(const GgufValue& v) {
    if (v.type == GgufType::ARRAY) {
        const GgufArray& a = v.as_array();
        nlohmann::json items = nlohmann::json::array();
        for (const auto& item : a.items) items.push_back(typed_json(item));
        return {{"type", "array"}, {"elem", gguf_type_name(a.type)}, {"items", items}};
    }
    return {{"type", gguf_type_name(v.type)}, {"value", gguf_value_to_json(v)}};
}

std::string hex(const uint8_t* p, size_t n) {
    std::string s;
    for (size_t k = 0; k < n; ++k) s += fmt::format("{:02x}", p[k]);
    return s;
}

}  // namespace

TEST(GgufInterop, PythonReadsOurFiles) {
    if (!python_gguf_available()) GTEST_SKIP() << "python3 with the gguf package is not installed";
    for (uint32_t alignment : {32u, 64u}) {
        SCOPED_TRACE(alignment);
        const Sample s = make_sample(alignment, 11);
        const std::string path = temp_path(fmt::format("interop{}.gguf", alignment));
        write_sample(s, path);
        GgufFile f(path);
        nlohmann::json want;
        want["alignment"] = alignment;
        want["data_offset"] = f.data_offset();
        want["metadata"] = nlohmann::json::array();
        for (const auto& kv : s.kv) want["metadata"].push_back({{"key", kv.key}, {"value", typed_json(kv.value)}});
        want["tensors"] = nlohmann::json::array();
        for (size_t k = 0; k < s.tensors.size(); ++k) {
            const auto& t = s.tensors[k];
            nlohmann::json ne = nlohmann::json::array();
            for (int d = 0; d < t.n_dims; ++d) ne.push_back(t.ne[d]);
            want["tensors"].push_back({{"name", t.name},
                                       {"type", static_cast<uint32_t>(t.type)},
                                       {"ne", ne},
                                       {"offset", f.tensors()[k].offset},
                                       {"nbytes", t.bytes.size()},
                                       {"data_hex", hex(t.bytes.data(), t.bytes.size())}});
        }
        const std::string json_path = path + ".json";
        std::ofstream(json_path) << want.dump(1);
        const std::string out_path = path + ".out";
        const std::string cmd = fmt::format("python3 '{}/tests/python/gguf_read_check.py' '{}' '{}' > '{}' 2>&1",
                                            QUERN_SOURCE_DIR, path, json_path, out_path);
        const int rc = std::system(cmd.c_str());
        const std::vector<uint8_t> out = read_bytes(out_path);
        EXPECT_EQ(rc, 0) << cmd << "\n" << std::string(out.begin(), out.end());
    }
}

TEST(GgufInterop, WeReadPythonFiles) {
    if (!python_gguf_available()) GTEST_SKIP() << "python3 with the gguf package is not installed";
    const std::string path = temp_path("from_python.gguf");
    const std::string cmd =
        fmt::format("python3 '{}/tests/python/gguf_write_sample.py' '{}'", QUERN_SOURCE_DIR, path);
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

    using T = GgufType;
    GgufFile f(path);
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.alignment(), 64u);
    EXPECT_EQ(f.get_string("general.architecture"), "quern-test");
    auto expect = [&](const char* key, const GgufValue& v) {
        const GgufValue* got = f.find(key);
        ASSERT_NE(got, nullptr) << key;
        EXPECT_TRUE(*got == v) << key << ": " << got->to_string() << " vs " << v.to_string();
    };
    expect("test.u8", u(T::UINT8, 200));
    expect("test.i8", i(T::INT8, -100));
    expect("test.u16", u(T::UINT16, 60000));
    expect("test.i16", i(T::INT16, -30000));
    expect("test.u32", u(T::UINT32, 4000000000u));
    expect("test.i32", i(T::INT32, -2000000000));
    expect("test.f32", f32(0.25f));
    expect("test.u64", u(T::UINT64, std::numeric_limits<uint64_t>::max()));
    expect("test.i64", i(T::INT64, std::numeric_limits<int64_t>::min()));
    expect("test.f64", gguf_float(T::FLOAT64, 3.141592653589793));
    expect("test.bool", gguf_bool(true));
    expect("test.str", str("h\xc3\xa9llo \xe2\x9c\x93"));
    expect("test.strings", gguf_array(T::STRING, {str("a"), str(""), str("ccc")}));
    expect("test.ints", gguf_array(T::INT32, {i(T::INT32, 1), i(T::INT32, -2), i(T::INT32, 3)}));
    expect("test.floats", gguf_array(T::FLOAT32, {f32(0.5f), f32(-1.5f)}));
    expect("test.bools", gguf_array(T::BOOL, {gguf_bool(true), gguf_bool(false)}));
    expect("test.nested", gguf_array(T::ARRAY, {gguf_array(T::INT32, {i(T::INT32, 1), i(T::INT32, 2)}),
                                                gguf_array(T::INT32, {i(T::INT32, 3)})}));

    ASSERT_EQ(f.tensors().size(), 3u);
    const GgufTensorInfo* t = f.find_tensor("t.f32");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, DType::F32);
    EXPECT_EQ(t->n_dims, 2);
    EXPECT_EQ(t->ne, (std::array<int64_t, 4>{3, 2, 1, 1}));
    const float* x = reinterpret_cast<const float*>(f.data(*t));
    for (int k = 0; k < 6; ++k) EXPECT_EQ(x[k], static_cast<float>(k));
    t = f.find_tensor("t.f16");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, DType::F16);
    EXPECT_EQ(t->nbytes, 8u);
    EXPECT_EQ(reinterpret_cast<const uint16_t*>(f.data(*t))[3], 0x4400);  // 4.0 in binary16
    t = f.find_tensor("t.q8_0");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, DType::Q8_0);
    EXPECT_EQ(t->ne, (std::array<int64_t, 4>{32, 2, 1, 1}));
    ASSERT_EQ(t->nbytes, 68u);
    for (int k = 0; k < 68; ++k) EXPECT_EQ(f.data(*t)[k], k % 251);
    for (const auto& ti : f.tensors()) EXPECT_EQ(ti.offset % 64, 0u);
}

// ---------------------------------------------------------------- the real default model

TEST(GgufModel, SmolLM2) {
    const char* home = std::getenv("QUERN_HOME");
    const char* user_home = std::getenv("HOME");
    const fs::path dir = home ? fs::path(home) : fs::path(user_home ? user_home : "/") / ".cache" / "quern";
    const fs::path path = dir / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf";
    if (!fs::exists(path)) GTEST_SKIP() << path << " is absent (bash tools/fetch-model.sh fetches it)";
    const auto t0 = std::chrono::steady_clock::now();
    GgufFile f(path.string());
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("opened %s in %.2f ms\n", path.c_str(), ms);
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.tensors().size(), 272u);
    EXPECT_EQ(f.get_string("general.architecture"), "llama");
    EXPECT_EQ(f.get_int("llama.block_count"), 30);
    EXPECT_EQ(f.get_int("llama.embedding_length"), 576);
    EXPECT_NEAR(f.get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-9);
    const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
    ASSERT_EQ(tokens.size(), 49152u);
    EXPECT_EQ(tokens[0], "<|endoftext|>");
    EXPECT_EQ(tokens[1], "<|im_start|>");
    EXPECT_EQ(f.get_int_array("tokenizer.ggml.token_type").size(), 49152u);
    EXPECT_EQ(f.get_string_array("tokenizer.ggml.merges").size(), 48900u);
    const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
    ASSERT_NE(emb, nullptr);
    EXPECT_EQ(emb->type, DType::Q8_0);
    EXPECT_EQ(emb->ne, (std::array<int64_t, 4>{576, 49152, 1, 1}));
    EXPECT_EQ(emb->offset, f.data_offset());
    const GgufTensorInfo* q = f.find_tensor("blk.0.attn_q.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->type, DType::Q4_1);
    EXPECT_EQ(q->nbytes, 576u / 32u * 20u * 576u);
    EXPECT_EQ(data_end(f), f.file_size());
    const std::string text = gguf_inspect_text(f);
    EXPECT_NE(text.find(R"([49152 strings: "<|endoftext|>", "<|im_start|>", )"), std::string::npos);
    EXPECT_NE(text.find("134515008 parameters"), std::string::npos) << text.substr(text.size() - 600);
}

// ---------------------------------------------------------------- inspect report

TEST(GgufInspect, TextAndJson) {
    const std::string path = temp_path("inspect.gguf");
    write_sample(make_sample(), path);
    GgufFile f(path);
    const std::string text = gguf_inspect_text(f, 3);
    for (const char* s : {"metadata (29 keys)", "test.arr.strings", "array[string]", "[40 strings: \"tok0",
                          "w.q4_k", "Q4_K", "[256, 2]", "288", "tensors (6)", "bits per weight", "[5, 1, 1, 2]"})
        EXPECT_NE(text.find(s), std::string::npos) << s << "\n" << text;

    const nlohmann::json j = gguf_inspect_json(f, 3);
    EXPECT_EQ(j["file"]["version"], 3);
    EXPECT_EQ(j["metadata"].size(), 29u);
    const auto& toks = j["metadata"][17];
    EXPECT_EQ(toks["key"], "test.arr.strings");
    EXPECT_EQ(toks["count"], 40);
    EXPECT_EQ(toks["truncated"], true);
    EXPECT_EQ(toks["value"].size(), 3u);
    EXPECT_EQ(j["tensors"].size(), 6u);
    EXPECT_EQ(j["tensors"][2]["type"], "Q4_K");
    EXPECT_EQ(j["tensors"][2]["bytes"], 288);
    uint64_t params = 0;
    for (const auto& t : f.tensors()) params += static_cast<uint64_t>(t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]);
    EXPECT_EQ(j["totals"]["parameters"], params);
    EXPECT_EQ(j["totals"]["by_type"]["Q8_0"]["tensors"], 1);
    const nlohmann::json full = gguf_inspect_json(f);
    EXPECT_EQ(full["metadata"][17]["value"].size(), 40u);
    EXPECT_FALSE(full["metadata"][17].contains("truncated"));
}
