// The HTTP layer over a scripted engine (no model needed): routes, the
// OpenAI error shape and status of every refusal (400/401/404/405/413/429/503),
// SSE framing (role chunk, [DONE], the usage-chunk rules), stream == non-stream,
// and a client that disconnects mid-stream freeing its sequence at once.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <optional>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <httplib.h>

#include <algorithm>
#include <csignal>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "chat/chat.h"
#include "fake_engine.h"
#include "server/api.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

using namespace quern;
using namespace quern::server;

namespace {

/// A TCP connection to the test server's port (-1 on failure).
int connect_raw(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

/// Reads what the server sends on fd until it closes, `until` appears, or
/// `timeout` passes.
std::string read_reply(int fd, std::chrono::milliseconds timeout, const std::string& until = "}}") {
    timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string got;
    char buf[4096];
    for (ssize_t k; got.find(until) == std::string::npos && (k = ::recv(fd, buf, sizeof buf, 0)) > 0;)
        got.append(buf, static_cast<size_t>(k));
    return got;
}

/// The threads of this process (the server under test runs in it).
int process_threads() {
    std::ifstream f("/proc/self/status");
    for (std::string line; std::getline(f, line);)
        if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
    return -1;
}

const char* kText = "Hello, wörld! 你好 STOP tail";

class HttpTest : public ::testing::Test {
protected:
    void start(std::chrono::microseconds interval = std::chrono::microseconds(200), int parallel = 4, int queue = 8,
               std::string api_key = "", const std::string& text = kText, const std::string& template_file = "",
               const std::string& vocab = "gpt-2") {
        tok_ = Tokenizer::from_file(std::string(QUERN_TESTDATA_DIR) + "/vocab/ggml-vocab-" + vocab + ".gguf");
        script_ = tok_->encode(text, false, false);
        EngineOptions eo;
        eo.n_ctx = template_file.empty() ? 64 : 4096;  // a real template renders tools into a long prompt
        eo.n_parallel = parallel;
        eo.max_queue = queue;
        engine_ = std::make_unique<test::FakeEngine>(
            [this](const GenerationRequest& r) {
                std::lock_guard<std::mutex> l(prompt_mu_);
                last_prompt_ = r.prompt;
                return script_;
            },
            eo, interval);
        if (template_file.empty()) {
            tmpl_ = std::make_unique<chat::ChatTemplate>(*chat::builtin_template("chatml"), "", "<|endoftext|>", "chatml");
        } else {
            std::ifstream f(std::string(QUERN_TESTDATA_DIR) + "/chat-templates/" + template_file);
            std::stringstream ss;
            ss << f.rdbuf();
            tmpl_ = std::make_unique<chat::ChatTemplate>(ss.str(), "", "<|endoftext|>", template_file);
        }
        ServerOptions so;
        so.host = "127.0.0.1";
        so.port = 0;
        so.model_id = "test-model";
        so.api_key = std::move(api_key);
        so.http = limits_;
        so.http.max_body_bytes = 64 * 1024;
        so.log_requests = std::getenv("QUERN_TEST_LOG") != nullptr;
        so.tool_format = tool_format_;
        so.parse_reasoning = parse_reasoning_;
        so.parse_special_in_messages = parse_special_;
        server_ = std::make_unique<HttpServer>(*engine_, *tok_, tmpl_.get(), so);
        port_ = server_->bind();
        thread_ = std::thread([this] { server_->run(); });
        client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
        client_->set_read_timeout(10, 0);
    }
    void TearDown() override {
        if (server_) server_->stop();
        if (thread_.joinable()) thread_.join();
        server_.reset();
        if (engine_) engine_->shutdown();
    }
    httplib::Result post(const std::string& path, const std::string& body, httplib::Headers h = {}) {
        return client_->Post(path, h, body, "application/json");
    }
    /// The error object of a refusal, checked for OpenAI's shape.
    Json error_of(const httplib::Result& r, int status) {
        EXPECT_TRUE(r) << "no response";
        if (!r) return {};
        EXPECT_EQ(r->status, status) << r->body;
        const Json j = Json::parse(r->body);
        EXPECT_TRUE(j.contains("error")) << r->body;
        const Json& e = j["error"];
        EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty());
        EXPECT_TRUE(e["type"].is_string());
        EXPECT_TRUE(e.contains("param") && e.contains("code"));
        return e;
    }
    /// The data payloads of an SSE body.
    static std::vector<std::string> events(const std::string& body) {
        std::vector<std::string> out;
        size_t at = 0;
        while (at < body.size()) {
            const size_t end = body.find("\n\n", at);
            EXPECT_NE(end, std::string::npos) << "unterminated event";
            if (end == std::string::npos) break;
            const std::string ev = body.substr(at, end - at);
            EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
            out.push_back(ev.substr(6));
            at = end + 2;
        }
        return out;
    }

    std::unique_ptr<Tokenizer> tok_;
    std::vector<int32_t> script_;
    std::mutex prompt_mu_;
    std::vector<int32_t> last_prompt_;  // the prompt of the latest request the engine took
    std::string last_prompt_text() {
        std::lock_guard<std::mutex> l(prompt_mu_);
        return tok_->decode(last_prompt_);
    }
    std::unique_ptr<test::FakeEngine> engine_;
    std::unique_ptr<chat::ChatTemplate> tmpl_;
    std::unique_ptr<HttpServer> server_;
    std::optional<ToolFormat> tool_format_;  // ServerOptions of the next start()
    bool parse_reasoning_ = true;
    bool parse_special_ = false;
    http::Limits limits_;  // the transport's bounds at the next start()
    std::unique_ptr<httplib::Client> client_;
    std::thread thread_;
    int port_ = 0;
};

const std::string kChat = R"({"model": "test-model", "messages": [{"role": "user", "content": "hi"}]})";

}  // namespace

