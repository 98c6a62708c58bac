#include "server/api.h"

#include "core/error.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace quern::server {
namespace {

constexpr int kMaxDepth = 64;
constexpr size_t kMaxStops = 4;
constexpr size_t kMaxStopBytes = 1024;
constexpr int kMaxChoices = 128;
constexpr int kMaxTopLogprobs = 20;

std::string default_type(int status) {
    switch (status) {
        case 401: return "authentication_error";
        case 404: return "not_found_error";
        case 429: return "rate_limit_error";
        case 500: return "server_error";
        case 503: return "service_unavailable";
        default: return "invalid_request_error";
    }
}

/// A short rendering of a JSON value for error messages.
std::string show(const Json& v) {
    std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
    if (s.size() > 60) s = s.substr(0, 57) + "...";
    return s;
}

[[noreturn]] void bad(const std::string& param, const std::string& msg) { throw ApiError(400, msg, param); }

/// The field, or nullptr when absent or null (null means "default" everywhere).
const Json* field(const Json& body, const char* name) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) return nullptr;
    return &*it;
}

double get_number(const Json& body, const char* name, double lo, double hi, double def) {
    const Json* v = field(body, name);
    if (!v) return def;
    if (!v->is_number()) bad(name, fmt::format("'{}' must be a number between {} and {}, got {}", name, lo, hi, show(*v)));
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi)
        bad(name, fmt::format("'{}' must be between {} and {}, got {}", name, lo, hi, show(*v)));
    return x;
}

/// An integer in [lo, hi]; a float with an integral value is accepted.
int64_t get_int(const Json& body, const char* name, int64_t lo, int64_t hi, int64_t def) {
    const Json* v = field(body, name);
    if (!v) return def;
    const std::string want = fmt::format("'{}' must be an integer between {} and {}, got {}", name, lo, hi, show(*v));
    int64_t x = 0;
    if (v->is_number_unsigned()) {
        const uint64_t u = v->get<uint64_t>();
        if (u > static_cast<uint64_t>(hi)) bad(name, want);
        x = static_cast<int64_t>(u);
    } else if (v->is_number_integer()) {
        x = v->get<int64_t>();
    } else if (v->is_number_float()) {
        const double d = v->get<double>();
        // (double)INT64_MAX rounds up to 2^63, which no int64 holds
        if (!std::isfinite(d) || d != std::floor(d) || d < static_cast<double>(lo) || d > static_cast<double>(hi) ||
            d >= 0x1p63)
            bad(name, want);
        x = static_cast<int64_t>(d);
    } else {
        bad(name, want);
    }
    if (x < lo || x > hi) bad(name, want);
    return x;
}

bool get_bool(const Json& body, const char* name, bool def) {
    const Json* v = field(body, name);
    if (!v) return def;
    if (!v->is_boolean()) bad(name, fmt::format("'{}' must be true or false, got {}", name, show(*v)));
    return v->get<bool>();
}

std::string get_string(const Json& body, const char* name) {
    const Json* v = field(body, name);
    if (!v) return {};
    if (!v->is_string()) bad(name, fmt::format("'{}' must be a string, got {}", name, show(*v)));
    return v->get<std::string>();
}

/// The fields both endpoints share.
/// Fields other servers take that would change what is generated and that
/// this server does not implement (yet): refused by name, never ignored.
void refuse_unimplemented(const Json& body) {
    static const std::pair<const char*, const char*> kFields[] = {
        {"json_schema", "a top-level 'json_schema' is not a field of this API; send 'response_format' "
                        "{\"type\": \"json_schema\", \"json_schema\": {\"schema\": ...}}"},
        {"guided_whitespace_pattern", "a custom whitespace pattern is not supported"},
        {"guided_decoding_backend", "this server has one constrained-decoding engine; leave 'guided_decoding_backend' out"},
        {"functions", "the legacy 'functions' field is not supported; send 'tools'"},
        {"function_call", "the legacy 'function_call' field is not supported; send 'tool_choice'"},
        {"logits_processors", "custom logits processors are not supported"},
        {"audio", "this server generates text only"},
        {"web_search_options", "this server runs no web search"},
    };
    for (const auto& [name, why] : kFields)
        if (field(body, name)) bad(name, fmt::format("'{}': {}", name, why));
    if (const Json* rf = field(body, "response_format")) {
        const std::string type = rf->is_object() ? rf->value("type", "") : "";
        if (type != "text" && type != "json_object" && type != "json_schema")
            bad("response_format", "'response_format.type' may be text, json_object or json_schema");
    }
    if (const Json* m = field(body, "modalities")) {
        if (!m->is_array() || m->size() != 1 || (*m)[0] != "text") bad("modalities", "this server generates text only");
    }
}

