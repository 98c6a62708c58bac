// Shared helpers for model tests.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace quern::test {

/// True in a build under AddressSanitizer (tools/sanitize.sh), whose binaries
/// run several times slower: end-to-end tests there run fewer cases and
/// wall-clock bounds get slack, since that job looks for memory errors, not
/// speed.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitizerBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif
#else
inline constexpr bool kSanitizerBuild = false;
#endif

/// Path of the default model in $QUERN_HOME (default ~/.cache/quern).
inline std::string default_model_path() {
    const char* qh = std::getenv("QUERN_HOME");
    std::string home = qh && *qh ? qh : std::string(std::getenv("HOME") ? std::getenv("HOME") : ".") + "/.cache/quern";
    return home + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

/// Runs `cmd` through the shell, stderr joined to stdout, echoing the output
/// to the test log as it comes; returns the exit status (-1 when it cannot
/// start) and the output.
inline std::pair<int, std::string> run_command(const std::string& cmd) {
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    if (!p) return {-1, "cannot run: " + cmd};
    std::string out;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) {
        out.append(buf, n);
        std::fwrite(buf, 1, n, stdout);
        std::fflush(stdout);
    }
    return {pclose(p), out};
}

/// True when the default model is present; in CI (CI=true) its absence is a failure,
/// elsewhere the calling test should skip.
inline bool have_default_model() {
    if (std::filesystem::exists(default_model_path())) return true;
    if (std::getenv("CI")) ADD_FAILURE() << "default model missing in CI: " << default_model_path();
    return false;
}

/// The golden fixtures of the default model (tests/data/golden, made by
/// tools/make_golden.py): prompts, token ids, greedy continuations, and the
/// reference logits as fp16, [position][vocab] per prompt in order.
struct Golden {
    nlohmann::json meta;
    std::vector<uint16_t> logits;
};

inline Golden load_golden() {
    const std::string dir = std::string(QUERN_SOURCE_DIR) + "/tests/data/golden/";
    Golden g;
    std::ifstream jf(dir + "smollm2-135m-q4_1.json");
    g.meta = nlohmann::json::parse(jf);
    std::ifstream lf(dir + g.meta["logits_file"].get<std::string>(), std::ios::binary | std::ios::ate);
    const auto size = static_cast<size_t>(lf.tellg());
    lf.seekg(0);
    g.logits.resize(size / 2);
    lf.read(reinterpret_cast<char*>(g.logits.data()), static_cast<std::streamsize>(size));
    return g;
}

}  // namespace quern::test
