// Jinja parser (see parser.h). Error messages follow jinja2's wording.
#include "chat/parser.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <set>

#include "chat/filters.h"

namespace quern::jinja {

namespace {

std::string describe(const Token& t) {
    switch (t.kind) {
        case Tok::Eof: return "end of template";
        case Tok::BlockEnd: return "end of statement block";
        case Tok::VarEnd: return "end of print statement";
        case Tok::BlockBegin: return "begin of statement block";
        case Tok::VarBegin: return "begin of print statement";
        case Tok::Data: return "template data / text";
        case Tok::String: return "string";
        case Tok::Int: return "integer";
        case Tok::Float: return "float";
        default: return t.value;
    }
}

class Parser {
public:
    Parser(std::vector<Token> toks, const ParseLimits& lim) : t_(std::move(toks)), lim_(lim) {}

    Program run() {
        Program p;
        p.body = subparse(nullptr);
        return p;
    }

private:
    // ---------------------------------------------------------------- tokens
    const Token& cur() const { return t_[i_]; }
    const Token& look() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
    const Token& next() {
        const Token& t = t_[i_];
        if (i_ + 1 < t_.size()) ++i_;
        return t;
    }
    bool is_op(std::string_view op) const { return cur().kind == Tok::Op && cur().value == op; }
    bool is_name(std::string_view n) const { return cur().kind == Tok::Name && cur().value == n; }
    bool skip_op(std::string_view op) {
        if (!is_op(op)) return false;
        next();
        return true;
    }
    bool skip_name(std::string_view n) {
        if (!is_name(n)) return false;
        next();
        return true;
    }
    [[noreturn]] void fail(const std::string& msg, const Token& at, std::string type = "TemplateSyntaxError") const {
        throw TemplateError(std::move(type), msg, at.line, at.col);
    }
    [[noreturn]] void fail(const std::string& msg) const { fail(msg, cur()); }
    void expect_op(std::string_view op) {
        if (!skip_op(op)) unexpected("'" + std::string(op) + "'");
    }
    void expect_kind(Tok k, const char* what) {
        if (cur().kind != k) unexpected(std::string("'") + what + "'");
        next();
    }
    const Token& expect_name() {
        if (cur().kind != Tok::Name) unexpected("name");
        return next();
    }
    [[noreturn]] void unexpected(const std::string& want) const {
        if (cur().kind == Tok::Eof) fail("unexpected end of template, expected " + want + ".");
        fail("expected token " + want + ", got '" + describe(cur()) + "'");
    }

    struct DepthGuard {
        Parser& p;
        explicit DepthGuard(Parser& pp) : p(pp) {
            if (++p.depth_ > p.lim_.max_depth) p.fail("template nesting is too deep (more than " +
                                                      std::to_string(p.lim_.max_depth) + " levels)");
        }
        ~DepthGuard() { --p.depth_; }
    };

    // Records the height of `e` from its children; a left-nested chain
    // (a + b + c ..., x|f|f|f ..., a.b.c ...) must not grow without bound
    // (evaluating and freeing the tree recurse over it).
    ExprPtr sized(ExprPtr e) {
        int d = 0;
        auto take = [&](const ExprPtr& c) {
            if (c) d = std::max(d, c->depth);
        };
        take(e->a), take(e->b), take(e->c);
        for (const auto& i : e->items) take(i);
        for (const auto& i : e->args.pos) take(i);
        for (const auto& [k, v] : e->args.kw) take(v);
        take(e->args.star), take(e->args.starstar);
        e->depth = d + 1;
        if (e->depth > lim_.max_depth)
            fail("expression is nested too deeply (more than " + std::to_string(lim_.max_depth) + " levels)", t_[i_]);
        return e;
    }

    ExprPtr make(ExprKind k, const Token& at) {
        auto e = std::make_unique<Expr>();
        e->kind = k;
        e->line = at.line;
        e->col = at.col;
        return e;
    }

