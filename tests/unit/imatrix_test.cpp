// Importance matrices (formats/imatrix.h): sums of squares per column as they
// accumulate, the GGUF layout llama-imatrix writes (read back and by name),
// the older .dat layout, malformed files refused; the CPU runner showing every
// matrix product's input to the observer (ActivationFn), experts by index;
// and `quern imatrix` then `quern quantize --imatrix` end to end.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <unistd.h>

#include "../model/test_util.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "formats/imatrix.h"
#include "model/model.h"
#include "model/synth.h"

using namespace quern;
namespace fs = std::filesystem;

namespace {

class ImatrixFiles : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / fmt::format("quern_imatrix_{}", ::getpid());
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::string path(const char* name) const { return (dir_ / name).string(); }
    fs::path dir_;
};

std::vector<float> random_rows(std::mt19937& rng, int64_t n) {
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = nd(rng);
    return x;
}

}  // namespace

TEST(Imatrix, AccumulatesSquaresPerColumn) {
    std::mt19937 rng(std::random_device{}());
    const int64_t n_in = 48;
    Imatrix m;
    std::vector<double> want(2 * n_in, 0.0);
    for (int call = 0; call < 3; ++call) {
        for (int64_t mat = 0; mat < 2; ++mat) {
            const int64_t rows = 5 + call + mat;
            const auto x = random_rows(rng, rows * n_in);
            m.accumulate("blk.0.ffn_up_exps.weight", 2, mat, x.data(), rows, n_in);
            for (int64_t r = 0; r < rows; ++r)
                for (int64_t j = 0; j < n_in; ++j) want[mat * n_in + j] += double(x[r * n_in + j]) * x[r * n_in + j];
        }
    }
    const ImatrixEntry& e = m.entries.at("blk.0.ffn_up_exps.weight");
    ASSERT_EQ(e.n_in(), n_in);
    EXPECT_EQ(e.counts, (std::vector<float>{5 + 6 + 7, 6 + 7 + 8}));
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(e.sums[i], want[i], 1e-5 * want[i]) << i;
    const auto imp = m.importance("blk.0.ffn_up_exps.weight");
    EXPECT_FLOAT_EQ(imp[3], e.sums[3] / 18.0f);
    EXPECT_FLOAT_EQ(imp[n_in + 3], e.sums[n_in + 3] / 21.0f);
    EXPECT_TRUE(m.importance("blk.9.nothing").empty());
    const auto x = random_rows(rng, n_in);
    EXPECT_THROW(m.accumulate("blk.0.ffn_up_exps.weight", 2, 0, x.data(), 1, n_in / 2), Error);  // another width
    EXPECT_THROW(m.accumulate("blk.0.ffn_up_exps.weight", 3, 0, x.data(), 1, n_in), Error);      // another count
    EXPECT_THROW(m.accumulate("blk.0.ffn_up_exps.weight", 2, 2, x.data(), 1, n_in), Error);      // no such expert
}

// An expert bank's weights from experts collected as tensors of their own
// (blk.N.X.E.weight: Hugging Face folders, older Mixtral files) when the
// bank itself (blk.N.X_exps.weight) has no entry.
TEST(Imatrix, ExpertBankFromPerExpertEntries) {
    Imatrix m;
    for (int e = 0; e < 3; ++e) {
        const std::vector<float> x = {float(e), 1, 2, 3};
        m.accumulate("blk.0.ffn_up." + std::to_string(e) + ".weight", 1, 0, x.data(), 1, 4);
    }
    EXPECT_EQ(m.importance_size("blk.0.ffn_up_exps.weight", 3), 12u);
    EXPECT_EQ(m.importance("blk.0.ffn_up_exps.weight", 3),
              (std::vector<float>{0, 1, 4, 9, 1, 1, 4, 9, 4, 1, 4, 9}));
    EXPECT_EQ(m.importance_size("blk.0.ffn_up_exps.weight", 4), 0u);  // expert 3 missing
    EXPECT_TRUE(m.importance("blk.0.ffn_up_exps.weight", 4).empty());
    EXPECT_EQ(m.importance_size("blk.0.ffn_up.1.weight", 1), 4u);  // a plain entry as it is
}

