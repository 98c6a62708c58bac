// Checks quern's Jinja engine against Python jinja2 (Hugging Face's settings):
//   1. tools/make_chat_fixtures.py --check: the expected outputs stored in
//      tests/data/chat/ (compared byte for byte by chat_templates_test) are
//      what jinja2 renders today;
//   2. tests/python/jinja_diff.py: random templates over every construct chat
//      templates use render identically (or raise the same error) with both.
// Skipped when python3 lacks jinja2 (bash tools/install-deps.sh installs it).
//
// Environment: QUERN_JINJA_DIFF_N (templates, default 3000), QUERN_JINJA_DIFF_SEED.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace {

bool python_has_jinja2() { return std::system("python3 -c 'import jinja2' >/dev/null 2>&1") == 0; }

// Runs a command, echoing its output; returns {exit status, output}.
std::pair<int, std::string> run(const std::string& cmd) {
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    if (!p) return {-1, "popen failed: " + cmd};
    std::string out;
    std::array<char, 4096> buf;
    for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;) {
        out.append(buf.data(), n);
        std::fwrite(buf.data(), 1, n, stdout);
        std::fflush(stdout);
    }
    return {pclose(p), out};
}

}  // namespace

TEST(JinjaDiff, StoredFixturesAreJinja2s) {
    if (!python_has_jinja2()) GTEST_SKIP() << "python3 with jinja2 is not installed (bash tools/install-deps.sh)";
    const auto [status, out] = run("python3 '" + std::string(QUERN_SOURCE_DIR) + "/tools/make_chat_fixtures.py' --check");
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("all fixtures match jinja2"), std::string::npos) << out;
}

TEST(JinjaDiff, RandomTemplatesRenderLikeJinja2) {
    if (!python_has_jinja2()) GTEST_SKIP() << "python3 with jinja2 is not installed (bash tools/install-deps.sh)";
    const std::string quern = std::string(QUERN_BINARY_DIR) + "/quern";
    ASSERT_TRUE(std::filesystem::exists(quern)) << quern << " is not built (cmake --build BUILD --target quern)";
    std::string cmd = "python3 '" + std::string(QUERN_SOURCE_DIR) + "/tests/python/jinja_diff.py' --quern '" + quern + "'";
    const char* n = std::getenv("QUERN_JINJA_DIFF_N");
    cmd += " --n " + std::to_string(n ? std::atoi(n) : 3000);
    if (const char* s = std::getenv("QUERN_JINJA_DIFF_SEED")) cmd += " --seed " + std::to_string(std::atoll(s));
    const auto [status, out] = run(cmd);
    EXPECT_EQ(status, 0) << "jinja_diff.py found differences:\n" << out;
    EXPECT_NE(out.find("jinja_diff: all agree"), std::string::npos) << out;
}
