// Safetensors malformed-input suite: truncation at every byte, header size,
// JSON, fields and types, offsets and coverage, index and shard errors, and
// seeded mutations. Each input must fail with a quern::Error whose message
// names the file and the tensor and says why — never a crash or another
// exception (run under -fsanitize=address,undefined as well).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/safetensors.h"
#include "safetensors_test_util.h"

using namespace quern;
using namespace st_test;

namespace {

TEST(SafetensorsModel, IndexErrors) {
    const std::string shard1 = "model-00001-of-00002.safetensors", shard2 = "model-00002-of-00002.safetensors";
    const auto index_with = [&](const std::string& weight_map) {
        return R"({"metadata": {"total_size": 32}, "weight_map": )" + weight_map + "}";
    };
    const std::string ok_a = R"("embed.weight": ")" + shard1 + R"(", "layers.0.w": ")" + shard1 + R"(")";
    const std::string ok_b = R"("layers.1.w": ")" + shard2 + R"(", "lm_head.weight": ")" + shard2 + R"(")";
    struct Case {
        std::string index;
        std::vector<const char*> parts;
    };
    const std::vector<Case> cases = {
        {index_with("{" + ok_a + R"(, "layers.1.w": "model-00003-of-00003.safetensors", "lm_head.weight": ")" + shard2 +
                    R"("})"),
         {"model-00003-of-00003.safetensors", "does not exist", "layers.1.w"}},
        {index_with("{" + ok_a + ", " + ok_b + R"(, "ghost": ")" + shard2 + R"("})"),
         {"'ghost'", shard2.c_str(), "does not hold it"}},
        {index_with("{" + ok_a + R"(, "layers.1.w": ")" + shard2 + R"("})"),
         {"'lm_head.weight'", "does not list", shard2.c_str()}},
        {index_with(R"({"embed.weight": ")" + shard1 + R"(", "layers.0.w": ")" + shard2 + R"(", )" + ok_b + "}"),
         {"'layers.0.w'", "maps to shard", shard2.c_str()}},
        {index_with("{" + ok_a + ", " + ok_b + ", " + ok_b + "}"), {"'layers.1.w'", "appears twice"}},
        {index_with("{}"), {"lists no tensors"}},
        {index_with("[]"), {"'weight_map' is an array"}},
        {R"({"metadata": {}})", {"missing 'weight_map'"}},
        {"[1, 2]", {"index is an array"}},
        {"{\"weight_map\": {", {"invalid JSON"}},
        {"", {"invalid JSON"}},
        {index_with(R"({"x": 3})"), {"'x'", "is a non-negative integer", "expected a file name"}},
        {index_with(R"({"x": "/etc/passwd"})"), {"'x'", "relative"}},
        {index_with(R"({"x": "../up.safetensors"})"), {"'x'", "without '..'"}},
        {index_with(R"({"x": ""})"), {"'x'", "relative"}},
        {index_with(R"({"": "a.safetensors"})"), {"empty tensor name"}},
        {R"({"metadata": 5, "weight_map": {"x": "a"}})", {"'metadata' is"}},
    };
    for (size_t i = 0; i < cases.size(); ++i) {
        SCOPED_TRACE(cases[i].index);
        const Sharded s = write_sharded("idx" + std::to_string(i), cases[i].index);
        const std::string msg = open_error(s.dir);
        EXPECT_FALSE(msg.empty());
        EXPECT_NE(msg.find("model.safetensors.index.json"), std::string::npos) << msg;
        for (const char* p : cases[i].parts) EXPECT_NE(msg.find(p), std::string::npos) << "lacks " << p << ": " << msg;
    }
    // A truncated shard fails at open, naming the shard.
    const Sharded s = write_sharded("trunc");
    const std::string shard = s.dir + "/" + shard2;
    const std::vector<uint8_t> full = s.b.build();
    write_bytes(shard, full, full.size() - 1);
    EXPECT_ERROR(open_error(s.dir), shard2.c_str(), "'lm_head.weight'", "truncated");
}

// ---------------------------------------------------------------- malformed files

