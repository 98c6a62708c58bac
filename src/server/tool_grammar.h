// The grammar that makes a model call a tool: tool_choice "required" (any
// of the request's tools) or a named function, enforced by constrained
// decoding in the call format the model's template writes (chat_output.h):
//   - Hermes:  <tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>
//   - Llama 3: {"name": NAME, "parameters": ARGS}, several joined by "; "
//   - XML (Qwen3-Coder / Qwen3.5):
//       <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n…</function>\n</tool_call>
//     the parameters in the schema's order, the required ones always
//     written; string values as plain text, others as JSON of their schema;
//   - Mistral: [{"name": NAME, "arguments": ARGS}, …] (the [TOOL_CALLS]
//     control token has no text to force; the list reads as calls without it);
//   - DeepSeek (V3 / R1 form): <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function
//     <｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>;
//   - DSML (DeepSeek V4): <｜DSML｜tool_calls> <｜DSML｜invoke name="NAME"> with
//     XML-like parameters (string="true" for text, "false" for JSON).
// These markers are forced as text: a vocabulary must spell them (DeepSeek's
// are ordinary added tokens).
// ARGS is JSON its parameters schema accepts (json_schema.h). Models that
// think may reason first: when the prompt opened a <think> block the grammar
// lets it close; a template that thinks lets the model open one.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "server/chat_output.h"

namespace quern::server {

/// Where a forced call may begin: at once, after an optional think block,
/// or after the think block the prompt opened.
enum class ThinkFirst { No, Optional, Open };

/// GBNF text for one (or, `parallel`, several) calls to `tools` (OpenAI
/// shape), or only to the one named `only`. quern::Error for a format it
/// cannot force, no such tool, or a parameters schema it cannot compile
/// (naming the keyword).
std::string forced_tool_call_gbnf(ToolFormat f, const nlohmann::ordered_json& tools, const std::string& only,
                                  bool parallel, ThinkFirst think = ThinkFirst::No);

}  // namespace quern::server
