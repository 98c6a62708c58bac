// The web chat page end to end: runs tests/python/webui_e2e.py, which drives
// the page `quern serve` answers at / in headless Chromium (Selenium with
// Debian's chromium-driver): it loads with its libraries and no console error,
// a streamed reply equals the API's answer to the same request, Stop ends a
// reply and frees the request, conversations survive a reload, markdown and
// code render while model-written HTML stays text, and --no-webui turns the
// page off. Skipped without the default model, Chromium or Selenium
// (tools/install-deps.sh installs them), except under CI=true.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "../model/test_util.h"

TEST(WebUiE2E, PageChatsStopsAndKeepsConversations) {
    if (!quern::test::have_default_model()) GTEST_SKIP() << "default model missing (bash tools/fetch-model.sh)";
    const bool have = std::filesystem::exists("/usr/bin/chromium") && std::filesystem::exists("/usr/bin/chromedriver") &&
                      std::system("python3 -c 'import selenium, openai' >/dev/null 2>&1") == 0;
    if (!have) {
        if (std::getenv("CI")) FAIL() << "chromium, chromium-driver or selenium missing in CI (bash tools/install-deps.sh)";
        GTEST_SKIP() << "chromium, chromium-driver or selenium missing (bash tools/install-deps.sh)";
    }
    const std::string quern = std::string(QUERN_BINARY_DIR) + "/quern";
    ASSERT_TRUE(std::filesystem::exists(quern)) << quern << " is not built (cmake --build BUILD --target quern)";
    const std::string cmd = "python3 '" + std::string(QUERN_SOURCE_DIR) + "/tests/python/webui_e2e.py' --quern '" +
                            quern + "' --model '" + quern::test::default_model_path() + "'";
    const auto [status, out] = quern::test::run_command(cmd);
    EXPECT_EQ(status, 0) << "webui_e2e.py failed:\n" << out;
    EXPECT_NE(out.find("webui_e2e: all passed"), std::string::npos) << out;
}
