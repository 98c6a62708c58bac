// Python operators and string formatting on template values (see ops.h).
#include "chat/ops.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <limits>

#include "chat/eval.h"
#include "chat/pystr.h"

namespace quern::jinja {

namespace {

[[noreturn]] void unsupported(std::string_view op, const Value& a, const Value& b) {
    type_error("unsupported operand type(s) for " + std::string(op) + ": '" + type_name(a) + "' and '" +
               type_name(b) + "'");
}

[[noreturn]] void overflow() { raise("OverflowError", "integer overflow (template integers are 64-bit)"); }

bool is_intlike(const Value& v) { return v.is_int() || v.is_bool(); }

int64_t py_floordiv(int64_t a, int64_t b) {
    if (a == INT64_MIN && b == -1) overflow();
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
    return q;
}

int64_t py_mod(int64_t a, int64_t b) {
    if (b == -1) return 0;
    int64_t r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
}

double py_fmod(double a, double b) {
    double r = std::fmod(a, b);
    if (r != 0) {
        if ((b < 0) != (r < 0)) r += b;
    } else {
        r = std::copysign(0.0, b);
    }
    return r;
}

double py_ffloordiv(double a, double b) {
    double mod = std::fmod(a, b);
    double div = (a - mod) / b;
    if (mod != 0) {
        if ((b < 0) != (mod < 0)) div -= 1.0;
    }
    if (div != 0) {
        double fl = std::floor(div);
        if (div - fl > 0.5) fl += 1.0;
        return fl;
    }
    return std::copysign(0.0, a / b);
}

Value repeat(Interp& in, const Value& seq, int64_t n) {
    if (n < 0) n = 0;
    // Python gives an empty sequence for any count: no loop over n (which may
    // be 2^63 - 1) for nothing.
    if (seq.is_string() ? seq.str().empty() : seq.items().empty()) n = 0;
    if (seq.is_string()) {
        const std::string& s = seq.str();
        if (n > 0 && s.size() > 0 && static_cast<uint64_t>(n) > in.options().limits.max_output / s.size())
            raise("MemoryError", "string repetition is too large");
        in.charge(s.size() * static_cast<uint64_t>(n));
        std::string r;
        r.reserve(s.size() * static_cast<size_t>(n));
        for (int64_t k = 0; k < n; ++k) r += s;
        return seq.is_markup() ? Value::markup(std::move(r)) : Value(std::move(r));
    }
    const auto& items = seq.items();
    if (n > 0 && items.size() > 0 && static_cast<uint64_t>(n) > in.options().limits.max_bytes / (16 * items.size()))
        raise("MemoryError", "list repetition is too large");
    in.charge(16 * items.size() * static_cast<uint64_t>(n));
    std::vector<Value> r;
    r.reserve(items.size() * static_cast<size_t>(n));
    for (int64_t k = 0; k < n; ++k) r.insert(r.end(), items.begin(), items.end());
    return seq.list_data().kind == SeqKind::Tuple ? Value::tuple(std::move(r)) : Value::list(std::move(r));
}

int64_t ipow(int64_t base, int64_t exp) {
    int64_t result = 1;
    while (exp > 0) {
        if (exp & 1) {
            if (__builtin_mul_overflow(result, base, &result)) overflow();
        }
        exp >>= 1;
        if (exp > 0 && __builtin_mul_overflow(base, base, &base)) overflow();
    }
    return result;
}

}  // namespace

Value binary_op(Interp& in, std::string_view op, const Value& a, const Value& b) {
    if (a.is_undefined()) a.fail_undefined();
    if (op == "%" && a.is_string()) {  // str.__mod__ takes any argument, even an undefined one
        std::string r = percent_format(in, a.str(), b, a.is_markup());
        in.charge(r.size());
        return a.is_markup() ? Value::markup(std::move(r)) : Value(std::move(r));
    }
    if (a.is_markup() && op == "*" && b.is_undefined())  // markupsafe calls str.__mul__ directly
        type_error("'Undefined' object cannot be interpreted as an integer");
    if (b.is_undefined()) b.fail_undefined();
    const bool nums = a.is_number() && b.is_number();
    const bool ints = is_intlike(a) && is_intlike(b);
    if (op == "+") {
        if (ints) {
            int64_t r;
            if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) overflow();
            return Value(r);
        }
        if (nums) return Value(a.as_double() + b.as_double());
        if (a.is_string() && b.is_string()) {
            if (a.str().size() + b.str().size() > in.options().limits.max_output) raise("MemoryError", "string too large");
            in.charge(a.str().size() + b.str().size());
            if (a.is_markup() || b.is_markup()) {
                const std::string l = a.is_markup() ? a.str() : pystr::html_escape(a.str());
                const std::string r = b.is_markup() ? b.str() : pystr::html_escape(b.str());
                return Value::markup(l + r);
            }
            return Value(a.str() + b.str());
        }
        if (a.is_sequence_list() && b.is_sequence_list() && a.list_data().kind == b.list_data().kind) {
            in.charge(16 * (a.items().size() + b.items().size()));
            std::vector<Value> r = a.items();
            r.insert(r.end(), b.items().begin(), b.items().end());
            return a.list_data().kind == SeqKind::Tuple ? Value::tuple(std::move(r)) : Value::list(std::move(r));
        }
        if (a.is_markup()) unsupported(op, a, b);
        if (a.is_string()) type_error("can only concatenate str (not \"" + type_name(b) + "\") to str");
        if (a.is_sequence_list()) {
            const std::string t = type_name(a);
            type_error("can only concatenate " + t + " (not \"" + type_name(b) + "\") to " + t);
        }
        unsupported(op, a, b);
    }
    if (op == "-") {
        if (ints) {
            int64_t r;
            if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) overflow();
            return Value(r);
        }
        if (nums) return Value(a.as_double() - b.as_double());
        unsupported(op, a, b);
    }
    if (op == "*") {
        if (ints) {
            int64_t r;
            if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) overflow();
            return Value(r);
        }
        if (nums) return Value(a.as_double() * b.as_double());
        const bool a_seq = a.is_string() || a.is_sequence_list();
        const bool b_seq = b.is_string() || b.is_sequence_list();
        if (a_seq && is_intlike(b)) return repeat(in, a, b.as_int());
        if (b_seq && is_intlike(a)) return repeat(in, b, a.as_int());
        // markupsafe calls str.__mul__ directly, which wants an index
        if (a.is_markup()) type_error("'" + type_name(b) + "' object cannot be interpreted as an integer");
        if (b.is_markup()) type_error("'" + type_name(a) + "' object cannot be interpreted as an integer");
        if (a_seq) type_error("can't multiply sequence by non-int of type '" + type_name(b) + "'");
        if (b_seq) type_error("can't multiply sequence by non-int of type '" + type_name(a) + "'");
        unsupported(op, a, b);
    }
    if (op == "/") {
        if (!nums) unsupported(op, a, b);
        if (b.as_double() == 0.0) raise("ZeroDivisionError", ints ? "division by zero" : "float division by zero");
        return Value(a.as_double() / b.as_double());
    }
    if (op == "//") {
        if (ints) {
            if (b.as_int() == 0) raise("ZeroDivisionError", "integer division or modulo by zero");
            return Value(py_floordiv(a.as_int(), b.as_int()));
        }
        if (!nums) unsupported(op, a, b);
        if (b.as_double() == 0.0) raise("ZeroDivisionError", "float floor division by zero");
        return Value(py_ffloordiv(a.as_double(), b.as_double()));
    }
    if (op == "%") {
        if (ints) {
            if (b.as_int() == 0) raise("ZeroDivisionError", "integer modulo by zero");
            return Value(py_mod(a.as_int(), b.as_int()));
        }
        if (!nums) unsupported(op, a, b);
        if (b.as_double() == 0.0) raise("ZeroDivisionError", "float modulo");
        return Value(py_fmod(a.as_double(), b.as_double()));
    }
    if (op == "**") {
        if (ints && b.as_int() >= 0) return Value(ipow(a.as_int(), b.as_int()));
        if (!nums) unsupported("** or pow()", a, b);
        const double x = a.as_double(), y = b.as_double();
        if (x == 0.0 && y < 0) raise("ZeroDivisionError", "0.0 cannot be raised to a negative power");
        if (x < 0 && y != std::floor(y)) type_error("complex results are not supported");
        const double r = std::pow(x, y);
        if (std::isinf(r) && !std::isinf(x)) raise("OverflowError", "(34, 'Numerical result out of range')");
        return Value(r);
    }
    raise("TemplateRuntimeError", "unknown operator " + std::string(op));
}

