// Reasoning and tool-call parsing of generated chat text (server/chat_output.h)
// on recorded outputs of each family: the parts (reasoning, content, calls)
// of the whole text, and the same parts however the text is cut into pieces
// (every cut into two, and byte by byte), as a stream delivers it.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "grammar/grammar.h"
#include "server/chat_output.h"
#include "server/tool_grammar.h"

using namespace quern::server;
using Json = nlohmann::ordered_json;

namespace {

struct Parts {
    std::string reasoning, content;
    std::vector<std::pair<std::string, Json>> calls;  // name, arguments
    bool operator==(const Parts& o) const = default;
};

/// The calls as their pieces add up (the arguments' text as streamed).
struct Streamed {
    std::vector<ToolCall> calls;
    int pieces = 0;
};

void PrintTo(const Parts& p, std::ostream* os) {
    *os << "reasoning=" << Json(p.reasoning).dump() << " content=" << Json(p.content).dump() << " calls=[";
    for (const auto& [n, a] : p.calls) *os << n << a.dump() << " ";
    *os << "]";
}

void collect(const ChatDelta& d, Parts& p, Streamed& st) {
    p.reasoning += d.reasoning;
    p.content += d.content;
    for (const ToolCallPiece& c : d.calls) {
        // pieces come in order: a call's first, its arguments, its last
        if (c.first) EXPECT_TRUE(st.calls.empty() || c.index == static_cast<int>(st.calls.size()));
        else EXPECT_EQ(c.index, static_cast<int>(st.calls.size()) - 1);
        merge_call_piece(st.calls, c);
        ++st.pieces;
    }
}

Parts parse_pieces(const std::vector<std::string>& pieces, OutputFormat f, bool in_reasoning, const Json& tools,
                   Streamed* streamed = nullptr) {
    ChatOutputParser parser(f, in_reasoning, tools, [] { return std::string("call_x"); });
    Parts p;
    Streamed st;
    for (const std::string& s : pieces) collect(parser.push(s), p, st);
    collect(parser.finish(), p, st);
    for (const ToolCall& c : st.calls) {
        const Json args = Json::parse(c.arguments, nullptr, false);
        p.calls.emplace_back(c.name, args.is_discarded() ? Json(c.arguments) : args);  // cut short: the text
    }
    if (streamed) *streamed = std::move(st);
    return p;
}

/// The parts of `text` in one piece, checked to be the same for every cut.
Parts parse_all_ways(const std::string& text, OutputFormat f, bool in_reasoning = false, const Json& tools = {}) {
    const Parts whole = parse_pieces({text}, f, in_reasoning, tools);
    for (size_t cut = 0; cut <= text.size(); ++cut)
        EXPECT_EQ(parse_pieces({text.substr(0, cut), text.substr(cut)}, f, in_reasoning, tools), whole) << "cut " << cut;
    std::vector<std::string> bytes;
    for (char c : text) bytes.emplace_back(1, c);
    EXPECT_EQ(parse_pieces(bytes, f, in_reasoning, tools), whole) << "byte by byte";
    return whole;
}

const OutputFormat kHermes{false, ToolFormat::Hermes};
const OutputFormat kQwen3{true, ToolFormat::Hermes};
const OutputFormat kQwen35{true, ToolFormat::Xml};

const Json kTools = Json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
    "units": {"type": "string"}}}}}])");

TEST(ChatOutput, HermesToolCallAfterText) {
    const Parts p = parse_all_ways(
        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        kHermes);
    EXPECT_EQ(p.content, "Let me check.\n");
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].first, "get_weather");
    EXPECT_EQ(p.calls[0].second, Json::parse(R"({"city": "Paris"})"));
}

TEST(ChatOutput, ParallelHermesCallsAndStringArguments) {
    const Parts p = parse_all_ways(
        "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n"
        "<tool_call>\n{\"name\": \"b\", \"arguments\": \"{\\\"y\\\": [1, 2]}\"}\n</tool_call>",
        kHermes);
    EXPECT_EQ(p.content, "");
    ASSERT_EQ(p.calls.size(), 2u);
    EXPECT_EQ(p.calls[0], (std::pair<std::string, Json>{"a", Json::parse(R"({"x": 1})")}));
    EXPECT_EQ(p.calls[1], (std::pair<std::string, Json>{"b", Json::parse(R"({"y": [1, 2]})")}));
}

