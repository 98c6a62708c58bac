// Tokenizer pipeline tests: tokenizer.json loading (every pre-tokenizer step
// and split behaviour, added-token flags, normalizers, Metaspace schemes,
// byte fallback) against ids from the Hugging Face `tokenizers` package; the
// hand-written regex matchers against PCRE2; the streaming detokenizer on
// random splits; malformed tokenizer.json files.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/fast_regex.h"
#include "tokenizer/patterns.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

using namespace quern;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kVocabDir = std::string(QUERN_TESTDATA_DIR) + "/vocab";
const std::string kSpace = "\xE2\x96\x81";  // "▁"

// ---------------------------------------------------------------- tiny tokenizer.json files
// The same files tests/python made the expected ids from (tokenizers 0.23.3).

json added(int id, const std::string& content, bool special, bool lstrip = false, bool rstrip = false,
           bool single_word = false) {
    return {{"id", id},         {"content", content},         {"special", special},    {"lstrip", lstrip},
            {"rstrip", rstrip}, {"single_word", single_word}, {"normalized", false}};
}

json byte_level(bool add_prefix_space, bool use_regex) {
    return {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"trim_offsets", true},
            {"use_regex", use_regex}};
}

json split(const std::string& pattern, const std::string& behavior, bool invert = false, bool string = false) {
    return {{"type", "Split"},
            {"pattern", {{string ? "String" : "Regex", pattern}}},
            {"behavior", behavior},
            {"invert", invert}};
}

json sequence(std::vector<json> steps) { return {{"type", "Sequence"}, {"pretokenizers", steps}}; }

// Byte-level BPE: the 256 byte characters (id = byte), "Ġt" "he" "Ġthe" "ab" "12".
json byte_level_json(const json& pre, const json& added_tokens = json::array(), bool ignore_merges = false,
                     const json& normalizer = nullptr) {
    const auto& bm = unicode::ByteMap::get();
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) vocab[std::string(bm.byte_to_utf8(static_cast<uint8_t>(b)))] = b;
    const std::vector<std::string> extra = {"\xC4\xA0t", "he", "\xC4\xA0the", "ab", "12"};
    for (size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 256 + static_cast<int>(i);
    return {{"version", "1.0"},
            {"added_tokens", added_tokens},
            {"normalizer", normalizer},
            {"pre_tokenizer", pre},
            {"post_processor", nullptr},
            {"decoder", byte_level(true, true)},
            {"model",
             {{"type", "BPE"},
              {"vocab", vocab},
              {"merges", {"\xC4\xA0 t", "h e", "\xC4\xA0t he", "a b", "1 2"}},
              {"ignore_merges", ignore_merges},
              {"unk_token", nullptr}}}};
}

// SentencePiece-style: <unk> <s> </s>, <0x00>..<0xFF>, then ▁ a b c ▁a ab ▁ab h i hi ▁hi.
json spm_json(const json& pre, const json& normalizer, const json& decoder) {
    json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
    for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        vocab[name] = 3 + b;
    }
    int next = 259;
    for (const std::string t : {kSpace, std::string("a"), std::string("b"), std::string("c"), kSpace + "a",
                                std::string("ab"), kSpace + "ab", std::string("h"), std::string("i"),
                                std::string("hi"), kSpace + "hi"})
        vocab[t] = next++;
    return {{"version", "1.0"},
            {"added_tokens", {added(0, "<unk>", true), added(1, "<s>", true), added(2, "</s>", true)}},
            {"normalizer", normalizer},
            {"pre_tokenizer", pre},
            {"post_processor", nullptr},
            {"decoder", decoder},
            {"model",
             {{"type", "BPE"},
              {"vocab", vocab},
              // Pairs (json::array: a list of string pairs would read as an object).
              {"merges", json::array({json::array({kSpace, "a"}), json::array({"a", "b"}),
                                      json::array({kSpace + "a", "b"}), json::array({"h", "i"}),
                                      json::array({kSpace, "hi"})})},
              {"byte_fallback", true},
              {"fuse_unk", true},
              {"unk_token", "<unk>"}}}};
}

