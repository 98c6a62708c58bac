// The server's pure parts: request validation (every field, every kind of
// bad value), stop-string matching with holdback, response and chunk
// shapes, and the generation driver over a scripted engine (stop strings
// across tokens, UTF-8 never split, log-probabilities in step with the text,
// n choices and their seeds, usage).
#include <gtest/gtest.h>

#include "grammar/grammar.h"

#include <cmath>
#include <random>

#include <fstream>
#include <sstream>

#include "chat/chat.h"
#include "fake_engine.h"
#include "server/anthropic.h"
#include "server/api.h"
#include "server/responses.h"
#include "server/generation.h"
#include "server/stop.h"
#include "tokenizer/tokenizer.h"

using namespace quern;
using namespace quern::server;

namespace {

const int32_t kVocab = 1000;

ApiRequest chat_req(const std::string& body) { return parse_chat_request(parse_body(body), kVocab); }
ApiRequest completion(const std::string& body) { return parse_completion_request(parse_body(body), kVocab); }

/// The status and param of the ApiError `f` throws (0 when none).
template <class F>
std::pair<int, std::string> error_of(F f) {
    try {
        f();
    } catch (const ApiError& e) {
        return {e.status, e.param};
    }
    return {0, ""};
}

bool valid_utf8(const std::string& s) {
    size_t i = 0;
    while (i < s.size()) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (n == 0 || i + n > s.size()) return false;
        for (size_t k = 1; k < n; ++k)
            if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
        i += n;
    }
    return true;
}

}  // namespace

// ---------------------------------------------------------------- validation

TEST(ServerApi, ChatDefaultsAreOpenAIs) {
    const ApiRequest r = chat_req(R"({"model": "m", "messages": [{"role": "user", "content": "hi"}]})");
    EXPECT_EQ(r.model, "m");
    EXPECT_EQ(r.n, 1);
    EXPECT_EQ(r.max_tokens, -1);
    EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);
    EXPECT_FLOAT_EQ(r.sampling.top_p, 1.0f);
    EXPECT_EQ(r.sampling.top_k, 0);
    EXPECT_FLOAT_EQ(r.sampling.min_p, 0.0f);
    EXPECT_FLOAT_EQ(r.sampling.repeat_penalty, 1.0f);
    EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 0.0f);
    EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, 0.0f);
    EXPECT_FALSE(r.seed.has_value());
    EXPECT_EQ(r.top_logprobs, -1);
    EXPECT_FALSE(r.stream);
    EXPECT_TRUE(r.stop.empty());
}

TEST(ServerApi, ChatFieldsAreRead) {
    const ApiRequest r = chat_req(R"({"messages": [{"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": null, "tool_calls": []}],
        "max_tokens": 5, "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5, "top_k": 40, "min_p": 0.1,
        "presence_penalty": -2, "frequency_penalty": 2, "repetition_penalty": 1.3, "seed": -5, "stop": "x",
        "n": 3, "logprobs": true, "top_logprobs": 2, "logit_bias": {"5": -100, "7": 3.5}, "user": "u",
        "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true,
        "some_future_field": {"deep": [1, 2]}})");
    ASSERT_EQ(r.messages.size(), 3u);
    EXPECT_EQ(r.messages[0]["role"], "system");
    EXPECT_EQ(r.messages[1]["content"], "a\nb");
    EXPECT_TRUE(r.messages[2]["content"].is_null());
    EXPECT_FALSE(r.messages[2].contains("tool_calls"));  // an empty list is dropped (normalize_tool_calls)
    EXPECT_EQ(r.max_tokens, 7);
    EXPECT_FLOAT_EQ(r.sampling.temperature, 0.0f);
    EXPECT_FLOAT_EQ(r.sampling.top_p, 0.5f);
    EXPECT_EQ(r.sampling.top_k, 40);
    EXPECT_FLOAT_EQ(r.sampling.min_p, 0.1f);
    EXPECT_FLOAT_EQ(r.sampling.presence_penalty, -2.0f);
    EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, 2.0f);
    EXPECT_FLOAT_EQ(r.sampling.repeat_penalty, 1.3f);
    EXPECT_EQ(r.seed, -5);
    EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
    EXPECT_EQ(r.n, 3);
    EXPECT_EQ(r.top_logprobs, 2);
    ASSERT_EQ(r.logit_bias.size(), 2u);
    EXPECT_EQ(r.logit_bias[0].first, 5);
    EXPECT_FLOAT_EQ(r.logit_bias[0].second, -100.0f);
    EXPECT_TRUE(r.stream);
    EXPECT_TRUE(r.include_usage);
    EXPECT_TRUE(r.ignore_eos);
    EXPECT_EQ(r.user, "u");
    // logprobs without top_logprobs: the token's own only
    EXPECT_EQ(chat_req(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true})").top_logprobs, 0);
    // nulls mean the default
    const ApiRequest d = chat_req(R"({"messages": [{"role": "user", "content": "x"}], "temperature": null, "stop": null,
                                  "n": null, "seed": null, "max_tokens": null, "stream_options": null})");
    EXPECT_FLOAT_EQ(d.sampling.temperature, 1.0f);
    EXPECT_EQ(d.n, 1);
    // an integral float is an integer
    EXPECT_EQ(chat_req(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 12.0})").max_tokens, 12);
}