    // ---------------------------------------------------------------- statements
    Body subparse(const std::vector<std::string>* end_tokens) {
        Body body;
        if (end_tokens) end_stack_.push_back(*end_tokens);
        while (cur().kind != Tok::Eof) {
            const Token& tk = cur();
            if (tk.kind == Tok::Data) {
                auto s = std::make_unique<Stmt>();
                s->kind = StmtKind::Data;
                s->line = tk.line, s->col = tk.col;
                s->text = tk.value;
                body.push_back(std::move(s));
                next();
            } else if (tk.kind == Tok::VarBegin) {
                const Token& at = next();
                auto s = std::make_unique<Stmt>();
                s->kind = StmtKind::Output;
                s->line = at.line, s->col = at.col;
                s->expr = parse_tuple(false, true, {}, false);
                expect_kind(Tok::VarEnd, "end of print statement");
                body.push_back(std::move(s));
            } else if (tk.kind == Tok::BlockBegin) {
                next();
                if (end_tokens && cur().kind == Tok::Name &&
                    std::find(end_tokens->begin(), end_tokens->end(), cur().value) != end_tokens->end()) {
                    end_stack_.pop_back();
                    return body;
                }
                parse_statement(body);
                expect_kind(Tok::BlockEnd, "end of statement block");
            } else {
                fail("unexpected '" + describe(tk) + "'");
            }
        }
        if (end_tokens) end_stack_.pop_back();
        return body;
    }

    // jinja2's message for an unknown tag or a premature end.
    [[noreturn]] void fail_tag(const std::string* name, const std::vector<std::string>* extra) {
        std::vector<std::vector<std::string>> stack = end_stack_;
        if (extra) stack.push_back(*extra);
        std::set<std::string> expected;
        for (const auto& v : stack) expected.insert(v.begin(), v.end());
        std::string looking;
        if (!stack.empty()) {
            for (size_t k = 0; k < stack.back().size(); ++k) {
                if (k) looking += " or ";
                looking += "'" + stack.back()[k] + "'";
            }
        }
        std::string msg = name ? "Encountered unknown tag '" + *name + "'." : "Unexpected end of template.";
        if (!looking.empty()) {
            if (name && expected.count(*name))
                msg += " You probably made a nesting mistake. Jinja is expecting this tag, but currently looking for " +
                       looking + ".";
            else
                msg += " Jinja was looking for the following tags: " + looking + ".";
        }
        if (!tag_stack_.empty()) msg += " The innermost block that needs to be closed is '" + tag_stack_.back() + "'.";
        fail(msg);
    }

    Body parse_statements(const std::vector<std::string>& end_tokens, bool drop_needle) {
        skip_op(":");
        expect_kind(Tok::BlockEnd, "end of statement block");
        Body b = subparse(&end_tokens);
        if (cur().kind == Tok::Eof) fail_tag(nullptr, &end_tokens);
        if (drop_needle) next();
        return b;
    }

    StmtPtr new_stmt(StmtKind k, const Token& at) {
        auto s = std::make_unique<Stmt>();
        s->kind = k;
        s->line = at.line;
        s->col = at.col;
        return s;
    }

    void parse_statement(Body& out) {
        DepthGuard g(*this);
        const Token& tk = cur();
        if (tk.kind != Tok::Name) fail("tag name expected");
        const std::string name = tk.value;
        static const std::set<std::string> known = {"for", "if", "set", "macro", "call", "filter", "with", "block",
                                                    "print", "autoescape", "break", "continue", "generation",
                                                    "include", "import", "from", "extends"};
        if (!known.count(name)) fail_tag(&name, nullptr);
        tag_stack_.push_back(name);
        const bool saved_soft = soft_;
        if (name == "for") out.push_back(parse_for());
        else if (name == "if") out.push_back(parse_if());
        else if (name == "set") out.push_back(parse_set());
        else if (name == "macro") out.push_back(parse_macro());
        else if (name == "call") out.push_back(parse_call_block());
        else if (name == "filter") out.push_back(parse_filter_block());
        else if (name == "with") out.push_back(parse_with());
        else if (name == "block" || name == "generation" || name == "autoescape") out.push_back(parse_scope(name));
        else if (name == "print") parse_print(out);
        else if (name == "break" || name == "continue") {
            const Token& at = next();
            if (loop_depth_ == 0) fail("'" + name + "' must be inside a for loop", at);
            out.push_back(new_stmt(name == "break" ? StmtKind::Break : StmtKind::Continue, at));
        } else {
            fail("'" + name + "' is not supported: chat templates cannot load other templates", tk);
        }
        soft_ = saved_soft;
        tag_stack_.pop_back();
    }

