// Tool calls end to end with the official `openai` Python client against
// `quern serve` and a real tool-calling model: runs tests/python/tools_e2e.py
// (see it for the checks) with Qwen2.5-Coder-0.5B-Instruct, which
// tools/fetch-tool-model.sh installs (tools/test.sh runs it). Skipped without
// the model or the `openai` package, except under CI=true.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "../model/test_util.h"

namespace {

std::string tool_model_path() {
    const char* home = std::getenv("QUERN_HOME");
    const std::string dir = home && *home ? std::string(home) : std::string(std::getenv("HOME") ? std::getenv("HOME") : ".") + "/.cache/quern";
    return dir + "/models/qwen2.5-coder-0.5b-instruct.gguf";
}

}  // namespace

TEST(ToolsE2E, OpenAIClientGetsToolCalls) {
    const std::string model = tool_model_path();
    const bool ci = std::getenv("CI") != nullptr;
    if (!std::filesystem::exists(model)) {
        if (ci) FAIL() << model << " is missing in CI (bash tools/fetch-tool-model.sh)";
        GTEST_SKIP() << "tool-calling model missing (bash tools/fetch-tool-model.sh)";
    }
    if (std::system("python3 -c 'import openai' >/dev/null 2>&1") != 0) {
        if (ci) FAIL() << "python3 lacks the openai package in CI (bash tools/install-deps.sh)";
        GTEST_SKIP() << "python3 lacks the openai package (bash tools/install-deps.sh)";
    }
    const std::string quern = std::string(QUERN_BINARY_DIR) + "/quern";
    ASSERT_TRUE(std::filesystem::exists(quern)) << quern << " is not built";
    const std::string cmd = "python3 '" + std::string(QUERN_SOURCE_DIR) + "/tests/python/tools_e2e.py' --quern '" +
                            quern + "' --model '" + model + "'";
    const auto [status, out] = quern::test::run_command(cmd);
    EXPECT_EQ(status, 0) << "tools_e2e.py failed:\n" << out;
    EXPECT_NE(out.find("tools_e2e: all passed"), std::string::npos) << out;
}