/// vLLM's constrained-decoding fields (guided_json / guided_regex /
/// guided_choice / guided_grammar, or structured_outputs with json / regex /
/// choice / grammar) as a grammar; null when none is given. `name`: the
/// field, for errors.
std::shared_ptr<const grammar::Grammar> guided_grammar(const Json& body, std::string& name) {
    std::vector<std::pair<std::string, const Json*>> given;
    for (const char* k : {"guided_json", "guided_regex", "guided_choice", "guided_grammar"})
        if (const Json* v = field(body, k)) given.emplace_back(k, v);
    if (const Json* so = field(body, "structured_outputs")) {
        if (!so->is_object()) bad("structured_outputs", "'structured_outputs' must be an object");
        for (const auto& [k, v] : so->items()) {
            if (k != "json" && k != "regex" && k != "choice" && k != "grammar")
                bad("structured_outputs." + k, fmt::format("'structured_outputs.{}' is not supported (json, regex, choice "
                                                           "and grammar are)", k));
            given.emplace_back("structured_outputs." + k, &v);
        }
    }
    if (given.empty()) return nullptr;
    if (given.size() > 1) bad(given[1].first, fmt::format("give one of '{}' and '{}', not both", given[0].first, given[1].first));
    name = given[0].first;
    const Json& v = *given[0].second;
    const std::string kind = name.substr(name.find_last_of("_.") + 1);
    try {
        if (kind == "json") {
            const Json schema = v.is_string() ? Json::parse(v.get<std::string>(), nullptr, false) : v;
            if (!schema.is_object() && !schema.is_boolean()) bad(name, fmt::format("'{}' must be a JSON schema", name));
            return grammar::json_schema_grammar(schema);
        }
        if (kind == "regex") {
            if (!v.is_string()) bad(name, fmt::format("'{}' must be a regular expression", name));
            return grammar::Grammar::parse("root ::= " + grammar::regex_to_gbnf(v.get<std::string>(), grammar::RegexTarget::Text));
        }
        if (kind == "choice") {
            if (!v.is_array() || v.empty()) bad(name, fmt::format("'{}' must be a non-empty list of strings", name));
            std::string alts;
            for (const Json& c : v) {
                if (!c.is_string()) bad(name, fmt::format("'{}' must be a non-empty list of strings", name));
                alts += (alts.empty() ? "" : " | ") + grammar::gbnf_literal(c.get<std::string>());
            }
            return grammar::Grammar::parse("root ::= " + alts);
        }
        if (!v.is_string()) bad(name, fmt::format("'{}' must be a string of GBNF rules with a 'root' rule", name));
        return grammar::Grammar::parse(v.get<std::string>());
    } catch (const quern::Error& e) {
        bad(name, fmt::format("'{}': {}", name, e.what()));
    }
}

