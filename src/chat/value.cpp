// Template values with Python semantics (see value.h).
#include "chat/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "chat/pystr.h"

namespace quern::jinja {

namespace {
std::string describe(const std::string& type, const std::string& message, int line, int col,
                     const std::string& where) {
    std::string s = (where.empty() ? "" : where + ": ") + type + ": " + message;
    if (line > 0) s += " (template line " + std::to_string(line) + ", column " + std::to_string(col) + ")";
    return s;
}
constexpr int kMaxDepth = 400;  // nesting of values printed / compared / serialised
void check_depth(int depth) {
    if (depth > kMaxDepth) raise("RecursionError", "maximum recursion depth exceeded");
}
}  // namespace

TemplateError::TemplateError(std::string type, std::string message, int line, int col, std::string where)
    : Error(describe(type, message, line, col, where)), type_(std::move(type)), message_(std::move(message)),
      where_(std::move(where)), line_(line), col_(col) {}

TemplateError TemplateError::located(int line, int col) const {
    if (line_ > 0 || line <= 0) return *this;
    return TemplateError(type_, message_, line, col, where_);
}

TemplateError TemplateError::in(std::string where) const { return TemplateError(type_, message_, line_, col_, std::move(where)); }

void raise(std::string_view type, std::string message) { throw TemplateError(std::string(type), std::move(message)); }
void type_error(std::string message) { raise("TypeError", std::move(message)); }

void check_width(int64_t width) {
    if (width > kMaxFieldWidth)
        raise("MemoryError", "a field width of " + std::to_string(width) + " is larger than the engine allows (" +
                                 std::to_string(kMaxFieldWidth) + ")");
}

// ------------------------------------------------------------------ Value

Value::Value(std::string s) : kind_(Kind::String), b_(false), p_(std::make_shared<std::string>(std::move(s))) {}
Value::Value(std::shared_ptr<ListData> l) : kind_(Kind::List), i_(0) {
    uint32_t d = 0;
    for (const Value& v : l->items) d = std::max(d, v.nesting());
    if (d + 1 > kMaxNesting) raise("RecursionError", "maximum recursion depth exceeded (lists and dicts nest too deeply)");
    l->depth = d + 1;
    p_ = std::move(l);
}

Value::Value(std::shared_ptr<DictData> dd) : kind_(Kind::Dict), i_(0) {
    uint32_t d = 0;
    for (const auto& kv : dd->items()) d = std::max({d, kv.first.nesting(), kv.second.nesting()});
    if (d + 1 > kMaxNesting) raise("RecursionError", "maximum recursion depth exceeded (lists and dicts nest too deeply)");
    dd->depth = d + 1;
    p_ = std::move(dd);
}

uint32_t Value::nesting() const {
    if (kind_ == Kind::List) return list_data().depth;
    if (kind_ == Kind::Dict) return dict_data().depth;
    return 0;
}
Value::Value(std::shared_ptr<Object> o) : kind_(Kind::Object), i_(0), p_(std::move(o)) {}

Value Value::undefined(std::string message, std::string type) {
    Value v;
    auto info = std::make_shared<UndefinedInfo>();
    info->message = std::move(message);
    info->type = std::move(type);
    v.p_ = std::move(info);
    return v;
}

namespace {
const std::shared_ptr<UndefinedInfo>& missing_info() {
    static const auto info = std::make_shared<UndefinedInfo>(UndefinedInfo{"missing", "UndefinedError"});
    return info;
}
}  // namespace

Value Value::missing() {
    Value v;
    v.p_ = missing_info();
    return v;
}

bool Value::is_missing() const { return kind_ == Kind::Undefined && p_ == missing_info(); }

Value Value::undefined_name(std::string_view name) { return undefined(str_repr(name) + " is undefined"); }

Value Value::markup(std::string s) {
    Value v(std::move(s));
    v.b_ = true;
    return v;
}

Value Value::list(std::vector<Value> items) {
    auto l = std::make_shared<ListData>();
    l->items = std::move(items);
    return Value(std::move(l));
}

Value Value::tuple(std::vector<Value> items) {
    auto l = std::make_shared<ListData>();
    l->items = std::move(items);
    l->kind = SeqKind::Tuple;
    return Value(std::move(l));
}

Value Value::iterator(std::vector<Value> items, std::string type) {
    auto l = std::make_shared<ListData>();
    l->items = std::move(items);
    l->kind = SeqKind::Iterator;
    l->iter_type = std::move(type);
    return Value(std::move(l));
}

Value Value::view(std::vector<Value> items, std::string type) {
    auto l = std::make_shared<ListData>();
    l->items = std::move(items);
    l->kind = SeqKind::View;
    l->iter_type = std::move(type);
    return Value(std::move(l));
}

Value Value::dict() { return Value(std::make_shared<DictData>()); }

void Value::fail_undefined() const {
    const UndefinedInfo* info = undefined_info();
    if (!info) raise("UndefinedError", "'?' is undefined");
    raise(info->type, info->message);
}

const Value* CallArgs::kwarg(std::string_view name) const {
    for (const auto& [k, v] : kw)
        if (k == name) return &v;
    return nullptr;
}

Value Object::getattr(const std::string& name) const {
    return Value::undefined(str_repr(type_repr()) + " has no attribute " + str_repr(name));
}

Value Object::call(Interp&, CallArgs&) { type_error("'" + type_name() + "' object is not callable"); }

// ------------------------------------------------------------------ DictData

void DictData::set(const Value& key, Value v) {
    if (key.is_string()) {
        if (const Value* old = find(std::string_view(key.str()))) {
            const_cast<Value&>(*old) = std::move(v);
            return;
        }
    } else if (const Value* old = find(key)) {
        const_cast<Value&>(*old) = std::move(v);
        return;
    }
    items_.emplace_back(key, std::move(v));
}

const Value* DictData::find(std::string_view key) const {
    if (items_.size() < 8) {
        for (const auto& [k, v] : items_)
            if (k.is_string() && k.str() == key) return &v;
        return nullptr;
    }
    for (; indexed_ < items_.size(); ++indexed_)
        if (items_[indexed_].first.is_string()) index_.emplace(items_[indexed_].first.str(), indexed_);
    const auto it = index_.find(std::string(key));
    return it == index_.end() ? nullptr : &items_[it->second].second;
}

const Value* DictData::find(const Value& key) const {
    if (key.is_string()) return find(std::string_view(key.str()));
    for (const auto& [k, v] : items_)
        if (equals(k, key)) return &v;
    return nullptr;
}

// ------------------------------------------------------------------ truth, equality, order

bool truthy(const Value& v) {
    switch (v.kind()) {
        case Kind::Undefined:
        case Kind::None: return false;
        case Kind::Bool: return v.as_bool();
        case Kind::Int: return v.as_int() != 0;
        case Kind::Float: return v.as_double() != 0.0;
        case Kind::String: return !v.str().empty();
        case Kind::List: return v.list_data().kind == SeqKind::Iterator || !v.items().empty();
        case Kind::Dict: return v.dict_data().size() > 0;
        case Kind::Object: return true;
    }
    return false;
}

namespace {

bool equals_d(const Value& a, const Value& b, int depth) {
    check_depth(depth);
    if (a.is_number() && b.is_number()) {
        if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
        return a.as_int() == b.as_int();
    }
    if (a.kind() != b.kind()) return false;
    switch (a.kind()) {
        case Kind::Undefined:
        case Kind::None: return true;
        case Kind::String: return a.str() == b.str();
        case Kind::List: {
            const ListData &la = a.list_data(), &lb = b.list_data();
            if (la.kind == SeqKind::Iterator || lb.kind == SeqKind::Iterator || la.kind == SeqKind::View ||
                lb.kind == SeqKind::View)
                return a.identity() == b.identity();
            if (la.kind != lb.kind || la.items.size() != lb.items.size()) return false;
            for (size_t i = 0; i < la.items.size(); ++i)
                if (!equals_d(la.items[i], lb.items[i], depth + 1)) return false;
            return true;
        }
        case Kind::Dict: {
            const DictData &da = a.dict_data(), &db = b.dict_data();
            if (da.size() != db.size()) return false;
            for (const auto& [k, v] : da.items()) {
                const Value* o = db.find(k);
                if (!o || !equals_d(v, *o, depth + 1)) return false;
            }
            return true;
        }
        default: return a.identity() == b.identity();
    }
}

// -1, 0, 1; 2 when unordered (NaN)
int compare_d(const Value& a, const Value& b, const char* op, int depth) {
    check_depth(depth);
    if (a.is_number() && b.is_number()) {
        if (a.is_float() || b.is_float()) {
            const double x = a.as_double(), y = b.as_double();
            if (std::isnan(x) || std::isnan(y)) return 2;
            return x < y ? -1 : (x > y ? 1 : 0);
        }
        const int64_t x = a.as_int(), y = b.as_int();
        return x < y ? -1 : (x > y ? 1 : 0);
    }
    if (a.is_string() && b.is_string()) {
        const int c = a.str().compare(b.str());
        return c < 0 ? -1 : (c > 0 ? 1 : 0);
    }
    if (a.is_sequence_list() && b.is_sequence_list() && a.list_data().kind == b.list_data().kind) {
        const auto &x = a.items(), &y = b.items();
        for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
            if (equals_d(x[i], y[i], depth + 1)) continue;
            return compare_d(x[i], y[i], op, depth + 1);
        }
        return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
    }
    if (a.is_undefined()) a.fail_undefined();
    if (b.is_undefined()) b.fail_undefined();
    type_error(std::string("'") + op + "' not supported between instances of '" + type_name(a) + "' and '" +
               type_name(b) + "'");
}

}  // namespace

