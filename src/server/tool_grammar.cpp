#include "server/tool_grammar.h"

#include <set>

#include "core/error.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"

namespace quern::server {

namespace {

using Json = nlohmann::ordered_json;
using grammar::gbnf_literal;


const Json& function_of(const Json& t) { return t.contains("function") ? t["function"] : t; }

Json parameters_of(const Json& fn) {
    return fn.contains("parameters") && fn["parameters"].is_object() ? fn["parameters"] : Json{{"type", "object"}};
}

/// A plain-text XML parameter value: no "</" inside (what would close it).
constexpr const char* kXmlText = "( [^<] | \"<\" [^/] )*";

/// GBNF for the XML parameters of `params` (an object schema): each as
/// <parameter=P>\nVALUE\n</parameter>\n (DSML: <｜DSML｜parameter name="P"
/// string="true|false">VALUE</｜DSML｜parameter>\n), in order, required
/// ones always.
std::string xml_parameters(const Json& params, const std::string& prefix, std::string& rules, bool dsml) {
    if (!params.contains("properties")) return "";
    std::set<std::string> required;
    if (params.contains("required") && params["required"].is_array())
        for (const Json& r : params["required"])
            if (r.is_string()) required.insert(r.get<std::string>());
    std::string seq;
    int k = 0;
    for (const auto& [name, schema] : params["properties"].items()) {
        const std::string path = prefix + "p" + std::to_string(k++);
        std::string value;
        const bool plain_string = schema.is_object() && schema.value("type", Json()) == "string";
        if (plain_string) {
            // Written as text: constraints on the text itself cannot be kept.
            for (const char* key : {"pattern", "format", "minLength", "maxLength"})
                if (schema.contains(key))
                    fail("the parameter '{}' constrains its string with '{}', which a forced XML call cannot enforce",
                         name, key);
            if (schema.contains("enum") || schema.contains("const")) {
                const Json options = schema.contains("enum") ? schema["enum"] : Json::array({schema["const"]});
                for (const Json& o : options)
                    value += (value.empty() ? "( " : " | ") + gbnf_literal(o.is_string() ? o.get<std::string>() : o.dump());
                value += " )";
            } else {
                value = path + "t";
                rules += value + " ::= " + kXmlText + "\n";
            }
        } else {
            std::string expr;
            rules += grammar::json_schema_rules(schema, path + "x", expr);
            value = expr;
        }
        const std::string member = path + "m";
        const std::string open = dsml ? "<｜DSML｜parameter name=\"" + name + "\" string=\"" + (plain_string ? "true" : "false") + "\">"
                                      : "<parameter=" + name + ">\n";
        const std::string close = dsml ? "</｜DSML｜parameter>\n" : "\n</parameter>\n";
        rules += member + " ::= " + gbnf_literal(open) + " " + value + " " + gbnf_literal(close) + "\n";
        seq += (seq.empty() ? "" : " ") + member + (required.count(name) ? "" : "?");
    }
    return seq;
}

}  // namespace

std::string forced_tool_call_gbnf(ToolFormat f, const Json& tools, const std::string& only, bool parallel, ThinkFirst think) {
    if (f == ToolFormat::None)
        fail("the model's chat template writes no tool calls, so a call cannot be forced");
    if (f == ToolFormat::Harmony)
        fail("a harmony (gpt-oss) tool call cannot be forced: its markers are special tokens, outside what a grammar "
             "over text constrains");
    std::string rules, calls;
    int k = 0;
    for (const Json& t : tools) {
        const Json& fn = function_of(t);
        const std::string name = fn.value("name", "");
        if (name.empty() || (!only.empty() && name != only)) continue;
        const std::string prefix = "t" + std::to_string(k);
        const std::string call = "call" + std::to_string(k++);
        if (f == ToolFormat::Xml || f == ToolFormat::Dsml) {
            const bool dsml = f == ToolFormat::Dsml;
            const std::string params = xml_parameters(parameters_of(fn), prefix, rules, dsml);
            rules += call + " ::= " +
                     gbnf_literal(dsml ? "<｜DSML｜invoke name=\"" + name + "\">\n" : "<tool_call>\n<function=" + name + ">\n") + " " +
                     params + " " + gbnf_literal(dsml ? "</｜DSML｜invoke>" : "</function>\n</tool_call>") + "\n";
        } else if (f == ToolFormat::DeepSeek) {  // the V3 / R1 form
            std::string args;
            rules += grammar::json_schema_rules(parameters_of(fn), prefix + "x", args);
            rules += call + " ::= " + gbnf_literal("<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n") + " " + args + " " +
                     gbnf_literal("\n```<｜tool▁call▁end｜>") + "\n";
        } else {
            std::string args;
            rules += grammar::json_schema_rules(parameters_of(fn), prefix + "x", args);
            const std::string head = f == ToolFormat::Hermes   ? "<tool_call>\n{\"name\": " + Json(name).dump() + ", \"arguments\": "
                                     : f == ToolFormat::Llama3 ? "{\"name\": " + Json(name).dump() + ", \"parameters\": "
                                                               : "{\"name\": " + Json(name).dump() + ", \"arguments\": ";
            const std::string tail = f == ToolFormat::Hermes ? "}\n</tool_call>" : "}";
            rules += call + " ::= " + gbnf_literal(head) + " " + args + " " + gbnf_literal(tail) + "\n";
        }
        calls += (calls.empty() ? "" : " | ") + call;
    }
    if (calls.empty()) fail("no tool named '{}' among the request's tools", only);
    const std::string sep = f == ToolFormat::Llama3 ? "\"; \"" : f == ToolFormat::Mistral ? "\", \"" : f == ToolFormat::DeepSeek ? "\"\"" : "\"\\n\"";
    std::string body = "( " + calls + " )" + (parallel ? " ( " + sep + " ( " + calls + " ) )*" : "");
    if (f == ToolFormat::Mistral) body = "\"[\" " + body + " \"]\"";
    if (f == ToolFormat::DeepSeek) body = gbnf_literal("<｜tool▁calls▁begin｜>") + " " + body + " " + gbnf_literal("<｜tool▁calls▁end｜>");
    if (f == ToolFormat::Dsml) body = gbnf_literal("<｜DSML｜tool_calls>\n") + " " + body + " " + gbnf_literal("\n</｜DSML｜tool_calls>");
    // Reasoning first, for models that think: anything but "</" up to the
    // block's end.
    const std::string reasoning = std::string(kXmlText) + " \"</think>\" [ \\n]*";
    if (think == ThinkFirst::Open) body = reasoning + " " + body;
    if (think == ThinkFirst::Optional) body = "( \"<think>\" " + reasoning + " )? " + body;
    return "root ::= " + body + "\n" + rules + grammar::json_value_rules();
}

}  // namespace quern::server