TEST(SafetensorsMalformed, TruncatedAtEveryLength) {
    const std::vector<uint8_t> full = sample().build();
    ASSERT_EQ(load_error(full), "");
    for (size_t n = 0; n < full.size(); ++n) {
        const std::string msg = load_error(std::vector<uint8_t>(full.begin(), full.begin() + static_cast<long>(n)),
                                           "trunc.safetensors");
        ASSERT_FALSE(msg.empty()) << "a file cut to " << n << " of " << full.size() << " bytes loaded";
        EXPECT_NE(msg.find("trunc.safetensors"), std::string::npos) << msg;
        EXPECT_TRUE(msg.find("truncated") != std::string::npos || msg.find("too short") != std::string::npos)
            << "cut to " << n << ": " << msg;
    }
}

TEST(SafetensorsMalformed, HeaderSize) {
    EXPECT_ERROR(load_error({1, 2, 3}), "bad.safetensors", "3 bytes long", "too short");
    std::vector<uint8_t> b = raw_file("{}", {});
    b[0] = 3;  // header size 3 > the 2 bytes left
    EXPECT_ERROR(load_error(b), "header size 3", "runs past the end", "truncated");
    uint64_t huge = kSafetensorsMaxHeader + 1;
    std::memcpy(b.data(), &huge, 8);
    EXPECT_ERROR(load_error(b), "header size 100000001", "exceeds the limit");
    huge = ~0ull;
    std::memcpy(b.data(), &huge, 8);
    EXPECT_ERROR(load_error(b), "exceeds the limit");
    b.assign(8, 0);  // header size 0: empty JSON
    EXPECT_ERROR(load_error(b), "invalid JSON");
}

TEST(SafetensorsMalformed, HeaderJson) {
    EXPECT_ERROR(load_error(raw_file("[]", {})), "header is an array", "expected a JSON object");
    EXPECT_ERROR(load_error(raw_file("\"x\"", {})), "header is a string");
    EXPECT_ERROR(load_error(raw_file("7", {})), "header is a non-negative integer");
    EXPECT_ERROR(load_error(raw_file("{\"a\":", {})), "bad.safetensors", "invalid JSON");
    EXPECT_ERROR(load_error(raw_file(std::string("{}\0\0", 4), {})), "invalid JSON", "NUL byte at offset 2");
    EXPECT_ERROR(load_error(raw_file("{\"\xff\": 1}", {})), "invalid JSON");           // not UTF-8
    EXPECT_ERROR(load_error(raw_file(R"({"a":{"dtype":"U8","shape":[1e400],"data_offsets":[0,1]}})", {1})),
                 "invalid JSON");  // the parser's range error
    EXPECT_ERROR(load_error(raw_file(R"({"a":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,1]}})",
                                     {1})),
                 "tensor 'a'", "shape[0] is the floating-point number");  // 2^64 parses as a double
    EXPECT_ERROR(load_error(raw_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},
                                         "a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
                                     {1})),
                 "key 'a' appears twice");
    EXPECT_ERROR(load_error(raw_file(R"({"a":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}})", {1})),
                 "key 'dtype' appears twice in the entry of 'a'");
    EXPECT_ERROR(load_error(raw_file(R"({"a":{"shape":[[[[[1]]]]]}})", {})), "nested deeper", "'a'");
    EXPECT_ERROR(load_error(raw_file(std::string(100000, '[') + std::string(100000, ']'), {})), "nested deeper");
    std::string long_shape = R"({"a":{"dtype":"U8","shape":[1)";
    for (int i = 0; i < 1024; ++i) long_shape += ",1";
    EXPECT_ERROR(load_error(raw_file(long_shape + R"(],"data_offsets":[0,1]}})", {1})), "an array in 'a'",
                 "more than 1024 items");
    EXPECT_ERROR(load_error(raw_file(R"({"__metadata__": [1]})", {})), "'__metadata__' is an array");
    EXPECT_ERROR(load_error(raw_file(R"({"__metadata__": {"k": 1}})", {})), "'__metadata__' key 'k'",
                 "expected a string");
}