bool equals(const Value& a, const Value& b) { return equals_d(a, b, 0); }

bool less(const Value& a, const Value& b, const char* op) { return compare_d(a, b, op, 0) == -1; }

int compare(const Value& a, const Value& b, const char* op) { return compare_d(a, b, op, 0); }

std::string unhashable_type(const Value& v) {
    if (v.is_dict()) return "dict";
    if (!v.is_list()) return "";
    const ListData& l = v.list_data();
    if (l.kind == SeqKind::List) return "list";
    if (l.kind == SeqKind::View) return l.iter_type != "dict_values" ? l.iter_type : "";
    if (l.kind == SeqKind::Tuple)
        for (const Value& i : l.items)
            if (std::string t = unhashable_type(i); !t.empty()) return t;
    return "";
}

bool unhashable(const Value& v) { return !unhashable_type(v).empty(); }

void check_hashable(const Value& v) {
    if (std::string t = unhashable_type(v); !t.empty()) type_error("unhashable type: '" + t + "'");
}

std::vector<size_t> py_sort_order(const std::vector<Value>& keys, bool reverse) {
    const size_t n = keys.size();
    std::vector<size_t> a(n);
    for (size_t i = 0; i < n; ++i) a[i] = reverse ? n - 1 - i : i;
    auto lt = [&](size_t x, size_t y) { return compare(keys[x], keys[y], "<") == -1; };
    if (n >= 2 && n < 64) {
        // CPython's list.sort on a short list: one natural run, then binary insertion
        size_t run = 2;
        if (lt(a[1], a[0])) {
            while (run < n && lt(a[run], a[run - 1])) ++run;
            std::reverse(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(run));
        } else {
            while (run < n && !lt(a[run], a[run - 1])) ++run;
        }
        for (size_t start = run; start < n; ++start) {
            const size_t pivot = a[start];
            size_t l = 0, r = start;
            while (l < r) {
                const size_t p = l + ((r - l) >> 1);
                if (lt(pivot, a[p])) r = p;
                else l = p + 1;
            }
            for (size_t k = start; k > l; --k) a[k] = a[k - 1];
            a[l] = pivot;
        }
    } else if (n >= 64) {
        std::stable_sort(a.begin(), a.end(), lt);  // (CPython merges runs; same order, errors may name types swapped)
    }
    if (reverse) std::reverse(a.begin(), a.end());
    return a;
}