TEST(ChatOutput, Qwen3ThinkingThenACall) {
    const Parts p = parse_all_ways(
        "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
        "\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
        kQwen3);
    EXPECT_EQ(p.reasoning, "The user wants the weather.\n");
    EXPECT_EQ(p.content, "");
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].second, Json::parse(R"({"city": "Oslo"})"));
}

TEST(ChatOutput, ThinkBlockOpenedByThePrompt) {
    EXPECT_TRUE(prompt_opens_think("<|im_start|>assistant\n<think>\n"));
    EXPECT_FALSE(prompt_opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    const Parts p = parse_all_ways("Two plus two.\n</think>\n\nThe answer is 4.", kQwen3, /*in_reasoning=*/true);
    EXPECT_EQ(p.reasoning, "Two plus two.\n");
    EXPECT_EQ(p.content, "The answer is 4.");
    // a model that opens the block again
    EXPECT_EQ(parse_all_ways("\n<think>\nTwo plus two.\n</think>\n\n4", kQwen3, true),
              (Parts{"Two plus two.\n", "4", {}}));
}

TEST(ChatOutput, Qwen35XmlCallsTypedByTheSchema) {
    const Parts p = parse_all_ways(
        "<think>\nCall it.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n<parameter=units>\n42\n</parameter>\n</function>\n</tool_call>",
        kQwen35, false, kTools);
    EXPECT_EQ(p.reasoning, "Call it.\n");
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].first, "get_weather");
    // days is an integer; units a string even though it reads as a number
    EXPECT_EQ(p.calls[0].second, Json::parse(R"({"city": "New York", "days": 3, "units": "42"})"));
}

TEST(ChatOutput, UnfinishedOrUnreadableCallsStayText) {
    const std::string cut = "Sure.<tool_call>\n{\"name\": \"get_weather\", \"argu";
    Parts p = parse_all_ways(cut, kHermes);
    EXPECT_EQ(p.content, cut);
    EXPECT_TRUE(p.calls.empty());
    const std::string bad = "<tool_call>{not json}</tool_call> done";
    p = parse_all_ways(bad, kHermes);
    EXPECT_EQ(p.content, bad);
    EXPECT_TRUE(p.calls.empty());
}

// Calls stream: the call goes out once named with its arguments begun, the
// arguments follow as they are written, and the pieces add up to the call.
TEST(ChatOutput, ToolCallsStreamTheirArguments) {
    const std::string hermes = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>";
    ChatOutputParser p(kHermes, false, kTools, [] { return std::string("call_1"); });
    const size_t mid = hermes.find("Paris");
    ChatDelta d = p.push(hermes.substr(0, mid));
    ASSERT_EQ(d.calls.size(), 1u);  // out before the call ends
    EXPECT_TRUE(d.calls[0].first);
    EXPECT_FALSE(d.calls[0].last);
    EXPECT_EQ(d.calls[0].id, "call_1");
    EXPECT_EQ(d.calls[0].name, "get_weather");
    EXPECT_EQ(d.calls[0].arguments, "{\"city\": \"");
    Streamed st;
    std::vector<std::string> bytes;
    for (char c : hermes) bytes.emplace_back(1, c);
    parse_pieces(bytes, kHermes, false, kTools, &st);
    ASSERT_EQ(st.calls.size(), 1u);
    EXPECT_EQ(st.calls[0].arguments, "{\"city\": \"Paris\", \"days\": 3}");  // the model's text
    EXPECT_GT(st.pieces, 20);
    // cut short inside the arguments: still a call, with what it has
    const Parts cut = parse_all_ways(hermes.substr(0, mid + 3), kHermes, false, kTools);
    ASSERT_EQ(cut.calls.size(), 1u);
    EXPECT_EQ(cut.calls[0].second, Json("{\"city\": \"Par"));
    EXPECT_EQ(cut.content, "");
    // arguments before the name: out once the name is there
    const Parts late = parse_all_ways("<tool_call>{\"arguments\": {\"x\": [1, {\"y\": \"}\"}]}, \"name\": \"f\"}</tool_call>", kHermes);
    ASSERT_EQ(late.calls.size(), 1u);
    EXPECT_EQ(late.calls[0], (std::pair<std::string, Json>{"f", Json::parse(R"({"x": [1, {"y": "}"}]})")}));
    // XML: a parameter at a time, as compact JSON
    const std::string xml = "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
                            "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    ChatOutputParser x(kQwen35, false, kTools, [] { return std::string("call_2"); });
    d = x.push(xml.substr(0, xml.find("<parameter=days>")));
    ASSERT_EQ(d.calls.size(), 1u);
    EXPECT_EQ(d.calls[0].arguments, "{\"city\":\"New York\"");
    d = x.push(xml.substr(xml.find("<parameter=days>")));
    ASSERT_EQ(d.calls.size(), 1u);
    EXPECT_EQ(d.calls[0].arguments, ",\"days\":3}");
    EXPECT_TRUE(d.calls[0].last);
}