Value negate(const Value& a, bool minus) {
    if (a.is_undefined()) a.fail_undefined();
    if (is_intlike(a)) {
        if (!minus) return Value(a.as_int());
        if (a.as_int() == INT64_MIN) overflow();
        return Value(-a.as_int());
    }
    if (a.is_float()) return Value(minus ? -a.as_double() : a.as_double());
    type_error(std::string("bad operand type for unary ") + (minus ? "-" : "+") + ": '" + type_name(a) + "'");
}

bool contains(const Value& c, const Value& item) {
    switch (c.kind()) {
        case Kind::Undefined: return false;
        case Kind::String:
            if (!item.is_string()) type_error("'in <string>' requires string as left operand, not " + type_name(item));
            return c.str().find(item.str()) != std::string::npos;
        case Kind::List:
            if (c.list_data().kind == SeqKind::View && c.list_data().iter_type != "dict_values") {
                // dict_keys / dict_items hash the item
                const bool keys = c.list_data().iter_type == "dict_keys";
                if (keys) check_hashable(item);
                if (!keys && item.is_list() && item.list_data().kind == SeqKind::Tuple)
                    for (const Value& p : item.items()) check_hashable(p);
            }
            if (c.list_data().pending && !c.list_data().exhausted)
                for (const Value& v : c.items())
                    if (equals(v, item)) return true;
            for (const Value& v : iterate(c))
                if (equals(v, item)) return true;
            return false;
        case Kind::Dict:
            check_hashable(item);
            return c.dict_data().find(item) != nullptr;
        default: type_error("argument of type '" + type_name(c) + "' is not iterable");
    }
}

