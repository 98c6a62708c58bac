#include "grammar/json_schema.h"

#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "core/error.h"
#include "grammar/regex.h"

namespace quern::grammar {

namespace {

using Json = nlohmann::ordered_json;

/// A GBNF literal matching exactly the JSON text `j` (compact).
std::string literal(const Json& j) { return gbnf_literal(j.dump()); }

/// GBNF for the decimal numerals from a to b, strings of one length (a <= b);
/// digits after the first may be 0.
std::string same_length(const std::string& a, const std::string& b) {
    if (a == b) return "\"" + a + "\"";
    const size_t n = a.size();
    const std::string rest_a = a.substr(1), rest_b = b.substr(1);
    if (a[0] == b[0]) return "\"" + std::string(1, a[0]) + "\" " + same_length(rest_a, rest_b);
    const auto digits = [](char lo, char hi) { return lo == hi ? "\"" + std::string(1, lo) + "\"" : "[" + std::string(1, lo) + "-" + std::string(1, hi) + "]"; };
    const std::string any = n > 1 ? " [0-9]{" + std::to_string(n - 1) + "}" : "";
    if (rest_a.find_first_not_of('0') == std::string::npos && rest_b.find_first_not_of('9') == std::string::npos)
        return digits(a[0], b[0]) + any;
    std::string out = "( \"" + std::string(1, a[0]) + "\" " + same_length(rest_a, std::string(n - 1, '9'));
    if (b[0] - a[0] >= 2) out += " | " + digits(static_cast<char>(a[0] + 1), static_cast<char>(b[0] - 1)) + any;
    return out + " | \"" + std::string(1, b[0]) + "\" " + same_length(std::string(n - 1, '0'), rest_b) + " )";
}

/// GBNF for the numerals of [lo, hi] without leading zeros (no hi: any up to
/// 20 digits).
std::string unsigned_range(uint64_t lo, std::optional<uint64_t> hi) {
    std::vector<std::string> alts;
    if (lo == 0) {
        alts.push_back("\"0\"");
        if (hi && *hi == 0) return alts[0];
        lo = 1;
    }
    const std::string a = std::to_string(lo);
    const size_t la = a.size(), lb = hi ? std::to_string(*hi).size() : 20;
    if (hi && la == lb) {
        alts.push_back(same_length(a, std::to_string(*hi)));
    } else {
        alts.push_back(same_length(a, std::string(la, '9')));
        const size_t mid_hi = hi ? lb - 1 : lb;  // lengths wholly inside
        if (mid_hi > la) alts.push_back("[1-9] [0-9]{" + std::to_string(la) + (mid_hi - 1 > la ? "," + std::to_string(mid_hi - 1) : "") + "}");
        if (hi) alts.push_back(same_length("1" + std::string(lb - 1, '0'), std::to_string(*hi)));
    }
    std::string out;
    for (const auto& x : alts) out += (out.empty() ? "" : " | ") + x;
    return alts.size() == 1 ? out : "( " + out + " )";
}

/// GBNF for the integers of [lo, hi] (either end open).
std::string integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
    const auto magnitude = [](int64_t v) { return v < 0 ? static_cast<uint64_t>(-(v + 1)) + 1 : static_cast<uint64_t>(v); };
    std::vector<std::string> alts;
    if (!lo || *lo < 0) {  // negatives: magnitudes from max(1, -hi) to -lo
        const uint64_t from = hi && *hi < 0 ? magnitude(*hi) : 1;
        alts.push_back("\"-\" " + unsigned_range(from, lo ? std::optional<uint64_t>(magnitude(*lo)) : std::nullopt));
    }
    if (!hi || *hi >= 0)
        alts.push_back(unsigned_range(lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0,
                                      hi ? std::optional<uint64_t>(static_cast<uint64_t>(*hi)) : std::nullopt));
    return alts.size() == 1 ? alts[0] : alts[0] + " | " + alts[1];
}

class Compiler {
public:
    explicit Compiler(const Json& root, std::string prefix = "s") : root_(root), prefix_(std::move(prefix)) {}

