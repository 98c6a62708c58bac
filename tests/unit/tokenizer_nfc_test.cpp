// NFC normalization (src/tokenizer/unicode_nfc.h): known cases (composition,
// Hangul, canonical ordering, blocking, composition exclusions, singletons,
// non-starter decompositions, starters that compose with the one before them),
// the quick-check fast path, invalid UTF-8, and the normalizer and GGUF
// wiring. The byte-exact differential check against Hugging Face's NFC on
// every code point and on random strings is the "nfc" family of
// tests/python/tok_diff.py (run by test_tokenizer_diff).
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/unicode_nfc.h"

using namespace quern;

namespace {

std::string u8(std::u32string_view s) {
    std::string out;
    for (char32_t c : s) unicode::utf8_append(out, static_cast<uint32_t>(c));
    return out;
}

std::string nfc(std::string_view s) {
    std::string buf;
    return std::string(unicode::nfc(s, buf));
}

std::string hex(std::string_view s) {
    std::string out;
    char b[4];
    for (unsigned char c : s) {
        std::snprintf(b, sizeof b, "%02X ", c);
        out += b;
    }
    return out;
}

#define EXPECT_NFC(in, want) EXPECT_EQ(hex(nfc(u8(in))), hex(u8(want))) << "input " << hex(u8(in))

}  // namespace

TEST(Nfc, ComposesDecomposedLetters) {
    EXPECT_NFC(U"e\u0301", U"\u00E9");
    EXPECT_NFC(U"cafe\u0301 nai\u0308ve", U"caf\u00E9 na\u00EFve");
    EXPECT_NFC(U"A\u030A", U"\u00C5");
    EXPECT_NFC(U"\u00C5", U"\u00C5");                   // already composed
    EXPECT_NFC(U"\u03B1\u0313\u0300\u0345", U"\u1F82");  // four code points into one
    EXPECT_NFC(U"\u1FB3\u0313", U"\u1F80");  // ᾳ + psili: decomposed, reordered (0345 is 240), recomposed
    EXPECT_NFC(U"C\u0327\u0301", U"\u1E08");
    EXPECT_NFC(U"\u304B\u3099", U"\u304C");  // kana voicing mark (class 8)
    EXPECT_NFC(U"x\u0301", U"x\u0301");      // no composite
}

TEST(Nfc, Hangul) {
    EXPECT_NFC(U"\u1100\u1161", U"\uAC00");
    EXPECT_NFC(U"\u1100\u1161\u11A8", U"\uAC01");
    EXPECT_NFC(U"\uAC00\u11A8", U"\uAC01");                  // LV + T
    EXPECT_NFC(U"\uAC01\u11A8", U"\uAC01\u11A8");            // LVT + T: nothing
    EXPECT_NFC(U"\u1100\u1161\u11A7", U"\uAC00\u11A7");      // U+11A7 is not a trailing consonant
    EXPECT_NFC(U"\u1112\u1175\u11C2", U"\uD7A3");            // the last syllable
    EXPECT_NFC(U"\u1100\u0301\u1161", U"\u1100\u0301\u1161");  // blocked by a mark
    EXPECT_NFC(U"\uD55C\uAD6D\uC5B4", U"\uD55C\uAD6D\uC5B4");
}

TEST(Nfc, CanonicalOrderingAndBlocking) {
    // Marks are sorted by combining class (stably), then composed.
    EXPECT_NFC(U"a\u0302\u0323", U"\u1EAD");            // circumflex (230) + dot below (220) -> ậ
    EXPECT_NFC(U"q\u0307\u0323", U"q\u0323\u0307");     // sorted, nothing composes
    EXPECT_NFC(U"q\u0301\u0300", U"q\u0301\u0300");     // same class: order kept
    EXPECT_NFC(U"a\u0301\u0301", U"\u00E1\u0301");      // the second is blocked by the first
    EXPECT_NFC(U"e\u0334\u0301", U"\u00E9\u0334");      // a lower class does not block
    EXPECT_NFC(U"e\u0301\u0334", U"\u00E9\u0334");      // sorted first
    EXPECT_NFC(U"a\u05B4\u0591\u0301", U"\u00E1\u05B4\u0591");
    EXPECT_NFC(U"\u0301\u0323", U"\u0323\u0301");       // leading marks are sorted too
    EXPECT_NFC(U"\u0301e", U"\u0301e");
}

