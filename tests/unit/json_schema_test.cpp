// JSON Schema → grammar (grammar/json_schema.h): instances of a schema are
// sentences of its grammar and others are not — on hand-written schemas
// (required and optional members, nested arrays, enums, anyOf with null,
// recursive $ref as pydantic writes them) and on 200 random schemas, each
// with random instances made from it; keywords it cannot enforce are
// refused by name.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <tuple>

#include "core/error.h"
#include "grammar/json_schema.h"

using namespace quern;
using namespace quern::grammar;
using Json = nlohmann::ordered_json;

namespace {

bool accepts(const std::shared_ptr<const Grammar>& g, const std::string& text) {
    GrammarState s(g);
    return s.advance_bytes(text) && s.accepting();
}

TEST(JsonSchema, InstancesAndNonInstances) {
    const Json schema = Json::parse(R"({
      "$defs": {"Node": {"type": "object", "properties": {"v": {"type": "integer"},
                 "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}, "required": ["v"]}},
      "type": "object",
      "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "score": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "kind": {"enum": ["a", "b", 3]}, "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "tree": {"$ref": "#/$defs/Node"}, "ok": {"type": "boolean"}
      },
      "required": ["name", "age", "tags"]})");
    const auto g = json_schema_grammar(schema);
    for (const char* ok : {
             R"({"name": "Ada", "age": 36, "tags": ["x"]})",
             R"({"name":"Ada","age":-1,"score":1.5e3,"tags":["x","y"],"kind":3,"note":null,"tree":{"v":1,"kids":[{"v":2}]},"ok":true})",
             R"({"name": "Ada", "age": 0, "tags": ["x"], "note": "n"})"}) {
        EXPECT_TRUE(accepts(g, ok)) << ok;
        EXPECT_TRUE(accepts(g, Json::parse(ok).dump(2))) << ok;
    }
    for (const char* bad : {
             R"({"age": 36, "tags": ["x"]})",                          // name missing
             R"({"name": "Ada", "age": 36.5, "tags": ["x"]})",         // not an integer
             R"({"name": "Ada", "age": 36, "tags": []})",              // minItems 1
             R"({"name": "Ada", "age": 36, "tags": ["x"], "kind": "c"})",
             R"({"name": "Ada", "age": 36, "tags": ["x"], "extra": 1})",  // only declared members
             R"({"age": 36, "name": "Ada", "tags": ["x"]})",           // declared order
             R"({"name": "Ada", "age": 36, "tags": ["x"], "tree": {"kids": []}})"})
        EXPECT_FALSE(accepts(g, bad)) << bad;
}

TEST(JsonSchema, UnenforceableKeywordsAreRefused) {
    for (const char* s : {R"({"type": "string", "pattern": "(?=a)b"})", R"({"type": "string", "pattern": "(a)\\1"})",
                          R"({"type": "string", "pattern": "\\bword"})", R"({"type": "string", "pattern": "a^b"})",
                          R"({"type": "string", "pattern": "^a|b$"})", R"({"type": "string", "pattern": "[b-a]"})",
                          R"({"type": "string", "pattern": "a+", "maxLength": 3})", R"({"type": "number", "maximum": 3})",
                          R"({"type": "string", "format": "ipv6"})", R"({"type": "array", "maxItems": 20000})",
                          R"({"type": "integer", "minimum": 3, "maximum": 2})", R"({"type": "string", "minLength": 4, "maxLength": 2})",
                          R"({"type": "array", "uniqueItems": true})", R"({"type": "number", "multipleOf": 2})",
                          R"({"$ref": "#/$defs/Missing"})", R"({"type": "strange"})"}) {
        try {
            json_schema_to_gbnf(Json::parse(s));
            ADD_FAILURE() << s << " accepted";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("json_schema at #"), std::string::npos) << e.what();
        }
    }
}

/// Whether the grammar of `schema` accepts the JSON text of `value`.
bool schema_accepts(const Json& schema, const Json& value) { return accepts(json_schema_grammar(schema), value.dump()); }

TEST(JsonSchema, StringLengthsPatternsAndFormats) {
    const Json len = Json::parse(R"({"type": "string", "minLength": 2, "maxLength": 4})");
    for (const char* ok : {"ab", "a\"\\b", "你好", "abcd"}) EXPECT_TRUE(schema_accepts(len, ok)) << ok;
    for (const char* bad : {"a", "abcde", ""}) EXPECT_FALSE(schema_accepts(len, bad)) << bad;
    struct Case {
        const char* pattern;
        std::vector<std::string> ok, bad;
    };
    const std::vector<Case> cases = {
        {"^[A-Z]{2}-\\d{3,4}$", {"AB-123", "ZZ-0000"}, {"ab-123", "AB-12", "AB-12345", "xAB-123"}},
        {"^(cat|dog)s?$", {"cat", "dogs"}, {"cow", "cats!"}},
        {"^a.c$", {"abc", "a\"c", "a\\c", "a你c"}, {"a\nc", "ac"}},
        {"^[^a-z\\s]+$", {"ABC", "1\"2", "你"}, {"aB", "A B", ""}},
        {"^\\w+@\\w+\\.(com|org)$", {"ada@x.org"}, {"ada@x.net", "@x.com"}},
        {"^(?:\\+\\d{1,3} )?\\(\\d{3}\\) \\d{3}-\\d{4}$", {"(555) 123-4567", "+44 (555) 123-4567"}, {"555-123-4567"}},
        {"x{2}y", {"xxy", "_xxy_"}, {"xy"}},  // unanchored: a search
        {"^a{1,}[\\t]?$", {"aaa", "a\t"}, {"", "a\t\t"}},
        {"^\\u00e9\\x41[\\d-]$", {"éA-", "éA7"}, {"eA7"}},
        {"^a{$", {"a{"}, {"a"}},  // a '{' that opens no count stands for itself
    };
    for (const Case& c : cases) {
        const Json schema = {{"type", "string"}, {"pattern", c.pattern}};
        for (const auto& v : c.ok) EXPECT_TRUE(schema_accepts(schema, v)) << c.pattern << " " << v;
        for (const auto& v : c.bad) EXPECT_FALSE(schema_accepts(schema, v)) << c.pattern << " " << v;
    }
    const std::string L63(63, 'q');
    const std::vector<std::tuple<const char*, std::vector<std::string>, std::vector<std::string>>> formats = {
        {"date", {"2026-12-05", "2024-02-29", "2000-02-29", "2026-04-30", "2026-01-31"},
         {"2026-13-01", "26-12-05", "2026-12-5", "1999-02-31", "2026-02-29", "1900-02-29", "2026-04-31", "2026-00-10"}},
        // no leap seconds: RFC 3339 allows :60 only where the UTC time is 23:59:60, which a grammar cannot check
        {"time", {"23:59:59Z", "08:00:00.123+05:30"}, {"24:00:00Z", "08:00:00", "20:22:60-03:09"}},
        {"date-time", {"2026-12-05T01:20:09Z"}, {"2026-12-05 01:20:09Z"}},
        {"uuid", {"123e4567-e89b-12d3-a456-426614174000"}, {"123e4567e89b12d3a456426614174000"}},
        {"email", {"ada.lovelace+x@example.co.uk"}, {"ada@", "ada@localhost", "a b@x.org"}},
        {"ipv4", {"192.168.0.255", "0.0.0.0"}, {"256.1.1.1", "1.2.3", "01.2.3.4"}},
        {"hostname", {"example.com", "a-b.c", "a.b.c.d.e.f.g.h.i", L63 + "." + L63 + "." + L63 + "." + L63.substr(2)},
         // too long: a 64-character label; four full labels are 255 characters, over RFC 1035's 253
         {"-a.com", "a..b", L63 + "x", L63 + "." + L63 + "." + L63 + "." + L63}},
        {"uri", {"https://example.com:8080/a/b%20c?b=c&d=/e?#frag/x", "urn:isbn:0451450523", "mailto:ada@example.org"},
         {"//example.com", "http://a b", "anyOf:[]", "a:b#c#d", "http://x/%zz"}},
    };
    for (const auto& [f, ok, bad] : formats) {
        const Json schema = {{"type", "string"}, {"format", f}};
        for (const auto& v : ok) EXPECT_TRUE(schema_accepts(schema, v)) << f << " " << v;
        for (const auto& v : bad) EXPECT_FALSE(schema_accepts(schema, v)) << f << " " << v;
    }
}

// Integer bounds against arithmetic, on fresh random ranges (inclusive,
// exclusive, open at either end, across zero and across digit counts).
TEST(JsonSchema, IntegerBoundsMatchArithmetic) {
    const unsigned seed = std::random_device{}();
    std::mt19937 rng(seed);
    const int64_t scales[] = {9, 100, 1000, 123456, 9000000000LL};
    for (int t = 0; t < 60; ++t) {
        const int64_t scale = scales[rng() % 5];
        const auto pick = [&] { return static_cast<int64_t>(rng() % static_cast<uint64_t>(2 * scale + 1)) - scale; };
        int64_t a = pick(), b = pick();
        if (a > b) std::swap(a, b);
        Json schema = {{"type", "integer"}};
        const int form = static_cast<int>(rng() % 4);
        std::optional<int64_t> lo, hi;
        if (form != 1) {
            if (rng() % 2) schema["minimum"] = a, lo = a;
            else schema["exclusiveMinimum"] = a - 1, lo = a;
        }
        if (form != 2) {
            if (rng() % 2) schema["maximum"] = b, hi = b;
            else schema["exclusiveMaximum"] = b + 1, hi = b;
        }
        const auto g = json_schema_grammar(schema);
        std::vector<int64_t> probes = {0, 1, -1, a, b, a - 1, b + 1, a + 1, b - 1, 10, -10, 99, 100, -100, 1000000};
        for (int k = 0; k < 40; ++k) probes.push_back(pick());
        for (int64_t v : probes) {
            const bool want = (!lo || v >= *lo) && (!hi || v <= *hi);
            EXPECT_EQ(accepts(g, std::to_string(v)), want) << "seed " << seed << " " << schema.dump() << " value " << v;
        }
        EXPECT_FALSE(accepts(g, "-0")) << schema.dump();
        if ((!lo || *lo <= 5) && (!hi || *hi >= 5)) EXPECT_FALSE(accepts(g, "05")) << schema.dump();
    }
    // a lower bound of 0 on numbers: no minus sign
    const Json nonneg = Json::parse(R"({"type": "number", "minimum": 0})");
    EXPECT_TRUE(schema_accepts(nonneg, 0.5));
    EXPECT_TRUE(schema_accepts(nonneg, 0));
    EXPECT_FALSE(schema_accepts(nonneg, -0.5));
}

TEST(JsonSchema, ArrayLengths) {
    const Json s = Json::parse(R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3})");
    EXPECT_FALSE(schema_accepts(s, Json::parse("[1]")));
    EXPECT_TRUE(schema_accepts(s, Json::parse("[1, 2]")));
    EXPECT_TRUE(schema_accepts(s, Json::parse("[1, 2, 3]")));
    EXPECT_FALSE(schema_accepts(s, Json::parse("[1, 2, 3, 4]")));
    const Json none = Json::parse(R"({"type": "array", "maxItems": 0})");
    EXPECT_TRUE(schema_accepts(none, Json::array()));
    EXPECT_FALSE(schema_accepts(none, Json::parse("[1]")));
    const Json one = Json::parse(R"({"type": "array", "maxItems": 1})");
    EXPECT_TRUE(schema_accepts(one, Json::array()));
    EXPECT_TRUE(schema_accepts(one, Json::parse("[{}]")));
    EXPECT_FALSE(schema_accepts(one, Json::parse("[1, 2]")));
}

/// A random schema and a generator of its instances.
Json random_schema(std::mt19937& rng, int depth) {
    const int k = static_cast<int>(rng() % (depth > 2 ? 5 : 8));
    switch (k) {
        case 0: return Json{{"type", "string"}};
        case 1: return Json{{"type", "integer"}};
        case 2: return Json{{"type", "number"}};
        case 3: return Json{{"type", "boolean"}};
        case 4: return Json{{"enum", Json::array({"x", 1, nullptr, "y z"})}};
        case 5: return Json{{"type", "array"}, {"items", random_schema(rng, depth + 1)}, {"minItems", static_cast<int>(rng() % 2)}};
        case 6: return Json{{"anyOf", Json::array({random_schema(rng, depth + 1), Json{{"type", "null"}}})}};
        default: {
            Json props = Json::object(), req = Json::array();
            for (int n = 1 + static_cast<int>(rng() % 4), i = 0; i < n; ++i) {
                const std::string name = "p" + std::to_string(i);
                props[name] = random_schema(rng, depth + 1);
                if (rng() % 2) req.push_back(name);
            }
            return Json{{"type", "object"}, {"properties", props}, {"required", req}};
        }
    }
}

Json instance(const Json& s, std::mt19937& rng) {
    if (s.contains("enum")) return s["enum"][rng() % s["enum"].size()];
    if (s.contains("anyOf")) return instance(s["anyOf"][rng() % 2], rng);
    const std::string t = s["type"];
    if (t == "string") return std::string(rng() % 5, 'a' + static_cast<char>(rng() % 26)) + "\"\\é";
    if (t == "integer") return static_cast<int>(rng() % 2001) - 1000;
    if (t == "number") return (static_cast<double>(rng() % 100000) - 50000) / 64.0;
    if (t == "boolean") return rng() % 2 == 0;
    if (t == "null") return nullptr;
    if (t == "array") {
        Json a = Json::array();
        for (int n = s["minItems"].get<int>() + static_cast<int>(rng() % 3); n > 0; --n) a.push_back(instance(s["items"], rng));
        return a;
    }
    Json o = Json::object();
    for (const auto& [name, sub] : s["properties"].items()) {
        bool req = false;
        for (const Json& r : s["required"]) req = req || r == name;
        if (req || rng() % 2) o[name] = instance(sub, rng);
    }
    return o;
}

TEST(JsonSchema, RandomSchemasAcceptTheirInstances) {
    std::mt19937 rng(2026);
    for (int i = 0; i < 200; ++i) {
        const Json s = random_schema(rng, 0);
        const auto g = json_schema_grammar(s);
        for (int j = 0; j < 3; ++j) {
            const Json v = instance(s, rng);
            EXPECT_TRUE(accepts(g, v.dump())) << s.dump() << "\n" << v.dump();
            EXPECT_TRUE(accepts(g, v.dump(2))) << s.dump() << "\n" << v.dump(2);
        }
    }
}

}  // namespace
