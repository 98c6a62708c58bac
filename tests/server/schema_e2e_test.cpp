// Structured output end to end: runs tests/python/schema_e2e.py — 200 fresh
// random JSON schemas (nesting, enums, required members, patterns, formats,
// lengths, integer bounds) as response_format json_schema against `quern
// serve` with the default model through the official `openai` client; every
// reply must be JSON the schema accepts (checked by the `jsonschema`
// package). Skipped without the default model or the Python packages
// (tools/install-deps.sh installs them), except under CI=true. Under
// AddressSanitizer 40 schemas: the sanitized server takes ~5.5 s a schema
// on a two-core machine (200: ~1,100 s).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "../model/test_util.h"

TEST(SchemaE2E, RandomSchemasGiveValidJson) {
    if (!quern::test::have_default_model()) GTEST_SKIP() << "default model missing (bash tools/fetch-model.sh)";
    if (std::system("python3 -c 'import openai, jsonschema, rfc3339_validator, rfc3986_validator, fqdn' >/dev/null 2>&1") != 0) {
        if (std::getenv("CI")) FAIL() << "python3 lacks openai or jsonschema[format-nongpl] in CI (bash tools/install-deps.sh)";
        GTEST_SKIP() << "python3 lacks openai or jsonschema[format-nongpl] (bash tools/install-deps.sh)";
    }
    const std::string quern = std::string(QUERN_BINARY_DIR) + "/quern";
    ASSERT_TRUE(std::filesystem::exists(quern)) << quern << " is not built (cmake --build BUILD --target quern)";
    const int count = quern::test::kSanitizerBuild ? 40 : 200;
    const std::string cmd = "python3 '" + std::string(QUERN_SOURCE_DIR) + "/tests/python/schema_e2e.py' --quern '" +
                            quern + "' --model '" + quern::test::default_model_path() + "' --count " + std::to_string(count);
    const auto [status, out] = quern::test::run_command(cmd);
    EXPECT_EQ(status, 0) << "schema_e2e.py failed:\n" << out;
    const std::string n = std::to_string(count);
    EXPECT_NE(out.find("schema_e2e: " + n + "/" + n + " valid"), std::string::npos) << out;
}
