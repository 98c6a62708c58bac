#include "server/chat_output.h"

#include <algorithm>

#include "core/error.h"
#include "server/harmony.h"

namespace quern::server {

namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>", kToolClose = "</tool_call>";
// DeepSeek V3 / R1 / V3.1: each call between these, the list between the
// wrappers (dropped from the content); the name and arguments either side of
// the separator.
constexpr std::string_view kDsCallOpen = "<｜tool▁call▁begin｜>", kDsCallClose = "<｜tool▁call▁end｜>",
                           kDsSep = "<｜tool▁sep｜>", kDsListOpen = "<｜tool▁calls▁begin｜>",
                           kDsListClose = "<｜tool▁calls▁end｜>";
// DeepSeek V4 (DSML): <｜DSML｜invoke name="NAME"> parameters </｜DSML｜invoke>.
constexpr std::string_view kDsmlOpen = "<｜DSML｜invoke", kDsmlClose = "</｜DSML｜invoke>",
                           kDsmlListOpen = "<｜DSML｜tool_calls>", kDsmlListClose = "</｜DSML｜tool_calls>",
                           kDsmlParam = "<｜DSML｜parameter", kDsmlParamEnd = "</｜DSML｜parameter>";

/// What opens and closes one call in format f, and the wrappers around a
/// list of calls (dropped).
struct CallMarkers {
    std::string_view open, close;
    std::vector<std::string_view> wrappers;
};
CallMarkers markers_of(ToolFormat f) {
    if (f == ToolFormat::DeepSeek) return {kDsCallOpen, kDsCallClose, {kDsListOpen, kDsListClose}};
    if (f == ToolFormat::Dsml) return {kDsmlOpen, kDsmlClose, {kDsmlListOpen, kDsmlListClose}};
    return {kToolOpen, kToolClose, {}};
}

/// The value of attribute `key` in a tag's text (key="value"), or npos.
std::string_view attribute(std::string_view tag, std::string_view key) {
    const std::string pat = std::string(key) + "=\"";
    const size_t a = tag.find(pat);
    if (a == std::string_view::npos) return {};
    const size_t b = tag.find('"', a + pat.size());
    if (b == std::string_view::npos) return {};
    return tag.substr(a + pat.size(), b - a - pat.size());
}

std::string_view trim(std::string_view s) {
    const auto ws = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
    while (!s.empty() && ws(s.front())) s.remove_prefix(1);
    while (!s.empty() && ws(s.back())) s.remove_suffix(1);
    return s;
}

/// The JSON type the request's tool `fn` gives parameter `param` ("" when
/// it says nothing).
std::string param_type(const Json& tools, const std::string& fn, const std::string& param) {
    if (!tools.is_array()) return "";
    for (const Json& t : tools) {
        const Json* f = t.contains("function") ? &t["function"] : &t;
        if (!f->is_object() || f->value("name", "") != fn) continue;
        const Json* props = f->contains("parameters") && (*f)["parameters"].is_object() &&
                                    (*f)["parameters"].contains("properties")
                                ? &(*f)["parameters"]["properties"]
                                : nullptr;
        if (!props || !props->is_object() || !props->contains(param)) return "";
        const Json& p = (*props)[param];
        if (p.is_object() && p.contains("type") && p["type"].is_string()) return p["type"].get<std::string>();
        return "";
    }
    return "";
}

/// An XML parameter's value as JSON: typed by the tool's schema (strings
/// stay strings; other types, or none, read as JSON when they parse).
Json xml_value(const Json& tools, const std::string& fn, const std::string& param, std::string_view value) {
    if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    Json v(Json::value_t::discarded);
    if (param_type(tools, fn, param) != "string") v = Json::parse(value, nullptr, false);
    return v.is_discarded() ? Json(std::string(value)) : v;
}

/// The whole parameter elements at the start of `rest` (each `open` ...
/// `>` VALUE `close`, up to the first that is not whole) as the start of a
/// compact JSON object ("{" and its members, no closing brace: more may come);
/// `member` reads a tag's text (up to its '>') and value into (name, value).
template <class Member>
std::string parameters(std::string_view rest, std::string_view open, std::string_view close, Member member) {
    std::string args = "{";
    for (bool first = true;; first = false) {
        rest = trim(rest);
        if (!rest.starts_with(open)) break;
        const size_t pg = rest.find('>'), pe = rest.find(close);
        if (pg == std::string_view::npos || pe == std::string_view::npos || pe < pg) break;
        const auto [name, value] = member(rest.substr(0, pg), rest.substr(pg + 1, pe - pg - 1));
        args += (first ? "" : ",") + Json(name).dump() + ":" + value.dump();
        rest = rest.substr(pe + close.size());
    }
    return args;
}

/// The end of the JSON value starting at s[i] (one past it), or npos while
/// it is unfinished. Strings and nesting are followed; a number or literal
/// ends at a delimiter.
size_t json_value_end(std::string_view s, size_t i) {
    if (i >= s.size()) return std::string_view::npos;
    int depth = 0;
    bool in_str = false, esc = false;
    const bool scalar = s[i] != '"' && s[i] != '{' && s[i] != '[';
    for (size_t k = i; k < s.size(); ++k) {
        const char c = s[k];
        if (scalar) {
            if (c == ',' || c == '}' || c == ']' || c == ' ' || c == '\n' || c == '\r' || c == '\t') return k;
            continue;
        }
        if (in_str) {
            if (esc) esc = false;
            else if (c == '\\') esc = true;
            else if (c == '"') {
                in_str = false;
                if (depth == 0) return k + 1;  // a string value
            }
        } else if (c == '"') {
            in_str = true;
        } else if (c == '{' || c == '[') {
            ++depth;
        } else if ((c == '}' || c == ']') && --depth == 0) {
            return k + 1;
        }
    }
    return std::string_view::npos;
}

/// A JSON call body {"name": …, "arguments" (or "parameters"): {…}} so far:
/// its name once whole, its arguments' text from their '{' (to their end,
/// or all there is). False before both have begun, or when the arguments
/// are not an object (a JSON string: read whole at the end).
bool json_call_progress(std::string_view b, std::string& name, std::string& args) {
    const auto skip = [&](size_t& i) {
        while (i < b.size() && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t')) ++i;
    };
    size_t i = 0;
    skip(i);
    if (i >= b.size() || b[i] != '{') return false;
    ++i;
    bool have_name = false, have_args = false;
    for (;;) {
        skip(i);
        if (i < b.size() && b[i] == ',') {
            ++i;
            skip(i);
        }
        if (i >= b.size() || b[i] != '"') break;
        const size_t key_end = json_value_end(b, i);
        if (key_end == std::string_view::npos) break;
        const Json key = Json::parse(b.substr(i, key_end - i), nullptr, false);
        i = key_end;
        skip(i);
        if (i >= b.size() || b[i] != ':') break;
        ++i;
        skip(i);
        if (i >= b.size()) break;
        const size_t v = i, end = json_value_end(b, i);
        const std::string k = key.is_string() ? key.get<std::string>() : "";
        if (k == "name" && !have_name) {
            if (b[v] != '"' || end == std::string_view::npos) return false;
            const Json n = Json::parse(b.substr(v, end - v), nullptr, false);
            if (!n.is_string()) return false;
            name = n.get<std::string>();
            have_name = true;
        } else if ((k == "arguments" || k == "parameters") && !have_args) {
            if (b[v] != '{') return false;
            args = std::string(b.substr(v, end == std::string_view::npos ? std::string_view::npos : end - v));
            have_args = true;
        }
        if (end == std::string_view::npos) break;
        i = end;
    }
    return have_name && have_args;
}

}  // namespace

size_t partial_marker(std::string_view s, const std::vector<std::string_view>& markers) {
    size_t best = 0;
    for (std::string_view m : markers)
        for (size_t k = std::min(m.size() - 1, s.size()); k > best; --k)
            if (s.substr(s.size() - k) == m.substr(0, k)) {
                best = k;
                break;
            }
    return best;
}

ToolCallPiece& open_piece(ChatDelta& d, int index) {
    if (d.calls.empty() || d.calls.back().index != index || d.calls.back().last) {
        ToolCallPiece p;
        p.index = index;
        d.calls.push_back(std::move(p));
    }
    return d.calls.back();
}

void ChatDelta::append(ChatDelta&& o) {
    reasoning += o.reasoning;
    content += o.content;
    for (ToolCallPiece& c : o.calls) calls.push_back(std::move(c));
}

void merge_call_piece(std::vector<ToolCall>& calls, const ToolCallPiece& p) {
    if (p.first || calls.empty()) calls.push_back(ToolCall{p.id, p.name, ""});
    calls.back().arguments += p.arguments;
}

OutputFormat detect_output_format(const std::string& src) {
    OutputFormat f;
    if (src.find("<|channel|>") != std::string::npos && src.find("<|message|>") != std::string::npos) {
        f.harmony = f.think = true;  // gpt-oss: the analysis channel is its reasoning
        f.tools = ToolFormat::Harmony;
        return f;
    }
    f.think = src.find(kThinkOpen) != std::string::npos;
    if (src.find("｜DSML｜") != std::string::npos)
        f.tools = ToolFormat::Dsml;
    else if (src.find(kDsCallOpen) != std::string::npos)
        f.tools = ToolFormat::DeepSeek;
    else if (src.find("<function=") != std::string::npos && src.find("<parameter=") != std::string::npos)
        f.tools = ToolFormat::Xml;
    else if (src.find(kToolOpen) != std::string::npos)
        f.tools = ToolFormat::Hermes;
    else if (src.find("[TOOL_CALLS]") != std::string::npos)
        f.tools = ToolFormat::Mistral;
    else if (src.find("\"parameters\": dictionary of argument name") != std::string::npos)
        f.tools = ToolFormat::Llama3;
    return f;
}

bool prompt_opens_think(const std::string& prompt) {
    const std::string_view p = trim(prompt);
    return p.size() >= kThinkOpen.size() && p.substr(p.size() - kThinkOpen.size()) == kThinkOpen;
}

ChatOutputParser::~ChatOutputParser() = default;

ChatOutputParser::ChatOutputParser(OutputFormat f, bool in_reasoning, Json tools, std::function<std::string()> new_id)
    : f_(f), tools_(std::move(tools)), new_id_(std::move(new_id)) {
    if (f_.harmony) harmony_ = std::make_unique<HarmonyParser>(f_.tools != ToolFormat::None, new_id_);
    mode_ = f_.think && in_reasoning ? Mode::Reasoning : Mode::Content;
    trim_next_ = mode_ == Mode::Reasoning;
    opened_ = mode_ == Mode::Reasoning;
}

void ChatOutputParser::emit(ChatDelta& d, Mode m, std::string_view text) {
    if (trim_next_) {
        while (!text.empty() && (text.front() == '\n' || text.front() == '\r')) text.remove_prefix(1);
        if (text.empty()) return;
        trim_next_ = false;
    }
    (m == Mode::Reasoning ? d.reasoning : d.content).append(text);
}

ChatDelta ChatOutputParser::push(std::string_view text) {
    if (harmony_) return harmony_->push(text);
    ChatDelta d;
    std::string buf = held_;
    buf.append(text);
    held_.clear();
    if (opened_) {
        // Some models open the block again although the prompt did.
        const size_t lead = buf.find_first_not_of("\r\n ");
        if (lead == std::string::npos) {
            held_ = buf;
            return d;
        }
        const std::string_view rest = std::string_view(buf).substr(lead);
        if (rest.size() < kThinkOpen.size() && kThinkOpen.substr(0, rest.size()) == rest) {
            held_ = buf;
            return d;
        }
        if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) buf.erase(0, lead + kThinkOpen.size());
        opened_ = false;
    }
    while (!buf.empty()) {
        if (mode_ == Mode::BareJson) {
            bare_ += buf;
            break;
        }
        // The answer's first character decides whether it may be bare JSON
        // tool calls (the request has tools and the model writes Hermes JSON).
        if (mode_ == Mode::Content && !answer_started_ &&
            (f_.tools == ToolFormat::Hermes || f_.tools == ToolFormat::Llama3 || f_.tools == ToolFormat::Mistral) &&
            tools_.is_array() && !tools_.empty()) {
            const size_t lead = buf.find_first_not_of(" \t\r\n");
            if (lead == std::string::npos) break;  // only whitespace so far: wait
            // Markers a Llama 3 / Mistral call may start with (the text may
            // also lack them: control tokens are not rendered).
            const std::string_view rest = std::string_view(buf).substr(lead);
            bool partial = false;
            for (std::string_view m : {std::string_view("<|python_tag|>"), std::string_view("[TOOL_CALLS]")})
                partial = partial || (rest.size() < m.size() && m.substr(0, rest.size()) == rest);
            if (partial) {
                held_ = buf;
                return d;
            }
            answer_started_ = true;
            const bool marker = rest.starts_with("<|python_tag|>") || rest.starts_with("[TOOL_CALLS]");
            if (marker || buf[lead] == '{' || (buf[lead] == '[' && f_.tools == ToolFormat::Mistral)) {
                mode_ = Mode::BareJson;
                bare_ = buf;
                break;
            }
        }
        const CallMarkers cm = markers_of(f_.tools);
        if (mode_ == Mode::Tool) {
            const size_t from = tool_.size() >= cm.close.size() ? tool_.size() - (cm.close.size() - 1) : 0;
            tool_ += buf;
            buf.clear();
            const size_t e = tool_.find(cm.close, from);
            if (e == std::string::npos) {
                // Not closed yet: what can stream goes out (a closing tag's
                // start held back).
                const size_t hold = partial_marker(tool_, {cm.close});
                stream_call(d, std::string_view(tool_).substr(0, tool_.size() - hold), false);
                break;
            }
            buf = tool_.substr(e + cm.close.size());
            const std::string body = tool_.substr(0, e);
            tool_.clear();
            std::string name, args;
            bool built = false;
            ToolCall call;
            if (streaming_ || call_progress(body, name, args, built)) stream_call(d, body, true);
            else if (parse_call(body, call)) add_call(d, std::move(call));
            else emit(d, Mode::Content, std::string(cm.open) + body + std::string(cm.close));
            mode_ = Mode::Content;
            trim_next_ = true;
            continue;
        }
        std::vector<std::string_view> markers;
        if (mode_ == Mode::Reasoning) {
            markers.push_back(kThinkClose);
        } else {
            if (f_.think) markers.push_back(kThinkOpen);
            if (f_.tools != ToolFormat::None) {
                markers.push_back(cm.open);
                markers.insert(markers.end(), cm.wrappers.begin(), cm.wrappers.end());
            }
        }
        size_t at = std::string::npos;
        std::string_view which;
        for (std::string_view m : markers) {
            const size_t p = buf.find(m);
            if (p < at) {
                at = p;
                which = m;
            }
        }
        if (at == std::string::npos) {
            const size_t hold = partial_marker(buf, markers);
            emit(d, mode_, std::string_view(buf).substr(0, buf.size() - hold));
            held_ = buf.substr(buf.size() - hold);
            break;
        }
        emit(d, mode_, std::string_view(buf).substr(0, at));
        buf.erase(0, at + which.size());
        if (std::find(cm.wrappers.begin(), cm.wrappers.end(), which) != cm.wrappers.end()) {
            trim_next_ = true;  // a list's wrapper: dropped
            continue;
        }
        if (which == kThinkOpen) mode_ = Mode::Reasoning;
        else if (which == kThinkClose) mode_ = Mode::Content;
        else mode_ = Mode::Tool;
        trim_next_ = mode_ != Mode::Tool;
    }
    return d;
}