/// Constrained decoding: response_format json_object (an object) or
/// json_schema, a GBNF grammar (grammar/grammar.h), or vLLM's guided fields;
/// one of them.
void parse_grammar(const Json& body, ApiRequest& r) {
    const Json* rf = field(body, "response_format");
    const std::string rf_type = rf && rf->is_object() ? rf->value("type", "") : "";
    const bool json_object = rf_type == "json_object" || rf_type == "json_schema";
    std::string guided;
    if (auto g = guided_grammar(body, guided)) {
        if (json_object || field(body, "grammar"))
            bad(guided, fmt::format("give '{}' or 'response_format' / 'grammar', not both", guided));
        r.grammar = std::move(g);
        return;
    }
    if (const Json* g = field(body, "grammar")) {
        if (!g->is_string()) bad("grammar", "'grammar' must be a string of GBNF rules with a 'root' rule");
        if (json_object) bad("grammar", "give 'grammar' or 'response_format' json_object, not both");
        try {
            r.grammar = grammar::Grammar::parse(g->get<std::string>());
        } catch (const quern::Error& e) {
            bad("grammar", std::string("'grammar': ") + e.what());
        }
    } else if (rf_type == "json_schema") {
        const Json* js = rf->contains("json_schema") ? &(*rf)["json_schema"] : nullptr;
        if (!js || !js->is_object() || !js->contains("schema"))
            bad("response_format", "'response_format.json_schema.schema' is required (the JSON schema)");
        try {
            r.grammar = grammar::json_schema_grammar((*js)["schema"]);
        } catch (const quern::Error& e) {
            bad("response_format", std::string("'response_format': ") + e.what());
        }
    } else if (json_object) {
        static const std::shared_ptr<const grammar::Grammar> kObject = grammar::Grammar::json(true);
        r.grammar = kObject;
    }
}

void parse_common(const Json& body, ApiRequest& r, int32_t n_vocab, const SamplingParams& def) {
    refuse_unimplemented(body);
    parse_grammar(body, r);
    r.model = get_string(body, "model");
    r.n = static_cast<int>(get_int(body, "n", 1, kMaxChoices, 1));

    SamplingParams& sp = r.sampling;
    // Absent fields take the server's defaults (api_default_sampling, or the
    // model's generation_config.json over it).
    sp.temperature = static_cast<float>(get_number(body, "temperature", 0.0, 2.0, def.temperature));
    sp.top_p = static_cast<float>(get_number(body, "top_p", 0.0, 1.0, def.top_p));
    // OpenAI accepts top_p = 0: only the most likely token survives the cut.
    if (sp.top_p == 0.0f) sp.top_p = std::numeric_limits<float>::min();
    const int64_t top_k = get_int(body, "top_k", -1, std::numeric_limits<int32_t>::max(), def.top_k);
    sp.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);
    sp.min_p = static_cast<float>(get_number(body, "min_p", 0.0, 1.0, def.min_p));
    sp.presence_penalty = static_cast<float>(get_number(body, "presence_penalty", -2.0, 2.0, def.presence_penalty));
    sp.frequency_penalty = static_cast<float>(get_number(body, "frequency_penalty", -2.0, 2.0, def.frequency_penalty));
    const double rp = get_number(body, "repetition_penalty", 0.0, 100.0, def.repeat_penalty);
    if (rp <= 0) bad("repetition_penalty", fmt::format("'repetition_penalty' must be greater than 0, got {}", rp));
    sp.repeat_penalty = static_cast<float>(rp);
    sp.repeat_last_n = -1;  // penalties see the whole sequence, as OpenAI's do
    sp.seed = 0;
    if (field(body, "seed"))
        r.seed = get_int(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), 0);

    if (const Json* v = field(body, "stop")) {
        if (v->is_string()) {
            r.stop.push_back(v->get<std::string>());
        } else if (v->is_array()) {
            if (v->size() > kMaxStops) bad("stop", fmt::format("'stop' takes at most {} strings, got {}", kMaxStops, v->size()));
            for (const Json& s : *v) {
                if (!s.is_string()) bad("stop", fmt::format("'stop' must be a string or a list of strings, got {}", show(*v)));
                r.stop.push_back(s.get<std::string>());
            }
        } else {
            bad("stop", fmt::format("'stop' must be a string or a list of strings, got {}", show(*v)));
        }
        for (const std::string& s : r.stop)
            if (s.size() > kMaxStopBytes)
                bad("stop", fmt::format("each stop string may have at most {} bytes, one has {}", kMaxStopBytes, s.size()));
    }

    if (const Json* v = field(body, "logit_bias")) {
        if (!v->is_object()) bad("logit_bias", fmt::format("'logit_bias' must be an object mapping token ids to numbers, got {}", show(*v)));
        for (const auto& [key, val] : v->items()) {
            int64_t id = -1;
            const char* p = key.c_str();
            char* end = nullptr;
            errno = 0;
            const long long parsed = key.empty() ? -1 : std::strtoll(p, &end, 10);
            if (!key.empty() && errno == 0 && end && *end == '\0') id = parsed;
            if (id < 0 || id >= n_vocab)
                bad("logit_bias", fmt::format("'logit_bias' keys must be token ids from 0 to {}, got \"{}\"", n_vocab - 1, key));
            if (!val.is_number() || !std::isfinite(val.get<double>()) || val.get<double>() < -100 || val.get<double>() > 100)
                bad("logit_bias", fmt::format("'logit_bias' values must be numbers between -100 and 100, got {} for token {}", show(val), key));
            r.logit_bias.emplace_back(static_cast<int32_t>(id), val.get<float>());
        }
    }

    r.stream = get_bool(body, "stream", false);
    if (const Json* v = field(body, "stream_options")) {
        if (!v->is_object()) bad("stream_options", fmt::format("'stream_options' must be an object, got {}", show(*v)));
        if (!r.stream) bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
        r.include_usage = get_bool(*v, "include_usage", false);
    }
    r.ignore_eos = get_bool(body, "ignore_eos", false);
    r.user = get_string(body, "user");
}

