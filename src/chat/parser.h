// Jinja parser: tokens to a syntax tree, following jinja2's grammar and
// operator precedence (condexpr < or < and < not < comparisons < + - < ~ <
// * / // % < ** < unary - + < filters, tests and calls < postfix . [] ()).
#pragma once
#include <string_view>

#include "chat/ast.h"
#include "chat/lexer.h"

namespace quern::jinja {

/// Limits that keep parsing a hostile template cheap.
struct ParseLimits {
    int max_depth = 200;  // nesting of expressions and blocks
};

/// Parses a template. Throws TemplateError (TemplateSyntaxError, or
/// TemplateAssertionError for an unknown filter/test outside if-blocks, as
/// jinja2 does at compile time) with line and column.
Program parse(std::string_view source, const LexOptions& lex = {}, const ParseLimits& limits = {});

}  // namespace quern::jinja