ChatDelta ChatOutputParser::finish() {
    if (harmony_) return harmony_->finish();
    ChatDelta d;
    if (mode_ == Mode::BareJson) {
        std::vector<ToolCall> calls;
        if (parse_bare_json(bare_, calls)) {
            for (ToolCall& c : calls) add_call(d, std::move(c));
        } else {
            emit(d, Mode::Content, bare_);
        }
        bare_.clear();
        mode_ = Mode::Content;
        return d;
    }
    if (mode_ == Mode::Tool) {
        // Cut short: a call that has gone out ends with what it has; one
        // that has not stays text.
        if (streaming_) stream_call(d, tool_ + held_, true);
        else emit(d, Mode::Content, std::string(markers_of(f_.tools).open) + tool_ + held_);
        tool_.clear();
        mode_ = Mode::Content;
    } else {
        emit(d, mode_, held_);
    }
    held_.clear();
    return d;
}

bool ChatOutputParser::parse_bare_json(const std::string& text, std::vector<ToolCall>& calls) const {
    std::string_view rest = trim(text);
    for (std::string_view m : {std::string_view("<|python_tag|>"), std::string_view("[TOOL_CALLS]")})
        if (rest.starts_with(m)) rest = trim(rest.substr(m.size()));
    if (!rest.empty() && rest.front() == '[') {  // Mistral: a JSON list of calls
        const Json list = Json::parse(rest, nullptr, false);
        if (list.is_discarded() || !list.is_array() || list.empty()) return false;
        std::string joined;
        for (const Json& c : list) joined += c.dump() + "\n";
        rest = trim(joined);
        std::vector<ToolCall> out;
        const bool ok = parse_bare_json_objects(rest, out);
        if (ok) calls = std::move(out);
        return ok;
    }
    return parse_bare_json_objects(rest, calls);
}

