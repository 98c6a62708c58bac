// Tokenizer tests: reference vectors from ../shared/testdata/vocab (produced by
// each model's Hugging Face tokenizer), the default model's tokenizer, round
// trips, the streaming detokenizer and hostile input.
#include <gtest/gtest.h>

#include <algorithm>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/unicode_nfc.h"

using namespace quern;
namespace fs = std::filesystem;

namespace {

const std::string kVocabDir = std::string(QUERN_TESTDATA_DIR) + "/vocab";

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Loads (and caches) ggml-vocab-NAME.gguf; nullptr when the file is absent.
const Tokenizer* vocab(const std::string& name) {
    static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
    auto it = cache.find(name);
    if (it != cache.end()) return it->second.get();
    const std::string path = kVocabDir + "/ggml-vocab-" + name + ".gguf";
    std::unique_ptr<Tokenizer> tok;
    if (fs::exists(path)) tok = Tokenizer::from_gguf(GgufFile(path));
    return (cache[name] = std::move(tok)).get();
}

std::string default_model_path() {
    const char* home = std::getenv("QUERN_HOME");
    std::string base = home && *home ? home : std::string(std::getenv("HOME") ? std::getenv("HOME") : "") + "/.cache/quern";
    return base + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

const Tokenizer* smollm() {
    static std::unique_ptr<Tokenizer> tok;
    static bool tried = false;
    if (!tried) {
        tried = true;
        if (fs::exists(default_model_path())) tok = Tokenizer::from_gguf(GgufFile(default_model_path()));
    }
    return tok.get();
}

struct Vector {
    std::string text;
    std::vector<int32_t> ids;
};

std::vector<Vector> load_vectors(const std::string& name) {
    const std::string inp = read_file(kVocabDir + "/ggml-vocab-" + name + ".gguf.inp");
    const std::string out = read_file(kVocabDir + "/ggml-vocab-" + name + ".gguf.out");
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> texts;
    for (size_t pos = 0; pos < inp.size();) {
        size_t e = inp.find(sep, pos);
        if (e == std::string::npos) break;
        texts.push_back(inp.substr(pos, e - pos));
        pos = e + sep.size();
    }
    std::vector<Vector> v;
    std::istringstream lines(out);
    std::string line;
    for (const auto& t : texts) {
        if (!std::getline(lines, line)) break;
        Vector x{t, {}};
        std::istringstream ids(line);
        for (long id; ids >> id;) x.ids.push_back(static_cast<int32_t>(id));
        v.push_back(std::move(x));
    }
    EXPECT_EQ(v.size(), texts.size()) << name << ": .inp and .out disagree on the number of cases";
    return v;
}

std::string ids_str(const std::vector<int32_t>& ids) {
    std::string s;
    for (auto id : ids) s += " " + std::to_string(id);
    return s;
}

// Random valid UTF-8 drawn from several scripts and whitespace runs.
std::string random_text(std::mt19937& rng, size_t n_atoms) {
    static const std::vector<std::pair<uint32_t, uint32_t>> ranges = {
        {0x20, 0x7E},       {0x20, 0x7E},       {0x20, 0x7E},     {0x30, 0x39},     {0xA0, 0xFF},
        {0x100, 0x17F},     {0x300, 0x36F},     {0x391, 0x3C9},   {0x410, 0x44F},   {0x5D0, 0x5EA},
        {0x620, 0x64A},     {0x900, 0x97F},     {0x1780, 0x17DD}, {0x3040, 0x30FF}, {0x4E00, 0x9FFF},
        {0xAC00, 0xD7A3},   {0xFF01, 0xFF5E},   {0x1F300, 0x1F64F}, {0x1F680, 0x1F6FF}, {0x1F900, 0x1F9FF},
    };
    static const char* ws[] = {" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "    ", "\t\t"};
    static const char* joiners[] = {"\u200D", "\uFE0F", "\u0301", "\u00A0", "\u3000"};
    std::string s;
    for (size_t i = 0; i < n_atoms; ++i) {
        const uint32_t kind = rng() % 10;
        if (kind < 2) {
            s += ws[rng() % std::size(ws)];
        } else if (kind == 2) {
            s += joiners[rng() % std::size(joiners)];
        } else {
            const auto& r = ranges[rng() % ranges.size()];
            unicode::utf8_append(s, r.first + rng() % (r.second - r.first + 1));
        }
    }
    return s;
}

std::string random_bytes(std::mt19937& rng, size_t n) {
    std::string s;
    for (size_t i = 0; i < n; ++i) {
        const uint32_t k = rng() % 4;
        s += static_cast<char>(k == 0 ? 0x80 + rng() % 0x80 : k == 1 ? 0xC0 + rng() % 0x40 : rng() % 0x100);
    }
    return s;
}

// `s` without the bytes a byte-level vocabulary has no token for (dropped by
// the encoder, as Hugging Face does when there is no <unk>).
std::string encodable(const Tokenizer& tok, const std::string& s) {
    if (tok.kind() != VocabKind::Bpe) return s;
    const auto& bm = unicode::ByteMap::get();
    std::string out;
    for (char c : s)
        if (auto id = tok.token_id(bm.byte_to_utf8(static_cast<uint8_t>(c))); id && !tok.is_special(*id)) out += c;
    return out;
}

const std::vector<std::string> kByteLevel = {"gpt-2", "starcoder", "falcon", "deepseek-coder", "gpt-neox"};
const std::vector<std::string> kAll = {"gpt-2", "starcoder", "falcon", "deepseek-coder", "gpt-neox", "llama-spm", "phi-3",
                                       "baichuan"};

}  // namespace

// ---------------------------------------------------------------- unicode helpers

TEST(Unicode, ByteMapIsABijection) {
    const auto& bm = unicode::ByteMap::get();
    std::string all;
    for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
    const std::string enc = bm.encode(all);
    EXPECT_TRUE(unicode::utf8_valid(enc));
    EXPECT_EQ(bm.decode(enc), all);
    EXPECT_EQ(bm.byte_to_cp(' '), 0x120u);   // "Ġ"
    EXPECT_EQ(bm.byte_to_cp('\n'), 0x10Au);  // "Ċ"
    EXPECT_EQ(bm.byte_to_cp('A'), static_cast<uint32_t>('A'));
}

TEST(Unicode, DecodeIsStrict) {
    EXPECT_TRUE(unicode::utf8_valid("h\xC3\xA9llo \xF0\x9F\xA6\x99"));
    for (const char* bad : {"\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xFF", "\x80", "\xE4\xB8"})
        EXPECT_FALSE(unicode::utf8_valid(bad)) << bad;
}

TEST(Unicode, IncompleteTail) {
    EXPECT_EQ(unicode::utf8_incomplete_tail("abc"), 0u);
    EXPECT_EQ(unicode::utf8_incomplete_tail("a\xE4"), 1u);
    EXPECT_EQ(unicode::utf8_incomplete_tail("a\xE4\xB8"), 2u);
    EXPECT_EQ(unicode::utf8_incomplete_tail("a\xE4\xB8\xAD"), 0u);
    EXPECT_EQ(unicode::utf8_incomplete_tail("\xF0\x9F\xA6"), 3u);
    EXPECT_EQ(unicode::utf8_incomplete_tail("\xF0\x9F\xA6\x99"), 0u);
    EXPECT_EQ(unicode::utf8_incomplete_tail("\x80\x80"), 0u);      // stray continuations: emit
    EXPECT_EQ(unicode::utf8_incomplete_tail("\xE0\x80"), 0u);      // can never complete validly
    EXPECT_EQ(unicode::utf8_incomplete_tail("\xFF"), 0u);
}

TEST(PreTokenizer, Gpt2Splits) {
    PreTokenizer p("gpt2");
    const std::vector<std::string> got = p.split("Hello world's  42!\n");
    EXPECT_EQ(got, (std::vector<std::string>{"Hello", " world", "'s", " ", " 42", "!", "\n"}));
    EXPECT_FALSE(PreTokenizer("no-such-pre").known());
}

TEST(PreTokenizer, StarcoderSplitsDigits) {
    PreTokenizer p("smollm");
    const std::vector<std::string> got = p.split("abc 123");
    EXPECT_EQ(got, (std::vector<std::string>{"abc", " ", "1", "2", "3"}));
}

TEST(PreTokenizer, EveryFamilyCompilesAndCoversTheText) {
    const std::string text = "Hello 12345 world's\n\n  \xE4\xBD\xA0\xE5\xA5\xBD, \xF0\x9F\xA6\x99!\xFF ok";
    const std::vector<std::string> names = PreTokenizer::known_names();  // what quern tokenize --pre accepts
    for (const char* pre : {"default", "gpt2", "smollm", "starcoder", "llama3", "llama-bpe", "qwen2", "qwen35", "deepseek-llm",
                            "deepseek-coder", "deepseek-v3", "falcon", "gpt-neox", "phi-2", "command-r"})
        EXPECT_NE(std::find(names.begin(), names.end(), pre), names.end()) << pre;
    EXPECT_EQ(std::find(names.begin(), names.end(), "no-such-pre"), names.end());
    for (const std::string& pre : names) {
        PreTokenizer p(pre);
        EXPECT_TRUE(p.known()) << pre;
        std::string joined;
        for (const auto& w : p.split(text)) {
            EXPECT_FALSE(w.empty()) << pre;
            joined += w;
        }
        EXPECT_EQ(joined, text) << pre;
    }
    const std::vector<std::string> got = PreTokenizer("llama3").split("Hello 12345 world's\n\n");
    EXPECT_EQ(got, (std::vector<std::string>{"Hello", " ", "123", "45", " world", "'s", "\n\n"}));
}

// Qwen3.5's regex keeps combining marks in their word: Devanagari vowel
// signs and viramas (category M) stay with the letters, where Qwen2's splits
// them off.
TEST(PreTokenizer, Qwen35KeepsCombiningMarksInWords) {
    const std::string namaste = "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87";  // नमस्ते
    const std::string text = "say " + namaste + "!";
    EXPECT_EQ(PreTokenizer("qwen35").split(text), (std::vector<std::string>{"say", " " + namaste, "!"}));
    EXPECT_GT(PreTokenizer("qwen2").split(text).size(), 3u);
    EXPECT_EQ(PreTokenizer("qwen35").family(), "qwen35");
}

// GPT-4o's o200k regex (gpt-oss): words split by case (upper run, then a
// lower run), contractions kept with their word, digits in threes,
// punctuation taking trailing slashes and newlines. The expected split is
// Hugging Face tokenizers' Split of the same regex.
TEST(PreTokenizer, Gpt4oSplitsWordsByCase) {
    const std::string text = "HelloWorld ABCdef XMLHttpRequest 1234567 it's THEY'RE ./a/b//\n\n  x";
    EXPECT_EQ(PreTokenizer("gpt-4o").split(text),
              (std::vector<std::string>{"Hello", "World", " ABCdef", " XMLHttp", "Request", " ", "123", "456", "7",
                                        " it's", " THEY'RE", " ./", "a", "/b", "//\n\n", " ", " x"}));
    EXPECT_EQ(PreTokenizer("gpt-4o").family(), "gpt-4o");
    EXPECT_EQ(PreTokenizer("llama4").family(), "gpt-4o");
}

// ---------------------------------------------------------------- reference vectors

class VocabVectors : public ::testing::TestWithParam<std::string> {};

TEST_P(VocabVectors, MatchHuggingFace) {
    const std::string name = GetParam();
    const Tokenizer* tok = vocab(name);
    ASSERT_NE(tok, nullptr) << "missing vocab " << name;
    const auto vectors = load_vectors(name);
    ASSERT_FALSE(vectors.empty());
    int pass = 0;
    for (const auto& v : vectors) {
        const auto got = tok->encode(v.text, false, false);
        if (got == v.ids) {
            ++pass;
        } else {
            ADD_FAILURE() << name << ": text \"" << v.text << "\"\n  expected:" << ids_str(v.ids)
                          << "\n  got:     " << ids_str(got);
        }
    }
    std::printf("[ vectors  ] %-15s %d/%zu passed\n", name.c_str(), pass, vectors.size());
}

INSTANTIATE_TEST_SUITE_P(Families, VocabVectors,
                         ::testing::Values("llama-spm", "gpt-2", "phi-3", "falcon", "deepseek-coder", "starcoder"),
                         [](const auto& info) {
                             std::string n = info.param;
                             for (auto& c : n)
                                 if (c == '-') c = '_';
                             return n;
                         });

// ---------------------------------------------------------------- specials and settings

TEST(Tokenizer, SpecialTokensParsedOnlyWhenAsked) {
    const Tokenizer* tok = vocab("gpt-2");
    ASSERT_NE(tok, nullptr);
    EXPECT_EQ(tok->encode("<|endoftext|>", false, true), (std::vector<int32_t>{50256}));
    const auto plain = tok->encode("<|endoftext|>", false, false);
    EXPECT_GT(plain.size(), 1u);
    EXPECT_EQ(tok->decode(plain), "<|endoftext|>");
    EXPECT_EQ(tok->encode("a<|endoftext|>b", false, true).size(), 3u);
    EXPECT_TRUE(tok->is_eog(50256));
    EXPECT_FALSE(tok->is_eog(15496));
    EXPECT_EQ(tok->n_vocab(), 50257);
    EXPECT_EQ(tok->token_id("Hello"), 15496);
    EXPECT_FALSE(tok->token_id("no such token at all").has_value());
    // gpt2 vocab: no BOS unless the GGUF asks for one.
    EXPECT_EQ(tok->encode("Hello", true, false), (std::vector<int32_t>{15496}));
}

TEST(Tokenizer, SpmAddsBosAndPrefix) {
    const Tokenizer* tok = vocab("llama-spm");
    ASSERT_NE(tok, nullptr);
    EXPECT_EQ(tok->bos(), 1);
    EXPECT_EQ(tok->eos(), 2);
    const auto ids = tok->encode("Hello world", true, false);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], 1);
    EXPECT_EQ(tok->decode(ids, false), "Hello world");
    EXPECT_EQ(tok->token_to_piece(tok->token_id("\xE2\x96\x81Hello").value()), " Hello");
    EXPECT_EQ(tok->token_to_piece(tok->token_id("<0x0A>").value()), "\n");
    EXPECT_EQ(tok->encode("<s>Hi</s>", false, true).front(), 1);
    EXPECT_TRUE(tok->is_eog(2));
    EXPECT_TRUE(tok->encode("", true, false) == std::vector<int32_t>{1});
    EXPECT_TRUE(tok->encode("", false, false).empty());
}

