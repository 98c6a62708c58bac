// The Jinja evaluator (see eval.h).
#include "chat/eval.h"

#include <algorithm>

#include "chat/filters.h"
#include "chat/objects.h"
#include "chat/ops.h"
#include "chat/pystr.h"

namespace quern::jinja {

struct Interp::DepthGuard {
    Interp& in;
    explicit DepthGuard(Interp& i) : in(i) {
        if (++in.depth_ > in.opts_.limits.max_depth) {
            --in.depth_;
            raise("RecursionError", "maximum recursion depth exceeded");
        }
    }
    ~DepthGuard() { --in.depth_; }
};

Interp::Interp(const Program& prog, const RenderOptions& opts) : prog_(prog), opts_(opts) {}

Interp::~Interp() {
    // Break the cycles scope -> macro -> scope and namespace -> namespace.
    for (auto& m : macros_) m->release();
    for (auto& l : loops_) l->scope.reset(), l->items.reset();
    for (auto& ns : namespaces_) {
        std::vector<std::pair<std::string, Value>> attrs;
        attrs.swap(ns->attrs);
    }
}

void Interp::step() {
    if (++steps_ > opts_.limits.max_steps)
        raise("TemplateRuntimeError", "template evaluation exceeded " + std::to_string(opts_.limits.max_steps) + " steps");
}

void Interp::charge(uint64_t n) {
    bytes_ += n;
    if (bytes_ > opts_.limits.max_bytes)
        raise("MemoryError", "template produced more than " + std::to_string(opts_.limits.max_bytes >> 20) +
                                 " MiB of strings and lists");
}

void Interp::emit(std::string& out, std::string_view text) {
    if (out.size() + text.size() > opts_.limits.max_output)
        raise("MemoryError", "template output exceeds " + std::to_string(opts_.limits.max_output >> 20) + " MiB");
    out.append(text);
}

std::string Interp::render(const Value& context) {
    auto root = std::make_shared<Scope>();
    if (context.is_dict())
        for (const auto& [k, v] : context.dict_data().items())
            if (k.is_string()) root->set(k.str(), v);
    auto top = std::make_shared<Scope>();
    top->parent = root;
    std::string out;
    exec(prog_.body, top, out);
    return out;
}

// ------------------------------------------------------------------ statements

Interp::Flow Interp::exec(const Body& body, const ScopeP& sc, std::string& out) {
    for (const auto& s : body) {
        const Flow f = exec_stmt(*s, sc, out);
        if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
}

std::string Interp::render_block(const Body& body, const ScopeP& parent) {
    auto child = std::make_shared<Scope>();
    child->parent = parent;
    std::string out;
    exec(body, child, out);
    return out;
}

Interp::Flow Interp::exec_stmt(const Stmt& s, const ScopeP& sc, std::string& out) {
    DepthGuard g(*this);
    step();
    try {
        switch (s.kind) {
            case StmtKind::Data: emit(out, s.text); break;
            case StmtKind::Output: {
                const Value v = eval(*s.expr, sc);
                if (v.is_string()) {
                    emit(out, v.str());
                } else {
                    std::string t;
                    append_str(t, v);
                    emit(out, t);
                }
                break;
            }
            case StmtKind::If:
                for (size_t i = 0; i < s.tests.size(); ++i)
                    if (truthy(eval(*s.tests[i], sc))) return exec(s.bodies[i], sc, out);
                return exec(s.else_body, sc, out);
            case StmtKind::For: {
                const Value it = eval(*s.expr, sc);
                exec_for(s, sc, out, iterate(it), 0);
                break;
            }
            case StmtKind::Set: assign(s.target, eval(*s.expr, sc), *sc); break;
            case StmtKind::SetBlock: {
                std::string text = render_block(s.body, sc);
                Value v(std::move(text));
                if (s.expr) v = eval_filter(*s.expr, sc, &v);
                assign(s.target, v, *sc);
                break;
            }
            case StmtKind::Macro: {
                auto m = std::make_shared<Macro>(&s, s.text, sc);
                macros_.push_back(m);
                sc->set(s.text, Value(std::static_pointer_cast<Object>(m)));
                break;
            }
            case StmtKind::CallBlock: {
                auto caller = std::make_shared<Macro>(&s, "caller", sc);
                macros_.push_back(caller);
                const Expr& call = *s.expr;
                Value callee = call.a->kind == ExprKind::Attr ? getattr(eval(*call.a->a, sc), call.a->name)
                                                               : eval(*call.a, sc);
                CallArgs args;
                eval_args(call.args, sc, args);
                args.kw.emplace_back("caller", Value(std::static_pointer_cast<Object>(caller)));
                const Value r = this->call(callee, args);
                if (r.is_string()) emit(out, r.str());
                else emit(out, to_str(r));
                break;
            }
            case StmtKind::FilterBlock: {
                Value body(render_block(s.body, sc));
                const Value r = eval_filter(*s.expr, sc, &body);
                emit(out, to_str(r));
                break;
            }
            case StmtKind::With: {
                auto child = std::make_shared<Scope>();
                child->parent = sc;
                for (const auto& [t, e] : s.withs) assign(t, eval(*e, sc), *child);
                return exec(s.body, child, out);
            }
            case StmtKind::Scope: {
                auto child = std::make_shared<Scope>();
                child->parent = sc;
                return exec(s.body, child, out);
            }
            case StmtKind::Break: return Flow::Break;
            case StmtKind::Continue: return Flow::Continue;
        }
    } catch (const TemplateError& e) {
        if (e.line() > 0) throw;
        throw e.located(s.line, s.col);
    }
    return Flow::Normal;
}

void Interp::exec_for(const Stmt& s, const ScopeP& sc, std::string& out, const std::vector<Value>& all,
                      int64_t depth0) {
    auto items = std::make_shared<std::vector<Value>>();
    if (s.cond) {
        for (const Value& v : all) {
            step();
            auto probe = std::make_shared<Scope>();
            probe->parent = sc;
            assign(s.target, v, *probe);
            if (truthy(eval(*s.cond, probe))) items->push_back(v);
        }
    } else {
        *items = all;
    }
    if (items->empty()) {
        auto child = std::make_shared<Scope>();
        child->parent = sc;
        exec(s.else_body, child, out);
        return;
    }
    auto loop = std::make_shared<LoopObject>();
    loop->items = items;
    loop->depth0 = depth0;
    if (s.recursive) {
        loop->stmt = &s;
        loop->scope = sc;
        loops_.push_back(loop);
    }
    const Value loop_value(std::static_pointer_cast<Object>(loop));
    for (size_t i = 0; i < items->size(); ++i) {
        loop->index0 = static_cast<int64_t>(i);
        auto child = std::make_shared<Scope>();
        child->parent = sc;
        assign(s.target, (*items)[i], *child);
        child->set("loop", loop_value);
        const Flow f = exec(s.body, child, out);
        if (f == Flow::Break) break;
    }
}

Value Interp::call_loop(LoopObject& loop, CallArgs& args) {
    if (args.pos.size() != 1 || !args.kw.empty()) type_error("loop() takes exactly one argument");
    if (!loop.stmt || !loop.scope) raise("TemplateRuntimeError", "the loop is not recursive");
    std::string out;
    exec_for(*loop.stmt, loop.scope, out, iterate(args.pos[0]), loop.depth0 + 1);
    return Value(std::move(out));
}

void Interp::assign(const Target& t, const Value& v, Scope& sc) {
    switch (t.kind) {
        case Target::Name: sc.set(t.name, v); return;
        case Target::NsAttr: {
            const Value* ns = sc.find(t.name);
            Value found = ns ? *ns : lookup_global(t.name);
            if (!found.is_object() || found.object().type_name() != "Namespace")
                raise("TemplateRuntimeError", "Cannot assign attribute on non-namespace object");
            static_cast<Namespace&>(found.object()).set(t.attr, v);
            return;
        }
        case Target::Tuple: {
            const std::vector<Value> parts = iterate(v);
            if (parts.size() < t.items.size())
                raise("ValueError", "not enough values to unpack (expected " + std::to_string(t.items.size()) +
                                        ", got " + std::to_string(parts.size()) + ")");
            if (parts.size() > t.items.size())
                raise("ValueError", "too many values to unpack (expected " + std::to_string(t.items.size()) + ")");
            for (size_t i = 0; i < parts.size(); ++i) assign(t.items[i], parts[i], sc);
            return;
        }
    }
}

// ------------------------------------------------------------------ macros

Value Interp::call_macro(Macro& m, CallArgs& args) {
    const Stmt& def = *m.def();
    if (call_depth_ >= opts_.limits.max_call_depth)
        raise("RecursionError", "maximum recursion depth exceeded (more than " +
                                    std::to_string(opts_.limits.max_call_depth) + " nested macro calls)");
    if (!m.closure()) raise("TemplateRuntimeError", "macro called after the render ended");
    auto sc = std::make_shared<Scope>();
    sc->parent = m.closure();
    const auto& params = def.params;
    const bool is_caller = def.kind == StmtKind::CallBlock;
    const std::string& mname = m.name();
    // positional
    std::vector<Value> extra;
    std::vector<bool> set(params.size(), false);
    for (size_t i = 0; i < args.pos.size(); ++i) {
        if (i < params.size()) {
            sc->set(params[i].name, args.pos[i]);
            set[i] = true;
        } else {
            extra.push_back(args.pos[i]);
        }
    }
    if (!extra.empty() && !def.uses_varargs && !is_caller)
        type_error("macro '" + mname + "' takes not more than " + std::to_string(params.size()) + " argument(s)");
    auto kwargs = std::make_shared<DictData>();
    Value caller;
    for (const auto& [k, v] : args.kw) {
        bool matched = false;
        for (size_t i = 0; i < params.size(); ++i) {
            if (params[i].name == k) {
                if (set[i]) type_error("macro '" + mname + "' got multiple values for argument '" + k + "'");
                sc->set(k, v);
                set[i] = true;
                matched = true;
                break;
            }
        }
        if (matched) continue;
        if (k == "caller" && def.uses_caller) {
            caller = v;
            continue;
        }
        if (!def.uses_kwargs) type_error("macro '" + mname + "' takes no keyword argument '" + k + "'");
        kwargs->set(Value(k), v);
    }
    for (size_t i = 0; i < params.size(); ++i) {
        if (set[i]) continue;
        if (params[i].def) sc->set(params[i].name, eval(*params[i].def, sc));
        else sc->set(params[i].name, Value::undefined("parameter '" + params[i].name + "' was not provided"));
    }
    if (def.uses_varargs) sc->set("varargs", Value::tuple(std::move(extra)));
    if (def.uses_kwargs) sc->set("kwargs", Value(std::move(kwargs)));
    if (def.uses_caller && !is_caller)
        sc->set("caller", caller.is_undefined() ? Value::undefined("No caller defined") : caller);
    ++call_depth_;
    std::string out;
    try {
        exec(def.body, sc, out);
    } catch (...) {
        --call_depth_;
        throw;
    }
    --call_depth_;
    return Value(std::move(out));
}

// ------------------------------------------------------------------ expressions

Value Interp::lookup(const std::string& name, const ScopeP& sc) {
    if (const Value* v = sc->find(name)) return *v;
    Value g = lookup_global(name);
    if (!g.is_undefined()) return g;
    return Value::undefined_name(name);
}

Value Interp::eval(const Expr& e, const ScopeP& sc) {
    DepthGuard g(*this);
    step();
    try {
        return eval_inner(e, sc);
    } catch (const TemplateError& err) {
        if (err.line() > 0) throw;
        throw err.located(e.line, e.col);
    }
}

void Interp::eval_args(const Args& a, const ScopeP& sc, CallArgs& out) {
    for (const auto& p : a.pos) out.pos.push_back(eval(*p, sc));
    for (const auto& [k, p] : a.kw) out.kw.emplace_back(k, eval(*p, sc));
    if (a.star) {
        for (Value& v : iterate(eval(*a.star, sc))) out.pos.push_back(std::move(v));
    }
    if (a.starstar) {
        const Value d = eval(*a.starstar, sc);
        if (!d.is_dict()) type_error("argument after ** must be a mapping, not " + type_name(d));
        for (const auto& [k, v] : d.dict_data().items()) {
            if (!k.is_string()) type_error("keywords must be strings");
            out.kw.emplace_back(k.str(), v);
        }
    }
}

Value Interp::eval_filter(const Expr& e, const ScopeP& sc, const Value* input) {
    Value v = e.a ? (e.a->kind == ExprKind::Filter ? eval_filter(*e.a, sc, input) : eval(*e.a, sc))
                  : (input ? *input : Value());
    CallArgs args;
    eval_args(e.args, sc, args);
    try {
        return filter(e.name, v, args);
    } catch (const TemplateError& err) {
        if (err.line() > 0) throw;
        throw err.located(e.line, e.col);
    }
}

Value Interp::eval_call(const Expr& e, const ScopeP& sc) {
    const Expr& fn = *e.a;
    if (fn.kind == ExprKind::Attr) {
        const Value obj = eval(*fn.a, sc);
        bool unsafe = false;
        if (!obj.is_object() && !obj.is_undefined() && has_method(obj, fn.name, unsafe) && !unsafe) {
            CallArgs args;
            eval_args(e.args, sc, args);
            return call_method(*this, obj, fn.name, args);
        }
        const Value callee = getattr(obj, fn.name);
        CallArgs args;
        eval_args(e.args, sc, args);
        return call(callee, args);
    }
    const Value callee = eval(fn, sc);
    CallArgs args;
    eval_args(e.args, sc, args);
    return call(callee, args);
}

Value Interp::call(const Value& callee, CallArgs& args) {
    if (callee.is_object() && callee.object().callable()) return callee.object().call(*this, args);
    if (callee.is_undefined()) callee.fail_undefined();
    type_error("'" + type_name(callee) + "' object is not callable");
}

Value Interp::eval_inner(const Expr& e, const ScopeP& sc) {
    switch (e.kind) {
        case ExprKind::Const: return e.value;
        case ExprKind::Name: return lookup(e.name, sc);
        case ExprKind::List:
        case ExprKind::Tuple: {
            std::vector<Value> items;
            items.reserve(e.items.size());
            for (const auto& i : e.items) items.push_back(eval(*i, sc));
            charge(16 * items.size());
            return e.kind == ExprKind::List ? Value::list(std::move(items)) : Value::tuple(std::move(items));
        }
        case ExprKind::Dict: {
            auto d = std::make_shared<DictData>();
            for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
                Value k = eval(*e.items[i], sc);
                if (k.is_list() || k.is_dict()) type_error("unhashable type: '" + type_name(k) + "'");
                d->set(k, eval(*e.items[i + 1], sc));
            }
            charge(32 * d->size());
            return Value(std::move(d));
        }
        case ExprKind::Attr: return getattr(eval(*e.a, sc), e.name);
        case ExprKind::Item: return getitem(eval(*e.a, sc), eval(*e.b, sc));
        case ExprKind::Slice: {
            const Value obj = eval(*e.a, sc);
            Value parts[3] = {Value::none(), Value::none(), Value::none()};
            for (size_t i = 0; i < 3 && i < e.items.size(); ++i)
                if (e.items[i]) parts[i] = eval(*e.items[i], sc);
            if (obj.is_undefined()) obj.fail_undefined();
            if (!obj.is_string() && !obj.is_sequence_list()) {
                auto show = [](const Value& v) { return v.is_none() ? std::string("None") : repr(v); };
                return Value::undefined(object_type_repr(obj) + " has no element slice(" + show(parts[0]) + ", " +
                                        show(parts[1]) + ", " + show(parts[2]) + ")");
            }
            return slice(*this, obj, parts[0], parts[1], parts[2]);
        }
        case ExprKind::Call: return eval_call(e, sc);
        case ExprKind::Filter: return eval_filter(e, sc, nullptr);
        case ExprKind::Test: {
            const Value v = eval(*e.a, sc);
            CallArgs args;
            eval_args(e.args, sc, args);
            return Value(test(e.name, v, args));
        }
        case ExprKind::Not: return Value(!truthy(eval(*e.a, sc)));
        case ExprKind::Neg:
        case ExprKind::Pos: return negate(eval(*e.a, sc), e.kind == ExprKind::Neg);
        case ExprKind::Binary: {
            if (e.name == "and") {
                Value l = eval(*e.a, sc);
                return truthy(l) ? eval(*e.b, sc) : l;
            }
            if (e.name == "or") {
                Value l = eval(*e.a, sc);
                return truthy(l) ? l : eval(*e.b, sc);
            }
            const Value l = eval(*e.a, sc);
            const Value r = eval(*e.b, sc);
            if (e.name == "~") {
                std::string s = to_str(l);
                append_str(s, r);
                charge(s.size());
                if (s.size() > opts_.limits.max_output) raise("MemoryError", "string too large");
                return Value(std::move(s));
            }
            return binary_op(*this, e.name, l, r);
        }
        case ExprKind::Compare: {
            Value left = eval(*e.items[0], sc);
            for (size_t i = 0; i < e.ops.size(); ++i) {
                Value right = eval(*e.items[i + 1], sc);
                const std::string& op = e.ops[i];
                bool ok;
                if (op == "==") ok = equals(left, right);
                else if (op == "!=") ok = !equals(left, right);
                else if (op == "<") ok = compare(left, right, "<") == -1;
                else if (op == ">") ok = compare(left, right, ">") == 1;
                else if (op == "<=") {
                    const int c = compare(left, right, "<=");
                    ok = c == -1 || c == 0;
                } else if (op == ">=") {
                    const int c = compare(left, right, ">=");
                    ok = c == 1 || c == 0;
                }
                else if (op == "in") ok = contains(right, left);
                else ok = !contains(right, left);
                if (!ok) return Value(false);
                left = std::move(right);
            }
            return Value(true);
        }
        case ExprKind::Cond: {
            if (truthy(eval(*e.b, sc))) return eval(*e.a, sc);
            if (e.c) return eval(*e.c, sc);
            return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                                    " evaluated to false and no else section was defined.");
        }
    }
    return Value();
}

