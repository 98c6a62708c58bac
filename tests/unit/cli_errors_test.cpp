// The quern binary's answers to command lines a user gets wrong: a known
// command missing its argument is not reported as an unknown command; a
// context whose KV cache cannot fit in memory is refused, naming the flag.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

#include "runtime/memory.h"

namespace {

namespace fs = std::filesystem;

struct Result {
    int rc;
    std::string err;
};

Result run(const std::string& args) {
    const std::string quern = std::string(QUERN_BINARY_DIR) + "/quern";
    const fs::path err = fs::temp_directory_path() / ("quern_cli_err_" + std::to_string(::getpid()) + ".txt");
    const int rc = std::system(("'" + quern + "' " + args + " >/dev/null 2>'" + err.string() + "'").c_str());
    std::ifstream f(err);
    std::stringstream ss;
    ss << f.rdbuf();
    fs::remove(err);
    return {rc, ss.str()};
}

bool have_quern() { return fs::exists(std::string(QUERN_BINARY_DIR) + "/quern"); }

TEST(CliErrors, MissingArgumentOfAKnownCommand) {
    if (!have_quern()) GTEST_SKIP() << "quern is not built";
    for (const char* cmd : {"inspect", "inspect --json", "perplexity -c 64"}) {
        const Result r = run(cmd);
        EXPECT_NE(r.rc, 0) << cmd;
        EXPECT_EQ(r.err.find("unknown command"), std::string::npos) << cmd << ": " << r.err;
        EXPECT_NE(r.err.find("is required"), std::string::npos) << cmd << ": " << r.err;
    }
    const Result r = run("frobnicate");
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(r.err.find("unknown command 'frobnicate'"), std::string::npos) << r.err;
}

// The check behind -c / --kv-tokens (make_cpu_session, the serving engine).
TEST(CliErrors, KvCacheLargerThanMemoryIsRefused) {
    if (quern::available_memory_bytes() == 0) GTEST_SKIP() << "available memory unknown here";
    try {
        // 32 layers x 1024 floats x 2 x 4 bytes = 256 KiB per position: 2^30 positions need 256 TiB.
        quern::check_kv_cache_fits(int64_t{1} << 30, 32, 1024, 4, "-c");
        FAIL() << "no error";
    } catch (const std::exception& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("KV cache for 1073741824 tokens needs 262144.00 GiB"), std::string::npos) << m;
        EXPECT_NE(m.find("lower -c"), std::string::npos) << m;
    }
    EXPECT_NO_THROW(quern::check_kv_cache_fits(1024, 32, 1024, 4, "-c"));  // 256 MiB
}

}  // namespace