TEST(Tokenizer, GptTokenToPieceMapsBytesBack) {
    const Tokenizer* tok = vocab("gpt-2");
    ASSERT_NE(tok, nullptr);
    EXPECT_EQ(tok->token_to_piece(tok->token_id("\xC4\xA0world").value()), " world");  // "Ġworld"
    EXPECT_EQ(tok->token_to_piece(198), "\n");
    EXPECT_EQ(tok->token_to_piece(-1), "");
    EXPECT_EQ(tok->token_to_piece(1 << 30), "");
}

TEST(Tokenizer, EndOfGenerationTokens) {
    if (const Tokenizer* phi3 = vocab("phi-3")) {
        EXPECT_TRUE(phi3->is_eog(phi3->token_id("<|end|>").value()));
        EXPECT_TRUE(phi3->is_eog(phi3->token_id("<|endoftext|>").value()));
        EXPECT_FALSE(phi3->is_eog(phi3->token_id("<|user|>").value()));
        EXPECT_FALSE(phi3->is_eog(phi3->bos()));
    }
    if (const Tokenizer* ds = vocab("deepseek-coder")) {
        EXPECT_TRUE(ds->is_eog(ds->eos()));
        EXPECT_TRUE(ds->is_eog(ds->token_id("<|EOT|>").value()));
        // User-defined tokens are matched even without parse_special, control ones only with it.
        EXPECT_EQ(ds->encode("<|EOT|>", false, false), std::vector<int32_t>{ds->token_id("<|EOT|>").value()});
        EXPECT_GT(ds->encode("<｜end▁of▁sentence｜>", false, false).size(), 1u);
        EXPECT_EQ(ds->encode("<｜end▁of▁sentence｜>", false, true), std::vector<int32_t>{ds->eos()});
    }
}

