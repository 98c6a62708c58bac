// Jinja lexer: template source to tokens, with jinja2's whitespace control.
//
// The source is first normalised as jinja2 does (\r\n and \r become \n; one
// trailing newline is dropped unless keep_trailing_newline). Then text outside
// tags becomes Data tokens and {{ }} / {% %} become Begin ... End token runs;
// comments produce nothing. Whitespace control follows jinja2 exactly:
//   - "{%-", "{{-", "{#-" strip all whitespace (Python's str.isspace set)
//     before the tag; "-%}", "-}}", "-#}" strip all whitespace after it;
//   - trim_blocks removes one newline right after "%}" or "#}" ("+%}" keeps it);
//   - lstrip_blocks removes spaces/tabs between the start of a line and "{%"
//     or "{#" ("{%+" keeps them), not before "{{".
// {% raw %}...{% endraw %} content is one Data token.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace quern::jinja {

/// Token kinds of the Jinja lexer.
enum class Tok : uint8_t {
    Data,        // template text
    VarBegin,    // {{
    VarEnd,      // }}
    BlockBegin,  // {%
    BlockEnd,    // %}
    Name,
    String,      // value: the unescaped text
    Int,         // value: decimal digits of the value (underscores removed, base converted)
    Float,       // value: the literal without underscores
    Op,          // value: the operator text (e.g. "==", "(", "|")
    Eof,
};

/// One token with its 1-based source position.
struct Token {
    Tok kind;
    std::string value;
    int line = 1, col = 1;
};

/// Lexer settings (Hugging Face's chat-template settings by default).
struct LexOptions {
    bool trim_blocks = true;
    bool lstrip_blocks = true;
    bool keep_trailing_newline = false;
};

/// Tokenizes a template; throws TemplateError("TemplateSyntaxError", ...) with
/// the line and column of the problem.
std::vector<Token> tokenize(std::string_view source, const LexOptions& opts);

}  // namespace quern::jinja
