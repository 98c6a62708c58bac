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

Interp::Interp(const Program& prog, const RenderOptions& opts)
    : prog_(prog), opts_(opts),
      deadline_(std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                    std::chrono::duration<double>(opts.limits.max_seconds))) {}

Interp::~Interp() {
    // Break the cycles scope -> macro -> scope and namespace -> namespace.
    for (auto& m : macros_) m->release();
    for (auto& l : loops_) l->frame.reset(), l->pull = nullptr;
    for (auto& ns : namespaces_) {
        std::vector<std::pair<std::string, Value>> attrs;
        attrs.swap(ns->attrs);
    }
}

void Interp::step() {
    if (++steps_ > opts_.limits.max_steps)
        raise("TemplateRuntimeError", "template evaluation exceeded " + std::to_string(opts_.limits.max_steps) + " steps");
    // The clock every 1024 steps: a step is a fraction of a microsecond,
    // but one (a filter over a long string) can take far longer.
    if ((steps_ & 1023) == 0 && std::chrono::steady_clock::now() > deadline_)
        raise("TemplateRuntimeError", "template evaluation took longer than " +
                                          std::to_string(static_cast<int>(opts_.limits.max_seconds)) + " s");
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
    context_ = context;
    exported_.clear();
    const FrameP root = enter(prog_.frame, nullptr);
    std::string out;
    exec(prog_.body, root, out);
    return out;
}

Value Interp::resolve(const std::string& name) const {
    if (const auto it = exported_.find(name); it != exported_.end()) return it->second;
    if (context_.is_dict())
        if (const Value* v = context_.dict_data().find(std::string_view(name))) return *v;
    Value g = lookup_global(name);
    return g.is_undefined() ? Value::missing() : g;
}

Interp::FrameP Interp::enter(const FrameDef& def, const FrameP& parent) {
    auto f = std::make_shared<Frame>();
    f->parent = parent;
    f->level = def.level;
    f->slots.assign(def.slots.size(), Value::missing());
    for (size_t i = 0; i < def.slots.size(); ++i) {
        const SlotInit& s = def.slots[i];
        if (s.kind == SlotInit::Resolve) {
            f->slots[i] = resolve(s.name);
        } else if (s.kind == SlotInit::Alias && parent) {
            Frame* o = parent->at(s.alias_level);
            if (o && s.alias_slot >= 0 && static_cast<size_t>(s.alias_slot) < o->slots.size()) f->slots[i] = o->slots[s.alias_slot];
        }
    }
    return f;
}

// ------------------------------------------------------------------ statements