// ---------------------------------------------------------------- default model

TEST(DefaultModel, SmolLM2Encodings) {
    const Tokenizer* tok = smollm();
    if (!tok) GTEST_SKIP() << "default model not found at " << default_model_path() << " (bash tools/fetch-model.sh)";
    EXPECT_EQ(tok->pre_family(), "starcoder");
    // Expected ids from the Hugging Face `tokenizers` package with the GGUF's
    // vocab + merges and SmolLM2's pre-tokenizer (Digits individual, ByteLevel).
    const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
        {"Hello, world!", {19556, 28, 905, 17}},
        {"The year 2024 had 366 days.", {504, 713, 216, 34, 32, 34, 36, 761, 216, 35, 38, 38, 2009, 30}},
        {"  leading spaces and trailing  ", {216, 2899, 5600, 284, 35079, 256}},
        {"def f(x):\n    return x**2\n", {1604, 275, 24, 104, 727, 472, 1003, 1792, 828, 34, 198}},
        {"\xC3\x84pfel \xC3\xBC" "ber na\xC3\xAFve caf\xC3\xA9 \xE2\x80\x94 \xC2\xBD cup",
         {142, 222, 96, 34520, 5549, 137, 593, 15486, 46494, 37366, 1841, 216, 16738, 7118}},
        {"日本語のテキストと emoji 🦙🚀",
         {23274, 115, 40993, 179, 120, 248, 26453, 11100, 224, 10391, 251, 10391, 134, 11100, 226, 7365, 118, 649,
          33777, 15107, 116, 243, 10813, 244, 218}},
        {"tab\tseparated\r\nlines", {15999, 197, 19509, 483, 201, 198, 5110}},
        {"I'm sure they'll've done it'S", {57, 5248, 2090, 502, 3060, 3543, 2294, 357, 23, 67}},
    };
    for (const auto& [text, ids] : cases) EXPECT_EQ(tok->encode(text, false, false), ids) << text;
    // Chat markup with special parsing.
    EXPECT_EQ(tok->encode("<|im_start|>user\nHi there<|im_end|>\n", false, true),
              (std::vector<int32_t>{1, 4093, 198, 26843, 665, 2, 198}));
    EXPECT_TRUE(tok->is_eog(2));  // <|im_end|>
    EXPECT_TRUE(tok->is_eog(0));  // <|endoftext|>
    EXPECT_FALSE(tok->is_eog(1));
    EXPECT_FALSE(tok->add_bos());
    EXPECT_EQ(tok->encode("Hi", true, false), tok->encode("Hi", false, false));
}