// Small models drop the tags (Qwen2.5-Coder-0.5B answers a tool request
// with the bare object): read as calls when they name the request's tools.
TEST(ChatOutput, BareJsonCallsOfTheRequestsTools) {
    Parts p = parse_all_ways("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}", kHermes, false,
                             kTools);
    EXPECT_EQ(p.content, "");
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].second, Json::parse(R"({"city": "Paris"})"));
    p = parse_all_ways("\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"a}\"}}\n"
                       "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"b\"}}",
                       kHermes, false, kTools);
    ASSERT_EQ(p.calls.size(), 2u);
    EXPECT_EQ(p.calls[0].second, Json::parse(R"({"city": "a}"})"));
    // a JSON answer that names no tool of the request stays the answer
    const std::string answer = "{\"name\": \"Ada\", \"arguments\": {}}";
    p = parse_all_ways(answer, kHermes, false, kTools);
    EXPECT_EQ(p.content, answer);
    EXPECT_TRUE(p.calls.empty());
    // without tools in the request, nothing is held back
    EXPECT_EQ(parse_all_ways("{\"name\": \"get_weather\"}", kHermes).content, "{\"name\": \"get_weather\"}");
}

TEST(ChatOutput, WithoutAFormatTextPassesThrough) {
    const std::string t = "<think>x</think><tool_call>{\"name\": \"a\"}</tool_call> <tool_";
    const Parts p = parse_all_ways(t, OutputFormat{});
    EXPECT_EQ(p.content, t);
    EXPECT_TRUE(p.reasoning.empty() && p.calls.empty());
}

TEST(ChatOutput, FormatsReadFromTemplates) {
    const OutputFormat q = detect_output_format("{{- '<tool_call>\\n<function=' + name + '>\\n<parameter=' }} <think>");
    EXPECT_EQ(q.tools, ToolFormat::Xml);
    EXPECT_TRUE(q.think);
    const OutputFormat h = detect_output_format("<tool_call>\\n{\"name\": ...}");
    EXPECT_EQ(h.tools, ToolFormat::Hermes);
    EXPECT_FALSE(h.think);
    EXPECT_EQ(detect_output_format("{{ messages }}").tools, ToolFormat::None);
}