TEST_F(ImatrixFiles, GgufRoundTripsInLlamaImatrixLayout) {
    std::mt19937 rng(std::random_device{}());
    Imatrix m;
    m.datasets = {"calibration.txt"};
    m.chunk_count = 7;
    m.chunk_size = 512;
    const auto a = random_rows(rng, 4 * 32), b = random_rows(rng, 3 * 16);
    m.accumulate("blk.0.attn_q.weight", 1, 0, a.data(), 4, 32);
    m.accumulate("blk.1.ffn_down_exps.weight", 3, 1, b.data(), 3, 16);  // experts 0 and 2 never routed to
    write_imatrix(path("m.gguf"), m);

    GgufFile f(path("m.gguf"));
    EXPECT_EQ(f.get_string("general.type"), "imatrix");
    EXPECT_EQ(f.get_int("imatrix.chunk_count"), 7);
    ASSERT_EQ(f.tensors().size(), 4u);  // sorted by name, sums before counts
    EXPECT_EQ(f.tensors()[0].name, "blk.0.attn_q.weight.in_sum2");
    EXPECT_EQ(f.tensors()[0].n_dims, 1);
    EXPECT_EQ(f.tensors()[1].name, "blk.0.attn_q.weight.counts");
    EXPECT_EQ(f.tensors()[2].name, "blk.1.ffn_down_exps.weight.in_sum2");
    EXPECT_EQ(f.tensors()[2].n_dims, 2);
    EXPECT_EQ(f.tensors()[2].ne[1], 3);

    const Imatrix r = read_imatrix(path("m.gguf"));
    EXPECT_EQ(r.datasets, m.datasets);
    EXPECT_EQ(r.chunk_count, 7);
    EXPECT_EQ(r.chunk_size, 512);
    ASSERT_EQ(r.entries.size(), 2u);
    for (const auto& [name, e] : m.entries) {
        EXPECT_EQ(r.entries.at(name).sums, e.sums) << name;
        EXPECT_EQ(r.entries.at(name).counts, e.counts) << name;
    }
    const auto imp = r.importance("blk.1.ffn_down_exps.weight");
    ASSERT_EQ(imp.size(), 48u);
    EXPECT_EQ(imp[0], 1.0f);  // an expert that saw no token: weight 1, as llama-quantize
    EXPECT_FLOAT_EQ(imp[16 + 5], r.entries.at("blk.1.ffn_down_exps.weight").sums[16 + 5] / 3.0f);
}

TEST_F(ImatrixFiles, ReadsTheDatLayout) {
    // Two entries of mean squares × ncall, then the chunk count and dataset.
    std::ofstream out(path("m.dat"), std::ios::binary);
    const auto put = [&](int32_t v) { out.write(reinterpret_cast<const char*>(&v), 4); };
    put(2);
    const std::pair<std::string, std::vector<float>> entries[] = {{"blk.0.attn_k.weight", {2, 4, 6, 8}},
                                                                  {"output.weight", {1, 1}}};
    for (const auto& [name, vals] : entries) {
        put(static_cast<int32_t>(name.size()));
        out.write(name.data(), static_cast<std::streamsize>(name.size()));
        put(2);  // ncall
        put(static_cast<int32_t>(vals.size()));
        out.write(reinterpret_cast<const char*>(vals.data()), static_cast<std::streamsize>(vals.size() * 4));
    }
    put(10);
    put(8);
    out.write("wiki.txt", 8);
    out.close();
    const Imatrix m = read_imatrix(path("m.dat"));
    EXPECT_EQ(m.chunk_count, 10);
    EXPECT_EQ(m.datasets, std::vector<std::string>{"wiki.txt"});
    EXPECT_EQ(m.importance("blk.0.attn_k.weight"), (std::vector<float>{1, 2, 3, 4}));
    EXPECT_EQ(m.importance("output.weight"), (std::vector<float>{0.5f, 0.5f}));
}

TEST_F(ImatrixFiles, MalformedFilesAreErrors) {
    EXPECT_THROW(read_imatrix(path("missing.gguf")), Error);
    const auto write = [&](const char* name, const std::string& bytes) {
        std::ofstream(path(name), std::ios::binary) << bytes;
        return path(name);
    };
    EXPECT_THROW(read_imatrix(write("empty.dat", "")), Error);
    const std::string header("\x01\x00\x00\x00\x05\x00\x00\x00" "abcde\x01\x00\x00\x00\x10\x00\x00\x00", 21);
    EXPECT_THROW(read_imatrix(write("short.dat", header + "xyz")), Error);  // 16 values promised, 3 bytes given
    EXPECT_THROW(read_imatrix(write("huge.dat", std::string("\xff\xff\xff\x7f", 4))), Error);
    // GGUF: sums without counts; F16 sums; a GGUF model rather than an imatrix.
    const std::vector<float> v(8, 1.0f);
    GgufWriter w1;
    w1.add_tensor("blk.0.attn_q.weight.in_sum2", DType::F32, {8, 1, 1, 1}, 1, v.data());
    w1.write(path("nocounts.gguf"));
    EXPECT_THROW(read_imatrix(path("nocounts.gguf")), Error);
    GgufWriter w2;
    w2.add_tensor("x.in_sum2", DType::F32, {8, 1, 1, 1}, 1, v.data());
    w2.add_tensor("x.counts", DType::F32, {3, 1, 1, 1}, 1, v.data());  // 8 sums do not split into 3 matrices
    w2.write(path("split.gguf"));
    EXPECT_THROW(read_imatrix(path("split.gguf")), Error);
    GgufWriter w3;
    w3.add_tensor("blk.0.attn_q.weight", DType::F32, {8, 1, 1, 1}, 1, v.data());
    w3.write(path("model.gguf"));
    EXPECT_THROW(read_imatrix(path("model.gguf")), Error);
}