/// An assistant message's tool calls as templates take them, as vLLM
/// normalises them: an empty list dropped (Llama 3.1's template refuses it),
/// arguments sent as JSON text (OpenAI's wire form) turned into objects
/// (templates iterate or tojson them).
void normalize_tool_calls(Json& m) {
    const auto it = m.find("tool_calls");
    if (it == m.end()) return;
    if (it->is_null() || (it->is_array() && it->empty())) {
        m.erase(it);
        return;
    }
    if (!it->is_array()) return;
    for (Json& call : *it) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
        Json& fn = call["function"];
        if (!fn.contains("arguments") || !fn["arguments"].is_string()) continue;
        Json parsed = Json::parse(fn["arguments"].get<std::string>(), nullptr, false);
        if (!parsed.is_discarded() && parsed.is_object()) fn["arguments"] = std::move(parsed);
    }
}

/// A chat message's content as one string (text parts joined by newlines).
std::string content_text(const Json& content, size_t i) {
    const std::string param = fmt::format("messages[{}].content", i);
    if (content.is_string()) return content.get<std::string>();
    if (!content.is_array())
        bad(param, fmt::format("'{}' must be a string or a list of content parts, got {}", param, show(content)));
    std::string text;
    for (size_t k = 0; k < content.size(); ++k) {
        const Json& part = content[k];
        if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
            bad(param, fmt::format("'{}[{}]' must be an object with a 'type', got {}", param, k, show(part)));
        const std::string type = part["type"].get<std::string>();
        if (type != "text")
            bad(param, fmt::format("'{}[{}]' has type '{}'; this server takes text parts only", param, k, type));
        if (!part.contains("text") || !part["text"].is_string())
            bad(param, fmt::format("'{}[{}].text' must be a string", param, k));
        if (k) text += '\n';
        text += part["text"].get<std::string>();
    }
    return text;
}

std::vector<int32_t> token_list(const Json& arr, const std::string& param, int32_t n_vocab) {
    std::vector<int32_t> ids;
    ids.reserve(arr.size());
    for (const Json& t : arr) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab)
            bad(param, fmt::format("'{}' token ids must be integers from 0 to {}, got {}", param, n_vocab - 1, show(t)));
        ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    if (ids.empty()) bad(param, fmt::format("'{}' is empty", param));
    return ids;
}

}  // namespace

