// jinja2's builtin filters and tests (plus Hugging Face's tojson), and the
// argument binding they share with the str/list/dict methods.
#pragma once
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "chat/value.h"

namespace quern::jinja {

class Interp;

/// Whether jinja2 (as Hugging Face configures it) has a filter/test of this name.
bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);

/// Applies filter `name` to `v`; raises TemplateRuntimeError
/// "No filter named 'x' found." for an unknown name.
Value apply_filter(Interp& in, const std::string& name, const Value& v, CallArgs& args);
/// Applies test `name`; raises TemplateRuntimeError "No test named 'x' found.".
bool apply_test(Interp& in, const std::string& name, const Value& v, CallArgs& args);

/// Binds call arguments to named parameters the way Python does (positional
/// first, then keywords), raising TypeError for unknown keywords, duplicates
/// and too many positional arguments. Missing parameters are null.
class ArgBinder {
public:
    ArgBinder(const CallArgs& args, std::string fname, std::initializer_list<const char*> params);
    /// The i-th parameter or nullptr when not given.
    const Value* get(size_t i) const { return slots_[i]; }
    /// The i-th parameter or `def` when not given.
    Value get_or(size_t i, Value def) const { return slots_[i] ? *slots_[i] : std::move(def); }

private:
    std::vector<const Value*> slots_;
};

/// Python's str(x) for filters that take strings (jinja2's soft_str).
std::string soft_str(const Value& v);
/// An int argument (bool counts); raises TypeError naming `what` otherwise.
int64_t int_arg(const Value& v, const char* what);

}  // namespace quern::jinja
