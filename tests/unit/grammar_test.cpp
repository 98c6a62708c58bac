// GBNF grammars (grammar/grammar.h): parsing, errors that name the problem,
// recognition a code point and a byte at a time, and the built-in JSON
// grammar on random documents (accepted, compact or indented) and on broken
// ones (refused at the first wrong character).
#include <gtest/gtest.h>

#include "random_json.h"

#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "grammar/grammar.h"

using namespace quern;
using namespace quern::grammar;

namespace {

/// Whether `text` is a whole sentence of `g` (fed in pieces of `piece` bytes).
bool accepts(const std::shared_ptr<const Grammar>& g, const std::string& text, size_t piece = 1000) {
    GrammarState s(g);
    for (size_t i = 0; i < text.size(); i += piece)
        if (!s.advance_bytes(std::string_view(text).substr(i, piece))) return false;
    return s.accepting();
}

std::string error_of(const std::string& text) {
    try {
        Grammar::parse(text);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(Grammar, ParsesAndRecognises) {
    const auto g = Grammar::parse(R"(
        # a greeting, then digits
        root  ::= greet " " num ( "," num )* "!"?
        greet ::= "hi" | "héllo"
        num   ::= [1-9] [0-9]* | "0"
    )");
    for (const char* ok : {"hi 1", "héllo 10,0,23!", "hi 0!"}) EXPECT_TRUE(accepts(g, ok)) << ok;
    for (const char* bad : {"hi", "hi 01", "hey 1", "hi 1,", "hi 1!!", ""}) EXPECT_FALSE(accepts(g, bad)) << bad;
    // byte by byte, a multi-byte character split
    EXPECT_TRUE(accepts(g, "héllo 7", 1));
    GrammarState s(g);
    EXPECT_TRUE(s.advance_bytes("hi 1"));
    EXPECT_TRUE(s.accepting());
    EXPECT_TRUE(s.can_continue());
    EXPECT_FALSE(s.advance_bytes("x"));  // refused: the state stays
    EXPECT_TRUE(s.advance_bytes("!"));
    EXPECT_TRUE(s.accepting());
    EXPECT_FALSE(s.can_continue());
}

TEST(Grammar, ClassesEscapesAndNegation) {
    const auto g = Grammar::parse(R"(root ::= "\"" [^"\\\n]* "\"" [\x41-\x43] [\u00e9])");
    EXPECT_TRUE(accepts(g, "\"a b\"Bé"));
    EXPECT_FALSE(accepts(g, "\"a\nb\"Bé"));
    EXPECT_FALSE(accepts(g, "\"ab\"Dé"));
    // an incomplete UTF-8 sequence is kept only if some character it may
    // begin is allowed next (a token can end mid-character)
    GrammarState s(Grammar::parse(R"(root ::= "a" [\u4e00-\u4eff])"));
    EXPECT_FALSE(s.advance_bytes("\xE4"));  // no character may start the text but "a"
    GrammarState t = s;
    EXPECT_TRUE(s.advance_bytes("a\xE4"));  // U+4xxx may follow "a"
    EXPECT_TRUE(s.advance_bytes("\xB8"));   // E4 B8 .. : U+4E00-U+4E3F, allowed
    EXPECT_FALSE(s.accepting());
    EXPECT_TRUE(s.advance_bytes("\x80"));   // U+4E00
    EXPECT_TRUE(s.accepting());
    EXPECT_FALSE(t.advance_bytes("a\xE5"));  // U+5xxx may not
    // Only valid UTF-8: no overlong forms (C1 BB would be '{'), surrogates or
    // code points past U+10FFFF, whole or begun.
    const auto brace = Grammar::parse(R"(root ::= "{" [^x]*)");
    for (const char* bad : {"\xC1\xBB", "\xC1", "\xE0\x81\xBB", "\xE0\x80", "\xF0\x80\x81\xBB", "\xF0\x80"}) {
        GrammarState u(brace);
        EXPECT_FALSE(u.advance_bytes(bad)) << "overlong";
    }
    GrammarState v(brace);
    ASSERT_TRUE(v.advance_bytes("{"));
    EXPECT_FALSE(GrammarState(v).advance_bytes("\xED\xA0\x80"));  // U+D800
    EXPECT_FALSE(GrammarState(v).advance_bytes("\xED\xA0"));       // only surrogates can follow
    EXPECT_TRUE(GrammarState(v).advance_bytes("\xED\x9F"));        // U+D7C0..U+D7FF
    EXPECT_FALSE(GrammarState(v).advance_bytes("\xF4\x90"));       // past U+10FFFF
    EXPECT_TRUE(GrammarState(v).advance_bytes("\xF4\x8F\xBF\xBF"));  // U+10FFFF
}

TEST(Grammar, CountedRepetition) {
    const auto g = Grammar::parse(R"(root ::= [a-c]{2,4} "x"{3} ( "ab" ){1,} "-"{0,1} [0-9]{ 2 , })");
    for (const char* ok : {"abxxxab12", "abcaxxxababab-123", "bbxxxab-00"}) EXPECT_TRUE(accepts(g, ok)) << ok;
    for (const char* bad : {"axxxab12", "abcabxxxab12", "abxxab12", "abxxx12", "abxxxab--12", "abxxxab1"})
        EXPECT_FALSE(accepts(g, bad)) << bad;
    EXPECT_NE(error_of("root ::= \"a\"{3,2}").find("below its minimum"), std::string::npos);
    EXPECT_NE(error_of("root ::= \"a\"{20000}").find("above 10000"), std::string::npos);
    EXPECT_NE(error_of("root ::= \"a\"{2").find("'}'"), std::string::npos);
}

TEST(Grammar, ErrorsNameTheProblem) {
    EXPECT_NE(error_of("root ::= foo").find("'foo' is used but not defined"), std::string::npos);
    EXPECT_NE(error_of("start ::= \"a\"").find("no 'root' rule"), std::string::npos);
    EXPECT_NE(error_of("root ::= root \"a\" | \"b\"").find("left-recursive"), std::string::npos);
    EXPECT_NE(error_of("root ::= x\nx ::= y? x \"a\"\ny ::= \"b\"").find("left-recursive"), std::string::npos);
    EXPECT_NE(error_of("root ::= \"a").find("line 1"), std::string::npos);
    EXPECT_NE(error_of("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
    EXPECT_NE(error_of("root ::= [z-a]").find("range"), std::string::npos);
    // Found by tests/fuzz/fuzz_requests.cpp: a request's grammar of 100,000
    // nested groups overflowed the stack; groups now nest at most 128 deep.
    EXPECT_NE(error_of("root ::= " + std::string(100000, '(') + "\"a\"" + std::string(100000, ')'))
                  .find("nested more than 128 deep"),
              std::string::npos);
    EXPECT_EQ(error_of("root ::= " + std::string(100, '(') + "\"a\"" + std::string(100, ')')), "");
}

TEST(Grammar, JsonAcceptsRandomDocumentsAndRefusesBrokenOnes) {
    const auto any = Grammar::json(false), obj = Grammar::json(true);
    std::mt19937 rng(11);
    for (int i = 0; i < 200; ++i) {
        const nlohmann::json v = quern::test::random_json(rng, 3);
        for (int indent : {-1, 2}) {
            const std::string text = v.dump(indent);
            EXPECT_TRUE(accepts(any, text, 3)) << text;
            EXPECT_EQ(accepts(obj, text), v.is_object()) << text;
        }
    }
    for (const char* bad : {"{\"a\": 1,}", "[1 2]", "01", "\"a\x01\"", "tru", "{a: 1}", "\"\\q\"", "1.", "-",
                            "[1]]", "{\"a\" 1}", "\"unterminated"})
        EXPECT_FALSE(accepts(any, bad)) << bad;
    // bounded whitespace: no endless padding
    EXPECT_FALSE(accepts(any, "[1,                                       2]"));
}

}  // namespace

#include <chrono>

#include "grammar/json_schema.h"
#include "grammar/token_matcher.h"
#include "grammar/warm.h"
#include "tokenizer/tokenizer.h"

namespace {

// Token masks on GPT-2's vocabulary: every token of a JSON document's own
// tokenization is allowed at its step, end-of-text only at the end, and a
// token that breaks the grammar is masked; the mask equals advancing each
// token alone.
TEST(TokenMatcher, MasksFollowTheGrammar) {
    auto tok = Tokenizer::from_file(std::string(QUERN_TESTDATA_DIR) + "/vocab/ggml-vocab-gpt-2.gguf");
    const auto pieces = grammar::TokenPieces::of(*tok);
    const auto g = Grammar::json(true);
    const std::string doc = R"({"name": "Ada", "langs": ["en", "fr"], "age": 36, "ok": true})";
    const std::vector<int32_t> ids = tok->encode(doc, false, false);
    grammar::TokenMatcher m(g, pieces);
    std::vector<float> logits(static_cast<size_t>(tok->n_vocab()));
    double worst_ms = 0;
    for (size_t i = 0; i <= ids.size(); ++i) {
        std::fill(logits.begin(), logits.end(), 0.0f);
        const auto t0 = std::chrono::steady_clock::now();
        const int64_t n = m.mask(logits.data());
        worst_ms = std::max(worst_ms, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        EXPECT_GT(n, 0);
        for (int32_t e : pieces->eog) EXPECT_EQ(std::isinf(logits[static_cast<size_t>(e)]), i < ids.size()) << "step " << i;
        if (i == ids.size()) break;
        EXPECT_FALSE(std::isinf(logits[static_cast<size_t>(ids[i])])) << "step " << i << " token " << ids[i];
        if (i % 5 == 0) {  // the mask agrees with advancing every token alone
            for (int32_t id = 0; id < tok->n_vocab(); id += 97) {
                grammar::TokenMatcher copy = m;
                EXPECT_EQ(copy.accept(id), !std::isinf(logits[static_cast<size_t>(id)]) || tok->is_eog(id))
                    << "step " << i << " token " << id;
            }
        }
        ASSERT_TRUE(m.accept(ids[i]));
    }
    EXPECT_TRUE(m.accepting());
    grammar::TokenMatcher fresh(g, pieces);
    std::fill(logits.begin(), logits.end(), 0.0f);
    fresh.mask(logits.data());
    EXPECT_TRUE(std::isinf(logits[static_cast<size_t>(tok->encode("x", false, false)[0])]));  // an object starts with {
    // The same document again: every state's mask comes from the cache.
    grammar::TokenMatcher again(g, pieces);
    double total_us = 0;
    for (size_t i = 0; i <= ids.size(); ++i) {
        std::vector<float> l2(static_cast<size_t>(tok->n_vocab()), 0.0f);
        const auto t0 = std::chrono::steady_clock::now();
        again.mask(l2.data());
        total_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        std::fill(logits.begin(), logits.end(), 0.0f);
        if (i == ids.size()) break;
        ASSERT_TRUE(again.accept(ids[i]));
    }
    std::printf("mask on a %d-token vocabulary: at most %.1f ms per step; a cached state %.0f us per step\n",
                tok->n_vocab(), worst_ms, total_us / static_cast<double>(ids.size() + 1));
}

// The warm-up walks its sample documents to the end (so it reaches the chains
// it is for), and masks from warmed caches equal those built on demand, step
// by step, for a schema of its own.
TEST(TokenMatcher, WarmedCachesGiveTheSameMasks) {
    auto tok = Tokenizer::from_file(std::string(QUERN_TESTDATA_DIR) + "/vocab/ggml-vocab-gpt-2.gguf");
    const auto warmed = grammar::TokenPieces::of(*tok);
    const grammar::WarmStats st = grammar::warm_json_masks(*tok, warmed);
    EXPECT_EQ(st.documents, 2);
    EXPECT_EQ(st.accepted, st.documents);
    EXPECT_GT(st.steps, 150);
    const auto cold = grammar::TokenPieces::of(*tok);
    const auto g = grammar::json_schema_grammar(nlohmann::ordered_json::parse(
        R"({"type":"object","properties":{"title":{"type":"string","maxLength":20},"year":{"type":"integer"},
            "genres":{"type":"array","items":{"enum":["drama","comedy"]}}},"required":["title","year","genres"]})"));
    const std::vector<int32_t> ids =
        tok->encode(R"({"title":"Rashomon","year":1950,"genres":["drama"]})", false, false);
    grammar::TokenMatcher a(g, warmed), b(g, cold);
    std::vector<float> la(static_cast<size_t>(tok->n_vocab())), lb(la.size());
    for (size_t i = 0; i <= ids.size(); ++i) {
        std::fill(la.begin(), la.end(), 0.0f);
        std::fill(lb.begin(), lb.end(), 0.0f);
        EXPECT_EQ(a.mask(la.data()), b.mask(lb.data())) << "step " << i;
        for (size_t t = 0; t < la.size(); ++t)
            if (std::isinf(la[t]) != std::isinf(lb[t])) {
                ADD_FAILURE() << "step " << i << ": token " << t << " differs";
                break;
            }
        if (i == ids.size()) break;
        ASSERT_TRUE(a.accept(ids[i]));
        ASSERT_TRUE(b.accept(ids[i]));
    }
    EXPECT_TRUE(a.accepting());
}

}  // namespace
