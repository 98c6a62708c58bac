// Shared helpers of the Hugging Face checkpoint tests (hf_golden_test.cpp,
// hf_quant_test.cpp): the fixture folder, a fixture's golden facts and
// logits, a temporary copy of a checkpoint to damage, safetensors headers to
// edit in place, a byte-level tokenizer.json for `quern run`, and the mixed
// requests of the hybrid serving tests.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/hf_model.h"
#include "runtime/engine.h"

namespace quern::hf_test {

namespace fs = std::filesystem;

inline const std::string kDir = std::string(QUERN_SOURCE_DIR) + "/tests/data/hf/";

/// A fixture's reference logits: float32 little-endian, [position][vocab].
inline std::vector<float> read_logits(const std::string& path) {
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    EXPECT_TRUE(f) << path;
    std::vector<float> v(static_cast<size_t>(f.tellg()) / 4);
    f.seekg(0);
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
    return v;
}

inline int64_t argmax(const float* x, int64_t n) { return std::max_element(x, x + n) - x; }

/// A copy of a fixture checkpoint in a fresh temporary folder.
class HfCheckpointCopy : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("quern_hf_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    /// `tag` tells apart several copies of one checkpoint in a test.
    fs::path copy(const std::string& arch, const std::string& dtype, const std::string& tag = "") {
        const fs::path d = dir_ / (arch + "_" + dtype + tag);
        fs::copy(kDir + arch + "/" + dtype, d, fs::copy_options::recursive);
        return d;
    }
    /// The error load_hf_model throws for `path` ("" when it loads).
    static std::string load_error(const fs::path& path) {
        try {
            load_hf_model(path.string());
        } catch (const Error& e) {
            return e.what();
        }
        return "";
    }
    fs::path dir_;
};

/// The header of a safetensors file as JSON, and its data.
struct StFile {
    nlohmann::ordered_json header;
    std::string data;
};

inline StFile read_st(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    uint64_t n = 0;
    f.read(reinterpret_cast<char*>(&n), 8);
    std::string h(n, '\0');
    f.read(h.data(), static_cast<std::streamsize>(n));
    StFile s;
    s.header = nlohmann::ordered_json::parse(h);
    s.data.assign(std::istreambuf_iterator<char>(f), {});
    return s;
}

inline void write_st(const fs::path& p, const StFile& s) {
    std::string h = s.header.dump();
    while (h.size() % 8) h += ' ';
    const uint64_t n = h.size();
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << h << s.data;
}

/// A byte-level BPE tokenizer.json with one token per byte (GPT-2's byte
/// characters), no merges: ids 0..255 for the fixtures' 256-token vocabulary.
inline std::string byte_tokenizer_json() {
    nlohmann::json vocab = nlohmann::json::object();
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
        const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        const int cp = printable ? b : 256 + extra++;
        std::string s;
        if (cp < 0x80) s += static_cast<char>(cp);
        else s += static_cast<char>(0xC0 | (cp >> 6)), s += static_cast<char>(0x80 | (cp & 0x3F));
        vocab[s] = b;
    }
    nlohmann::json j = {{"version", "1.0"},
                        {"added_tokens", nlohmann::json::array()},
                        {"normalizer", nullptr},
                        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                                           {"use_regex", true}}},
                        {"post_processor", nullptr},
                        {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                                     {"use_regex", true}}},
                        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
    return j.dump();
}


/// Request i of the serving tests' mix over a fixture's prompt `tokens`
/// (at least 64): 5 to 44 tokens, every third from the start (a shared
/// prefix), the others from offset i % 20; 6 to 10 greedy tokens, EOS ignored.
inline GenerationRequest mixed_request(const std::vector<int32_t>& tokens, int i) {
    GenerationRequest r;
    const size_t len = 5 + static_cast<size_t>(i) * 7 % 40;
    const size_t from = i % 3 == 0 ? 0 : static_cast<size_t>(i % 20);
    r.prompt.assign(tokens.begin() + static_cast<std::ptrdiff_t>(from),
                    tokens.begin() + static_cast<std::ptrdiff_t>(from + len));
    r.max_tokens = 6 + i % 5;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    return r;
}

/// Submits mixed_request(tokens, i) for i < n to `e` at once and waits for
/// all: each request's tokens.
inline std::vector<std::vector<int32_t>> run_mixed_requests(Engine& e, const std::vector<int32_t>& tokens, int n) {
    std::vector<std::vector<int32_t>> out(static_cast<size_t>(n));
    std::vector<std::promise<void>> done(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i)
        e.submit(mixed_request(tokens, i), [&, i](const TokenEvent& ev) {
            if (ev.token >= 0) out[static_cast<size_t>(i)].push_back(ev.token);
            if (ev.last) done[static_cast<size_t>(i)].set_value();
            return true;
        });
    for (auto& d : done) d.get_future().wait();
    return out;
}

}  // namespace quern::hf_test
