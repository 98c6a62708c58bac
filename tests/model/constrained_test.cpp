// Constrained decoding in the serving engine (GenerationRequest::grammar)
// on the default model: requests for a JSON object, sampled at temperature 1
// with many seeds and greedy, all come back as JSON objects that parse (or,
// cut at max_tokens, as a prefix the grammar still accepts); a small GBNF
// grammar's sentences likewise; and constrained and free requests share
// batches without touching each other's tokens. Once with the masks built on
// demand, once with the engine's start-up warm-up (EngineOptions::
// warm_grammar, as `quern serve` runs), which the first requests wait for.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>

#include "formats/gguf.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace quern;

namespace {

struct Out {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<int32_t> tokens;
    FinishReason finish = FinishReason::None;
    bool done = false;
};

void check_constrained_requests(bool warm_grammar) {
    auto file = std::make_shared<GgufFile>(test::default_model_path());
    auto model = Model::from_gguf(file);
    auto tok = Tokenizer::from_gguf(*file);
    EngineOptions o;
    o.n_ctx = 512;
    o.n_parallel = 8;
    o.n_threads = 2;
    o.warm_grammar = warm_grammar;
    auto engine = make_engine(*model, *tok, o);
    const auto json = grammar::Grammar::json(true);
    const auto digits = grammar::Grammar::parse(R"(root ::= "The answer is " [1-9] [0-9]? "." )");
    const std::vector<std::string> asks = {
        "Describe a cat as JSON.", "Give me a JSON object with your name and age.", "List three fruits.",
        "Write a poem.", "What is 2+2?", "Make a JSON config for a web server."};
    constexpr int kRequests = 24;
    std::vector<Out> outs(kRequests);
    for (int i = 0; i < kRequests; ++i) {
        GenerationRequest r;
        const std::string chat = "<|im_start|>user\n" + asks[static_cast<size_t>(i) % asks.size()] +
                                 "<|im_end|>\n<|im_start|>assistant\n";
        r.prompt = tok->encode(chat, false, true);
        r.max_tokens = 160;
        r.sampling.temperature = i % 4 == 0 ? 0.0f : 1.0f;
        r.sampling.top_k = 0;
        r.sampling.top_p = 1.0f;
        r.sampling.min_p = 0.0f;
        r.sampling.seed = static_cast<uint64_t>(1000 + i);
        if (i % 6 != 5) r.grammar = i % 6 == 4 ? digits : json;  // every sixth free
        Out& out = outs[static_cast<size_t>(i)];
        engine->submit(std::move(r), [&out](const TokenEvent& e) {
            std::lock_guard<std::mutex> lk(out.mu);
            if (e.token >= 0) out.tokens.push_back(e.token);
            if (e.last) {
                out.finish = e.finish;
                out.done = true;
                out.cv.notify_all();
            }
            return true;
        });
    }
    int whole = 0;
    for (int i = 0; i < kRequests; ++i) {
        Out& out = outs[static_cast<size_t>(i)];
        std::unique_lock<std::mutex> lk(out.mu);
        ASSERT_TRUE(out.cv.wait_for(lk, std::chrono::seconds(300), [&] { return out.done; }));
        const std::string text = tok->decode(out.tokens, false);
        if (i % 6 == 5) continue;  // free
        const auto g = i % 6 == 4 ? digits : json;
        grammar::GrammarState st(g);
        EXPECT_TRUE(st.advance_bytes(text)) << "request " << i << ": " << text;
        if (out.finish == FinishReason::Stop) {
            ++whole;
            EXPECT_TRUE(st.accepting()) << "request " << i << ": " << text;
            if (g == json) {
                const auto j = nlohmann::json::parse(text, nullptr, false);
                EXPECT_TRUE(!j.is_discarded() && j.is_object()) << "request " << i << ": " << text;
            }
        } else {
            EXPECT_EQ(out.finish, FinishReason::Length) << "request " << i;
        }
    }
    EXPECT_GT(whole, kRequests / 3) << "most constrained requests should finish within 160 tokens";
}

TEST(Constrained, JsonObjectsAndGrammarsFromTheDefaultModel) {
    if (!test::have_default_model()) GTEST_SKIP() << "default model missing";
    check_constrained_requests(false);
}

TEST(Constrained, TheSameRightAfterTheStartUpWarmUp) {
    if (!test::have_default_model()) GTEST_SKIP() << "default model missing";
    check_constrained_requests(true);
}

}  // namespace