// ------------------------------------------------------------------ formatting

std::string float_repr(double d) {
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
    char buf[64];
    const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
    std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
    std::string sign;
    if (!sci.empty() && sci[0] == '-') sign = "-", sci.remove_prefix(1);
    const size_t e = sci.find('e');
    std::string digits;
    for (char c : sci.substr(0, e))
        if (c != '.') digits.push_back(c);
    int exp10 = 0;
    std::from_chars(sci.data() + e + 1 + (sci[e + 1] == '+' ? 1 : 0), sci.data() + sci.size(), exp10);
    while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
    const int decpt = exp10 + 1;
    std::string out = sign;
    if (decpt <= -4 || decpt > 16) {
        out += digits[0];
        if (digits.size() > 1) out += "." + digits.substr(1);
        char eb[16];
        std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
        out += eb;
    } else if (decpt <= 0) {
        out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
        out += digits + std::string(static_cast<size_t>(decpt) - digits.size(), '0') + ".0";
    } else {
        out += digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
    }
    return out;
}

std::string str_repr(std::string_view s) {
    const bool has_sq = s.find('\'') != std::string_view::npos, has_dq = s.find('"') != std::string_view::npos;
    const char q = (has_sq && !has_dq) ? '"' : '\'';
    std::string r(1, q);
    char buf[16];
    for (size_t i = 0; i < s.size();) {
        const size_t st = i;
        const uint32_t c = pystr::next_cp(s, i);
        if (c == static_cast<uint32_t>(q) || c == '\\') {
            r += '\\';
            r += static_cast<char>(c);
        } else if (c == '\n') {
            r += "\\n";
        } else if (c == '\r') {
            r += "\\r";
        } else if (c == '\t') {
            r += "\\t";
        } else if (c < 0x80 && c >= 0x20 && c != 0x7F) {
            r += static_cast<char>(c);
        } else if (!pystr::is_printable(c)) {
            if (c <= 0xFF) std::snprintf(buf, sizeof buf, "\\x%02x", c);
            else if (c <= 0xFFFF) std::snprintf(buf, sizeof buf, "\\u%04x", c);
            else std::snprintf(buf, sizeof buf, "\\U%08x", c);
            r += buf;
        } else {
            r.append(s.substr(st, i - st));
        }
    }
    r += q;
    return r;
}