    StmtPtr parse_for() {
        auto s = new_stmt(StmtKind::For, next());
        s->target = parse_target(true, false, {"in"});
        if (!skip_name("in")) unexpected("'in'");
        s->expr = parse_tuple(false, false, {"recursive"}, false);
        soft_ = false;
        if (skip_name("if")) s->cond = parse_expression(true);
        s->recursive = skip_name("recursive");
        ++loop_depth_;
        s->body = parse_statements({"endfor", "else"}, false);
        --loop_depth_;
        if (next().value != "endfor") s->else_body = parse_statements({"endfor"}, true);
        return s;
    }

    StmtPtr parse_if() {
        auto s = new_stmt(StmtKind::If, next());
        soft_ = true;
        while (true) {
            s->tests.push_back(parse_tuple(false, false, {}, false));
            s->bodies.push_back(parse_statements({"elif", "else", "endif"}, false));
            const Token& t = next();
            if (t.value == "elif") continue;
            if (t.value == "else") s->else_body = parse_statements({"endif"}, true);
            break;
        }
        return s;
    }

    StmtPtr parse_set() {
        const Token& at = next();
        Target target = parse_target(true, true, {});
        if (skip_op("=")) {
            auto s = new_stmt(StmtKind::Set, at);
            s->target = std::move(target);
            s->expr = parse_tuple(false, true, {}, false);
            return s;
        }
        auto s = new_stmt(StmtKind::SetBlock, at);
        s->target = std::move(target);
        soft_ = false;
        if (is_op("|")) s->expr = parse_filter(nullptr, false);
        s->body = parse_statements({"endset"}, true);
        return s;
    }

    void parse_signature(Stmt& s) {
        expect_op("(");
        bool defaults = false;
        while (!is_op(")")) {
            if (!s.params.empty()) expect_op(",");
            Param p;
            p.name = expect_name().value;
            if (skip_op("=")) {
                p.def = parse_expression(true);
                defaults = true;
            } else if (defaults) {
                fail("non-default argument follows default argument");
            }
            s.params.push_back(std::move(p));
        }
        expect_op(")");
    }

    StmtPtr parse_macro() {
        auto s = new_stmt(StmtKind::Macro, next());
        s->text = expect_name().value;
        soft_ = false;
        parse_signature(*s);
        const int saved_loops = loop_depth_;
        loop_depth_ = 0;
        s->body = parse_statements({"endmacro"}, true);
        loop_depth_ = saved_loops;
        scan_specials(*s);
        return s;
    }

    StmtPtr parse_call_block() {
        auto s = new_stmt(StmtKind::CallBlock, next());
        soft_ = false;
        if (is_op("(")) parse_signature(*s);
        s->expr = parse_expression(true);
        if (s->expr->kind != ExprKind::Call) fail("expected call", t_[i_]);
        const int saved_loops = loop_depth_;
        loop_depth_ = 0;
        s->body = parse_statements({"endcall"}, true);
        loop_depth_ = saved_loops;
        scan_specials(*s);
        return s;
    }

    StmtPtr parse_filter_block() {
        auto s = new_stmt(StmtKind::FilterBlock, next());
        soft_ = false;
        s->expr = parse_filter(nullptr, true);
        s->body = parse_statements({"endfilter"}, true);
        return s;
    }

    StmtPtr parse_with() {
        auto s = new_stmt(StmtKind::With, next());
        while (cur().kind != Tok::BlockEnd) {
            if (!s->withs.empty()) expect_op(",");
            Target t = parse_target(false, false, {});
            expect_op("=");
            s->withs.emplace_back(std::move(t), parse_expression(true));
        }
        soft_ = false;
        s->body = parse_statements({"endwith"}, true);
        return s;
    }

    StmtPtr parse_scope(const std::string& name) {
        auto s = new_stmt(StmtKind::Scope, next());
        if (name == "block") {
            s->isolated = true;
            const std::string bname = expect_name().value;
            skip_name("scoped");
            skip_name("required");
            s->body = parse_statements({"endblock"}, true);
            skip_name(bname);
        } else if (name == "autoescape") {
            parse_expression(true);
            s->body = parse_statements({"endautoescape"}, true);
        } else {
            s->body = parse_statements({"endgeneration"}, true);
        }
        return s;
    }

    void parse_print(Body& out) {
        const Token& at = next();
        bool first = true;
        while (cur().kind != Tok::BlockEnd) {
            if (!first) expect_op(",");
            first = false;
            auto s = new_stmt(StmtKind::Output, at);
            s->expr = parse_expression(true);
            out.push_back(std::move(s));
        }
    }

