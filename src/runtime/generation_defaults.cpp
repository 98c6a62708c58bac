#include "runtime/generation_defaults.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace quern {

namespace {

using Json = nlohmann::json;

/// The value of `key`, or nullptr when absent or null.
const Json* value(const Json& j, const char* key) {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
}

std::optional<float> number(const Json& j, const char* key, const std::string& where, double lo, double hi,
                            bool lo_open, const char* range) {
    const Json* v = value(j, key);
    if (!v) return std::nullopt;
    if (!v->is_number()) fail("{}: key '{}' must be a number {}, got {}", where, key, range, v->dump());
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi || (lo_open && d == lo))
        fail("{}: key '{}' must be {}, got {}", where, key, range, v->dump());
    return static_cast<float>(d);
}

std::string show(float v) { return fmt::format("{:g}", v); }

}  // namespace

std::vector<std::string> GenerationDefaults::apply(SamplingParams& sp, const SamplingGiven& given) const {
    std::vector<std::string> used;
    if (!given.temperature) {
        if (greedy) {
            sp.temperature = 0.0f;
            used.push_back("temperature 0 (do_sample false)");
        } else if (temperature) {
            sp.temperature = *temperature;
            used.push_back("temperature " + show(*temperature));
        }
    }
    if (top_k && !given.top_k) {
        sp.top_k = *top_k;
        used.push_back(fmt::format("top_k {}", *top_k));
    }
    if (top_p && !given.top_p) {
        sp.top_p = *top_p;
        used.push_back("top_p " + show(*top_p));
    }
    if (min_p && !given.min_p) {
        sp.min_p = *min_p;
        used.push_back("min_p " + show(*min_p));
    }
    if (repetition_penalty && !given.repeat_penalty) {
        sp.repeat_penalty = *repetition_penalty;
        used.push_back("repetition_penalty " + show(*repetition_penalty));
    }
    return used;
}

GenerationDefaults parse_generation_defaults(std::string_view json_text, const std::string& where) {
    Json j;
    try {
        j = Json::parse(json_text);
    } catch (const Json::parse_error& e) {
        fail("{}: not valid JSON: {}", where, e.what());
    }
    if (!j.is_object()) fail("{}: the top level must be a JSON object", where);
    GenerationDefaults g;
    g.origin = where;
    const double inf = std::numeric_limits<double>::infinity();
    g.temperature = number(j, "temperature", where, 0.0, inf, false, ">= 0");
    g.top_p = number(j, "top_p", where, 0.0, 1.0, true, "in (0, 1]");
    g.min_p = number(j, "min_p", where, 0.0, 1.0, false, "in [0, 1]");
    g.repetition_penalty = number(j, "repetition_penalty", where, 0.0, inf, true, "> 0");
    if (const Json* v = value(j, "top_k")) {
        const bool integral = v->is_number_integer() ||
                              (v->is_number_float() && std::isfinite(v->get<double>()) &&
                               v->get<double>() == std::floor(v->get<double>()));
        if (!integral || v->get<double>() < 0 || v->get<double>() > std::numeric_limits<int32_t>::max())
            fail("{}: key 'top_k' must be an integer >= 0, got {}", where, v->dump());
        g.top_k = static_cast<int>(v->get<double>());
    }
    if (const Json* v = value(j, "do_sample")) {
        if (!v->is_boolean()) fail("{}: key 'do_sample' must be true or false, got {}", where, v->dump());
        g.greedy = !v->get<bool>();
    }
    return g;
}

GenerationDefaults load_generation_defaults(const std::string& dir) {
    const std::filesystem::path p = std::filesystem::path(dir) / "generation_config.json";
    std::error_code ec;
    if (!std::filesystem::exists(p, ec)) return {};
    std::ifstream in(p, std::ios::binary);
    if (!in) fail("cannot read {}", p.string());
    std::ostringstream s;
    s << in.rdbuf();
    return parse_generation_defaults(s.str(), p.string());
}

}  // namespace quern