    std::string run() {
        const std::string r = rule(root_, "#");
        return "root ::= " + r + "\n" + out_ + json_value_rules();
    }
    /// The rules only; `expr` the schema's expression.
    std::string rules(std::string& expr) {
        expr = rule(root_, "#");
        return out_;
    }

private:
    [[noreturn]] static void refuse(const std::string& path, const std::string& what) {
        fail("json_schema at {}: {}", path, what);
    }
    std::string fresh() { return prefix_ + std::to_string(n_++); }
    std::string def(const std::string& body) {
        const std::string name = fresh();
        out_ += name + " ::= " + body + "\n";
        return name;
    }

    /// The rule (or expression) for `s` at `path`.
    std::string rule(const Json& s, const std::string& path) {
        if (s.is_boolean()) {
            if (!s.get<bool>()) refuse(path, "the schema false accepts nothing");
            return "value";
        }
        if (!s.is_object()) refuse(path, "a schema must be an object or a boolean");
        static const std::set<std::string> kIgnored = {"title", "description", "default", "examples", "$schema", "$id",
                                                       "$comment", "additionalProperties", "$defs", "definitions",
                                                       "strict", "readOnly", "writeOnly", "deprecated"};
        static const std::set<std::string> kKnown = {
            "type",      "properties", "required",  "items",   "minItems", "maxItems", "enum",      "const",
            "anyOf",     "oneOf",      "allOf",     "$ref",    "minLength", "maxLength", "pattern", "format",
            "minimum",   "maximum",    "exclusiveMinimum", "exclusiveMaximum"};
        for (const auto& [k, v] : s.items())
            if (!kIgnored.count(k) && !kKnown.count(k))
                refuse(path, "the keyword '" + k + "' is not supported (constrained decoding cannot enforce it yet)");
        if (s.contains("$ref")) return ref(s["$ref"], path);
        if (s.contains("const")) return literal(s["const"]);
        if (s.contains("enum")) {
            if (!s["enum"].is_array() || s["enum"].empty()) refuse(path + "/enum", "'enum' must be a non-empty list");
            std::string alts;
            for (const Json& v : s["enum"]) alts += (alts.empty() ? "" : " | ") + literal(v);
            return "( " + alts + " )";
        }
        for (const char* key : {"anyOf", "oneOf"})
            if (s.contains(key)) {
                const Json& list = s[key];
                if (!list.is_array() || list.empty()) refuse(path + "/" + key, std::string("'") + key + "' must be a non-empty list");
                std::string alts;
                for (size_t i = 0; i < list.size(); ++i)
                    alts += (alts.empty() ? "" : " | ") + rule(list[i], path + "/" + key + "/" + std::to_string(i));
                return "( " + alts + " )";
            }
        if (s.contains("allOf")) {
            if (!s["allOf"].is_array() || s["allOf"].size() != 1) refuse(path + "/allOf", "'allOf' of one schema only");
            return rule(s["allOf"][0], path + "/allOf/0");
        }
        if (!s.contains("type")) {
            // Keywords of one type without a type: that type is written (the
            // keywords constrain nothing else).
            if (s.contains("properties")) return object(s, path);
            for (const char* k : {"minLength", "maxLength", "pattern", "format"})
                if (s.contains(k)) return string(s, path);
            for (const char* k : {"items", "minItems", "maxItems"})
                if (s.contains(k)) return array(s, path);
            for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
                if (s.contains(k)) return number(s, path, false);
            return "value";
        }
        const Json& t = s["type"];
        if (t.is_array()) {
            std::string alts;
            for (const Json& one : t) {
                Json copy = s;
                copy["type"] = one;
                alts += (alts.empty() ? "" : " | ") + rule(copy, path);
            }
            return "( " + alts + " )";
        }
        const std::string type = t.is_string() ? t.get<std::string>() : "";
        if (type == "object") return object(s, path);
        if (type == "array") return array(s, path);
        if (type == "string") return string(s, path);
        if (type == "integer") return number(s, path, true);
        if (type == "number") return number(s, path, false);
        if (type == "boolean") return "boolean";
        if (type == "null") return "null";
        refuse(path + "/type", "unknown type '" + t.dump() + "'");
    }