// ---------------------------------------------------------------- round trips

TEST(RoundTrip, RandomValidUtf8) {
    std::vector<std::pair<std::string, const Tokenizer*>> toks;
    for (const auto& n : kAll)
        if (vocab(n)) toks.emplace_back(n, vocab(n));
    if (smollm()) toks.emplace_back("smollm2", smollm());
    std::mt19937 rng(1234);
    for (int iter = 0; iter < 300; ++iter) {
        const std::string s = random_text(rng, 1 + rng() % 40);
        for (const auto& [name, tok] : toks) {
            const auto ids = tok->encode(s, false, false);
            // GPT-NeoX normalizes with NFC: decoding gives the normalized text.
            std::string buf;
            const std::string t(name == "gpt-neox" ? unicode::nfc(s, buf) : std::string_view(s));
            ASSERT_EQ(tok->decode(ids), encodable(*tok, t)) << name << " iteration " << iter;
        }
    }
}

TEST(Detokenizer, StreamingMatchesDecodeAndKeepsCharactersWhole) {
    std::vector<const Tokenizer*> toks;
    for (const auto& n : kAll)
        if (vocab(n)) toks.push_back(vocab(n));
    if (smollm()) toks.push_back(smollm());
    std::mt19937 rng(99);
    for (int iter = 0; iter < 200; ++iter) {
        const std::string s = random_text(rng, 1 + rng() % 30);
        for (const Tokenizer* tok : toks) {
            const auto ids = tok->encode(s, true, false);
            Detokenizer d(*tok, true, /*starts_text=*/true);
            std::string streamed;
            for (auto id : ids) {
                const std::string chunk = d.push(id);
                EXPECT_TRUE(unicode::utf8_valid(chunk)) << "chunk ends inside a character";
                streamed += chunk;
            }
            streamed += d.flush();
            ASSERT_EQ(streamed, tok->decode(ids));
        }
    }
}