Value slice(Interp& in, const Value& obj, const Value& start, const Value& stop, const Value& step) {
    auto idx = [](const Value& v, int64_t& out) {
        if (v.is_none() || v.is_undefined()) return false;
        if (!is_intlike(v)) type_error("slice indices must be integers or None or have an __index__ method");
        out = v.as_int();
        return true;
    };
    int64_t st = 1;
    idx(step, st);
    if (st == 0) raise("ValueError", "slice step cannot be zero");
    std::u32string u;
    int64_t n;
    const bool is_str = obj.is_string();
    if (is_str) {
        u = pystr::decode(obj.str());
        n = static_cast<int64_t>(u.size());
    } else {
        n = static_cast<int64_t>(obj.items().size());
    }
    int64_t b, e;
    auto clamp = [&](int64_t v, bool is_start) {
        if (v < 0) v += n;
        if (st > 0) return std::clamp<int64_t>(v, 0, n);
        (void)is_start;
        return std::clamp<int64_t>(v, -1, n - 1);
    };
    if (!idx(start, b)) b = st > 0 ? 0 : n - 1;
    else b = clamp(b, true);
    if (!idx(stop, e)) e = st > 0 ? n : -1;
    else e = clamp(e, false);
    std::vector<int64_t> picks;
    if (st > 0)
        for (int64_t i = b; i < e; i += st) picks.push_back(i);
    else
        for (int64_t i = b; i > e; i += st) picks.push_back(i);
    if (is_str) {
        std::u32string r;
        for (int64_t i : picks) r.push_back(u[static_cast<size_t>(i)]);
        std::string s = pystr::encode(r);
        in.charge(s.size());
        return obj.is_markup() ? Value::markup(std::move(s)) : Value(std::move(s));
    }
    std::vector<Value> r;
    for (int64_t i : picks) r.push_back(obj.items()[static_cast<size_t>(i)]);
    in.charge(16 * r.size());
    return obj.list_data().kind == SeqKind::Tuple ? Value::tuple(std::move(r)) : Value::list(std::move(r));
}

// ------------------------------------------------------------------ number parsing

