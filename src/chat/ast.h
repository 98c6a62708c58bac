// Syntax tree of a parsed Jinja template (made by parser.cpp, run by eval.cpp).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/value.h"

namespace quern::jinja {

/// Expression node kinds.
enum class ExprKind : uint8_t {
    Const,    // value
    Name,     // name
    List,     // items
    Tuple,    // items
    Dict,     // items (key, value alternating)
    Attr,     // a.name
    Item,     // a[b]
    Slice,    // a[b:c:d] (null parts omitted)
    Call,     // a(args)
    Filter,   // a|name(args); a is null inside {% filter %}
    Test,     // a is name(args)
    Not,      // not a
    Neg,      // -a
    Pos,      // +a
    Binary,   // a op b: + - * / // % ** ~ and or
    Compare,  // a op b op c ... (ops in names)
    Cond,     // a if b else c
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

/// Arguments of a call, filter or test.
struct Args {
    std::vector<ExprPtr> pos;
    std::vector<std::pair<std::string, ExprPtr>> kw;
    ExprPtr star;      // *args
    ExprPtr starstar;  // **kwargs
};

/// An expression. Which fields are used depends on `kind` (see ExprKind).
struct Expr {
    ExprKind kind;
    int line = 0, col = 0;
    std::string name;                // Name, Attr, Filter, Test, Binary operator
    Value value;                     // Const
    ExprPtr a, b, c;                 // operands
    std::vector<ExprPtr> items;      // List, Tuple, Dict, Compare operands
    std::vector<std::string> ops;    // Compare operators
    Args args;                       // Call, Filter, Test
    bool soft = false;               // Filter/Test inside if/condexpr: unknown names fail at run time
};

/// Statement node kinds.
enum class StmtKind : uint8_t {
    Data,      // text
    Output,    // {{ expr }}
    If,        // tests/bodies, else_body
    For,
    Set,       // target = expr
    SetBlock,  // {% set target %}body{% endset %}, optional filter
    Macro,
    CallBlock,
    FilterBlock,
    With,
    Break,
    Continue,
    Scope,     // a body run in its own scope ({% generation %})
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

/// An assignment target: a name, ns.attr, or a tuple of targets.
struct Target {
    enum Kind : uint8_t { Name, NsAttr, Tuple } kind = Name;
    std::string name, attr;
    std::vector<Target> items;
};

/// A macro parameter with its optional default.
struct Param {
    std::string name;
    ExprPtr def;
};

/// A statement. Which fields are used depends on `kind`.
struct Stmt {
    StmtKind kind;
    int line = 0, col = 0;
    std::string text;                   // Data; Macro name
    ExprPtr expr;                       // Output, Set, For iterable, CallBlock call, SetBlock/FilterBlock filter
    ExprPtr cond;                       // For filter (`if`)
    std::vector<ExprPtr> tests;         // If: one test per branch
    std::vector<Body> bodies;           // If: one body per branch
    Body body, else_body;               // For/Macro/CallBlock/FilterBlock/With/Scope/SetBlock bodies
    Target target;                      // Set, SetBlock, For
    std::vector<Param> params;          // Macro, CallBlock
    std::vector<std::pair<Target, ExprPtr>> withs;  // With assignments
    bool recursive = false;             // For
    bool uses_caller = false, uses_varargs = false, uses_kwargs = false;  // Macro/CallBlock bodies
};

/// A parsed template.
struct Program {
    Body body;
};

}  // namespace quern::jinja
