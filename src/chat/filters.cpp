// jinja2's builtin filters and tests (see filters.h). Each follows the
// behaviour of jinja2 3.1 on Python values, including its error messages.
#include "chat/filters.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <unordered_map>

#include "chat/eval.h"
#include "chat/objects.h"
#include "chat/ops.h"
#include "chat/pystr.h"

namespace quern::jinja {

// ------------------------------------------------------------------ helpers

ArgBinder::ArgBinder(const CallArgs& args, std::string fname, std::initializer_list<const char*> params)
    : slots_(params.size(), nullptr) {
    const std::vector<const char*> names(params);
    if (args.pos.size() > names.size())
        type_error(fname + "() takes at most " + std::to_string(names.size()) + " arguments (" +
                   std::to_string(args.pos.size()) + " given)");
    for (size_t i = 0; i < args.pos.size(); ++i) slots_[i] = &args.pos[i];
    for (const auto& [k, v] : args.kw) {
        size_t i = 0;
        while (i < names.size() && k != names[i]) ++i;
        if (i == names.size()) type_error(fname + "() got an unexpected keyword argument '" + k + "'");
        if (slots_[i]) type_error(fname + "() got multiple values for argument '" + k + "'");
        slots_[i] = &v;
    }
}

std::string soft_str(const Value& v) { return v.is_string() ? v.str() : to_str(v); }

int64_t int_arg(const Value& v, const char* what) {
    if (v.is_int() || v.is_bool()) return v.as_int();
    if (v.is_undefined()) v.fail_undefined();
    type_error(std::string("'") + type_name(v) + "' object cannot be interpreted as an integer" +
               (what && *what ? std::string(" (") + what + ")" : std::string()));
}

namespace {

Value str_result(const Value& like, std::string s) { return like.is_markup() ? Value::markup(std::move(s)) : Value(std::move(s)); }

// jinja2's ignore_case postprocessor: lowercase strings only.
Value ignore_case(const Value& v) { return v.is_string() ? Value(pystr::lower(v.str())) : v; }

// "a.b.0" -> ["a", "b", 0]
std::vector<Value> attribute_parts(const Value& attr) {
    std::vector<Value> parts;
    if (attr.is_none() || attr.is_undefined()) return parts;
    if (!attr.is_string()) return {attr};
    for (const std::string& p : pystr::split(attr.str(), std::string("."), -1)) {
        int64_t n;
        if (pystr::str_all(p, pystr::is_digit) && parse_int(p, 10, n)) parts.emplace_back(n);
        else parts.emplace_back(p);
    }
    return parts;
}

Value get_path(Interp& in, Value item, const std::vector<Value>& parts, const Value* def) {
    for (const Value& p : parts) {
        item = in.getitem(item, p);
        if (def && !def->is_none() && item.is_undefined()) item = *def;
    }
    return item;
}

std::string json_indent(const Value& v) {
    if (v.is_string()) return v.str();
    const int64_t n = int_arg(v, "indent");
    return std::string(static_cast<size_t>(std::clamp<int64_t>(n, 0, 1000)), ' ');
}

Value do_tojson(Interp& in, const Value& v, CallArgs& args) {
    ArgBinder b(args, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
    JsonOptions o;
    o.ensure_ascii = truthy(b.get_or(0, Value(false)));
    const Value indent = b.get_or(1, Value::none());
    if (!indent.is_none()) {
        o.has_indent = true;
        o.indent = json_indent(indent);
        o.item_sep = ",";
    }
    const Value seps = b.get_or(2, Value::none());
    if (!seps.is_none()) {
        const std::vector<Value> s = iterate(seps);
        if (s.size() != 2) raise("ValueError", "too many values to unpack (expected 2)");
        if (!s[0].is_string() || !s[1].is_string()) type_error("separators must be strings");
        o.item_sep = s[0].str();
        o.key_sep = s[1].str();
    }
    o.sort_keys = truthy(b.get_or(3, Value(false)));
    std::string r = to_json(v, o);
    in.charge(r.size());
    return Value(std::move(r));
}

std::string do_indent(const Value& s, const Value& width, bool first, bool blank) {
    if (!s.is_string()) {  // jinja2 does `s += "\n"` first
        if (s.is_undefined()) s.fail_undefined();
        if (s.is_list() && s.list_data().kind == SeqKind::List)
            raise("AttributeError", "'list' object has no attribute 'splitlines'");
        if (s.is_list() && s.list_data().kind == SeqKind::Tuple)
            type_error("can only concatenate tuple (not \"str\") to tuple");
        type_error("unsupported operand type(s) for +=: '" + type_name(s) + "' and 'str'");
    }
    int64_t w = width.is_string() ? 0 : int_arg(width, "width");
    check_width(w);
    const std::string ind = width.is_string() ? width.str() : std::string(static_cast<size_t>(std::max<int64_t>(w, 0)), ' ');
    const std::vector<std::string> lines = pystr::splitlines(s.str() + "\n", false);
    std::string rv;
    if (blank) {
        for (size_t i = 0; i < lines.size(); ++i) {
            if (i) rv += "\n" + ind;
            rv += lines[i];
        }
    } else {
        rv = lines.empty() ? "" : lines[0];
        for (size_t i = 1; i < lines.size(); ++i) {
            rv += "\n";
            if (!lines[i].empty()) rv += ind;
            rv += lines[i];
        }
    }
    if (first) rv = ind + rv;
    return rv;
}

// Python's sorted(items, key=...) with a stable sort; raises on unorderable keys.
std::vector<Value> sorted_by(std::vector<Value> items, const std::vector<Value>& keys, bool reverse) {
    const std::vector<size_t> idx = py_sort_order(keys, reverse);
    std::vector<Value> out;
    out.reserve(items.size());
    for (size_t i : idx) out.push_back(std::move(items[i]));
    return out;
}

Value do_round(Interp& in, const Value& v, int64_t prec, const std::string& method) {
    if (method != "common" && method != "ceil" && method != "floor")
        raise("FilterArgumentError", "method must be common, ceil or floor");
    if (method == "common") {
        if (!v.is_number()) type_error("type " + type_name(v) + " doesn't define __round__ method");
        if (!v.is_float()) {
            if (prec >= 0) return Value(v.as_int());
            if (prec < -18) return Value(0);
            int64_t p = 1;
            for (int64_t k = 0; k < -prec; ++k) p *= 10;
            const int64_t x = v.as_int();
            int64_t q = x / p, r = x % p;
            if (r < 0) r += p, --q;
            if (2 * r > p || (2 * r == p && (q & 1))) ++q;
            return Value(q * p);
        }
        const double d = v.as_double();
        if (!std::isfinite(d)) return Value(d);
        if (prec >= 0) {
            char buf[400];
            std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::min<int64_t>(prec, 300)), d);
            double r = 0;
            parse_float(buf, r);
            return Value(r);
        }
        const double p = std::pow(10.0, static_cast<double>(-prec));
        return Value(std::nearbyint(d / p) * p);
    }
    // math.ceil/floor(value * 10**precision) / 10**precision, as jinja2 computes it
    const Value scale = prec >= 0 && prec < 19 ? binary_op(in, "**", Value(10), Value(prec)) : Value(std::pow(10.0, static_cast<double>(prec)));
    const Value x = binary_op(in, "*", v, scale);
    if (!x.is_number()) type_error("must be real number, not " + type_name(x));
    Value r;
    if (x.is_float()) {
        const double d = method == "ceil" ? std::ceil(x.as_double()) : std::floor(x.as_double());
        if (!std::isfinite(d)) raise("OverflowError", "cannot convert float infinity to integer");
        if (std::fabs(d) > 9.2e18) raise("OverflowError", "integer overflow (template integers are 64-bit)");
        r = Value(static_cast<int64_t>(d));
    } else {
        r = Value(x.as_int());
    }
    return binary_op(in, "/", r, scale);
}

std::string do_title(const std::string& s) {
    // jinja2 splits on runs of [-\s({\[<] and capitalizes each piece
    std::string out;
    std::string piece;
    auto is_sep = [](uint32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || pystr::is_space(c); };
    auto flush = [&]() {
        if (piece.empty()) return;
        size_t p = 0;
        const uint32_t c0 = pystr::next_cp(piece, p);
        std::string first;
        pystr::append_cp(first, c0);
        out += pystr::upper(first) + pystr::lower(piece.substr(p));
        piece.clear();
    };
    for (size_t i = 0; i < s.size();) {
        const size_t st = i;
        const uint32_t c = pystr::next_cp(s, i);
        if (is_sep(c)) {
            flush();
            out.append(s, st, i - st);
        } else {
            piece.append(s, st, i - st);
        }
    }
    flush();
    return out;
}

std::string do_striptags(const std::string& s) {
    std::string t;
    for (size_t i = 0; i < s.size();) {
        if (s.compare(i, 4, "<!--") == 0) {
            const size_t e = s.find("-->", i + 4);
            if (e == std::string::npos) {
                t.append(s, i, std::string::npos);
                break;
            }
            i = e + 3;
        } else if (s[i] == '<') {
            const size_t e = s.find('>', i + 1);
            if (e == std::string::npos) {
                t.append(s, i, std::string::npos);
                break;
            }
            i = e + 1;
        } else {
            t.push_back(s[i++]);
        }
    }
    std::string joined;
    for (const std::string& w : pystr::split(t, std::nullopt, -1)) {
        if (!joined.empty()) joined += ' ';
        joined += w;
    }
    static const std::pair<const char*, const char*> ents[] = {
        {"&amp;", "&"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&#34;", "\""}, {"&#39;", "'"}, {"&quot;", "\""}, {"&apos;", "'"}};
    for (const auto& [e, r] : ents) joined = pystr::replace(joined, e, r, -1);
    return joined;
}

std::string do_filesizeformat(const Value& v, bool binary) {
    double bytes = 0;
    if (v.is_string()) {
        if (!parse_float(v.str(), bytes)) raise("ValueError", "could not convert string to float: " + str_repr(v.str()));
    } else if (v.is_number()) {
        bytes = v.as_double();
    } else {
        type_error("float() argument must be a string or a real number, not '" + type_name(v) + "'");
    }
    const double base = binary ? 1024 : 1000;
    static const char* dec[] = {"kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
    static const char* bin[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
    char buf[64];
    if (bytes == 1) return "1 Byte";
    if (bytes < base) {
        std::snprintf(buf, sizeof buf, "%d Bytes", static_cast<int>(bytes));
        return buf;
    }
    double unit = base;
    for (int i = 0; i < 8; ++i) {
        unit = std::pow(base, i + 2);
        if (bytes < unit || i == 7) {
            std::snprintf(buf, sizeof buf, "%.1f %s", base * bytes / unit, binary ? bin[i] : dec[i]);
            return buf;
        }
    }
    return buf;
}

std::string url_quote(const std::string& s, bool for_qs) {
    static const char* hex = "0123456789ABCDEF";
    std::string out;
    for (unsigned char c : s) {
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
            c == '-' || c == '~' || (!for_qs && c == '/')) {
            out.push_back(static_cast<char>(c));
        } else if (for_qs && c == ' ') {
            out.push_back('+');
        } else {
            out.push_back('%');
            out.push_back(hex[c >> 4]);
            out.push_back(hex[c & 15]);
        }
    }
    return out;
}

std::string do_truncate(Interp& in, const std::string& s, int64_t length, bool killwords, const std::string& end,
                        int64_t leeway) {
    const int64_t end_len = static_cast<int64_t>(pystr::length(end));
    if (length < end_len) raise("AssertionError", "expected length >= " + std::to_string(end_len) + ", got " + std::to_string(length));
    if (leeway < 0) raise("AssertionError", "expected leeway >= 0, got " + std::to_string(leeway));
    const std::u32string u = pystr::decode(s);
    if (static_cast<int64_t>(u.size()) <= length + leeway) return s;
    const std::string head = pystr::encode(std::u32string_view(u).substr(0, static_cast<size_t>(length - end_len)));
    if (killwords) return head + end;
    (void)in;
    return pystr::rsplit(head, std::string(" "), 1)[0] + end;
}

std::string do_wordwrap(const std::string& s, int64_t width, bool break_long, const std::string& wrap) {
    // A close approximation of textwrap.wrap(expand_tabs=False, replace_whitespace=False)
    if (width <= 0) raise("ValueError", "invalid width " + std::to_string(width) + " (must be > 0)");
    std::string out;
    bool first_para = true;
    for (const std::string& para : pystr::splitlines(s, false)) {
        if (!first_para) out += wrap;
        first_para = false;
        std::vector<std::string> lines;
        std::string line;
        int64_t line_len = 0;
        for (const std::string& word : pystr::split(para, std::nullopt, -1)) {
            std::u32string w = pystr::decode(word);
            while (true) {
                const int64_t need = static_cast<int64_t>(w.size()) + (line_len ? 1 : 0);
                if (line_len + need <= width) {
                    if (line_len) line += ' ', ++line_len;
                    line += pystr::encode(w);
                    line_len += static_cast<int64_t>(w.size());
                    break;
                }
                if (line_len) {
                    lines.push_back(line);
                    line.clear();
                    line_len = 0;
                    continue;
                }
                if (!break_long) {
                    lines.push_back(pystr::encode(w));
                    break;
                }
                lines.push_back(pystr::encode(std::u32string_view(w).substr(0, static_cast<size_t>(width))));
                w = w.substr(static_cast<size_t>(width));
                if (w.empty()) break;
            }
        }
        if (line_len) lines.push_back(line);
        for (size_t i = 0; i < lines.size(); ++i) {
            if (i) out += wrap;
            out += lines[i];
        }
    }
    return out;
}

// A generator that yields `prefix` and then raises `e` (jinja2's generator
// filters fail only when consumed).
Value pending_iterator(std::vector<Value> prefix, const TemplateError& e) {
    Value it = Value::iterator(std::move(prefix));
    it.list_data().pending = std::make_shared<TemplateError>(e);
    return it;
}

Value select_or_reject(Interp& in, const Value& v, CallArgs& args, bool select, bool attr) {
    std::vector<Value> out;
    if (!truthy(v)) return Value::iterator({});
    std::vector<Value> parts;
    size_t off = 0;
    if (attr) {
        if (args.pos.empty()) raise("FilterArgumentError", "Missing parameter for attribute name");
        parts = attribute_parts(args.pos[0]);
        off = 1;
    }
    std::string test_name;
    CallArgs targs;
    const bool has_test = args.pos.size() > off;
    if (has_test) {
        if (!args.pos[off].is_string()) type_error("test name must be a string");
        test_name = args.pos[off].str();
        targs.pos.assign(args.pos.begin() + static_cast<std::ptrdiff_t>(off + 1), args.pos.end());
        targs.kw = args.kw;
    }
    for (const Value& item : iterate(v)) {
        in.step();
        try {
            const Value x = attr ? get_path(in, item, parts, nullptr) : item;
            CallArgs a = targs;
            const bool ok = has_test ? in.test(test_name, x, a) : truthy(x);
            if (ok == select) out.push_back(item);
        } catch (const TemplateError& e) {
            return pending_iterator(std::move(out), e);
        }
    }
    in.charge(16 * out.size());
    return Value::iterator(std::move(out));
}

Value do_map(Interp& in, const Value& v, CallArgs& args) {
    std::vector<Value> out;
    if (!truthy(v)) return Value::iterator({});  // jinja2: `if value:` before anything
    const Value* attribute = args.kwarg("attribute");
    if (args.pos.empty() && attribute) {
        const Value* def = args.kwarg("default");
        for (const auto& [k, val] : args.kw)
            if (k != "attribute" && k != "default") raise("FilterArgumentError", "Unexpected keyword argument " + str_repr(k));
        const std::vector<Value> parts = attribute_parts(*attribute);
        for (const Value& item : iterate(v)) {
            in.step();
            try {
                out.push_back(get_path(in, item, parts, def));
            } catch (const TemplateError& e) {
                return pending_iterator(std::move(out), e);
            }
        }
    } else {
        if (args.pos.empty()) raise("FilterArgumentError", "map requires a filter argument");
        if (!args.pos[0].is_string()) type_error("filter name must be a string");
        const std::string name = args.pos[0].str();
        CallArgs rest;
        rest.pos.assign(args.pos.begin() + 1, args.pos.end());
        rest.kw = args.kw;
        for (const Value& item : iterate(v)) {
            CallArgs a = rest;
            try {
                out.push_back(in.filter(name, item, a));
            } catch (const TemplateError& e) {
                return pending_iterator(std::move(out), e);
            }
        }
    }
    in.charge(16 * out.size());
    return Value::iterator(std::move(out));
}

Value min_max(Interp& in, const Value& v, CallArgs& args, bool is_max) {
    ArgBinder b(args, is_max ? "do_max" : "do_min", {"case_sensitive", "attribute"});
    const std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    const bool cs = truthy(b.get_or(0, Value(false)));
    const std::vector<Value> parts = attribute_parts(b.get_or(1, Value::none()));
    size_t best = 0;
    Value best_key;
    for (size_t i = 0; i < items.size(); ++i) {
        Value k = get_path(in, items[i], parts, nullptr);
        if (!cs) k = ignore_case(k);
        if (i == 0 || (is_max ? compare(k, best_key, ">") == 1 : compare(k, best_key, "<") == -1)) best = i, best_key = k;
    }
    return items[best];
}

bool reversible(const Value& v) {
    return v.is_string() || v.is_dict() || v.is_undefined() || (v.is_list() && v.list_data().kind != SeqKind::Iterator);
}

Value first_or_last(const Value& v, bool last) {
    if (last && !reversible(v)) type_error("'" + type_name(v) + "' object is not reversible");
    if (!last && v.is_list() && v.list_data().pending && !v.list_data().exhausted && !v.items().empty()) {
        v.list_data().exhausted = true;
        return v.items().front();
    }
    const std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined(last ? "No last item, sequence was empty." : "No first item, sequence was empty.");
    if (last && v.is_markup()) return Value::markup(items.back().str());  // reversed() indexes the Markup
    return last ? items.back() : items.front();
}

const std::unordered_map<std::string, int>& filter_names() {
    static const std::unordered_map<std::string, int> m = [] {
        std::unordered_map<std::string, int> r;
        int i = 0;
        for (const char* n : {"abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e",
                              "escape", "filesizeformat", "first", "float", "forceescape", "format", "groupby",
                              "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min",
                              "pprint", "random", "reject", "rejectattr", "replace", "reverse", "round", "safe",
                              "select", "selectattr", "slice", "sort", "string", "striptags", "sum", "title", "tojson",
                              "trim", "truncate", "unique", "upper", "urlencode", "urlize", "wordcount", "wordwrap",
                              "xmlattr"})
            r.emplace(n, i++);
        return r;
    }();
    return m;
}

}  // namespace

bool is_known_filter(std::string_view name) { return filter_names().count(std::string(name)) > 0; }

// ------------------------------------------------------------------ filters

Value apply_filter_now(Interp& in, const std::string& name, const Value& v, CallArgs& args);

Value apply_filter(Interp& in, const std::string& name, const Value& v, CallArgs& args) {
    if (!is_known_filter(name)) raise("TemplateRuntimeError", "No filter named '" + name + "' found.");
    // jinja2's generator filters: arguments bind at the call, everything else
    // runs when the generator is consumed.
    static const std::unordered_map<std::string, std::vector<const char*>> lazy = {
        {"items", {}}, {"unique", {"case_sensitive", "attribute"}}, {"batch", {"linecount", "fill_with"}},
        {"slice", {"slices", "fill_with"}}, {"map", {}}, {"select", {}}, {"reject", {}}, {"selectattr", {}},
        {"rejectattr", {}}};
    const auto it = lazy.find(name);
    if (it == lazy.end()) return apply_filter_now(in, name, v, args);
    if (name == "items" || name == "unique" || name == "batch" || name == "slice") {
        const std::vector<const char*>& p = it->second;
        if (p.empty()) ArgBinder(args, "do_" + name, {});
        else ArgBinder(args, "do_" + name, {p[0], p[1]});
    }
    Value r;
    try {
        r = apply_filter_now(in, name, v, args);
    } catch (const TemplateError& e) {
        r = pending_iterator({}, e);
    }
    static const std::unordered_map<std::string, const char*> fn = {
        {"items", "do_items"}, {"unique", "sync_do_unique"}, {"batch", "do_batch"}, {"slice", "sync_do_slice"},
        {"map", "sync_do_map"}, {"select", "select_or_reject"}, {"reject", "select_or_reject"},
        {"selectattr", "select_or_reject"}, {"rejectattr", "select_or_reject"}};
    if (r.is_list() && r.list_data().kind == SeqKind::Iterator) r.list_data().gen_name = fn.at(name);
    return r;
}

Value apply_filter_now(Interp& in, const std::string& name, const Value& v, CallArgs& args) {
    auto B = [&](std::initializer_list<const char*> params) { return ArgBinder(args, "do_" + name, params); };
    if (name == "tojson") return do_tojson(in, v, args);
    if (name == "default" || name == "d") {
        ArgBinder b = B({"default_value", "boolean"});
        if (v.is_undefined() || (truthy(b.get_or(1, Value(false))) && !truthy(v))) return b.get_or(0, Value(""));
        return v;
    }
    if (name == "length" || name == "count") {
        B({});
        return Value(length(v));
    }
    if (name == "trim") {
        ArgBinder b = B({"chars"});
        const Value chars = b.get_or(0, Value::none());
        std::optional<std::string> c;
        if (!chars.is_none()) {
            if (!chars.is_string()) type_error("strip arg must be None or str");
            c = chars.str();
        }
        return str_result(v, pystr::strip(soft_str(v), c, true, true));
    }
    if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
        B({});
        const std::string s = soft_str(v);
        if (name == "upper") return str_result(v, pystr::upper(s));
        if (name == "lower") return str_result(v, pystr::lower(s));
        if (name == "capitalize") return str_result(v, pystr::capitalize(s));
        return Value(do_title(s));
    }
    if (name == "string") {
        B({});
        return v.is_markup() ? v : Value(to_str(v));
    }
    if (name == "safe") {
        B({});
        return Value::markup(to_str(v));
    }
    if (name == "e" || name == "escape" || name == "forceescape") {
        B({});
        if (v.is_markup() && name != "forceescape") return v;
        return Value::markup(pystr::html_escape(to_str(v)));
    }
    if (name == "join") {
        ArgBinder b = B({"d", "attribute"});
        const std::string sep = to_str(b.get_or(0, Value("")));
        const Value attribute = b.get_or(1, Value::none());
        const std::vector<Value> parts = attribute_parts(attribute);
        std::string out;
        bool first = true;
        for (const Value& item : iterate(v)) {
            if (!first) out += sep;
            first = false;
            append_str(out, attribute.is_none() ? item : get_path(in, item, parts, nullptr));
            if (out.size() > in.options().limits.max_output) raise("MemoryError", "joined string too large");
        }
        in.charge(out.size());
        return Value(std::move(out));
    }
    if (name == "replace") {
        ArgBinder b = B({"old", "new", "count"});
        if (!b.get(0) || !b.get(1)) type_error("do_replace() missing required argument");
        const Value cnt = b.get_or(2, Value::none());
        const int64_t count = cnt.is_none() ? -1 : int_arg(cnt, "count");
        std::string r = pystr::replace(to_str(v), to_str(*b.get(0)), to_str(*b.get(1)), count);
        if (r.size() > in.options().limits.max_output) raise("MemoryError", "replaced string too large");
        in.charge(r.size());
        return Value(std::move(r));
    }
    if (name == "items") {
        B({});
        if (v.is_undefined()) return Value::iterator({}, "generator");
        if (!v.is_dict()) type_error("Can only get item pairs from a mapping.");
        std::vector<Value> out;
        for (const auto& [k, val] : v.dict_data().items()) out.push_back(Value::tuple({k, val}));
        return Value::iterator(std::move(out), "generator");
    }
    if (name == "list") {
        B({});
        std::vector<Value> items = iterate(v);
        in.charge(16 * items.size());
        return Value::list(std::move(items));
    }
    if (name == "first" || name == "last") {
        B({});
        return first_or_last(v, name == "last");
    }
    if (name == "map") return do_map(in, v, args);
    if (name == "select" || name == "reject") return select_or_reject(in, v, args, name == "select", false);
    if (name == "selectattr" || name == "rejectattr") return select_or_reject(in, v, args, name == "selectattr", true);
    if (name == "int") {
        ArgBinder b = B({"default", "base"});
        const Value def = b.get_or(0, Value(0));
        const int64_t base = int_arg(b.get_or(1, Value(10)), "base");
        int64_t n;
        if (v.is_string()) {
            if (base != 0 && (base < 2 || base > 36)) raise("ValueError", "int() base must be >= 2 and <= 36, or 0");
            if (parse_int(v.str(), static_cast<int>(base), n)) return Value(n);
            double d;
            if (parse_float(v.str(), d) && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value(static_cast<int64_t>(std::trunc(d)));
            return def;
        }
        if (v.is_int() || v.is_bool()) return Value(v.as_int());
        if (v.is_float()) {
            const double d = v.as_double();
            if (std::isfinite(d) && std::fabs(d) < 9.2e18) return Value(static_cast<int64_t>(std::trunc(d)));
            return def;
        }
        if (v.is_undefined()) v.fail_undefined();
        return def;
    }
    if (name == "float") {
        ArgBinder b = B({"default"});
        const Value def = b.get_or(0, Value(0.0));
        if (v.is_number()) return Value(v.as_double());
        double d;
        if (v.is_string() && parse_float(v.str(), d)) return Value(d);
        if (v.is_undefined()) v.fail_undefined();
        return def;
    }
    if (name == "abs") {
        B({});
        if (v.is_int() || v.is_bool()) {
            if (v.as_int() == INT64_MIN) raise("OverflowError", "integer overflow (template integers are 64-bit)");
            return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
        }
        if (v.is_float()) return Value(std::fabs(v.as_double()));
        type_error("bad operand type for abs(): '" + type_name(v) + "'");
    }
    if (name == "indent") {
        ArgBinder b = B({"width", "first", "blank"});
        std::string r = do_indent(v, b.get_or(0, Value(4)), truthy(b.get_or(1, Value(false))), truthy(b.get_or(2, Value(false))));
        if (r.size() > in.options().limits.max_output) raise("MemoryError", "indented string too large");
        in.charge(r.size());
        return str_result(v, std::move(r));
    }
    if (name == "center") {
        ArgBinder b = B({"width"});
        const int64_t w = int_arg(b.get_or(0, Value(80)), "width");
        check_width(w);
        in.charge(static_cast<uint64_t>(std::max<int64_t>(w, 0)));
        return str_result(v, pystr::pad(soft_str(v), w, ' ', '^'));
    }
    if (name == "dictsort") {
        ArgBinder b = B({"case_sensitive", "by", "reverse"});
        const bool cs = truthy(b.get_or(0, Value(false)));
        const Value by = b.get_or(1, Value("key"));
        const bool reverse = truthy(b.get_or(2, Value(false)));
        int pos;
        if (by.is_string() && by.str() == "key") pos = 0;
        else if (by.is_string() && by.str() == "value") pos = 1;
        else raise("FilterArgumentError", "You can only sort by either \"key\" or \"value\"");
        if (v.is_undefined()) v.fail_undefined();
        if (!v.is_dict()) raise("AttributeError", "'" + type_name(v) + "' object has no attribute 'items'");
        std::vector<Value> items, keys;
        for (const auto& [k, val] : v.dict_data().items()) {
            items.push_back(Value::tuple({k, val}));
            keys.push_back(cs ? (pos ? val : k) : ignore_case(pos ? val : k));
        }
        return Value::list(sorted_by(std::move(items), keys, reverse));
    }
    if (name == "sort") {
        ArgBinder b = B({"reverse", "case_sensitive", "attribute"});
        const bool reverse = truthy(b.get_or(0, Value(false)));
        const bool cs = truthy(b.get_or(1, Value(false)));
        const Value attribute = b.get_or(2, Value::none());
        std::vector<std::vector<Value>> attr_parts;
        if (attribute.is_string())
            for (const std::string& a : pystr::split(attribute.str(), std::string(","), -1)) attr_parts.push_back(attribute_parts(Value(a)));
        else
            attr_parts.push_back(attribute_parts(attribute));
        std::vector<Value> items = iterate(v), keys;
        for (const Value& item : items) {
            std::vector<Value> k;
            for (const auto& parts : attr_parts) {
                Value x = get_path(in, item, parts, nullptr);
                k.push_back(cs ? x : ignore_case(x));
            }
            keys.push_back(Value::list(std::move(k)));
        }
        in.charge(16 * items.size());
        return Value::list(sorted_by(std::move(items), keys, reverse));
    }
    if (name == "unique") {
        ArgBinder b = B({"case_sensitive", "attribute"});
        const bool cs = truthy(b.get_or(0, Value(false)));
        const std::vector<Value> parts = attribute_parts(b.get_or(1, Value::none()));
        std::vector<Value> out, seen;
        for (const Value& item : iterate(v)) {
            in.step();
            Value k = get_path(in, item, parts, nullptr);
            if (!cs) k = ignore_case(k);
            check_hashable(k);
            bool dup = false;
            for (const Value& s : seen)
                if (equals(s, k)) dup = true;
            if (!dup) seen.push_back(k), out.push_back(item);
        }
        return Value::iterator(std::move(out));
    }
    if (name == "min" || name == "max") return min_max(in, v, args, name == "max");
    if (name == "sum") {
        ArgBinder b = B({"attribute", "start"});
        const Value attribute = b.get_or(0, Value::none());
        const std::vector<Value> parts = attribute_parts(attribute);
        Value acc = b.get_or(1, Value(0));
        if (acc.is_string()) type_error("sum() can't sum strings [use ''.join(seq) instead]");
        for (const Value& item : iterate(v))
            acc = binary_op(in, "+", acc, attribute.is_none() ? item : get_path(in, item, parts, nullptr));
        return acc;
    }
    if (name == "reverse") {
        B({});
        if (v.is_string()) {
            std::u32string u = pystr::decode(v.str());
            std::reverse(u.begin(), u.end());
            return str_result(v, pystr::encode(u));
        }
        if (!reversible(v) && !(v.is_list() || v.is_object())) raise("FilterArgumentError", "argument must be iterable");
        std::vector<Value> items;
        try {
            items = iterate(v);
        } catch (const TemplateError& e) {
            if (e.type() == "TypeError") raise("FilterArgumentError", "argument must be iterable");
            throw;
        }
        std::reverse(items.begin(), items.end());
        if (v.is_list() && v.list_data().kind == SeqKind::Iterator) return Value::list(std::move(items));
        const std::string t = v.is_dict() ? "dict_reversekeyiterator"
                              : v.is_list() && v.list_data().kind == SeqKind::List ? "list_reverseiterator"
                              : v.is_list() && v.list_data().kind == SeqKind::View ? v.list_data().iter_type.substr(0, 5) + "_reverse" + v.list_data().iter_type.substr(5) + "iterator"
                                                                                    : "reversed";
        return Value::iterator(std::move(items), t);
    }
    if (name == "round") {
        ArgBinder b = B({"precision", "method"});
        const Value m = b.get_or(1, Value("common"));
        return do_round(in, v, int_arg(b.get_or(0, Value(0)), "precision"), m.is_string() ? m.str() : "");
    }
    if (name == "attr") {
        ArgBinder b = B({"name"});
        if (!b.get(0)) type_error("do_attr() missing 1 required positional argument: 'name'");
        if (!b.get(0)->is_string()) type_error("attribute name must be string");
        const std::string& an = b.get(0)->str();
        if (v.is_undefined()) v.fail_undefined();
        bool unsafe = false;
        Value prop;
        if (v.is_object() || has_method(v, an, unsafe) || builtin_property(v, an, prop)) return in.getattr(v, an);
        return Value::undefined(str_repr(object_type_repr(v)) + " has no attribute " + str_repr(an));
    }
    if (name == "batch" || name == "slice") {
        ArgBinder b = B({name == "batch" ? "linecount" : "slices", "fill_with"});
        if (!b.get(0)) type_error("do_" + name + "() missing 1 required positional argument");
        const int64_t n = int_arg(*b.get(0), "count");
        const Value fill = b.get_or(1, Value::none());
        const std::vector<Value> items = iterate(v);
        std::vector<Value> out;
        if (name == "batch") {
            if (n <= 0 && !items.empty()) raise("ValueError", "batch size must be positive");
            std::vector<Value> tmp;
            for (const Value& item : items) {
                if (static_cast<int64_t>(tmp.size()) == n) out.push_back(Value::list(std::move(tmp))), tmp.clear();
                tmp.push_back(item);
            }
            if (!tmp.empty()) {
                if (!fill.is_none())
                    while (static_cast<int64_t>(tmp.size()) < n) tmp.push_back(fill);
                out.push_back(Value::list(std::move(tmp)));
            }
        } else {
            if (n <= 0) raise("ZeroDivisionError", "integer division or modulo by zero");
            if (n > 100000) raise("MemoryError", "too many slices");
            const int64_t len = static_cast<int64_t>(items.size());
            const int64_t per = len / n, extra = len % n;
            int64_t offset = 0;
            for (int64_t s = 0; s < n; ++s) {
                const int64_t start = offset + s * per;
                if (s < extra) ++offset;
                const int64_t end = offset + (s + 1) * per;
                std::vector<Value> tmp(items.begin() + start, items.begin() + end);
                if (!fill.is_none() && s >= extra) tmp.push_back(fill);
                out.push_back(Value::list(std::move(tmp)));
            }
        }
        in.charge(16 * items.size() + 16 * out.size());
        return Value::iterator(std::move(out));
    }
    if (name == "groupby") {
        ArgBinder b = B({"attribute", "default", "case_sensitive"});
        if (!b.get(0)) type_error("do_groupby() missing 1 required positional argument: 'attribute'");
        const std::vector<Value> parts = attribute_parts(*b.get(0));
        const Value def = b.get_or(1, Value::none());
        const bool cs = truthy(b.get_or(2, Value(false)));
        std::vector<Value> items = iterate(v), keys;
        for (const Value& item : items) {
            Value k = get_path(in, item, parts, &def);
            keys.push_back(cs ? k : ignore_case(k));
        }
        const std::vector<size_t> idx = py_sort_order(keys, false);
        std::vector<Value> out;
        for (size_t i = 0; i < idx.size();) {
            size_t j = i;
            std::vector<Value> group;
            while (j < idx.size() && equals(keys[idx[j]], keys[idx[i]])) group.push_back(items[idx[j++]]);
            const Value grouper = cs ? keys[idx[i]] : get_path(in, items[idx[i]], parts, &def);
            Value g = Value::tuple({grouper, Value::list(std::move(group))});
            g.list_data().iter_type = "_GroupTuple";  // a namedtuple: .grouper and .list
            out.push_back(std::move(g));
            i = j;
        }
        return Value::list(std::move(out));
    }
    if (name == "format") {
        if (!args.pos.empty() && !args.kw.empty())
            raise("FilterArgumentError", "can't handle positional and keyword arguments at the same time");
        Value fargs;
        if (!args.kw.empty()) {
            auto d = std::make_shared<DictData>();
            for (const auto& [k, val] : args.kw) d->set(Value(k), val);
            fargs = Value(std::move(d));
        } else {
            fargs = Value::tuple(args.pos);
        }
        return str_result(v, percent_format(in, soft_str(v), fargs, v.is_markup()));
    }
    if (name == "striptags") {
        B({});
        return Value(do_striptags(to_str(v)));
    }
    if (name == "truncate") {
        ArgBinder b = B({"length", "killwords", "end", "leeway"});
        const Value lw = b.get_or(3, Value::none());
        if (!v.is_string()) {  // jinja2 measures len(s) before any conversion
            const int64_t n = length(v);
            if (n <= int_arg(b.get_or(0, Value(255)), "length") + (lw.is_none() ? 5 : int_arg(lw, "leeway"))) return v;
            type_error("can only concatenate " + type_name(v) + " (not \"str\") to " + type_name(v));
        }
        const Value end = b.get_or(2, Value("..."));
        const std::string e = v.is_markup() && !end.is_markup() ? pystr::html_escape(to_str(end)) : to_str(end);
        return str_result(v, do_truncate(in, soft_str(v), int_arg(b.get_or(0, Value(255)), "length"),
                                         truthy(b.get_or(1, Value(false))), e, lw.is_none() ? 5 : int_arg(lw, "leeway")));
    }
    if (name == "wordcount") {
        B({});
        int64_t n = 0;
        bool in_word = false;
        const std::string s = soft_str(v);
        for (size_t i = 0; i < s.size();) {
            const uint32_t c = pystr::next_cp(s, i);
            const bool w = c == '_' || pystr::is_alpha(c) || pystr::is_numeric(c);
            if (w && !in_word) ++n;
            in_word = w;
        }
        return Value(n);
    }
    if (name == "wordwrap") {
        ArgBinder b = B({"width", "break_long_words", "wrapstring", "break_on_hyphens"});
        const Value ws = b.get_or(2, Value::none());
        std::string r = do_wordwrap(soft_str(v), int_arg(b.get_or(0, Value(79)), "width"),
                                    truthy(b.get_or(1, Value(true))), ws.is_none() ? "\n" : to_str(ws));
        in.charge(r.size());
        return Value(std::move(r));
    }
    if (name == "filesizeformat") {
        ArgBinder b = B({"binary"});
        return Value(do_filesizeformat(v, truthy(b.get_or(0, Value(false)))));
    }
    if (name == "pprint") {  // pprint.pformat: dict keys sorted (long lines are not wrapped as pprint would)
        B({});
        std::function<Value(const Value&, int)> sorted_copy = [&](const Value& x, int depth) -> Value {
            if (depth > 100) return x;
            if (x.is_dict()) {
                std::vector<std::pair<Value, Value>> kv = x.dict_data().items();
                std::stable_sort(kv.begin(), kv.end(), [](const auto& a, const auto& b) {
                    if (a.first.is_number() == b.first.is_number() && a.first.kind() == b.first.kind()) return less(a.first, b.first);
                    return type_name(a.first) < type_name(b.first);
                });
                auto d = std::make_shared<DictData>();
                for (auto& [k, val] : kv) d->set(k, sorted_copy(val, depth + 1));
                return Value(std::move(d));
            }
            if (x.is_sequence_list()) {
                std::vector<Value> items;
                for (const Value& i : x.items()) items.push_back(sorted_copy(i, depth + 1));
                return x.list_data().kind == SeqKind::Tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
            }
            return x;
        };
        return Value(repr(sorted_copy(v, 0)));
    }
    if (name == "urlencode") {
        B({});
        if (v.is_string()) return Value(url_quote(v.str(), false));
        std::string out;
        std::vector<std::pair<Value, Value>> pairs;
        if (v.is_dict()) pairs = v.dict_data().items();
        else
            for (const Value& p : iterate(v)) {
                const std::vector<Value> kv = iterate(p);
                if (kv.size() != 2) raise("ValueError", "need key/value pairs");
                pairs.emplace_back(kv[0], kv[1]);
            }
        for (const auto& [k, val] : pairs) {
            if (!out.empty()) out += '&';
            out += url_quote(to_str(k), true) + "=" + url_quote(to_str(val), true);
        }
        return Value(std::move(out));
    }
    if (name == "xmlattr") {
        ArgBinder b = B({"autospace"});
        if (!v.is_dict()) raise("AttributeError", "'" + type_name(v) + "' object has no attribute 'items'");
        std::string out;
        for (const auto& [k, val] : v.dict_data().items()) {
            if (val.is_none() || val.is_undefined()) continue;
            const std::string key = to_str(k);
            if (key.find_first_of(" \t\n\r\f\v/>=") != std::string::npos)
                raise("ValueError", "Invalid character in attribute name: " + str_repr(key));
            if (!out.empty()) out += ' ';
            out += pystr::html_escape(key) + "=\"" + (val.is_markup() ? val.str() : pystr::html_escape(to_str(val))) + "\"";
        }
        if (truthy(b.get_or(0, Value(true))) && !out.empty()) out = " " + out;
        return Value(std::move(out));
    }
    if (name == "random") {
        B({});
        const std::vector<Value> items = iterate(v);
        if (items.empty()) return Value::undefined("No random item, sequence was empty.");
        static thread_local std::mt19937_64 rng{std::random_device{}()};
        return items[rng() % items.size()];
    }
    raise("TemplateRuntimeError", "the filter '" + name + "' is not supported by quern");
}

}  // namespace quern::jinja