// The observer sees each matrix product's input rows: dense matrices every
// row of the pass; an expert bank by expert index, its experts' rows adding
// up to rows × experts per token.
TEST_F(ImatrixFiles, ObserverSeesEveryMatrixOfAMoeModel) {
    const std::string file = path("moe.gguf");
    write_synthetic_gguf(make_synthetic(synth_tiny(synth_preset("qwen3-30b-a3b")), "F32", 3), file);
    auto model = Model::from_gguf(std::make_shared<GgufFile>(file));
    const ModelConfig& cfg = model->config();
    std::map<std::string, int64_t> rows_seen;
    std::map<std::string, std::vector<int64_t>> expert_rows;
    model->set_activation_observer([&](const Tensor& w, int64_t expert, const float* x, int64_t rows) {
        ASSERT_TRUE(std::isfinite(x[0]));
        if (expert < 0) {
            rows_seen[w.name] += rows;
            return;
        }
        auto& v = expert_rows[w.name];
        v.resize(static_cast<size_t>(w.ne[2]));
        v[static_cast<size_t>(expert)] += rows;
    });
    const int64_t n = 9;
    std::vector<int32_t> ids(n);
    for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 7 + 1) % cfg.n_vocab);
    ThreadPool pool(2);
    KvCache cache = model->make_cache(16);
    std::vector<float> logits(static_cast<size_t>(n * cfg.n_vocab));
    model->forward(ids.data(), n, cache, logits.data(), true, pool);
    for (int64_t l = 0; l < cfg.n_layer; ++l) {
        for (const char* m : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp"})
            EXPECT_EQ(rows_seen[fmt::format("blk.{}.{}.weight", l, m)], n) << l << " " << m;
        for (const char* m : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}) {
            const auto& v = expert_rows[fmt::format("blk.{}.{}.weight", l, m)];
            ASSERT_EQ(static_cast<int64_t>(v.size()), cfg.n_expert) << l << " " << m;
            int64_t total = 0;
            for (int64_t r : v) total += r;
            EXPECT_EQ(total, n * cfg.n_expert_used) << l << " " << m;
        }
    }
    model->set_activation_observer(nullptr);
    rows_seen.clear();
    cache.clear();
    model->forward(ids.data(), n, cache, logits.data(), false, pool);
    EXPECT_TRUE(rows_seen.empty());
}

// quern imatrix over the default model, then quantize with it: the file
// names every layer matrix, and the quantized file records it and runs.
TEST_F(ImatrixFiles, CommandThenQuantizeUsesIt) {
    if (!test::have_default_model()) GTEST_SKIP() << "default model missing (bash tools/fetch-model.sh)";
    const std::string q = std::string(QUERN_BINARY_DIR) + "/quern";
    const std::string text = std::string(QUERN_SOURCE_DIR) + "/tests/data/genesis-kjv.txt";
    const std::string im = path("m.imatrix.gguf"), f16 = path("f16.gguf"), out = path("q3.gguf");
    auto [st, log] = test::run_command(q + " imatrix -f " + text + " -c 128 --chunks 2 -o " + im + " --json");
    ASSERT_EQ(st, 0) << log;
    EXPECT_NE(log.find("\"entries\": 210"), std::string::npos) << log;  // 7 matrices × 30 layers
    std::tie(st, log) = test::run_command(q + " imatrix -f " + text + " -c 128 --chunks 1 -o " + im);
    EXPECT_NE(st, 0);
    EXPECT_NE(log.find("--force"), std::string::npos) << log;
    const Imatrix m = read_imatrix(im);
    EXPECT_EQ(m.chunk_count, 2);
    EXPECT_EQ(m.entries.at("blk.3.ffn_down.weight").counts, std::vector<float>{256});
    std::tie(st, log) = test::run_command(q + " quantize " + test::default_model_path() + " " + f16 + " F16 --allow-requantize");
    ASSERT_EQ(st, 0) << log;
    std::tie(st, log) = test::run_command(q + " quantize " + f16 + " " + out + " Q3_K_M --imatrix " + im);
    ASSERT_EQ(st, 0) << log;
    GgufFile g(out);
    EXPECT_EQ(g.get_string("quantize.imatrix.file"), im);
    EXPECT_EQ(g.get_int("quantize.imatrix.entries_count"), 210);
    EXPECT_EQ(g.get_int("quantize.imatrix.chunks_count"), 2);
    std::tie(st, log) = test::run_command(q + " run -m " + out + " -p 'In the beginning' -n 4 --temp 0");
    EXPECT_EQ(st, 0) << log;
}
