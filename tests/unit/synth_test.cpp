// Synthetic models: llama.cpp's Q4_K_M tensor choices, a GGUF file that the
// `gguf` Python package reads back identically, and a model that runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "quant/reference.h"

using namespace quern;

TEST(Synth, Q4KMTypesFollowLlamaCpp) {
    // 30 layers: use_more_bits(i) for i < 3, i >= 26, (i - 3) % 3 == 2
    EXPECT_EQ(synth_tensor_type("Q4_K_M", "blk.0.attn_v.weight", 0, 30, 1536), DType::Q6_K);
    EXPECT_EQ(synth_tensor_type("Q4_K_M", "blk.4.attn_v.weight", 4, 30, 1536), DType::Q4_K);
    EXPECT_EQ(synth_tensor_type("Q4_K_M", "blk.5.ffn_down.weight", 5, 30, 1536), DType::Q6_K);
    EXPECT_EQ(synth_tensor_type("Q4_K_M", "blk.29.ffn_down.weight", 29, 30, 1536), DType::Q6_K);
    EXPECT_EQ(synth_tensor_type("Q4_K_M", "blk.10.attn_q.weight", 10, 30, 4096), DType::Q4_K);
    EXPECT_EQ(synth_tensor_type("Q4_K_M", "output.weight", -1, 30, 4096), DType::Q6_K);
    // rows that are not whole 256-blocks fall back as llama.cpp does
    EXPECT_EQ(synth_tensor_type("Q4_K_M", "blk.10.attn_q.weight", 10, 30, 576), DType::Q5_0);
    EXPECT_EQ(synth_tensor_type("Q4_K_M", "output.weight", -1, 30, 576), DType::Q8_0);
    EXPECT_EQ(synth_tensor_type("Q8_0", "blk.1.ffn_up.weight", 1, 30, 576), DType::Q8_0);
    EXPECT_THROW(synth_tensor_type("Q9_Z", "x", 0, 1, 256), Error);
    EXPECT_THROW(synth_preset("nope"), Error);
}

TEST(Synth, FileReadsBackInGgufPythonAndRuns) {
    const auto dir = std::filesystem::temp_directory_path() / ("quern-synth-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "smollm2-q4km.gguf").string();
    SynthModel m = make_synthetic(synth_preset("smollm2-135m"), "Q4_K_M", 7);
    write_synthetic_gguf(m, path);

    GgufFile f(path);
    EXPECT_EQ(f.tensors().size(), m.order.size());
    EXPECT_EQ(f.get_int("llama.block_count"), 30);
    EXPECT_EQ(f.get_int("general.file_type"), 15);
    EXPECT_EQ(static_cast<int64_t>(f.get_string_array("tokenizer.ggml.tokens").size()), 49152);

    // Independent reader: the gguf package.
    if (std::system("python3 -c 'import gguf, numpy' 2>/dev/null") == 0) {
        const std::string out = (dir / "summary.json").string();
        const std::string cmd = std::string("python3 ") + QUERN_SOURCE_DIR + "/tests/python/synth_check.py " + path + " > " + out;
        ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
        std::ifstream in(out);
        const auto j = nlohmann::json::parse(in);
        EXPECT_EQ(j["arch"], "llama");
        EXPECT_EQ(j["block_count"], 30);
        EXPECT_EQ(j["n_vocab_tokens"], 49152);
        ASSERT_EQ(j["tensors"].size(), m.order.size());
        std::vector<float> row;
        for (const auto& info : f.tensors()) {
            const auto& t = j["tensors"][info.name];
            EXPECT_EQ(t["type"].get<int>(), static_cast<int>(info.type)) << info.name;
            EXPECT_EQ(t["ne"][0].get<int64_t>(), info.ne[0]) << info.name;
            row.resize(static_cast<size_t>(info.ne[0]));
            dequantize_row_ref(info.type, f.data(info), row.data(), info.ne[0]);
            double sum = 0;
            for (float v : row) sum += v;
            EXPECT_NEAR(t["row0_sum"].get<double>(), sum, 1e-6 * (1 + std::fabs(sum))) << info.name;
        }
    } else if (std::getenv("CI")) {
        ADD_FAILURE() << "python3 with gguf and numpy is needed in CI";
    }

    // And it runs: finite logits from the file and from the in-memory weights alike.
    auto model = Model::from_gguf(std::make_shared<GgufFile>(path));
    ThreadPool pool(0);
    KvCache cache = model->make_cache(32);
    std::vector<float> logits(static_cast<size_t>(model->config().n_vocab));
    std::vector<int32_t> ids{1, 300, 4000, 20000};
    model->forward(ids.data(), 4, cache, logits.data(), false, pool);
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
    std::filesystem::remove_all(dir);
}
