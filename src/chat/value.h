// Values of the Jinja template engine, with Python's semantics.
//
// Chat templates are written against Python jinja2, so a value here behaves
// like the Python object jinja2 would see: str (UTF-8 text, indexed by code
// point), int (64-bit; overflow is an error, not a big integer), float, bool,
// None, list, tuple, dict (insertion-ordered), jinja2's Undefined, and host
// objects (namespace(), loop, macros, functions, bound methods). Lists and
// dicts are shared by reference as in Python; the sandbox never mutates them
// in place (jinja2's ImmutableSandboxedEnvironment forbids that), only
// namespace attributes change.
//
// Formatting follows Python: str() and repr() of every kind (so "{{ [1, 'a'] }}"
// prints "[1, 'a']" and floats print as Python's shortest repr), and errors
// carry the Python exception class name and message jinja2 would give.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"

namespace quern::jinja {

/// An error while parsing or rendering a template. `type()` is the Python
/// exception class jinja2 raises in the same situation (TemplateSyntaxError,
/// UndefinedError, TypeError, TemplateError for raise_exception(), ...) and
/// `message()` is str() of that exception; line and column (1-based, 0 when
/// unknown) locate the template construct that failed.
class TemplateError : public Error {
public:
    TemplateError(std::string type, std::string message, int line = 0, int col = 0, std::string where = "");
    const std::string& type() const { return type_; }
    const std::string& message() const { return message_; }
    int line() const { return line_; }
    int col() const { return col_; }
    /// Where the template came from ("" when not said), e.g. its file.
    const std::string& where() const { return where_; }
    /// Same error located at line:col (kept when already located).
    TemplateError located(int line, int col) const;
    /// Same error naming the template's origin (a file name, ...) first in what().
    TemplateError in(std::string where) const;

private:
    std::string type_, message_, where_;
    int line_, col_;
};

/// Throws a TemplateError without location (the evaluator adds it).
[[noreturn]] void raise(std::string_view type, std::string message);
/// Widest field a format/pad operation may produce (beyond: MemoryError).
constexpr int64_t kMaxFieldWidth = 1 << 24;
/// Raises MemoryError when a width/fill request exceeds kMaxFieldWidth.
void check_width(int64_t width);
/// Throws TemplateError("TypeError", message).
[[noreturn]] void type_error(std::string message);

class Value;
class Object;

/// Deepest allowed nesting of lists and dicts in one value.
constexpr uint32_t kMaxNesting = 256;

/// The kinds of values.
enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Object };

/// What a sequence value stands for in Python. Iterators (generators from
/// map/select, dict item iterators, reversed()) are truthy, have no len(),
/// cannot be indexed and are exhausted after one pass. Views (dict.items(),
/// .keys(), .values()) are sized and re-iterable but cannot be indexed.
enum class SeqKind : uint8_t { List, Tuple, Iterator, View };

/// The items of a list, tuple or iterator.
struct ListData {
    std::vector<Value> items;
    SeqKind kind = SeqKind::List;
    std::string iter_type;  // Python type name of an iterator ("generator", ...)
    std::string gen_name;   // a generator's function name, as Python prints it
    bool exhausted = false;
    /// A lazy Python generator that failed part way: iterating it yields
    /// `items` and then raises this error (jinja2 raises such errors only
    /// when the generator is consumed).
    std::shared_ptr<const TemplateError> pending;
    uint32_t depth = 1;     // nesting of lists/dicts (bounded; see Value(shared_ptr<ListData>))
};

/// An insertion-ordered dict. Keys are any hashable values (usually strings).
class DictData {
public:
    /// Sets `key` to `v`, keeping the position of an existing key.
    void set(const Value& key, Value v);
    /// The value for `key`, or nullptr.
    const Value* find(const Value& key) const;
    const Value* find(std::string_view key) const;
    const std::vector<std::pair<Value, Value>>& items() const { return items_; }
    size_t size() const;  // defined below Value: the pair needs Value complete
    /// Nesting of lists/dicts inside (set when wrapped in a Value).
    uint32_t depth = 1;

private:
    std::vector<std::pair<Value, Value>> items_;
    mutable std::unordered_map<std::string, size_t> index_;  // string keys, built once the dict grows
    mutable size_t indexed_ = 0;
};

