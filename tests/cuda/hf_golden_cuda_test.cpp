// Hugging Face checkpoints on the GPU against transformers: the tiny random
// models of tests/data/hf_gpu (tools/make_hf_golden.py --gpu-shapes: the
// architectures of tests/data/hf with heads of 32 elements and widths the
// CUDA decode path takes), fed token by token through a CUDA session, give
// logits at every position within cosine 0.9999 (fp32) / 0.999 (bf16) of
// transformers' and the same argmax (LongRoPE past its original context: one
// call, its last position), and the FP8 / NVFP4 checkpoints made from
// them match transformers on their dequantized weights (0.9999). A fixture
// folder that is absent, or an architecture the CUDA path refuses
// (cuda_unsupported), is skipped with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/session.h"
#include "backend/block_plan.h"
#include "cuda_test_util.h"
#include "model/hf_model.h"
#include "runtime/verify.h"
#include "../model/hf_test_util.h"

using namespace quern;
using quern::hf_test::argmax;
using quern::hf_test::read_logits;
namespace fs = std::filesystem;

namespace {

const std::string kGpuDir = std::string(QUERN_SOURCE_DIR) + "/tests/data/hf_gpu/";

struct Case {
    std::string arch, checkpoint;
    double min_cos;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.arch << "_" << c.checkpoint; }

class HfGoldenCuda : public ::testing::TestWithParam<Case> {};

TEST_P(HfGoldenCuda, LogitsMatchTransformersAtEveryPosition) {
    const Case& c = GetParam();
    if (cuda::CudaContext::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
    const std::string root = kGpuDir + c.arch + "/";
    if (!fs::exists(root + "golden.json"))
        GTEST_SKIP() << root << " not made (python3 tools/make_hf_golden.py --gpu-shapes, on a machine with torch)";
    std::ifstream jf(root + "golden.json");
    const nlohmann::json meta = nlohmann::json::parse(jf);
    if (!meta["checkpoints"].contains(c.checkpoint)) GTEST_SKIP() << c.checkpoint << " not in " << root;
    const auto& ck = meta["checkpoints"][c.checkpoint];
    const std::vector<int32_t> tokens = meta["tokens"].get<std::vector<int32_t>>();
    const int64_t n = static_cast<int64_t>(tokens.size()), V = meta["n_vocab"].get<int64_t>();
    const std::vector<float> ref = read_logits(root + ck["logits_file"].get<std::string>());
    ASSERT_EQ(ref.size(), static_cast<size_t>(n * V));

    auto model = load_hf_model(root + ck["folder"].get<std::string>());
    ASSERT_EQ(model->config().n_vocab, V);
    if (const std::string why = cuda_unsupported(model->program()); !why.empty())
        GTEST_SKIP() << "the CUDA path does not compute " << why << " yet";
    cuda::SessionOptions o;
    o.verbose = false;
    auto s = test::cuda_session(*model, o, 64);
    std::vector<float> out(static_cast<size_t>(V));
    double worst = 1.0;
    if (c.arch == "phi3_longrope") {
        // The prompt runs past LongRoPE's original context: transformers'
        // one pass (the reference) takes the long factors at every position,
        // and so does one call of all the tokens; its last row is compared.
        s->eval(tokens.data(), n, out.data());
        const float* r = ref.data() + (n - 1) * V;
        EXPECT_GE(cosine_similarity(out.data(), r, V), c.min_cos) << "last position";
        EXPECT_EQ(argmax(out.data(), V), argmax(r, V)) << "last position";
        std::printf("%s %s on the GPU: one call of %lld tokens, last cosine 1 - %.2e\n", c.arch.c_str(),
                    c.checkpoint.c_str(), static_cast<long long>(n), 1.0 - cosine_similarity(out.data(), r, V));
        return;
    }
    for (int64_t t = 0; t < n; ++t) {
        s->eval(&tokens[static_cast<size_t>(t)], 1, out.data());
        const float* r = ref.data() + t * V;
        const double cs = cosine_similarity(out.data(), r, V);
        worst = std::min(worst, cs);
        EXPECT_GE(cs, c.min_cos) << "position " << t;
        EXPECT_EQ(argmax(out.data(), V), argmax(r, V)) << "position " << t;
    }
    std::printf("%s %s on the GPU: %lld positions, worst cosine 1 - %.2e\n", c.arch.c_str(), c.checkpoint.c_str(),
                static_cast<long long>(n), 1.0 - worst);
}

INSTANTIATE_TEST_SUITE_P(
    Checkpoints, HfGoldenCuda,
    ::testing::Values(Case{"llama", "fp32", 0.9999}, Case{"llama", "bf16", 0.999}, Case{"qwen2", "fp32", 0.9999},
                      Case{"qwen2", "bf16", 0.999}, Case{"qwen3", "fp32", 0.9999}, Case{"qwen3", "bf16", 0.999},
                      Case{"gemma2", "fp32", 0.9999}, Case{"gemma2", "bf16", 0.999}, Case{"gemma3", "fp32", 0.9999},
                      Case{"gemma3", "bf16", 0.999}, Case{"mixtral", "fp32", 0.9999}, Case{"mixtral", "bf16", 0.999},
                      Case{"qwen3_moe", "fp32", 0.9999}, Case{"qwen3_moe", "bf16", 0.999},
                      Case{"phi3", "fp32", 0.9999}, Case{"phi3", "bf16", 0.999},
                      Case{"granite", "fp32", 0.9999}, Case{"granite", "bf16", 0.999},
                      Case{"phi3_longrope", "fp32", 0.9999}, Case{"phi3_longrope", "bf16", 0.999},
                      Case{"phi3_longrope_short", "fp32", 0.9999}, Case{"phi3_longrope_short", "bf16", 0.999},
                      Case{"llama", "fp8_block", 0.9999}, Case{"llama", "fp8_channel", 0.9999},
                      Case{"llama", "fp8_tensor", 0.9999}, Case{"llama", "nvfp4", 0.9999},
                      Case{"qwen3", "fp8_block", 0.9999}, Case{"qwen3", "nvfp4", 0.9999},
                      Case{"qwen3_5", "fp32", 0.9999}, Case{"qwen3_5", "bf16", 0.999},
                      Case{"qwen3_5", "fp8_block", 0.9999}, Case{"qwen3_5", "nvfp4", 0.9999},
                      Case{"qwen3_5_moe", "fp32", 0.9999}, Case{"qwen3_5_moe", "bf16", 0.999},
                      Case{"qwen3_5_moe", "fp8_block", 0.9999}, Case{"qwen3_5_moe", "nvfp4", 0.9999}),
    [](const auto& info) { return info.param.arch + "_" + info.param.checkpoint; });

}  // namespace