ApiError::ApiError(int status_, std::string message, std::string param_, std::string code_, std::string type_)
    : std::runtime_error(std::move(message)), status(status_), param(std::move(param_)), code(std::move(code_)),
      type(std::move(type_)) {}

Json error_json(int status, std::string_view message, std::string_view param, std::string_view code,
                std::string_view type) {
    Json e = Json::object();
    e["message"] = message;
    e["type"] = type.empty() ? default_type(status) : std::string(type);
    e["param"] = param.empty() ? Json(nullptr) : Json(param);
    e["code"] = code.empty() ? Json(nullptr) : Json(code);
    return Json{{"error", std::move(e)}};
}

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

Json parse_body(std::string_view body) {
    // Bound the nesting before parsing (deep nesting is the one thing a
    // recursive consumer of the value could not survive).
    int depth = 0;
    bool in_string = false, escaped = false;
    for (char c : body) {
        if (in_string) {
            if (escaped) escaped = false;
            else if (c == '\\') escaped = true;
            else if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > kMaxDepth)
                throw ApiError(400, fmt::format("the request body nests deeper than {} levels", kMaxDepth));
        } else if (c == ']' || c == '}') {
            --depth;
        }
    }
    Json j;
    try {
        j = Json::parse(body);
    } catch (const Json::exception& e) {
        std::string what = e.what();
        // "[json.exception.parse_error.101] parse error at line 1, column 2: ..." -> from "parse error"
        const size_t at = what.find("] ");
        if (at != std::string::npos) what = what.substr(at + 2);
        throw ApiError(400, "the request body is not valid JSON: " + what + " (send a JSON object with Content-Type: application/json)");
    }
    if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object, got " + show(j));
    return j;
}

SamplingParams api_default_sampling() {
    // OpenAI's defaults, not quern run's: no top-k / min-p, full nucleus.
    SamplingParams sp;
    sp.temperature = 1.0f;
    sp.top_p = 1.0f;
    sp.top_k = 0;
    sp.min_p = 0.0f;
    sp.presence_penalty = 0.0f;
    sp.frequency_penalty = 0.0f;
    sp.repeat_penalty = 1.0f;
    return sp;
}