TEST(Nfc, ExclusionsSingletonsAndNonStarters) {
    EXPECT_NFC(U"\u0958", U"\u0915\u093C");             // composition exclusion (Devanagari qa)
    EXPECT_NFC(U"\u0915\u093C", U"\u0915\u093C");
    EXPECT_NFC(U"\u2ADC", U"\u2ADD\u0338");
    EXPECT_NFC(U"\uFB2A", U"\u05E9\u05C1");
    EXPECT_NFC(U"\U0001D15E", U"\U0001D157\U0001D165");
    EXPECT_NFC(U"\u212B", U"\u00C5");                   // singletons: Angstrom, Ohm, Kelvin
    EXPECT_NFC(U"\u2126", U"\u03A9");
    EXPECT_NFC(U"\u212A", U"K");
    EXPECT_NFC(U"\uF900", U"\u8C48");                   // CJK compatibility ideograph
    EXPECT_NFC(U"\U0002F800", U"\u4E3D");
    EXPECT_NFC(U"\u0340", U"\u0300");
    EXPECT_NFC(U"\u0344", U"\u0308\u0301");             // non-starter decompositions
    EXPECT_NFC(U"\u0F73", U"\u0F71\u0F72");
    EXPECT_NFC(U"\u1E9B\u0323", U"\u1E9B\u0323");
    EXPECT_NFC(U"\u0387", U"\u00B7");
}

TEST(Nfc, StartersThatComposeWithThePreviousOne) {
    EXPECT_NFC(U"\u09C7\u09BE", U"\u09CB");             // Bengali o
    EXPECT_NFC(U"\u0B47\u0B3E", U"\u0B4B");
    EXPECT_NFC(U"\u0B47\u0B56", U"\u0B48");
    EXPECT_NFC(U"\u0BC6\u0BBE", U"\u0BCA");
    EXPECT_NFC(U"\u0DD9\u0DCF\u0DCA", U"\u0DDD");       // two steps
    EXPECT_NFC(U"\u0DD9\u0DCA\u0DCF", U"\u0DDA\u0DCF");
    EXPECT_NFC(U"\u1025\u102E", U"\u1026");
    EXPECT_NFC(U"\u0995\u09BE", U"\u0995\u09BE");       // common Bengali text: unchanged
    EXPECT_NFC(U"\u09BE", U"\u09BE");
    EXPECT_NFC(U"\u09C7\u09BC\u09BE", U"\u09C7\u09BC\u09BE");  // blocked by a mark
    EXPECT_TRUE(unicode::nfc_quick_check(u8(U"\u0995\u09BE\u0995\u09BF")));
    EXPECT_FALSE(unicode::nfc_quick_check(u8(U"\u09C7\u09BE")));
}

TEST(Nfc, FastPathKeepsTheInput) {
    std::string buf;
    for (std::string s : {std::string("Hello, world! The quick brown fox."), std::string(),
                          u8(U"caf\u00E9 \u6771\u4EAC \uD55C\uAD6D\uC5B4 \U0001F600 \u0995\u09BE"),
                          std::string(1000, 'x') + "\xFF" + std::string(100, ' ')}) {
        const std::string_view r = unicode::nfc(s, buf);
        EXPECT_EQ(r.data(), s.data());
        EXPECT_EQ(r.size(), s.size());
        EXPECT_TRUE(unicode::nfc_quick_check(s));
    }
    // A change in the middle of long text keeps the text around it.
    const std::string prose(5000, 'a');
    const std::string s = prose + u8(U"e\u0301") + prose;
    EXPECT_EQ(nfc(s), prose + u8(U"\u00E9") + prose);
}

TEST(Nfc, InvalidUtf8IsKeptAndComposesWithNothing) {
    EXPECT_EQ(hex(nfc("\xFF" "e\xCC\x81\xE4")), hex("\xFF\xC3\xA9\xE4"));
    EXPECT_EQ(hex(nfc("e\xFF\xCC\x81")), hex("e\xFF\xCC\x81"));   // not across the bad byte
    EXPECT_EQ(hex(nfc("\xCC\x81\x80\xCC\xA3")), hex("\xCC\x81\x80\xCC\xA3"));
    EXPECT_EQ(hex(nfc("\xE1\x84\x80\xE1\x85")), hex("\xE1\x84\x80\xE1\x85"));  // truncated V jamo
    EXPECT_EQ(hex(nfc("\xED\xA0\x80\xCC\x81")), hex("\xED\xA0\x80\xCC\x81"));  // surrogate bytes
    // Random bytes and random mixes: no crash; valid output for valid input,
    // idempotent, and the result passes the quick check or is stable anyway.
    std::mt19937 rng(1234);
    const std::vector<std::string> atoms = {"a", "e", " ", "\xCC\x81", "\xCC\xA3", "\xCC\x88", "\xE1\x84\x80",
                                            "\xE1\x85\xA1", "\xE1\x86\xA8", "\xEA\xB0\x80", "\xE0\xA7\x87",
                                            "\xE0\xA6\xBE", "\xCD\x84", "\xE2\x84\xAB", "\xFF", "\x80", "\xE1",
                                            "\xCE\xB1", "\xCD\x85", "\xE0\xBD\xB3"};
    for (int t = 0; t < 20000; ++t) {
        std::string s;
        const int n = static_cast<int>(rng() % 40);
        for (int k = 0; k < n; ++k) {
            if (rng() % 8 == 0)
                s += static_cast<char>(rng() & 0xFF);
            else
                s += atoms[rng() % atoms.size()];
        }
        const std::string once = nfc(s);
        EXPECT_EQ(nfc(once), once) << hex(s);
        if (unicode::utf8_valid(s)) EXPECT_TRUE(unicode::utf8_valid(once)) << hex(s);
    }
}