    std::string ref(const Json& r, const std::string& path) {
        if (!r.is_string()) refuse(path + "/$ref", "'$ref' must be a string");
        const std::string target = r.get<std::string>();
        const auto it = refs_.find(target);
        if (it != refs_.end()) return it->second;
        std::string name;
        for (const char* prefix : {"#/$defs/", "#/definitions/"})
            if (target.rfind(prefix, 0) == 0) name = target.substr(std::string(prefix).size());
        const char* section = target.rfind("#/$defs/", 0) == 0 ? "$defs" : "definitions";
        if (name.empty() || !root_.contains(section) || !root_[section].contains(name))
            refuse(path + "/$ref", "'" + target + "' is not a definition of this schema ($defs or definitions)");
        const std::string rn = fresh();
        refs_[target] = rn;  // before compiling it: recursive references find it
        const std::string body = rule(root_[section][name], target);
        out_ += rn + " ::= " + body + "\n";
        return rn;
    }

    std::string object(const Json& s, const std::string& path) {
        if (!s.contains("properties")) return "object";
        const Json& props = s["properties"];
        if (!props.is_object()) refuse(path + "/properties", "'properties' must be an object");
        std::set<std::string> required;
        if (s.contains("required")) {
            if (!s["required"].is_array()) refuse(path + "/required", "'required' must be a list of names");
            for (const Json& r : s["required"]) {
                if (!r.is_string() || !props.contains(r.get<std::string>()))
                    refuse(path + "/required", "'" + r.dump() + "' is required but not among the properties");
                required.insert(r.get<std::string>());
            }
        }
        // Members in order: S_i writes from property i with nothing written
        // yet, T_i after something was (each member then after a comma); an
        // optional property may be skipped.
        std::vector<std::string> members;
        std::vector<bool> optional;
        for (const auto& [name, sub] : props.items()) {
            members.push_back(literal(Json(name)) + " ws \":\" ws " + rule(sub, path + "/properties/" + name));
            optional.push_back(!required.count(name));
        }
        const size_t n = members.size();
        std::vector<std::string> S(n + 1), T(n + 1);
        S[n] = T[n] = "";
        for (size_t i = n; i-- > 0;) {
            const std::string t_next = T[i + 1].empty() ? "" : " " + T[i + 1];
            const std::string s_body = members[i] + t_next + (optional[i] ? " | " + (S[i + 1].empty() ? "\"\"" : S[i + 1]) : "");
            const std::string t_body = "ws \",\" ws " + members[i] + t_next + (optional[i] ? " | " + (T[i + 1].empty() ? "\"\"" : T[i + 1]) : "");
            S[i] = def(s_body);
            T[i] = def(t_body);
        }
        return "\"{\" ws " + (n > 0 ? S[0] + " " : "") + "ws \"}\"";
    }

    /// A count keyword's value (absent: `otherwise`).
    static int64_t count(const Json& s, const char* key, const std::string& path, int64_t otherwise) {
        if (!s.contains(key)) return otherwise;
        const Json& v = s[key];
        if (!v.is_number_integer() || v.get<int64_t>() < 0) refuse(path + "/" + key, std::string("'") + key + "' must be a count");
        if (v.get<int64_t>() > 10000) refuse(path + "/" + key, std::string("'") + key + "' above 10000 is not supported");
        return v.get<int64_t>();
    }
    /// The GBNF repetition suffix for m..n times (n < 0: no bound).
    static std::string times(int64_t m, int64_t n) {
        if (n < 0) return m == 0 ? "*" : "{" + std::to_string(m) + ",}";
        return m == n ? "{" + std::to_string(m) + "}" : "{" + std::to_string(m) + "," + std::to_string(n) + "}";
    }