static ApiRequest parse_chat_request_unguarded(const Json& body, int32_t n_vocab, const SamplingParams& defaults) {
    ApiRequest r;
    r.endpoint = Endpoint::Chat;
    const Json* msgs = field(body, "messages");
    if (!msgs) bad("messages", "'messages' is required: a list of {\"role\", \"content\"} objects");
    if (!msgs->is_array()) bad("messages", fmt::format("'messages' must be a list of messages, got {}", show(*msgs)));
    if (msgs->empty()) bad("messages", "'messages' is empty; send at least one message");
    r.messages = Json::array();
    for (size_t i = 0; i < msgs->size(); ++i) {
        const Json& m = (*msgs)[i];
        const std::string p = fmt::format("messages[{}]", i);
        if (!m.is_object()) bad(p, fmt::format("'{}' must be an object with 'role' and 'content', got {}", p, show(m)));
        if (!m.contains("role") || !m["role"].is_string())
            bad(p + ".role", fmt::format("'{}.role' must be one of system, developer, user, assistant, tool", p));
        std::string role = m["role"].get<std::string>();
        if (role != "system" && role != "developer" && role != "user" && role != "assistant" && role != "tool")
            bad(p + ".role", fmt::format("'{}.role' is '{}'; it must be one of system, developer, user, assistant, tool", p, role));
        if (role == "developer") role = "system";
        Json out = Json::object();
        out["role"] = role;
        const auto c = m.find("content");
        if (c == m.end() || c->is_null()) {
            if (role != "assistant") bad(p + ".content", fmt::format("'{}.content' is required", p));
            out["content"] = nullptr;
        } else {
            out["content"] = content_text(*c, i);
        }
        for (const auto& [k, v] : m.items())
            if (k != "role" && k != "content") out[k] = v;
        normalize_tool_calls(out);
        r.messages.push_back(std::move(out));
    }
    if (const Json* t = field(body, "tools")) {
        if (!t->is_array()) bad("tools", fmt::format("'tools' must be a list, got {}", show(*t)));
        if (!t->empty()) r.tools = *t;
    }
    if (const Json* tc = field(body, "tool_choice")) {
        // auto, none, required (a call, any tool), or a named function: the
        // last two enforced by constrained decoding (server: forced_tool_call_gbnf).
        if (tc->is_string() && (*tc == "none" || *tc == "auto" || *tc == "required")) {
            r.tool_choice = tc->get<std::string>();
        } else if (tc->is_object() && tc->value("type", "") == "function" && tc->contains("function") &&
                   (*tc)["function"].is_object() && (*tc)["function"].contains("name") &&
                   (*tc)["function"]["name"].is_string()) {
            r.tool_choice = "function:" + (*tc)["function"]["name"].get<std::string>();
        } else {
            bad("tool_choice", "'tool_choice' may be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                               "\"function\": {\"name\": ...}}");
        }
        if (r.tool_choice != "none" && r.tool_choice != "auto" && r.tools.empty())
            bad("tool_choice", "'tool_choice' asks for a tool call but the request gives no 'tools'");
    }
    r.parallel_tool_calls = get_bool(body, "parallel_tool_calls", true);
    if (const Json* rf = field(body, "reasoning_format")) {
        if (!(rf->is_string() && (*rf == "auto" || *rf == "none")))
            bad("reasoning_format", "'reasoning_format' may be \"auto\" (reasoning in reasoning_content) or \"none\" "
                                    "(left in the content)");
        r.parse_reasoning = *rf == "auto";
    }
    if (const Json* k = field(body, "chat_template_kwargs")) {
        if (!k->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
        r.template_kwargs = *k;
    }
    parse_common(body, r, n_vocab, defaults);
    // max_completion_tokens supersedes the older max_tokens
    const int64_t kMax = int64_t{1} << 53;
    r.max_tokens = get_int(body, "max_tokens", 1, kMax, -1);
    r.max_tokens = get_int(body, "max_completion_tokens", 1, kMax, r.max_tokens);
    const bool logprobs = get_bool(body, "logprobs", false);
    const int64_t top = get_int(body, "top_logprobs", 0, kMaxTopLogprobs, -1);
    if (top >= 0 && !logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r.top_logprobs = logprobs ? static_cast<int>(std::max<int64_t>(top, 0)) : -1;
    return r;
}

ApiRequest parse_chat_request(const Json& body, int32_t n_vocab, const SamplingParams& defaults) {
    return parse_or_400(body, [&] { return parse_chat_request_unguarded(body, n_vocab, defaults); });
}

static ApiRequest parse_completion_request_unguarded(const Json& body, int32_t n_vocab, const SamplingParams& defaults) {
    ApiRequest r;
    r.endpoint = Endpoint::Completions;
    const Json* p = field(body, "prompt");
    if (!p) bad("prompt", "'prompt' is required: a string, a list of strings, a list of token ids or a list of such lists");
    if (p->is_string()) {
        r.prompt_texts.push_back(p->get<std::string>());
    } else if (p->is_array() && !p->empty()) {
        const Json& first = p->front();
        if (first.is_string()) {
            for (const Json& s : *p) {
                if (!s.is_string()) bad("prompt", "'prompt' mixes strings with other values; send strings only");
                r.prompt_texts.push_back(s.get<std::string>());
            }
        } else if (first.is_number()) {
            r.prompt_tokens.push_back(token_list(*p, "prompt", n_vocab));
        } else if (first.is_array()) {
            for (size_t i = 0; i < p->size(); ++i) {
                if (!(*p)[i].is_array()) bad("prompt", "'prompt' mixes token-id lists with other values");
                r.prompt_tokens.push_back(token_list((*p)[i], fmt::format("prompt[{}]", i), n_vocab));
            }
        } else {
            bad("prompt", fmt::format("'prompt' must be a string, a list of strings or token ids, got {}", show(*p)));
        }
    } else {
        bad("prompt", fmt::format("'prompt' must be a non-empty string list or token-id list, got {}", show(*p)));
    }
    parse_common(body, r, n_vocab, defaults);
    // OpenAI's completions default: 16 tokens
    r.max_tokens = get_int(body, "max_tokens", 1, int64_t{1} << 53, 16);
    if (const Json* lp = field(body, "logprobs")) {
        if (lp->is_boolean()) bad("logprobs", "'logprobs' of /v1/completions is an integer (alternatives per token, 0 to 20)");
        r.top_logprobs = static_cast<int>(get_int(body, "logprobs", 0, kMaxTopLogprobs, -1));
    }
    if (get_bool(body, "echo", false)) bad("echo", "'echo' is not supported by this server");
    if (!get_string(body, "suffix").empty()) bad("suffix", "'suffix' is not supported by this server");
    if (field(body, "best_of") && get_int(body, "best_of", 1, kMaxChoices, 1) > r.n)
        bad("best_of", "'best_of' greater than 'n' is not supported by this server");
    return r;
}

ApiRequest parse_completion_request(const Json& body, int32_t n_vocab, const SamplingParams& defaults) {
    return parse_or_400(body, [&] { return parse_completion_request_unguarded(body, n_vocab, defaults); });
}

Json usage_json(const Usage& u) {
    return Json{{"prompt_tokens", u.prompt_tokens},
                {"completion_tokens", u.completion_tokens},
                {"total_tokens", u.prompt_tokens + u.completion_tokens},
                {"prompt_tokens_details", Json{{"cached_tokens", u.cached_tokens}}}};
}

namespace {
/// JSON has no -inf; OpenAI reports impossible tokens as -9999.
double finite_logprob(float lp) { return std::isfinite(lp) ? lp : -9999.0; }

Json bytes_json(const std::string& s) {
    Json b = Json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
}
}  // namespace

Json chat_logprobs_json(const std::vector<TokenLogprob>& lps) {
    Json content = Json::array();
    for (const TokenLogprob& t : lps) {
        Json top = Json::array();
        for (const auto& [piece, lp] : t.top)
            top.push_back(Json{{"token", piece}, {"logprob", finite_logprob(lp)}, {"bytes", bytes_json(piece)}});
        content.push_back(Json{{"token", t.piece},
                               {"logprob", finite_logprob(t.logprob)},
                               {"bytes", bytes_json(t.piece)},
                               {"top_logprobs", std::move(top)}});
    }
    return Json{{"content", std::move(content)}};
}

Json completion_logprobs_json(const std::vector<TokenLogprob>& lps) {
    Json tokens = Json::array(), token_lps = Json::array(), tops = Json::array(), offsets = Json::array();
    for (const TokenLogprob& t : lps) {
        tokens.push_back(t.piece);
        token_lps.push_back(finite_logprob(t.logprob));
        Json top = Json::object();
        for (const auto& [piece, lp] : t.top) top[piece] = finite_logprob(lp);
        tops.push_back(std::move(top));
        offsets.push_back(t.text_offset);
    }
    return Json{{"tokens", std::move(tokens)},
                {"token_logprobs", std::move(token_lps)},
                {"top_logprobs", std::move(tops)},
                {"text_offset", std::move(offsets)}};
}

Json response_json(const ResponseMeta& m, const std::vector<ChoiceResult>& choices, const Usage& usage) {
    const bool chat = m.endpoint == Endpoint::Chat;
    Json out = Json::object();
    out["id"] = m.id;
    out["object"] = chat ? "chat.completion" : "text_completion";
    out["created"] = m.created;
    out["model"] = m.model;
    Json arr = Json::array();
    for (const ChoiceResult& c : choices) {
        Json ch = Json::object();
        ch["index"] = c.index;
        if (chat) {
            Json msg = Json{{"role", "assistant"}};
            msg["content"] = c.text.empty() && !c.tool_calls.empty() ? Json(nullptr) : Json(c.text);
            if (!c.reasoning.empty()) msg["reasoning_content"] = c.reasoning;
            if (!c.tool_calls.empty()) {
                Json calls = Json::array();
                for (const ToolCall& t : c.tool_calls)
                    calls.push_back(Json{{"id", t.id},
                                         {"type", "function"},
                                         {"function", Json{{"name", t.name}, {"arguments", t.arguments}}}});
                msg["tool_calls"] = std::move(calls);
            }
            ch["message"] = std::move(msg);
        } else {
            ch["text"] = c.text;
        }
        if (!c.want_logprobs) ch["logprobs"] = nullptr;
        else ch["logprobs"] = chat ? chat_logprobs_json(c.logprobs) : completion_logprobs_json(c.logprobs);
        ch["finish_reason"] = c.finish_reason;
        arr.push_back(std::move(ch));
    }
    out["choices"] = std::move(arr);
    out["usage"] = usage_json(usage);
    return out;
}

Json chunk_json(const ResponseMeta& m, int index, const std::string* role, const std::string& text,
                const std::vector<TokenLogprob>* logprobs, const std::string& finish_reason, bool usage_null) {
    const bool chat = m.endpoint == Endpoint::Chat;
    Json out = Json::object();
    out["id"] = m.id;
    out["object"] = chat ? "chat.completion.chunk" : "text_completion";
    out["created"] = m.created;
    out["model"] = m.model;
    Json ch = Json::object();
    ch["index"] = index;
    if (chat) {
        Json delta = Json::object();
        if (role) delta["role"] = *role;
        if (role || !text.empty() || (logprobs && !logprobs->empty())) delta["content"] = text;
        ch["delta"] = std::move(delta);
    } else {
        ch["text"] = text;
    }
    if (!logprobs) ch["logprobs"] = nullptr;
    else ch["logprobs"] = chat ? chat_logprobs_json(*logprobs) : completion_logprobs_json(*logprobs);
    ch["finish_reason"] = finish_reason.empty() ? Json(nullptr) : Json(finish_reason);
    out["choices"] = Json::array({std::move(ch)});
    if (usage_null) out["usage"] = nullptr;
    return out;
}

Json chat_delta_chunk_json(const ResponseMeta& m, int index, const ChatDelta& d, const std::vector<TokenLogprob>* logprobs,
                           bool usage_null) {
    Json out = chunk_json(m, index, nullptr, d.content, logprobs, "", usage_null);
    Json& delta = out["choices"][0]["delta"];
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (d.content.empty()) delta.erase("content");
    if (!d.calls.empty()) {
        // OpenAI's shape: a call's first chunk carries its id, type and name
        // (arguments ""), later ones only more arguments, by index.
        Json calls = Json::array();
        for (const ToolCallPiece& p : d.calls) {
            if (!p.first && p.arguments.empty()) continue;  // an end carries nothing
            Json c = Json{{"index", p.index}};
            if (p.first) {
                c["id"] = p.id;
                c["type"] = "function";
                c["function"] = Json{{"name", p.name}, {"arguments", p.arguments}};
            } else {
                c["function"] = Json{{"arguments", p.arguments}};
            }
            calls.push_back(std::move(c));
        }
        if (!calls.empty()) delta["tool_calls"] = std::move(calls);
    }
    return out;
}

Json usage_chunk_json(const ResponseMeta& m, const Usage& usage) {
    Json out = Json::object();
    out["id"] = m.id;
    out["object"] = m.endpoint == Endpoint::Chat ? "chat.completion.chunk" : "text_completion";
    out["created"] = m.created;
    out["model"] = m.model;
    out["choices"] = Json::array();
    out["usage"] = usage_json(usage);
    return out;
}

std::string sse_event(const Json& j) { return "data: " + dump(j) + "\n\n"; }

}  // namespace quern::server
