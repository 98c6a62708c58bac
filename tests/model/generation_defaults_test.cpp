// Sampling defaults from a Hugging Face folder's generation_config.json: the
// parser (values, nulls, do_sample false, malformed files named with their
// key), the precedence flag > file > built-in defaults in quern run, and
// request field > file > OpenAI's defaults in the server's request parser.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "hf_test_util.h"
#include "runtime/generation_defaults.h"
#include "server/api.h"

using namespace quern;
using namespace quern::hf_test;

namespace {

std::string parse_error(const std::string& text) {
    try {
        parse_generation_defaults(text, "m/generation_config.json");
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST(GenerationDefaults, ReadsTheSamplingKeys) {
    // Qwen2.5-Instruct's file.
    const GenerationDefaults g = parse_generation_defaults(
        R"({"bos_token_id": 151643, "pad_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
            "repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "transformers_version": "4.37.0"})",
        "q/generation_config.json");
    EXPECT_EQ(g.origin, "q/generation_config.json");
    EXPECT_FLOAT_EQ(*g.temperature, 0.7f);
    EXPECT_FLOAT_EQ(*g.top_p, 0.8f);
    EXPECT_EQ(*g.top_k, 20);
    EXPECT_FLOAT_EQ(*g.repetition_penalty, 1.05f);
    EXPECT_FALSE(g.min_p.has_value());
    EXPECT_FALSE(g.greedy);

    SamplingParams sp;  // quern run's built-in defaults
    const SamplingParams builtin = sp;
    const auto used = g.apply(sp, {});
    EXPECT_FLOAT_EQ(sp.temperature, 0.7f);
    EXPECT_EQ(sp.top_k, 20);
    EXPECT_FLOAT_EQ(sp.top_p, 0.8f);
    EXPECT_FLOAT_EQ(sp.repeat_penalty, 1.05f);
    EXPECT_EQ(sp.min_p, builtin.min_p);  // not in the file: the built-in default stays
    EXPECT_EQ(used, (std::vector<std::string>{"temperature 0.7", "top_k 20", "top_p 0.8", "repetition_penalty 1.05"}));

    // Fields given explicitly keep their values.
    SamplingParams given_sp;
    given_sp.temperature = 1.25f;
    given_sp.top_k = 3;
    SamplingGiven given;
    given.temperature = given.top_k = true;
    g.apply(given_sp, given);
    EXPECT_EQ(given_sp.temperature, 1.25f);
    EXPECT_EQ(given_sp.top_k, 3);
    EXPECT_FLOAT_EQ(given_sp.top_p, 0.8f);
}

TEST(GenerationDefaults, DoSampleFalseIsGreedyAndNullIsAbsent) {
    const GenerationDefaults g = parse_generation_defaults(
        R"({"do_sample": false, "temperature": 0.6, "top_p": null, "top_k": 50.0, "min_p": 0})", "g.json");
    EXPECT_TRUE(g.greedy);
    EXPECT_FALSE(g.top_p.has_value());
    EXPECT_EQ(*g.top_k, 50);
    EXPECT_EQ(*g.min_p, 0.0f);
    SamplingParams sp;
    EXPECT_EQ(g.apply(sp, {})[0], "temperature 0 (do_sample false)");
    EXPECT_EQ(sp.temperature, 0.0f);
    SamplingParams flag;
    flag.temperature = 0.9f;
    SamplingGiven given;
    given.temperature = true;
    g.apply(flag, given);
    EXPECT_EQ(flag.temperature, 0.9f);  // --temp wins over do_sample false
    // A file without sampling keys has no defaults; do_sample true alone neither.
    EXPECT_TRUE(parse_generation_defaults(R"({"eos_token_id": 2, "do_sample": true})", "g.json").empty());
}

TEST(GenerationDefaults, MalformedFilesNameTheFileAndKey) {
    const std::string f = "m/generation_config.json";
    for (const auto& [text, key] : std::vector<std::pair<std::string, std::string>>{
             {R"({"top_p": 1.5})", "'top_p'"},
             {R"({"top_p": 0})", "'top_p'"},
             {R"({"temperature": "hot"})", "'temperature'"},
             {R"({"temperature": -0.1})", "'temperature'"},
             {R"({"top_k": 2.5})", "'top_k'"},
             {R"({"top_k": -1})", "'top_k'"},
             {R"({"min_p": 2})", "'min_p'"},
             {R"({"repetition_penalty": 0})", "'repetition_penalty'"},
             {R"({"do_sample": "no"})", "'do_sample'"},
             {R"([1, 2])", "object"},
             {R"({"temperature": 0.7,)", "not valid JSON"}}) {
        const std::string e = parse_error(text);
        EXPECT_NE(e.find(f), std::string::npos) << text << " -> " << e;
        EXPECT_NE(e.find(key), std::string::npos) << text << " -> " << e;
    }
    EXPECT_EQ(parse_error(R"({"temperature": 0, "top_p": 1, "top_k": 0, "min_p": 1, "repetition_penalty": 1})"), "");
}

TEST(GenerationDefaults, ServerRequestFieldsWinOverTheFile) {
    SamplingParams def = server::api_default_sampling();
    parse_generation_defaults(R"({"temperature": 0.25, "top_k": 7, "repetition_penalty": 1.1})", "g.json").apply(def, {});
    const auto parse = [&](const std::string& body) {
        return server::parse_chat_request(server::parse_body(body), 1000, def).sampling;
    };
    const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
    SamplingParams sp = parse("{" + msgs + "}");
    EXPECT_FLOAT_EQ(sp.temperature, 0.25f);
    EXPECT_EQ(sp.top_k, 7);
    EXPECT_FLOAT_EQ(sp.repeat_penalty, 1.1f);
    EXPECT_EQ(sp.top_p, 1.0f);  // not in the file: OpenAI's default
    sp = parse("{" + msgs + R"(, "temperature": 0.9, "top_k": null, "repetition_penalty": 1.0})");
    EXPECT_FLOAT_EQ(sp.temperature, 0.9f);
    EXPECT_EQ(sp.top_k, 7);  // null: the default
    EXPECT_EQ(sp.repeat_penalty, 1.0f);
    // Without defaults given, OpenAI's.
    sp = server::parse_completion_request(server::parse_body(R"({"prompt": "x"})"), 1000).sampling;
    EXPECT_EQ(sp.temperature, 1.0f);
    EXPECT_EQ(sp.top_k, 0);
}

TEST_F(HfCheckpointCopy, QuernRunTakesSamplingDefaultsFromTheFolder) {
    const std::string quern = std::string(QUERN_BINARY_DIR) + "/quern";
    if (!fs::exists(quern)) GTEST_SKIP() << quern << " is not built";
    const fs::path d = copy("qwen2", "fp32");
    std::ofstream(d / "tokenizer.json") << byte_tokenizer_json();
    std::ofstream(d / "tokenizer_config.json") << R"({"add_bos_token": false})";
    const fs::path gen = d / "generation_config.json", out = dir_ / "out.txt", err = dir_ / "err.txt";
    auto slurp = [](const fs::path& p) {
        std::ifstream in(p);
        return std::string((std::istreambuf_iterator<char>(in)), {});
    };
    int rc = 0;
    auto run = [&](const std::string& flags) {
        const std::string cmd = "'" + quern + "' run -m '" + d.string() + "' -p 'hello' -n 12 --ignore-eos -t 2 " +
                                flags + " >'" + out.string() + "' 2>'" + err.string() + "'";
        rc = std::system(cmd.c_str());
        return slurp(out);
    };
    // The fixture's logits are peaked (spread ~9): a high temperature makes sampling show.
    const std::string sampled_flags = "--temp 50 --top-k 0 --top-p 1 --min-p 0 --seed 7";
    // The fixture's own file has no sampling keys: the built-in defaults.
    const std::string greedy = run("--temp 0");
    ASSERT_EQ(rc, 0) << slurp(err);
    EXPECT_EQ(slurp(err).find("sampling defaults"), std::string::npos) << slurp(err);
    const std::string sampled = run(sampled_flags);
    ASSERT_EQ(rc, 0) << slurp(err);
    ASSERT_NE(sampled, greedy) << "the test needs sampling to differ from greedy decoding";

    // do_sample false: greedy without any flag, and said so.
    std::ofstream(gen) << R"({"eos_token_id": 2, "do_sample": false, "temperature": 0.9})";
    EXPECT_EQ(run("--seed 7"), greedy);
    EXPECT_NE(slurp(err).find("sampling defaults from " + gen.string() + ": temperature 0 (do_sample false)"),
              std::string::npos)
        << slurp(err);
    // Explicit flags win over the file.
    EXPECT_EQ(run(sampled_flags), sampled);
    EXPECT_NE(slurp(err).find("overrides every default"), std::string::npos) << slurp(err);
    // The file's values replace the built-in defaults: the same text as the flags.
    std::ofstream(gen) << R"({"temperature": 50, "top_k": 0, "top_p": 1.0, "min_p": 0})";
    EXPECT_EQ(run("--seed 7"), sampled);
    EXPECT_NE(slurp(err).find("temperature 50, top_k 0, top_p 1, min_p 0"), std::string::npos) << slurp(err);
    // ... and a flag replaces one of them.
    EXPECT_EQ(run("--seed 7 --temp 0"), greedy);
    // A malformed value stops quern run, naming the file and the key.
    std::ofstream(gen) << R"({"top_p": 2})";
    run("");
    EXPECT_NE(rc, 0);
    const std::string e = slurp(err);
    EXPECT_NE(e.find(gen.string()), std::string::npos) << e;
    EXPECT_NE(e.find("'top_p'"), std::string::npos) << e;
}