TEST(ServerApi, ChatRejectsBadValuesNamingTheField) {
    const std::string m = R"("messages": [{"role": "user", "content": "hi"}])";
    struct Case {
        std::string body;
        std::string param;
    };
    const std::vector<Case> cases = {
        {R"({})", "messages"},
        {R"({"messages": []})", "messages"},
        {R"({"messages": "hi"})", "messages"},
        {R"({"messages": [1]})", "messages[0]"},
        {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
        {R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role"},
        {R"({"messages": [{"role": 5, "content": "x"}]})", "messages[0].role"},
        {R"({"messages": [{"role": "user"}]})", "messages[0].content"},
        {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
        {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})", "messages[0].content"},
        {R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})", "messages[0].content"},
        {"{" + m + R"(, "temperature": "hot"})", "temperature"},
        {"{" + m + R"(, "temperature": 2.5})", "temperature"},
        {"{" + m + R"(, "temperature": -1})", "temperature"},
        {"{" + m + R"(, "temperature": true})", "temperature"},
        {"{" + m + R"(, "temperature": 1e999})", ""},  // not even JSON nlohmann accepts
        {"{" + m + R"(, "top_p": 1.5})", "top_p"},
        {"{" + m + R"(, "top_k": -2})", "top_k"},
        {"{" + m + R"(, "top_k": 1.5})", "top_k"},
        {"{" + m + R"(, "min_p": 2})", "min_p"},
        {"{" + m + R"(, "presence_penalty": 3})", "presence_penalty"},
        {"{" + m + R"(, "frequency_penalty": -3})", "frequency_penalty"},
        {"{" + m + R"(, "repetition_penalty": 0})", "repetition_penalty"},
        {"{" + m + R"(, "n": 0})", "n"},
        {"{" + m + R"(, "n": 1000})", "n"},
        {"{" + m + R"(, "n": "2"})", "n"},
        {"{" + m + R"(, "max_tokens": 0})", "max_tokens"},
        {"{" + m + R"(, "max_tokens": -5})", "max_tokens"},
        {"{" + m + R"(, "max_tokens": 2.5})", "max_tokens"},
        {"{" + m + R"(, "max_tokens": 1e30})", "max_tokens"},
        {"{" + m + R"(, "max_tokens": 99999999999999999999999})", "max_tokens"},
        {"{" + m + R"(, "max_completion_tokens": 0})", "max_completion_tokens"},
        {"{" + m + R"(, "seed": 1e30})", "seed"},
        {"{" + m + R"(, "seed": 9223372036854775808.0})", "seed"},
        {"{" + m + R"(, "seed": "1"})", "seed"},
        {"{" + m + R"(, "stop": 5})", "stop"},
        {"{" + m + R"(, "stop": ["a", 5]})", "stop"},
        {"{" + m + R"(, "stop": ["a", "b", "c", "d", "e"]})", "stop"},
        {"{" + m + R"(, "logit_bias": {"abc": 1}})", "logit_bias"},
        {"{" + m + R"(, "logit_bias": {"5": 101}})", "logit_bias"},
        {"{" + m + R"(, "logit_bias": {"5": "x"}})", "logit_bias"},
        {"{" + m + R"(, "logit_bias": {"1000": 1}})", "logit_bias"},
        {"{" + m + R"(, "logit_bias": {"-1": 1}})", "logit_bias"},
        {"{" + m + R"(, "logit_bias": [1]})", "logit_bias"},
        {"{" + m + R"(, "logprobs": 1})", "logprobs"},
        {"{" + m + R"(, "top_logprobs": 2})", "top_logprobs"},
        {"{" + m + R"(, "logprobs": true, "top_logprobs": 21})", "top_logprobs"},
        {"{" + m + R"(, "stream": "yes"})", "stream"},
        {"{" + m + R"(, "stream_options": {"include_usage": true}})", "stream_options"},
        {"{" + m + R"(, "stream": true, "stream_options": {"include_usage": 1}})", "include_usage"},
        {"{" + m + R"(, "model": 5})", "model"},
        {"{" + m + R"(, "user": 5})", "user"},
        {"{" + m + R"(, "response_format": {"type": "json_schema"}})", "response_format"},
        {"{" + m + R"(, "tool_choice": "required"})", "tool_choice"},
    };
    for (const Case& c : cases) {
        const auto [status, param] = error_of([&] { chat_req(c.body); });
        EXPECT_EQ(status, 400) << c.body;
        EXPECT_EQ(param, c.param) << c.body;
    }
}

// Messages as agent frameworks send them, normalised before rendering (as
// vLLM does) and rendered by the real templates: an empty tool-call list
// (Llama 3.1's template refuses it), arguments as JSON text (Qwen2.5's and
// Qwen3.5's templates write or iterate an object), text parts (templates
// that take strings).
TEST(ServerApi, MessagesAreNormalisedForTheRealTemplates) {
    const auto render = [](const std::string& file, const ApiRequest& r) {
        std::ifstream f(std::string(QUERN_TESTDATA_DIR) + "/chat-templates/" + file);
        EXPECT_TRUE(f) << file;
        std::stringstream ss;
        ss << f.rdbuf();
        quern::chat::ChatTemplate t(ss.str(), "<s>", "</s>", file);
        quern::chat::ChatOptions o;
        o.tools = r.tools.empty() ? quern::chat::Json() : quern::chat::Json::parse(r.tools.dump());
        return t.apply(quern::chat::Json::parse(r.messages.dump()), o);
    };
    const ApiRequest empty = chat_req(R"({"messages": [{"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "tool_calls": []}, {"role": "user", "content": "bye"}]})");
    EXPECT_NO_THROW(render("meta-llama-Llama-3.1-8B-Instruct.jinja", empty));
    const ApiRequest args = chat_req(R"({"messages": [{"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
          "properties": {"city": {"type": "string"}}}}}]})");
    EXPECT_TRUE(args.messages[1]["tool_calls"][0]["function"]["arguments"].is_object());
    const std::string q25 = render("Qwen-Qwen2.5-7B-Instruct.jinja", args);
    EXPECT_NE(q25.find(R"("arguments": {"city": "Paris"})"), std::string::npos) << q25;
    const std::string q35 = render("Qwen3.5-4B.jinja", args);
    EXPECT_NE(q35.find("<parameter=city>\nParis\n</parameter>"), std::string::npos) << q35;
    const ApiRequest parts = chat_req(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "one"},
        {"type": "text", "text": "two"}]}]})");
    EXPECT_NE(render("meta-llama-Llama-3.1-8B-Instruct.jinja", parts).find("one\ntwo"), std::string::npos);
}