    // Marks macros/call blocks whose bodies use caller/varargs/kwargs.
    void scan_specials(Stmt& s) {
        std::function<void(const Expr*)> ex = [&](const Expr* e) {
            if (!e) return;
            if (e->kind == ExprKind::Name) {
                if (e->name == "caller") s.uses_caller = true;
                if (e->name == "varargs") s.uses_varargs = true;
                if (e->name == "kwargs") s.uses_kwargs = true;
            }
            ex(e->a.get()), ex(e->b.get()), ex(e->c.get());
            for (const auto& i : e->items) ex(i.get());
            for (const auto& i : e->args.pos) ex(i.get());
            for (const auto& i : e->args.kw) ex(i.second.get());
            ex(e->args.star.get()), ex(e->args.starstar.get());
        };
        std::function<void(const Body&)> bd = [&](const Body& b) {
            for (const auto& st : b) {
                ex(st->expr.get()), ex(st->cond.get());
                for (const auto& t : st->tests) ex(t.get());
                for (const auto& bb : st->bodies) bd(bb);
                for (const auto& p : st->params) ex(p.def.get());
                for (const auto& w : st->withs) ex(w.second.get());
                bd(st->body), bd(st->else_body);
            }
        };
        bd(s.body);
        for (const auto& p : s.params) ex(p.def.get());
    }

    // ---------------------------------------------------------------- targets
    Target parse_target(bool with_tuple, bool with_ns, const std::vector<std::string>& extra_end) {
        auto one = [&]() {
            Target t;
            const Token& tk = cur();
            if (tk.kind != Tok::Name) fail("can't assign to '" + describe(tk) + "'", tk);
            if (tk.value == "true" || tk.value == "false" || tk.value == "none" || tk.value == "True" ||
                tk.value == "False" || tk.value == "None")
                fail("can't assign to 'const'", tk);
            next();
            t.name = tk.value;
            if (with_ns && is_op(".")) {
                next();
                t.kind = Target::NsAttr;
                t.attr = expect_name().value;
            }
            return t;
        };
        if (!with_tuple) return one();
        Target tuple;
        tuple.kind = Target::Tuple;
        bool is_tuple = false;
        while (true) {
            if (!tuple.items.empty()) expect_op(",");
            if (tuple_end(extra_end)) break;
            tuple.items.push_back(one());
            if (is_op(",")) is_tuple = true;
            else break;
        }
        if (!is_tuple) {
            if (tuple.items.empty()) fail("Expected an expression, got '" + describe(cur()) + "'");
            return std::move(tuple.items[0]);
        }
        return tuple;
    }

    bool tuple_end(const std::vector<std::string>& extra_end) const {
        if (cur().kind == Tok::VarEnd || cur().kind == Tok::BlockEnd || is_op(")")) return true;
        for (const auto& e : extra_end)
            if (is_name(e)) return true;
        return false;
    }

    // ---------------------------------------------------------------- expressions
    ExprPtr parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string>& extra_end,
                        bool explicit_parens) {
        const Token& at = cur();
        std::vector<ExprPtr> items;
        bool is_tuple = false;
        while (true) {
            if (!items.empty()) expect_op(",");
            if (tuple_end(extra_end)) break;
            items.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
            if (is_op(",")) is_tuple = true;
            else break;
        }
        if (!is_tuple) {
            if (!items.empty()) return std::move(items[0]);
            if (!explicit_parens) fail("Expected an expression, got '" + describe(cur()) + "'");
        }
        auto e = make(ExprKind::Tuple, at);
        e->items = std::move(items);
        return sized(std::move(e));
    }

    ExprPtr parse_expression(bool with_condexpr) {
        DepthGuard g(*this);
        return with_condexpr ? parse_condexpr() : parse_or();
    }

    static void mark_soft(Expr* e) {
        if (!e) return;
        if (e->kind == ExprKind::Filter || e->kind == ExprKind::Test) e->soft = true;
        mark_soft(e->a.get()), mark_soft(e->b.get()), mark_soft(e->c.get());
        for (auto& i : e->items) mark_soft(i.get());
        for (auto& i : e->args.pos) mark_soft(i.get());
        for (auto& i : e->args.kw) mark_soft(i.second.get());
    }

    ExprPtr parse_condexpr() {
        ExprPtr e1 = parse_or();
        while (is_name("if")) {
            const Token& at = next();
            auto c = make(ExprKind::Cond, at);
            c->b = parse_or();
            if (skip_name("else")) c->c = parse_condexpr();
            c->a = std::move(e1);
            mark_soft(c.get());
            e1 = sized(std::move(c));
        }
        return e1;
    }