namespace {

void append_repr(std::string& out, const Value& v, int depth);

void append_str_d(std::string& out, const Value& v, int depth) {
    check_depth(depth);
    switch (v.kind()) {
        case Kind::Undefined: return;
        case Kind::None: out += "None"; return;
        case Kind::Bool: out += v.as_bool() ? "True" : "False"; return;
        case Kind::Int: out += std::to_string(v.as_int()); return;
        case Kind::Float: out += float_repr(v.as_double()); return;
        case Kind::String: out += v.str(); return;
        case Kind::List: {
            const ListData& l = v.list_data();
            if (l.kind == SeqKind::Iterator) {  // Python prints an address here; ours is always 0x0
                out += "<" + l.iter_type + " object" + (l.gen_name.empty() ? "" : " " + l.gen_name) + " at 0x0>";
                return;
            }
            if (l.kind == SeqKind::View) {
                out += l.iter_type + "([";
                for (size_t i = 0; i < l.items.size(); ++i) {
                    if (i) out += ", ";
                    append_repr(out, l.items[i], depth + 1);
                }
                out += "])";
                return;
            }
            const bool tuple = l.kind == SeqKind::Tuple;
            out += tuple ? '(' : '[';
            for (size_t i = 0; i < l.items.size(); ++i) {
                if (i) out += ", ";
                append_repr(out, l.items[i], depth + 1);
            }
            if (tuple && l.items.size() == 1) out += ',';
            out += tuple ? ')' : ']';
            return;
        }
        case Kind::Dict: {
            out += '{';
            bool first = true;
            for (const auto& [k, val] : v.dict_data().items()) {
                if (!first) out += ", ";
                first = false;
                append_repr(out, k, depth + 1);
                out += ": ";
                append_repr(out, val, depth + 1);
            }
            out += '}';
            return;
        }
        case Kind::Object: out += v.object().repr(); return;
    }
}

void append_repr(std::string& out, const Value& v, int depth) {
    if (v.is_string()) {
        if (v.is_markup()) out += "Markup(" + str_repr(v.str()) + ")";
        else out += str_repr(v.str());
    } else if (v.is_undefined()) {
        out += "Undefined";
    } else {
        append_str_d(out, v, depth);
    }
}

}  // namespace

