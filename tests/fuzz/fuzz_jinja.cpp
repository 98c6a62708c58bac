// libFuzzer harness: a chat template (the input) parsed and rendered over a
// conversation with a system prompt, tools, a tool call and its result, as
// quern serve renders a request. A template that does not parse, fails or
// runs out of its budgets must end in quern::Error, within the harness's
// time limit.
#include "chat/chat.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace quern;
    using chat::Json;
    static const Json kMessages = Json::parse(R"([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris? <|im_end|>"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21.5}"},
        {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]}])");
    static const Json kTools = Json::parse(R"([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather of a city", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "array", "items": {"type": "integer"}}},
        "required": ["city"]}}}])");
    try {
        const chat::ChatTemplate t(std::string(reinterpret_cast<const char*>(data), size), "<s>", "</s>", "fuzz");
        chat::ChatOptions o;
        o.tools = kTools;
        o.extra = Json{{"enable_thinking", true}};
        (void)t.apply(kMessages, o);
        o.add_generation_prompt = false;
        o.tools = nullptr;
        (void)t.apply(Json::array({kMessages[1]}), o);
    } catch (const Error&) {
    }
    return 0;
}