TEST_F(HttpTest, ModelsHealthMetrics) {
    start();
    auto r = client_->Get("/v1/models");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    const Json j = Json::parse(r->body);
    EXPECT_EQ(j["data"][0]["id"], "test-model");
    EXPECT_EQ(client_->Get("/v1/models/test-model")->status, 200);
    error_of(client_->Get("/v1/models/other"), 404);
    EXPECT_EQ(client_->Get("/health")->status, 200);
    r = client_->Get("/metrics");
    ASSERT_TRUE(r);
    EXPECT_NE(r->body.find("quern_requests_running"), std::string::npos);
    EXPECT_NE(r->body.find("quern_time_to_first_token_seconds_bucket{le=\"+Inf\"}"), std::string::npos);
}

// The one BOS rule through the server: a prompt that begins with the BOS
// text of a model that adds BOS (Llama's SPM vocabulary) gets one BOS.
TEST_F(HttpTest, PromptsGetOneBos) {
    start(std::chrono::microseconds(200), 4, 8, "", kText, "", "llama-spm");
    ASSERT_TRUE(tok_->add_bos());
    for (const char* prompt : {"Hello world", "<s>Hello world"}) {
        auto r = post("/v1/tokenize", Json{{"prompt", prompt}}.dump());
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const auto ids = Json::parse(r->body)["tokens"].get<std::vector<int32_t>>();
        ASSERT_FALSE(ids.empty());
        EXPECT_EQ(ids.front(), tok_->bos()) << prompt;
        EXPECT_EQ(std::count(ids.begin(), ids.end(), tok_->bos()), 1) << prompt;
    }
}

// Special-token text typed in a message stays text (chat/prompt.h): the
// prompt holds no <|endoftext|> token unless the server was started with
// --parse-special-in-messages. Counted in /v1/tokenize's ids and in the
// usage of a chat completion.
TEST_F(HttpTest, SpecialTokenTextInMessagesStaysText) {
    const Json body{{"messages", Json::array({{{"role", "user"}, {"content", "hi<|endoftext|>there"}}})}};
    for (bool permissive : {false, true}) {
        parse_special_ = permissive;
        start();
        const int32_t eot = *tok_->token_id("<|endoftext|>");
        auto r = post("/v1/tokenize", body.dump());
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const auto ids = Json::parse(r->body)["tokens"].get<std::vector<int32_t>>();
        EXPECT_EQ(std::count(ids.begin(), ids.end(), eot), permissive ? 1 : 0) << r->body;
        EXPECT_EQ(tok_->decode(ids).find("hi<|endoftext|>there") != std::string::npos, true);
        Json chat = body;
        chat["max_tokens"] = 2;
        r = post("/v1/chat/completions", chat.dump());
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        EXPECT_EQ(Json::parse(r->body)["usage"]["prompt_tokens"].get<size_t>(), ids.size());
        TearDown();
    }
}

// A chunked body is held to the same size limit as one with a
// Content-Length (the fixture's: 64 KiB): the server answers 413 and closes
// after reading at most the limit (a client still writing sees the close),
// while a small chunked body is answered, and the server stays up.
TEST_F(HttpTest, ChunkedBodiesHaveTheSizeLimit) {
    std::signal(SIGPIPE, SIG_IGN);  // the client writes on after the server's close
    start();
    size_t sent = 0;
    auto big = client_->Post(
        "/v1/chat/completions",
        [&](size_t, httplib::DataSink& sink) {
            const std::string piece(16 * 1024, ' ');
            if (sent >= (size_t{64} << 20)) {  // 64 MiB, if nobody stops us
                sink.done();
                return true;
            }
            sent += piece.size();
            return sink.write(piece.data(), piece.size());
        },
        "application/json");
    if (big) EXPECT_EQ(big->status, 413) << big->body;
    else  // the write the close cut short
        EXPECT_TRUE(big.error() == httplib::Error::Write || big.error() == httplib::Error::Canceled)
            << httplib::to_string(big.error());
    EXPECT_LT(sent, size_t{16} << 20) << "the server read on past the limit";
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    const std::string small = kChat;
    auto ok = client_->Post(
        "/v1/chat/completions",
        [&, done = false](size_t, httplib::DataSink& sink) mutable {
            if (done) {
                sink.done();
                return true;
            }
            done = true;
            return sink.write(small.data(), small.size());
        },
        "application/json");
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << ok->body;
    auto health = client_->Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
}

