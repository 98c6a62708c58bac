// The Anthropic Messages schema (server/anthropic.h): a Messages body as the
// chat request it stands for (system, content blocks, tool_use / tool_result
// turns, tools, tool_choice, thinking, stop_sequences), refusals naming the
// field, the response's content blocks and stop_reason, and the event
// sequence of a stream (blocks opened and closed in order, indices rising).
#include <gtest/gtest.h>

#include "server/anthropic.h"

using namespace quern::server;

namespace {

ApiRequest parse(const std::string& body) { return parse_messages_request(parse_body(body), 1000, api_default_sampling()); }

TEST(Anthropic, ABodyBecomesAChatRequest) {
    const ApiRequest r = parse(R"({"model": "m", "max_tokens": 50, "system": [{"type": "text", "text": "be brief"}],
        "stop_sequences": ["END"], "temperature": 0.5, "top_k": 7, "stream": true,
        "thinking": {"type": "adaptive"},
        "tools": [{"name": "get_weather", "description": "weather", "input_schema": {"type": "object",
                   "properties": {"city": {"type": "string"}}}}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
        "messages": [{"role": "user", "content": "weather in Paris?"},
                     {"role": "assistant", "content": [{"type": "thinking", "thinking": "call it", "signature": "x"},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "sunny"}]}, {"type": "text", "text": "and Rome?"}]}]})");
    EXPECT_EQ(r.endpoint, Endpoint::Messages);
    EXPECT_EQ(r.max_tokens, 50);
    EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
    EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
    EXPECT_EQ(r.sampling.top_k, 7);
    EXPECT_TRUE(r.stream);
    EXPECT_FALSE(r.parallel_tool_calls);
    EXPECT_EQ(r.template_kwargs["enable_thinking"], true);
    ASSERT_EQ(r.tools.size(), 1u);
    EXPECT_EQ(r.tools[0]["function"]["parameters"]["properties"]["city"]["type"], "string");
    ASSERT_EQ(r.messages.size(), 5u);
    EXPECT_EQ(r.messages[0]["role"], "system");
    EXPECT_EQ(r.messages[0]["content"], "be brief");
    EXPECT_EQ(r.messages[2]["reasoning_content"], "call it");
    EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["arguments"]["city"], "Paris");
    EXPECT_EQ(r.messages[3]["role"], "tool");
    EXPECT_EQ(r.messages[3]["tool_call_id"], "toolu_1");
    EXPECT_EQ(r.messages[3]["content"], "sunny");
    EXPECT_EQ(r.messages[4]["content"], "and Rome?");
}

TEST(Anthropic, RefusalsNameTheField) {
    const auto param_of = [](const std::string& body) {
        try {
            parse(body);
        } catch (const ApiError& e) {
            EXPECT_EQ(e.status, 400);
            return e.param;
        }
        return std::string("(accepted)");
    };
    EXPECT_EQ(param_of(R"({"messages": [{"role": "user", "content": "x"}]})"), "max_tokens");
    EXPECT_EQ(param_of(R"({"max_tokens": 5, "messages": []})"), "messages");
    EXPECT_EQ(param_of(R"({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})"), "messages[0].role");
    EXPECT_EQ(param_of(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image",
        "source": {}}]}]})"), "messages[0].content[0].type");
    EXPECT_EQ(param_of(R"({"max_tokens": 5, "tool_choice": {"type": "any"},
        "messages": [{"role": "user", "content": "x"}]})"), "tool_choice");
    EXPECT_EQ(param_of(R"({"max_tokens": 5, "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        "messages": [{"role": "user", "content": "x"}]})"), "tools[0].type");
    EXPECT_EQ(param_of(R"({"max_tokens": 5, "output_config": {"format": {"type": "json_schema"}},
        "messages": [{"role": "user", "content": "x"}]})"), "output_config.format");
    for (const char* f : {"mcp_servers", "container", "context_management"})
        EXPECT_EQ(param_of(std::string(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], ")") + f +
                           R"(": [{"x": 1}]})"),
                  f);
    EXPECT_EQ(parse_messages_request(parse_body(R"({"messages": [{"role": "user", "content": "x"}]})"), 1000,
                                     api_default_sampling(), /*count_only=*/true)
                  .messages.size(),
              1u);
    EXPECT_EQ(anthropic_error_json(429, "busy")["error"]["type"], "rate_limit_error");
}

TEST(Anthropic, ResponsesAndStreams) {
    const ResponseMeta m{Endpoint::Messages, "msg_1", 0, "model"};
    ChoiceResult c;
    c.text = "Checking.";
    c.reasoning = "Use the tool.";
    c.tool_calls.push_back(ToolCall{"call_abc", "get_weather", R"({"city":"Paris"})"});
    c.finish_reason = "tool_calls";
    const Json r = messages_response_json(m, c, Usage{10, 5, 4});
    ASSERT_EQ(r["content"].size(), 3u);
    EXPECT_EQ(r["content"][0]["type"], "thinking");
    EXPECT_EQ(r["content"][1]["text"], "Checking.");
    EXPECT_EQ(r["content"][2]["id"], "toolu_abc");
    EXPECT_EQ(r["content"][2]["input"]["city"], "Paris");
    EXPECT_EQ(r["stop_reason"], "tool_use");
    EXPECT_EQ(r["usage"]["input_tokens"], 6);
    EXPECT_EQ(r["usage"]["cache_read_input_tokens"], 4);
    c.finish_reason = "stop";
    c.stop_sequence = "END";
    EXPECT_EQ(anthropic_stop_reason(c), "stop_sequence");

    AnthropicStream s(m);
    std::string out = s.start(10);
    out += s.delta(ChatDelta{"thin", "", {}});
    out += s.delta(ChatDelta{"king", "Hi", {}});
    // a call whose input streams in two pieces
    out += s.delta(ChatDelta{"", " there", {ToolCallPiece{0, "call_1", "f", "{\"a\":", true, false}}});
    out += s.delta(ChatDelta{"", "", {ToolCallPiece{0, "", "", " 1}", false, true}}});
    c.finish_reason = "tool_calls";
    out += s.finish(c, Usage{10, 3, 0});
    std::vector<std::string> names;
    for (size_t at = 0; (at = out.find("event: ", at)) != std::string::npos; at += 7)
        names.push_back(out.substr(at + 7, out.find('\n', at) - at - 7));
    EXPECT_EQ(names, (std::vector<std::string>{"message_start", "content_block_start", "content_block_delta",
                                               "content_block_delta", "content_block_stop", "content_block_start",
                                               "content_block_delta", "content_block_delta", "content_block_stop",
                                               "content_block_start", "content_block_delta", "content_block_delta",
                                               "content_block_stop", "message_delta", "message_stop"}));
    EXPECT_NE(out.find(R"("partial_json":"{\"a\":")"), std::string::npos) << out;
    EXPECT_NE(out.find(R"("partial_json":" 1}")"), std::string::npos) << out;
    EXPECT_NE(out.find(R"("stop_reason":"tool_use")"), std::string::npos);
    EXPECT_NE(out.find(R"("index":2)"), std::string::npos);
}

}  // namespace