Interp::Flow Interp::exec(const Body& body, const FrameP& fr, std::string& out) {
    for (const auto& s : body) {
        const Flow f = exec_stmt(*s, fr, out);
        if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
}

Interp::Flow Interp::exec_stmt(const Stmt& s, const FrameP& fr, std::string& out) {
    DepthGuard g(*this);
    step();
    try {
        switch (s.kind) {
            case StmtKind::Data: emit(out, s.text); break;
            case StmtKind::Output: {
                const Value v = eval(*s.expr, fr);
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
                    if (truthy(eval(*s.tests[i], fr))) return exec(s.bodies[i], fr, out);
                return exec(s.else_body, fr, out);
            case StmtKind::For: {
                const Value it = eval(*s.expr, fr);
                exec_for(s, fr, out, iterate(it), 0);
                break;
            }
            case StmtKind::Set: {
                if (s.target.kind == Target::NsAttr) check_namespace(s.target, *fr);  // jinja2 checks first
                const Value v = eval(*s.expr, fr);
                assign(s.target, v, *fr);
                if (s.toplevel) export_target(s.target, *fr);
                break;
            }
            case StmtKind::SetBlock: {
                const FrameP bf = enter(s.frame, fr);
                std::string text;
                exec(s.body, bf, text);
                Value v(std::move(text));
                if (s.expr) v = eval_filter(*s.expr, bf, &v);
                assign(s.target, v, *fr);
                if (s.toplevel) export_target(s.target, *fr);
                break;
            }
            case StmtKind::Macro: {
                auto m = std::make_shared<Macro>(&s, s.text, fr);
                macros_.push_back(m);
                assign(s.target, Value(std::static_pointer_cast<Object>(m)), *fr);
                if (s.toplevel) export_target(s.target, *fr);
                break;
            }
            case StmtKind::CallBlock: {
                auto caller = std::make_shared<Macro>(&s, "caller", fr);
                macros_.push_back(caller);
                const Expr& call = *s.expr;
                Value callee = call.a->kind == ExprKind::Attr ? getattr(eval(*call.a->a, fr), call.a->name)
                                                               : eval(*call.a, fr);
                CallArgs args;
                eval_args(call.args, fr, args);
                args.kw.emplace_back("caller", Value(std::static_pointer_cast<Object>(caller)));
                const Value r = this->call(callee, args);
                if (r.is_string()) emit(out, r.str());
                else emit(out, to_str(r));
                break;
            }
            case StmtKind::FilterBlock: {
                const FrameP ff = enter(s.frame, fr);
                std::string text;
                exec(s.body, ff, text);
                const Value body(std::move(text));
                const Value r = eval_filter(*s.expr, ff, &body);
                emit(out, to_str(r));
                break;
            }
            case StmtKind::With: {
                std::vector<Value> vals;
                for (const auto& w : s.withs) vals.push_back(eval(*w.second, fr));
                const FrameP wf = enter(s.frame, fr);
                for (size_t i = 0; i < vals.size(); ++i) assign(s.withs[i].first, vals[i], *wf);
                return exec(s.body, wf, out);
            }
            case StmtKind::Scope: {
                const FrameP sf = enter(s.frame, s.isolated ? nullptr : fr);
                exec(s.body, sf, out);
                break;
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

void Interp::exec_for(const Stmt& s, const FrameP& fr, std::string& out, const std::vector<Value>& all,
                      int64_t depth0) {
    auto loop = std::make_shared<LoopObject>();
    loop->items = std::make_shared<std::vector<Value>>();
    loop->depth0 = depth0;
    if (s.cond) {
        // filtered lazily, item by item, as jinja2's loop filter generator does
        auto source = std::make_shared<std::vector<Value>>(all);
        auto pos = std::make_shared<size_t>(0);
        const FrameP tf = enter(s.test_frame, fr);
        const Stmt* st = &s;
        std::weak_ptr<std::vector<Value>> found = loop->items;
        loop->pull = [this, source, pos, tf, st, found]() -> bool {
            const auto items = found.lock();
            while (items && *pos < source->size()) {
                const Value v = (*source)[(*pos)++];
                step();
                assign(st->test_target, v, *tf);
                if (truthy(eval(*st->cond, tf))) {
                    items->push_back(v);
                    return true;
                }
            }
            return false;
        };
    } else {
        *loop->items = all;
        loop->done = true;
    }
    Value loop_value;
    if (s.loop_slot >= 0) {
        if (s.recursive) {
            loop->stmt = &s;
            loop->frame = fr;
        }
        loop_value = Value(std::static_pointer_cast<Object>(loop));
    }
    loops_.push_back(loop);
    // jinja2 runs the else block when no iteration reached the end of the body
    // (so also when the first iteration breaks or every one continues)
    bool completed = false;
    for (size_t i = 0; loop->ensure(i + 1); ++i) {
        step();
        const FrameP bf = enter(s.frame, fr);
        assign(s.target, (*loop->items)[i], *bf);
        loop->index0 = static_cast<int64_t>(i);
        if (s.loop_slot >= 0) bf->slots[static_cast<size_t>(s.loop_slot)] = loop_value;
        const Flow f = exec(s.body, bf, out);
        if (f == Flow::Break) break;
        if (f == Flow::Normal) completed = true;
    }
    if (!completed && !s.else_body.empty()) exec(s.else_body, enter(s.else_frame, fr), out);
}

Value Interp::call_loop(LoopObject& loop, CallArgs& args) {
    if (args.pos.size() != 1 || !args.kw.empty()) type_error("loop() takes exactly one argument");
    if (!loop.stmt || !loop.frame) raise("TemplateRuntimeError", "the loop is not recursive");
    std::string out;
    exec_for(*loop.stmt, loop.frame, out, iterate(args.pos[0]), loop.depth0 + 1);
    return Value(std::move(out));
}

Value Interp::check_namespace(const Target& t, Frame& fr) {
    Value found = Value::missing();
    if (t.level >= 0) {
        if (Frame* f = fr.at(t.level)) found = f->slots[static_cast<size_t>(t.slot)];
    } else {
        found = resolve(t.name);
    }
    if (!found.is_object() || found.object().type_name() != "Namespace")
        raise("TemplateRuntimeError", "cannot assign attribute on non-namespace object");
    return found;
}

void Interp::assign(const Target& t, const Value& v, Frame& fr) {
    switch (t.kind) {
        case Target::Name: {
            Frame* f = t.level >= 0 ? fr.at(t.level) : nullptr;
            if (!f || t.slot < 0) raise("TemplateRuntimeError", "cannot assign to '" + t.name + "' here");
            f->slots[static_cast<size_t>(t.slot)] = v;
            return;
        }
        case Target::NsAttr: {
            const Value found = check_namespace(t, fr);
            static_cast<Namespace&>(found.object()).set(t.attr, v);
            return;
        }
        case Target::Tuple: {
            if (!v.is_string() && !v.is_list() && !v.is_dict() && !v.is_undefined())
                type_error("cannot unpack non-iterable " + type_name(v) + " object");
            const std::vector<Value> parts = iterate(v);
            if (parts.size() < t.items.size())
                raise("ValueError", "not enough values to unpack (expected " + std::to_string(t.items.size()) +
                                        ", got " + std::to_string(parts.size()) + ")");
            if (parts.size() > t.items.size())
                raise("ValueError", "too many values to unpack (expected " + std::to_string(t.items.size()) + ")");
            for (size_t i = 0; i < parts.size(); ++i) assign(t.items[i], parts[i], fr);
            return;
        }
    }
}

void Interp::export_target(const Target& t, Frame& fr) {
    if (t.kind == Target::Tuple) {
        for (const Target& i : t.items) export_target(i, fr);
    } else if (t.kind == Target::Name && t.level >= 0) {
        if (Frame* f = fr.at(t.level)) exported_[t.name] = f->slots[static_cast<size_t>(t.slot)];
    }
}

// ------------------------------------------------------------------ macros

Value Interp::call_macro(Macro& m, CallArgs& args) {
    const Stmt& def = *m.def();
    if (call_depth_ >= opts_.limits.max_call_depth)
        raise("RecursionError", "maximum recursion depth exceeded (more than " +
                                    std::to_string(opts_.limits.max_call_depth) + " nested macro calls)");
    if (!m.closure()) raise("TemplateRuntimeError", "macro called after the render ended");
    const FrameP fr = enter(def.frame, m.closure());
    auto set_slot = [&](int slot, Value v) {
        if (slot >= 0) fr->slots[static_cast<size_t>(slot)] = std::move(v);
    };
    const auto& params = def.params;
    const std::string& mname = m.name();
    std::vector<Value> extra;
    std::vector<bool> given(params.size(), false);
    for (size_t i = 0; i < args.pos.size(); ++i) {
        if (i < params.size()) {
            set_slot(params[i].slot, args.pos[i]);
            given[i] = true;
        } else {
            extra.push_back(args.pos[i]);
        }
    }
    if (!extra.empty() && !def.uses_varargs)
        type_error("macro '" + mname + "' takes not more than " + std::to_string(params.size()) + " argument(s)");
    auto kwargs = std::make_shared<DictData>();
    Value caller;
    for (const auto& [k, v] : args.kw) {
        bool matched = false;
        for (size_t i = 0; i < params.size(); ++i) {
            if (params[i].name == k) {
                if (given[i]) type_error("macro '" + mname + "' got multiple values for argument '" + k + "'");
                set_slot(params[i].slot, v);
                given[i] = true;
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
        if (given[i]) continue;
        if (params[i].def) set_slot(params[i].slot, eval(*params[i].def, fr));
        else set_slot(params[i].slot, Value::undefined("parameter '" + params[i].name + "' was not provided"));
    }
    if (def.uses_varargs) set_slot(def.varargs_slot, Value::tuple(std::move(extra)));
    if (def.uses_kwargs) set_slot(def.kwargs_slot, Value(std::move(kwargs)));
    if (def.uses_caller) set_slot(def.caller_slot, caller.is_undefined() ? Value::undefined("No caller defined") : caller);
    ++call_depth_;
    std::string out;
    try {
        exec(def.body, fr, out);
    } catch (...) {
        --call_depth_;
        throw;
    }
    --call_depth_;
    return Value(std::move(out));
}

// ------------------------------------------------------------------ expressions

Value Interp::eval(const Expr& e, const FrameP& fr) {
    DepthGuard g(*this);
    step();
    try {
        return eval_inner(e, fr);
    } catch (const TemplateError& err) {
        if (err.line() > 0) throw;
        throw err.located(e.line, e.col);
    }
}

void Interp::eval_args(const Args& a, const FrameP& fr, CallArgs& out) {
    for (const auto& p : a.pos) out.pos.push_back(eval(*p, fr));
    for (const auto& [k, p] : a.kw) out.kw.emplace_back(k, eval(*p, fr));
    if (a.star) {
        for (Value& v : iterate(eval(*a.star, fr))) out.pos.push_back(std::move(v));
    }
    if (a.starstar) {
        const Value d = eval(*a.starstar, fr);
        if (!d.is_dict()) type_error("argument after ** must be a mapping, not " + type_name(d));
        for (const auto& [k, v] : d.dict_data().items()) {
            if (!k.is_string()) type_error("keywords must be strings");
            out.kw.emplace_back(k.str(), v);
        }
    }
}

Value Interp::eval_filter(const Expr& e, const FrameP& fr, const Value* input) {
    Value v = e.a ? (e.a->kind == ExprKind::Filter ? eval_filter(*e.a, fr, input) : eval(*e.a, fr))
                  : (input ? *input : Value());
    CallArgs args;
    eval_args(e.args, fr, args);
    try {
        return filter(e.name, v, args);
    } catch (const TemplateError& err) {
        if (err.line() > 0) throw;
        throw err.located(e.line, e.col);
    }
}

Value Interp::eval_call(const Expr& e, const FrameP& fr) {
    const Expr& fn = *e.a;
    if (fn.kind == ExprKind::Attr) {
        const Value obj = eval(*fn.a, fr);
        bool unsafe = false;
        if (!obj.is_object() && !obj.is_undefined() && has_method(obj, fn.name, unsafe) && !unsafe) {
            CallArgs args;
            eval_args(e.args, fr, args);
            return call_method(*this, obj, fn.name, args);
        }
        const Value callee = getattr(obj, fn.name);
        CallArgs args;
        eval_args(e.args, fr, args);
        return call(callee, args);
    }
    const Value callee = eval(fn, fr);
    CallArgs args;
    eval_args(e.args, fr, args);
    return call(callee, args);
}

Value Interp::call(const Value& callee, CallArgs& args) {
    if (callee.is_object() && callee.object().callable()) return callee.object().call(*this, args);
    if (callee.is_undefined()) callee.fail_undefined();
    type_error("'" + type_name(callee) + "' object is not callable");
}

Value Interp::eval_inner(const Expr& e, const FrameP& fr) {
    switch (e.kind) {
        case ExprKind::Const: return e.value;
        case ExprKind::Name: {
            Value v = Value::missing();
            if (e.level >= 0) {
                if (Frame* f = fr->at(e.level)) v = f->slots[static_cast<size_t>(e.slot)];
            } else {
                v = resolve(e.name);
            }
            return v.is_missing() ? Value::undefined_name(e.name) : v;
        }
        case ExprKind::List:
        case ExprKind::Tuple: {
            std::vector<Value> items;
            items.reserve(e.items.size());
            for (const auto& i : e.items) items.push_back(eval(*i, fr));
            charge(16 * items.size());
            return e.kind == ExprKind::List ? Value::list(std::move(items)) : Value::tuple(std::move(items));
        }
        case ExprKind::Dict: {
            auto d = std::make_shared<DictData>();
            for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
                Value k = eval(*e.items[i], fr);
                check_hashable(k);
                d->set(k, eval(*e.items[i + 1], fr));
            }
            charge(32 * d->size());
            return Value(std::move(d));
        }
        case ExprKind::Attr: return getattr(eval(*e.a, fr), e.name);
        case ExprKind::Item: return getitem(eval(*e.a, fr), eval(*e.b, fr));
        case ExprKind::Slice: {
            const Value obj = eval(*e.a, fr);
            Value parts[3] = {Value::none(), Value::none(), Value::none()};
            for (size_t i = 0; i < 3 && i < e.items.size(); ++i)
                if (e.items[i]) parts[i] = eval(*e.items[i], fr);
            // jinja2 compiles slices to plain Python subscription (no sandbox getitem)
            if (obj.is_undefined()) obj.fail_undefined();
            if (obj.is_dict()) type_error("unhashable type: 'slice'");
            if (obj.is_object() && obj.object().type_name() == "Namespace") {
                auto show = [](const Value& v) { return v.is_none() ? std::string("None") : repr(v); };
                raise("KeyError", "slice(" + show(parts[0]) + ", " + show(parts[1]) + ", " + show(parts[2]) + ")");
            }
            if (!obj.is_string() && !obj.is_sequence_list())
                type_error("'" + type_name(obj) + "' object is not subscriptable");
            return slice(*this, obj, parts[0], parts[1], parts[2]);
        }
        case ExprKind::Call: return eval_call(e, fr);
        case ExprKind::Filter: return eval_filter(e, fr, nullptr);
        case ExprKind::Test: {
            const Value v = eval(*e.a, fr);
            CallArgs args;
            eval_args(e.args, fr, args);
            return Value(test(e.name, v, args));
        }
        case ExprKind::Not: return Value(!truthy(eval(*e.a, fr)));
        case ExprKind::Neg:
        case ExprKind::Pos: return negate(eval(*e.a, fr), e.kind == ExprKind::Neg);
        case ExprKind::Binary: {
            if (e.name == "and") {
                Value l = eval(*e.a, fr);
                return truthy(l) ? eval(*e.b, fr) : l;
            }
            if (e.name == "or") {
                Value l = eval(*e.a, fr);
                return truthy(l) ? l : eval(*e.b, fr);
            }
            const Value l = eval(*e.a, fr);
            const Value r = eval(*e.b, fr);
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
            Value left = eval(*e.items[0], fr);
            for (size_t i = 0; i < e.ops.size(); ++i) {
                Value right = eval(*e.items[i + 1], fr);
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
            if (truthy(eval(*e.b, fr))) return eval(*e.a, fr);
            if (e.c) return eval(*e.c, fr);
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
    if (obj.is_list() && obj.list_data().iter_type == "_GroupTuple" && (name == "grouper" || name == "list"))
        return obj.items()[name == "grouper" ? 0 : 1];
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
                    return obj.is_markup() ? Value::markup(s.substr(b, e - b)) : Value(s.substr(b, e - b));
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
            if (!unhashable(key))
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
