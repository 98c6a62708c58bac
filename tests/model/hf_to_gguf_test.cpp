// Hugging Face folders as quantize input (model/hf_to_gguf.h): the tiny
// checkpoints of tests/data/hf, given a byte-level BPE tokenizer.json, are
// written as GGUF files that compute the checkpoint's logits (q/k rows
// permuted for the Llama family's interleaved RoPE, expert banks stacked, FP8
// dequantized), whose tokenizer encodes as the tokenizer.json does; and what
// GGUF cannot carry is refused before anything is written.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "formats/imatrix.h"
#include "model/hf_model.h"
#include "model/model.h"
#include "model/quantize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

using namespace quern;
namespace fs = std::filesystem;

namespace {

const fs::path kHf = fs::path(QUERN_SOURCE_DIR) / "tests/data/hf";

/// A byte-level BPE tokenizer.json over the 256 byte tokens (no merges), with
/// Qwen2's pre-tokenizer and `normalizer`.
std::string byte_tokenizer_json(const nlohmann::json& normalizer = {{"type", "NFC"}}) {
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) vocab[unicode::ByteMap::get().byte_to_utf8(static_cast<uint8_t>(b))] = b;
    const std::string qwen2 =
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    nlohmann::json j = {
        {"version", "1.0"},
        {"added_tokens", nlohmann::json::array()},
        {"normalizer", normalizer},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", qwen2}}}, {"behavior", "Isolated"}, {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}}},
        {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
        {"model",
         {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}, {"byte_fallback", false},
          {"fuse_unk", false}, {"ignore_merges", false}}}};
    return j.dump();
}