// Every field that would change the output and is not implemented is
// refused with a 400 naming it, on both endpoints (README's compatibility
// table lists them), never accepted and ignored.
TEST(ServerApi, UnimplementedOutputFieldsAreRefusedByName) {
    const std::vector<std::pair<std::string, std::string>> fields = {
        {"response_format", R"({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "string", "pattern": "(?=a)b"}}})"},
        {"response_format", R"({"type": "json_schema"})"},
        {"guided_json", R"({"type": "number", "multipleOf": 2})"},
        {"guided_regex", R"("(?=a)b")"},
        {"guided_choice", R"([])"},
        {"guided_grammar", R"("root ::= missing")"},
        {"guided_whitespace_pattern", R"("[ ]*")"},
        {"guided_decoding_backend", R"("xgrammar")"},
        {"grammar", R"("root ::= undefined-rule")"},
        {"grammar", R"(42)"},
        {"json_schema", R"({})"},
        {"functions", R"([{"name": "f"}])"},
        {"function_call", R"("auto")"},
        {"logits_processors", R"(["x"])"},
        {"audio", R"({"voice": "x"})"},
        {"modalities", R"(["text", "audio"])"},
        {"web_search_options", R"({})"},
    };
    for (const auto& [name, value] : fields) {
        for (bool chat : {true, false}) {
            const std::string body = chat ? R"({"messages": [{"role": "user", "content": "x"}], ")" + name + "\": " + value + "}"
                                          : R"({"prompt": "x", ")" + name + "\": " + value + "}";
            try {
                chat ? chat_req(body) : parse_completion_request(parse_body(body), kVocab);
                ADD_FAILURE() << name << " accepted (" << (chat ? "chat" : "completions") << ")";
            } catch (const ApiError& e) {
                EXPECT_EQ(e.status, 400);
                EXPECT_EQ(e.param, name) << e.what();
            }
        }
    }
    // vLLM's guided fields: each a grammar; structured_outputs' other kinds
    // refused by name; two at once refused
    for (const char* f : {R"("guided_json": {"type": "object", "properties": {"a": {"type": "integer"}}})",
                          R"("guided_json": "{\"type\": \"string\"}")", R"("guided_regex": "[a-c]{2}x?")",
                          R"("guided_choice": ["yes", "no \"maybe\""])", R"("guided_grammar": "root ::= \"a\"+")",
                          R"("structured_outputs": {"choice": ["a", "b"]})", R"("structured_outputs": {"regex": "\\d+"})"}) {
        const ApiRequest r = chat_req(std::string(R"({"messages": [{"role": "user", "content": "x"}], )") + f + "}");
        EXPECT_TRUE(r.grammar) << f;
    }
    const auto accepts = [&](const std::string& f, const std::string& text) {
        const ApiRequest r = chat_req(std::string(R"({"messages": [{"role": "user", "content": "x"}], )") + f + "}");
        grammar::GrammarState st(r.grammar);
        return st.advance_bytes(text) && st.accepting();
    };
    EXPECT_TRUE(accepts(R"("guided_regex": "[a-c]{2}x?")", "abx"));
    EXPECT_FALSE(accepts(R"("guided_regex": "[a-c]{2}x?")", "abxx"));  // matched whole
    EXPECT_TRUE(accepts(R"("guided_choice": ["yes", "no \"maybe\""])", "no \"maybe\""));
    EXPECT_FALSE(accepts(R"("guided_choice": ["yes", "no"])", "yesno"));
    EXPECT_TRUE(accepts(R"("guided_json": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})", R"({"a": 5})"));
    for (const auto& [f, param] : std::vector<std::pair<std::string, std::string>>{
             {R"("structured_outputs": {"json_object": true})", "structured_outputs.json_object"},
             {R"("guided_regex": "a", "guided_choice": ["a"])", "guided_choice"},
             {R"("guided_regex": "a", "response_format": {"type": "json_object"})", "guided_regex"}}) {
        try {
            chat_req(std::string(R"({"messages": [{"role": "user", "content": "x"}], )") + f + "}");
            ADD_FAILURE() << f << " accepted";
        } catch (const ApiError& e) {
            EXPECT_EQ(e.param, param) << e.what();
        }
    }
    // and what changes nothing or is implemented is accepted
    EXPECT_NO_THROW(chat_req(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "text"},
        "modalities": ["text"], "metadata": {"a": "b"}, "store": false, "service_tier": "auto", "user": "u",
        "parallel_tool_calls": false, "tool_choice": "none", "reasoning_format": "none"})"));
    // constrained decoding: json_object, or a GBNF grammar
    EXPECT_NE(chat_req(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})")
                  .grammar,
              nullptr);
    EXPECT_NE(parse_completion_request(parse_body(R"({"prompt": "x", "grammar": "root ::= [a-z]+"})"), kVocab).grammar,
              nullptr);
}