TEST_F(HttpTest, ChatAndCompletionsStreamedAndNot) {
    start();
    const std::string body = kChat.substr(0, kChat.size() - 1) + R"(, "stop": "STOP", "seed": 3})";
    auto r = post("/v1/chat/completions", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const Json j = Json::parse(r->body);
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_EQ(j["model"], "test-model");
    EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
    EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello, wörld! 你好 ");
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 0);
    EXPECT_TRUE(j["usage"]["prompt_tokens_details"].contains("cached_tokens"));

    const std::string sbody = body.substr(0, body.size() - 1) + R"(, "stream": true})";
    r = post("/v1/chat/completions", sbody);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
    const auto evs = events(r->body);
    ASSERT_GE(evs.size(), 4u);
    EXPECT_EQ(evs.back(), "[DONE]");
    const Json first = Json::parse(evs[0]);
    EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
    std::string text;
    std::string finish;
    for (size_t i = 0; i + 1 < evs.size(); ++i) {
        const Json c = Json::parse(evs[i]);
        EXPECT_EQ(c["object"], "chat.completion.chunk");
        EXPECT_FALSE(c.contains("usage")) << "no usage without stream_options.include_usage";
        ASSERT_EQ(c["choices"].size(), 1u);
        if (c["choices"][0]["delta"].contains("content")) text += c["choices"][0]["delta"]["content"].get<std::string>();
        if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(text, j["choices"][0]["message"]["content"].get<std::string>());
    EXPECT_EQ(finish, "stop");

    // completions with include_usage: exactly one usage chunk, last before [DONE], with empty choices
    r = post("/v1/completions",
             R"({"prompt": "x", "max_tokens": 5, "stream": true, "stream_options": {"include_usage": true}})");
    ASSERT_TRUE(r);
    const auto cevs = events(r->body);
    ASSERT_GE(cevs.size(), 3u);
    EXPECT_EQ(cevs.back(), "[DONE]");
    int usage_chunks = 0;
    std::string ctext;
    for (size_t i = 0; i + 1 < cevs.size(); ++i) {
        const Json c = Json::parse(cevs[i]);
        EXPECT_EQ(c["object"], "text_completion");
        ASSERT_TRUE(c.contains("usage"));
        if (!c["usage"].is_null()) {
            ++usage_chunks;
            EXPECT_EQ(i, cevs.size() - 2);
            EXPECT_TRUE(c["choices"].empty());
            EXPECT_EQ(c["usage"]["completion_tokens"], 5);
        } else {
            ctext += c["choices"][0]["text"].get<std::string>();
        }
    }
    EXPECT_EQ(usage_chunks, 1);
    const auto plain = post("/v1/completions", R"({"prompt": "x", "max_tokens": 5})");
    ASSERT_TRUE(plain);
    const Json pj = Json::parse(plain->body);
    EXPECT_EQ(pj["choices"][0]["text"], ctext);
    EXPECT_EQ(pj["choices"][0]["finish_reason"], "length");
}

// The server's --tool-call-format and --reasoning-format: a Hermes call from
// a model whose template writes XML ones is read when the server says so,
// and reasoning stays in the content unless a request asks for it apart.
TEST_F(HttpTest, ServerToolAndReasoningFormats) {
    tool_format_ = ToolFormat::Hermes;
    parse_reasoning_ = false;
    const std::string out = "<think>\nhmm\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    start(std::chrono::microseconds(200), 4, 8, "", out, "Qwen3.5-4B.jinja");
    const std::string body = R"({"messages": [{"role": "user", "content": "weather in Oslo?"}], "tools": [{"type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])";
    auto r = post("/v1/chat/completions", body + "}");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    Json m = Json::parse(r->body)["choices"][0]["message"];
    ASSERT_EQ(m["tool_calls"].size(), 1u);
    EXPECT_EQ(Json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>()), Json::parse(R"({"city": "Oslo"})"));
    EXPECT_EQ(m["content"], "<think>\nhmm\n</think>\n\n");  // reasoning left inline
    EXPECT_FALSE(m.contains("reasoning_content"));
    r = post("/v1/chat/completions", body + R"(, "reasoning_format": "auto"})");
    ASSERT_TRUE(r);
    m = Json::parse(r->body)["choices"][0]["message"];
    EXPECT_EQ(m["reasoning_content"], "hmm\n");
}

// gpt-oss: harmony messages (a scripted output) come back as
// reasoning_content and a streamed tool call.
TEST_F(HttpTest, HarmonyReasoningAndToolCalls) {
    const std::string out = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
                            "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Lima\"}<|call|>";
    start(std::chrono::microseconds(200), 4, 8, "", out, "openai-gpt-oss-120b.jinja");
    const std::string body = R"({"messages": [{"role": "user", "content": "weather in Lima?"}], "tools": [{"type": "function",
        "function": {"name": "get_weather", "description": "Weather now", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}}}}]})";
    auto r = post("/v1/chat/completions", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const Json c = Json::parse(r->body)["choices"][0];
    EXPECT_EQ(c["message"]["reasoning_content"], "Need the weather.");
    ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
    EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["arguments"], R"({"city":"Lima"})");
    EXPECT_EQ(c["finish_reason"], "tool_calls");
}

