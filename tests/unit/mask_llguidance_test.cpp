// Token masks against an independent engine: llguidance (PyPI), given the
// same GBNF grammars, the same vocabulary (GPT-2's byte-level tokens and
// Llama's SentencePiece pieces, both splitting UTF-8 characters) and the same documents, must allow exactly the same
// tokens at every step. This test writes quern's masks; tests/python/
// mask_diff.py replays them through llguidance and compares. Fresh random JSON
// documents each run (the seed is printed). Skipped without python3's
// llguidance package, except under CI=true.
#include <gtest/gtest.h>

#include "random_json.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <unordered_map>

#include "../model/test_util.h"
#include "grammar/json_schema.h"
#include "grammar/token_matcher.h"
#include "tokenizer/tokenizer.h"

using namespace quern;

namespace {

std::string hex(const std::string& bytes) {
    static const char* d = "0123456789abcdef";
    std::string out;
    for (unsigned char c : bytes) {
        out += d[c >> 4];
        out += d[c & 15];
    }
    return out;
}

}  // namespace

class MaskLlguidance : public ::testing::TestWithParam<const char*> {};

TEST_P(MaskLlguidance, SameMasksAsLlguidance) {
    const bool ci = std::getenv("CI") != nullptr;
    if (std::system("python3 -c 'import llguidance, numpy' >/dev/null 2>&1") != 0) {
        if (ci) FAIL() << "python3 lacks the llguidance package in CI (bash tools/install-deps.sh)";
        GTEST_SKIP() << "python3 lacks the llguidance package (bash tools/install-deps.sh)";
    }
    auto tok = Tokenizer::from_file(std::string(QUERN_TESTDATA_DIR) + "/vocab/" + GetParam());
    const auto pieces = grammar::TokenPieces::of(*tok);
    nlohmann::json out;
    out["tokens"] = nlohmann::json::array();
    out["eog"] = nlohmann::json::array();
    for (int32_t id = 0; id < tok->n_vocab(); ++id) {
        out["tokens"].push_back(hex(tok->is_eog(id) ? std::string() : tok->token_to_piece(id, false)));
        if (tok->is_eog(id)) out["eog"].push_back(id);
    }
    ASSERT_FALSE(out["eog"].empty());

    struct Case {
        std::string name, gbnf, doc;
    };
    std::vector<Case> cases;
    const std::string json_object = "root ::= object\n" + grammar::json_value_rules();
    const unsigned seed = std::random_device{}();
    std::printf("random documents from seed %u\n", seed);
    std::mt19937 rng(seed);
    for (int i = 0; i < 6; ++i) {
        nlohmann::json v = quern::test::random_json(rng, 2, 1);
        if (!v.is_object()) v = nlohmann::json{{"v", v}};
        cases.push_back({"random json " + std::to_string(i), json_object, v.dump(i % 2 ? 2 : -1)});
    }
    const auto schema = nlohmann::ordered_json::parse(R"({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "kind": {"enum": ["cat", "dog", 3, null]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "owner": {"type": "object", "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}},
                      "required": ["id"]}
        },
        "required": ["name", "kind", "tags", "owner"]
    })");
    cases.push_back({"schema", grammar::json_schema_to_gbnf(schema),
                     R"({"name": "Ada \"the\" first", "kind": "dog", "tags": ["x", "你好"], "owner": {"id": -12, "ok": true}})"});
    cases.push_back({"gbnf", R"G(
root  ::= item ( sep item )* tail?
item  ::= word | han+ | "(" root ")"
word  ::= [a-z]{1,6} opt
opt   ::= ( "-" [0-9]{1,2} )?
han   ::= [\u4e00-\u9fff] | "🦙"
sep   ::= ", " | " "
tail  ::= "!" | "?!"
)G",
                     "hello-12 你好世界, (world 🦙🦙 abc-2) x?!"});

    // Documents as the longest pieces at each point (any split is one a model
    // may produce; the tokenizer's own would add SentencePiece's leading space).
    std::unordered_map<std::string, int32_t> by_text;
    size_t longest = 0;
    for (int32_t id = 0; id < tok->n_vocab(); ++id) {
        const std::string t = tok->is_eog(id) ? std::string() : tok->token_to_piece(id, false);
        if (!t.empty() && !by_text.count(t)) by_text[t] = id;
        longest = std::max(longest, t.size());
    }
    const auto greedy = [&](const std::string& text) {
        std::vector<int32_t> ids;
        for (size_t i = 0; i < text.size();) {
            size_t n = std::min(longest, text.size() - i);
            for (; n > 0; --n) {
                const auto it = by_text.find(text.substr(i, n));
                if (it == by_text.end()) continue;
                ids.push_back(it->second);
                break;
            }
            if (n == 0) throw std::runtime_error("no token for byte " + std::to_string(static_cast<uint8_t>(text[i])));
            i += n;
        }
        return ids;
    };
    std::vector<float> logits(static_cast<size_t>(tok->n_vocab()));
    out["cases"] = nlohmann::json::array();
    for (const Case& c : cases) {
        grammar::TokenMatcher m(grammar::Grammar::parse(c.gbnf), pieces);
        const std::vector<int32_t> ids = greedy(c.doc);
        nlohmann::json masks = nlohmann::json::array();
        for (size_t i = 0; i <= ids.size(); ++i) {
            std::fill(logits.begin(), logits.end(), 0.0f);
            m.mask(logits.data());
            std::string bits((static_cast<size_t>(tok->n_vocab()) + 7) / 8, '\0');
            for (int32_t id = 0; id < tok->n_vocab(); ++id)
                if (!std::isinf(logits[static_cast<size_t>(id)])) bits[static_cast<size_t>(id) / 8] |= static_cast<char>(1 << (id % 8));
            masks.push_back(hex(bits));
            if (i < ids.size()) ASSERT_TRUE(m.accept(ids[i])) << c.name << " step " << i;
        }
        ASSERT_TRUE(m.accepting()) << c.name;
        out["cases"].push_back({{"name", c.name}, {"gbnf", c.gbnf}, {"ids", ids}, {"masks", masks}});
    }
    const std::string path = (std::filesystem::temp_directory_path() / ("quern-masks-" + std::to_string(seed) + ".json")).string();
    std::ofstream(path) << out.dump();
    const std::string cmd = "python3 '" + std::string(QUERN_SOURCE_DIR) + "/tests/python/mask_diff.py' '" + path + "'";
    const auto [status, log] = quern::test::run_command(cmd);
    EXPECT_EQ(status, 0) << "masks differ from llguidance's (seed " << seed << "):\n" << log;
    if (status == 0) std::filesystem::remove(path);
}

// GPT-2: byte-level BPE; Llama's SentencePiece: pieces with byte fallback.
INSTANTIATE_TEST_SUITE_P(Vocabularies, MaskLlguidance,
                         ::testing::Values("ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-spm.gguf"),
                         [](const auto& info) { return std::string(info.index == 0 ? "gpt2" : "llama_spm"); });
