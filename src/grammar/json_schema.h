// JSON Schema → GBNF grammar (grammar.h), for response_format json_schema:
// the output is JSON that the schema accepts. Covered: type (object,
// array, string, integer, number, boolean, null, or a list of them),
// properties (in the order given; required ones always written, the others
// optional), required, items, minItems / maxItems, enum, const, anyOf /
// oneOf, allOf of one schema, $ref into $defs / definitions (recursion
// allowed), minLength / maxLength, pattern (regex.h), format (date, time,
// date-time, uuid, email, hostname, ipv4, uri), integer minimum / maximum /
// exclusiveMinimum / exclusiveMaximum (and minimum 0 on numbers), and the
// annotations that constrain nothing (title, description, default, examples,
// additionalProperties: only the declared properties are written). Anything
// else that constrains values (multipleOf, uniqueItems, other number bounds,
// ...) is refused naming the keyword, never ignored.
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"

namespace quern::grammar {

/// The GBNF text of `schema` (root the schema). quern::Error naming the
/// unsupported keyword or the bad value, with its JSON path.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);

/// The rules of `schema` without a root and without the shared JSON rules,
/// their names starting with `prefix`; `expr` receives the expression that
/// matches the schema (to combine several schemas in one grammar, followed
/// once by json_value_rules()).
std::string json_schema_rules(const nlohmann::ordered_json& schema, const std::string& prefix, std::string& expr);

/// json_schema_to_gbnf, parsed.
std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::ordered_json& schema);

}  // namespace quern::grammar