// A Qwen3.5 model's reasoning and XML tool calls (a scripted output) come
// back as reasoning_content and tool_calls, streamed and not, with
// finish_reason "tool_calls"; tool_choice "none" and reasoning_format "none"
// leave the text as written; parallel_tool_calls false keeps the first call.
TEST_F(HttpTest, ReasoningAndToolCallsAreParsed) {
    const std::string out =
        "<think>\nThe user asks for weather.\n</think>\n\nLet me look.\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>";
    start(std::chrono::microseconds(200), 4, 8, "", out, "Qwen3.5-4B.jinja");
    const std::string tools = R"("tools": [{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])";
    const std::string body = R"({"messages": [{"role": "user", "content": "weather in Paris and Rome?"}], )" + tools +
                             R"(, "chat_template_kwargs": {"enable_thinking": true}})";
    auto r = post("/v1/chat/completions", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const Json m = Json::parse(r->body)["choices"][0]["message"];
    EXPECT_EQ(m["reasoning_content"], "The user asks for weather.\n");
    EXPECT_EQ(m["content"], "Let me look.\n");
    ASSERT_EQ(m["tool_calls"].size(), 2u);
    EXPECT_EQ(m["tool_calls"][0]["type"], "function");
    EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(Json::parse(m["tool_calls"][1]["function"]["arguments"].get<std::string>()), Json::parse(R"({"city": "Rome"})"));
    EXPECT_EQ(m["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0), 0u);
    EXPECT_EQ(Json::parse(r->body)["choices"][0]["finish_reason"], "tool_calls");

    // streamed: the same parts from the deltas — a call's first chunk with
    // its id and name, then chunks adding to its arguments (OpenAI's shape)
    r = post("/v1/chat/completions", body.substr(0, body.size() - 1) + R"(, "stream": true})");
    ASSERT_TRUE(r);
    std::string reasoning, content, finish;
    Json calls = Json::array();
    int pieces = 0;
    for (const std::string& e : events(r->body)) {
        if (e == "[DONE]") break;
        const Json c = Json::parse(e)["choices"][0];
        const Json& d = c["delta"];
        if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
        if (d.contains("content")) content += d["content"].get<std::string>();
        if (d.contains("tool_calls"))
            for (const Json& t : d["tool_calls"]) {
                ++pieces;
                if (t.contains("id")) {
                    EXPECT_EQ(t["index"], calls.size());
                    EXPECT_EQ(t["type"], "function");
                    calls.push_back(t);
                } else {
                    ASSERT_FALSE(calls.empty());
                    EXPECT_EQ(t["index"], calls.size() - 1);
                    EXPECT_FALSE(t["function"].contains("name"));
                    auto& a = calls.back()["function"]["arguments"];
                    a = a.get<std::string>() + t["function"]["arguments"].get<std::string>();
                }
            }
        if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
    EXPECT_EQ(reasoning, m["reasoning_content"].get<std::string>());
    EXPECT_EQ(content, m["content"].get<std::string>());
    ASSERT_EQ(calls.size(), 2u);
    EXPECT_GT(pieces, 2);
    EXPECT_EQ(calls[0]["function"]["arguments"], m["tool_calls"][0]["function"]["arguments"]);
    EXPECT_EQ(calls[1]["function"]["arguments"], m["tool_calls"][1]["function"]["arguments"]);
    EXPECT_EQ(finish, "tool_calls");

    // tool_choice none, reasoning_format none: the text as written
    r = post("/v1/chat/completions", body.substr(0, body.size() - 1) +
                                         R"(, "tool_choice": "none", "reasoning_format": "none"})");
    ASSERT_TRUE(r);
    const Json plain = Json::parse(r->body)["choices"][0];
    EXPECT_EQ(plain["message"]["content"], out);
    EXPECT_FALSE(plain["message"].contains("tool_calls"));
    EXPECT_EQ(plain["finish_reason"], "stop");

    // parallel_tool_calls false: the first call ends the choice
    r = post("/v1/chat/completions", body.substr(0, body.size() - 1) + R"(, "parallel_tool_calls": false})");
    ASSERT_TRUE(r);
    const Json one = Json::parse(r->body)["choices"][0];
    ASSERT_EQ(one["message"]["tool_calls"].size(), 1u);
    EXPECT_EQ(Json::parse(one["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
              Json::parse(R"({"city": "Paris"})"));
    EXPECT_EQ(one["finish_reason"], "tool_calls");
}

// enable_thinking=false end to end: the template closes the think block in
// the prompt, and the same output then comes back as content, not reasoning
// (chat, streamed and not; Anthropic's thinking.type "disabled"; Responses'
// reasoning effort "none"). With thinking on, the prompt opens the block and
// the output is reasoning.
TEST_F(HttpTest, EnableThinkingFalseIsHonoured) {
    const std::string out = "The answer is 4.";
    start(std::chrono::microseconds(200), 4, 8, "", out, "Qwen3.5-4B.jinja");
    const auto ends_with = [](const std::string& s, const std::string& t) {
        return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
    };
    const std::string closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    const std::string open = "<|im_start|>assistant\n<think>\n";
    const std::string chat = R"({"messages": [{"role": "user", "content": "2+2?"}])";

    auto r = post("/v1/chat/completions", chat + R"(, "chat_template_kwargs": {"enable_thinking": false}})");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_TRUE(ends_with(last_prompt_text(), closed)) << last_prompt_text();
    Json m = Json::parse(r->body)["choices"][0]["message"];
    EXPECT_EQ(m["content"], out);
    EXPECT_FALSE(m.contains("reasoning_content")) << m.dump();

    r = post("/v1/chat/completions", chat + R"(, "stream": true, "chat_template_kwargs": {"enable_thinking": false}})");
    ASSERT_TRUE(r);
    std::string content;
    for (const std::string& e : events(r->body)) {
        if (e == "[DONE]") break;
        const Json d = Json::parse(e)["choices"][0]["delta"];
        EXPECT_FALSE(d.contains("reasoning_content")) << e;
        if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
    }
    EXPECT_EQ(content, out);

    // thinking on (the template's default): the prompt opens the block
    r = post("/v1/chat/completions", chat + "}");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_TRUE(ends_with(last_prompt_text(), open)) << last_prompt_text();
    m = Json::parse(r->body)["choices"][0]["message"];
    EXPECT_EQ(m["reasoning_content"], out);

    const std::string msgs = R"({"model": "test-model", "max_tokens": 64, "messages": [{"role": "user", "content": "2+2?"}])";
    r = post("/v1/messages", msgs + R"(, "thinking": {"type": "disabled"}})");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_TRUE(ends_with(last_prompt_text(), closed)) << last_prompt_text();
    Json blocks = Json::parse(r->body)["content"];
    ASSERT_EQ(blocks.size(), 1u) << blocks.dump();
    EXPECT_EQ(blocks[0]["type"], "text");
    EXPECT_EQ(blocks[0]["text"], out);

    r = post("/v1/messages", msgs + R"(, "thinking": {"type": "enabled", "budget_tokens": 1024}})");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_TRUE(ends_with(last_prompt_text(), open)) << last_prompt_text();
    blocks = Json::parse(r->body)["content"];
    ASSERT_EQ(blocks.size(), 1u) << blocks.dump();
    EXPECT_EQ(blocks[0]["type"], "thinking");
    EXPECT_EQ(blocks[0]["thinking"], out);

    r = post("/v1/responses", R"({"model": "test-model", "input": "2+2?", "reasoning": {"effort": "none"}})");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_TRUE(ends_with(last_prompt_text(), closed)) << last_prompt_text();
    const Json items = Json::parse(r->body)["output"];
    ASSERT_EQ(items.size(), 1u) << items.dump();
    EXPECT_EQ(items[0]["type"], "message");
    EXPECT_EQ(items[0]["content"][0]["text"], out);
}

// /v1/tokenize and /v1/detokenize: a prompt, messages as the template
// renders them, the ids back to text; bad ids refused.
TEST_F(HttpTest, TokenizeAndDetokenize) {
    start();
    auto r = post("/v1/tokenize", R"({"prompt": "Hello, wörld!", "return_token_strs": true})");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const Json t = Json::parse(r->body);
    EXPECT_EQ(t["count"], t["tokens"].size());
    EXPECT_EQ(t["max_model_len"], 64);
    EXPECT_EQ(t["token_strs"].size(), t["tokens"].size());
    r = post("/v1/detokenize", Json{{"tokens", t["tokens"]}}.dump());
    ASSERT_TRUE(r);
    EXPECT_EQ(Json::parse(r->body)["prompt"], "Hello, wörld!");
    r = post("/v1/tokenize", R"({"messages": [{"role": "user", "content": "hi"}]})");
    ASSERT_TRUE(r);
    const Json m = Json::parse(r->body);
    r = post("/v1/detokenize", Json{{"tokens", m["tokens"]}}.dump());
    EXPECT_NE(Json::parse(r->body)["prompt"].get<std::string>().find("<|im_start|>user\nhi<|im_end|>"), std::string::npos);
    EXPECT_EQ(error_of(post("/v1/detokenize", R"({"tokens": [-1]})"), 400)["param"], "tokens");
    EXPECT_EQ(error_of(post("/v1/tokenize", R"({})"), 400)["param"], "prompt");
}

TEST_F(HttpTest, Refusals) {
    start();
    // 400: malformed, wrong types, out of range, empty, too long for the context
    Json e = error_of(post("/v1/chat/completions", "{not json"), 400);
    error_of(post("/v1/chat/completions", "[]"), 400);
    e = error_of(post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "temperature": "warm"})"), 400);
    EXPECT_EQ(e["param"], "temperature");
    error_of(post("/v1/chat/completions", R"({"messages": []})"), 400);
    error_of(post("/v1/completions", R"({"prompt": "x", "max_tokens": -1})"), 400);
    e = error_of(post("/v1/completions", R"({"prompt": ")" + std::string(2000, 'a') + " " + std::string(2000, 'b') + R"("})"), 400);
    EXPECT_EQ(e["code"], "context_length_exceeded");
    error_of(post("/v1/completions", R"({"prompt": "x", "n": 100})"), 400);  // more than the server can hold
    // 404: unknown route, unknown model
    e = error_of(post("/v1/nothing", "{}"), 404);
    error_of(client_->Get("/v2/models"), 404);
    // 405: a route's path with another method, saying which methods it answers
    auto not_allowed = [&](const httplib::Result& r, const std::string& allow) {
        const Json err = error_of(r, 405);
        if (!r) return;
        EXPECT_EQ(r->get_header_value("Allow"), allow) << r->body;
        EXPECT_EQ(err["type"], "invalid_request_error");
        EXPECT_NE(err["message"].get<std::string>().find(allow), std::string::npos) << r->body;
    };
    not_allowed(client_->Get("/v1/chat/completions"), "POST");
    not_allowed(client_->Put("/v1/completions", "{}", "application/json"), "POST");
    not_allowed(post("/v1/models", "{}"), "GET, HEAD");
    not_allowed(client_->Delete("/v1/models/test-model"), "GET, HEAD");
    not_allowed(post("/health", "{}"), "GET, HEAD");
    EXPECT_EQ(client_->Head("/v1/models")->status, 200);  // HEAD is answered where GET is
    e = error_of(post("/v1/chat/completions", R"({"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]})"), 404);
    EXPECT_EQ(e["code"], "model_not_found");
    // 413: over the body limit (64 KiB in this test); the connection still works afterwards
    error_of(post("/v1/completions", R"({"prompt": ")" + std::string(100 * 1024, 'a') + R"("})"), 413);
    EXPECT_EQ(post("/v1/completions", R"({"prompt": "x", "max_tokens": 2})")->status, 200);
    // 503 once shutting down
    server_->begin_shutdown();
    error_of(post("/v1/completions", R"({"prompt": "x"})"), 503);
    EXPECT_EQ(client_->Get("/health")->status, 503);
}

// A POST without Content-Length (and not chunked) gets 411 at once instead
// of a server waiting for a body until the client gives up.
// A Content-Length far past the limit gets 413 at once, before any of the
// body is read (the server once read and discarded bytes until its 30 s read
// timeout before answering).
TEST_F(HttpTest, HugeContentLengthIs413AtOnce) {
    start();
    const int fd = connect_raw(port_);
    ASSERT_GE(fd, 0);
    timeval tv{2, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const std::string req =
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: 9999999999\r\n\r\n{\"prompt\": \"";
    ASSERT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
    const auto t0 = std::chrono::steady_clock::now();
    std::string got;
    char buf[4096];
    // Until the whole answer is in (its JSON error ends the body).
    for (ssize_t k; got.find("}}") == std::string::npos && (k = ::recv(fd, buf, sizeof buf, 0)) > 0;)
        got.append(buf, static_cast<size_t>(k));
    ::close(fd);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
    EXPECT_EQ(got.rfind("HTTP/1.1 413", 0), 0u) << got;
    EXPECT_NE(got.find("Connection: close"), std::string::npos) << got;
}

TEST_F(HttpTest, PostWithoutContentLengthIs411) {
    start();
    const int fd = connect_raw(port_);
    ASSERT_GE(fd, 0);
    timeval tv{5, 0};  // the answer must come well before this
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    ASSERT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
    std::string got;
    char buf[4096];
    for (ssize_t k; (k = ::recv(fd, buf, sizeof buf, 0)) > 0;) {
        got.append(buf, static_cast<size_t>(k));
        if (got.find("}") != std::string::npos) break;
    }
    ::close(fd);
    EXPECT_EQ(got.rfind("HTTP/1.1 411", 0), 0u) << got;
    EXPECT_NE(got.find("Content-Length"), std::string::npos) << got;
    EXPECT_NE(got.find("invalid_request_error"), std::string::npos) << got;
    // Ordinary requests still work.
    EXPECT_EQ(post("/v1/completions", R"({"prompt": "x", "max_tokens": 2})")->status, 200);
}

TEST_F(HttpTest, ApiKey) {
    start(std::chrono::microseconds(200), 4, 8, "sekrit");
    Json e = error_of(post("/v1/chat/completions", kChat), 401);
    EXPECT_EQ(e["code"], "missing_api_key");
    e = error_of(post("/v1/chat/completions", kChat, {{"Authorization", "Bearer wrong"}}), 401);
    EXPECT_EQ(e["code"], "invalid_api_key");
    error_of(client_->Get("/v1/models"), 401);
    auto r = post("/v1/chat/completions", kChat, {{"Authorization", "Bearer sekrit"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(client_->Get("/health")->status, 200);  // health and metrics stay open
}

TEST_F(HttpTest, QueueFullIs429) {
    start(std::chrono::microseconds(200), 1, 0);
    engine_->pause(true);
    httplib::Client other("127.0.0.1", port_);
    std::thread first([&] { other.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 3})", "application/json"); });
    for (int i = 0; i < 400 && engine_->active() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_EQ(engine_->active(), 1);
    auto r = post("/v1/completions", R"({"prompt": "x", "max_tokens": 3})");
    Json e = error_of(r, 429);
    EXPECT_EQ(r->get_header_value("Retry-After"), "1");
    engine_->pause(false);
    first.join();
    EXPECT_EQ(post("/v1/completions", R"({"prompt": "x", "max_tokens": 3})")->status, 200);
}

TEST_F(HttpTest, DisconnectMidStreamFreesTheSequence) {
    start(std::chrono::milliseconds(5));
    script_.clear();
    for (int i = 0; i < 2000; ++i) script_.push_back(tok_->encode(" word", false, false)[0]);  // ~10 s of tokens
    for (const bool stream : {true, false}) {
        const int64_t before = engine_->cancelled();
        httplib::Client c("127.0.0.1", port_);
        int chunks = 0;
        std::thread t([&] {
            httplib::Request req;
            req.method = "POST";
            req.path = "/v1/completions";
            req.body = std::string(R"({"prompt": "x", "max_tokens": 2000, "stream": )") + (stream ? "true" : "false") + "}";
            req.set_header("Content-Type", "application/json");
            req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
            c.send(req);
        });
        // the non-streamed request sends nothing until the end: give up on it from outside
        if (!stream) {
            for (int i = 0; i < 400 && engine_->active() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            c.stop();
        }
        t.join();
        const auto t0 = std::chrono::steady_clock::now();
        while (engine_->cancelled() == before && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_EQ(engine_->cancelled(), before + 1) << (stream ? "stream" : "non-stream");
        EXPECT_LT(ms, 1000) << "the sequence should be cancelled at once";
        for (int i = 0; i < 400 && engine_->active() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        EXPECT_EQ(engine_->active(), 0);
    }
    // the server is still fine
    EXPECT_EQ(post("/v1/completions", R"({"prompt": "x", "max_tokens": 2})")->status, 200);
}

TEST_F(HttpTest, ManyConcurrentRequestsAllAnswered) {
    start(std::chrono::microseconds(500), 4, 32);
    std::vector<std::thread> ts;
    std::atomic<int> ok{0};
    for (int i = 0; i < 24; ++i)
        ts.emplace_back([&, i] {
            httplib::Client c("127.0.0.1", port_);
            auto r = c.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 6, "stream": )" +
                                                   std::string(i % 2 ? "true" : "false") + "}",
                            "application/json");
            if (r && r->status == 200) ++ok;
            else ADD_FAILURE() << i << " " << (r ? std::to_string(r->status) + " " + r->body : httplib::to_string(r.error()));
        });
    for (auto& t : ts) t.join();
    EXPECT_EQ(ok.load(), 24);
}

// A second server on a port in use fails to bind (no SO_REUSEPORT sharing),
// and top_p = 0 (accepted by OpenAI) is answered, not fatal.
TEST_F(HttpTest, PortInUseAndTopPZero) {
    start();
    ServerOptions so;
    so.host = "127.0.0.1";
    so.port = port_;
    so.model_id = "test-model";
    HttpServer second(*engine_, *tok_, tmpl_.get(), so);
    EXPECT_THROW(second.bind(), Error);
    auto r = post("/v1/chat/completions",
                  R"({"model":"test-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"top_p":0})");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
}

// Header bytes and header count are bounded while they arrive: a million
// headers, one 64 MB header line, or 200 small headers get 431 at once, and
// the server stays up (the old server buffered all of them: +107 MB).
TEST_F(HttpTest, HeadersAreBoundedWhileTheyArrive) {
    std::signal(SIGPIPE, SIG_IGN);
    start();
    std::string million = "GET /health HTTP/1.1\r\nHost: x\r\n";
    for (int i = 0; i < 1000000; ++i) million += "X-A: b\r\n";
    std::string long_line = "GET /health HTTP/1.1\r\nHost: x\r\nX-Long: " + std::string(64 << 20, 'a') + "\r\n\r\n";
    std::string many = "GET /health HTTP/1.1\r\nHost: x\r\n";
    for (int i = 0; i < 200; ++i) many += "X-" + std::to_string(i) + ": b\r\n";
    many += "\r\n";
    for (const std::string* req : {&million, &long_line, &many}) {
        const int fd = connect_raw(port_);
        ASSERT_GE(fd, 0);
        const auto t0 = std::chrono::steady_clock::now();
        std::thread sender([&] { (void)::send(fd, req->data(), req->size(), MSG_NOSIGNAL); });
        const std::string got = read_reply(fd, std::chrono::seconds(5));
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        ::shutdown(fd, SHUT_RDWR);
        sender.join();
        ::close(fd);
        EXPECT_EQ(got.rfind("HTTP/1.1 431", 0), 0u) << req->size() << " bytes: " << got.substr(0, 200);
        EXPECT_NE(got.find("invalid_request_error"), std::string::npos) << got.substr(0, 300);
        EXPECT_LT(ms, 1000) << req->size() << " bytes of headers";
    }
    EXPECT_EQ(client_->Get("/health")->status, 200);
}

// Time limits count in total, not per read: a client that sends its headers
// a byte at a time gets 408 once the header time is up; a body that stops
// coming gets 408; an idle keep-alive connection is closed.
TEST_F(HttpTest, SlowRequestsAndIdleConnectionsTimeOut) {
    limits_.header_timeout = std::chrono::milliseconds(600);
    limits_.body_timeout = std::chrono::milliseconds(600);
    limits_.keep_alive_timeout = std::chrono::milliseconds(400);
    start();
    {  // slowloris: one byte every 100 ms would go on for 4 s
        const int fd = connect_raw(port_);
        ASSERT_GE(fd, 0);
        const std::string req = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaaaaaaaaaaaaaa\r\n\r\n";
        const auto t0 = std::chrono::steady_clock::now();
        std::atomic<bool> stop{false};
        std::thread dribble([&] {
            for (char ch : req) {
                if (stop || ::send(fd, &ch, 1, MSG_NOSIGNAL) != 1) return;
                std::this_thread::sleep_for(std::chrono::milliseconds(100));
            }
        });
        const std::string got = read_reply(fd, std::chrono::seconds(5));
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        stop = true;
        dribble.join();
        ::close(fd);
        EXPECT_EQ(got.rfind("HTTP/1.1 408", 0), 0u) << got;
        EXPECT_LT(s, 1.5) << "the header deadline did not hold";
    }
    {  // a body that stops halfway
        const int fd = connect_raw(port_);
        ASSERT_GE(fd, 0);
        const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":";
        ASSERT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
        const std::string got = read_reply(fd, std::chrono::seconds(5));
        ::close(fd);
        EXPECT_EQ(got.rfind("HTTP/1.1 408", 0), 0u) << got;
    }
    {  // idle keep-alive: answered, then closed after the idle time
        const int fd = connect_raw(port_);
        ASSERT_GE(fd, 0);
        const std::string req = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
        ASSERT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
        const auto t0 = std::chrono::steady_clock::now();
        const std::string got = read_reply(fd, std::chrono::seconds(5), "\x01");  // until the server closes
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ::close(fd);
        EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
        EXPECT_NE(got.find("keep-alive"), std::string::npos) << got;
        EXPECT_GT(s, 0.3);
        EXPECT_LT(s, 2.0) << "an idle connection stayed open";
    }
    EXPECT_EQ(client_->Get("/health")->status, 200);
}

// Open connections are capped per client address (and in all): beyond, a
// new connection gets 503 and is closed, and once some close, new ones are
// served again.
TEST_F(HttpTest, ConnectionsPerClientAreCapped) {
    limits_.max_connections_per_client = 8;
    start();
    std::vector<int> fds;
    for (int i = 0; i < 8; ++i) fds.push_back(connect_raw(port_));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const int extra = connect_raw(port_);
    ASSERT_GE(extra, 0);
    const std::string got = read_reply(extra, std::chrono::seconds(3));
    ::close(extra);
    EXPECT_EQ(got.rfind("HTTP/1.1 503", 0), 0u) << got;
    EXPECT_NE(got.find("too many open connections"), std::string::npos) << got;
    for (int fd : fds) ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(client_->Get("/health")->status, 200);
}

// Idle and slow connections hold no thread (they wait on the transport's
// event loop): 1000 of them, a third having sent part of a request line
// (slowloris), add only a few threads to the process; /health is answered
// in well under 100 ms and a chat request is served. (A server with a
// thread per connection and a fixed pool stalled for its 30 s read timeout.)
TEST_F(HttpTest, IdleConnectionsHoldNoThreads) {
    start();
    EXPECT_EQ(client_->Get("/health")->status, 200);
    const int before = process_threads();
    rlimit lim{};
    ::getrlimit(RLIMIT_NOFILE, &lim);
    const int n = static_cast<int>(std::min<rlim_t>(1000, lim.rlim_cur > 300 ? (lim.rlim_cur - 200) / 2 : 50));
    std::vector<int> fds;
    for (int i = 0; i < n; ++i) {
        const int fd = connect_raw(port_);
        ASSERT_GE(fd, 0);
        if (i % 3 == 0) ASSERT_EQ(::send(fd, "GET /he", 7, 0), 7);
        fds.push_back(fd);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const int during = process_threads();
    std::vector<double> ms;
    for (int i = 0; i < 9; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        auto h = client_->Get("/health");
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        ASSERT_TRUE(h);
        EXPECT_EQ(h->status, 200);
    }
    std::sort(ms.begin(), ms.end());
    auto r = client_->Post("/v1/chat/completions", kChat, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    for (int fd : fds) ::close(fd);
    EXPECT_LT(during - before, 16) << n << " open connections: threads " << before << " -> " << during;
    EXPECT_LT(ms[4], 100.0) << "median /health with " << n << " open connections";
}

// A shutdown cuts running requests off with finish_reason "abort" (not an
// error): 32 streams and a non-streamed request each end with it, the
// streams with their [DONE].
TEST_F(HttpTest, ShutdownEndsRunningRequestsWithAbort) {
    start(std::chrono::milliseconds(5), 33, 8);
    script_.clear();
    for (int i = 0; i < 2000; ++i) script_.push_back(tok_->encode(" word", false, false)[0]);  // ~10 s of tokens
    std::vector<std::string> bodies(33);
    std::vector<std::thread> ts;
    for (int i = 0; i < 33; ++i)
        ts.emplace_back([&, i] {
            httplib::Client c("127.0.0.1", port_);
            c.set_read_timeout(20, 0);
            const bool stream = i < 32;
            auto r = c.Post("/v1/chat/completions",
                            R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000, "stream": )" +
                                std::string(stream ? "true" : "false") + "}",
                            "application/json");
            if (r && r->status == 200) bodies[static_cast<size_t>(i)] = r->body;
            else ADD_FAILURE() << i << " " << (r ? std::to_string(r->status) : httplib::to_string(r.error()));
        });
    for (int i = 0; i < 400 && engine_->active() < 33; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_EQ(engine_->active(), 33);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    server_->begin_shutdown();
    engine_->shutdown();
    for (auto& t : ts) t.join();
    for (int i = 0; i < 32; ++i) {
        const std::vector<std::string> ev = events(bodies[static_cast<size_t>(i)]);
        ASSERT_GE(ev.size(), 3u) << i;
        EXPECT_EQ(ev.back(), "[DONE]") << i;
        const Json last = Json::parse(ev[ev.size() - 2]);
        EXPECT_FALSE(last.contains("error")) << ev[ev.size() - 2];
        EXPECT_EQ(last["choices"][0]["finish_reason"], "abort") << ev[ev.size() - 2];
    }
    const Json whole = Json::parse(bodies[32]);
    EXPECT_EQ(whole["choices"][0]["finish_reason"], "abort") << bodies[32];
    EXPECT_FALSE(whole["choices"][0]["message"]["content"].get<std::string>().empty());
}