bool parse_int(std::string_view s, int base, int64_t& out) {
    const std::string t = pystr::strip(s, std::nullopt, true, true);
    size_t i = 0;
    bool neg = false;
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) neg = t[i++] == '-';
    if (i + 1 < t.size() && t[i] == '0') {
        const char p = static_cast<char>(t[i + 1] | 32);
        const int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
        if (pb && (base == pb || base == 0)) base = pb, i += 2;
    }
    if (base == 0) base = 10;
    unsigned __int128 v = 0;
    bool any = false, last_us = true;
    for (; i < t.size(); ++i) {
        const char c = t[i];
        if (c == '_') {
            if (last_us) return false;
            last_us = true;
            continue;
        }
        int d = -1;
        if (c >= '0' && c <= '9') d = c - '0';
        else if ((c | 32) >= 'a' && (c | 32) <= 'z') d = (c | 32) - 'a' + 10;
        if (d < 0 || d >= base) return false;
        v = v * static_cast<unsigned>(base) + static_cast<unsigned>(d);
        if (v > static_cast<unsigned __int128>(INT64_MAX) + 1) overflow();
        any = true;
        last_us = false;
    }
    if (!any || last_us) return false;
    if (!neg && v > static_cast<unsigned __int128>(INT64_MAX)) overflow();
    out = neg ? static_cast<int64_t>(-static_cast<__int128>(v)) : static_cast<int64_t>(v);
    return true;
}

bool parse_float(std::string_view s, double& out) {
    std::string t = pystr::strip(s, std::nullopt, true, true);
    std::string low = pystr::lower(t);
    std::string_view body = low;
    bool neg = false;
    if (!body.empty() && (body[0] == '+' || body[0] == '-')) neg = body[0] == '-', body.remove_prefix(1);
    if (body == "inf" || body == "infinity") {
        out = neg ? -HUGE_VAL : HUGE_VAL;
        return true;
    }
    if (body == "nan") {
        out = std::nan("");
        return true;
    }
    std::string clean;
    char prev = 0;
    for (char c : body) {
        if (c == '_') {
            if (!(prev >= '0' && prev <= '9')) return false;
        } else {
            if (prev == '_' && !(c >= '0' && c <= '9')) return false;
            if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == '+' || c == '-')) return false;
            clean.push_back(c);
        }
        prev = c;
    }
    if (prev == '_' || clean.empty()) return false;
    double d = 0;
    const auto r = std::from_chars(clean.data(), clean.data() + clean.size(), d);
    if (r.ptr != clean.data() + clean.size()) return false;
    if (r.ec == std::errc::result_out_of_range) d = clean.find("e-") != std::string::npos ? 0.0 : HUGE_VAL;
    out = neg ? -d : d;
    return true;
}

// ------------------------------------------------------------------ % formatting

namespace {

std::string cformat(const char* f, int prec, double d) {
    char buf[512];
    std::snprintf(buf, sizeof buf, f, prec, d);
    return buf;
}

std::string fmt_float(double d, char type, int prec, bool alt) {
    if (std::isnan(d)) return (type >= 'A' && type <= 'Z') ? "NAN" : "nan";
    if (std::isinf(d)) return std::string(d < 0 ? "-" : "") + ((type >= 'A' && type <= 'Z') ? "INF" : "inf");
    if (std::fabs(d) >= 1e50 && (type == 'f' || type == 'F')) {
        // C prints the full expansion too; keep the budget small
        char buf[400];
        std::snprintf(buf, sizeof buf, "%.*f", std::min(prec, 50), d);
        return buf;
    }
    std::string f = std::string("%") + (alt ? "#" : "") + ".*" + type;
    return cformat(f.c_str(), std::min(prec, 100), d);
}

std::string int_digits(int64_t v, char type, bool alt) {
    const bool neg = v < 0;
    const unsigned __int128 mag = neg ? static_cast<unsigned __int128>(-static_cast<__int128>(v))
                                      : static_cast<unsigned __int128>(v);
    int base = 10;
    const char* prefix = "";
    if (type == 'x' || type == 'X') base = 16, prefix = type == 'x' ? "0x" : "0X";
    else if (type == 'o') base = 8, prefix = "0o";
    else if (type == 'b') base = 2, prefix = "0b";
    std::string d;
    unsigned __int128 m = mag;
    do {
        const int dig = static_cast<int>(m % static_cast<unsigned>(base));
        d.push_back(static_cast<char>(dig < 10 ? '0' + dig : (type == 'X' ? 'A' : 'a') + dig - 10));
        m /= static_cast<unsigned>(base);
    } while (m > 0);
    std::reverse(d.begin(), d.end());
    return std::string(neg ? "-" : "") + (alt ? prefix : "") + d;
}

std::string pad_num(std::string body, int width, bool left, bool zero) {
    const int64_t len = static_cast<int64_t>(pystr::length(body));
    if (width <= len) return body;
    const size_t fill = static_cast<size_t>(width - len);
    if (left) return body + std::string(fill, ' ');
    if (zero) {
        size_t at = 0;
        if (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) at = 1;
        if (body.size() > at + 1 && body[at] == '0' && std::string_view("xXob").find(body[at + 1]) != std::string::npos)
            at += 2;
        return body.substr(0, at) + std::string(fill, '0') + body.substr(at);
    }
    return std::string(fill, ' ') + body;
}

}  // namespace