    std::string array(const Json& s, const std::string& path) {
        const std::string item = s.contains("items") ? rule(s["items"], path + "/items") : "value";
        const int64_t min = count(s, "minItems", path, 0), max = count(s, "maxItems", path, -1);
        if (max >= 0 && max < min) refuse(path + "/maxItems", "'maxItems' is below 'minItems'");
        if (max == 0) return "\"[\" ws \"]\"";
        const int64_t more_min = std::max<int64_t>(min - 1, 0), more_max = max < 0 ? -1 : max - 1;
        std::string list = item;
        if (more_max != 0) list += " ( ws \",\" ws " + item + " )" + times(more_min, more_max);
        return "\"[\" ws " + (min == 0 ? "( " + list + " )?" : list) + " ws \"]\"";
    }

    std::string string(const Json& s, const std::string& path) {
        const bool lengths = s.contains("minLength") || s.contains("maxLength");
        if (s.contains("pattern") && lengths)
            refuse(path, "'pattern' together with 'minLength' / 'maxLength' is not supported (put the length in the pattern)");
        if (s.contains("format") && (lengths || s.contains("pattern")))
            refuse(path, "'format' together with 'pattern' or a length is not supported");
        std::string pattern;
        if (s.contains("pattern")) {
            if (!s["pattern"].is_string()) refuse(path + "/pattern", "'pattern' must be a string");
            pattern = s["pattern"].get<std::string>();
        } else if (s.contains("format")) {
            if (!s["format"].is_string()) refuse(path + "/format", "'format' must be a string");
            pattern = format_pattern(s["format"].get<std::string>(), path);
        }
        if (!pattern.empty()) {
            try {
                return def("\"\\\"\" " + regex_to_gbnf(pattern) + " \"\\\"\"");
            } catch (const Error& e) {
                refuse(path + (s.contains("pattern") ? "/pattern" : "/format"), e.what());
            }
        }
        if (!lengths) return "string";
        const int64_t min = count(s, "minLength", path, 0), max = count(s, "maxLength", path, -1);
        if (max >= 0 && max < min) refuse(path + "/maxLength", "'maxLength' is below 'minLength'");
        return def("\"\\\"\" char" + times(min, max) + " \"\\\"\"");
    }

