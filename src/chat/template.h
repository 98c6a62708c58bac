// quern's Jinja template engine: the public entry point.
//
// Renders chat templates exactly as Python's jinja2 does with the settings
// Hugging Face uses for apply_chat_template (ImmutableSandboxedEnvironment,
// trim_blocks, lstrip_blocks, loopcontrols, a {% generation %} block,
// raise_exception(), strftime_now(), and a tojson filter with ensure_ascii,
// indent, separators and sort_keys). Templates are treated as untrusted data:
// they cannot reach files or the environment, and every render is bounded in
// time, memory, output and recursion (RenderLimits); anything unsupported or
// wrong raises TemplateError with a line and column.
//
//   jinja::Template t(source);                 // parse once
//   std::string s = t.render(jinja::from_json(ctx));  // render many times
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "chat/eval.h"
#include "chat/lexer.h"
#include "chat/parser.h"
#include "chat/value.h"

namespace quern::jinja {

/// Settings for parsing a template.
struct TemplateOptions {
    LexOptions lex;      // trim_blocks / lstrip_blocks / keep_trailing_newline
    ParseLimits parse;   // nesting bound
};

/// A parsed template. Immutable; render() may be called from several threads.
class Template {
public:
    /// Parses `source`; throws TemplateError (with line and column) on syntax errors.
    explicit Template(std::string_view source, const TemplateOptions& opts = {});
    /// Renders with the variables of `context` (a dict value).
    std::string render(const Value& context, const RenderOptions& opts = {}) const;

private:
    std::shared_ptr<const Program> prog_;
};

/// Converts JSON (keys in document order) to template values: objects become
/// dicts, arrays lists, numbers int or float as Python's json module reads them.
Value from_json(const nlohmann::ordered_json& j);

}  // namespace quern::jinja
