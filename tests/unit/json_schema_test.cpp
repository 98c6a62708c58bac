// JSON Schema → grammar (grammar/json_schema.h): instances of a schema are
// sentences of its grammar and others are not — on hand-written schemas
// (required and optional members, nested arrays, enums, anyOf with null,
// recursive $ref as pydantic writes them) and on 200 random schemas, each
// with random instances made from it; keywords it cannot enforce are
// refused by name.
#include <gtest/gtest.h>

#include <random>

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
    for (const char* s : {R"({"type": "string", "pattern": "a+"})", R"({"type": "integer", "minimum": 3})",
                          R"({"type": "string", "format": "date-time"})", R"({"type": "array", "maxItems": 2})",
                          R"({"$ref": "#/$defs/Missing"})", R"({"type": "strange"})"}) {
        try {
            json_schema_to_gbnf(Json::parse(s));
            ADD_FAILURE() << s << " accepted";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("json_schema at #"), std::string::npos) << e.what();
        }
    }
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