void append_str(std::string& out, const Value& v) { append_str_d(out, v, 0); }

std::string to_str(const Value& v) {
    if (v.is_string()) return v.str();
    std::string s;
    append_str_d(s, v, 0);
    return s;
}

std::string repr(const Value& v) {
    std::string s;
    append_repr(s, v, 0);
    return s;
}

std::string type_name(const Value& v) {
    switch (v.kind()) {
        case Kind::Undefined: return "Undefined";
        case Kind::None: return "NoneType";
        case Kind::Bool: return "bool";
        case Kind::Int: return "int";
        case Kind::Float: return "float";
        case Kind::String: return v.is_markup() ? "Markup" : "str";
        case Kind::List: {
            const ListData& l = v.list_data();
            return l.kind == SeqKind::List ? "list" : l.kind == SeqKind::Tuple ? "tuple" : l.iter_type;  // iterators, views
        }
        case Kind::Dict: return "dict";
        case Kind::Object: return v.object().type_name();
    }
    return "object";
}

std::string object_type_repr(const Value& v) {
    switch (v.kind()) {
        case Kind::None: return "None";
        case Kind::Undefined: return "jinja2.runtime.Undefined object";
        case Kind::String:
            if (v.is_markup()) return "markupsafe.Markup object";
            break;
        case Kind::Object: return v.object().type_repr();
        default: break;
    }
    return type_name(v) + " object";
}

int64_t length(const Value& v) {
    switch (v.kind()) {
        case Kind::Undefined: return 0;
        case Kind::String: return static_cast<int64_t>(pystr::length(v.str()));
        case Kind::List:
            if (v.list_data().kind != SeqKind::Iterator) return static_cast<int64_t>(v.items().size());
            break;
        case Kind::Dict: return static_cast<int64_t>(v.dict_data().size());
        case Kind::Object:
            if (const int64_t n = v.object().len(); n >= 0) return n;
            break;
        default: break;
    }
    type_error("object of type '" + type_name(v) + "' has no len()");
}

std::vector<Value> iterate(const Value& v) {
    switch (v.kind()) {
        case Kind::Undefined: return {};
        case Kind::String: {
            std::vector<Value> r;
            const std::string& s = v.str();
            for (size_t i = 0; i < s.size();) {
                const size_t st = i;
                pystr::next_cp(s, i);
                r.emplace_back(s.substr(st, i - st));
            }
            return r;
        }
        case Kind::List: {
            ListData& l = v.list_data();
            if (l.kind != SeqKind::Iterator) return l.items;
            if (l.exhausted) return {};
            l.exhausted = true;
            if (l.pending) throw *l.pending;
            return l.items;
        }
        case Kind::Dict: {
            std::vector<Value> r;
            for (const auto& kv : v.dict_data().items()) r.push_back(kv.first);
            return r;
        }
        default: break;
    }
    type_error("'" + type_name(v) + "' object is not iterable");
}

// ------------------------------------------------------------------ JSON