TEST(SafetensorsMalformed, FieldsAndTypes) {
    using J = OJson;
    const auto err = [](const std::function<void(OJson&)>& f) { return header_error(f); };
    EXPECT_ERROR(err([](J& h) { h["w"] = 5; }), "tensor 'w'", "entry is a non-negative integer");
    EXPECT_ERROR(err([](J& h) { h["w"].erase("dtype"); }), "tensor 'w'", "missing 'dtype'");
    EXPECT_ERROR(err([](J& h) { h["w"].erase("shape"); }), "tensor 'w'", "missing 'shape'");
    EXPECT_ERROR(err([](J& h) { h["w"].erase("data_offsets"); }), "tensor 'w'", "missing 'data_offsets'");
    EXPECT_ERROR(err([](J& h) { h["w"]["extra"] = 1; }), "tensor 'w'", "unexpected key 'extra'");
    EXPECT_ERROR(err([](J& h) { h[""] = h["b"]; }), "empty name");
    EXPECT_ERROR(err([](J& h) { h["w"]["dtype"] = 4; }), "tensor 'w'", "'dtype' is");
    EXPECT_ERROR(err([](J& h) { h["w"]["dtype"] = "F4"; }), "tensor 'w'", "unsupported dtype 'F4'",
                 "F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U8, BOOL");
    EXPECT_ERROR(err([](J& h) { h["w"]["dtype"] = "Q4_K"; }), "tensor 'w'", "unknown dtype 'Q4_K'", "BOOL");
    EXPECT_ERROR(err([](J& h) { h["w"]["dtype"] = "f32"; }), "unknown dtype 'f32'");
    EXPECT_ERROR(err([](J& h) { h["w"]["shape"] = "2x3"; }), "tensor 'w'", "'shape' is a string");
    EXPECT_ERROR(err([](J& h) { h["w"]["shape"] = {2, -3}; }), "tensor 'w'", "shape[1] is the negative integer -3");
    EXPECT_ERROR(err([](J& h) { h["w"]["shape"] = {2, 3.0}; }), "tensor 'w'", "shape[1] is the floating-point number");
    EXPECT_ERROR(err([](J& h) { h["w"]["shape"] = {2, "3"}; }), "shape[1] is a string");
    EXPECT_ERROR(err([](J& h) { h["w"]["shape"] = {2, nullptr}; }), "shape[1] is null");
    EXPECT_ERROR(err([](J& h) { h["w"]["shape"] = {1ull << 63}; }), "shape[0] = 9223372036854775808 is larger");
    EXPECT_ERROR(err([](J& h) { h["w"]["shape"] = {1ll << 31, 1ll << 31}; }), "tensor 'w'", "does not fit");
    EXPECT_ERROR(err([](J& h) { h["w"]["shape"] = {0, 1ll << 40, 1ll << 40}; }), "does not fit");  // zero counts as 1
    EXPECT_ERROR(err([](J& h) { h["w"]["shape"] = {1ll << 61}; }), "does not fit");                 // × 4 bytes
    EXPECT_ERROR(err([](J& h) { h["w"]["data_offsets"] = 0; }), "'data_offsets' is");
    EXPECT_ERROR(err([](J& h) { h["w"]["data_offsets"] = {0, 24, 28}; }), "'data_offsets' is an array of 3 items");
    EXPECT_ERROR(err([](J& h) { h["w"]["data_offsets"] = {0}; }), "of 1 items");
    EXPECT_ERROR(err([](J& h) { h["w"]["data_offsets"] = {-1, 24}; }), "data_offsets[0] is the negative integer");
    EXPECT_ERROR(err([](J& h) { h["w"]["data_offsets"] = {0, "24"}; }), "data_offsets[1] is a string");
    EXPECT_ERROR(err([](J& h) { h["w"]["data_offsets"] = {0, 24.5}; }), "data_offsets[1] is the floating-point number");
    EXPECT_ERROR(err([](J& h) { h["w"]["data_offsets"] = {24, 0}; }), "tensor 'w'", "end before they begin");
}

