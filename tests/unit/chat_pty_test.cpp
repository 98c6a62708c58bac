// `quern chat` in a pseudo-terminal: runs tests/python/chat_pty.py (see it
// for the checks: /help, the up arrow, Ctrl-C during a reply and twice at
// the prompt, /save and /load) with the default model. Skipped without it.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

#include "../model/test_util.h"

TEST(ChatPty, LineEditingCtrlCAndCommands) {
    if (!quern::test::have_default_model()) GTEST_SKIP() << "default model missing (bash tools/fetch-model.sh)";
    const std::string quern = std::string(QUERN_BINARY_DIR) + "/quern";
    ASSERT_TRUE(std::filesystem::exists(quern)) << quern << " is not built";
    const std::string cmd = "python3 '" + std::string(QUERN_SOURCE_DIR) + "/tests/python/chat_pty.py' --quern '" + quern +
                            "' --model '" + quern::test::default_model_path() + "' 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr) << cmd;
    std::string out;
    std::array<char, 4096> buf;
    for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;) out.append(buf.data(), n);
    const int status = pclose(p);
    std::fputs(out.c_str(), stdout);
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("chat_pty: all passed"), std::string::npos) << out;
}