TEST(Detokenizer, HoldsSplitCharacterUntilComplete) {
    const Tokenizer* tok = vocab("gpt-2");
    ASSERT_NE(tok, nullptr);
    // "🦙" is four byte tokens in GPT-2.
    const auto ids = tok->encode("\xF0\x9F\xA6\x99", false, false);
    ASSERT_GT(ids.size(), 1u);
    Detokenizer d(*tok);
    std::string got;
    for (size_t i = 0; i + 1 < ids.size(); ++i) EXPECT_EQ(d.push(ids[i]), "");
    got = d.push(ids.back());
    EXPECT_EQ(got, "\xF0\x9F\xA6\x99");
    // An unfinished sequence comes out at flush.
    EXPECT_EQ(d.push(ids[0]), "");
    EXPECT_EQ(d.flush(), tok->token_to_piece(ids[0]));
}

TEST(Detokenizer, ContinuationKeepsSpmLeadingSpace) {
    const Tokenizer* tok = vocab("llama-spm");
    ASSERT_NE(tok, nullptr);
    const auto ids = tok->encode("Paris is", false, false);  // "▁Paris", "▁is"
    Detokenizer gen(*tok);                                    // continuing a prompt
    std::string out;
    for (auto id : ids) out += gen.push(id);
    EXPECT_EQ(out + gen.flush(), " Paris is");
    Detokenizer whole(*tok, true, true);
    out.clear();
    for (auto id : ids) out += whole.push(id);
    EXPECT_EQ(out + whole.flush(), "Paris is");
    EXPECT_EQ(tok->decode(ids), "Paris is");
}