/// Why a value is undefined: the message its use raises (jinja2's hint) and
/// the exception class (UndefinedError, or SecurityError for an unsafe attribute).
struct UndefinedInfo {
    std::string message;
    std::string type = "UndefinedError";
};

/// A template value (see the file comment). Cheap to copy: strings, lists,
/// dicts and objects are shared.
class Value {
public:
    /// An undefined value with no hint ("'?' is undefined").
    Value() : kind_(Kind::Undefined), i_(0) {}
    Value(bool b) : kind_(Kind::Bool), b_(b) {}
    Value(int v) : kind_(Kind::Int), i_(v) {}
    Value(int64_t v) : kind_(Kind::Int), i_(v) {}
    Value(double v) : kind_(Kind::Float), f_(v) {}
    Value(std::string s);
    Value(std::string_view s) : Value(std::string(s)) {}
    Value(const char* s) : Value(std::string(s)) {}
    /// Wraps a list/dict. Raises RecursionError when lists and dicts nest
    /// more than kMaxNesting deep (so printing, comparing and freeing values
    /// never recurse without bound).
    Value(std::shared_ptr<ListData> l);
    Value(std::shared_ptr<DictData> d);
    Value(std::shared_ptr<Object> o);

    static Value none() {
        Value v;
        v.kind_ = Kind::None;
        return v;
    }
    /// An undefined value whose use raises `type` with `message`.
    static Value undefined(std::string message, std::string type = "UndefinedError");
    /// The marker of a frame variable not assigned yet (reads give undefined).
    static Value missing();
    bool is_missing() const;
    /// jinja2's Undefined for a missing variable: "'name' is undefined".
    static Value undefined_name(std::string_view name);
    /// A string that is jinja2 Markup (already escaped; concatenation escapes the other side).
    static Value markup(std::string s);
    static Value list(std::vector<Value> items = {});
    static Value tuple(std::vector<Value> items);
    /// An iterator over `items`; `type` is its Python type name.
    static Value iterator(std::vector<Value> items, std::string type = "generator");
    /// A dict view ("dict_items", "dict_keys", "dict_values").
    static Value view(std::vector<Value> items, std::string type);
    static Value dict();

    Kind kind() const { return kind_; }
    bool is_undefined() const { return kind_ == Kind::Undefined; }
    bool is_none() const { return kind_ == Kind::None; }
    bool is_bool() const { return kind_ == Kind::Bool; }
    bool is_int() const { return kind_ == Kind::Int; }
    bool is_float() const { return kind_ == Kind::Float; }
    /// int, float or bool (Python's numbers.Number).
    bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
    bool is_string() const { return kind_ == Kind::String; }
    bool is_markup() const { return kind_ == Kind::String && b_; }
    bool is_list() const { return kind_ == Kind::List; }
    bool is_dict() const { return kind_ == Kind::Dict; }
    bool is_object() const { return kind_ == Kind::Object; }
    /// A list or tuple (indexable, sized), not an iterator.
    bool is_sequence_list() const {
        return kind_ == Kind::List && (list_data().kind == SeqKind::List || list_data().kind == SeqKind::Tuple);
    }

    bool as_bool() const { return b_; }
    int64_t as_int() const { return kind_ == Kind::Bool ? (b_ ? 1 : 0) : i_; }
    /// int/float/bool as a double.
    double as_double() const { return kind_ == Kind::Float ? f_ : static_cast<double>(as_int()); }
    const std::string& str() const { return *static_cast<const std::string*>(p_.get()); }
    ListData& list_data() const { return *static_cast<ListData*>(p_.get()); }
    const std::vector<Value>& items() const { return list_data().items; }
    DictData& dict_data() const { return *static_cast<DictData*>(p_.get()); }
    Object& object() const { return *static_cast<Object*>(p_.get()); }
    std::shared_ptr<Object> object_ptr() const { return std::static_pointer_cast<Object>(p_); }
    const UndefinedInfo* undefined_info() const { return static_cast<const UndefinedInfo*>(p_.get()); }
    /// Nesting depth of a list/dict value (0 for other kinds).
    uint32_t nesting() const;
    /// Identity of the shared payload (Python's `is` for containers).
    const void* identity() const { return p_.get(); }