bool ChatOutputParser::parse_bare_json_objects(std::string_view rest, std::vector<ToolCall>& calls) const {
    while (!rest.empty()) {
        // One JSON object: up to the brace that closes the first (strings skipped).
        size_t end = 0;
        int depth = 0;
        bool in_str = false, esc = false;
        for (size_t i = 0; i < rest.size() && end == 0; ++i) {
            const char c = rest[i];
            if (in_str) {
                if (esc) esc = false;
                else if (c == '\\') esc = true;
                else if (c == '"') in_str = false;
            } else if (c == '"') {
                in_str = true;
            } else if (c == '{') {
                ++depth;
            } else if (c == '}' && --depth == 0) {
                end = i + 1;
            }
        }
        if (end == 0) return false;
        ToolCall call;
        if (!parse_call(std::string(rest.substr(0, end)), call)) return false;
        bool known = false;  // only the request's tools: a JSON answer is not a call
        for (const Json& t : tools_) {
            const Json* f = t.contains("function") ? &t["function"] : &t;
            known = known || (f->is_object() && f->value("name", "") == call.name);
        }
        if (!known) return false;
        calls.push_back(std::move(call));
        rest = trim(rest.substr(end));
        if (!rest.empty() && (rest.front() == ',' || rest.front() == ';')) rest = trim(rest.substr(1));
    }
    return !calls.empty();
}

