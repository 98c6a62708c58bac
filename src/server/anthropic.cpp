#include "server/anthropic.h"

#include <fmt/format.h>

namespace quern::server {

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& msg) { throw ApiError(400, msg, param); }

/// Text of a content given as a string or as text blocks ("" for none).
std::string text_of(const Json& content, const std::string& where) {
    if (content.is_null()) return "";
    if (content.is_string()) return content.get<std::string>();
    if (!content.is_array()) bad(where, fmt::format("'{}' must be a string or a list of content blocks", where));
    std::string out;
    for (const Json& b : content) {
        if (!b.is_object() || b.value("type", "") != "text" || !b.contains("text") || !b["text"].is_string())
            bad(where, fmt::format("'{}' may hold text blocks only here", where));
        if (!out.empty()) out += "\n";
        out += b["text"].get<std::string>();
    }
    return out;
}

/// One Messages message as the chat messages it stands for: a user turn's
/// tool results become tool messages (before its text), an assistant turn's
/// tool_use blocks tool calls and its thinking reasoning_content.
void translate_message(const Json& m, size_t i, Json& out) {
    const std::string p = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad(p, fmt::format("'{}' must be an object with 'role' and 'content'", p));
    const std::string role = m.contains("role") && m["role"].is_string() ? m["role"].get<std::string>() : "";
    if (role != "user" && role != "assistant") bad(p + ".role", fmt::format("'{}.role' must be user or assistant", p));
    if (!m.contains("content")) bad(p + ".content", fmt::format("'{}.content' is required", p));
    const Json& content = m["content"];
    if (content.is_string()) {
        out.push_back(Json{{"role", role}, {"content", content}});
        return;
    }
    if (!content.is_array()) bad(p + ".content", fmt::format("'{}.content' must be a string or a list of blocks", p));
    std::string text, thinking;
    Json calls = Json::array();
    for (size_t k = 0; k < content.size(); ++k) {
        const Json& b = content[k];
        const std::string bp = fmt::format("{}.content[{}]", p, k);
        const std::string type = b.is_object() ? b.value("type", "") : "";
        if (type == "text") {
            if (!text.empty()) text += "\n";
            text += text_of(Json::array({b}), bp);
        } else if (type == "tool_result" && role == "user") {
            if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string())
                bad(bp + ".tool_use_id", fmt::format("'{}.tool_use_id' is required", bp));
            std::string r = b.contains("content") ? text_of(b["content"], bp + ".content") : "";
            if (b.value("is_error", false)) r = "Error: " + r;
            out.push_back(Json{{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", r}});
        } else if (type == "tool_use" && role == "assistant") {
            if (!b.contains("name") || !b["name"].is_string() || !b.contains("id") || !b["id"].is_string())
                bad(bp, fmt::format("'{}' needs 'id' and 'name'", bp));
            const Json input = b.contains("input") && b["input"].is_object() ? b["input"] : Json::object();
            calls.push_back(Json{{"id", b["id"]},
                                 {"type", "function"},
                                 {"function", Json{{"name", b["name"]}, {"arguments", input}}}});
        } else if (type == "thinking" && role == "assistant") {
            thinking += b.value("thinking", "");
        } else if (type == "redacted_thinking" && role == "assistant") {
            // nothing to show the template
        } else {
            bad(bp + ".type", fmt::format("'{}' is a '{}' block, which this server does not take in a {} turn (it "
                                          "serves a text model: text, tool_use, tool_result, thinking)",
                                          bp, type, role));
        }
    }
    if (role == "user" && text.empty()) return;  // only tool results
    Json msg{{"role", role}, {"content", text.empty() && role == "assistant" ? Json(nullptr) : Json(text)}};
    if (!thinking.empty()) msg["reasoning_content"] = thinking;
    if (!calls.empty()) msg["tool_calls"] = std::move(calls);
    out.push_back(std::move(msg));
}

std::string anthropic_id(const std::string& call_id) {
    return call_id.rfind("call_", 0) == 0 ? "toolu_" + call_id.substr(5) : call_id;
}

Json usage_of(const Usage& u) {
    return Json{{"input_tokens", u.prompt_tokens - u.cached_tokens},
                {"output_tokens", u.completion_tokens},
                {"cache_read_input_tokens", u.cached_tokens},
                {"cache_creation_input_tokens", 0}};
}

}  // namespace

static ApiRequest parse_messages_request_unguarded(const Json& body, int32_t n_vocab, const SamplingParams& defaults, bool count_only) {
    // Fields that would change the output and are not implemented: refused
    // by name (those that change nothing here are accepted).
    static const std::pair<const char*, const char*> kRefused[] = {
        {"mcp_servers", "this server connects to no MCP servers; send client tools"},
        {"container", "this server runs no code-execution container"},
        {"context_management", "context editing is not supported; send the context to use"},
    };
    for (const auto& [name, why] : kRefused)
        if (body.contains(name) && !body[name].is_null()) bad(name, fmt::format("'{}': {}", name, why));
    Json oa = Json::object();  // the same request in the chat API's terms
    if (body.contains("model")) oa["model"] = body["model"];
    Json msgs = Json::array();
    if (body.contains("system") && !body["system"].is_null())
        msgs.push_back(Json{{"role", "system"}, {"content", text_of(body["system"], "system")}});
    const Json* m = body.contains("messages") ? &body["messages"] : nullptr;
    if (!m || !m->is_array() || m->empty()) bad("messages", "'messages' is required: a non-empty list of messages");
    for (size_t i = 0; i < m->size(); ++i) translate_message((*m)[i], i, msgs);
    oa["messages"] = std::move(msgs);
    if (body.contains("tools") && !body["tools"].is_null()) {
        const Json& t = body["tools"];
        if (!t.is_array()) bad("tools", "'tools' must be a list");
        Json tools = Json::array();
        for (size_t i = 0; i < t.size(); ++i) {
            const Json& x = t[i];
            const std::string p = fmt::format("tools[{}]", i);
            if (!x.is_object() || !x.contains("name") || !x["name"].is_string())
                bad(p, fmt::format("'{}' must be an object with 'name' and 'input_schema'", p));
            const std::string type = x.value("type", "custom");
            if (type != "custom")
                bad(p + ".type", fmt::format("'{}' is a '{}' tool, which this server does not run (client tools only)", p, type));
            Json fn{{"name", x["name"]}};
            if (x.contains("description")) fn["description"] = x["description"];
            fn["parameters"] = x.contains("input_schema") ? x["input_schema"] : Json{{"type", "object"}};
            tools.push_back(Json{{"type", "function"}, {"function", std::move(fn)}});
        }
        oa["tools"] = std::move(tools);
    }
    if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
        const Json& tc = body["tool_choice"];
        const std::string type = tc.is_object() ? tc.value("type", "") : "";
        if (type == "auto" || type == "none") oa["tool_choice"] = type;
        else if (type == "any") oa["tool_choice"] = "required";
        else if (type == "tool" && tc.contains("name") && tc["name"].is_string())
            oa["tool_choice"] = Json{{"type", "function"}, {"function", Json{{"name", tc["name"]}}}};
        else
            bad("tool_choice", "'tool_choice' may be {\"type\": \"auto\"}, \"none\", \"any\" or {\"type\": \"tool\", "
                               "\"name\": ...}");
        if (tc.value("disable_parallel_tool_use", false)) oa["parallel_tool_calls"] = false;
    }
    if (body.contains("max_tokens")) oa["max_tokens"] = body["max_tokens"];
    else if (!count_only) bad("max_tokens", "'max_tokens' is required");
    for (const char* k : {"temperature", "top_p", "top_k", "stream"})
        if (body.contains(k)) oa[k] = body[k];
    if (body.contains("stop_sequences")) oa["stop"] = body["stop_sequences"];
    if (body.contains("thinking") && !body["thinking"].is_null()) {
        const Json& th = body["thinking"];
        const std::string type = th.is_object() ? th.value("type", "") : "";
        if (type != "enabled" && type != "adaptive" && type != "between_tools" && type != "disabled")
            bad("thinking", "'thinking.type' must be enabled, adaptive, between_tools or disabled");
        oa["chat_template_kwargs"] = Json{{"enable_thinking", type != "disabled"}};  // the template's switch
    }
    if (body.contains("output_config") && body["output_config"].is_object() && body["output_config"].contains("format") &&
        !body["output_config"]["format"].is_null()) {
        const Json& f = body["output_config"]["format"];
        if (!f.is_object() || f.value("type", "") != "json_schema" || !f.contains("schema"))
            bad("output_config.format", "'output_config.format' must be {\"type\": \"json_schema\", \"schema\": ...}");
        oa["response_format"] = Json{{"type", "json_schema"}, {"json_schema", Json{{"schema", f["schema"]}}}};
    }
    ApiRequest r = parse_chat_request(oa, n_vocab, defaults);
    r.endpoint = Endpoint::Messages;
    return r;
}