json make_case(const std::string& name) {
    for (const char* b : {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"})
        for (bool inv : {false, true})
            if (name == std::string("split_") + b + (inv ? "_True" : "_False"))
                return byte_level_json(sequence({split("[,; ]", b, inv), byte_level(false, false)}));
    if (name == "split_string")
        return byte_level_json(sequence({split(" ", "MergedWithNext", false, true), byte_level(false, false)}));
    if (name == "bytelevel_prefix") return byte_level_json(byte_level(true, true));
    if (name == "digits_punct")
        return byte_level_json(sequence({{{"type", "Digits"}, {"individual_digits", false}},
                                         {{"type", "Punctuation"}, {"behavior", "Isolated"}},
                                         byte_level(false, true)}));
    if (name == "added")
        return byte_level_json(byte_level(false, true),
                               {added(261, "<s>", true), added(262, "<mask>", true, true),
                                added(263, "[x]", false, false, true), added(264, "foo", false, false, false, true)});
    if (name == "ignore_merges")
        return byte_level_json(sequence({split(R"(\s+|\S+)", "Isolated"), byte_level(false, false)}), json::array(),
                               true);
    if (name == "strip_norm")
        return byte_level_json(
            byte_level(false, true), json::array(), false,
            {{"type", "Sequence"},
             {"normalizers",
              {{{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
               {{"type", "Replace"}, {"pattern", {{"Regex", "a+"}}}, {"content", "b"}}}}});
    if (name == "spm_legacy")
        return spm_json(nullptr,
                        {{"type", "Sequence"},
                         {"normalizers",
                          {{{"type", "Prepend"}, {"prepend", kSpace}},
                           {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}}}}},
                        {{"type", "Sequence"},
                         {"decoders",
                          {{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                           {{"type", "ByteFallback"}},
                           {{"type", "Fuse"}},
                           {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}});
    for (const char* scheme : {"always", "first", "never"})
        for (bool sp : {true, false})
            if (name == std::string("metaspace_") + scheme + (sp ? "_True" : "_False")) {
                const json m = {{"type", "Metaspace"}, {"replacement", kSpace}, {"prepend_scheme", scheme}, {"split", sp}};
                return spm_json(m, nullptr, m);
            }
    ADD_FAILURE() << "no case " << name;
    return {};
}

struct HfCase {
    const char* name;
    std::vector<std::pair<std::string, std::vector<int32_t>>> cases;
};

// Expected ids: tokenizers 0.23.3, encode(text, add_special_tokens=False).
const std::vector<HfCase> kHfCases = {
    {"split_Isolated_False", {{"the the", {116, 257, 32, 116, 257}}, {"abab  12 x", {259, 259, 32, 32, 260, 32, 120}}, {"a,b;;c d", {97, 44, 98, 59, 59, 99, 32, 100}}, {"  the\n\nthe  ", {32, 32, 116, 257, 10, 10, 116, 257, 32, 32}}, {"12 345 6789", {260, 32, 51, 52, 53, 32, 54, 55, 56, 57}}}},
    {"split_Isolated_True", {{"the the", {116, 257, 32, 116, 257}}, {"abab  12 x", {259, 259, 32, 32, 260, 32, 120}}, {"a,b;;c d", {97, 44, 98, 59, 59, 99, 32, 100}}, {"  the\n\nthe  ", {32, 32, 116, 257, 10, 10, 116, 257, 32, 32}}, {"12 345 6789", {260, 32, 51, 52, 53, 32, 54, 55, 56, 57}}}},
    {"split_Removed_False", {{"the the", {116, 257, 116, 257}}, {"abab  12 x", {259, 259, 260, 120}}, {"a,b;;c d", {97, 98, 99, 100}}, {"  the\n\nthe  ", {116, 257, 10, 10, 116, 257}}, {"12 345 6789", {260, 51, 52, 53, 54, 55, 56, 57}}}},
    {"split_Removed_True", {{"the the", {32}}, {"abab  12 x", {32, 32, 32}}, {"a,b;;c d", {44, 59, 59, 32}}, {"  the\n\nthe  ", {32, 32, 32, 32}}, {"12 345 6789", {32, 32}}}},
    {"split_MergedWithPrevious_False", {{"the the", {116, 257, 32, 116, 257}}, {"abab  12 x", {259, 259, 32, 32, 260, 32, 120}}, {"a,b;;c d", {97, 44, 98, 59, 59, 99, 32, 100}}, {"  the\n\nthe  ", {32, 32, 116, 257, 10, 10, 116, 257, 32, 32}}, {"12 345 6789", {260, 32, 51, 52, 53, 32, 54, 55, 56, 57}}}},
    {"split_MergedWithPrevious_True", {{"the the", {116, 257, 258}}, {"abab  12 x", {259, 259, 32, 32, 260, 32, 120}}, {"a,b;;c d", {97, 44, 98, 59, 59, 99, 32, 100}}, {"  the\n\nthe  ", {32, 258, 10, 10, 116, 257, 32, 32}}, {"12 345 6789", {260, 32, 51, 52, 53, 32, 54, 55, 56, 57}}}},
    {"split_MergedWithNext_False", {{"the the", {116, 257, 258}}, {"abab  12 x", {259, 259, 32, 32, 260, 32, 120}}, {"a,b;;c d", {97, 44, 98, 59, 59, 99, 32, 100}}, {"  the\n\nthe  ", {32, 258, 10, 10, 116, 257, 32, 32}}, {"12 345 6789", {260, 32, 51, 52, 53, 32, 54, 55, 56, 57}}}},
    {"split_MergedWithNext_True", {{"the the", {116, 257, 32, 116, 257}}, {"abab  12 x", {259, 259, 32, 32, 260, 32, 120}}, {"a,b;;c d", {97, 44, 98, 59, 59, 99, 32, 100}}, {"  the\n\nthe  ", {32, 32, 116, 257, 10, 10, 116, 257, 32, 32}}, {"12 345 6789", {260, 32, 51, 52, 53, 32, 54, 55, 56, 57}}}},
    {"split_Contiguous_False", {{"the the", {116, 257, 32, 116, 257}}, {"abab  12 x", {259, 259, 32, 32, 260, 32, 120}}, {"a,b;;c d", {97, 44, 98, 59, 59, 99, 32, 100}}, {"  the\n\nthe  ", {32, 32, 116, 257, 10, 10, 116, 257, 32, 32}}, {"12 345 6789", {260, 32, 51, 52, 53, 32, 54, 55, 56, 57}}}},
    {"split_Contiguous_True", {{"the the", {116, 257, 32, 116, 257}}, {"abab  12 x", {259, 259, 32, 32, 260, 32, 120}}, {"a,b;;c d", {97, 44, 98, 59, 59, 99, 32, 100}}, {"  the\n\nthe  ", {32, 32, 116, 257, 10, 10, 116, 257, 32, 32}}, {"12 345 6789", {260, 32, 51, 52, 53, 32, 54, 55, 56, 57}}}},
    {"split_string", {{"the the", {116, 257, 258}}, {"abab  12 x", {259, 259, 32, 32, 260, 32, 120}}, {"a,b;;c d", {97, 44, 98, 59, 59, 99, 32, 100}}, {"  the\n\nthe  ", {32, 258, 10, 10, 116, 257, 32, 32}}, {"12 345 6789", {260, 32, 51, 52, 53, 32, 54, 55, 56, 57}}}},
    {"bytelevel_prefix", {{"the the", {258, 258}}, {"abab  12 x", {32, 259, 259, 32, 32, 260, 32, 120}}, {"a,b;;c d", {32, 97, 44, 98, 59, 59, 99, 32, 100}}, {"  the\n\nthe  ", {32, 258, 10, 10, 116, 257, 32, 32}}, {"12 345 6789", {32, 260, 32, 51, 52, 53, 32, 54, 55, 56, 57}}, {"<s>the", {32, 60, 115, 62, 116, 257}}, {"x<s> the", {32, 120, 60, 115, 62, 258}}}},
    {"digits_punct", {{"the the", {116, 257, 258}}, {"abab  12 x", {259, 259, 32, 32, 260, 32, 120}}, {"a,b;;c d", {97, 44, 98, 59, 59, 99, 32, 100}}, {"  the\n\nthe  ", {32, 258, 10, 10, 116, 257, 32, 32}}, {"12 345 6789", {260, 32, 51, 52, 53, 32, 54, 55, 56, 57}}}},
    {"added", {{"a <mask> b", {97, 262, 32, 98}}, {"a  \n<mask>b", {97, 262, 98}}, {"[x]  the", {263, 116, 257}}, {"foo bar", {264, 32, 98, 97, 114}}, {"afoo foo", {97, 102, 111, 111, 32, 264}}, {"foo,foo", {264, 44, 264}}, {"<s>the <s> the", {261, 116, 257, 32, 261, 258}}, {"x [x]\n\n y", {120, 32, 263, 121}}}},
    {"ignore_merges", {{"the the", {116, 257, 32, 116, 257}}, {"\xC4""\xA0""the", {196, 160, 116, 257}}}},
    {"strip_norm", {{"  aaa the  ", {98, 258}}, {"\xE3""\x80""\x80"" x \xE2""\x80""\x83""", {120}}}},
    {"spm_legacy", {{"ab hi", {265, 269}}, {"  hi ab", {259, 259, 269, 265}}, {"abc\xE4""\xB8""\x80""x", {265, 262, 231, 187, 131, 123}}, {"hi<s>ab", {269, 1, 265}}, {"<s> hi", {1, 259, 269}}, {"\xE2""\x96""\x81""ab", {259, 265}}, {"zzq hi", {259, 125, 125, 116, 269}}}},
    {"metaspace_always_True", {{"ab hi", {265, 269}}, {"  hi ab", {259, 269, 265}}, {"abc\xE4""\xB8""\x80""x", {265, 262, 231, 187, 131, 123}}, {"hi<s>ab", {269, 1, 265}}, {"<s> hi", {1, 269}}, {"\xE2""\x96""\x81""ab", {265}}, {"zzq hi", {259, 125, 125, 116, 269}}}},
    {"metaspace_always_False", {{"ab hi", {265, 269}}, {"  hi ab", {259, 269, 265}}, {"abc\xE4""\xB8""\x80""x", {265, 262, 231, 187, 131, 123}}, {"hi<s>ab", {269, 1, 265}}, {"<s> hi", {1, 269}}, {"\xE2""\x96""\x81""ab", {265}}, {"zzq hi", {259, 125, 125, 116, 269}}}},
    {"metaspace_first_True", {{"ab hi", {265, 269}}, {"  hi ab", {259, 269, 265}}, {"abc\xE4""\xB8""\x80""x", {265, 262, 231, 187, 131, 123}}, {"hi<s>ab", {269, 1, 264}}, {"<s> hi", {1, 269}}, {"\xE2""\x96""\x81""ab", {265}}, {"zzq hi", {259, 125, 125, 116, 269}}}},
    {"metaspace_first_False", {{"ab hi", {265, 269}}, {"  hi ab", {259, 269, 265}}, {"abc\xE4""\xB8""\x80""x", {265, 262, 231, 187, 131, 123}}, {"hi<s>ab", {269, 1, 264}}, {"<s> hi", {1, 269}}, {"\xE2""\x96""\x81""ab", {265}}, {"zzq hi", {259, 125, 125, 116, 269}}}},
    {"metaspace_never_True", {{"ab hi", {264, 269}}, {"  hi ab", {259, 269, 265}}, {"abc\xE4""\xB8""\x80""x", {264, 262, 231, 187, 131, 123}}, {"hi<s>ab", {268, 1, 264}}, {"<s> hi", {1, 269}}, {"\xE2""\x96""\x81""ab", {265}}, {"zzq hi", {125, 125, 116, 269}}}},
    {"metaspace_never_False", {{"ab hi", {264, 269}}, {"  hi ab", {259, 269, 265}}, {"abc\xE4""\xB8""\x80""x", {264, 262, 231, 187, 131, 123}}, {"hi<s>ab", {268, 1, 264}}, {"<s> hi", {1, 269}}, {"\xE2""\x96""\x81""ab", {265}}, {"zzq hi", {125, 125, 116, 269}}}},
};

std::unique_ptr<Tokenizer> from_json(const json& j, const std::string& config = "",
                                     const std::string& generation = "") {
    return std::make_unique<Tokenizer>(Tokenizer::vocab_from_hf_json(j.dump(), config, generation, "test"));
}

std::string ids_str(const std::vector<int32_t>& ids) {
    std::string s;
    for (auto id : ids) s += " " + std::to_string(id);
    return s;
}

}  // namespace

// ---------------------------------------------------------------- tokenizer.json

TEST(HfJson, MatchesHuggingFaceOnEveryStep) {
    int n = 0;
    for (const HfCase& c : kHfCases) {
        const auto tok = from_json(make_case(c.name));
        for (const auto& [text, ids] : c.cases) {
            EXPECT_EQ(tok->encode(text, false, true), ids)
                << c.name << ": \"" << text << "\"\n  expected:" << ids_str(ids)
                << "\n  got:     " << ids_str(tok->encode(text, false, true));
            ++n;
        }
    }
    EXPECT_GT(n, 100);
}

TEST(HfJson, SpmRoundTripAndDecoding) {
    const auto tok = from_json(make_case("spm_legacy"));
    EXPECT_EQ(tok->kind(), VocabKind::SpmBpe);
    for (const std::string s : {"ab hi", "  hi ab", "abc\xE4\xB8\x80x", "zzq hi ", "\xFF\x80 raw"})
        EXPECT_EQ(tok->decode(tok->encode(s, false, false)), s) << s;
    // Byte fallback for the characters outside the vocabulary.
    EXPECT_EQ(tok->encode("\xE4\xB8\x80", false, false), (std::vector<int32_t>{259, 3 + 0xE4, 3 + 0xB8, 3 + 0x80}));
    const auto ms = from_json(make_case("metaspace_first_False"));
    EXPECT_EQ(ms->decode(ms->encode("ab hi", false, false)), "ab hi");
    const auto never = from_json(make_case("metaspace_never_True"));
    EXPECT_EQ(never->decode(never->encode("ab hi", false, false)), "ab hi");
}

TEST(HfJson, BosEosFromConfigAndTemplate) {
    json j = make_case("spm_legacy");
    j["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                       {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                           {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
    auto tok = from_json(j);
    EXPECT_TRUE(tok->add_bos());
    EXPECT_FALSE(tok->add_eos());
    EXPECT_EQ(tok->encode("ab", true, false), (std::vector<int32_t>{1, 265}));
    tok = from_json(j, R"({"add_bos_token": false, "add_eos_token": true, "eos_token": {"content": "</s>"}})",
                    R"({"eos_token_id": [2, 0]})");
    EXPECT_EQ(tok->encode("ab", true, false), (std::vector<int32_t>{265, 2}));
    EXPECT_TRUE(tok->is_eog(2));
    EXPECT_TRUE(tok->is_eog(0));
}

TEST(HfJson, LoadsFromFolderAndFile) {
    const fs::path dir = fs::temp_directory_path() / ("quern-tok-json-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    std::ofstream(dir / "tokenizer.json") << make_case("spm_legacy").dump();
    std::ofstream(dir / "tokenizer_config.json") << R"({"add_bos_token": true, "bos_token": "<s>"})";
    const auto a = Tokenizer::from_file(dir.string());
    EXPECT_EQ(a->encode("ab", true, false), (std::vector<int32_t>{1, 265}));
    const auto b = Tokenizer::from_file((dir / "tokenizer.json").string());
    EXPECT_EQ(b->encode("ab", true, false), (std::vector<int32_t>{1, 265}));
    fs::remove_all(dir);
    EXPECT_THROW(Tokenizer::from_file((dir / "nothing").string()), Error);
}

// generation_config.json is not the tokenizer's own file (quern also reads its
// sampling defaults): its errors name its path, and the key at fault.
TEST(HfJson, GenerationConfigErrorsNameTheFileAndKey) {
    const fs::path dir = fs::temp_directory_path() / ("quern-tok-gen-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    std::ofstream(dir / "tokenizer.json") << make_case("spm_legacy").dump();
    const std::string gen = (dir / "generation_config.json").string();
    auto error = [&](const std::string& text) -> std::string {
        std::ofstream(gen, std::ios::trunc) << text;
        try {
            Tokenizer::from_file(dir.string());
        } catch (const Error& e) {
            return e.what();
        }
        return "no error";
    };
    std::string e = error("{ nope");
    EXPECT_EQ(e.rfind(gen + ": not valid JSON", 0), 0u) << e;
    EXPECT_EQ(e.find("tokenizer:"), std::string::npos) << e;
    for (const char* bad : {R"({"eos_token_id": "x"})", R"({"eos_token_id": [2, "x"]})", R"({"eos_token_id": -1})",
                            R"({"eos_token_id": 2.5})"}) {
        e = error(bad);
        EXPECT_EQ(e.rfind(gen + ": key 'eos_token_id' must be a token id", 0), 0u) << bad << ": " << e;
    }
    e = error(R"({"eos_token_id": [2, 0], "temperature": 0.6})");
    EXPECT_EQ(e, "no error");
    std::ofstream(gen, std::ios::trunc) << R"({"eos_token_id": null})";
    EXPECT_NO_THROW(Tokenizer::from_file(dir.string()));
    fs::remove_all(dir);
}

TEST(HfJson, MalformedFilesGiveClearErrors) {
    auto load = [](const std::string& text) { Tokenizer::vocab_from_hf_json(text, "", "", "t.json"); };
    EXPECT_THROW(load(""), Error);
    EXPECT_THROW(load("{"), Error);
    EXPECT_THROW(load("[]"), Error);
    EXPECT_THROW(load(R"({"model": {"type": "Unigram", "vocab": []}})"), Error);
    EXPECT_THROW(load(R"({"model": {"type": "BPE", "vocab": {"a": -3}, "merges": []}})"), Error);
    EXPECT_THROW(load(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [7]}})"), Error);
    EXPECT_THROW(load(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["ab"]}})"), Error);
    EXPECT_THROW(load(R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "normalizer": {"type": "NFKD"}})"), Error);
    EXPECT_THROW(load(R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "Bert"}})"), Error);
    // A bad regex is found when the pipeline is compiled: construction throws, no crash.
    const VocabData d = Tokenizer::vocab_from_hf_json(
        R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "("}, "behavior": "Isolated"}})",
        "", "", "t.json");
    EXPECT_THROW(Tokenizer{d}, Error);
    // A vocabulary with holes (ids without a token) is fine.
    const auto tok = std::make_unique<Tokenizer>(Tokenizer::vocab_from_hf_json(
        R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 5}, "merges": []}})", "", "", "t.json"));
    EXPECT_EQ(tok->n_vocab(), 6);
    EXPECT_EQ(tok->encode("ab?", false, false), (std::vector<int32_t>{0, 5}));
}