bool ChatOutputParser::parse_call(const std::string& raw, ToolCall& call) const {
    const std::string_view body = trim(raw);
    Json args = Json::object();
    const Json j = Json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
    call.name = j["name"].get<std::string>();
    const char* key = j.contains("arguments") ? "arguments" : "parameters";
    if (j.contains(key)) {
        const Json& a = j[key];
        if (a.is_string()) {  // arguments written as a JSON string
            const Json inner = Json::parse(a.get<std::string>(), nullptr, false);
            if (inner.is_discarded() || !inner.is_object()) return false;
            args = inner;
        } else if (a.is_object()) {
            args = a;
        } else if (!a.is_null()) {
            return false;
        }
    }
    if (call.name.empty()) return false;
    call.arguments = args.dump();
    call.id = new_id_ ? new_id_() : "call_" + std::to_string(n_calls_);
    return true;
}

bool ChatOutputParser::call_progress(std::string_view raw, std::string& name, std::string& args, bool& built) const {
    const std::string_view body = trim(raw);
    built = false;
    if (f_.tools == ToolFormat::DeepSeek) {
        // V3 / R1: function<sep>NAME\n```json\nARGS\n```; V3.1: NAME<sep>ARGS.
        const size_t sep = body.find(kDsSep);
        if (sep == std::string_view::npos) return false;
        std::string_view left = trim(body.substr(0, sep)), right = body.substr(sep + kDsSep.size());
        if (left == "function") {
            const size_t nl = right.find('\n');
            if (nl == std::string_view::npos) return false;
            left = trim(right.substr(0, nl));
            right = trim(right.substr(nl + 1));
            if (right.starts_with("```")) {
                const size_t fence = right.find('\n');
                if (fence == std::string_view::npos) return false;
                right = right.substr(fence + 1);
            }
        }
        right = trim(right);
        if (left.empty() || right.empty() || right.front() != '{') return false;
        name = std::string(left);
        const size_t end = json_value_end(right, 0);
        args = std::string(right.substr(0, end));
        return true;
    }
    if (f_.tools == ToolFormat::Dsml) {
        // name="NAME"> then whole <｜DSML｜parameter name="P" string="true|false">VALUE</｜DSML｜parameter>.
        const size_t gt = body.find('>');
        if (gt == std::string_view::npos) return false;
        name = std::string(attribute(body.substr(0, gt), "name"));
        if (name.empty()) return false;
        built = true;
        args = parameters(body.substr(gt + 1), kDsmlParam, kDsmlParamEnd, [](std::string_view tag, std::string_view value) {
            Json v(Json::value_t::discarded);
            if (attribute(tag, "string") != "true") v = Json::parse(value, nullptr, false);
            return std::pair{std::string(attribute(tag, "name")), v.is_discarded() ? Json(std::string(value)) : v};
        });
        return true;
    }
    if (f_.tools == ToolFormat::Hermes || (!body.empty() && body.front() == '{')) return json_call_progress(raw, name, args);
    // <function=NAME> then whole <parameter=P>VALUE</parameter> elements.
    constexpr std::string_view kFn = "<function=", kP = "<parameter=", kPEnd = "</parameter>";
    if (body.substr(0, kFn.size()) != kFn) return false;
    const size_t gt = body.find('>');
    if (gt == std::string_view::npos) return false;
    name = std::string(trim(body.substr(kFn.size(), gt - kFn.size())));
    if (name.empty()) return false;
    built = true;
    args = parameters(body.substr(gt + 1), kP, kPEnd, [&](std::string_view tag, std::string_view value) {
        std::string param(trim(tag.substr(kP.size())));
        Json v = xml_value(tools_, name, param, value);
        return std::pair{std::move(param), std::move(v)};
    });
    return true;
}

