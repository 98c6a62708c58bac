// Static resolution of template variables to frame slots, following the
// rules of jinja2's compiler (its idtracking module):
//   - a frame is the template body, a loop body, a loop's filter test, a
//     loop's else block, a macro or call-block body, a filter/with/set block;
//     if-blocks belong to their enclosing frame;
//   - a name assigned anywhere in a frame (set, macro, loop target, ...) is a
//     variable of that frame for the whole frame. When the frame starts it
//     holds the context's value if the frame reads the name before assigning
//     it, else the enclosing frame's variable of that name if there is one,
//     else nothing (reads give undefined);
//   - a name only read in a frame reads the nearest enclosing frame's
//     variable (live, as a closure would), or else the context.
// This is what makes e.g. a macro defined in a loop see the loop's variable
// rather than a context variable of the same name.
#include <functional>
#include <set>
#include <unordered_map>

#include "chat/ast.h"

namespace quern::jinja {

namespace {

struct Symbols {
    const Symbols* parent = nullptr;
    int level = 0;
    bool toplevel = false;  // the template's own top frame (assignments are exported)
    std::vector<std::string> order;                    // slot order
    std::unordered_map<std::string, SlotInit> refs;    // name -> load (Alias: alias_level + name)
    std::set<std::string> stores;
    std::unordered_map<std::string, int> index;        // name -> slot, after finalize()

    Symbols(const Symbols* p, int lvl) : parent(p), level(lvl) {}