// ---------------------------------------------------------------- fast matchers

namespace {

// Characters whose classes PCRE2 (Unicode 14) and the table (Unicode 16) agree
// on, so both matchers must split any text of them identically.
std::vector<std::string> agreed_characters() {
    const std::pair<const char*, unsigned> probes[] = {{R"(\A\p{L}\z)", fastre::kLetter}, {R"(\A\p{N}\z)", fastre::kNumber},
                                                       {R"(\A\p{P}\z)", fastre::kPunct},  {R"(\A\p{S}\z)", fastre::kSymbol},
                                                       {R"(\A\p{M}\z)", fastre::kMark},   {R"(\A\s\z)", fastre::kSpace},
                                                       {R"(\A[\p{Lu}\p{Lt}]\z)", fastre::kUpper},
                                                       {R"(\A\p{Ll}\z)", fastre::kLower}};
    std::vector<std::unique_ptr<Regex>> re;
    for (const auto& p : probes) re.push_back(std::make_unique<Regex>(p.first, false));
    const std::pair<uint32_t, uint32_t> blocks[] = {
        {0x0, 0x24F},      {0x300, 0x52F},     {0x590, 0x6FF},     {0x900, 0x9FF},     {0xE00, 0xE7F},
        {0x1100, 0x11FF},  {0x1680, 0x1680},   {0x180E, 0x180E},   {0x1E00, 0x1FFF},   {0x2000, 0x2BFF},
        {0x2E00, 0x2E7F},  {0x3000, 0x30FF},   {0x4E00, 0x4E3F},   {0x9FA0, 0x9FFF},   {0xA640, 0xA7FF},
        {0xAC00, 0xAC3F},  {0xD7F0, 0xD7FF},   {0xFB00, 0xFB4F},   {0xFE00, 0xFE6F},   {0xFF00, 0xFFEF},
        {0x10400, 0x1044F}, {0x11400, 0x1147F}, {0x1D400, 0x1D4FF}, {0x1F300, 0x1F6FF}, {0x1F900, 0x1FAFF},
        {0x20000, 0x2003F}};
    // Where the Punctuation / Digits steps deliberately follow other tables.
    auto hf_exception = [](uint32_t cp) {
        return cp == 0x61D || cp == 0x9FD || cp == 0x166D || (cp >= 0x1B4E && cp <= 0x1B7F) ||
               (cp >= 0x2E43 && cp <= 0x2E5D) || (cp >= 0x1144B && cp <= 0x1145D);
    };
    std::vector<std::string> out;
    for (const auto& [a, b] : blocks)
        for (uint32_t cp = a; cp <= b; ++cp) {
            if (hf_exception(cp)) continue;
            std::string s;
            unicode::utf8_append(s, cp);
            unsigned pcre = 0;
            for (size_t k = 0; k < re.size(); ++k)
                re[k]->for_each_match(s, [&](size_t, size_t) { pcre |= probes[k].second; });
            if (pcre == fastre::class_of(cp)) out.push_back(s);
        }
    return out;
}

std::vector<std::pair<size_t, size_t>> matches(const Regex& re, const std::string& s) {
    std::vector<std::pair<size_t, size_t>> m;
    re.for_each_match(s, [&](size_t b, size_t e) { m.emplace_back(b, e); });
    return m;
}

}  // namespace