std::string percent_format(Interp& in, std::string_view fmt, const Value& args, bool markup) {
    std::vector<Value> list;
    const bool is_tuple = args.is_list() && args.list_data().kind == SeqKind::Tuple;
    // Python treats any argument with __getitem__ (but a tuple or str) as a mapping
    const bool is_map = args.is_dict() || args.is_undefined() || (args.is_list() && args.list_data().kind == SeqKind::List) ||
                        (args.is_object() && args.object().type_name() == "Namespace");
    if (is_tuple) list = args.items();
    else list.push_back(args);
    size_t ai = 0;
    bool used_map = false;
    auto next_arg = [&]() -> const Value& {
        if (ai >= list.size()) type_error("not enough arguments for format string");
        return list[ai++];
    };
    std::string out;
    for (size_t i = 0; i < fmt.size(); ++i) {
        if (fmt[i] != '%') {
            out.push_back(fmt[i]);
            continue;
        }
        const size_t start = i;
        if (++i >= fmt.size()) raise("ValueError", "incomplete format");
        const Value* val = nullptr;
        Value keyed;
        if (fmt[i] == '(') {
            if (!is_map || is_tuple) type_error("format requires a mapping");
            int depth = 1;
            const size_t ks = ++i;
            while (i < fmt.size() && depth > 0) {
                if (fmt[i] == '(') ++depth;
                else if (fmt[i] == ')') --depth;
                if (depth > 0) ++i;
            }
            if (i >= fmt.size()) raise("ValueError", "incomplete format key");
            const std::string key(fmt.substr(ks, i - ks));
            if (args.is_undefined()) args.fail_undefined();
            if (args.is_list()) type_error("list indices must be integers or slices, not str");
            if (!args.is_dict()) raise("KeyError", str_repr(key));
            const Value* v = args.dict_data().find(std::string_view(key));
            if (!v) raise("KeyError", str_repr(key));
            keyed = *v;
            val = &keyed;
            used_map = true;
            ++i;
        }
        bool left = false, plus = false, space = false, alt = false, zero = false;
        for (; i < fmt.size(); ++i) {
            const char c = fmt[i];
            if (c == '-') left = true;
            else if (c == '+') plus = true;
            else if (c == ' ') space = true;
            else if (c == '#') alt = true;
            else if (c == '0') zero = true;
            else break;
        }
        // A width or precision: digits (saturating just past the largest
        // width allowed, so no count of digits overflows) or '*'.
        auto read_num = [&](int& n) {
            if (i < fmt.size() && fmt[i] == '*') {
                const Value& w = next_arg();
                if (!is_intlike(w)) type_error("* wants int");
                const int64_t v = w.as_int();
                check_width(v == std::numeric_limits<int64_t>::min() ? kMaxFieldWidth + 1 : std::abs(v));
                n = static_cast<int>(v);
                ++i;
                return;
            }
            int64_t v = n;
            while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') {
                v = std::min<int64_t>(v * 10 + (fmt[i] - '0'), kMaxFieldWidth + 1);
                ++i;
            }
            check_width(v);
            n = static_cast<int>(v);
        };
        int width = 0, prec = -1;
        read_num(width);
        check_width(width);
        if (width < 0) left = true, width = -width;
        if (i < fmt.size() && fmt[i] == '.') {
            ++i;
            prec = 0;
            read_num(prec);
            check_width(prec);
        }
        while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
        if (i >= fmt.size()) raise("ValueError", "incomplete format");
        const char type = fmt[i];
        if (type == '%') {
            out.push_back('%');
            continue;
        }
        if (!val) val = &next_arg();
        const Value& v = *val;
        std::string body;
        switch (type) {
            case 's':
            case 'r':
            case 'a':
                body = type == 's' ? to_str(v) : repr(v);
                if (markup && !v.is_markup()) body = pystr::html_escape(body);
                if (prec >= 0) body = pystr::encode(std::u32string_view(pystr::decode(body)).substr(0, static_cast<size_t>(prec)));
                out += pad_num(body, width, left, false);
                continue;
            case 'd':
            case 'i':
            case 'u':
            case 'o':
            case 'x':
            case 'X': {
                int64_t n;
                if (is_intlike(v)) n = v.as_int();
                else if (v.is_float() && (type == 'd' || type == 'i' || type == 'u')) {
                    if (!std::isfinite(v.as_double())) raise("OverflowError", "cannot convert float infinity to integer");
                    n = static_cast<int64_t>(std::trunc(v.as_double()));
                } else if (type == 'd' || type == 'i' || type == 'u') {
                    type_error(std::string("%") + type + " format: a real number is required, not " + type_name(v));
                } else {
                    type_error(std::string("%") + type + " format: an integer is required, not " + type_name(v));
                }
                body = int_digits(n, type == 'u' || type == 'i' ? 'd' : type, alt);
                if (n >= 0 && plus) body = "+" + body;
                else if (n >= 0 && space) body = " " + body;
                if (prec > 0) {
                    const size_t at = (body[0] == '-' || body[0] == '+' || body[0] == ' ') ? 1 : 0;
                    const size_t digits = body.size() - at;
                    if (digits < static_cast<size_t>(prec)) body.insert(at, static_cast<size_t>(prec) - digits, '0');
                }
                out += pad_num(body, width, left, zero && !left);
                continue;
            }
            case 'e':
            case 'E':
            case 'f':
            case 'F':
            case 'g':
            case 'G': {
                if (!v.is_number()) type_error("must be real number, not " + type_name(v));
                const double d = v.as_double();
                body = fmt_float(d, type, prec < 0 ? 6 : prec, alt);
                if (!std::signbit(d) && plus) body = "+" + body;
                else if (!std::signbit(d) && space) body = " " + body;
                out += pad_num(body, width, left, zero && !left && std::isfinite(d));
                continue;
            }
            case 'c': {
                if (is_intlike(v)) {
                    if (v.as_int() < 0 || v.as_int() > 0x10FFFF) raise("OverflowError", "%c arg not in range(0x110000)");
                    pystr::append_cp(body, static_cast<uint32_t>(v.as_int()));
                } else if (v.is_string() && pystr::length(v.str()) == 1) {
                    body = v.str();
                } else {
                    type_error("%c requires int or char");
                }
                out += pad_num(body, width, left, false);
                continue;
            }
            default: {
                char buf[96];
                std::snprintf(buf, sizeof buf, "unsupported format character '%c' (0x%x) at index %zu", type,
                              static_cast<unsigned char>(type), i);
                (void)start;
                raise("ValueError", buf);
            }
        }
    }
    if (!used_map && ai < list.size() && !(is_map && !is_tuple))
        type_error("not all arguments converted during string formatting");
    (void)in;
    in.charge(out.size());
    return out;
}