    ExprPtr binary(const char* op, const Token& at, ExprPtr l, ExprPtr r) {
        auto e = make(ExprKind::Binary, at);
        e->name = op;
        e->a = std::move(l);
        e->b = std::move(r);
        return sized(std::move(e));
    }

    ExprPtr parse_or() {
        ExprPtr l = parse_and();
        while (is_name("or")) {
            const Token& at = next();
            l = binary("or", at, std::move(l), parse_and());
        }
        return l;
    }

    ExprPtr parse_and() {
        ExprPtr l = parse_not();
        while (is_name("and")) {
            const Token& at = next();
            l = binary("and", at, std::move(l), parse_not());
        }
        return l;
    }

    ExprPtr parse_not() {
        if (is_name("not")) {
            DepthGuard g(*this);
            const Token& at = next();
            auto e = make(ExprKind::Not, at);
            e->a = parse_not();
            return sized(std::move(e));
        }
        return parse_compare();
    }

    ExprPtr parse_compare() {
        const Token& at = cur();
        ExprPtr first = parse_math1();
        std::vector<std::string> ops;
        std::vector<ExprPtr> rest;
        while (true) {
            if (cur().kind == Tok::Op && (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
                                          cur().value == "<=" || cur().value == ">" || cur().value == ">=")) {
                ops.push_back(next().value);
            } else if (is_name("in")) {
                next();
                ops.emplace_back("in");
            } else if (is_name("not") && look().kind == Tok::Name && look().value == "in") {
                next(), next();
                ops.emplace_back("notin");
            } else {
                break;
            }
            rest.push_back(parse_math1());
        }
        if (ops.empty()) return first;
        auto e = make(ExprKind::Compare, at);
        e->items.push_back(std::move(first));
        for (auto& r : rest) e->items.push_back(std::move(r));
        e->ops = std::move(ops);
        return sized(std::move(e));
    }

    ExprPtr parse_math1() {
        ExprPtr l = parse_concat();
        while (is_op("+") || is_op("-")) {
            const Token& at = next();
            l = binary(at.value == "+" ? "+" : "-", at, std::move(l), parse_concat());
        }
        return l;
    }

    ExprPtr parse_concat() {
        ExprPtr l = parse_math2();
        while (is_op("~")) {
            const Token& at = next();
            l = binary("~", at, std::move(l), parse_math2());
        }
        return l;
    }

    ExprPtr parse_math2() {
        ExprPtr l = parse_pow();
        while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
            const Token& at = next();
            const std::string op = at.value;
            l = binary(op == "*" ? "*" : op == "/" ? "/" : op == "//" ? "//" : "%", at, std::move(l), parse_pow());
        }
        return l;
    }

    ExprPtr parse_pow() {
        ExprPtr l = parse_unary(true);
        while (is_op("**")) {
            const Token& at = next();
            l = binary("**", at, std::move(l), parse_unary(true));
        }
        return l;
    }

    ExprPtr parse_unary(bool with_filter) {
        DepthGuard g(*this);
        ExprPtr node;
        if (is_op("-") || is_op("+")) {
            const Token& at = next();
            node = make(at.value == "-" ? ExprKind::Neg : ExprKind::Pos, at);
            node->a = parse_unary(false);
            node = sized(std::move(node));
        } else {
            node = parse_primary();
        }
        node = parse_postfix(std::move(node));
        if (with_filter) node = parse_filter_expr(std::move(node));
        return node;
    }