// tool_choice required / a named function: the grammar admits exactly the
// Hermes calls of the allowed tools with arguments their schemas accept, and
// the parser reads them back as calls.
TEST(ChatOutput, ForcedToolCallGrammar) {
    const Json tools = Json::parse(R"([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
          "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}])");
    const auto accepts = [](const std::string& gbnf, const std::string& text) {
        quern::grammar::GrammarState s(quern::grammar::Grammar::parse(gbnf));
        return s.advance_bytes(text) && s.accepting();
    };
    const std::string call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n</tool_call>";
    const std::string ping = "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>";
    const std::string any = forced_tool_call_gbnf(ToolFormat::Hermes, tools, "", true);
    EXPECT_TRUE(accepts(any, call));
    EXPECT_TRUE(accepts(any, ping));
    EXPECT_TRUE(accepts(any, call + "\n" + ping));
    EXPECT_FALSE(accepts(any, "Sure!"));
    EXPECT_FALSE(accepts(any, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 2}}\n</tool_call>"));
    const std::string named = forced_tool_call_gbnf(ToolFormat::Hermes, tools, "ping", false);
    EXPECT_TRUE(accepts(named, ping));
    EXPECT_FALSE(accepts(named, call));
    EXPECT_FALSE(accepts(named, ping + "\n" + ping));
    EXPECT_EQ(parse_all_ways(call, kHermes, false, tools).calls.size(), 1u);
    EXPECT_THROW(forced_tool_call_gbnf(ToolFormat::None, tools, "", true), quern::Error);
    EXPECT_THROW(forced_tool_call_gbnf(ToolFormat::Hermes, tools, "nope", true), quern::Error);
    // A thinking model may reason first: after the block the prompt opened,
    // or in one it opens.
    const std::string open = forced_tool_call_gbnf(ToolFormat::Hermes, tools, "", false, ThinkFirst::Open);
    EXPECT_TRUE(accepts(open, "The user wants a joke; I must call a tool.\n</think>\n\n" + call));
    EXPECT_FALSE(accepts(open, call));
    const std::string optional = forced_tool_call_gbnf(ToolFormat::Hermes, tools, "", false, ThinkFirst::Optional);
    EXPECT_TRUE(accepts(optional, call));
    EXPECT_TRUE(accepts(optional, "<think>\nhmm\n</think>\n" + call));
    EXPECT_FALSE(accepts(optional, "hmm</think>" + call));
}

// Llama 3.x: a bare {"name", "parameters"} object (after <|python_tag|>, or
// several joined by ";"); Mistral: [TOOL_CALLS] and a list (the marker may
// be missing from the text: a control token).
TEST(ChatOutput, Llama3AndMistralCalls) {
    const OutputFormat llama{false, ToolFormat::Llama3}, mistral{false, ToolFormat::Mistral};
    Parts p = parse_all_ways(R"({"name": "get_weather", "parameters": {"city": "Paris"}})", llama, false, kTools);
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].second, Json::parse(R"({"city": "Paris"})"));
    p = parse_all_ways(R"(<|python_tag|>{"name": "get_weather", "parameters": {"city": "A"}}; {"name": "get_weather", "parameters": {"city": "B"}})",
                       llama, false, kTools);
    ASSERT_EQ(p.calls.size(), 2u);
    EXPECT_EQ(p.calls[1].second, Json::parse(R"({"city": "B"})"));
    EXPECT_EQ(parse_all_ways("The weather is fine.", llama, false, kTools).content, "The weather is fine.");
    for (const char* t : {R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}])",
                          R"([{"name": "get_weather", "arguments": {"city": "Rome"}, "id": "abcdefghi"}])"}) {
        p = parse_all_ways(t, mistral, false, kTools);
        ASSERT_EQ(p.calls.size(), 1u) << t;
        EXPECT_EQ(p.calls[0].second, Json::parse(R"({"city": "Rome"})"));
    }
    const std::string g = forced_tool_call_gbnf(ToolFormat::Llama3, kTools, "", true);
    quern::grammar::GrammarState s(quern::grammar::Grammar::parse(g));
    EXPECT_TRUE(s.advance_bytes(R"({"name": "get_weather", "parameters": {"city": "X"}})") && s.accepting());
    // Mistral: a JSON list (its [TOOL_CALLS] token has no text to force).
    const std::string m = forced_tool_call_gbnf(ToolFormat::Mistral, kTools, "", true);
    quern::grammar::GrammarState ms(quern::grammar::Grammar::parse(m));
    const std::string list = R"([{"name": "get_weather", "arguments": {"city": "X"}}, {"name": "get_weather", "arguments": {}}])";
    EXPECT_TRUE(ms.advance_bytes(list) && ms.accepting());
    EXPECT_EQ(parse_all_ways(list, mistral, false, kTools).calls.size(), 2u);
}

