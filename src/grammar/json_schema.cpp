#include "grammar/json_schema.h"

#include <map>
#include <set>

#include "core/error.h"

namespace quern::grammar {

namespace {

using Json = nlohmann::ordered_json;

/// A GBNF literal matching exactly the JSON text `j` (compact).
std::string literal(const Json& j) {
    std::string out = "\"";
    for (char c : j.dump()) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
    }
    return out + "\"";
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
        static const std::set<std::string> kKnown = {"type", "properties", "required", "items", "minItems", "enum",
                                                     "const", "anyOf", "oneOf", "allOf", "$ref"};
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
        if (!s.contains("type")) return s.contains("properties") ? object(s, path) : "value";
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
        if (type == "string") return "string";
        if (type == "integer") return "integer";
        if (type == "number") return "number";
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

    std::string array(const Json& s, const std::string& path) {
        const std::string item = s.contains("items") ? rule(s["items"], path + "/items") : "value";
        int64_t min = 0;
        if (s.contains("minItems")) {
            if (!s["minItems"].is_number_integer() || s["minItems"].get<int64_t>() < 0 || s["minItems"].get<int64_t>() > 1)
                refuse(path + "/minItems", "'minItems' above 1 is not supported");
            min = s["minItems"].get<int64_t>();
        }
        const std::string list = item + " ( ws \",\" ws " + item + " )*";
        return "\"[\" ws " + (min == 0 ? "( " + list + " )?" : list) + " ws \"]\"";
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