/// A SentencePiece-style tokenizer.json (BPE with byte fallback, as Llama 2
/// and Gemma ship): <unk> <s> </s>, the byte tokens of every byte UTF-8 can
/// hold, "▁", five letters and the four pieces their merges make; 256 tokens
/// in all.
std::string spm_tokenizer_json() {
    nlohmann::json vocab = nlohmann::json::object();
    int id = 0;
    for (const char* s : {"<unk>", "<s>", "</s>"}) vocab[s] = id++;
    for (int b = 0; b < 256; ++b)
        if (!(b == 0xC0 || b == 0xC1 || b >= 0xF5)) vocab[fmt::format("<0x{:02X}>", b)] = id++;
    const std::string sp = "\u2581";
    for (const std::string& piece : {sp, std::string("t"), std::string("h"), std::string("e"), std::string("i"),
                                     std::string("n"), sp + "t", std::string("he"), sp + "the", std::string("in")})
        vocab[piece] = id++;
    const nlohmann::json merges = {sp + " t", "h e", sp + "t he", "i n"};
    nlohmann::json added = nlohmann::json::array();
    for (int i = 0; i < 3; ++i)
        added.push_back({{"id", i}, {"content", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>"}, {"special", true},
                         {"lstrip", false}, {"rstrip", false}, {"single_word", false}, {"normalized", false}});
    const nlohmann::json j = {
        {"version", "1.0"},
        {"added_tokens", added},
        {"normalizer",
         {{"type", "Sequence"},
          {"normalizers",
           {{{"type", "Prepend"}, {"prepend", sp}},
            {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", sp}}}}}},
        {"pre_tokenizer", nullptr},
        {"decoder",
         {{"type", "Sequence"},
          {"decoders",
           {{{"type", "Replace"}, {"pattern", {{"String", sp}}}, {"content", " "}},
            {{"type", "ByteFallback"}},
            {{"type", "Fuse"}},
            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
        {"model",
         {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"unk_token", "<unk>"}, {"byte_fallback", true},
          {"fuse_unk", true}, {"ignore_merges", false}}}};
    return j.dump();
}

class HfToGguf : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / fmt::format("quern_hf2gguf_{}", ::getpid());
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    /// A copy of checkpoint `arch`/`kind` with a tokenizer.json.
    std::string folder(const std::string& arch, const std::string& kind, const std::string& tokenizer_json) {
        const fs::path d = dir_ / (arch + "_" + kind);
        fs::copy(kHf / arch / kind, d, fs::copy_options::recursive);
        std::ofstream(d / "tokenizer.json") << tokenizer_json;
        return d.string();
    }
    fs::path dir_;
};

std::vector<int32_t> golden_tokens(const std::string& arch) {
    std::ifstream f(kHf / arch / "golden.json");
    return nlohmann::json::parse(f)["tokens"].get<std::vector<int32_t>>();
}

std::vector<float> logits_of(Model& m, const std::vector<int32_t>& ids) {
    ThreadPool pool(2);
    KvCache cache = m.make_cache(static_cast<int64_t>(ids.size()));
    std::vector<float> out(ids.size() * static_cast<size_t>(m.config().n_vocab));
    m.forward(ids.data(), static_cast<int64_t>(ids.size()), cache, out.data(), true, pool);
    return out;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
    }
    return d / scale;
}

}  // namespace

class HfToGgufArch : public HfToGguf, public testing::WithParamInterface<std::string> {};

// F32 out of an F32 checkpoint: the GGUF model computes the checkpoint's
// logits (to float rounding: the Llama family's RoPE runs on other pairs).
TEST_P(HfToGgufArch, F32FileComputesTheCheckpointsLogits) {
    const std::string arch = GetParam();
    const std::string src = folder(arch, "fp32", byte_tokenizer_json());
    const std::string out = (dir_ / "out.gguf").string();
    ThreadPool pool(2);
    quantize_gguf(src, out, QuantizeOptions{FileType::F32}, pool);
    auto gguf = Model::from_gguf(std::make_shared<GgufFile>(out));
    auto hf = load_hf_model(src);
    const auto ids = golden_tokens(arch);
    EXPECT_LT(max_rel_diff(logits_of(*gguf, ids), logits_of(*hf, ids)), 2e-5) << arch;
    // The file's tokenizer encodes as the folder's tokenizer.json.
    GgufFile f(out);
    const auto a = Tokenizer::from_gguf(f);
    const auto b = Tokenizer::from_file(src);
    for (const char* s : {"Hello, world! 12345", " naïve\n\ttext 😀"})
        EXPECT_EQ(a->encode(s, false, false), b->encode(s, false, false)) << s;
    EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "qwen2");
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, HfToGgufArch, testing::Values("llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "granite"),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

// Quantized from BF16 and from an FP8 checkpoint (dequantized first): close
// to the checkpoint's logits, expert banks one 3-D tensor per layer.
TEST_F(HfToGguf, Q8_0FromBf16AndFp8) {
    ThreadPool pool(2);
    for (const auto& [arch, kind] : {std::pair{"qwen3_moe", "bf16"}, std::pair{"llama", "fp8_block"}}) {
        const std::string src = folder(arch, kind, byte_tokenizer_json());
        const std::string out = (dir_ / fmt::format("{}_{}.gguf", arch, kind)).string();
        QuantizeOptions o{FileType::Q8_0};
        o.allow_requantize = true;  // FP8 is a quantized type
        const QuantizeReport r = quantize_gguf(src, out, o, pool);
        GgufFile f(out);
        if (std::string(arch) == "qwen3_moe") {
            const GgufTensorInfo* e = f.find_tensor("blk.0.ffn_up_exps.weight");
            ASSERT_NE(e, nullptr);
            EXPECT_EQ(e->n_dims, 3);
            EXPECT_EQ(e->type, DType::Q8_0);
        }
        auto gguf = Model::from_gguf(std::make_shared<GgufFile>(out));
        auto hf = load_hf_model(src);
        const auto ids = golden_tokens(arch);
        const auto a = logits_of(*gguf, ids), b = logits_of(*hf, ids);
        double dot = 0, na = 0, nb = 0;
        for (size_t i = 0; i < a.size(); ++i) dot += double(a[i]) * b[i], na += double(a[i]) * a[i], nb += double(b[i]) * b[i];
        EXPECT_GT(dot / std::sqrt(na * nb), 0.999) << arch << " " << kind;
        EXPECT_GT(r.tensors.size(), 10u);
    }
}

// A SentencePiece-style tokenizer.json becomes GGUF's "llama" tokenizer
// (scores from the merges, byte tokens typed as such), encoding as before.
TEST_F(HfToGguf, SentencePieceVocabulary) {
    const std::string src = folder("llama", "fp32", spm_tokenizer_json());
    const std::string out = (dir_ / "spm.gguf").string();
    ThreadPool pool(2);
    quantize_gguf(src, out, QuantizeOptions{FileType::Q8_0}, pool);
    GgufFile f(out);
    EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
    EXPECT_EQ(f.get_float_array("tokenizer.ggml.scores").size(), 256u);
    EXPECT_EQ(f.get_int_array("tokenizer.ggml.token_type")[5], 6);  // <0x02>: a byte token
    const auto a = Tokenizer::from_gguf(f);
    const auto b = Tokenizer::from_file(src);
    for (const char* s : {"the world is in order", "Hello, world! 12345", " naïve\n\ttext 😀 東京"}) {
        EXPECT_EQ(a->encode(s, true, false), b->encode(s, true, false)) << s;
        EXPECT_EQ(a->decode(a->encode(s, false, false)), b->decode(b->encode(s, false, false))) << s;
    }
}

// An importance matrix collected on the folder (experts as tensors of their
// own) weights the stacked expert banks of the GGUF file.
TEST_F(HfToGguf, ImatrixFromTheFolderWeightsStackedExperts) {
    const std::string src = folder("qwen3_moe", "fp32", byte_tokenizer_json());
    auto hf = load_hf_model(src);
    Imatrix im;
    hf->set_activation_observer([&](const Tensor& w, int64_t expert, const float* x, int64_t rows) {
        if (w.name.rfind("blk.", 0) == 0) im.accumulate(w.name, expert < 0 ? 1 : w.ne[2], std::max<int64_t>(expert, 0), x, rows, w.ne[0]);
    });
    logits_of(*hf, golden_tokens("qwen3_moe"));
    ThreadPool pool(2);
    QuantizeOptions o{FileType::Q8_0};
    o.imatrix = &im;
    const QuantizeReport r = quantize_gguf(src, (dir_ / "moe_imatrix.gguf").string(), o, pool);
    int banks = 0;
    for (const QuantizedTensor& t : r.tensors)
        if (t.name.find("_exps.weight") != std::string::npos) {
            ++banks;
            EXPECT_TRUE(t.weighted) << t.name;
        }
    EXPECT_GT(banks, 0);
}

TEST_F(HfToGguf, WhatGgufCannotCarryIsRefused) {
    ThreadPool pool(2);
    const std::string out = (dir_ / "refused.gguf").string();
    const auto refused = [&](const std::string& src, const std::string& needle) {
        try {
            quantize_gguf(src, out, QuantizeOptions{FileType::Q8_0}, pool);
            ADD_FAILURE() << src << " was converted";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
        EXPECT_FALSE(fs::exists(out));
    };
    const fs::path bare = dir_ / "bare";
    fs::copy(kHf / "qwen2" / "fp32", bare, fs::copy_options::recursive);
    refused(bare.string(), "no tokenizer.json");
    // A normalizer llama.cpp's qwen2 pre-tokenizer does not apply: text
    // would encode differently.
    refused(folder("qwen2", "fp32",
                   byte_tokenizer_json({{"type", "Replace"}, {"pattern", {{"String", "o"}}}, {"content", "0"}})),
            "differently");
    // A pre-tokenizer llama.cpp has no name for.
    std::string odd = byte_tokenizer_json();
    odd.replace(odd.find("\\\\p{N}|"), 7, "\\\\p{N}{1,2}|");
    refused(folder("qwen3", "fp32", odd), "pre-tokenizer");
}