TEST(FastRegex, AgreesWithPcre2) {
    const std::vector<std::string> chars = agreed_characters();
    ASSERT_GT(chars.size(), 5000u);
    const char* pats[] = {patterns::kGpt2,           patterns::kLlama3,         patterns::kQwen2,
                          patterns::kQwen35,         patterns::kGpt4o,
                          patterns::kDeepseek3Main,   patterns::kDigit,          patterns::kDigitRun,
                          patterns::kDigits1to3,      patterns::kThreeAsciiDigits, patterns::kCrLf,
                          patterns::kSpaceLetters,    patterns::kSpacePunct,     patterns::kFalconPunct,
                          patterns::kPunctOne,        patterns::kDeepseekLlmLetters, patterns::kDeepseekLlmPunct,
                          patterns::kTrailingSpace,   patterns::kDeepseekCjk,    patterns::kDeepseek3Cjk};
    const std::vector<std::string> pieces = {" ", "  ", "\n", "\r\n", "\t", "'s", "'T", "'ll", "'RE", "'\xC5\xBF",
                                             "a", "Z", "7", "123", "!", ".", "(", "\xC2\xA0", "\xE3\x80\x80",
                                             "/", "Ab", "aB", "ABc", "\xC7\x85" /* U+01C5, title case */,
                                             "\xCC\x81" /* U+0301, a mark */, "\xCA\xB0" /* U+02B0, Lm */};
    std::mt19937 rng(42);
    for (const char* p : pats) {
        const Regex fast(p, true), slow(p, false);
        ASSERT_TRUE(fast.has_fast_path()) << p;
        ASSERT_FALSE(slow.has_fast_path());
        for (int iter = 0; iter < 3000; ++iter) {
            std::string s;
            const int n = 1 + static_cast<int>(rng() % 24);
            for (int k = 0; k < n; ++k) {
                const uint32_t r = rng() % 10;
                if (r < 4)
                    s += static_cast<char>(rng() % 128);  // any ASCII, controls included
                else if (r < 6)
                    s += pieces[rng() % pieces.size()];
                else if (r < 9)
                    s += chars[rng() % chars.size()];
                else
                    s += static_cast<char>(0x80 + rng() % 0x80);  // invalid UTF-8: PCRE2 takes over
            }
            ASSERT_EQ(matches(fast, s), matches(slow, s)) << "pattern " << p << " on \"" << s << "\"";
        }
    }
}

