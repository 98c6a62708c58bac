// Methods of str/list/dict/number values, host objects (namespace, loop,
// macros) and the template globals (see objects.h).
#include <algorithm>
#include <cmath>
#include <ctime>
#include <unordered_map>
#include <unordered_set>

#include "chat/eval.h"
#include "chat/filters.h"
#include "chat/objects.h"
#include "chat/ops.h"
#include "chat/pystr.h"

namespace quern::jinja {

namespace {

const std::unordered_set<std::string>& str_methods() {
    static const std::unordered_set<std::string> s = {
        "capitalize", "casefold",  "center",       "count",     "endswith",   "expandtabs", "find",
        "format",     "format_map", "index",       "isalnum",   "isalpha",    "isascii",    "isdecimal",
        "isdigit",    "isidentifier", "islower",   "isnumeric", "isprintable", "isspace",   "istitle",
        "isupper",    "join",      "ljust",        "lower",     "lstrip",     "partition",  "removeprefix",
        "removesuffix", "replace", "rfind",        "rindex",    "rjust",      "rpartition", "rsplit",
        "rstrip",     "split",     "splitlines",   "startswith", "strip",     "swapcase",   "title",
        "upper",      "zfill",     "encode",       "translate", "maketrans"};
    return s;
}
const std::unordered_set<std::string>& list_methods() {
    static const std::unordered_set<std::string> s = {"count", "index", "copy"};
    return s;
}
const std::unordered_set<std::string>& list_unsafe() {
    static const std::unordered_set<std::string> s = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"};
    return s;
}
const std::unordered_set<std::string>& dict_methods() {
    static const std::unordered_set<std::string> s = {"get", "items", "keys", "values", "copy", "fromkeys"};
    return s;
}
const std::unordered_set<std::string>& dict_unsafe() {
    static const std::unordered_set<std::string> s = {"clear", "pop", "popitem", "setdefault", "update"};
    return s;
}

// A str argument; `what` is Python's message prefix ("must be str", "replace() argument 1 must be str").
const std::string& str_arg(const Value& v, const std::string& what) {
    if (!v.is_string()) {
        if (v.is_undefined()) v.fail_undefined();
        type_error(what + ", not " + type_name(v));
    }
    return v.str();
}

std::optional<std::string> opt_str(const Value* v, const char* fn) {
    if (!v || v->is_none()) return std::nullopt;
    if (!v->is_string()) type_error(std::string(fn) + " arg must be None or str");
    return v->str();
}

// start/end code-point indices of find/startswith, clamped as Python slices do
void span(const Value* s, const Value* e, int64_t n, int64_t& b, int64_t& end) {
    b = 0, end = n;
    if (s && !s->is_none()) b = int_arg(*s, "start");
    if (e && !e->is_none()) end = int_arg(*e, "end");
    if (b < 0) b = std::max<int64_t>(0, b + n);
    if (end < 0) end = std::max<int64_t>(0, end + n);
    end = std::min(end, n);
}

bool affix(const std::string& s, const Value& pre, const Value* st, const Value* en, bool ends, const char* fn) {
    std::vector<std::string> cands;
    if (pre.is_string()) cands.push_back(pre.str());
    else if (pre.is_list() && pre.list_data().kind == SeqKind::Tuple) {
        for (const Value& p : pre.items()) {
            if (!p.is_string()) type_error("tuple for " + std::string(fn) + " must only contain str, not " + type_name(p));
            cands.push_back(p.str());
        }
    } else {
        if (pre.is_undefined()) pre.fail_undefined();
        type_error(std::string(fn) + " first arg must be str or a tuple of str, not " + type_name(pre));
    }
    std::string_view win = s;
    if (st || en) {
        int64_t b, e;
        span(st, en, static_cast<int64_t>(pystr::length(s)), b, e);
        if (b > e) return false;
        const size_t bb = pystr::byte_offset(s, static_cast<size_t>(b));
        win = std::string_view(s).substr(bb, pystr::byte_offset(s, static_cast<size_t>(e)) - bb);
    }
    for (const std::string& c : cands) {
        if (c.size() > win.size()) continue;
        if (ends ? win.substr(win.size() - c.size()) == c : win.substr(0, c.size()) == c) return true;
    }
    return false;
}

Value call_str_method_impl(Interp& in, const Value& self, const std::string& m, CallArgs& a);

// markupsafe's Markup wraps these str methods: string arguments are escaped
// and the results are Markup again.
Value call_str_method(Interp& in, const Value& self, const std::string& m, CallArgs& a) {
    if (!self.is_markup()) return call_str_method_impl(in, self, m, a);
    static const std::unordered_set<std::string> wrapped = {
        "capitalize", "title", "lower", "upper", "replace", "ljust", "rjust", "lstrip", "rstrip", "center", "strip",
        "expandtabs", "swapcase", "zfill", "casefold", "removeprefix", "removesuffix", "split", "rsplit",
        "splitlines", "partition", "rpartition", "join", "format", "format_map"};
    if (!wrapped.count(m)) return call_str_method_impl(in, self, m, a);
    auto esc = [](Value& v) {
        if (v.is_string() && !v.is_markup()) v = Value::markup(pystr::html_escape(v.str()));
    };
    CallArgs e = a;
    if (m == "join") {
        if (!e.pos.empty()) {
            std::vector<Value> items = iterate(e.pos[0]);
            for (Value& i : items) {
                if (!i.is_string()) i = Value::markup(pystr::html_escape(to_str(i)));
                else esc(i);
            }
            e.pos[0] = Value::list(std::move(items));
        }
    } else if (m == "format" || m == "format_map") {
        for (Value& v : e.pos) esc(v);
        for (auto& kv : e.kw) esc(kv.second);
    } else {
        for (Value& v : e.pos) esc(v);
        for (auto& kv : e.kw) esc(kv.second);
    }
    Value r = call_str_method_impl(in, self, m, e);
    if (r.is_string()) return Value::markup(r.str());
    if (r.is_list()) {
        std::vector<Value> items = r.items();
        for (Value& i : items)
            if (i.is_string()) i = Value::markup(i.str());
        return r.list_data().kind == SeqKind::Tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    return r;
}

Value call_str_method_impl(Interp& in, const Value& self, const std::string& m, CallArgs& a) {
    const std::string& s = self.str();
    auto B = [&](std::initializer_list<const char*> p) { return ArgBinder(a, m, p); };
    auto ret = [&](std::string r) {
        in.charge(r.size());
        return self.is_markup() ? Value::markup(std::move(r)) : Value(std::move(r));
    };
    if (m == "strip" || m == "lstrip" || m == "rstrip") {
        ArgBinder b = B({"chars"});
        return ret(pystr::strip(s, opt_str(b.get(0), m.c_str()), m != "rstrip", m != "lstrip"));
    }
    if (m == "split" || m == "rsplit") {
        ArgBinder b = B({"sep", "maxsplit"});
        const int64_t maxsplit = b.get(1) ? int_arg(*b.get(1), "maxsplit") : -1;
        const auto sep = opt_str(b.get(0), "must be str or None, not");
        std::vector<std::string> parts = m == "split" ? pystr::split(s, sep, maxsplit) : pystr::rsplit(s, sep, maxsplit);
        std::vector<Value> out;
        for (auto& p : parts) out.emplace_back(std::move(p));
        in.charge(s.size() + 16 * out.size());
        return Value::list(std::move(out));
    }
    if (m == "splitlines") {
        ArgBinder b = B({"keepends"});
        std::vector<Value> out;
        for (auto& p : pystr::splitlines(s, truthy(b.get_or(0, Value(false))))) out.emplace_back(std::move(p));
        in.charge(s.size() + 16 * out.size());
        return Value::list(std::move(out));
    }
    if (m == "startswith" || m == "endswith") {
        ArgBinder b = B({"prefix", "start", "end"});
        if (!b.get(0)) type_error(m + "() takes at least 1 argument (0 given)");
        return Value(affix(s, *b.get(0), b.get(1), b.get(2), m == "endswith", m.c_str()));
    }
    if (m == "replace") {
        ArgBinder b = B({"old", "new", "count"});
        if (!b.get(0) || !b.get(1)) type_error("replace expected at least 2 arguments, got " + std::to_string(a.pos.size()));
        std::string r = pystr::replace(s, str_arg(*b.get(0), "replace() argument 1 must be str"),
                                       str_arg(*b.get(1), "replace() argument 2 must be str"),
                                       b.get(2) ? int_arg(*b.get(2), "count") : -1);
        if (r.size() > in.options().limits.max_output) raise("MemoryError", "replaced string too large");
        return ret(std::move(r));
    }
    if (m == "find" || m == "rfind" || m == "index" || m == "rindex") {
        ArgBinder b = B({"sub", "start", "end"});
        if (!b.get(0)) type_error(m + "() takes at least 1 argument (0 given)");
        int64_t st, en;
        span(b.get(1), b.get(2), static_cast<int64_t>(pystr::length(s)), st, en);
        const int64_t r = pystr::find(s, str_arg(*b.get(0), "must be str"), st, en, m[0] == 'r');
        if (r < 0 && (m == "index" || m == "rindex")) raise("ValueError", "substring not found");
        return Value(r);
    }
    if (m == "count") {
        ArgBinder b = B({"sub"});
        if (!b.get(0)) type_error("count() takes at least 1 argument (0 given)");
        return Value(pystr::count(s, str_arg(*b.get(0), "must be str")));
    }
    if (m == "upper") return B({}), ret(pystr::upper(s));
    if (m == "lower" || m == "casefold") return B({}), ret(pystr::lower(s));
    if (m == "title") return B({}), ret(pystr::title(s));
    if (m == "capitalize") return B({}), ret(pystr::capitalize(s));
    if (m == "swapcase") return B({}), ret(pystr::swapcase(s));
    if (m == "join") {
        ArgBinder b = B({"iterable"});
        if (!b.get(0)) type_error("str.join() takes exactly one argument (0 given)");
        std::string out;
        size_t i = 0;
        for (const Value& item : iterate(*b.get(0))) {
            if (!item.is_string())
                type_error("sequence item " + std::to_string(i) + ": expected str instance, " + type_name(item) + " found");
            if (i++) out += s;
            out += item.str();
            if (out.size() > in.options().limits.max_output) raise("MemoryError", "joined string too large");
        }
        return ret(std::move(out));
    }
    if (m == "format") return ret(str_format(in, s, a));
    if (m == "format_map") {
        ArgBinder b = B({"mapping"});
        if (!b.get(0) || !b.get(0)->is_dict()) type_error("format_map() argument must be a mapping");
        CallArgs kw;
        for (const auto& [k, v] : b.get(0)->dict_data().items())
            if (k.is_string()) kw.kw.emplace_back(k.str(), v);
        return ret(str_format(in, s, kw));
    }
    if (m == "center" || m == "ljust" || m == "rjust") {
        ArgBinder b = B({"width", "fillchar"});
        if (!b.get(0)) type_error(m + "() takes at least 1 argument (0 given)");
        const int64_t w = int_arg(*b.get(0), "width");
        check_width(w);
        uint32_t fill = ' ';
        if (b.get(1)) {
            if (!b.get(1)->is_string()) type_error("The fill character must be a unicode character, not " + type_name(*b.get(1)));
            const std::string& f = b.get(1)->str();
            if (pystr::length(f) != 1) type_error("The fill character must be exactly one character long");
            size_t p = 0;
            fill = pystr::next_cp(f, p);
        }
        return ret(pystr::pad(s, w, fill, m == "center" ? '^' : m == "ljust" ? '<' : '>'));
    }
    if (m == "zfill") {
        ArgBinder b = B({"width"});
        if (!b.get(0)) type_error("zfill() takes exactly one argument (0 given)");
        const int64_t w = int_arg(*b.get(0), "width");
        check_width(w);
        return ret(pystr::zfill(s, w));
    }
    if (m == "partition" || m == "rpartition") {
        ArgBinder b = B({"sep"});
        if (!b.get(0)) type_error(m + "() takes exactly one argument (0 given)");
        const std::string& sep = str_arg(*b.get(0), "must be str");
        if (sep.empty()) raise("ValueError", "empty separator");
        const size_t f = m == "partition" ? s.find(sep) : s.rfind(sep);
        if (f == std::string::npos)
            return m == "partition" ? Value::tuple({Value(s), Value(""), Value("")}) : Value::tuple({Value(""), Value(""), Value(s)});
        return Value::tuple({Value(s.substr(0, f)), Value(sep), Value(s.substr(f + sep.size()))});
    }
    if (m == "removeprefix" || m == "removesuffix") {
        ArgBinder b = B({"affix"});
        if (!b.get(0)) type_error(m + "() takes exactly one argument (0 given)");
        const std::string& x = str_arg(*b.get(0), m + "() argument must be str");
        if (m == "removeprefix" && s.compare(0, x.size(), x) == 0) return ret(s.substr(x.size()));
        if (m == "removesuffix" && !x.empty() && s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
            return ret(s.substr(0, s.size() - x.size()));
        return self;
    }
    if (m == "expandtabs") {
        ArgBinder b = B({"tabsize"});
        const int64_t ts = std::clamp<int64_t>(int_arg(b.get_or(0, Value(8)), "tabsize"), 0, 1000);
        std::string out;
        int64_t col = 0;
        for (size_t i = 0; i < s.size();) {
            const size_t st = i;
            const uint32_t c = pystr::next_cp(s, i);
            if (c == '\t') {
                const int64_t n = ts ? ts - col % ts : 0;
                out.append(static_cast<size_t>(n), ' ');
                col += n;
            } else {
                out.append(s, st, i - st);
                col = (c == '\n' || c == '\r') ? 0 : col + 1;
            }
        }
        return ret(std::move(out));
    }
    B({});
    if (m == "isalpha") return Value(pystr::str_all(s, pystr::is_alpha));
    if (m == "isdigit") return Value(pystr::str_all(s, pystr::is_digit));
    if (m == "isdecimal") return Value(pystr::str_all(s, pystr::is_decimal));
    if (m == "isnumeric") return Value(pystr::str_all(s, pystr::is_numeric));
    if (m == "isalnum")
        return Value(pystr::str_all(s, [](uint32_t c) { return pystr::is_alpha(c) || pystr::is_numeric(c); }));
    if (m == "isspace") return Value(pystr::str_all(s, pystr::is_space));
    if (m == "isupper") return Value(pystr::str_isupper(s));
    if (m == "islower") return Value(pystr::str_islower(s));
    if (m == "istitle") return Value(pystr::str_istitle(s));
    if (m == "isascii") return Value(pystr::is_ascii(s));
    if (m == "isprintable") return Value(s.empty() || pystr::str_all(s, pystr::is_printable));
    if (m == "isidentifier") {
        if (s.empty()) return Value(false);
        size_t p = 0;
        const uint32_t c0 = pystr::next_cp(s, p);
        if (!(c0 == '_' || pystr::is_alpha(c0))) return Value(false);
        return Value(p == s.size() ||
                     pystr::str_all(std::string_view(s).substr(p), [](uint32_t c) { return c == '_' || pystr::is_alpha(c) || pystr::is_decimal(c); }));
    }
    raise("TemplateRuntimeError", "str." + m + "() is not supported by quern");
}

Value call_seq_method(Interp& in, const Value& self, const std::string& m, CallArgs& a) {
    const auto& items = self.items();
    if (m == "count") {
        ArgBinder b(a, "count", {"value"});
        if (!b.get(0)) type_error("count() takes exactly one argument (0 given)");
        int64_t n = 0;
        for (const Value& v : items) n += equals(v, *b.get(0));
        return Value(n);
    }
    if (m == "index") {
        ArgBinder b(a, "index", {"value", "start", "stop"});
        if (!b.get(0)) type_error("index expected at least 1 argument, got 0");
        int64_t st, en;
        span(b.get(1), b.get(2), static_cast<int64_t>(items.size()), st, en);
        for (int64_t i = st; i < en; ++i)
            if (equals(items[static_cast<size_t>(i)], *b.get(0))) return Value(i);
        if (self.list_data().kind == SeqKind::Tuple) raise("ValueError", "tuple.index(x): x not in tuple");
        raise("ValueError", repr(*b.get(0)) + " is not in list");
    }
    if (m == "copy") {
        ArgBinder b(a, "copy", {});
        in.charge(16 * items.size());
        return Value::list(items);
    }
    raise("TemplateRuntimeError", "list." + m + "() is not supported");
}

Value call_dict_method(Interp& in, const Value& self, const std::string& m, CallArgs& a) {
    const DictData& d = self.dict_data();
    if (m == "get") {
        ArgBinder b(a, "get", {"key", "default"});
        if (!b.get(0)) type_error("get expected at least 1 argument, got 0");
        const Value& k = *b.get(0);
        check_hashable(k);
        if (const Value* v = d.find(k)) return *v;
        return b.get_or(1, Value::none());
    }
    if (m == "items" || m == "keys" || m == "values") {
        ArgBinder b(a, m, {});
        std::vector<Value> out;
        for (const auto& [k, v] : d.items()) out.push_back(m == "items" ? Value::tuple({k, v}) : m == "keys" ? k : v);
        in.charge(16 * out.size());
        return Value::view(std::move(out), "dict_" + m);
    }
    if (m == "copy") {
        ArgBinder b(a, "copy", {});
        auto c = std::make_shared<DictData>();
        for (const auto& [k, v] : d.items()) c->set(k, v);
        in.charge(32 * d.size());
        return Value(std::move(c));
    }
    raise("TemplateRuntimeError", "dict." + m + "() is not supported");
}

}  // namespace

// ------------------------------------------------------------------ method dispatch

bool has_method(const Value& self, const std::string& name, bool& unsafe) {
    unsafe = false;
    if (name.size() > 4 && name.compare(0, 2, "__") == 0 && name.compare(name.size() - 2, 2, "__") == 0) {
        if (self.is_undefined() || self.is_object()) return false;
        unsafe = true;
        return true;
    }
    switch (self.kind()) {
        case Kind::String: return str_methods().count(name) > 0;
        case Kind::List:
            if (!self.is_sequence_list()) return false;
            if (self.list_data().kind == SeqKind::List && list_unsafe().count(name)) return unsafe = true;
            if (self.list_data().kind == SeqKind::Tuple && name == "copy") return false;
            return list_methods().count(name) > 0;
        case Kind::Dict:
            if (dict_unsafe().count(name)) return unsafe = true;
            return dict_methods().count(name) > 0;
        case Kind::Int:
        case Kind::Bool: return name == "bit_length" || name == "conjugate" || name == "bit_count";
        case Kind::Float: return name == "is_integer" || name == "conjugate";
        default: return false;
    }
}

bool builtin_property(const Value& self, const std::string& name, Value& out) {
    if (self.is_int() || self.is_bool()) {
        if (name == "real" || name == "numerator") return out = Value(self.as_int()), true;
        if (name == "imag") return out = Value(0), true;
        if (name == "denominator") return out = Value(1), true;
    }
    if (self.is_float()) {
        if (name == "real") return out = self, true;
        if (name == "imag") return out = Value(0.0), true;
    }
    return false;
}

Value call_method(Interp& in, const Value& self, const std::string& name, CallArgs& args) {
    bool unsafe = false;
    if (!has_method(self, name, unsafe) || unsafe) {
        const Value attr = in.getattr(self, name);
        return in.call(attr, args);
    }
    switch (self.kind()) {
        case Kind::String: return call_str_method(in, self, name, args);
        case Kind::List: return call_seq_method(in, self, name, args);
        case Kind::Dict: return call_dict_method(in, self, name, args);
        case Kind::Int:
        case Kind::Bool: {
            ArgBinder b(args, name, {});
            if (name == "conjugate") return Value(self.as_int());
            const int64_t v = self.as_int();
            const uint64_t mag = v < 0 ? static_cast<uint64_t>(-(v + 1)) + 1 : static_cast<uint64_t>(v);
            if (name == "bit_count") return Value(static_cast<int64_t>(__builtin_popcountll(mag)));
            return Value(static_cast<int64_t>(mag ? 64 - __builtin_clzll(mag) : 0));
        }
        case Kind::Float: {
            ArgBinder b(args, name, {});
            if (name == "conjugate") return self;
            const double d = self.as_double();
            return Value(std::isfinite(d) && d == std::floor(d));
        }
        default: break;
    }
    type_error("'" + type_name(self) + "' object has no method '" + name + "'");
}

// ------------------------------------------------------------------ objects

std::string Namespace::repr() const {
    // Python's dict repr prints a dict it is already inside as {...}
    thread_local std::vector<const Namespace*> active;
    if (std::find(active.begin(), active.end(), this) != active.end()) return "<Namespace {...}>";
    if (active.size() > 200) raise("RecursionError", "maximum recursion depth exceeded while getting the repr of an object");
    active.push_back(this);
    std::string s = "<Namespace {";
    try {
        for (size_t i = 0; i < attrs.size(); ++i) {
            if (i) s += ", ";
            s += str_repr(attrs[i].first) + ": " + jinja::repr(attrs[i].second);
        }
    } catch (...) {
        active.pop_back();
        throw;
    }
    active.pop_back();
    return s + "}>";
}

Value Namespace::getattr(const std::string& name) const {
    for (const auto& [k, v] : attrs)
        if (k == name) return v;
    return Object::getattr(name);
}

void Namespace::set(const std::string& name, Value v) {
    for (auto& [k, old] : attrs)
        if (k == name) {
            old = std::move(v);
            return;
        }
    attrs.emplace_back(name, std::move(v));
}

std::string BoundMethod::repr() const {
    return "<built-in method " + name_ + " of " + jinja::type_name(self_) + " object at 0x0>";
}

Value BoundMethod::call(Interp& in, CallArgs& args) { return call_method(in, self_, name_, args); }

std::string Macro::repr() const { return "<Macro " + str_repr(name_) + ">"; }

Value Macro::getattr(const std::string& name) const {
    if (name == "name") return Value(name_);
    if (name == "arguments") {
        std::vector<Value> a;
        for (const auto& p : def_->params) a.emplace_back(p.name);
        return Value::tuple(std::move(a));
    }
    if (name == "catch_kwargs") return Value(def_->uses_kwargs);
    if (name == "catch_varargs") return Value(def_->uses_varargs);
    if (name == "caller") return Value(def_->uses_caller);
    return Object::getattr(name);
}

std::string LoopObject::repr() const {
    return "<LoopContext " + std::to_string(index0 + 1) + "/" + std::to_string(items ? items->size() : 0) + ">";
}

Value LoopObject::getattr(const std::string& name) const {
    auto* me = const_cast<LoopObject*>(this);
    if (!items) return Object::getattr(name);
    if (name == "length" || name == "revindex" || name == "revindex0") me->ensure(SIZE_MAX);
    if (name == "last" || name == "nextitem") me->ensure(static_cast<size_t>(index0) + 2);
    const int64_t n = static_cast<int64_t>(items->size());
    if (name == "index") return Value(index0 + 1);
    if (name == "index0") return Value(index0);
    if (name == "revindex") return Value(n - index0);
    if (name == "revindex0") return Value(n - index0 - 1);
    if (name == "first") return Value(index0 == 0);
    if (name == "last") return Value(index0 >= n - 1);
    if (name == "length") return Value(n);
    if (name == "depth") return Value(depth0 + 1);
    if (name == "depth0") return Value(depth0);
    if (name == "previtem") {
        if (index0 == 0) return Value::undefined("there is no previous item");
        return (*items)[static_cast<size_t>(index0 - 1)];
    }
    if (name == "nextitem") {
        if (index0 + 1 >= n) return Value::undefined("there is no next item");
        return (*items)[static_cast<size_t>(index0 + 1)];
    }
    auto self = std::static_pointer_cast<LoopObject>(const_cast<LoopObject*>(this)->shared_from_this());
    if (name == "cycle") {
        return Value(std::static_pointer_cast<Object>(std::make_shared<NativeFunction>(
            "cycle", [self](Interp&, CallArgs& a) -> Value {
                if (a.pos.empty()) type_error("no items for cycling given");
                return a.pos[static_cast<size_t>(self->index0 % static_cast<int64_t>(a.pos.size()))];
            })));
    }
    if (name == "changed") {
        return Value(std::static_pointer_cast<Object>(std::make_shared<NativeFunction>(
            "changed", [self](Interp&, CallArgs& a) -> Value {
                const Value cur = Value::list(a.pos);
                if (!self->changed_called || !equals(cur, self->last_changed)) {
                    self->changed_called = true;
                    self->last_changed = cur;
                    return Value(true);
                }
                return Value(false);
            })));
    }
    return Object::getattr(name);
}

// ------------------------------------------------------------------ globals

namespace {

class Cycler : public Object {
public:
    std::vector<Value> items;
    size_t pos = 0;
    std::string type_name() const override { return "Cycler"; }
    std::string type_repr() const override { return "jinja2.utils.Cycler object"; }
    Value getattr(const std::string& name) const override {
        auto self = std::static_pointer_cast<Cycler>(const_cast<Cycler*>(this)->shared_from_this());
        if (name == "current") return items[pos];
        if (name == "next")
            return Value(std::static_pointer_cast<Object>(std::make_shared<NativeFunction>("next", [self](Interp&, CallArgs&) {
                const Value v = self->items[self->pos];
                self->pos = (self->pos + 1) % self->items.size();
                return v;
            })));
        if (name == "reset")
            return Value(std::static_pointer_cast<Object>(std::make_shared<NativeFunction>("reset", [self](Interp&, CallArgs&) {
                self->pos = 0;
                return Value::none();
            })));
        return Object::getattr(name);
    }
};

class Joiner : public Object {
public:
    std::string sep;
    bool used = false;
    std::string type_name() const override { return "Joiner"; }
    std::string type_repr() const override { return "jinja2.utils.Joiner object"; }
    bool callable() const override { return true; }
    Value call(Interp&, CallArgs&) override {
        if (!used) {
            used = true;
            return Value("");
        }
        return Value(sep);
    }
};

Value fn_range(Interp& in, CallArgs& a) {
    if (!a.kw.empty()) type_error("range() takes no keyword arguments");
    if (a.pos.empty() || a.pos.size() > 3) type_error("range expected at least 1 argument, got " + std::to_string(a.pos.size()));
    int64_t start = 0, stop, step = 1;
    if (a.pos.size() == 1) stop = int_arg(a.pos[0], "");
    else start = int_arg(a.pos[0], ""), stop = int_arg(a.pos[1], "");
    if (a.pos.size() == 3) step = int_arg(a.pos[2], "");
    if (step == 0) raise("ValueError", "range() arg 3 must not be zero");
    __int128 n = 0;
    if (step > 0 && stop > start) n = ((__int128)stop - start + step - 1) / step;
    if (step < 0 && stop < start) n = ((__int128)start - stop - step - 1) / -step;
    if (n > 100000)
        raise("OverflowError", "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    in.charge(16 * static_cast<uint64_t>(n));
    std::vector<Value> out;
    out.reserve(static_cast<size_t>(n));
    for (int64_t i = 0, v = start; i < static_cast<int64_t>(n); ++i, v += step) out.emplace_back(v);
    return Value::list(std::move(out));
}

void fill_mapping(std::vector<std::pair<Value, Value>>& out, const CallArgs& a, const char* fn) {
    if (a.pos.size() > 1) type_error(std::string(fn) + " expected at most 1 argument, got " + std::to_string(a.pos.size()));
    if (!a.pos.empty()) {
        const Value& src = a.pos[0];
        if (src.is_dict()) {
            out = src.dict_data().items();
        } else {
            size_t i = 0;
            for (const Value& p : iterate(src)) {
                const std::vector<Value> kv = p.is_string() ? std::vector<Value>{} : iterate(p);
                if (kv.size() != 2)
                    raise("ValueError", "dictionary update sequence element #" + std::to_string(i) + " has length " +
                                            std::to_string(kv.size()) + "; 2 is required");
                out.emplace_back(kv[0], kv[1]);
                ++i;
            }
        }
    }
    for (const auto& [k, v] : a.kw) out.emplace_back(Value(k), v);
}

Value fn_dict(Interp& in, CallArgs& a) {
    std::vector<std::pair<Value, Value>> kv;
    fill_mapping(kv, a, "dict");
    auto d = std::make_shared<DictData>();
    for (auto& [k, v] : kv) d->set(k, v);
    in.charge(32 * d->size());
    return Value(std::move(d));
}

Value fn_namespace(Interp& in, CallArgs& a) {
    std::vector<std::pair<Value, Value>> kv;
    fill_mapping(kv, a, "Namespace");
    auto ns = std::make_shared<Namespace>();
    for (auto& [k, v] : kv) {
        if (!k.is_string()) type_error("keywords must be strings");
        ns->set(k.str(), v);
    }
    in.adopt(ns);
    return Value(std::static_pointer_cast<Object>(ns));
}

Value fn_strftime_now(Interp& in, CallArgs& a) {
    ArgBinder b(a, "strftime_now", {"format"});
    if (!b.get(0)) type_error("strftime_now() missing 1 required positional argument: 'format'");
    const std::string fmt = to_str(*b.get(0));
    std::tm tm{};
    if (in.options().now) {
        tm = *in.options().now;
    } else {
        const std::time_t t = std::time(nullptr);
        localtime_r(&t, &tm);
    }
    // datetime.strftime: %f is microseconds; a naive datetime has empty %z/%Z
    std::string f;
    for (size_t i = 0; i < fmt.size(); ++i) {
        if (fmt[i] == '%' && i + 1 < fmt.size()) {
            const char c = fmt[i + 1];
            if (c == 'f') f += "000000", ++i;
            else if (c == 'z' || c == 'Z') ++i;
            else f += fmt[i], f += fmt[++i];
        } else {
            f += fmt[i];
        }
    }
    if (f.size() > 4096) raise("ValueError", "format string too long");
    std::string out(f.size() * 8 + 64, '\0');
    const size_t n = f.empty() ? 0 : std::strftime(out.data(), out.size(), f.c_str(), &tm);
    out.resize(n);
    return Value(std::move(out));
}

const std::unordered_map<std::string, Value>& globals() {
    static const std::unordered_map<std::string, Value> g = [] {
        std::unordered_map<std::string, Value> m;
        // Python types of jinja2's globals: plain functions, or classes ("type")
        // what Python prints for jinja2's globals (functions with their
        // qualified names as Hugging Face defines them; classes)
        static const std::unordered_map<std::string, std::string> reprs = {
            {"range", "<function safe_range at 0x0>"},
            {"dict", "<class 'dict'>"},
            {"namespace", "<class 'jinja2.utils.Namespace'>"},
            {"cycler", "<class 'jinja2.utils.Cycler'>"},
            {"joiner", "<class 'jinja2.utils.Joiner'>"},
            {"lipsum", "<function generate_lorem_ipsum at 0x0>"},
            {"raise_exception", "<function _compile_jinja_template.<locals>.raise_exception at 0x0>"},
            {"strftime_now", "<function _compile_jinja_template.<locals>.strftime_now at 0x0>"}};
        auto add = [&](const char* name, NativeFunction::Fn fn) {
            const std::string& r = reprs.at(name);
            const char* type = r.compare(0, 6, "<class") == 0 ? "type" : "function";
            m.emplace(name, Value(std::static_pointer_cast<Object>(std::make_shared<NativeFunction>(name, std::move(fn), type, r))));
        };
        add("range", fn_range);
        add("dict", fn_dict);
        add("namespace", fn_namespace);
        add("strftime_now", fn_strftime_now);
        add("raise_exception", [](Interp&, CallArgs& a) -> Value {
            ArgBinder b(a, "raise_exception", {"message"});
            raise("TemplateError", b.get(0) ? to_str(*b.get(0)) : std::string());
        });
        add("cycler", [](Interp&, CallArgs& a) -> Value {
            if (a.pos.empty()) type_error("at least one item has to be provided");
            auto c = std::make_shared<Cycler>();
            c->items = a.pos;
            return Value(std::static_pointer_cast<Object>(c));
        });
        add("joiner", [](Interp&, CallArgs& a) -> Value {
            ArgBinder b(a, "joiner", {"sep"});
            auto j = std::make_shared<Joiner>();
            j->sep = to_str(b.get_or(0, Value(", ")));
            return Value(std::static_pointer_cast<Object>(j));
        });
        add("lipsum", [](Interp&, CallArgs&) -> Value {
            raise("TemplateRuntimeError", "lipsum() is not supported by quern");
        });
        return m;
    }();
    return g;
}

}  // namespace

Value lookup_global(const std::string& name) {
    const auto& g = globals();
    const auto it = g.find(name);
    return it == g.end() ? Value() : it->second;
}

}  // namespace quern::jinja
