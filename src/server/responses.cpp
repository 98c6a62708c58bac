#include "server/responses.h"

#include <fmt/format.h>

#include <utility>

namespace quern::server {

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& msg) { throw ApiError(400, msg, param); }

/// The text of a message's content: a string, or input_text / output_text parts.
std::string parts_text(const Json& content, const std::string& where) {
    if (content.is_string()) return content.get<std::string>();
    if (!content.is_array()) bad(where, fmt::format("'{}' must be a string or a list of content parts", where));
    std::string out;
    for (size_t k = 0; k < content.size(); ++k) {
        const Json& p = content[k];
        const std::string type = p.is_object() ? p.value("type", "") : "";
        if ((type != "input_text" && type != "output_text" && type != "text") || !p.contains("text") ||
            !p["text"].is_string())
            bad(fmt::format("{}[{}].type", where, k),
                fmt::format("'{}[{}]' is a '{}' part; this server takes text parts (input_text, output_text) only",
                            where, k, type));
        if (!out.empty()) out += "\n";
        out += p["text"].get<std::string>();
    }
    return out;
}

/// The input items as chat messages appended to `out`.
void translate_items(const Json& input, Json& out) {
    std::string reasoning;  // a reasoning item's text, for the assistant turn after it
    for (size_t i = 0; i < input.size(); ++i) {
        const Json& it = input[i];
        const std::string p = fmt::format("input[{}]", i);
        if (!it.is_object()) bad(p, fmt::format("'{}' must be an object", p));
        const std::string type = it.value("type", it.contains("role") ? "message" : "");
        if (type == "message") {
            std::string role = it.value("role", "");
            if (role == "developer") role = "system";
            if (role != "user" && role != "system" && role != "assistant")
                bad(p + ".role", fmt::format("'{}.role' must be user, system, developer or assistant", p));
            Json m{{"role", role}, {"content", parts_text(it.contains("content") ? it["content"] : Json(""), p + ".content")}};
            if (role == "assistant" && !reasoning.empty()) m["reasoning_content"] = std::exchange(reasoning, "");
            out.push_back(std::move(m));
        } else if (type == "function_call") {
            if (!it.contains("call_id") || !it.contains("name") || !it["name"].is_string())
                bad(p, fmt::format("'{}' needs 'call_id', 'name' and 'arguments'", p));
            Json args = Json::parse(it.value("arguments", "{}"), nullptr, false);
            if (args.is_discarded() || !args.is_object()) bad(p + ".arguments", fmt::format("'{}.arguments' must be a JSON object as text", p));
            Json call{{"id", it["call_id"]}, {"type", "function"}, {"function", Json{{"name", it["name"]}, {"arguments", args}}}};
            if (!out.empty() && out.back()["role"] == "assistant" && out.back().contains("tool_calls")) {
                out.back()["tool_calls"].push_back(std::move(call));
            } else {
                Json m{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", Json::array({std::move(call)})}};
                if (!reasoning.empty()) m["reasoning_content"] = std::exchange(reasoning, "");
                out.push_back(std::move(m));
            }
        } else if (type == "function_call_output") {
            if (!it.contains("call_id")) bad(p + ".call_id", fmt::format("'{}.call_id' is required", p));
            const Json& o = it.contains("output") ? it["output"] : Json("");
            out.push_back(Json{{"role", "tool"},
                               {"tool_call_id", it["call_id"]},
                               {"content", o.is_string() ? o.get<std::string>() : parts_text(o, p + ".output")}});
        } else if (type == "reasoning") {
            if (it.contains("content") && it["content"].is_array())
                for (const Json& c : it["content"])
                    if (c.is_object() && c.contains("text") && c["text"].is_string()) reasoning += c["text"].get<std::string>();
        } else {
            bad(p + ".type", fmt::format("'{}' is a '{}' item; this server takes message, function_call, "
                                         "function_call_output and reasoning items",
                                         p, type));
        }
    }
}

Json usage_of(const Usage& u) {
    return Json{{"input_tokens", u.prompt_tokens},
                {"input_tokens_details", Json{{"cached_tokens", u.cached_tokens}}},
                {"output_tokens", u.completion_tokens},
                {"output_tokens_details", Json{{"reasoning_tokens", 0}}},
                {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

Json message_item(const std::string& id, const std::string& text, const char* status) {
    return Json{{"type", "message"},
                {"id", id},
                {"status", status},
                {"role", "assistant"},
                {"content", Json::array({Json{{"type", "output_text"}, {"text", text}, {"annotations", Json::array()}}})}};
}

Json reasoning_item(const std::string& id, const std::string& text) {
    return Json{{"type", "reasoning"},
                {"id", id},
                {"summary", Json::array()},
                {"content", Json::array({Json{{"type", "reasoning_text"}, {"text", text}}})}};
}

Json call_item(const std::string& id, const ToolCall& t, const char* status) {
    return Json{{"type", "function_call"}, {"id", id},      {"call_id", t.id},
                {"name", t.name},          {"arguments", t.arguments}, {"status", status}};
}

Json base_object(const ResponseMeta& m, const char* status, const std::string& prev) {
    return Json{{"id", m.id},
                {"object", "response"},
                {"created_at", m.created},
                {"status", status},
                {"error", nullptr},
                {"incomplete_details", nullptr},
                {"model", m.model},
                {"output", Json::array()},
                {"parallel_tool_calls", true},
                {"previous_response_id", prev.empty() ? Json(nullptr) : Json(prev)},
                {"text", Json{{"format", Json{{"type", "text"}}}}},
                {"tool_choice", "auto"},
                {"tools", Json::array()},
                {"metadata", Json::object()}};
}

}  // namespace

static ApiRequest parse_responses_request_unguarded(const Json& body, int32_t n_vocab, const SamplingParams& defaults,
                                   const Json* history) {
    // Fields that would change the output and are not implemented: refused
    // by name (those that change nothing here are accepted).
    static const std::pair<const char*, const char*> kRefused[] = {
        {"top_logprobs", "log-probabilities are not returned by this endpoint (use /v1/chat/completions)"},
        {"max_tool_calls", "a bound on tool calls is not supported"},
        {"prompt", "stored prompt templates are not supported; send 'input' and 'instructions'"},
        {"conversation", "stored conversations are not supported; use 'previous_response_id'"},
    };
    for (const auto& [name, why] : kRefused)
        if (body.contains(name) && !body[name].is_null()) bad(name, fmt::format("'{}': {}", name, why));
    if (body.value("background", false)) bad("background", "'background': responses run in the foreground only");
    if (body.contains("include") && body["include"].is_array() && !body["include"].empty())
        bad("include", "'include': no extra output data (encrypted reasoning, logprobs, search results) is available");
    Json oa = Json::object();
    if (body.contains("model")) oa["model"] = body["model"];
    Json convo = history && history->is_array() ? *history : Json::array();  // kept for a later continuation
    if (!body.contains("input") || body["input"].is_null()) bad("input", "'input' is required: a string or a list of items");
    const Json& input = body["input"];
    if (input.is_string()) convo.push_back(Json{{"role", "user"}, {"content", input}});
    else if (input.is_array()) translate_items(input, convo);
    else bad("input", "'input' must be a string or a list of items");
    Json msgs = Json::array();
    if (body.contains("instructions") && body["instructions"].is_string())  // this request's only
        msgs.push_back(Json{{"role", "system"}, {"content", body["instructions"]}});
    for (const Json& m : convo) msgs.push_back(m);
    oa["messages"] = std::move(msgs);
    if (body.contains("tools") && !body["tools"].is_null()) {
        const Json& t = body["tools"];
        if (!t.is_array()) bad("tools", "'tools' must be a list");
        Json tools = Json::array();
        for (size_t i = 0; i < t.size(); ++i) {
            const std::string p = fmt::format("tools[{}]", i);
            const std::string type = t[i].is_object() ? t[i].value("type", "") : "";
            if (type != "function")
                bad(p + ".type", fmt::format("'{}' is a '{}' tool; this server runs function tools only", p, type));
            if (!t[i].contains("name") || !t[i]["name"].is_string()) bad(p + ".name", fmt::format("'{}.name' is required", p));
            Json fn{{"name", t[i]["name"]}};
            if (t[i].contains("description")) fn["description"] = t[i]["description"];
            fn["parameters"] = t[i].contains("parameters") ? t[i]["parameters"] : Json{{"type", "object"}};
            tools.push_back(Json{{"type", "function"}, {"function", std::move(fn)}});
        }
        oa["tools"] = std::move(tools);
    }
    for (const char* k : {"parallel_tool_calls", "temperature", "top_p", "stream"})
        if (body.contains(k)) oa[k] = body[k];
    if (body.contains("tool_choice")) {
        const Json& tc = body["tool_choice"];
        if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("name"))
            oa["tool_choice"] = Json{{"type", "function"}, {"function", Json{{"name", tc["name"]}}}};
        else
            oa["tool_choice"] = tc;
    }
    if (body.contains("max_output_tokens")) oa["max_tokens"] = body["max_output_tokens"];
    if (body.contains("text") && body["text"].is_object() && body["text"].contains("format")) {
        const Json& f = body["text"]["format"];
        const std::string type = f.is_object() ? f.value("type", "") : "";
        if (type == "json_schema") {
            if (!f.contains("schema")) bad("text.format", "'text.format.schema' is required (the JSON schema)");
            oa["response_format"] = Json{{"type", "json_schema"}, {"json_schema", Json{{"schema", f["schema"]}}}};
        } else if (type == "json_object") {
            oa["response_format"] = Json{{"type", "json_object"}};
        } else if (type != "text") {
            bad("text.format", "'text.format.type' may be text, json_object or json_schema");
        }
    }
    if (body.contains("reasoning") && body["reasoning"].is_object() && body["reasoning"].contains("effort") &&
        body["reasoning"]["effort"].is_string()) {
        const std::string e = body["reasoning"]["effort"].get<std::string>();
        oa["chat_template_kwargs"] = Json{{"enable_thinking", e != "none" && e != "minimal"}};  // the template's switch
    }
    ApiRequest r = parse_chat_request(oa, n_vocab, defaults);
    r.endpoint = Endpoint::Responses;
    r.continuation = std::move(convo);
    return r;
}

ApiRequest parse_responses_request(const Json& body, int32_t n_vocab, const SamplingParams& defaults,
                                   const Json* history) {
    return parse_or_400(body, [&] { return parse_responses_request_unguarded(body, n_vocab, defaults, history); });
}

Json response_output_items(const ChoiceResult& c, const std::string& p) {
    Json out = Json::array();
    if (!c.reasoning.empty()) out.push_back(reasoning_item("rs_" + p, c.reasoning));
    if (!c.text.empty() || c.tool_calls.empty()) out.push_back(message_item("msg_" + p, c.text, "completed"));
    for (size_t i = 0; i < c.tool_calls.size(); ++i)
        out.push_back(call_item("fc_" + p + std::to_string(i), c.tool_calls[i], "completed"));
    return out;
}

Json response_object_json(const ResponseMeta& m, const ChoiceResult& c, const Usage& u, const Json& output,
                          const std::string& prev) {
    const bool cut = c.finish_reason == "length" || c.finish_reason == "abort";
    Json o = base_object(m, cut ? "incomplete" : "completed", prev);
    // "abort": cut off by a server shutdown
    if (cut) o["incomplete_details"] = Json{{"reason", c.finish_reason == "abort" ? "abort" : "max_output_tokens"}};
    o["output"] = output;
    o["usage"] = usage_of(u);
    return o;
}

Json response_history(const Json& continuation, const ChoiceResult& c) {
    Json h = continuation.is_array() ? continuation : Json::array();
    Json m{{"role", "assistant"}, {"content", c.text.empty() && !c.tool_calls.empty() ? Json(nullptr) : Json(c.text)}};
    if (!c.reasoning.empty()) m["reasoning_content"] = c.reasoning;
    if (!c.tool_calls.empty()) {
        Json calls = Json::array();
        for (const ToolCall& t : c.tool_calls)
            calls.push_back(Json{{"id", t.id},
                                 {"type", "function"},
                                 {"function", Json{{"name", t.name}, {"arguments", Json::parse(t.arguments, nullptr, false)}}}});
        m["tool_calls"] = std::move(calls);
    }
    h.push_back(std::move(m));
    return h;
}

void ResponseStore::put(const std::string& id, Json messages) {
    std::lock_guard<std::mutex> lock(mu_);
    if (items_.emplace(id, std::move(messages)).second) order_.push_back(id);
    while (order_.size() > cap_) {
        items_.erase(order_.front());
        order_.pop_front();
    }
}

Json ResponseStore::get(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = items_.find(id);
    return it == items_.end() ? Json() : it->second;
}

std::string ResponsesStream::event(const std::string& type, Json data) {
    data["type"] = type;
    data["sequence_number"] = seq_++;
    return "event: " + type + "\ndata: " + dump(data) + "\n\n";
}

std::string ResponsesStream::start() {
    std::string out = event("response.created", Json{{"response", base_object(m_, "in_progress", prev_)}});
    out += event("response.in_progress", Json{{"response", base_object(m_, "in_progress", prev_)}});
    return out;
}

std::string ResponsesStream::close() {
    if (item_ == Item::None) return "";
    std::string out;
    if (item_ == Item::Call) {
        out += event("response.function_call_arguments.done",
                     Json{{"item_id", item_id_}, {"output_index", index_}, {"arguments", call_.arguments}});
        done_.push_back(call_item(item_id_, call_, "completed"));
    } else if (item_ == Item::Reasoning) {
        out += event("response.reasoning_text.done",
                     Json{{"item_id", item_id_}, {"output_index", index_}, {"content_index", 0}, {"text", text_}});
        done_.push_back(reasoning_item(item_id_, text_));
    } else {
        const Json part{{"type", "output_text"}, {"text", text_}, {"annotations", Json::array()}};
        out += event("response.output_text.done",
                      Json{{"item_id", item_id_}, {"output_index", index_}, {"content_index", 0}, {"text", text_}});
        out += event("response.content_part.done",
                     Json{{"item_id", item_id_}, {"output_index", index_}, {"content_index", 0}, {"part", part}});
        done_.push_back(message_item(item_id_, text_, "completed"));
    }
    out += event("response.output_item.done", Json{{"output_index", index_}, {"item", done_.back()}});
    item_ = Item::None;
    text_.clear();
    return out;
}

std::string ResponsesStream::open(Item it) {
    if (item_ == it) return "";
    std::string out = close();
    item_ = it;
    ++index_;
    const std::string suffix = m_.id.substr(m_.id.find('_') + 1) + std::to_string(index_);
    if (it == Item::Reasoning) {
        item_id_ = "rs_" + suffix;
        out += event("response.output_item.added",
                     Json{{"output_index", index_},
                          {"item", Json{{"type", "reasoning"}, {"id", item_id_}, {"summary", Json::array()},
                                        {"content", Json::array()}}}});
    } else {
        item_id_ = "msg_" + suffix;
        Json item = message_item(item_id_, "", "in_progress");
        item["content"] = Json::array();
        out += event("response.output_item.added", Json{{"output_index", index_}, {"item", item}});
        out += event("response.content_part.added",
                     Json{{"item_id", item_id_},
                          {"output_index", index_},
                          {"content_index", 0},
                          {"part", Json{{"type", "output_text"}, {"text", ""}, {"annotations", Json::array()}}}});
    }
    return out;
}

std::string ResponsesStream::delta(const ChatDelta& d) {
    std::string out;
    if (!d.reasoning.empty()) {
        out += open(Item::Reasoning);
        text_ += d.reasoning;
        out += event("response.reasoning_text.delta",
                     Json{{"item_id", item_id_}, {"output_index", index_}, {"content_index", 0}, {"delta", d.reasoning}});
    }
    if (!d.content.empty()) {
        out += open(Item::Message);
        text_ += d.content;
        out += event("response.output_text.delta",
                     Json{{"item_id", item_id_}, {"output_index", index_}, {"content_index", 0}, {"delta", d.content}});
    }
    // A tool call is a function_call item: its arguments stream as deltas.
    for (const ToolCallPiece& p : d.calls) {
        if (p.first) {
            out += close();
            item_ = Item::Call;
            ++index_;
            item_id_ = "fc_" + m_.id.substr(m_.id.find('_') + 1) + std::to_string(index_);
            call_ = ToolCall{p.id, p.name, ""};
            out += event("response.output_item.added", Json{{"output_index", index_}, {"item", call_item(item_id_, call_, "in_progress")}});
        }
        if (!p.arguments.empty()) {
            call_.arguments += p.arguments;
            out += event("response.function_call_arguments.delta",
                         Json{{"item_id", item_id_}, {"output_index", index_}, {"delta", p.arguments}});
        }
        if (p.last) out += close();
    }
    return out;
}

std::string ResponsesStream::finish(const ChoiceResult& c, const Usage& u) {
    std::string out = close();
    if (done_.empty()) {  // nothing generated: an empty message, as the non-streamed response has
        out += open(Item::Message);
        out += close();
    }
    const bool cut = c.finish_reason == "length" || c.finish_reason == "abort";
    out += event(cut ? "response.incomplete" : "response.completed",
                 Json{{"response", response_object_json(m_, c, u, done_, prev_)}});
    return out;
}

}  // namespace quern::server