// ---------------------------------------------------------------- hostile input

TEST(InvalidUtf8, NeverThrowsAndByteLevelRoundTrips) {
    std::mt19937 rng(7);
    std::vector<std::string> inputs = {
        "\xFF", "\x80", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "abc\xE4\xB8", "\xF0\x9F\xA6",
        std::string("a\0b", 3), "\xE2\x96\x81\xFF x \xC3", "12\xB3" "45 \xBD\xBD\xBD",
    };
    for (int i = 0; i < 200; ++i) inputs.push_back(random_bytes(rng, 1 + rng() % 64));
    for (const auto& n : kAll) {
        const Tokenizer* tok = vocab(n);
        if (!tok) continue;
        const bool byte_level = tok->kind() == VocabKind::Bpe;
        for (const auto& s : inputs) {
            std::vector<int32_t> ids;
            ASSERT_NO_THROW(ids = tok->encode(s, true, true)) << n;
            ASSERT_NO_THROW(ids = tok->encode(s, false, false)) << n;
            for (auto id : ids) ASSERT_TRUE(id >= 0 && id < tok->n_vocab());
            if (byte_level) EXPECT_EQ(tok->decode(ids), encodable(*tok, s)) << n;
            Detokenizer d(*tok, true, /*starts_text=*/true);
            std::string streamed;
            for (auto id : ids) streamed += d.push(id);
            streamed += d.flush();
            EXPECT_EQ(streamed, tok->decode(ids)) << n;
        }
    }
    // SPM has byte tokens for every byte, so it round-trips too (except for
    // "▁" in the input, which SentencePiece cannot tell from a space).
    if (const Tokenizer* spm = vocab("llama-spm"))
        for (const auto& s : inputs)
            if (s.find("\xE2\x96\x81") == std::string::npos) EXPECT_EQ(spm->decode(spm->encode(s, false, false)), s);
}

