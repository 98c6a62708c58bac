// The Jinja evaluator: runs a parsed template over a context of values.
//
// Scoping follows jinja2: {% set %} writes the innermost scope; every for-loop
// iteration, macro call, call/filter/with/set block runs in a fresh child
// scope (assignments there never leak out; namespace() objects carry state
// across), while if-blocks share their enclosing scope. Macros see the scope
// they were defined in, as it is at call time.
//
// Everything a template does is bounded (RenderLimits): evaluation steps,
// bytes of strings/lists produced, output size, recursion and macro call
// depth. A template cannot reach files, the environment or the clock except
// through strftime_now().
#pragma once
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <chrono>

#include "chat/ast.h"
#include "chat/value.h"

namespace quern::jinja {

/// Resource bounds for one render (errors name the limit that was hit).
struct RenderLimits {
    uint64_t max_steps = 10'000'000;    // expression/statement evaluations
    uint64_t max_bytes = 1ull << 30;    // total bytes of strings and list slots produced
    size_t max_output = 32ull << 20;    // bytes of rendered text (also per macro call / block)
    int max_depth = 600;                // nested evaluation frames (recursion)
    int max_call_depth = 60;            // nested macro calls
    double max_seconds = 5;             // wall-clock time of the whole render
};

/// Settings of a render.
struct RenderOptions {
    RenderLimits limits;
    /// The time strftime_now() formats (local time); unset: the current time.
    std::optional<std::tm> now;
};

struct Frame;
class Namespace;
class Macro;
class LoopObject;

/// Runs renders of one Program (which must outlive it). Not thread-safe:
/// use one Interp per thread; the Program may be shared.
class Interp {
public:
    Interp(const Program& prog, const RenderOptions& opts);
    ~Interp();
    Interp(const Interp&) = delete;
    Interp& operator=(const Interp&) = delete;

    /// Renders with `context` (a dict of top-level variables).
    std::string render(const Value& context);

    // ---- services for filters, methods and host objects
    /// Calls a callable value (macro, function, bound method).
    Value call(const Value& callee, CallArgs& args);
    /// Applies filter `name` (TemplateRuntimeError "No filter named 'x' found." when unknown).
    Value filter(const std::string& name, const Value& v, CallArgs& args);
    /// Applies test `name`.
    bool test(const std::string& name, const Value& v, CallArgs& args);
    /// jinja2's sandboxed getattr(obj, name) and getitem(obj, key).
    Value getattr(const Value& obj, const std::string& name);
    Value getitem(const Value& obj, const Value& key);
    /// Counts one unit of work; raises when the step budget is spent.
    void step();
    /// Counts `n` bytes produced; raises when the byte budget is spent.
    void charge(uint64_t n);
    const RenderOptions& options() const { return opts_; }
    /// Keeps a namespace until the render ends, when its attributes are
    /// cleared (breaking reference cycles between namespaces).
    void adopt(const std::shared_ptr<Namespace>& ns) { namespaces_.push_back(ns); }

    // ---- used by Macro and LoopObject
    Value call_macro(Macro& m, CallArgs& args);
    Value call_loop(LoopObject& loop, CallArgs& args);

private:
    enum class Flow { Normal, Break, Continue };
    using FrameP = std::shared_ptr<Frame>;

    Flow exec(const Body& body, const FrameP& fr, std::string& out);
    Flow exec_stmt(const Stmt& s, const FrameP& fr, std::string& out);
    void exec_for(const Stmt& s, const FrameP& fr, std::string& out, const std::vector<Value>& items, int64_t depth0);
    /// A new frame for `def` inside `parent`, its variables initialised.
    FrameP enter(const FrameDef& def, const FrameP& parent);
    /// The context's value of a name (top-level assignments, render
    /// variables, globals), or missing.
    Value resolve(const std::string& name) const;
    void assign(const Target& t, const Value& v, Frame& fr);
    void export_target(const Target& t, Frame& fr);
    Value check_namespace(const Target& t, Frame& fr);
    Value eval(const Expr& e, const FrameP& fr);
    Value eval_inner(const Expr& e, const FrameP& fr);
    Value eval_call(const Expr& e, const FrameP& fr);
    Value eval_filter(const Expr& e, const FrameP& fr, const Value* input);
    void eval_args(const Args& a, const FrameP& fr, CallArgs& out);
    void emit(std::string& out, std::string_view text);

    struct DepthGuard;

    const Program& prog_;
    RenderOptions opts_;
    uint64_t steps_ = 0, bytes_ = 0;
    std::chrono::steady_clock::time_point deadline_;  // start + max_seconds
    int depth_ = 0, call_depth_ = 0;
    Value context_;                                        // the render variables (a dict)
    std::unordered_map<std::string, Value> exported_;      // top-level assignments
    std::vector<std::shared_ptr<Namespace>> namespaces_;
    std::vector<std::shared_ptr<Macro>> macros_;
    std::vector<std::shared_ptr<LoopObject>> loops_;
};

}  // namespace quern::jinja