// Qwen3.5 XML calls forced: parameters in order, required ones written,
// strings as text and other types as JSON of their schema; what the grammar
// writes the parser reads back typed.
TEST(ChatOutput, ForcedXmlToolCalls) {
    const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "units": {"type": "string", "enum": ["C", "F"]}}, "required": ["city", "days"]}}}])");
    const std::string g = forced_tool_call_gbnf(ToolFormat::Xml, tools, "", false, ThinkFirst::Open);
    const auto accepts = [&](const std::string& text) {
        quern::grammar::GrammarState s(quern::grammar::Grammar::parse(g));
        return s.advance_bytes(text) && s.accepting();
    };
    const std::string call = "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
                             "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    EXPECT_TRUE(accepts("Need the weather.\n</think>\n\n" + call));
    EXPECT_FALSE(accepts("x</think>" + std::string(call).replace(call.find("3\n"), 1, "9")));  // days above 7
    EXPECT_FALSE(accepts("x</think><tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"));
    const std::string units = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
                              "<parameter=days>\n1\n</parameter>\n<parameter=units>\nC\n</parameter>\n</function>\n</tool_call>";
    EXPECT_TRUE(accepts("</think>" + units));
    const Parts p = parse_all_ways("x\n</think>\n\n" + units, kQwen35, true, tools);
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].second, Json::parse(R"({"city": "Oslo", "days": 1, "units": "C"})"));
    const Json bad = Json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]+$"}}}}}])");
    EXPECT_THROW(forced_tool_call_gbnf(ToolFormat::Xml, bad, "", false), quern::Error);
}

// DeepSeek: V3 / R1 calls (name after "function", arguments in a ```json
// fence), V3.1 (name<sep>arguments), V4's DSML invokes; the list wrappers
// are not content, and forced calls read back.
TEST(ChatOutput, DeepSeekCalls) {
    const OutputFormat ds{true, ToolFormat::DeepSeek}, dsml{true, ToolFormat::Dsml};
    Parts p = parse_all_ways(
        "<think>\nThe user wants weather.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
        "```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        "{\"city\": \"Rome\", \"days\": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ds, false, kTools);
    EXPECT_EQ(p.reasoning, "The user wants weather.\n");
    EXPECT_EQ(p.content, "");
    ASSERT_EQ(p.calls.size(), 2u);
    EXPECT_EQ(p.calls[0], (std::pair<std::string, Json>{"get_weather", Json::parse(R"({"city": "Paris"})")}));
    EXPECT_EQ(p.calls[1].second, Json::parse(R"({"city": "Rome", "days": 2})"));
    p = parse_all_ways("Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Oslo\"}"
                       "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                       ds, false, kTools);
    EXPECT_EQ(p.content, "Let me check.");
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].second, Json::parse(R"({"city": "Oslo"})"));
    p = parse_all_ways("On it.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
                       "<｜DSML｜parameter name=\"city\" string=\"true\">New York</｜DSML｜parameter>\n"
                       "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
                       "<｜DSML｜invoke name=\"get_weather\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
                       dsml, false, kTools);
    EXPECT_EQ(p.content, "On it.\n\n");
    ASSERT_EQ(p.calls.size(), 2u);
    EXPECT_EQ(p.calls[0].second, Json::parse(R"({"city": "New York", "days": 3})"));
    EXPECT_EQ(p.calls[1].second, Json::object());
    // forced calls in both forms are read back
    for (const OutputFormat& f : {ds, dsml}) {
        const std::string g = forced_tool_call_gbnf(f.tools, kTools, "", true, ThinkFirst::Open);
        const std::string call = f.tools == ToolFormat::DeepSeek
            ? "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Lima\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
            : "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Lima</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
        quern::grammar::GrammarState st(quern::grammar::Grammar::parse(g));
        EXPECT_TRUE(st.advance_bytes("ok\n</think>\n\n" + call) && st.accepting()) << call;
        const Parts back = parse_all_ways("ok\n</think>\n\n" + call, f, true, kTools);
        ASSERT_EQ(back.calls.size(), 1u);
        EXPECT_EQ(back.calls[0].second, Json::parse(R"({"city": "Lima"})"));
    }
}

// gpt-oss harmony: the analysis channel is reasoning, a message to
// functions.NAME a call (recipient before or after the channel), final the
// answer; a call cut where the engine stopped (its <|call|> a stop token)
// ends with what it has; text without harmony is the answer.
TEST(ChatOutput, HarmonyMessages) {
    OutputFormat h;
    h.harmony = h.think = true;
    h.tools = ToolFormat::Harmony;
    Parts p = parse_all_ways("<|channel|>analysis<|message|>User wants weather.<|end|><|start|>assistant<|channel|>commentary "
                             "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
                             h, false, kTools);
    EXPECT_EQ(p.reasoning, "User wants weather.");
    EXPECT_EQ(p.content, "");
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0], (std::pair<std::string, Json>{"get_weather", Json::parse(R"({"city": "Paris"})")}));
    p = parse_all_ways("<|channel|>analysis<|message|>Two.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json"
                       "<|message|>{\"city\": \"Oslo\"}",  // stopped at <|call|>
                       h, false, kTools);
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].second, Json::parse(R"({"city": "Oslo"})"));
    p = parse_all_ways("<|channel|>analysis<|message|>2 + 2.<|end|><|start|>assistant<|channel|>final<|message|>The answer is 4.<|return|>",
                       h, false, kTools);
    EXPECT_EQ(p.reasoning, "2 + 2.");
    EXPECT_EQ(p.content, "The answer is 4.");
    EXPECT_TRUE(p.calls.empty());
    EXPECT_EQ(parse_all_ways("A plain answer.", h, false, kTools).content, "A plain answer.");
    // without tools in the request a call is text
    OutputFormat no_tools = h;
    no_tools.tools = ToolFormat::None;
    p = parse_all_ways("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>", no_tools);
    EXPECT_EQ(p.content, "{}");
    EXPECT_THROW(forced_tool_call_gbnf(ToolFormat::Harmony, kTools, "", false), quern::Error);
}

