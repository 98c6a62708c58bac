// Python operators on template values: arithmetic, `in`, slicing, and the
// two string formatting mini-languages (printf-style `%` and str.format).
#pragma once
#include <string>
#include <string_view>

#include "chat/value.h"

namespace quern::jinja {

class Interp;

/// a OP b for + - * / // % ** with Python's result types and error messages.
Value binary_op(Interp& in, std::string_view op, const Value& a, const Value& b);
/// -a and +a.
Value negate(const Value& a, bool minus);
/// Python's `item in container`.
bool contains(const Value& container, const Value& item);
/// Python's obj[start:stop:step] for str, list and tuple (null parts: None).
Value slice(Interp& in, const Value& obj, const Value& start, const Value& stop, const Value& step);
/// Python's `fmt % args` (`markup`: markupsafe's Markup % args, which escapes %s/%r values).
std::string percent_format(Interp& in, std::string_view fmt, const Value& args, bool markup = false);
/// Python's fmt.format(*args, **kwargs).
std::string str_format(Interp& in, std::string_view fmt, const CallArgs& args);
/// format(value, spec) for str, int, float and bool values.
std::string format_spec(const Value& v, std::string_view spec);
/// Python's int(x) semantics on a whole string ("  42 ", "1_000", "-7"); false when invalid.
bool parse_int(std::string_view s, int base, int64_t& out);
/// Python's float(x) on a string ("1.5", " inf ", "1e3"); false when invalid.
bool parse_float(std::string_view s, double& out);

}  // namespace quern::jinja
