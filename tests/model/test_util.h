// Shared helpers for model tests.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace quern::test {

/// Path of the default model in $QUERN_HOME (default ~/.cache/quern).
inline std::string default_model_path() {
    const char* qh = std::getenv("QUERN_HOME");
    std::string home = qh && *qh ? qh : std::string(std::getenv("HOME") ? std::getenv("HOME") : ".") + "/.cache/quern";
    return home + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

/// True when the default model is present; in CI (CI=true) its absence is a failure,
/// elsewhere the calling test should skip.
inline bool have_default_model() {
    if (std::filesystem::exists(default_model_path())) return true;
    if (std::getenv("CI")) ADD_FAILURE() << "default model missing in CI: " << default_model_path();
    return false;
}

}  // namespace quern::test