// ------------------------------------------------------------------ attribute access

Value Interp::getattr(const Value& obj, const std::string& name) {
    if (obj.is_undefined()) obj.fail_undefined();
    if (obj.is_object()) return obj.object().getattr(name);
    bool unsafe = false;
    if (has_method(obj, name, unsafe)) {
        if (unsafe)
            return Value::undefined("access to attribute " + str_repr(name) + " of " + str_repr(type_name(obj)) +
                                        " object is unsafe.",
                                    "SecurityError");
        return Value(std::static_pointer_cast<Object>(std::make_shared<BoundMethod>(obj, name)));
    }
    Value prop;
    if (builtin_property(obj, name, prop)) return prop;
    if (obj.is_dict())
        if (const Value* v = obj.dict_data().find(std::string_view(name))) return *v;
    return Value::undefined(str_repr(object_type_repr(obj)) + " has no attribute " + str_repr(name));
}

Value Interp::getitem(const Value& obj, const Value& key) {
    switch (obj.kind()) {
        case Kind::Undefined: obj.fail_undefined();
        case Kind::String:
            if (key.is_int() || key.is_bool()) {
                const std::string& s = obj.str();
                int64_t i = key.as_int();
                const int64_t n = static_cast<int64_t>(pystr::length(s));
                if (i < 0) i += n;
                if (i >= 0 && i < n) {
                    const size_t b = pystr::byte_offset(s, static_cast<size_t>(i));
                    size_t e = b;
                    pystr::next_cp(s, e);
                    return Value(s.substr(b, e - b));
                }
            }
            break;
        case Kind::List:
            if ((key.is_int() || key.is_bool()) && obj.is_sequence_list()) {
                const auto& items = obj.items();
                int64_t i = key.as_int();
                const int64_t n = static_cast<int64_t>(items.size());
                if (i < 0) i += n;
                if (i >= 0 && i < n) return items[static_cast<size_t>(i)];
            }
            break;
        case Kind::Dict:
            if (!key.is_list() && !key.is_dict())
                if (const Value* v = obj.dict_data().find(key)) return *v;
            break;
        case Kind::Object:
            if (obj.object().type_name() == "Namespace" && key.is_string()) {
                const Value v = obj.object().getattr(key.str());
                if (!v.is_undefined()) return v;
            }
            break;
        default: break;
    }
    if (key.is_string()) {
        bool unsafe = false;
        if (!obj.is_object() && has_method(obj, key.str(), unsafe)) return getattr(obj, key.str());
        Value prop;
        if (!obj.is_object() && builtin_property(obj, key.str(), prop)) return prop;
        if (obj.is_object() && obj.object().type_name() != "Namespace") {
            const Value v = obj.object().getattr(key.str());
            if (!v.is_undefined()) return v;
        }
        return Value::undefined(str_repr(object_type_repr(obj)) + " has no attribute " + str_repr(key.str()));
    }
    return Value::undefined(object_type_repr(obj) + " has no element " + repr(key));
}

// ------------------------------------------------------------------ filters and tests

Value Interp::filter(const std::string& name, const Value& v, CallArgs& args) {
    step();
    return apply_filter(*this, name, v, args);
}

bool Interp::test(const std::string& name, const Value& v, CallArgs& args) {
    step();
    return apply_test(*this, name, v, args);
}

// ------------------------------------------------------------------ objects needing the interpreter

Value Macro::call(Interp& in, CallArgs& args) { return in.call_macro(*this, args); }

Value LoopObject::call(Interp& in, CallArgs& args) { return in.call_loop(*this, args); }

}  // namespace quern::jinja