// ------------------------------------------------------------------ str.format

std::string format_spec(const Value& v, std::string_view spec) {
    if (spec.empty()) return to_str(v);
    // [[fill]align][sign][z][#][0][width][,_][.precision][type]
    size_t i = 0;
    uint32_t fill = ' ';
    char align = 0;
    auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
    {
        size_t p = 0;
        const uint32_t c0 = pystr::next_cp(spec, p);
        if (p < spec.size() && is_align(spec[p])) fill = c0, align = spec[p], i = p + 1;
        else if (is_align(spec[0])) align = spec[0], i = 1;
    }
    char sign = 0;
    if (i < spec.size() && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) sign = spec[i++];
    if (i < spec.size() && spec[i] == 'z') ++i;
    bool alt = false;
    if (i < spec.size() && spec[i] == '#') alt = true, ++i;
    if (i < spec.size() && spec[i] == '0') {
        if (!align) fill = '0', align = '=';
        ++i;
    }
    int64_t width = 0;
    while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9') width = std::min<int64_t>(width * 10 + (spec[i++] - '0'), 1 << 30);
    check_width(width);
    char group = 0;
    if (i < spec.size() && (spec[i] == ',' || spec[i] == '_')) group = spec[i++];
    int prec = -1;
    if (i < spec.size() && spec[i] == '.') {
        ++i;
        prec = 0;
        if (i >= spec.size() || spec[i] < '0' || spec[i] > '9') raise("ValueError", "Format specifier missing precision");
        while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9') prec = std::min(prec * 10 + (spec[i++] - '0'), 1000);
    }
    char type = 0;
    if (i < spec.size()) type = spec[i++];
    if (i != spec.size()) raise("ValueError", "Invalid format specifier");

    std::string body;
    bool numeric = false;
    if (v.is_string() || (!v.is_number())) {
        if (!v.is_string() && !v.is_undefined())
            type_error("unsupported format string passed to " + type_name(v) + ".__format__");
        if (type && type != 's') raise("ValueError", std::string("Unknown format code '") + type + "' for object of type 'str'");
        if (sign) raise("ValueError", "Sign not allowed in string format specifier");
        if (align == '=') raise("ValueError", "'=' alignment not allowed in string format specifier");
        body = to_str(v);
        if (prec >= 0) body = pystr::encode(std::u32string_view(pystr::decode(body)).substr(0, static_cast<size_t>(prec)));
        if (!align) align = '<';
    } else {
        numeric = true;
        const bool int_type = type == 0 || type == 'd' || type == 'b' || type == 'o' || type == 'x' || type == 'X' ||
                              type == 'c' || type == 'n';
        if (is_intlike(v) && int_type) {
            if (prec >= 0) raise("ValueError", "Precision not allowed in integer format specifier");
            if (type == 'c') {
                pystr::append_cp(body, static_cast<uint32_t>(std::clamp<int64_t>(v.as_int(), 0, 0x10FFFF)));
            } else {
                body = int_digits(v.as_int(), type ? (type == 'n' ? 'd' : type) : 'd', alt);
            }
        } else {
            if (int_type && type != 0) raise("ValueError", std::string("Unknown format code '") + type + "' for object of type 'float'");
            const double d = v.as_double();
            if (type == '%') {
                body = fmt_float(d * 100, 'f', prec < 0 ? 6 : prec, alt) + "%";
            } else if (type == 0) {
                if (prec < 0) body = v.is_float() ? float_repr(d) : std::to_string(v.as_int());
                else {
                    body = fmt_float(d, 'g', prec == 0 ? 1 : prec, alt);
                    if (body.find_first_of(".enai") == std::string::npos) body += ".0";
                }
            } else {
                body = fmt_float(d, type == 'n' ? 'g' : type, prec < 0 ? 6 : prec, alt);
            }
        }
        if (group) {
            const size_t neg = body[0] == '-' ? 1 : 0;
            size_t end = body.find_first_of(".eE%", neg);
            if (end == std::string::npos) end = body.size();
            std::string grouped;
            const std::string digits = body.substr(neg, end - neg);
            for (size_t k = 0; k < digits.size(); ++k) {
                if (k && (digits.size() - k) % 3 == 0) grouped.push_back(group);
                grouped.push_back(digits[k]);
            }
            body = body.substr(0, neg) + grouped + body.substr(end);
        }
        if (body[0] != '-' && (sign == '+' || sign == ' ')) body = std::string(1, sign) + body;
        if (!align) align = '>';
    }
    const int64_t len = static_cast<int64_t>(pystr::length(body));
    if (width <= len) return body;
    if (align == '=' && numeric) {
        size_t at = (body[0] == '-' || body[0] == '+' || body[0] == ' ') ? 1 : 0;
        if (alt && body.size() > at + 1 && body[at] == '0') at += 2;
        std::string f;
        for (int64_t k = 0; k < width - len; ++k) pystr::append_cp(f, fill);
        return body.substr(0, at) + f + body.substr(at);
    }
    return pystr::pad(body, width, fill, align == '=' ? '>' : align);
}

