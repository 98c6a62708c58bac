// quern quantize: llama-quantize's per-tensor types (quant/mix.h) on the
// tensor names and shapes of real models, written out by hand from
// llama.cpp's rules; and a whole file (model/quantize.h) whose tensors are
// the reference quantizers' output of the input's rows, in llama-quantize's
// order and with its metadata, that loads and runs; requantizing refused
// unless asked for. (Byte equality with llama-quantize's own files is
// checked by tools/gguf_tensor_diff.py, bench/quantize.md.)
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <unistd.h>

#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "formats/imatrix.h"
#include "model/model.h"
#include "model/quantize.h"
#include "model/synth.h"
#include "quant/mix.h"
#include "quant/reference.h"

using namespace quern;
namespace fs = std::filesystem;

namespace {

/// The types a Llama-3-8B-shaped file (32 layers, GQA 4, untied output) gets,
/// per tensor kind and type: how many of the 32.
std::map<std::string, std::map<std::string, int>> llama8b_types(FileType t, bool tied = false, int64_t experts = 0) {
    MixModel m;
    m.arch = "llama";
    m.n_layer = 32;
    m.n_gqa = 4;
    m.n_expert = experts;
    m.tied_embeddings = tied;
    m.n_attention_v = 32;
    MixPlanner p(t, m);
    std::map<std::string, std::map<std::string, int>> count;
    const auto add = [&](const std::string& kind, const std::string& name, int64_t ne0, int n_dims = 2) {
        ++count[kind][std::string(dtype_name(p.choose(name, DType::F16, {ne0, 1024, 1, 1}, n_dims)))];
    };
    add("token_embd", "token_embd.weight", 4096);
    for (int il = 0; il < 32; ++il) {
        add("attn_norm", fmt::format("blk.{}.attn_norm.weight", il), 4096, 1);
        for (const char* k : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up"})
            add(k, fmt::format("blk.{}.{}.weight", il, k), 4096);
        add("ffn_down", fmt::format("blk.{}.ffn_down.weight", il), 14336);
    }
    if (!tied) add("output", "output.weight", 4096);
    return count;
}

using M = std::map<std::string, int>;

}  // namespace

TEST(QuantMix, Q4KMGivesSomeLayersSixBits) {
    auto c = llama8b_types(FileType::Q4_K_M);
    // use_more_bits over 32 layers: 0-3, 28-31, and 6, 9, ..., 27 (8 more).
    EXPECT_EQ(c["attn_v"], (M{{"Q4_K", 16}, {"Q6_K", 16}}));
    EXPECT_EQ(c["ffn_down"], (M{{"Q4_K", 16}, {"Q6_K", 16}}));
    EXPECT_EQ(c["attn_q"], (M{{"Q4_K", 32}}));
    EXPECT_EQ(c["output"], (M{{"Q6_K", 1}}));
    EXPECT_EQ(c["token_embd"], (M{{"Q4_K", 1}}));
    EXPECT_EQ(c["attn_norm"], (M{{"F16", 32}}));  // 1-D: as it was
    // A tied embedding is the head: the output's type.
    EXPECT_EQ(llama8b_types(FileType::Q4_K_M, true)["token_embd"], (M{{"Q6_K", 1}}));
    // Q5_K_M: the same layers, on Q5_K.
    c = llama8b_types(FileType::Q5_K_M);
    EXPECT_EQ(c["attn_v"], (M{{"Q5_K", 16}, {"Q6_K", 16}}));
    EXPECT_EQ(c["attn_k"], (M{{"Q5_K", 32}}));
}

TEST(QuantMix, LowerMixes) {
    auto c = llama8b_types(FileType::Q3_K_M);
    EXPECT_EQ(c["attn_v"], (M{{"Q5_K", 2}, {"Q4_K", 30}}));      // the first two V a step higher
    EXPECT_EQ(c["ffn_down"], (M{{"Q5_K", 2}, {"Q4_K", 30}}));    // the first sixteenth; the rest Q4_K
    EXPECT_EQ(c["attn_output"], (M{{"Q4_K", 32}}));
    EXPECT_EQ(c["attn_q"], (M{{"Q3_K", 32}}));
    c = llama8b_types(FileType::Q2_K);
    EXPECT_EQ(c["attn_v"], (M{{"Q4_K", 32}}));  // GQA 4: Q4_K
    EXPECT_EQ(c["ffn_down"], (M{{"Q3_K", 32}}));
    EXPECT_EQ(c["attn_output"], (M{{"Q3_K", 32}}));
    c = llama8b_types(FileType::Q4_K_S);
    EXPECT_EQ(c["attn_v"], (M{{"Q5_K", 4}, {"Q4_K", 28}}));
    EXPECT_EQ(c["ffn_down"], (M{{"Q5_K", 4}, {"Q4_K", 28}}));
    // The plain types: one type for every matrix but the head.
    c = llama8b_types(FileType::Q8_0);
    EXPECT_EQ(c["attn_v"], (M{{"Q8_0", 32}}));
    EXPECT_EQ(c["output"], (M{{"Q8_0", 1}}));
    c = llama8b_types(FileType::Q4_0);
    EXPECT_EQ(c["output"], (M{{"Q6_K", 1}}));
    EXPECT_EQ(llama8b_types(FileType::F16)["output"], (M{{"F16", 1}}));
}

TEST(QuantMix, EightExpertsAndFallbacks) {
    // Mixtral's 8 experts: V and K in Q8_0, the attention output in Q5_K.
    auto c = llama8b_types(FileType::Q4_K_M, false, 8);
    EXPECT_EQ(c["attn_v"], (M{{"Q8_0", 32}}));
    EXPECT_EQ(c["attn_k"], (M{{"Q8_0", 32}}));
    EXPECT_EQ(c["attn_output"], (M{{"Q5_K", 32}}));
    // Rows that are not whole 256-blocks: the 32-element type of about the
    // same bits, and F16 where those do not fit either.
    MixModel m;
    m.n_layer = 30;
    m.n_attention_v = 30;
    MixPlanner p(FileType::Q4_K_M, m);
    bool fell = false;
    EXPECT_EQ(p.choose("blk.4.attn_q.weight", DType::F16, {576, 576, 1, 1}, 2, &fell), DType::Q5_0);
    EXPECT_TRUE(fell);
    EXPECT_EQ(p.choose("blk.4.attn_q.weight", DType::F16, {48, 576, 1, 1}, 2, &fell), DType::F16);
    EXPECT_EQ(p.choose("output.weight", DType::F16, {576, 49152, 1, 1}, 2, &fell), DType::Q8_0);
    // Tensors that stay as they are: norms, routers, conv kernels.
    for (const char* n : {"blk.0.attn_norm.weight", "blk.0.ffn_gate_inp.weight", "blk.0.ssm_conv1d.weight"})
        EXPECT_EQ(p.choose(n, DType::F32, {256, 64, 1, 1}, 2), DType::F32) << n;
    // An expert bank's layer comes from its name.
    m.n_expert = 4;
    MixPlanner e(FileType::Q4_K_M, m);
    EXPECT_EQ(e.choose("blk.29.ffn_down_exps.weight", DType::F16, {256, 64, 4, 1}, 3), DType::Q6_K);
    EXPECT_EQ(e.choose("blk.10.ffn_down_exps.weight", DType::F16, {256, 64, 4, 1}, 3), DType::Q4_K);
    EXPECT_THROW(e.choose("ffn_down_exps.weight", DType::F16, {256, 64, 4, 1}, 3), Error);
    EXPECT_EQ(file_type_from_name("q4_k_m"), FileType::Q4_K_M);
    EXPECT_FALSE(file_type_from_name("Q4_K_XL").has_value());
}

class QuantizeFile : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / fmt::format("quern_quantize_{}", ::getpid());
        fs::create_directories(dir_);
        f16_ = (dir_ / "f16.gguf").string();
        write_synthetic_gguf(make_synthetic(synth_tiny(synth_preset("llama3-1b")), "F16", 5), f16_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    fs::path dir_;
    std::string f16_;
};

TEST_F(QuantizeFile, TensorsAreTheReferenceQuantizersRows) {
    ThreadPool pool(2);
    const std::string out = (dir_ / "q4km.gguf").string();
    const QuantizeReport r = quantize_gguf(f16_, out, QuantizeOptions{FileType::Q4_K_M}, pool);
    GgufFile in(f16_), q(out);
    EXPECT_EQ(q.get_int("general.file_type"), 15);
    EXPECT_EQ(q.get_int("general.quantization_version"), 2);
    EXPECT_EQ(q.get_string_array("tokenizer.ggml.tokens"), in.get_string_array("tokenizer.ggml.tokens"));
    ASSERT_EQ(q.tensors().size(), in.tensors().size());
    // llama-quantize's order: outside the layers first, then by layer and name.
    EXPECT_EQ(q.tensors()[0].name, "output_norm.weight");
    EXPECT_EQ(q.tensors()[2].name, "blk.0.attn_k.weight");
    int changed = 0;
    for (const GgufTensorInfo& t : q.tensors()) {
        const GgufTensorInfo& s = *in.find_tensor(t.name);
        EXPECT_EQ(t.ne, s.ne) << t.name;
        if (t.type == s.type) {
            EXPECT_EQ(0, std::memcmp(q.data(t), in.data(s), s.nbytes)) << t.name;
            continue;
        }
        ++changed;
        std::vector<float> row(static_cast<size_t>(t.ne[0]));
        std::vector<uint8_t> want(row_size(t.type, t.ne[0]));
        const size_t rs_in = row_size(s.type, s.ne[0]);
        for (int64_t r = 0; r < t.ne[1] * t.ne[2]; r += 7) {
            dequantize_row_ref(s.type, in.data(s) + rs_in * static_cast<size_t>(r), row.data(), t.ne[0]);
            quantize_row_ref(t.type, row.data(), want.data(), t.ne[0]);
            ASSERT_EQ(0, std::memcmp(q.data(t) + want.size() * static_cast<size_t>(r), want.data(), want.size()))
                << t.name << " row " << r;
        }
    }
    EXPECT_GT(changed, 20);
    EXPECT_EQ(r.tensors.size(), q.tensors().size());
    EXPECT_LT(r.bytes_out, r.bytes_in / 2);
    // It loads and runs.
    auto model = Model::from_gguf(std::make_shared<GgufFile>(out));
    EXPECT_EQ(model->config().n_layer, synth_tiny(synth_preset("llama3-1b")).cfg.n_layer);
}

// With an importance matrix: each matrix it names is quantized row by row
// under its weights (quantize_row_weighted), the output records the matrix as
// llama-quantize does, Q4_0's first eighth of FFN down becomes Q4_1, and an
// entry of another width is refused before anything is written.
TEST_F(QuantizeFile, ImportanceMatrixWeightsTheRows) {
    GgufFile in(f16_);
    std::mt19937 rng(std::random_device{}());
    std::uniform_real_distribution<float> ud(0.0f, 1.0f);
    Imatrix im;
    im.datasets = {"calibration.txt"};
    im.chunk_count = 3;
    for (const GgufTensorInfo& t : in.tensors()) {
        if (t.name.rfind("blk.", 0) != 0 || t.n_dims < 2) continue;
        std::vector<float> x(static_cast<size_t>(t.ne[0]));
        for (float& v : x) v = ud(rng) * ud(rng) * 4.0f;
        im.accumulate(t.name, 1, 0, x.data(), 1, t.ne[0]);
    }
    ThreadPool pool(2);
    const std::string out = (dir_ / "q4_0.gguf").string();
    QuantizeOptions o{FileType::Q4_0};
    o.imatrix = &im;
    o.imatrix_file = "m.imatrix";
    const QuantizeReport r = quantize_gguf(f16_, out, o, pool);
    GgufFile q(out);
    EXPECT_EQ(q.get_string("quantize.imatrix.file"), "m.imatrix");
    EXPECT_EQ(q.get_string("quantize.imatrix.dataset"), "calibration.txt");
    EXPECT_EQ(q.get_int("quantize.imatrix.entries_count"), static_cast<int64_t>(im.entries.size()));
    EXPECT_EQ(q.get_int("quantize.imatrix.chunks_count"), 3);
    // Q4_0's first eighth of FFN down becomes Q4_1 (the tiny file has too few
    // layers for an eighth; the rule on a 32-layer model's counters).
    MixModel mm;
    mm.arch = "llama";
    mm.n_layer = 32;
    mm.has_imatrix = true;
    EXPECT_EQ(mix_tensor_type(FileType::Q4_0, mm, "blk.3.ffn_down.weight", 4096, 0, 3), DType::Q4_1);
    EXPECT_EQ(mix_tensor_type(FileType::Q5_0, mm, "blk.3.ffn_down.weight", 4096, 0, 3), DType::Q5_1);
    EXPECT_EQ(mix_tensor_type(FileType::Q4_0, mm, "blk.4.ffn_down.weight", 4096, 0, 4), DType::Q4_0);
    mm.has_imatrix = false;
    EXPECT_EQ(mix_tensor_type(FileType::Q4_0, mm, "blk.3.ffn_down.weight", 4096, 0, 3), DType::Q4_0);
    int weighted = 0;
    for (const QuantizedTensor& t : r.tensors) {
        const auto imp = im.importance(t.name);
        EXPECT_EQ(t.weighted, !imp.empty() && t.to != t.from) << t.name;
        if (!t.weighted) continue;
        ++weighted;
        const GgufTensorInfo& s = *in.find_tensor(t.name);
        const GgufTensorInfo& d = *q.find_tensor(t.name);
        std::vector<float> row(static_cast<size_t>(s.ne[0]));
        std::vector<uint8_t> want(row_size(d.type, s.ne[0])), plain(want.size());
        const size_t rs_in = row_size(s.type, s.ne[0]);
        int differs = 0;
        for (int64_t i = 0; i < s.ne[1]; i += 5) {
            dequantize_row_ref(s.type, in.data(s) + rs_in * static_cast<size_t>(i), row.data(), s.ne[0]);
            quantize_row_weighted(d.type, row.data(), want.data(), s.ne[0], imp.data());
            ASSERT_EQ(0, std::memcmp(q.data(d) + want.size() * static_cast<size_t>(i), want.data(), want.size()))
                << t.name << " row " << i;
            quantize_row_ref(d.type, row.data(), plain.data(), s.ne[0]);
            differs += plain != want;
        }
        EXPECT_GT(differs, 0) << t.name << ": the weights changed nothing";
    }
    EXPECT_GT(weighted, 20);
    // An entry made for another model (another width) is refused.
    std::vector<float> x(7, 1.0f);
    im.entries.erase("blk.1.attn_q.weight");
    im.accumulate("blk.1.attn_q.weight", 1, 0, x.data(), 1, 7);
    try {
        quantize_gguf(f16_, (dir_ / "bad.gguf").string(), o, pool);
        FAIL() << "a 7-wide entry was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("blk.1.attn_q.weight"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(dir_ / "bad.gguf"));
}

TEST_F(QuantizeFile, RequantizingIsRefusedUnlessAsked) {
    ThreadPool pool(1);
    const std::string q8 = (dir_ / "q8.gguf").string(), q4 = (dir_ / "q4.gguf").string();
    quantize_gguf(f16_, q8, QuantizeOptions{FileType::Q8_0}, pool);
    try {
        quantize_gguf(q8, q4, QuantizeOptions{FileType::Q4_K_M}, pool);
        ADD_FAILURE() << "requantized without being asked";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--allow-requantize"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("Q8_0"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(q4));
    QuantizeOptions o{FileType::Q4_K_M};
    o.allow_requantize = true;
    quantize_gguf(q8, q4, o, pool);
    EXPECT_EQ(GgufFile(q4).get_int("general.file_type"), 15);
    EXPECT_THROW(quantize_gguf(f16_, f16_, QuantizeOptions{FileType::Q8_0}, pool), Error);
}