    const Symbols* find(const std::string& n) const {
        for (const Symbols* s = this; s; s = s->parent)
            if (s->refs.count(n)) return s;
        return nullptr;
    }
    void define(const std::string& n, SlotInit init) {
        if (!refs.count(n)) order.push_back(n);
        init.name = n;
        refs[n] = std::move(init);
    }
    void store(const std::string& n) {
        stores.insert(n);
        if (refs.count(n)) return;
        if (parent) {
            if (const Symbols* o = parent->find(n)) {
                define(n, SlotInit{SlotInit::Alias, n, o->level, -1});
                return;
            }
        }
        define(n, SlotInit{SlotInit::Missing, n, -1, -1});
    }
    void param(const std::string& n) {
        stores.insert(n);
        define(n, SlotInit{SlotInit::Param, n, -1, -1});
    }
    void load(const std::string& n) {
        if (!find(n)) define(n, SlotInit{SlotInit::Resolve, n, -1, -1});
    }
    Symbols(const Symbols&) = default;
    void branch_update(const std::vector<const Symbols*>& branches) {
        std::set<std::string> new_stores;
        for (const Symbols* b : branches) new_stores.insert(b->stores.begin(), b->stores.end());
        for (const std::string& s : stores) new_stores.erase(s);
        for (const Symbols* b : branches) {
            for (const std::string& n : b->order) define(n, b->refs.at(n));
            stores.insert(b->stores.begin(), b->stores.end());
        }
        for (const std::string& n : new_stores) {
            if (parent) {
                if (const Symbols* o = parent->find(n)) {
                    refs[n] = SlotInit{SlotInit::Alias, n, o->level, -1};
                    continue;
                }
            }
            refs[n] = SlotInit{SlotInit::Resolve, n, -1, -1};
        }
    }
    FrameDef finalize() {
        FrameDef f;
        f.level = level;
        for (size_t i = 0; i < order.size(); ++i) index[order[i]] = static_cast<int>(i);
        for (const std::string& n : order) {
            SlotInit s = refs.at(n);
            if (s.kind == SlotInit::Alias) {
                const Symbols* o = parent;
                while (o && o->level != s.alias_level) o = o->parent;
                const auto it = o ? o->index.find(n) : decltype(o->index.end()){};
                if (o && it != o->index.end()) s.alias_slot = it->second;
                else s.kind = SlotInit::Resolve;  // cannot happen; resolve from the context
            }
            f.slots.push_back(std::move(s));
        }
        return f;
    }
    int slot(const std::string& n) const {
        const auto it = index.find(n);
        return it == index.end() ? -1 : it->second;
    }
};

// ---------------------------------------------------------------- analysis (symbols of one frame)

void an_expr(const Expr* e, Symbols& sym) {
    if (!e) return;
    if (e->kind == ExprKind::Name) {
        sym.load(e->name);
        return;
    }
    an_expr(e->a.get(), sym);
    an_expr(e->b.get(), sym);
    an_expr(e->c.get(), sym);
    for (const auto& i : e->items) an_expr(i.get(), sym);
    for (const auto& i : e->args.pos) an_expr(i.get(), sym);
    for (const auto& [k, v] : e->args.kw) an_expr(v.get(), sym);
    an_expr(e->args.star.get(), sym);
    an_expr(e->args.starstar.get(), sym);
}

void an_target(const Target& t, Symbols& sym, bool as_param) {
    switch (t.kind) {
        case Target::Name:
            if (as_param) sym.param(t.name);
            else sym.store(t.name);
            break;
        case Target::NsAttr: sym.load(t.name); break;
        case Target::Tuple:
            for (const Target& i : t.items) an_target(i, sym, as_param);
            break;
    }
}

void an_stmt(const Stmt& s, Symbols& sym);

void an_body(const Body& b, Symbols& sym) {
    for (const auto& st : b) an_stmt(*st, sym);
}

void an_stmt(const Stmt& s, Symbols& sym) {
    switch (s.kind) {
        case StmtKind::Output: an_expr(s.expr.get(), sym); break;
        case StmtKind::If: {
            // jinja2's shape: If(test0, body0, elif_=[If(test_i, body_i)...], else_)
            an_expr(s.tests[0].get(), sym);
            Symbols body = sym;
            an_body(s.bodies[0], body);
            Symbols elifs = sym;
            for (size_t i = 1; i < s.tests.size(); ++i) {
                an_expr(s.tests[i].get(), elifs);
                Symbols b = elifs, e1 = elifs, e2 = elifs;
                an_body(s.bodies[i], b);
                elifs.branch_update({&b, &e1, &e2});
            }
            Symbols els = sym;
            an_body(s.else_body, els);
            sym.branch_update({&body, &elifs, &els});
            break;
        }
        case StmtKind::For: an_expr(s.expr.get(), sym); break;
        case StmtKind::Set:
            an_expr(s.expr.get(), sym);
            an_target(s.target, sym, false);
            break;
        case StmtKind::SetBlock: an_target(s.target, sym, false); break;
        case StmtKind::Macro: sym.store(s.text); break;
        case StmtKind::CallBlock:
        case StmtKind::FilterBlock: an_expr(s.expr.get(), sym); break;
        case StmtKind::With:
            for (const auto& w : s.withs) an_expr(w.second.get(), sym);
            break;
        default: break;
    }
}

// Whether `name` is read somewhere in `body` (nested blocks included).
bool reads_name(const Body& body, const std::string& name) {
    std::function<bool(const Expr*)> ex = [&](const Expr* e) -> bool {
        if (!e) return false;
        if (e->kind == ExprKind::Name && e->name == name) return true;
        if (ex(e->a.get()) || ex(e->b.get()) || ex(e->c.get()) || ex(e->args.star.get()) || ex(e->args.starstar.get()))
            return true;
        for (const auto& i : e->items)
            if (ex(i.get())) return true;
        for (const auto& i : e->args.pos)
            if (ex(i.get())) return true;
        for (const auto& [k, v] : e->args.kw)
            if (ex(v.get())) return true;
        return false;
    };
    std::function<bool(const Body&)> bd = [&](const Body& b) -> bool {
        for (const auto& st : b) {
            if (ex(st->expr.get()) || ex(st->cond.get())) return true;
            for (const auto& t : st->tests)
                if (ex(t.get())) return true;
            for (const auto& bb : st->bodies)
                if (bd(bb)) return true;
            for (const auto& p : st->params)
                if (ex(p.def.get())) return true;
            for (const auto& w : st->withs)
                if (ex(w.second.get())) return true;
            if (bd(st->body) || bd(st->else_body)) return true;
        }
        return false;
    };
    return bd(body);
}

// ---------------------------------------------------------------- resolution (names to slots)

void rs_expr(Expr* e, const Symbols& sym) {
    if (!e) return;
    if (e->kind == ExprKind::Name) {
        if (const Symbols* s = sym.find(e->name)) {
            e->level = s->level;
            e->slot = s->slot(e->name);
        }
        return;
    }
    rs_expr(e->a.get(), sym);
    rs_expr(e->b.get(), sym);
    rs_expr(e->c.get(), sym);
    for (auto& i : e->items) rs_expr(i.get(), sym);
    for (auto& i : e->args.pos) rs_expr(i.get(), sym);
    for (auto& [k, v] : e->args.kw) rs_expr(v.get(), sym);
    rs_expr(e->args.star.get(), sym);
    rs_expr(e->args.starstar.get(), sym);
}

void rs_target(Target& t, const Symbols& sym) {
    if (t.kind == Target::Tuple) {
        for (Target& i : t.items) rs_target(i, sym);
        return;
    }
    if (const Symbols* s = sym.find(t.name)) {
        t.level = s->level;
        t.slot = s->slot(t.name);
    }
}

void rs_body(Body& b, Symbols& sym);

void rs_stmt(Stmt& s, Symbols& sym) {
    switch (s.kind) {
        case StmtKind::Output: rs_expr(s.expr.get(), sym); break;
        case StmtKind::If:
            for (auto& t : s.tests) rs_expr(t.get(), sym);
            for (auto& b : s.bodies) rs_body(b, sym);
            rs_body(s.else_body, sym);
            break;
        case StmtKind::For: {
            rs_expr(s.expr.get(), sym);
            Symbols body(&sym, sym.level + 1);
            const bool extended = s.recursive || reads_name(s.body, "loop");
            if (extended) body.param("loop");
            an_target(s.target, body, true);
            an_body(s.body, body);
            s.frame = body.finalize();
            if (extended) s.loop_slot = body.slot("loop");
            rs_target(s.target, body);
            rs_body(s.body, body);
            if (!s.else_body.empty()) {
                Symbols els(&sym, sym.level + 1);
                an_body(s.else_body, els);
                s.else_frame = els.finalize();
                rs_body(s.else_body, els);
            }
            if (s.cond) {
                Symbols test(&sym, sym.level + 1);
                an_target(s.target, test, true);
                an_expr(s.cond.get(), test);
                s.test_frame = test.finalize();
                // the test frame's own copy of the target slots
                std::function<void(Target&)> copy_slots = [&](Target& t) {
                    if (t.kind == Target::Tuple) {
                        for (Target& i : t.items) copy_slots(i);
                    } else {
                        t.level = test.level;
                        t.slot = test.slot(t.name);
                    }
                };
                s.test_target = s.target;
                copy_slots(s.test_target);
                rs_expr(s.cond.get(), test);
            }
            break;
        }
        case StmtKind::Set:
            rs_expr(s.expr.get(), sym);
            rs_target(s.target, sym);
            s.toplevel = sym.toplevel;
            break;
        case StmtKind::SetBlock: {
            Symbols blk(&sym, sym.level + 1);
            an_body(s.body, blk);
            s.frame = blk.finalize();
            rs_body(s.body, blk);
            rs_expr(s.expr.get(), blk);
            rs_target(s.target, sym);
            s.toplevel = sym.toplevel;
            break;
        }
        case StmtKind::Macro:
        case StmtKind::CallBlock: {
            if (s.kind == StmtKind::CallBlock) rs_expr(s.expr.get(), sym);
            Symbols m(&sym, sym.level + 1);
            for (const Param& p : s.params) m.param(p.name);
            for (const Param& p : s.params) an_expr(p.def.get(), m);
            an_body(s.body, m);
            if (s.uses_caller) m.param("caller");
            if (s.uses_kwargs) m.param("kwargs");
            if (s.uses_varargs) m.param("varargs");
            s.frame = m.finalize();
            for (Param& p : s.params) p.slot = m.slot(p.name);
            s.caller_slot = m.slot("caller");
            s.kwargs_slot = s.uses_kwargs ? m.slot("kwargs") : -1;
            s.varargs_slot = s.uses_varargs ? m.slot("varargs") : -1;
            for (Param& p : s.params) rs_expr(p.def.get(), m);
            rs_body(s.body, m);
            if (s.kind == StmtKind::Macro) {
                s.target.kind = Target::Name;
                s.target.name = s.text;
                rs_target(s.target, sym);
                s.toplevel = sym.toplevel;
            }
            break;
        }
        case StmtKind::FilterBlock: {
            Symbols f(&sym, sym.level + 1);
            an_body(s.body, f);
            an_expr(s.expr.get(), f);
            s.frame = f.finalize();
            rs_body(s.body, f);
            rs_expr(s.expr.get(), f);
            break;
        }
        case StmtKind::With: {
            for (auto& w : s.withs) rs_expr(w.second.get(), sym);
            Symbols w(&sym, sym.level + 1);
            for (auto& t : s.withs) an_target(t.first, w, true);
            an_body(s.body, w);
            s.frame = w.finalize();
            for (auto& t : s.withs) rs_target(t.first, w);
            rs_body(s.body, w);
            break;
        }
        case StmtKind::Scope: {
            Symbols sc(s.isolated ? nullptr : &sym, s.isolated ? 0 : sym.level + 1);
            an_body(s.body, sc);
            s.frame = sc.finalize();
            rs_body(s.body, sc);
            break;
        }
        default: break;
    }
}

void rs_body(Body& b, Symbols& sym) {
    for (auto& st : b) rs_stmt(*st, sym);
}

}  // namespace

void resolve_symbols(Program& prog) {
    Symbols root(nullptr, 0);
    root.toplevel = true;
    an_body(prog.body, root);
    prog.frame = root.finalize();
    rs_body(prog.body, root);
}

}  // namespace quern::jinja