// The real templates of the families covered.
TEST(ChatOutput, FormatsOfTheRealTemplates) {
    const auto of = [](const std::string& name) {
        std::ifstream f(std::string(QUERN_TESTDATA_DIR) + "/chat-templates/" + name);
        EXPECT_TRUE(f) << name;
        std::stringstream ss;
        ss << f.rdbuf();
        return detect_output_format(ss.str());
    };
    const OutputFormat q35 = of("Qwen3.5-4B.jinja");
    EXPECT_EQ(q35.tools, ToolFormat::Xml);
    EXPECT_TRUE(q35.think);
    EXPECT_EQ(of("Qwen3-Coder.jinja").tools, ToolFormat::Xml);
    const OutputFormat q25 = of("Qwen-Qwen2.5-7B-Instruct.jinja");
    EXPECT_EQ(q25.tools, ToolFormat::Hermes);
    EXPECT_FALSE(q25.think);
    const OutputFormat qwq = of("Qwen-QwQ-32B.jinja");
    EXPECT_EQ(qwq.tools, ToolFormat::Hermes);
    EXPECT_TRUE(qwq.think);
    EXPECT_EQ(of("meta-llama-Llama-3.1-8B-Instruct.jinja").tools, ToolFormat::Llama3);
    EXPECT_EQ(of("meta-llama-Llama-3.2-3B-Instruct.jinja").tools, ToolFormat::Llama3);
    EXPECT_EQ(of("mistralai-Mistral-Nemo-Instruct-2407.jinja").tools, ToolFormat::Mistral);
    EXPECT_EQ(of("deepseek-ai-DeepSeek-V3.1.jinja").tools, ToolFormat::DeepSeek);
    EXPECT_EQ(of("llama-cpp-deepseek-r1.jinja").tools, ToolFormat::DeepSeek);
    EXPECT_EQ(of("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").tools, ToolFormat::DeepSeek);
    EXPECT_EQ(of("deepseek-ai-DeepSeek-V4.jinja").tools, ToolFormat::Dsml);
    EXPECT_TRUE(of("deepseek-ai-DeepSeek-V4.jinja").think);
    const OutputFormat oss = of("openai-gpt-oss-120b.jinja");
    EXPECT_TRUE(oss.harmony);
    EXPECT_EQ(oss.tools, ToolFormat::Harmony);
}

}  // namespace