TEST(ServerApi, CompletionPrompts) {
    const ApiRequest s = completion(R"({"prompt": "hello"})");
    EXPECT_EQ(s.prompt_texts, std::vector<std::string>{"hello"});
    EXPECT_EQ(s.max_tokens, 16);  // OpenAI's default for completions
    EXPECT_EQ(s.n_prompts(), 1u);
    EXPECT_EQ(completion(R"({"prompt": ["a", "b"]})").prompt_texts.size(), 2u);
    const ApiRequest t = completion(R"({"prompt": [1, 2, 3]})");
    ASSERT_EQ(t.prompt_tokens.size(), 1u);
    EXPECT_EQ(t.prompt_tokens[0], (std::vector<int32_t>{1, 2, 3}));
    EXPECT_EQ(completion(R"({"prompt": [[1], [2, 3]]})").prompt_tokens.size(), 2u);
    EXPECT_EQ(completion(R"({"prompt": "x", "logprobs": 3})").top_logprobs, 3);
    EXPECT_EQ(completion(R"({"prompt": "x", "logprobs": 0})").top_logprobs, 0);
    EXPECT_EQ(completion(R"({"prompt": "x", "best_of": 1})").n, 1);
    for (const char* body : {R"({})", R"({"prompt": 5})", R"({"prompt": []})", R"({"prompt": ["a", 1]})",
                             R"({"prompt": [1, "a"]})", R"({"prompt": [1, 1000]})", R"({"prompt": [-1]})",
                             R"({"prompt": [[1], []]})", R"({"prompt": [[1], 2]})", R"({"prompt": [1.5]})",
                             R"({"prompt": [{}]})", R"({"prompt": "x", "logprobs": true})",
                             R"({"prompt": "x", "logprobs": 21})", R"({"prompt": "x", "echo": true})",
                             R"({"prompt": "x", "suffix": "y"})", R"({"prompt": "x", "best_of": 3})"}) {
        EXPECT_EQ(error_of([&] { completion(body); }).first, 400) << body;
    }
}

TEST(ServerApi, BodiesThatAreNotJsonObjects) {
    for (const char* body : {"", "{", "nope", "[1, 2]", "\"x\"", "42", "{\"a\": NaN}", "{\"a\": 1,}",
                             "{\"messages\": [}", "\xff\xfe"}) {
        EXPECT_EQ(error_of([&] { parse_body(body); }).first, 400) << body;
    }
    const std::string deep = std::string(10000, '[') + std::string(10000, ']');
    EXPECT_EQ(error_of([&] { parse_body("{\"a\": " + deep + "}"); }).first, 400);
    // brackets inside strings are not nesting
    EXPECT_NO_THROW(parse_body("{\"a\": \"" + std::string(1000, '[') + "\\\"\"}"));
}

TEST(ServerApi, ErrorShape) {
    const Json e = error_json(ApiError(400, "bad 'x'", "x", "c"));
    EXPECT_EQ(e["error"]["message"], "bad 'x'");
    EXPECT_EQ(e["error"]["type"], "invalid_request_error");
    EXPECT_EQ(e["error"]["param"], "x");
    EXPECT_EQ(e["error"]["code"], "c");
    const Json n = error_json(404, "none");
    EXPECT_TRUE(n["error"]["param"].is_null());
    EXPECT_TRUE(n["error"]["code"].is_null());
    EXPECT_EQ(error_json(401, "k")["error"]["type"], "authentication_error");
}

