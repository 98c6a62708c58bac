// The assistant's generated text split as the chat API returns it: the
// reasoning (<think> … </think>) apart from the answer, and tool calls
// parsed into OpenAI's structured `tool_calls`, incrementally while the text
// streams in. Which markers a model writes is read from its chat template
// (detect_output_format): the families covered so far are
//   - reasoning in <think> … </think> (Qwen3, Qwen3.5, DeepSeek-R1 style),
//     including templates whose generation prompt opens the block;
//   - Hermes / Qwen2.5 / Qwen3 tool calls:
//       <tool_call>{"name": …, "arguments": {…}}</tool_call>
//   - Qwen3-Coder / Qwen3.5 XML tool calls:
//       <tool_call><function=NAME><parameter=P>VALUE</parameter>…</function></tool_call>
//     (VALUE typed by the tool's JSON schema: strings stay strings, other
//     types are read as JSON).
// Tool calls stream: a call goes out as soon as its name is written and its
// arguments have begun, and its arguments follow as JSON text while they are
// generated (<tool_call> JSON: the model's own text from its '{'; XML: each
// parameter once its closing tag arrives, as compact JSON). A call cut short
// after that (a stop or the length limit) ends with the arguments it has; one
// cut short before, or unreadable, comes back as plain content, as written.
// Calls that cannot stream (arguments written as a JSON string, the bare
// and list forms below) go out whole when they end. Small models often
// drop the tags: an answer that is nothing but JSON objects naming one of
// the request's tools ({"name": …, "arguments": …}, one or more) is read as
// those calls (the generic fallback); such an answer is held back until the
// end to tell.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace quern::server {

class HarmonyParser;

/// Hermes: <tool_call>{json}</tool_call> (Qwen2.5, Qwen3, Hermes); Xml:
/// Qwen3-Coder / Qwen3.5; Llama3: a bare {"name", "parameters"} object,
/// maybe after <|python_tag|>; Mistral: [TOOL_CALLS] then a JSON list of
/// {"name", "arguments"} (the marker is a control token the text may lack);
/// DeepSeek: V3 / R1 <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
/// ```json ARGS ```<｜tool▁call▁end｜> and V3.1 NAME<｜tool▁sep｜>ARGS, within
/// <｜tool▁calls▁begin｜> … <｜tool▁calls▁end｜>; Dsml: DeepSeek V4's
/// <｜DSML｜invoke name="NAME"><｜DSML｜parameter name="P" string="true|false">
/// VALUE</｜DSML｜parameter></｜DSML｜invoke>.
/// Harmony: gpt-oss's messages to functions.NAME (server/harmony.h).
enum class ToolFormat { None, Hermes, Xml, Llama3, Mistral, DeepSeek, Dsml, Harmony };

/// What a model writes besides its answer, as its chat template shows it.
struct OutputFormat {
    bool think = false;                   ///< <think> … </think> reasoning
    ToolFormat tools = ToolFormat::None;  ///< how tool calls are written
    bool harmony = false;                 ///< gpt-oss's harmony messages (analysis, commentary, final)
};

/// Read from a chat template's source: <think> if it mentions the tag, XML
/// tool calls if it writes <function=…> / <parameter=…>, Hermes ones if it
/// writes <tool_call>.
OutputFormat detect_output_format(const std::string& template_source);

/// Whether the rendered prompt leaves the model inside a <think> block (the
/// generation prompt ends by opening it).
bool prompt_opens_think(const std::string& prompt);

struct ToolCall {
    std::string id;
    std::string name;
    std::string arguments;  ///< a JSON object, as text
};

/// A piece of a tool call as the text streams in: a call's first piece
/// names it (id, name), each piece adds JSON text to its arguments, its last
/// ends it (a call read at once is one piece, first and last).
struct ToolCallPiece {
    int index = 0;          ///< the call's number in the reply (0, 1, ...)
    std::string id, name;   ///< first piece only
    std::string arguments;  ///< more of the arguments' JSON text
    bool first = false, last = false;
};

/// Adds `p` to the calls it belongs to (a first piece starts one).
void merge_call_piece(std::vector<ToolCall>& calls, const ToolCallPiece& p);

/// Text of one step, by destination.
struct ChatDelta {
    std::string reasoning, content;
    std::vector<ToolCallPiece> calls;
    bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
    void append(ChatDelta&& o);
};

/// The piece of call `index` that `d` is adding to: its last one while that
/// is still open, else a new one.
ToolCallPiece& open_piece(ChatDelta& d, int index);

/// Bytes at the end of `s` that begin one of `markers` (a parser holds them
/// back: the next piece of text may complete the marker).
size_t partial_marker(std::string_view s, const std::vector<std::string_view>& markers);

class ChatOutputParser {
public:
    /// `tools`: the request's tool list (OpenAI shape; types the XML
    /// parameters); `new_id` names each call ("call_…").
    ChatOutputParser(OutputFormat f, bool in_reasoning, nlohmann::ordered_json tools,
                     std::function<std::string()> new_id);
    ~ChatOutputParser();

    /// The next piece of generated text: what of it can be told apart now
    /// (text that may begin a marker is held back until it can).
    ChatDelta push(std::string_view text);
    /// The end of the text: what was held back (an unfinished tool call as
    /// content).
    ChatDelta finish();

private:
    enum class Mode { Content, Reasoning, Tool, BareJson };
    void emit(ChatDelta& d, Mode m, std::string_view text);
    /// A JSON call body ({"name", "arguments" or "parameters"}, the
    /// arguments maybe a JSON string) as a call, or false.
    bool parse_call(const std::string& body, ToolCall& call) const;
    /// How far the open call's body has come: its name once written and
    /// its arguments' JSON text so far, or false before both have begun (or
    /// when its arguments cannot stream).
    /// `built`: the arguments are assembled here (XML parameters), so the
    /// call's end adds the closing brace.
    bool call_progress(std::string_view body, std::string& name, std::string& args, bool& built) const;
    /// Sends what is new of the open call (its first piece once it can
    /// stream, then its arguments). `end`: the body is whole; the call ends.
    void stream_call(ChatDelta& d, std::string_view body, bool end);
    /// A whole call as one piece.
    void add_call(ChatDelta& d, ToolCall call);
    /// The generic fallback: `text` as tool calls (JSON objects naming the
    /// request's tools, back to back), or false.
    bool parse_bare_json(const std::string& text, std::vector<ToolCall>& calls) const;
    bool parse_bare_json_objects(std::string_view text, std::vector<ToolCall>& calls) const;

    OutputFormat f_;
    std::unique_ptr<HarmonyParser> harmony_;  // f_.harmony: the whole text is its
    nlohmann::ordered_json tools_;
    std::function<std::string()> new_id_;
    Mode mode_;
    std::string held_;         // text that may begin a marker
    std::string tool_;         // the open tool call's body
    bool trim_next_ = true;    // drop newlines at the start of the next content or reasoning
    bool opened_ = false;      // the prompt opened the think block: a <think> the model writes anyway is dropped
    bool answer_started_ = false;  // content has begun (the bare-JSON fallback looks at its first character)
    std::string bare_;         // an answer held back as possible bare-JSON tool calls
    int n_calls_ = 0;
    bool streaming_ = false;   // the open call has gone out (its first piece)
    std::string sent_;         // its arguments sent so far
};

}  // namespace quern::server
