// jinja2's builtin tests (`x is defined`, `x is divisibleby 3`, ...), with
// Python's argument checks and error messages.
#include <algorithm>
#include <unordered_map>

#include "chat/eval.h"
#include "chat/filters.h"
#include "chat/objects.h"
#include "chat/ops.h"
#include "chat/pystr.h"

namespace quern::jinja {

namespace {

const std::vector<std::string>& test_names() {
    static const std::vector<std::string> v = {
        "odd", "even", "divisibleby", "defined", "undefined", "filter", "test", "none", "boolean", "false", "true",
        "integer", "float", "number", "string", "mapping", "iterable", "sequence", "callable", "sameas", "escaped",
        "in", "lower", "upper", "==", "eq", "equalto", "!=", "ne", ">", "gt", "greaterthan", ">=", "ge", "<", "lt",
        "lessthan", "<=", "le"};
    return v;
}

}  // namespace

bool is_known_test(std::string_view name) {
    const auto& v = test_names();
    return std::find(v.begin(), v.end(), name) != v.end();
}

// ------------------------------------------------------------------ tests

bool apply_test(Interp& in, const std::string& name, const Value& v, CallArgs& args) {
    if (!is_known_test(name)) raise("TemplateRuntimeError", "No test named '" + name + "' found.");
    static const std::unordered_map<std::string, std::string> ops = {
        {"==", "eq"}, {"eq", "eq"}, {"equalto", "eq"}, {"!=", "ne"}, {"ne", "ne"}, {">", "gt"}, {"gt", "gt"},
        {"greaterthan", "gt"}, {">=", "ge"}, {"ge", "ge"}, {"<", "lt"}, {"lt", "lt"}, {"lessthan", "lt"},
        {"<=", "le"}, {"le", "le"}};
    const size_t given = 1 + args.pos.size() + args.kw.size();
    if (const auto op = ops.find(name); op != ops.end()) {
        // Python's operator functions take exactly two positional arguments
        if (!args.kw.empty()) type_error(op->second + "() takes no keyword arguments");
        if (given != 2) type_error(op->second + " expected 2 arguments, got " + std::to_string(given));
        const Value& other = args.pos[0];
        const std::string& o = op->second;
        if (o == "eq") return equals(v, other);
        if (o == "ne") return !equals(v, other);
        const char* sym = o == "lt" ? "<" : o == "le" ? "<=" : o == "gt" ? ">" : ">=";
        const int c = compare(v, other, sym);
        if (o == "lt") return c == -1;
        if (o == "le") return c == -1 || c == 0;
        if (o == "gt") return c == 1;
        return c == 1 || c == 0;
    }
    if (name == "callable") {
        if (!args.kw.empty()) type_error("callable() takes no keyword arguments");
        if (given != 1) type_error("callable() takes exactly one argument (" + std::to_string(given) + " given)");
        return v.is_undefined() || (v.is_object() && v.object().callable());
    }
    static const std::unordered_map<std::string, const char*> two = {
        {"divisibleby", "num"}, {"sameas", "other"}, {"in", "seq"}};
    const auto t2 = two.find(name);
    const std::string fn = "test_" + name;
    if (t2 == two.end()) {
        for (const auto& [k, val] : args.kw) type_error(fn + "() got an unexpected keyword argument '" + k + "'");
        if (given != 1) type_error(fn + "() takes 1 positional argument but " + std::to_string(given) + " were given");
    }
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "boolean") return v.is_bool();
    if (name == "false") return v.is_bool() && !v.as_bool();
    if (name == "true") return v.is_bool() && v.as_bool();
    if (name == "integer") return v.is_int();
    if (name == "float") return v.is_float();
    if (name == "number") return v.is_number();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.is_dict();
    if (name == "iterable")
        return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict() ||
               (v.is_object() && (v.object().type_name() == "Namespace" || v.object().type_name() == "LoopContext"));
    if (name == "sequence") return v.is_undefined() || v.is_string() || v.is_sequence_list() || v.is_dict();
    if (name == "escaped") return v.is_markup();
    if (name == "lower" || name == "upper") {
        const std::string s = to_str(v);
        return name == "lower" ? pystr::str_islower(s) : pystr::str_isupper(s);
    }
    if (name == "filter" || name == "test") {
        if (v.is_list() || v.is_dict()) type_error("unhashable type: '" + type_name(v) + "'");
        if (!v.is_string()) return false;
        return name == "filter" ? is_known_filter(v.str()) : is_known_test(v.str());
    }
    if (name == "odd" || name == "even") {
        const Value r = binary_op(in, "%", v, Value(2));
        return equals(r, Value(name == "odd" ? 1 : 0));
    }
    // two-parameter tests
    ArgBinder b(args, fn, {t2->second});
    if (!b.get(0)) type_error(fn + "() missing 1 required positional argument: '" + t2->second + "'");
    const Value& other = *b.get(0);
    if (name == "divisibleby") return equals(binary_op(in, "%", v, other), Value(0));
    if (name == "in") return contains(other, v);
    // sameas: Python's `is`
    if (v.kind() != other.kind()) return false;
    switch (v.kind()) {
        case Kind::None: return true;
        case Kind::Undefined: return v.identity() == other.identity();
        case Kind::Bool: return v.as_bool() == other.as_bool();
        case Kind::Int: return v.as_int() == other.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
        default: return v.identity() == other.identity();
    }
}

}  // namespace quern::jinja