    /// The pattern standing for a string format (RFC 3339 date and time,
    /// RFC 4122 uuid, RFC 3986 uri without userinfo or IP-literal hosts;
    /// email, hostname and ipv4 as their common forms). Each part is bounded
    /// (a uri at most ~900 characters): a small model that loops inside one
    /// must still end before max_tokens.
    static std::string format_pattern(const std::string& f, const std::string& path) {
        // Days as each month has them; 29 February in leap years only.
        static const std::string date =
            R"((\d{4}-(0[1-9]|1[0-2])-(0[1-9]|1\d|2[0-8])|\d{4}-(0[13-9]|1[0-2])-(29|30)|\d{4}-(0[13578]|1[02])-31|)"
            R"((\d\d(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29))";
        static const std::string time =
            R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))";
        // A DNS label: 1-63 characters, no hyphen at either end.
        const auto label_upto = [](int n) { return "[A-Za-z0-9]([A-Za-z0-9-]{0," + std::to_string(n - 2) + "}[A-Za-z0-9])?"; };
        static const std::string label = label_upto(63);
        // RFC 1035 caps a name at 253 characters, which a regular pattern can
        // only keep by bounding the label count: up to four labels of full
        // length (3 * 63 + 61 + 3 dots = 253), or five to nine short ones.
        static const std::string hostname = "(" + label + "(\\." + label + "){0,2}(\\." + label_upto(61) + ")?|" +
                                            label_upto(26) + "(\\." + label_upto(26) + "){4,8})";
        static const std::string octet = R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))";
        if (f == "date") return "^" + date + "$";
        if (f == "time") return "^" + time + "$";
        if (f == "date-time") return "^" + date + "T" + time + "$";
        if (f == "uuid") return R"(^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$)";
        if (f == "email") return "^[A-Za-z0-9._%+-]{1,64}@" + label + "(\\." + label + "){1,4}$";
        if (f == "hostname") return "^" + hostname + "$";
        if (f == "ipv4") return "^" + octet + "(\\." + octet + "){3}$";
        if (f == "uri") {  // RFC 3986: scheme ":" ("//" host [":" port] path | path) ["?" query] ["#" fragment]
            static const std::string seg = R"(([A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2}))";
            static const std::string host = R"(([A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2}))";
            static const std::string query = R"(([A-Za-z0-9\-._~!$&'()*+,;=:@/?]|%[0-9A-Fa-f]{2}))";
            return "^[A-Za-z][A-Za-z0-9+.-]{0,31}:(//" + host + "{1,64}(:\\d{1,5})?(/" + seg + "{0,64}){0,8}|/?" + seg +
                   "{1,64}(/" + seg + "{0,64}){0,8})(\\?" + query + "{0,128})?(#" + query + "{0,128})?$";
        }
        refuse(path + "/format", "the format '" + f + "' is not supported (date, time, date-time, uuid, email, hostname, ipv4, uri are)");
    }

    /// integer (or number) with minimum / maximum / exclusive bounds.
    std::string number(const Json& s, const std::string& path, bool integer) {
        const bool bounded = s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
                             s.contains("exclusiveMaximum");
        if (!bounded) return integer ? "integer" : "number";
        const auto bound = [&](const char* key, const char* exclusive, bool lower) -> std::optional<double> {
            std::optional<double> v;
            bool excl = false;
            if (s.contains(key)) {
                if (!s[key].is_number()) refuse(path + "/" + key, std::string("'") + key + "' must be a number");
                v = s[key].get<double>();
            }
            if (s.contains(exclusive)) {
                const Json& e = s[exclusive];
                if (e.is_boolean()) {  // draft 4: a flag on minimum / maximum
                    excl = e.get<bool>();
                } else if (e.is_number()) {
                    const double x = e.get<double>();
                    if (!v || (lower ? x >= *v : x <= *v)) {
                        v = x;
                        excl = true;
                    }
                } else {
                    refuse(path + "/" + exclusive, std::string("'") + exclusive + "' must be a number");
                }
            }
            if (!v) return v;
            if (!integer) {
                // Numbers: only a lower bound of 0 (no minus sign) can be written as a grammar.
                if (!lower || *v != 0 || excl)
                    refuse(path + "/" + key, "bounds on numbers other than minimum 0 are not supported (use type integer)");
                return v;
            }
            return lower ? (excl ? std::floor(*v) + 1 : std::ceil(*v)) : (excl ? std::ceil(*v) - 1 : std::floor(*v));
        };
        const auto lo = bound("minimum", "exclusiveMinimum", true);
        const auto hi = bound("maximum", "exclusiveMaximum", false);
        if (!integer)  // minimum 0
            return def(R"(( "0" | [1-9] [0-9]{0,19} ) ( "." [0-9]{1,24} )? ( [eE] [-+]? [0-9]{1,3} )?)");
        constexpr double kLimit = 9.2e18;  // inside int64
        if ((lo && std::abs(*lo) > kLimit) || (hi && std::abs(*hi) > kLimit))
            refuse(path, "integer bounds beyond ±9.2e18 are not supported");
        if (lo && hi && *lo > *hi) refuse(path, "no integer lies within the bounds");
        return def(integer_range(lo ? std::optional<int64_t>(static_cast<int64_t>(*lo)) : std::nullopt,
                                 hi ? std::optional<int64_t>(static_cast<int64_t>(*hi)) : std::nullopt));
    }

    const Json& root_;
    std::string prefix_;
    std::string out_;
    int n_ = 0;
    std::map<std::string, std::string> refs_;
};

}  // namespace

std::string json_schema_to_gbnf(const Json& schema) { return Compiler(schema).run(); }

std::string json_schema_rules(const Json& schema, const std::string& prefix, std::string& expr) {
    return Compiler(schema, prefix).rules(expr);
}

std::shared_ptr<const Grammar> json_schema_grammar(const Json& schema) {
    return Grammar::parse(json_schema_to_gbnf(schema));
}

}  // namespace quern::grammar
