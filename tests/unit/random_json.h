// Random JSON documents for the grammar and token-mask tests: nulls,
// booleans, integers, doubles across exponents, strings with quotes,
// backslashes, controls and multi-byte characters, arrays and objects nested
// up to `max_depth` (deeper levels hold scalars only).
#pragma once
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

namespace quern::test {

inline nlohmann::json random_json(std::mt19937& rng, int max_depth, int depth = 0) {
    std::uniform_int_distribution<int> kind(0, depth > max_depth ? 4 : 6);
    switch (kind(rng)) {
        case 0: return nullptr;
        case 1: return rng() % 2 == 0;
        case 2: return static_cast<int64_t>(rng()) - (1ll << 31);
        case 3: return std::ldexp(static_cast<double>(rng() % 100000) - 50000, static_cast<int>(rng() % 40) - 20);
        case 4: {
            std::string s;
            const char* pool[] = {"a", "Zq", " the", "\"", "\\", "\n", "\t", "é", "你好", "\x01", "/", "🦙", "42", "}"};
            for (int n = static_cast<int>(rng() % 8); n > 0; --n) s += pool[rng() % 14];
            return s;
        }
        case 5: {
            nlohmann::json a = nlohmann::json::array();
            for (int n = static_cast<int>(rng() % 4); n > 0; --n) a.push_back(random_json(rng, max_depth, depth + 1));
            return a;
        }
        default: {
            nlohmann::json o = nlohmann::json::object();
            for (int n = static_cast<int>(rng() % 4); n > 0; --n)
                o["k" + std::to_string(rng() % 10)] = random_json(rng, max_depth, depth + 1);
            return o;
        }
    }
}

}  // namespace quern::test