namespace {

void json_string(std::string& out, std::string_view s, bool ascii) {
    out += '"';
    char buf[16];
    for (size_t i = 0; i < s.size();) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        if (c == '"') out += "\\\"", ++i;
        else if (c == '\\') out += "\\\\", ++i;
        else if (c == '\n') out += "\\n", ++i;
        else if (c == '\r') out += "\\r", ++i;
        else if (c == '\t') out += "\\t", ++i;
        else if (c == '\b') out += "\\b", ++i;
        else if (c == '\f') out += "\\f", ++i;
        else if (c < 0x20 || (ascii && c == 0x7F)) {
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
            ++i;
        } else if (c < 0x80 || !ascii) {
            out += static_cast<char>(c);
            ++i;
        } else {
            uint32_t cp = pystr::next_cp(s, i);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                std::snprintf(buf, sizeof buf, "\\u%04x", cp);
            }
            out += buf;
        }
    }
    out += '"';
}

void json_newline(std::string& out, const JsonOptions& o, int level) {
    out += '\n';
    for (int k = 0; k < level; ++k) out += o.indent;
}

std::string json_key(const Value& k) {
    switch (k.kind()) {
        case Kind::String: return k.str();
        case Kind::Bool: return k.as_bool() ? "true" : "false";
        case Kind::None: return "null";
        case Kind::Int: return std::to_string(k.as_int());
        case Kind::Float: {
            const double d = k.as_double();
            if (std::isnan(d)) return "NaN";
            if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
            return float_repr(d);
        }
        default: type_error("keys must be str, int, float, bool or None, not " + type_name(k));
    }
}

void json_value(std::string& out, const Value& v, const JsonOptions& o, int level) {
    check_depth(level);
    switch (v.kind()) {
        case Kind::None: out += "null"; return;
        case Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
        case Kind::Int: out += std::to_string(v.as_int()); return;
        case Kind::Float: {
            const double d = v.as_double();
            if (std::isnan(d)) out += "NaN";
            else if (std::isinf(d)) out += d < 0 ? "-Infinity" : "Infinity";
            else out += float_repr(d);
            return;
        }
        case Kind::String: json_string(out, v.str(), o.ensure_ascii); return;
        case Kind::List: {
            if (!v.is_sequence_list()) break;
            const auto& items = v.items();
            if (items.empty()) {
                out += "[]";
                return;
            }
            out += '[';
            for (size_t i = 0; i < items.size(); ++i) {
                if (i) out += o.item_sep;
                if (o.has_indent) json_newline(out, o, level + 1);
                json_value(out, items[i], o, level + 1);
            }
            if (o.has_indent) json_newline(out, o, level);
            out += ']';
            return;
        }
        case Kind::Dict: {
            const DictData& d = v.dict_data();
            if (d.size() == 0) {
                out += "{}";
                return;
            }
            std::vector<const std::pair<Value, Value>*> items;
            for (const auto& kv : d.items()) items.push_back(&kv);
            if (o.sort_keys) {
                std::vector<Value> keys;
                for (const auto* kv : items) keys.push_back(Value::tuple({kv->first, kv->second}));
                std::vector<const std::pair<Value, Value>*> sorted;
                for (size_t i : py_sort_order(keys, false)) sorted.push_back(items[i]);
                items = std::move(sorted);
            }
            out += '{';
            bool first = true;
            for (const auto* kv : items) {
                if (!first) out += o.item_sep;
                first = false;
                if (o.has_indent) json_newline(out, o, level + 1);
                json_string(out, json_key(kv->first), o.ensure_ascii);
                out += o.key_sep;
                json_value(out, kv->second, o, level + 1);
            }
            if (o.has_indent) json_newline(out, o, level);
            out += '}';
            return;
        }
        default: break;
    }
    type_error("Object of type " + type_name(v) + " is not JSON serializable");
}

}  // namespace

std::string to_json(const Value& v, const JsonOptions& o) {
    std::string out;
    json_value(out, v, o, 0);
    return out;
}

}  // namespace quern::jinja