std::string str_format(Interp& in, std::string_view fmt, const CallArgs& args) {
    std::string out;
    size_t auto_idx = 0;
    int mode = 0;  // 1 auto, 2 manual
    for (size_t i = 0; i < fmt.size(); ++i) {
        const char c = fmt[i];
        if (c == '}') {
            if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
                out.push_back('}');
                ++i;
                continue;
            }
            raise("ValueError", "Single '}' encountered in format string");
        }
        if (c != '{') {
            out.push_back(c);
            continue;
        }
        if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
            out.push_back('{');
            ++i;
            continue;
        }
        // find the matching '}'
        size_t j = i + 1;
        int depth = 1;
        while (j < fmt.size()) {
            if (fmt[j] == '{') ++depth;
            else if (fmt[j] == '}' && --depth == 0) break;
            ++j;
        }
        if (j >= fmt.size()) raise("ValueError", "expected '}' before end of string");
        std::string_view field = fmt.substr(i + 1, j - i - 1);
        i = j;
        std::string_view spec, name = field;
        char conv = 0;
        const size_t colon = field.find(':');
        if (colon != std::string_view::npos) spec = field.substr(colon + 1), name = field.substr(0, colon);
        const size_t bang = name.find('!');
        if (bang != std::string_view::npos) {
            if (bang + 2 != name.size()) raise("ValueError", "expected ':' after conversion specifier");
            conv = name[bang + 1];
            name = name.substr(0, bang);
        }
        // argument name: index or identifier, then .attr / [key]
        size_t k = 0;
        while (k < name.size() && name[k] != '.' && name[k] != '[') ++k;
        const std::string_view first = name.substr(0, k);
        Value v;
        // (string.Formatter, which jinja2's sandbox uses, words both switches the same way)
        if (first.empty()) {
            if (mode == 2) raise("ValueError", "cannot switch from manual field specification to automatic field numbering");
            mode = 1;
            if (auto_idx >= args.pos.size()) raise("IndexError", "tuple index out of range");
            v = args.pos[auto_idx++];
        } else if (std::all_of(first.begin(), first.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
            if (mode == 1) raise("ValueError", "cannot switch from manual field specification to automatic field numbering");
            mode = 2;
            const size_t idx = static_cast<size_t>(std::min<uint64_t>(std::stoull(std::string(first.substr(0, 12))), 1u << 30));
            if (idx >= args.pos.size()) raise("IndexError", "tuple index out of range");
            v = args.pos[idx];
        } else {
            const Value* kv = args.kwarg(first);
            if (!kv) raise("KeyError", str_repr(first));
            v = *kv;
        }
        while (k < name.size()) {
            if (name[k] == '.') {
                size_t e = k + 1;
                while (e < name.size() && name[e] != '.' && name[e] != '[') ++e;
                v = in.getattr(v, std::string(name.substr(k + 1, e - k - 1)));
                k = e;
            } else {
                const size_t e = name.find(']', k);
                if (e == std::string_view::npos) raise("ValueError", "Missing ']' in format string");
                const std::string key(name.substr(k + 1, e - k - 1));
                int64_t n;
                if (!key.empty() && std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) &&
                    parse_int(key, 10, n))
                    v = in.getitem(v, Value(n));
                else
                    v = in.getitem(v, Value(key));
                k = e + 1;
            }
            if (v.is_undefined()) v.fail_undefined();
        }
        if (conv == 'r' || conv == 'a') v = Value(repr(v));
        else if (conv == 's') v = Value(to_str(v));
        else if (conv) raise("ValueError", std::string("Unknown conversion specifier ") + conv);
        std::string sp(spec);
        if (sp.find('{') != std::string::npos) sp = str_format(in, sp, args);
        out += format_spec(v, sp);
        in.charge(out.size() / 8 + 1);
    }
    in.charge(out.size());
    return out;
}

}  // namespace quern::jinja