TEST(InvalidUtf8, LongInputsStayFast) {
    const Tokenizer* tok = vocab("gpt-2");
    ASSERT_NE(tok, nullptr);
    const auto t0 = std::chrono::steady_clock::now();
    for (const std::string& s : {std::string(200000, ' '), std::string(200000, 'a'), std::string(100000, '\xFF'),
                                 std::string(50000, '7')}) {
        const auto ids = tok->encode(s, false, false);
        EXPECT_EQ(tok->decode(ids), s);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(secs, 20.0);
    const Tokenizer* spm = vocab("llama-spm");
    ASSERT_NE(spm, nullptr);
    const std::string s(100000, 'a');
    EXPECT_EQ(spm->decode(spm->encode(s, false, false)), s);
}

TEST(Tokenizer, RejectsUnsupportedAndInconsistentVocab) {
    VocabData d;
    EXPECT_THROW(Tokenizer{d}, Error);
    d.tokens = {"a", "b"};
    d.scores = {0.0f};
    EXPECT_THROW(Tokenizer{d}, Error);
    d.scores.clear();
    d.types = {TokenType::Normal};
    EXPECT_THROW(Tokenizer{d}, Error);
}

// The prompt rule every command shares (Tokenizer::encode_prompt): BOS in
// front where the model adds one, once even when the text begins with it.
TEST(Tokenizer, PromptsGetOneBos) {
    const Tokenizer* t = vocab("llama-spm");
    if (!t) GTEST_SKIP() << "ggml-vocab-llama-spm.gguf not present";
    ASSERT_TRUE(t->add_bos());
    const auto bos_count = [&](const std::vector<int32_t>& v) { return std::count(v.begin(), v.end(), t->bos()); };
    bool in_text = true;
    const std::vector<int32_t> plain = t->encode_prompt("Hello world", true, &in_text);
    EXPECT_FALSE(in_text);
    ASSERT_FALSE(plain.empty());
    EXPECT_EQ(plain.front(), t->bos());
    EXPECT_EQ(bos_count(plain), 1);
    const std::vector<int32_t> with = t->encode_prompt("<s>Hello world", true, &in_text);
    EXPECT_TRUE(in_text);
    EXPECT_EQ(with.front(), t->bos());
    EXPECT_EQ(bos_count(with), 1);
    EXPECT_EQ(std::vector<int32_t>(with.end() - 2, with.end()), std::vector<int32_t>(plain.end() - 2, plain.end()));
    // Without parsing special text the BOS text is text, and BOS is added.
    const std::vector<int32_t> literal = t->encode_prompt("<s>Hello world", false, &in_text);
    EXPECT_FALSE(in_text);
    EXPECT_EQ(bos_count(literal), 1);
    EXPECT_GT(literal.size(), with.size());
}
