// `quern chat` in a pseudo-terminal: runs tests/python/chat_pty.py (see it
// for the checks: /help, the up arrow, Ctrl-C during a reply and twice at
// the prompt, /save and /load) with the default model. Skipped without it.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "../model/test_util.h"

TEST(ChatPty, LineEditingCtrlCAndCommands) {
    if (!quern::test::have_default_model()) GTEST_SKIP() << "default model missing (bash tools/fetch-model.sh)";
    const std::string quern = std::string(QUERN_BINARY_DIR) + "/quern";
    ASSERT_TRUE(std::filesystem::exists(quern)) << quern << " is not built";
    const std::string cmd = "python3 '" + std::string(QUERN_SOURCE_DIR) + "/tests/python/chat_pty.py' --quern '" + quern +
                            "' --model '" + quern::test::default_model_path() + "'";
    const auto [status, out] = quern::test::run_command(cmd);
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("chat_pty: all passed"), std::string::npos) << out;
}