    /// Raises the error this undefined value carries.
    [[noreturn]] void fail_undefined() const;

private:
    Kind kind_;
    union {
        bool b_;  // Bool; for String: is markup
        int64_t i_;
        double f_;
    };
    std::shared_ptr<void> p_;
};

/// Positional and keyword arguments of a call.
inline size_t DictData::size() const { return items_.size(); }

struct CallArgs {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
    /// Keyword argument `name`, or nullptr.
    const Value* kwarg(std::string_view name) const;
};

class Interp;

/// A host object: namespace(), loop, macros, functions, bound methods,
/// cycler/joiner. Subclasses answer attribute reads and calls.
class Object : public std::enable_shared_from_this<Object> {
public:
    virtual ~Object() = default;
    /// Python's type(x).__name__ ("Namespace", "LoopContext", "Macro", ...).
    virtual std::string type_name() const = 0;
    /// jinja2's object_type_repr(): "jinja2.utils.Namespace object", ...
    virtual std::string type_repr() const { return type_name() + " object"; }
    /// Python's repr()/str().
    virtual std::string repr() const { return "<" + type_name() + " object>"; }
    /// Attribute `name`, or an undefined value saying why not.
    virtual Value getattr(const std::string& name) const;
    virtual bool callable() const { return false; }
    virtual Value call(Interp& in, CallArgs& args);
    /// Python's len(), or -1 when the object has none.
    virtual int64_t len() const { return -1; }
};

// ------------------------------------------------------------------ semantics

/// Python's bool(x).
bool truthy(const Value& v);
/// Python's ==.
bool equals(const Value& a, const Value& b);
/// Python's a < b for orderable pairs (numbers, strings, lists/tuples); raises
/// TypeError "'<' not supported between instances of ..." otherwise. `op` is
/// the operator named in that message.
bool less(const Value& a, const Value& b, const char* op = "<");
/// Three-way Python comparison: -1, 0, 1, or 2 when unordered (NaN); raises
/// TypeError naming `op` and the operand types in the given order.
int compare(const Value& a, const Value& b, const char* op);
/// Whether Python refuses to hash x (list, dict, dict_keys/dict_items views,
/// tuples holding such values).
bool unhashable(const Value& v);
/// The type name Python's "unhashable type: '...'" error gives, or "" when hashable.
std::string unhashable_type(const Value& v);
/// Raises TypeError "unhashable type: 'list'" for unhashable values.
void check_hashable(const Value& v);
/// The order CPython's list.sort() puts `keys` in (stable; `reverse` as
/// sort(reverse=True)), comparing with `<` in the same order for lists
/// shorter than 64, so type errors match too.
std::vector<size_t> py_sort_order(const std::vector<Value>& keys, bool reverse);
/// Python's str(x) (undefined: "").
std::string to_str(const Value& v);
/// Appends str(x) to `out`.
void append_str(std::string& out, const Value& v);
/// Python's repr(x).
std::string repr(const Value& v);
/// Python's type(x).__name__.
std::string type_name(const Value& v);
/// jinja2's object_type_repr(x), used in undefined messages.
std::string object_type_repr(const Value& v);
/// Python's len(x); raises TypeError "object of type 'int' has no len()".
int64_t length(const Value& v);
/// Python's iter(x) materialised (strings give characters, dicts their keys,
/// undefined nothing); raises TypeError "'int' object is not iterable". An
/// iterator is marked exhausted.
std::vector<Value> iterate(const Value& v);
/// Python's float repr ("1.0", "1e+20", "0.1", "inf").
std::string float_repr(double d);
/// Python's repr() of a string.
std::string str_repr(std::string_view s);

/// Options of json.dumps as Hugging Face's tojson filter passes them.
struct JsonOptions {
    bool ensure_ascii = false;
    bool has_indent = false;
    std::string indent;        // the indent unit when has_indent
    std::string item_sep = ", ";
    std::string key_sep = ": ";
    bool sort_keys = false;
};
/// json.dumps(x, ...): raises TypeError "Object of type X is not JSON serializable".
std::string to_json(const Value& v, const JsonOptions& o);

}  // namespace quern::jinja
