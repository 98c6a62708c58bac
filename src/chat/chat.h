// Chat formatting: a conversation (messages, tools, options) to the prompt
// text a model was trained on, through the model's Jinja chat template.
//
// Messages are JSON objects as in the OpenAI / Hugging Face format:
//   {"role": "system"|"user"|"assistant"|"tool", "content": "text" or
//    [{"type": "text", "text": "..."}, ...], "tool_calls": [...],
//    "tool_call_id": "...", "name": "...", "reasoning_content": "..."}
// and are passed to the template unchanged (key order kept), exactly as
// transformers' apply_chat_template passes them: the variables are
// messages, tools (none when absent), documents (none),
// add_generation_prompt, bos_token, eos_token, plus any extra variables
// (enable_thinking, ...).
//
// Where a model file has no template, a built-in one stands in (chatml,
// llama2, llama3, mistral, gemma, phi3), chosen by name or guessed from the
// vocabulary's special tokens.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/template.h"

namespace quern {

class GgufFile;
class Tokenizer;

namespace chat {

using Json = nlohmann::ordered_json;

/// What to render besides the messages.
struct ChatOptions {
    bool add_generation_prompt = true;
    Json tools;                          // array of tool schemas, or null
    Json extra = Json::object();         // more template variables (enable_thinking, ...)
    std::optional<std::tm> now;          // strftime_now() time (default: now)
};

/// Names of the built-in templates.
const std::vector<std::string>& builtin_template_names();
/// The Jinja source of a built-in template, or nullopt for an unknown name.
std::optional<std::string> builtin_template(std::string_view name);
/// The built-in template whose special tokens the vocabulary has
/// (<|im_start|> -> chatml, <|eot_id|> -> llama3, ...); "chatml" when none.
std::string guess_builtin_template(const Tokenizer& tok);

/// A chat template with the special tokens it is rendered with.
class ChatTemplate {
public:
    /// Parses `source` (throws jinja::TemplateError with line/column on
    /// syntax errors, naming `origin` first unless it is the default).
    /// `origin` names where the template came from (a file name, ...).
    ChatTemplate(std::string source, std::string bos_token, std::string eos_token, std::string origin = "template");

    /// The template for a model: `file_path` (a Jinja file) when given, else
    /// the built-in `name` when given (a GGUF may also carry named templates
    /// as tokenizer.chat_template.NAME; those win), else the GGUF's
    /// tokenizer.chat_template, else a built-in guessed from the vocabulary.
    /// BOS/EOS text comes from the tokenizer.
    static ChatTemplate for_model(const GgufFile& f, const Tokenizer& tok, const std::string& name = "",
                                  const std::string& file_path = "");
    /// The model's templates by name ("" for the default one); returns ""
    /// when the model has no such template.
    using TemplateLookup = std::function<std::string(const std::string& name)>;
    /// As for_model, with the model's templates from `lookup` instead of a
    /// GGUF file (a Hugging Face folder's tokenizer_config.json chat_template).
    /// `where` names the model's templates in origin() ("tokenizer.chat_template"
    /// for GGUF).
    static ChatTemplate for_model(const TemplateLookup& lookup, const std::string& where, const Tokenizer& tok,
                                  const std::string& name = "", const std::string& file_path = "");

    /// Renders a conversation to prompt text. Throws jinja::TemplateError
    /// (e.g. a template's raise_exception) with jinja2's message.
    std::string apply(const Json& messages, const ChatOptions& opts = {}) const;

    /// More special-token variables a model provides (unk_token, pad_token),
    /// as Hugging Face passes every special token to the template.
    void set_special_tokens(Json specials) { specials_ = std::move(specials); }
    const Json& special_tokens() const { return specials_; }

    const std::string& source() const { return source_; }
    const std::string& origin() const { return origin_; }
    const std::string& bos_token() const { return bos_; }
    const std::string& eos_token() const { return eos_; }

private:
    static ChatTemplate for_model_source(const TemplateLookup& lookup, const std::string& where,
                                         const Tokenizer& tok, const std::string& name,
                                         const std::string& file_path);
    std::string source_, bos_, eos_, origin_;
    Json specials_ = Json::object();
    jinja::Template tmpl_;
};


/// Parses "YYYY-MM-DD" or "YYYY-MM-DDTHH:MM:SS" into a calendar time for
/// ChatOptions::now (weekday and day of year filled in); nullopt if malformed.
std::optional<std::tm> parse_time(std::string_view iso);

/// The BOS/EOS token text of a tokenizer ("" when it has none).
std::string bos_text(const Tokenizer& tok);
std::string eos_text(const Tokenizer& tok);

}  // namespace chat
}  // namespace quern
