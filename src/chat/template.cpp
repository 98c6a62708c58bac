// Template: parse once, render many times (see template.h).
#include "chat/template.h"

namespace quern::jinja {

Template::Template(std::string_view source, const TemplateOptions& opts)
    : prog_(std::make_shared<const Program>(parse(source, opts.lex, opts.parse))) {}

std::string Template::render(const Value& context, const RenderOptions& opts) const {
    Interp in(*prog_, opts);
    return in.render(context);
}

namespace {
Value from_json_d(const nlohmann::ordered_json& j, int depth) {
    if (depth > static_cast<int>(kMaxNesting))
        raise("RecursionError", "maximum recursion depth exceeded (JSON nests too deeply)");
    switch (j.type()) {
        case nlohmann::ordered_json::value_t::null: return Value::none();
        case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
        case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
        case nlohmann::ordered_json::value_t::number_unsigned: {
            const uint64_t u = j.get<uint64_t>();
            if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
            return Value(static_cast<int64_t>(u));
        }
        case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
        case nlohmann::ordered_json::value_t::string: return Value(j.get_ref<const std::string&>());
        case nlohmann::ordered_json::value_t::array: {
            std::vector<Value> items;
            items.reserve(j.size());
            for (const auto& e : j) items.push_back(from_json_d(e, depth + 1));
            return Value::list(std::move(items));
        }
        case nlohmann::ordered_json::value_t::object: {
            auto d = std::make_shared<DictData>();
            for (const auto& [k, v] : j.items()) d->set(Value(k), from_json_d(v, depth + 1));
            return Value(std::move(d));
        }
        default: return Value::none();
    }
}
}  // namespace

Value from_json(const nlohmann::ordered_json& j) { return from_json_d(j, 0); }

}  // namespace quern::jinja