TEST(SafetensorsMalformed, OffsetsAndCoverage) {
    using J = OJson;
    const auto err = [](const std::function<void(OJson&)>& f) { return header_error(f); };
    EXPECT_ERROR(err([](J& h) { h["w"]["data_offsets"] = {0, 20}; }), "tensor 'w'", "span 20 bytes",
                 "shape [2, 3] of F32 takes 24 bytes");
    EXPECT_ERROR(err([](J& h) { h["w"]["shape"] = {3, 3}; }), "tensor 'w'", "span 24 bytes", "36 bytes");
    EXPECT_ERROR(err([](J& h) { h["b"]["data_offsets"] = {26, 30}; }), "tensor 'b'", "run past the end",
                 "28 bytes");
    EXPECT_ERROR(err([](J& h) { h["b"]["data_offsets"] = {~0ull - 4, ~0ull}; }), "tensor 'b'", "run past the end");
    EXPECT_ERROR(err([](J& h) { h["b"]["data_offsets"] = {20, 24}; }), "overlap", "'b'", "'w'");
    EXPECT_ERROR(err([](J& h) { h["b"]["data_offsets"] = {0, 4}; }), "overlap");
    EXPECT_ERROR(err([](J& h) { h["w"]["data_offsets"] = {2, 26}; h["b"]["data_offsets"] = {0, 4}; }), "tensor 'w'",
                 "overlap those of tensor 'b' [0, 4]");
    EXPECT_ERROR(header_error([](J& h) { h["b"]["data_offsets"] = {25, 29}; }, std::vector<uint8_t>(29, 1)),
                 "tensor 'b'", "hole", "[24, 25)");
    EXPECT_ERROR(header_error([](J& h) { h["w"]["data_offsets"] = {1, 25}; h["b"]["data_offsets"] = {25, 29}; },
                              std::vector<uint8_t>(29, 1)),
                 "tensor 'w'", "[0, 1)");
    EXPECT_ERROR(header_error([](J&) {}, std::vector<uint8_t>(30, 1)), "cover 28 bytes of the 30-byte",
                 "2 bytes after them");
    EXPECT_ERROR(err([](J& h) { h["z"] = {{"dtype", "U8"}, {"shape", {0}}, {"data_offsets", {10, 10}}}; }),
                 "tensor 'z'", "overlap");
    // The order of the header and of the data need not agree.
    EXPECT_EQ(err([](J& h) { h["w"]["data_offsets"] = {4, 28}; h["b"]["data_offsets"] = {0, 4}; }), "");
}

// Random byte changes to a valid file: each load either succeeds or throws
// quern::Error (never another exception, a crash or a sanitizer report).
TEST(SafetensorsMalformed, SeededMutationsNeverCrash) {
    const std::vector<uint8_t> base = sample().build();
    const unsigned seed = std::random_device{}();
    std::printf("seed %u\n", seed);
    std::mt19937 rng(seed);
    const uint64_t header_end = 8 + [&] {
        uint64_t n;
        std::memcpy(&n, base.data(), 8);
        return n;
    }();
    const char* interesting = "{}[],:\"0123456789-e. tfn";
    int loaded = 0;
    for (int it = 0; it < 1500; ++it) {
        std::vector<uint8_t> b = base;
        const int edits = 1 + static_cast<int>(rng() % 3);
        for (int e = 0; e < edits; ++e) {
            const size_t at = rng() % header_end;  // the size field and the header: the data has no structure
            switch (rng() % 4) {
                case 0: b[at] = static_cast<uint8_t>(rng()); break;
                case 1: b[at] = static_cast<uint8_t>(interesting[rng() % std::strlen(interesting)]); break;
                case 2: b.erase(b.begin() + static_cast<long>(at)); break;
                default:
                    b.insert(b.begin() + static_cast<long>(at),
                             static_cast<uint8_t>(interesting[rng() % std::strlen(interesting)]));
            }
        }
        if (load_error(b, "mut.safetensors").empty()) ++loaded;
    }
    std::printf("%d of 1500 mutated files loaded\n", loaded);
}

}  // namespace