TEST(ServerApi, ChunksAndResponses) {
    ResponseMeta m{Endpoint::Chat, "chatcmpl-1", 123, "mod"};
    const std::string role = "assistant";
    const Json first = chunk_json(m, 0, &role, "", nullptr, "", false);
    EXPECT_EQ(first["object"], "chat.completion.chunk");
    EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
    EXPECT_EQ(first["choices"][0]["delta"]["content"], "");
    EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
    EXPECT_FALSE(first.contains("usage"));
    const Json text = chunk_json(m, 1, nullptr, "hé", nullptr, "", true);
    EXPECT_EQ(text["choices"][0]["index"], 1);
    EXPECT_EQ(text["choices"][0]["delta"]["content"], "hé");
    EXPECT_FALSE(text["choices"][0]["delta"].contains("role"));
    EXPECT_TRUE(text.contains("usage") && text["usage"].is_null());
    const Json fin = chunk_json(m, 0, nullptr, "", nullptr, "stop", false);
    EXPECT_TRUE(fin["choices"][0]["delta"].empty());
    EXPECT_EQ(fin["choices"][0]["finish_reason"], "stop");
    const Json u = usage_chunk_json(m, Usage{10, 5, 4});
    EXPECT_TRUE(u["choices"].empty());
    EXPECT_EQ(u["usage"]["total_tokens"], 15);
    EXPECT_EQ(u["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
    EXPECT_EQ(sse_event(Json{{"a", 1}}), "data: {\"a\":1}\n\n");
    EXPECT_EQ(sse_done(), "data: [DONE]\n\n");

    TokenLogprob lp{"\xe4\xbd", -0.5f, {{"a", -0.5f}, {"b", -std::numeric_limits<float>::infinity()}}, 3};
    const Json cl = chat_logprobs_json({lp});
    EXPECT_EQ(cl["content"][0]["bytes"], Json::array({0xe4, 0xbd}));
    EXPECT_EQ(cl["content"][0]["top_logprobs"][1]["logprob"], -9999.0);
    const Json pl = completion_logprobs_json({lp});
    EXPECT_EQ(pl["text_offset"][0], 3);
    EXPECT_EQ(pl["top_logprobs"][0]["a"], -0.5);
    // invalid UTF-8 never makes the serializer throw
    EXPECT_NO_THROW(dump(cl));
    EXPECT_NE(dump(cl).find("\xef\xbf\xbd"), std::string::npos);

    ResponseMeta cm{Endpoint::Completions, "cmpl-1", 1, "mod"};
    const Json r = response_json(cm, {ChoiceResult{0, "txt", "length", {}, false}}, Usage{3, 2, 0});
    EXPECT_EQ(r["object"], "text_completion");
    EXPECT_EQ(r["choices"][0]["text"], "txt");
    EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
    EXPECT_EQ(r["usage"]["completion_tokens"], 2);
}

// ---------------------------------------------------------------- stop strings

TEST(StopMatcher, PassesTextThroughWithoutStops) {
    StopMatcher s({"", ""});
    EXPECT_EQ(s.push("abc"), "abc");
    EXPECT_EQ(s.flush(), "");
    EXPECT_FALSE(s.stopped());
}

TEST(StopMatcher, StopAcrossPiecesIsHeldBackThenDropped) {
    StopMatcher s({"STOP"});
    EXPECT_EQ(s.push("Hello wo"), "Hello wo");
    EXPECT_EQ(s.push("rld ST"), "rld ");  // "ST" may begin STOP
    EXPECT_EQ(s.held(), 2u);
    EXPECT_EQ(s.push("O"), "");
    EXPECT_EQ(s.push("P and more"), "");
    EXPECT_TRUE(s.stopped());
    EXPECT_EQ(s.matched(), "STOP");
    EXPECT_EQ(s.push("x"), "");
    EXPECT_EQ(s.flush(), "");
}

TEST(StopMatcher, HeldTextIsReleasedWhenItDiverges) {
    StopMatcher s({"abc"});
    EXPECT_EQ(s.push("xa"), "x");
    EXPECT_EQ(s.push("b"), "");
    EXPECT_EQ(s.push("d"), "abd");
    EXPECT_EQ(s.push("ab"), "");
    EXPECT_EQ(s.flush(), "ab");  // the end: what was held goes out
    EXPECT_FALSE(s.stopped());
}

TEST(StopMatcher, EarliestOfSeveralStopsWins) {
    StopMatcher s({"cd", "bcde"});
    EXPECT_EQ(s.push("abcdef"), "a");
    EXPECT_EQ(s.matched(), "bcde");
    StopMatcher t({"\n\n", "User:"});
    EXPECT_EQ(t.push("Hi\nUs"), "Hi\n");
    EXPECT_EQ(t.push("er: x"), "");
    EXPECT_EQ(t.matched(), "User:");
}

TEST(StopMatcher, MultiByteStops) {
    StopMatcher s({"你好"});
    EXPECT_EQ(s.push("a\xe4\xbd\xa0"), "a");  // 你 may begin 你好
    EXPECT_EQ(s.push("\xe5\xa5\xbd!"), "");
    EXPECT_TRUE(s.stopped());
}

TEST(StopMatcher, RandomSplitsAgreeWithFindingTheStopInTheWholeText) {
    std::mt19937 rng(1234);
    std::printf("seed 1234\n");
    const std::vector<std::vector<std::string>> stop_sets = {{"aba"}, {"bb", "aab"}, {"abab", "b a"}, {"a"}, {"ba", "ab"}};
    for (int iter = 0; iter < 3000; ++iter) {
        const auto& stops = stop_sets[static_cast<size_t>(iter) % stop_sets.size()];
        std::string text;
        const size_t len = rng() % 24;
        for (size_t i = 0; i < len; ++i) text += "ab "[rng() % 3];
        size_t cut = std::string::npos;
        for (const auto& st : stops) cut = std::min(cut, text.find(st));
        const std::string expect = cut == std::string::npos ? text : text.substr(0, cut);
        StopMatcher s(stops);
        std::string got;
        size_t i = 0;
        while (i < text.size()) {
            const size_t n = 1 + rng() % 4;
            got += s.push(text.substr(i, n));
            i += n;
            // what went out is final: a prefix of the answer, never containing a stop
            ASSERT_EQ(expect.compare(0, got.size(), got), 0) << text;
        }
        got += s.flush();
        ASSERT_EQ(got, expect) << "text '" << text << "'";
        ASSERT_EQ(s.stopped(), cut != std::string::npos) << text;
    }
}

// ---------------------------------------------------------------- generation driver

namespace {

class GenerationTest : public ::testing::Test {
protected:
    void SetUp() override {
        const std::string path = std::string(QUERN_TESTDATA_DIR) + "/vocab/ggml-vocab-gpt-2.gguf";
        tok_ = Tokenizer::from_file(path);
        script_ = tok_->encode(kText, false, false);
        EngineOptions eo;
        eo.n_ctx = 256;
        eo.n_parallel = 4;
        eo.max_queue = 8;
        engine_ = std::make_unique<test::FakeEngine>([this](const GenerationRequest&) { return script_; }, eo);
    }
    static constexpr const char* kText = "Hello, wörld! 你好, 🙂 dear STOP and then more text";
    std::unique_ptr<Tokenizer> tok_;
    std::vector<int32_t> script_;
    std::unique_ptr<test::FakeEngine> engine_;
};

/// Records what a generation sends, chunk by chunk.
struct RecordingSink : Sink {
    std::vector<std::string> texts[8];
    std::vector<TokenLogprob> lps[8];
    std::string reason[8];
    bool text(int c, const std::string& t, const std::vector<TokenLogprob>* l) override {
        texts[c].push_back(t);
        if (l) lps[c].insert(lps[c].end(), l->begin(), l->end());
        return true;
    }
    bool finish(int c, const std::string& r) override {
        reason[c] = r;
        return true;
    }
    std::string joined(int c) const {
        std::string s;
        for (const auto& t : texts[c]) s += t;
        return s;
    }
};

ApiRequest request(const std::string& extra) {
    return parse_completion_request(parse_body(R"({"prompt": [1, 2, 3, 4], "max_tokens": 1000)" + extra + "}"), 50257);
}

}  // namespace

TEST_F(GenerationTest, StopStringAcrossTokensEndsTheChoiceAndCancelsTheEngine) {
    // the stop string spans several tokens (" ST", "OP" in GPT-2's vocabulary) and ends before " and"
    ApiRequest r = request(R"(, "stop": ["OP an"])");
    // tokens slow enough that the stop string is seen long before the script ends
    engine_ = std::make_unique<test::FakeEngine>([this](const GenerationRequest&) { return script_; }, engine_->options(),
                                                 std::chrono::milliseconds(5));
    Generation g(*engine_, *tok_, r, {{1, 2, 3, 4}}, mono_seconds());
    g.submit();
    RecordingSink sink;
    ASSERT_TRUE(g.run(sink));
    const auto res = g.results();
    ASSERT_EQ(res.size(), 1u);
    EXPECT_EQ(res[0].text, "Hello, wörld! 你好, 🙂 dear ST");
    EXPECT_EQ(res[0].finish_reason, "stop");
    EXPECT_EQ(sink.joined(0), res[0].text);
    EXPECT_EQ(sink.reason[0], "stop");
    for (const auto& t : sink.texts[0]) EXPECT_TRUE(valid_utf8(t)) << "a chunk splits a character: " << t;
    for (int i = 0; i < 200 && engine_->cancelled() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(engine_->cancelled(), 1);
    const Usage u = g.usage();
    EXPECT_EQ(u.prompt_tokens, 4);
    EXPECT_EQ(u.cached_tokens, 2);
    EXPECT_LT(u.completion_tokens, static_cast<int64_t>(script_.size()));
}

TEST_F(GenerationTest, WithoutStopTheWholeScriptArrivesWithValidUtf8Chunks) {
    Generation g(*engine_, *tok_, request(""), {{1, 2, 3, 4}}, mono_seconds());
    g.submit();
    RecordingSink sink;
    ASSERT_TRUE(g.run(sink));
    EXPECT_EQ(g.results()[0].text, kText);
    EXPECT_EQ(g.results()[0].finish_reason, "stop");
    EXPECT_EQ(g.usage().completion_tokens, static_cast<int64_t>(script_.size()));
    for (const auto& t : sink.texts[0]) EXPECT_TRUE(valid_utf8(t)) << t;
    EXPECT_GT(sink.texts[0].size(), 5u);
    EXPECT_TRUE(g.ttft().has_value());
}

TEST_F(GenerationTest, LengthCutsAtMaxTokensAndDropsAnUnfinishedCharacter) {
    // find a max_tokens that ends inside the 3-byte 你
    size_t cut = 0;
    for (size_t k = 1; k < script_.size(); ++k) {
        const std::string t = tok_->decode(std::vector<int32_t>(script_.begin(), script_.begin() + static_cast<long>(k)), false);
        if (!valid_utf8(t)) {
            cut = k;
            break;
        }
    }
    ASSERT_GT(cut, 0u) << "the script should split a character across tokens";
    ApiRequest r = request("");
    r.max_tokens = static_cast<int64_t>(cut);
    Generation g(*engine_, *tok_, r, {{1, 2, 3, 4}}, mono_seconds());
    g.submit();
    RecordingSink sink;
    ASSERT_TRUE(g.run(sink));
    const std::string text = g.results()[0].text;
    EXPECT_EQ(g.results()[0].finish_reason, "length");
    EXPECT_TRUE(valid_utf8(text)) << text;
    EXPECT_EQ(text.find("\xef\xbf\xbd"), std::string::npos);
    EXPECT_EQ(g.usage().completion_tokens, static_cast<int64_t>(cut));
}

TEST_F(GenerationTest, LogprobsFollowTheText) {
    ApiRequest r = request(R"(, "logprobs": 2, "stop": "dear")");
    Generation g(*engine_, *tok_, r, {{1, 2, 3, 4}}, mono_seconds());
    g.submit();
    RecordingSink sink;
    ASSERT_TRUE(g.run(sink));
    const auto res = g.results();
    const std::string text = res[0].text;
    EXPECT_EQ(text, "Hello, wörld! 你好, 🙂 ");
    // every released token starts inside the text; their pieces cover it
    std::string pieces;
    size_t prev = 0;
    for (const TokenLogprob& lp : res[0].logprobs) {
        EXPECT_LT(lp.text_offset, text.size());
        EXPECT_GE(lp.text_offset, prev);
        prev = lp.text_offset;
        EXPECT_EQ(lp.top.size(), 2u);
        pieces += lp.piece;
    }
    EXPECT_EQ(pieces.compare(0, text.size(), text), 0) << pieces;
    EXPECT_EQ(sink.lps[0].size(), res[0].logprobs.size());
}

TEST_F(GenerationTest, NChoicesGetConsecutiveSeedsAndOwnResults) {
    ApiRequest r = request(R"(, "n": 3, "seed": 41, "stop": "!")");
    Generation g(*engine_, *tok_, r, {{1, 2, 3, 4}, {5, 6}}, mono_seconds());
    g.submit();
    RecordingSink sink;
    ASSERT_TRUE(g.run(sink));
    const auto res = g.results();
    ASSERT_EQ(res.size(), 6u);
    for (int i = 0; i < 6; ++i) {
        EXPECT_EQ(res[static_cast<size_t>(i)].index, i);
        EXPECT_EQ(res[static_cast<size_t>(i)].text, "Hello, wörld");
        EXPECT_EQ(sink.joined(i), "Hello, wörld");
    }
    std::vector<uint64_t> seeds;
    for (const auto& q : engine_->requests()) seeds.push_back(q.sampling.seed);
    std::sort(seeds.begin(), seeds.end());
    EXPECT_EQ(seeds, (std::vector<uint64_t>{41, 41, 42, 42, 43, 43}));
    const Usage u = g.usage();
    EXPECT_EQ(u.prompt_tokens, 6);
    EXPECT_EQ(u.cached_tokens, 2 + 1);
}

TEST_F(GenerationTest, SamplingParametersReachTheEngine) {
    ApiRequest r = request(R"(, "temperature": 0.5, "top_k": 7, "logit_bias": {"11": -100}, "ignore_eos": true)");
    Generation g(*engine_, *tok_, r, {{1, 2, 3, 4}}, mono_seconds());
    g.submit();
    RecordingSink sink;
    ASSERT_TRUE(g.run(sink));
    const auto reqs = engine_->requests();
    ASSERT_EQ(reqs.size(), 1u);
    EXPECT_FLOAT_EQ(reqs[0].sampling.temperature, 0.5f);
    EXPECT_EQ(reqs[0].sampling.top_k, 7);
    EXPECT_FLOAT_EQ(reqs[0].sampling.top_p, 1.0f);
    EXPECT_FLOAT_EQ(reqs[0].sampling.min_p, 0.0f);
    EXPECT_EQ(reqs[0].max_tokens, 1000);
    EXPECT_TRUE(reqs[0].ignore_eos);
    ASSERT_EQ(reqs[0].logit_bias.size(), 1u);
    EXPECT_EQ(reqs[0].logit_bias[0].first, 11);
    EXPECT_EQ(reqs[0].top_logprobs, -1);
}

TEST_F(GenerationTest, AClientThatGoesAwayCancelsEverything) {
    struct GoneSink : Sink {
        int n = 0;
        bool text(int, const std::string&, const std::vector<TokenLogprob>*) override { return ++n < 3; }
    } sink;
    ApiRequest r = request(R"(, "n": 2)");
    Generation g(*engine_, *tok_, r, {{1, 2, 3, 4}}, mono_seconds());
    g.submit();
    EXPECT_FALSE(g.run(sink));
    for (int i = 0; i < 200 && engine_->active() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(engine_->active(), 0);
    EXPECT_EQ(g.summary_reason(), "cancelled");
}

TEST_F(GenerationTest, QueueFullIs429AndCancelsWhatWasSubmitted) {
    engine_->pause(true);
    ApiRequest r = request(R"(, "n": 13)");  // 4 running + 8 waiting fit; the 13th does not
    Generation g(*engine_, *tok_, r, {{1, 2, 3, 4}}, mono_seconds());
    const auto [status, param] = error_of([&] { g.submit(); });
    EXPECT_EQ(status, 429);
    engine_->pause(false);
    for (int i = 0; i < 400 && engine_->active() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(engine_->active(), 0);
}

// ---------------------------------------------------------------- mutated bodies

TEST(ServerApi, MutatedBodiesGiveApiErrorsOnly) {
    const std::vector<std::string> seeds = {
        R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "temperature": 0.5,
            "top_p": 0.9, "n": 2, "stop": ["a", "b"], "logit_bias": {"5": 1}, "logprobs": true, "top_logprobs": 3,
            "stream": true, "stream_options": {"include_usage": true}, "seed": 7, "max_tokens": 9})",
        R"({"prompt": [[1, 2], [3]], "logprobs": 2, "max_tokens": 3, "best_of": 1, "stop": "x", "frequency_penalty": 1})",
        R"({"prompt": ["a", "b"], "min_p": 0.1, "top_k": 5, "repetition_penalty": 1.1, "user": "u"})",
    };
    std::mt19937 rng(99);
    std::printf("seed 99\n");
    const std::string alphabet = "{}[]\",:0123456789.-+eE truefalsnul\\\x80\xff";
    int accepted = 0;
    for (int iter = 0; iter < 20000; ++iter) {
        std::string b = seeds[static_cast<size_t>(iter) % seeds.size()];
        const int edits = 1 + static_cast<int>(rng() % 4);
        for (int e = 0; e < edits && !b.empty(); ++e) {
            const size_t at = rng() % b.size();
            switch (rng() % 4) {
                case 0: b[at] = alphabet[rng() % alphabet.size()]; break;
                case 1: b.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
                case 2: b.erase(at, 1 + rng() % 8); break;
                default: b.resize(at); break;
            }
        }
        try {
            const Json j = parse_body(b);
            try {
                parse_chat_request(j, kVocab);
                ++accepted;
            } catch (const ApiError& e) {
                ASSERT_EQ(e.status, 400);
            }
            try {
                parse_completion_request(j, kVocab);
                ++accepted;
            } catch (const ApiError& e) {
                ASSERT_EQ(e.status, 400);
            }
        } catch (const ApiError& e) {
            ASSERT_EQ(e.status, 400);
            ASSERT_FALSE(std::string(e.what()).empty());
        } catch (const std::exception& e) {
            FAIL() << "not an ApiError: " << e.what() << " for " << b;
        }
    }
    EXPECT_GT(accepted, 100);  // some mutations stay valid
}

// Found by tests/fuzz/fuzz_requests.cpp: a field of a type the parser did
// not check reached a typed JSON accessor and escaped as an internal error
// (a 500). Every parser now answers 400 for those and for a body that is
// not an object.
TEST(ServerApi, FieldsOfTheWrongTypeAre400) {
    const auto status_of = [](auto&& parse) {
        try {
            parse();
            return 200;
        } catch (const ApiError& e) {
            return e.status;
        }
    };
    const SamplingParams d = api_default_sampling();
    const Json responses = Json::parse(R"({"input": "hi", "background": "yes"})");
    EXPECT_EQ(status_of([&] { parse_responses_request(responses, kVocab, d, nullptr); }), 400);
    const Json messages = Json::parse(R"({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": "x", "is_error": "very"}]}]})");
    EXPECT_EQ(status_of([&] { parse_messages_request(messages, kVocab, d); }), 400);
    const Json choice = Json::parse(R"({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
        "tools": [{"name": "w", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": 3}})");
    EXPECT_EQ(status_of([&] { parse_messages_request(choice, kVocab, d); }), 400);
    for (const char* text : {"8", "[]", "\"x\"", "null"}) {
        const Json j = Json::parse(text);
        EXPECT_EQ(status_of([&] { parse_chat_request(j, kVocab, d); }), 400) << text;
        EXPECT_EQ(status_of([&] { parse_completion_request(j, kVocab, d); }), 400) << text;
        EXPECT_EQ(status_of([&] { parse_messages_request(j, kVocab, d); }), 400) << text;
        EXPECT_EQ(status_of([&] { parse_responses_request(j, kVocab, d, nullptr); }), 400) << text;
    }
}