void ChatOutputParser::stream_call(ChatDelta& d, std::string_view body, bool end) {
    std::string name, args;
    bool built = false;
    const bool ok = call_progress(body, name, args, built);
    if (!streaming_) {
        if (!ok) return;
        streaming_ = true;
        sent_.clear();
        ToolCallPiece p;
        p.index = n_calls_;
        p.id = new_id_ ? new_id_() : "call_" + std::to_string(n_calls_);
        p.name = name;
        p.first = true;
        d.calls.push_back(std::move(p));
    }
    if (end && built) args += "}";
    // Arguments grow at their end only; anything else (a body that stopped
    // reading as a call) adds nothing.
    if (ok && args.size() > sent_.size() && args.compare(0, sent_.size(), sent_) == 0) {
        open_piece(d, n_calls_).arguments += args.substr(sent_.size());
        sent_ = std::move(args);
    }
    if (end) {
        open_piece(d, n_calls_).last = true;
        ++n_calls_;
        streaming_ = false;
        sent_.clear();
    }
}

void ChatOutputParser::add_call(ChatDelta& d, ToolCall call) {
    ToolCallPiece p;
    p.index = n_calls_++;
    p.id = std::move(call.id);
    p.name = std::move(call.name);
    p.arguments = std::move(call.arguments);
    p.first = p.last = true;
    d.calls.push_back(std::move(p));
}

}  // namespace quern::server