    ExprPtr parse_primary() {
        DepthGuard g(*this);
        const Token& tk = cur();
        if (tk.kind == Tok::Name) {
            next();
            auto e = make(ExprKind::Const, tk);
            if (tk.value == "true" || tk.value == "True") e->value = Value(true);
            else if (tk.value == "false" || tk.value == "False") e->value = Value(false);
            else if (tk.value == "none" || tk.value == "None") e->value = Value::none();
            else e->kind = ExprKind::Name, e->name = tk.value;
            return e;
        }
        if (tk.kind == Tok::String) {
            auto e = make(ExprKind::Const, tk);
            std::string s;
            while (cur().kind == Tok::String) s += next().value;
            e->value = Value(std::move(s));
            return e;
        }
        if (tk.kind == Tok::Int || tk.kind == Tok::Float) {
            next();
            auto e = make(ExprKind::Const, tk);
            if (tk.kind == Tok::Int) {
                int64_t v = 0;
                std::from_chars(tk.value.data(), tk.value.data() + tk.value.size(), v);
                e->value = Value(v);
            } else {
                double d = 0;
                const auto r = std::from_chars(tk.value.data(), tk.value.data() + tk.value.size(), d);
                if (r.ec == std::errc::result_out_of_range) d = tk.value.find("e-") != std::string::npos ||
                                                                       tk.value.find("E-") != std::string::npos
                                                                   ? 0.0
                                                                   : HUGE_VAL;
                e->value = Value(d);
            }
            return e;
        }
        if (is_op("(")) {
            next();
            ExprPtr e = parse_tuple(false, true, {}, true);
            expect_op(")");
            return e;
        }
        if (is_op("[")) {
            auto e = make(ExprKind::List, next());
            while (!is_op("]")) {
                if (!e->items.empty()) expect_op(",");
                if (is_op("]")) break;
                e->items.push_back(parse_expression(true));
            }
            expect_op("]");
            return sized(std::move(e));
        }
        if (is_op("{")) {
            auto e = make(ExprKind::Dict, next());
            while (!is_op("}")) {
                if (!e->items.empty()) expect_op(",");
                if (is_op("}")) break;
                e->items.push_back(parse_expression(true));
                expect_op(":");
                e->items.push_back(parse_expression(true));
            }
            expect_op("}");
            return sized(std::move(e));
        }
        if (tk.kind == Tok::Eof) fail("unexpected end of template");
        fail("unexpected '" + describe(tk) + "'");
    }

    ExprPtr parse_postfix(ExprPtr node) {
        while (true) {
            if (is_op(".") || is_op("[")) node = parse_subscript(std::move(node));
            else if (is_op("(")) node = parse_call(std::move(node));
            else break;
        }
        return node;
    }

    ExprPtr parse_filter_expr(ExprPtr node) {
        while (true) {
            if (is_op("|")) node = parse_filter(std::move(node), false);
            else if (is_name("is")) node = parse_test(std::move(node));
            else if (is_op("(")) node = parse_call(std::move(node));
            else break;
        }
        return node;
    }

    ExprPtr parse_subscript(ExprPtr node) {
        DepthGuard g(*this);
        const Token& at = next();
        if (at.value == ".") {
            const Token& tk = cur();
            if (tk.kind == Tok::Name) {
                next();
                auto e = make(ExprKind::Attr, at);
                e->a = std::move(node);
                e->name = tk.value;
                return sized(std::move(e));
            }
            if (tk.kind != Tok::Int) fail("expected name or number", tk);
            next();
            auto e = make(ExprKind::Item, at);
            e->a = std::move(node);
            auto k = make(ExprKind::Const, tk);
            int64_t v = 0;
            std::from_chars(tk.value.data(), tk.value.data() + tk.value.size(), v);
            k->value = Value(v);
            e->b = std::move(k);
            return sized(std::move(e));
        }
        std::vector<ExprPtr> args;
        while (!is_op("]")) {
            if (!args.empty()) expect_op(",");
            args.push_back(parse_subscribed());
        }
        expect_op("]");
        auto e = make(ExprKind::Item, at);
        e->a = std::move(node);
        if (args.size() == 1) {
            if (args[0]->kind == ExprKind::Slice) {
                args[0]->a = std::move(e->a);
                return sized(std::move(args[0]));
            }
            e->b = std::move(args[0]);
        } else {
            auto t = make(ExprKind::Tuple, at);
            t->items = std::move(args);
            e->b = sized(std::move(t));
        }
        return sized(std::move(e));
    }

    // An item or a slice; a slice comes back as ExprKind::Slice with its
    // parts in items[0..2] (null when omitted) and `a` unset.
    ExprPtr parse_subscribed() {
        const Token& at = cur();
        std::vector<ExprPtr> parts;
        if (is_op(":")) {
            next();
            parts.emplace_back();
        } else {
            ExprPtr node = parse_expression(true);
            if (!is_op(":")) return node;
            next();
            parts.push_back(std::move(node));
        }
        if (is_op(":")) parts.emplace_back();
        else if (!is_op("]") && !is_op(",")) parts.push_back(parse_expression(true));
        else parts.emplace_back();
        if (is_op(":")) {
            next();
            if (!is_op("]") && !is_op(",")) parts.push_back(parse_expression(true));
            else parts.emplace_back();
        } else {
            parts.emplace_back();
        }
        auto e = make(ExprKind::Slice, at);
        e->items = std::move(parts);
        return sized(std::move(e));
    }