TEST(FastRegex, FollowsUnicode16AndWhiteSpace) {
    // U+180E is \s to PCRE2 but not White_Space (nor to the HF regex engine).
    EXPECT_EQ(fastre::class_of(0x180E) & fastre::kSpace, 0u);
    EXPECT_NE(fastre::class_of(0x3000) & fastre::kSpace, 0u);
    EXPECT_NE(fastre::class_of(0x1C89) & fastre::kLetter, 0u);  // Unicode 16
    EXPECT_NE(fastre::class_of(0x4E00) & fastre::kLetter, 0u);
    EXPECT_NE(fastre::class_of(0x0669) & fastre::kNumber, 0u);
    const std::vector<std::string> got = PreTokenizer("gpt2").split("a \xE1\xA0\x8E b");
    EXPECT_EQ(got, (std::vector<std::string>{"a", " \xE1\xA0\x8E", " b"}));
}

// ---------------------------------------------------------------- streaming

TEST(Detokenizer, AnySplitOfAnySequenceGivesTheWholeText) {
    std::vector<std::unique_ptr<Tokenizer>> toks;
    for (const char* v : {"gpt-2", "llama-spm", "phi-3", "falcon", "deepseek-coder", "starcoder", "gpt-neox", "baichuan"}) {
        const std::string path = kVocabDir + "/ggml-vocab-" + v + ".gguf";
        if (fs::exists(path)) toks.push_back(Tokenizer::from_gguf(GgufFile(path)));
    }
    toks.push_back(from_json(make_case("spm_legacy")));
    ASSERT_GE(toks.size(), 2u);
    std::mt19937 rng(5);
    for (const auto& tok : toks) {
        for (int iter = 0; iter < 300; ++iter) {
            // Random ids (byte tokens and all) or the ids of text with multi-byte characters.
            std::vector<int32_t> ids;
            if (iter % 2) {
                for (int k = 0, n = 1 + static_cast<int>(rng() % 40); k < n; ++k)
                    ids.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(tok->n_vocab())));
            } else {
                std::string s;
                for (int k = 0, n = static_cast<int>(rng() % 30); k < n; ++k)
                    unicode::utf8_append(s, k % 3 ? 0x4E00 + rng() % 0x500 : 0x1F300 + rng() % 0x300);
                ids = tok->encode(s, true, false);
            }
            const bool starts = rng() % 2;
            const bool render = rng() % 2;
            DecodeState st;
            st.at_start = starts;
            std::string expected;
            for (int32_t id : ids) tok->append_piece(expected, id, st, render);
            Detokenizer d(*tok, render, starts);
            std::string streamed;
            std::vector<size_t> cuts;
            for (size_t i = 0; i < ids.size();) {
                const size_t n = std::min(ids.size() - i, static_cast<size_t>(1 + rng() % 5));
                streamed += d.push(std::vector<int32_t>(ids.begin() + i, ids.begin() + i + n));
                cuts.push_back(streamed.size());
                i += n;
            }
            streamed += d.flush();
            ASSERT_EQ(streamed, expected);
            // No chunk ends inside a valid character of the whole text (bytes
            // that can never complete may be emitted as they come).
            std::vector<bool> starts_char(streamed.size() + 1, false);
            for (size_t i = 0; i < streamed.size(); i += unicode::utf8_decode(streamed, i).len) starts_char[i] = true;
            starts_char[streamed.size()] = true;
            for (size_t c : cuts) ASSERT_TRUE(starts_char[c]) << "a chunk ends inside a character at byte " << c;
            if (starts) ASSERT_EQ(streamed, tok->decode(ids, render));
        }
    }
}

