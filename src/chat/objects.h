// Host objects of the template engine: scopes, namespace(), functions, bound
// methods of str/list/dict values, macros and the `loop` variable.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/ast.h"
#include "chat/value.h"

namespace quern::jinja {

class Interp;

/// The variables of one running frame (see FrameDef); frames nest through
/// `parent` (the enclosing frame, or a macro's defining frame).
struct Frame {
    std::shared_ptr<Frame> parent;
    int level = 0;
    std::vector<Value> slots;

    /// The frame of `lvl` on this chain, or nullptr.
    Frame* at(int lvl) {
        Frame* f = this;
        while (f && f->level != lvl) f = f->parent.get();
        return f;
    }
};

/// jinja2's namespace(): the one object whose attributes templates may set.
class Namespace : public Object {
public:
    std::vector<std::pair<std::string, Value>> attrs;

    std::string type_name() const override { return "Namespace"; }
    std::string type_repr() const override { return "jinja2.utils.Namespace object"; }
    std::string repr() const override;
    Value getattr(const std::string& name) const override;
    void set(const std::string& name, Value v);
};

/// A builtin function or a method bound to its object.
class NativeFunction : public Object {
public:
    using Fn = std::function<Value(Interp&, CallArgs&)>;
    /// `type`: Python's type name ("function", "type", "builtin_function_or_method");
    /// `repr`: what Python prints for it (default "<built-in function NAME>").
    NativeFunction(std::string name, Fn fn, std::string type = "builtin_function_or_method", std::string repr = "")
        : name_(std::move(name)), type_(std::move(type)), repr_(std::move(repr)), fn_(std::move(fn)) {}
    std::string type_name() const override { return type_; }
    std::string repr() const override { return repr_.empty() ? "<built-in function " + name_ + ">" : repr_; }
    bool callable() const override { return true; }
    Value call(Interp& in, CallArgs& args) override { return fn_(in, args); }

private:
    std::string name_, type_, repr_;
    Fn fn_;
};

/// A method of a str/list/dict/number value (`s.strip`), called later.
class BoundMethod : public Object {
public:
    BoundMethod(Value self, std::string name) : self_(std::move(self)), name_(std::move(name)) {}
    std::string type_name() const override { return "builtin_function_or_method"; }
    std::string repr() const override;
    bool callable() const override { return true; }
    Value call(Interp& in, CallArgs& args) override;

private:
    Value self_;
    std::string name_;
};

/// A {% macro %} (or the caller of a {% call %} block) bound to its defining scope.
class Macro : public Object {
public:
    Macro(const Stmt* def, std::string name, std::shared_ptr<Frame> closure, Value caller = Value())
        : def_(def), name_(std::move(name)), closure_(std::move(closure)), caller_(std::move(caller)) {}
    std::string type_name() const override { return "Macro"; }
    std::string type_repr() const override { return "jinja2.runtime.Macro object"; }
    std::string repr() const override;
    Value getattr(const std::string& name) const override;
    bool callable() const override { return true; }
    Value call(Interp& in, CallArgs& args) override;

    const Stmt* def() const { return def_; }
    const std::string& name() const { return name_; }
    const std::shared_ptr<Frame>& closure() const { return closure_; }
    /// Drops the closure (ends reference cycles when a render finishes).
    void release() { closure_.reset(), caller_ = Value(); }

private:
    const Stmt* def_;
    std::string name_;
    std::shared_ptr<Frame> closure_;
    Value caller_;  // the `caller` macro of a call block, passed on
};

/// The `loop` variable of a for-loop. Items of a filtered loop (`for x in
/// xs if cond`) are found lazily, as jinja2's LoopContext does: only
/// loop.length, revindex, last and nextitem look ahead.
class LoopObject : public Object {
public:
    std::shared_ptr<std::vector<Value>> items;  // items found so far
    std::function<bool()> pull;                 // finds one more item (false at the end); null: all known
    bool done = false;
    /// Whether at least n items exist (finding more as needed).
    bool ensure(size_t n) {
        while (items->size() < n && !done)
            if (!pull || !pull()) done = true;
        return items->size() >= n;
    }
    int64_t index0 = 0;
    int64_t depth0 = 0;
    Value last_changed;
    bool changed_called = false;
    // recursive loops: how to run the loop again on other items
    const Stmt* stmt = nullptr;
    std::shared_ptr<Frame> frame;

    std::string type_name() const override { return "LoopContext"; }
    std::string type_repr() const override { return "jinja2.runtime.LoopContext object"; }
    std::string repr() const override;
    Value getattr(const std::string& name) const override;
    bool callable() const override { return stmt && stmt->recursive; }
    int64_t len() const override {
        const_cast<LoopObject*>(this)->ensure(SIZE_MAX);
        return static_cast<int64_t>(items->size());
    }
    Value call(Interp& in, CallArgs& args) override;
};

/// Calls a str/list/dict/int/float method by name; raises when absent.
Value call_method(Interp& in, const Value& self, const std::string& name, CallArgs& args);
/// Whether `name` is a method/attribute of self's Python type (what
/// getattr() finds before dict keys). `unsafe` is set for methods the
/// immutable sandbox forbids (list.append, dict.update, ...).
bool has_method(const Value& self, const std::string& name, bool& unsafe);
/// A non-callable attribute of a builtin value (int.real, ...), if any.
bool builtin_property(const Value& self, const std::string& name, Value& out);
/// The template globals (range, dict, namespace, raise_exception,
/// strftime_now, cycler, joiner, lipsum), or an undefined value.
Value lookup_global(const std::string& name);

}  // namespace quern::jinja