TEST(Nfc, LongRunsOfMarks) {
    std::string s = "a";
    std::mt19937 rng(5);
    const char32_t marks[] = {0x301, 0x323, 0x334, 0x345, 0x5B4, 0x302, 0x0E49};
    std::u32string m;
    for (int k = 0; k < 100000; ++k) m += marks[rng() % std::size(marks)];
    s += u8(m);
    const std::string once = nfc(s);
    EXPECT_EQ(nfc(once), once);
    EXPECT_LE(once.size(), s.size());
    // Classes are in order in the result.
    uint8_t last = 0;
    bool ordered = true;
    for (size_t i = 0; i < once.size();) {
        const auto c = unicode::utf8_decode(once, i);
        const uint8_t cc = unicode::combining_class(c.cp);
        if (cc != 0 && cc < last) ordered = false;
        last = cc;
        i += c.len;
    }
    EXPECT_TRUE(ordered);
}

TEST(Nfc, Tables) {
    EXPECT_EQ(unicode::combining_class('a'), 0);
    EXPECT_EQ(unicode::combining_class(0x301), 230);
    EXPECT_EQ(unicode::combining_class(0x323), 220);
    EXPECT_EQ(unicode::combining_class(0x334), 1);
    EXPECT_EQ(unicode::combining_class(0x345), 240);
    EXPECT_EQ(unicode::combining_class(0x3099), 8);
    // Unicode 9, as Hugging Face tokenizers: marks added later have class 0.
    EXPECT_EQ(unicode::combining_class(0x1E944), 230);  // Adlam (9.0)
    EXPECT_EQ(unicode::combining_class(0x07FD), 0);     // 11.0
    EXPECT_EQ(unicode::combining_class(0x1E130), 0);    // 12.0
    EXPECT_EQ(unicode::nfc_compose_pair('e', 0x301), 0xE9u);
    EXPECT_EQ(unicode::nfc_compose_pair(0x915, 0x93C), 0u);  // excluded
    EXPECT_EQ(unicode::nfc_compose_pair(0x1100, 0x1161), 0xAC00u);
    EXPECT_EQ(unicode::nfc_compose_pair(0xAC00, 0x11A8), 0xAC01u);
    EXPECT_EQ(unicode::nfc_compose_pair(0xAC01, 0x11A8), 0u);
    EXPECT_EQ(unicode::nfc_compose_pair(0xAC00, 0x11A7), 0u);
}

TEST(Nfc, NormalizerStep) {
    Normalizer n({NormStep::nfc()});
    std::string buf;
    EXPECT_EQ(n.apply(u8(U"e\u0301"), buf), u8(U"\u00E9"));
    const std::string plain = "plain text";
    EXPECT_EQ(n.apply(plain, buf).data(), plain.data());
    // After a step that wrote into buf.
    Normalizer m({NormStep::replace("x", "e"), NormStep::nfc(), NormStep::prepend(">")});
    EXPECT_EQ(m.apply(u8(U"x\u0301x"), buf), u8(U">\u00E9e"));
    EXPECT_EQ(gguf_bpe_normalizer("qwen2", "qwen2").size(), 1u);
    EXPECT_EQ(gguf_bpe_normalizer("gpt2", "gptneox").size(), 1u);
    EXPECT_TRUE(gguf_bpe_normalizer("gpt2", "gpt2").empty());
    EXPECT_TRUE(gguf_bpe_normalizer("llama3", "gptneox").empty());
}

TEST(Nfc, GgufFamilies) {
    const std::filesystem::path dir = std::filesystem::path(QUERN_TESTDATA_DIR) / "vocab";
    if (!std::filesystem::exists(dir / "ggml-vocab-gpt-neox.gguf")) GTEST_SKIP() << "no test vocabularies";
    const std::string composed = u8(U"caf\u00E9 \uAC01"), decomposed = u8(U"cafe\u0301 \u1100\u1161\u11A8");
    {
        auto t = Tokenizer::from_gguf(GgufFile((dir / "ggml-vocab-gpt-neox.gguf").string()));
        EXPECT_EQ(t->encode(decomposed, false, false), t->encode(composed, false, false));
    }
    {
        auto t = Tokenizer::from_gguf(GgufFile((dir / "ggml-vocab-gpt-2.gguf").string()));
        EXPECT_NE(t->encode(decomposed, false, false), t->encode(composed, false, false));
        VocabData d = Tokenizer::vocab_from_gguf(GgufFile((dir / "ggml-vocab-gpt-2.gguf").string()));
        d.pre = "qwen2";
        Tokenizer q(std::move(d));
        EXPECT_EQ(q.encode(decomposed, false, false), q.encode(composed, false, false));
    }
}