// ---------------------------------------------------------------- threads

TEST(Tokenizer, SharedAcrossThreadsGivesTheSameIds) {
    const std::string path = kVocabDir + "/ggml-vocab-gpt-2.gguf";
    const std::string spm_path = kVocabDir + "/ggml-vocab-llama-spm.gguf";
    if (!fs::exists(path) || !fs::exists(spm_path)) GTEST_SKIP() << "vocab files not found";
    for (const std::string& p : {path, spm_path}) {
        const auto tok = Tokenizer::from_gguf(GgufFile(p));
        std::mt19937 rng(3);
        std::vector<std::string> texts;
        for (int i = 0; i < 200; ++i) {
            std::string s;
            for (int k = 0, n = 1 + static_cast<int>(rng() % 30); k < n; ++k) {
                s += "word" + std::to_string(rng() % 50) + (k % 4 ? " " : ", ");
                unicode::utf8_append(s, 0x4E00 + rng() % 64);
            }
            texts.push_back(s);
        }
        std::vector<std::vector<int32_t>> expected;  // from another instance, one thread
        const auto reference = Tokenizer::from_gguf(GgufFile(p));
        for (const auto& t : texts) expected.push_back(reference->encode(t, true, false));
        std::vector<std::thread> threads;
        std::atomic<int> mismatches{0};
        for (int th = 0; th < 4; ++th)
            threads.emplace_back([&, th] {
                for (int rep = 0; rep < 5; ++rep)
                    for (size_t i = 0; i < texts.size(); ++i) {
                        const size_t k = (i * 7 + static_cast<size_t>(th) * 13 + static_cast<size_t>(rep)) % texts.size();
                        if (tok->encode(texts[k], true, false) != expected[k]) ++mismatches;
                        if (i % 50 == 0 && th == 0) tok->clear_caches();
                    }
            });
        for (auto& t : threads) t.join();
        EXPECT_EQ(mismatches.load(), 0) << p;
    }
}