ApiRequest parse_messages_request(const Json& body, int32_t n_vocab, const SamplingParams& defaults, bool count_only) {
    return parse_or_400(body, [&] { return parse_messages_request_unguarded(body, n_vocab, defaults, count_only); });
}

Json anthropic_error_json(int status, const std::string& message) {
    const char* type = status == 400 ? "invalid_request_error"
                       : status == 401 ? "authentication_error"
                       : status == 403 ? "permission_error"
                       : status == 404 ? "not_found_error"
                       : status == 413 ? "request_too_large"
                       : status == 429 ? "rate_limit_error"
                       : status == 503 ? "overloaded_error"
                                       : "api_error";
    return Json{{"type", "error"}, {"error", Json{{"type", type}, {"message", message}}}};
}

std::string anthropic_stop_reason(const ChoiceResult& c) {
    if (c.finish_reason == "tool_calls") return "tool_use";
    if (c.finish_reason == "length") return "max_tokens";
    // cut off by a server shutdown: Anthropic's "the turn was paused; send
    // it back to continue"
    if (c.finish_reason == "abort") return "pause_turn";
    if (!c.stop_sequence.empty()) return "stop_sequence";
    return "end_turn";
}

Json messages_response_json(const ResponseMeta& m, const ChoiceResult& c, const Usage& u) {
    Json content = Json::array();
    if (!c.reasoning.empty()) content.push_back(Json{{"type", "thinking"}, {"thinking", c.reasoning}, {"signature", ""}});
    if (!c.text.empty()) content.push_back(Json{{"type", "text"}, {"text", c.text}});
    for (const ToolCall& t : c.tool_calls) {
        Json input = Json::parse(t.arguments, nullptr, false);
        if (!input.is_object()) input = Json::object();  // a call cut short by max_tokens
        content.push_back(Json{{"type", "tool_use"}, {"id", anthropic_id(t.id)}, {"name", t.name}, {"input", input}});
    }
    return Json{{"id", m.id},
                {"type", "message"},
                {"role", "assistant"},
                {"model", m.model},
                {"content", std::move(content)},
                {"stop_reason", anthropic_stop_reason(c)},
                {"stop_sequence", c.stop_sequence.empty() ? Json(nullptr) : Json(c.stop_sequence)},
                {"usage", usage_of(u)}};
}

