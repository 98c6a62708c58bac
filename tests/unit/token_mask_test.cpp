// Token masks (grammar/token_matcher.h, chain_mask.h) against the scalar
// reference: a token is allowed exactly when advancing a copy of the state
// over its bytes succeeds (end-of-generation: when the state accepts). Checked
// at every step of fresh random JSON documents, of JSON-schema documents and
// of a GBNF grammar with multi-byte classes and nullable rules, on GPT-2's
// byte-level vocabulary (whose tokens split UTF-8 characters).
#include <gtest/gtest.h>

#include "random_json.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "grammar/chain_mask.h"
#include "grammar/json_schema.h"
#include "grammar/token_matcher.h"
#include "tokenizer/tokenizer.h"

using namespace quern;
using namespace quern::grammar;

namespace {

struct Vocab {
    std::unique_ptr<Tokenizer> tok = Tokenizer::from_file(std::string(QUERN_TESTDATA_DIR) + "/vocab/ggml-vocab-gpt-2.gguf");
    std::vector<std::string> piece;  // by id
    Vocab() {
        for (int32_t id = 0; id < tok->n_vocab(); ++id) piece.push_back(tok->token_to_piece(id, false));
    }
};

const Vocab& vocab() {
    static const Vocab v;
    return v;
}

/// Runs `doc` through a matcher of `g`, comparing every `every`-th step's
/// mask with the reference; returns the number of steps compared.
int check_document(const std::shared_ptr<const Grammar>& g, const std::shared_ptr<const TokenPieces>& pieces,
                   const std::string& doc, int every, const std::string& what) {
    const Vocab& v = vocab();
    const std::vector<int32_t> ids = v.tok->encode(doc, false, false);
    TokenMatcher m(g, pieces);
    GrammarState ref(g);
    std::vector<float> logits(static_cast<size_t>(v.tok->n_vocab()));
    int compared = 0;
    for (size_t i = 0; i <= ids.size(); ++i) {
        if (i % static_cast<size_t>(every) == 0 || i == ids.size()) {
            std::fill(logits.begin(), logits.end(), 1.0f);
            const int64_t n = m.mask(logits.data());
            int64_t want_n = 0, wrong = 0;
            for (int32_t id = 0; id < v.tok->n_vocab(); ++id) {
                bool want;
                if (v.tok->is_eog(id)) {
                    want = ref.accepting();
                } else {
                    GrammarState s = ref;
                    want = !v.piece[static_cast<size_t>(id)].empty() && s.advance_bytes(v.piece[static_cast<size_t>(id)]);
                }
                want_n += want;
                const bool got = !std::isinf(logits[static_cast<size_t>(id)]);
                if (got != want && ++wrong <= 3)
                    ADD_FAILURE() << what << " step " << i << ": token " << id << " '" << v.piece[static_cast<size_t>(id)]
                                  << "' mask " << got << " reference " << want;
                if (got) EXPECT_EQ(logits[static_cast<size_t>(id)], 1.0f);  // allowed logits untouched
            }
            EXPECT_EQ(n, want_n) << what << " step " << i;
            if (wrong) return compared;
            ++compared;
        }
        if (i == ids.size()) break;
        EXPECT_TRUE(m.accept(ids[i])) << what << " step " << i;
        EXPECT_TRUE(ref.advance_bytes(v.piece[static_cast<size_t>(ids[i])])) << what << " step " << i;
    }
    EXPECT_TRUE(m.accepting()) << what;
    return compared;
}

TEST(TokenMask, EqualsTheReferenceOnRandomJson) {
    const auto pieces = TokenPieces::of(*vocab().tok);
    const auto g = Grammar::json(false);
    const unsigned seed = std::random_device{}();
    std::mt19937 rng(seed);
    int compared = 0;
    for (int doc = 0; doc < 6; ++doc) {
        const nlohmann::json v = quern::test::random_json(rng, 2);
        compared += check_document(g, pieces, v.dump(doc % 2 ? 2 : -1), 3, "seed " + std::to_string(seed) + " " + v.dump());
    }
    EXPECT_GT(compared, 10);
}

TEST(TokenMask, EqualsTheReferenceOnSchemas) {
    const auto pieces = TokenPieces::of(*vocab().tok);
    const auto schema = nlohmann::ordered_json::parse(R"({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "kind": {"enum": ["cat", "dog", 3, null]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "owner": {"type": "object", "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}},
                      "required": ["id"]},
            "score": {"anyOf": [{"type": "number"}, {"type": "null"}]}
        },
        "required": ["name", "kind", "tags", "owner"]
    })");
    const auto g = json_schema_grammar(schema);
    check_document(g, pieces, R"({"name": "Ada \"the\" first", "kind": "dog", "tags": ["x", "你好"], "owner": {"id": -12, "ok": true}, "score": 1.5e3})", 1, "schema 1");
    // A second schema sharing the JSON rules, on the same caches.
    const auto g2 = json_schema_grammar(nlohmann::ordered_json::parse(
        R"({"type":"array","items":{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}})"));
    check_document(g2, pieces, R"([{"q": "what?"}, {"q": "\\u00e9 and \n"}])", 1, "schema 2");
}

TEST(TokenMask, EqualsTheReferenceOnMultibyteAndNullableRules) {
    const auto pieces = TokenPieces::of(*vocab().tok);
    const auto g = Grammar::parse(R"G(
        root  ::= item ( sep item )* tail?
        item  ::= word | han+ | "(" root ")"
        word  ::= [a-z]{1,7} opt opt
        opt   ::= ( "-" [0-9]{1,3} )?
        han   ::= [\u4e00-\u9fff] | "🦙"
        sep   ::= ", " | " " | ""
        tail  ::= "!" | "?!"
    )G");
    check_document(g, pieces, "hello-1 你好世界, (world 🦙🦙 abc-2-345) x?!", 2, "gbnf");
}

// A walk that forgets its states every few steps finds the same masks.
TEST(TokenMask, WalkWithFewStatesIsTheSame) {
    const auto pieces = TokenPieces::of(*vocab().tok);
    const auto g = Grammar::json(true);
    GrammarState s(g);
    for (const char* text : {"", "{\"a", "{\"a\": [1, tr", "{\"a\": {\"b\": \"x y"}) {
        GrammarState t = s;
        ASSERT_TRUE(t.advance_bytes(text)) << text;
        for (size_t i = 0; i < t.stack_count(); ++i) {
            const int k = std::min(3, t.depth(i));
            if (k == 0) continue;
            const GrammarState c = t.chain(i, k);
            const ChainMask big = walk_tokens(c, pieces->tokens, true);
            const ChainMask tiny = walk_tokens(c, pieces->tokens, true, 2);
            EXPECT_EQ(big.accepted, tiny.accepted) << text;
            ASSERT_EQ(big.leaving.size(), tiny.leaving.size()) << text;
            for (size_t j = 0; j < big.leaving.size(); ++j) {
                EXPECT_EQ(big.leaving[j].id, tiny.leaving[j].id);
                EXPECT_EQ(big.leaving[j].at, tiny.leaving[j].at);
            }
        }
    }
}

}  // namespace
