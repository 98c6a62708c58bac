// Differential test of the tokenizer against the Hugging Face `tokenizers`
// package: runs tests/python/tok_diff.py with the built quern binary (10,000
// random strings per family plus 1,000 with invalid UTF-8; every vocabulary in
// ../shared/testdata/vocab, the default model when fetched, and four more
// pre-tokenizer families on the GPT-2 vocabulary), and the NFC normalizer
// alone, byte for byte, on every code point and 10,000 random strings. See the
// script for what is compared. Skipped when python3 lacks `tokenizers` or `gguf`
// (tools/install-deps.sh installs both).
//
// Environment: QUERN_TOK_DIFF_N (strings per family), QUERN_TOK_DIFF_SEED.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace {

bool python_has_tokenizers() {
    return std::system("python3 -c 'import tokenizers, gguf' >/dev/null 2>&1") == 0;
}

}  // namespace

TEST(TokenizerDiff, MatchesHuggingFaceOnRandomText) {
    if (!python_has_tokenizers())
        GTEST_SKIP() << "python3 with the tokenizers and gguf packages is not installed (bash tools/install-deps.sh)";
    const std::string quern = std::string(QUERN_BINARY_DIR) + "/quern";
    ASSERT_TRUE(std::filesystem::exists(quern)) << quern << " is not built (cmake --build BUILD --target quern)";
    std::string cmd = "python3 '" + std::string(QUERN_SOURCE_DIR) + "/tests/python/tok_diff.py' --quern '" + quern +
                      "' --vocab-dir '" + std::string(QUERN_TESTDATA_DIR) + "/vocab'";
    if (const char* n = std::getenv("QUERN_TOK_DIFF_N")) cmd += std::string(" --n ") + std::to_string(std::atoi(n));
    if (const char* s = std::getenv("QUERN_TOK_DIFF_SEED"))
        cmd += std::string(" --seed ") + std::to_string(std::atoll(s));
    cmd += " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr) << cmd;
    std::string out;
    std::array<char, 4096> buf;
    for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;) {
        out.append(buf.data(), n);
        std::fwrite(buf.data(), 1, n, stdout);  // per-family summary lines in the test log
        std::fflush(stdout);
    }
    const int status = pclose(p);
    EXPECT_EQ(status, 0) << "tok_diff.py reported differences or failed:\n" << out;
    EXPECT_NE(out.find("tok_diff: all agree"), std::string::npos) << out;
}