std::string AnthropicStream::event(const char* name, const Json& data) const {
    return std::string("event: ") + name + "\ndata: " + dump(data) + "\n\n";
}

std::string AnthropicStream::start(int64_t input_tokens) {
    const Json msg{{"id", m_.id},           {"type", "message"},     {"role", "assistant"},
                   {"model", m_.model},     {"content", Json::array()}, {"stop_reason", nullptr},
                   {"stop_sequence", nullptr},
                   {"usage", Json{{"input_tokens", input_tokens}, {"output_tokens", 0}}}};
    return event("message_start", Json{{"type", "message_start"}, {"message", msg}});
}

std::string AnthropicStream::close() {
    if (block_ == Block::None) return "";
    block_ = Block::None;
    return event("content_block_stop", Json{{"type", "content_block_stop"}, {"index", index_}});
}

std::string AnthropicStream::open(Block b) {
    if (block_ == b) return "";
    std::string out = close();
    block_ = b;
    const Json cb = b == Block::Thinking ? Json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                         : Json{{"type", "text"}, {"text", ""}};
    out += event("content_block_start", Json{{"type", "content_block_start"}, {"index", ++index_}, {"content_block", cb}});
    return out;
}

std::string AnthropicStream::delta(const ChatDelta& d) {
    std::string out;
    if (!d.reasoning.empty()) {
        out += open(Block::Thinking);
        out += event("content_block_delta",
                     Json{{"type", "content_block_delta"},
                          {"index", index_},
                          {"delta", Json{{"type", "thinking_delta"}, {"thinking", d.reasoning}}}});
    }
    if (!d.content.empty()) {
        out += open(Block::Text);
        out += event("content_block_delta", Json{{"type", "content_block_delta"},
                                                 {"index", index_},
                                                 {"delta", Json{{"type", "text_delta"}, {"text", d.content}}}});
    }
    // A tool call is a tool_use block: its input streams as partial JSON.
    for (const ToolCallPiece& p : d.calls) {
        if (p.first) {
            out += close();
            block_ = Block::Tool;
            out += event("content_block_start",
                         Json{{"type", "content_block_start"},
                              {"index", ++index_},
                              {"content_block", Json{{"type", "tool_use"}, {"id", anthropic_id(p.id)}, {"name", p.name},
                                                     {"input", Json::object()}}}});
        }
        if (!p.arguments.empty())
            out += event("content_block_delta",
                         Json{{"type", "content_block_delta"},
                              {"index", index_},
                              {"delta", Json{{"type", "input_json_delta"}, {"partial_json", p.arguments}}}});
        if (p.last) out += close();
    }
    return out;
}

std::string AnthropicStream::finish(const ChoiceResult& c, const Usage& u) {
    std::string out = close();
    out += event("message_delta",
                 Json{{"type", "message_delta"},
                      {"delta", Json{{"stop_reason", anthropic_stop_reason(c)},
                                     {"stop_sequence", c.stop_sequence.empty() ? Json(nullptr) : Json(c.stop_sequence)}}},
                      {"usage", Json{{"output_tokens", u.completion_tokens}}}});
    out += event("message_stop", Json{{"type", "message_stop"}});
    return out;
}

}  // namespace quern::server
