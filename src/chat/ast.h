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

/// How a frame slot is initialised when the frame is entered (jinja2's
/// symbol load instructions): a parameter set by the caller, a lookup in the
/// render context, a copy of an enclosing frame's variable, or "missing"
/// (undefined until assigned).
struct SlotInit {
    enum Kind : uint8_t { Param, Resolve, Alias, Missing } kind = Missing;
    std::string name;
    int alias_level = -1, alias_slot = -1;
};

/// The variables of one frame (template body, loop body, macro, block...),
/// found by static analysis exactly as jinja2's compiler finds them.
struct FrameDef {
    int level = 0;
    std::vector<SlotInit> slots;
};

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
    int level = -1, slot = -1;       // Name: the frame variable it reads (-1: look up in the context)
    int depth = 1;                   // height of this subtree (bounded by the parser)
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
    int level = -1, slot = -1;  // Name/NsAttr: the frame variable written (NsAttr: read)
};

/// A macro parameter with its optional default.
struct Param {
    std::string name;
    ExprPtr def;
    int slot = -1;
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
    Target target;                      // Set, SetBlock, For (Macro: its name)
    Target test_target;                 // For with a filter: the target in the test frame
    std::vector<Param> params;          // Macro, CallBlock
    std::vector<std::pair<Target, ExprPtr>> withs;  // With assignments
    bool recursive = false;             // For
    bool uses_caller = false, uses_varargs = false, uses_kwargs = false;  // Macro/CallBlock bodies
    // frames (see FrameDef): For body/test/else; Macro, CallBlock, FilterBlock,
    // With, SetBlock and Scope bodies use `frame`
    FrameDef frame, test_frame, else_frame;
    int loop_slot = -1;                 // For: the `loop` variable (when the body uses it)
    int caller_slot = -1, varargs_slot = -1, kwargs_slot = -1;  // Macro/CallBlock
    bool toplevel = false;              // Set/SetBlock/Macro in the template's top frame
    bool isolated = false;              // Scope of a {% block %}: no enclosing frame
};

/// A parsed template.
struct Program {
    Body body;
    FrameDef frame;
};

/// Resolves every variable of a parsed program to a frame slot, following
/// jinja2's compiler (idtracking): a name assigned anywhere in a frame is
/// that frame's variable for the whole frame; it starts as the enclosing
/// frame's value or the context's (when read before being assigned) or as
/// undefined.
void resolve_symbols(Program& prog);

}  // namespace quern::jinja
