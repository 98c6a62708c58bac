// End-to-end test of `quern serve` with the official `openai` Python client:
// runs tests/python/server_e2e.py against the built quern and the default
// model (see the script for the checks: chat and completions, streaming,
// UTF-8, stop strings, usage chunks, every error status, 16 concurrent
// requests against the same run alone, robustness, disconnects, prefix
// cache). Skipped without the default model or the `openai` package
// (tools/install-deps.sh installs it), except under CI=true.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "../model/test_util.h"

TEST(ServerE2E, OpenAIClientAgainstQuernServe) {
    if (!quern::test::have_default_model()) GTEST_SKIP() << "default model missing (bash tools/fetch-model.sh)";
    if (std::system("python3 -c 'import openai' >/dev/null 2>&1") != 0) {
        if (std::getenv("CI")) FAIL() << "python3 lacks the openai package in CI (bash tools/install-deps.sh)";
        GTEST_SKIP() << "python3 lacks the openai package (bash tools/install-deps.sh)";
    }
    const std::string quern = std::string(QUERN_BINARY_DIR) + "/quern";
    ASSERT_TRUE(std::filesystem::exists(quern)) << quern << " is not built (cmake --build BUILD --target quern)";
    const std::string cmd = "python3 '" + std::string(QUERN_SOURCE_DIR) + "/tests/python/server_e2e.py' --quern '" +
                            quern + "' --model '" + quern::test::default_model_path() + "'";
    const auto [status, out] = quern::test::run_command(cmd);
    EXPECT_EQ(status, 0) << "server_e2e.py failed:\n" << out;
    EXPECT_NE(out.find("server_e2e: all passed"), std::string::npos) << out;
}