    Args parse_call_args() {
        const Token& at = cur();
        expect_op("(");
        Args a;
        bool require_comma = false;
        auto ensure = [&](bool ok) {
            if (!ok) fail("invalid syntax for function call expression", at);
        };
        while (!is_op(")")) {
            if (require_comma) {
                expect_op(",");
                if (is_op(")")) break;
            }
            if (is_op("*")) {
                ensure(!a.star && !a.starstar);
                next();
                a.star = parse_expression(true);
            } else if (is_op("**")) {
                ensure(!a.starstar);
                next();
                a.starstar = parse_expression(true);
            } else if (cur().kind == Tok::Name && look().kind == Tok::Op && look().value == "=") {
                ensure(!a.starstar);
                std::string key = next().value;
                next();
                a.kw.emplace_back(std::move(key), parse_expression(true));
            } else {
                ensure(!a.star && !a.starstar && a.kw.empty());
                a.pos.push_back(parse_expression(true));
            }
            require_comma = true;
        }
        expect_op(")");
        return a;
    }

    ExprPtr parse_call(ExprPtr node) {
        DepthGuard g(*this);
        auto e = make(ExprKind::Call, cur());
        e->args = parse_call_args();
        e->a = std::move(node);
        return sized(std::move(e));
    }

    ExprPtr parse_filter(ExprPtr node, bool start_inline) {
        while (is_op("|") || start_inline) {
            DepthGuard g(*this);
            if (!start_inline) next();
            const Token& tk = expect_name();
            auto e = make(ExprKind::Filter, tk);
            e->name = tk.value;
            while (is_op(".")) {
                next();
                e->name += "." + expect_name().value;
            }
            if (is_op("(")) e->args = parse_call_args();
            e->a = std::move(node);
            e->soft = soft_;
            check_known(*e, tk);
            node = sized(std::move(e));
            start_inline = false;
        }
        return node;
    }

    ExprPtr parse_test(ExprPtr node) {
        DepthGuard g(*this);
        const Token& at = next();
        const bool negated = skip_name("not");
        const Token& tk = expect_name();
        auto e = make(ExprKind::Test, at);
        e->name = tk.value;
        while (is_op(".")) {
            next();
            e->name += "." + expect_name().value;
        }
        if (is_op("(")) {
            e->args = parse_call_args();
        } else if ((cur().kind == Tok::Name || cur().kind == Tok::String || cur().kind == Tok::Int ||
                    cur().kind == Tok::Float || is_op("(") || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
            if (is_name("is")) fail("You cannot chain multiple tests with is");
            e->args.pos.push_back(parse_postfix(parse_primary()));
        }
        e->a = std::move(node);
        e->soft = soft_;
        check_known(*e, tk);
        e = sized(std::move(e));
        if (!negated) return e;
        auto n = make(ExprKind::Not, at);
        n->a = std::move(e);
        return sized(std::move(n));
    }

    // jinja2 checks filter/test names at compile time unless the use is
    // inside an if-block or a conditional expression (then at run time).
    void check_known(const Expr& e, const Token& at) {
        pending_.push_back({&e, at});
    }

public:
    void verify_names() {
        for (const auto& [e, at] : pending_) {
            if (e->soft) continue;
            if (e->kind == ExprKind::Filter && !is_known_filter(e->name))
                fail("No filter named '" + e->name + "'.", at, "TemplateAssertionError");
            if (e->kind == ExprKind::Test && !is_known_test(e->name))
                fail("No test named '" + e->name + "'.", at, "TemplateAssertionError");
        }
    }

private:
    std::vector<Token> t_;
    size_t i_ = 0;
    ParseLimits lim_;
    int depth_ = 0;
    int loop_depth_ = 0;
    bool soft_ = false;
    std::vector<std::vector<std::string>> end_stack_;
    std::vector<std::string> tag_stack_;
    std::vector<std::pair<const Expr*, Token>> pending_;
};

}  // namespace

Program parse(std::string_view source, const LexOptions& lex, const ParseLimits& limits) {
    Parser p(tokenize(source, lex), limits);
    Program prog = p.run();
    p.verify_names();
    resolve_symbols(prog);
    return prog;
}

}  // namespace quern::jinja
