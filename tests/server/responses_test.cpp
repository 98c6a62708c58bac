// The OpenAI Responses schema (server/responses.h): input items as the chat
// request they stand for (instructions, messages with text parts,
// function_call / function_call_output, reasoning items, a continued
// conversation), refusals naming the field, output items, the kept history,
// and the stream's event sequence (sequence numbers rising, items opened and
// closed in order, the completed response carrying every item).
#include <gtest/gtest.h>

#include "server/responses.h"

using namespace quern::server;

namespace {

TEST(Responses, ItemsBecomeAChatRequest) {
    const Json history = Json::parse(R"([{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "ok"}])");
    const ApiRequest r = parse_responses_request(parse_body(R"({"model": "m", "instructions": "be brief",
        "max_output_tokens": 40, "temperature": 0.2, "reasoning": {"effort": "minimal"},
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
        "input": [{"role": "developer", "content": "rules"},
                  {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
                  {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "call"}]},
                  {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"},
                  {"type": "function_call_output", "call_id": "call_1", "output": "cold"}]})"),
                                                 1000, api_default_sampling(), &history);
    EXPECT_EQ(r.endpoint, Endpoint::Responses);
    EXPECT_EQ(r.max_tokens, 40);
    EXPECT_EQ(r.template_kwargs["enable_thinking"], false);
    ASSERT_EQ(r.tools.size(), 1u);
    ASSERT_EQ(r.messages.size(), 7u);
    EXPECT_EQ(r.messages[0]["content"], "be brief");  // instructions first, this request only
    EXPECT_EQ(r.messages[1]["content"], "earlier");
    EXPECT_EQ(r.messages[3]["role"], "system");
    EXPECT_EQ(r.messages[5]["reasoning_content"], "call");
    EXPECT_EQ(r.messages[5]["tool_calls"][0]["function"]["arguments"]["city"], "Oslo");
    EXPECT_EQ(r.messages[6]["role"], "tool");
    EXPECT_EQ(r.continuation.size(), 6u);  // without the instructions
}

TEST(Responses, RefusalsNameTheField) {
    const auto param_of = [](const std::string& body) {
        try {
            parse_responses_request(parse_body(body), 1000, api_default_sampling(), nullptr);
        } catch (const ApiError& e) {
            EXPECT_EQ(e.status, 400);
            return e.param;
        }
        return std::string("(accepted)");
    };
    EXPECT_EQ(param_of(R"({})"), "input");
    EXPECT_EQ(param_of(R"({"input": [{"type": "item_reference", "id": "x"}]})"), "input[0].type");
    EXPECT_EQ(param_of(R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]})"),
              "input[0].content[0].type");
    EXPECT_EQ(param_of(R"({"input": "x", "tools": [{"type": "web_search"}]})"), "tools[0].type");
    EXPECT_EQ(param_of(R"({"input": "x", "top_logprobs": 2})"), "top_logprobs");
    EXPECT_EQ(param_of(R"({"input": "x", "max_tool_calls": 2})"), "max_tool_calls");
    EXPECT_EQ(param_of(R"({"input": "x", "background": true})"), "background");
    EXPECT_EQ(param_of(R"({"input": "x", "include": ["reasoning.encrypted_content"]})"), "include");
    EXPECT_EQ(param_of(R"({"input": "x", "include": [], "background": false})"), "(accepted)");
    EXPECT_EQ(param_of(R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "a",
        "schema": {"type": "number", "multipleOf": 3}}}})"),
              "response_format");  // the schema's keyword named in the message
    EXPECT_EQ(param_of(R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "a"}}})"), "text.format");
    EXPECT_NE(parse_responses_request(parse_body(R"({"input": "x", "text": {"format": {"type": "json_schema",
        "name": "a", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}})"),
                                      1000, api_default_sampling(), nullptr)
                  .grammar,
              nullptr);
    EXPECT_EQ(param_of(R"({"input": "x", "tool_choice": "required"})"), "tool_choice");
    EXPECT_EQ(param_of(R"({"input": "x", "text": {"format": {"type": "text"}}})"), "(accepted)");
}

TEST(Responses, OutputItemsHistoryAndStream) {
    const ResponseMeta m{Endpoint::Responses, "resp_abc", 7, "model"};
    ChoiceResult c;
    c.reasoning = "think";
    c.text = "Checking.";
    c.tool_calls.push_back(ToolCall{"call_1", "get_weather", R"({"city":"Paris"})"});
    c.finish_reason = "tool_calls";
    const Json items = response_output_items(c, "abc");
    ASSERT_EQ(items.size(), 3u);
    EXPECT_EQ(items[0]["type"], "reasoning");
    EXPECT_EQ(items[1]["content"][0]["text"], "Checking.");
    EXPECT_EQ(items[2]["call_id"], "call_1");
    const Json obj = response_object_json(m, c, Usage{9, 4, 2}, items, "resp_prev");
    EXPECT_EQ(obj["status"], "completed");
    EXPECT_EQ(obj["previous_response_id"], "resp_prev");
    EXPECT_EQ(obj["usage"]["total_tokens"], 13);
    const Json h = response_history(Json::parse(R"([{"role": "user", "content": "q"}])"), c);
    ASSERT_EQ(h.size(), 2u);
    EXPECT_EQ(h[1]["tool_calls"][0]["function"]["arguments"]["city"], "Paris");

    ResponseStore store(2);
    store.put("a", Json::array());
    store.put("b", Json::array());
    store.put("c", Json::array());
    EXPECT_TRUE(store.get("a").is_null());  // the oldest out
    EXPECT_FALSE(store.get("c").is_null());

    ResponsesStream s(m, "");
    std::string out = s.start();
    out += s.delta(ChatDelta{"thi", "", {}});
    out += s.delta(ChatDelta{"nk", "Check", {}});
    // the call's arguments stream in two pieces
    out += s.delta(ChatDelta{"", "ing.", {ToolCallPiece{0, c.tool_calls[0].id, c.tool_calls[0].name, R"({"city":)", true, false}}});
    out += s.delta(ChatDelta{"", "", {ToolCallPiece{0, "", "", R"("Paris"})", false, true}}});
    out += s.finish(c, Usage{9, 4, 0});
    std::vector<Json> evs;
    for (size_t at = 0; (at = out.find("data: ", at)) != std::string::npos;) {
        const size_t end = out.find("\n\n", at);
        evs.push_back(Json::parse(out.substr(at + 6, end - at - 6)));
        at = end;
    }
    for (size_t i = 0; i < evs.size(); ++i) EXPECT_EQ(evs[i]["sequence_number"], i);
    EXPECT_EQ(evs.front()["type"], "response.created");
    EXPECT_EQ(evs.back()["type"], "response.completed");
    const Json& done = evs.back()["response"]["output"];
    ASSERT_EQ(done.size(), 3u);
    EXPECT_EQ(done[0]["content"][0]["text"], "think");
    EXPECT_EQ(done[1]["content"][0]["text"], "Checking.");
    EXPECT_EQ(done[2]["arguments"], R"({"city":"Paris"})");
    int arg_deltas = 0;
    for (const Json& e : evs) arg_deltas += e["type"] == "response.function_call_arguments.delta";
    EXPECT_EQ(arg_deltas, 2);
}

}  // namespace
