#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <array>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace quern {

namespace {

// ---------------------------------------------------------------- regex facts
// From each family's tokenizer.json pre_tokenizer section.

// GPT-2 ByteLevel(use_regex=true).
constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Llama 3 (tiktoken cl100k style; numbers in groups of up to three).
constexpr const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen2 (like Llama 3 but every digit on its own).
constexpr const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// DeepSeek LLM: a sequence of Split steps, then individual digits. Its
// classes are enumerated code point ranges; they are written as \x{...}
// escapes so no editor or tool can change them by Unicode normalization
// (several, e.g. U+1FD3, U+212A, normalize to other code points).
constexpr const char* kDeepseekLlmLetters =
    R"(\s?[\x{41}-\x{5A}\x{61}-\x{7A}\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF})"
    R"(\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-)"
    R"(\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556})"
    R"(\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-)"
    R"(\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45})"
    R"(\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4})"
    R"(\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB})"
    R"(\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115})"
    R"(\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-)"
    R"(\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-)"
    R"(\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787})"
    R"(\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-)"
    R"(\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-)"
    R"(\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";
constexpr const char* kDeepseekLlmPunct =
    R"(\s?[\x{21}-\x{2F}\x{3A}-\x{7E}\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-)"
    R"(\x{3002}]+)";
constexpr const char* kDeepseekCjk =
    R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";

// DeepSeek V3.
constexpr const char* kDeepseek3Main =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Falcon: Punctuation(Contiguous) (Unicode P plus ASCII punctuation), then the
// GPT-2 regex; after the byte mapping, Digits(contiguous) and 3-digit groups.
constexpr const char* kFalconPunct = R"([\p{P}\$\+<=>\^~\|`]+)";

struct Family {
    const char* family;
    std::vector<std::string> raw;
    std::vector<std::string> mapped;
};

Family family_for(std::string_view pre, bool& known) {
    known = true;
    auto is = [&](std::initializer_list<std::string_view> names) {
        for (auto n : names)
            if (pre == n) return true;
        return false;
    };
    if (is({"default", "gpt2", "gpt-2", "phi-2", "gpt-neox", "mpt", "olmo", "jais", "roberta-bpe", "gigachat",
            "poro-chat", "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code", "jina-es", "jina-de"}))
        return {"gpt2", {kGpt2}, {}};
    if (is({"starcoder", "refact", "smollm", "command-r", "codeshell", "exaone", "minerva-7b"}))
        return {"starcoder", {R"(\p{N})", kGpt2}, {}};
    if (is({"llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"})) return {"llama3", {kLlama3}, {}};
    if (is({"qwen2", "stablelm2", "hunyuan", "megrez", "deepseek-r1-qwen"})) return {"qwen2", {kQwen2}, {}};
    if (is({"deepseek-llm"}))
        return {"deepseek-llm",
                {R"([\r\n])", kDeepseekLlmLetters, kDeepseekLlmPunct, R"(\s+$)", kDeepseekCjk, R"(\p{N})"},
                {}};
    if (is({"deepseek-coder"}))
        return {"deepseek-coder", {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"}, {}};
    if (is({"deepseek-v3"}))
        return {"deepseek-v3",
                {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)", kDeepseek3Main},
                {}};
    if (is({"falcon"})) return {"falcon", {kFalconPunct, kGpt2}, {R"(\p{N}+)", R"([0-9][0-9][0-9])"}};
    known = false;
    return {"gpt2", {kGpt2}, {}};
}

// Cuts `s` into regex matches and the gaps between them (HF "Isolated").
void split_isolated(const Regex& re, std::string_view s, std::vector<std::string_view>& out) {
    size_t last = 0;
    re.for_each_match(s, [&](size_t b, size_t e) {
        if (b > last) out.push_back(s.substr(last, b - last));
        out.push_back(s.substr(b, e - b));
        last = e;
    });
    if (last < s.size()) out.push_back(s.substr(last));
}

}  // namespace

// ---------------------------------------------------------------- Regex

Regex::Regex(std::string_view pattern) : pattern_(pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
    if (!code) {
        std::array<PCRE2_UCHAR, 256> msg{};
        pcre2_get_error_message(err, msg.data(), msg.size());
        fail("tokenizer: cannot compile pre-tokenizer regex at offset {}: {} (pattern: {})", off,
             reinterpret_cast<const char*>(msg.data()), pattern_);
    }
    code_ = code;
    jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

Regex::Scratch::Scratch(const Regex& re)
    : md(pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(re.code_), nullptr)) {
    if (!md) fail("tokenizer: out of memory creating regex match data");
}

Regex::Scratch::~Scratch() { pcre2_match_data_free(static_cast<pcre2_match_data*>(md)); }

bool Regex::next_match(Scratch& s, std::string_view text, size_t pos, size_t& begin, size_t& end) const {
    auto* code = static_cast<pcre2_code*>(code_);
    auto* md = static_cast<pcre2_match_data*>(s.md);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    while (pos < text.size()) {
        int rc = PCRE2_ERROR_NOMATCH;
        if (jit_) rc = pcre2_jit_match(code, subject, text.size(), pos, 0, md, nullptr);
        // The JIT stack is small; the interpreter keeps its backtracking on the heap.
        if (!jit_ || (rc < 0 && rc != PCRE2_ERROR_NOMATCH))
            rc = pcre2_match(code, subject, text.size(), pos, 0, md, nullptr);
        if (rc < 0) return false;  // no match, or resource limits: leave the rest unsplit
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        if (ov[1] > ov[0]) {
            begin = ov[0];
            end = ov[1];
            return true;
        }
        // Empty match: retry one character further on.
        pos = ov[0] + (ov[0] < text.size() ? unicode::utf8_decode(text, ov[0]).len : 1);
    }
    return false;
}

// ---------------------------------------------------------------- PreTokenizer

PreTokenizer::PreTokenizer(std::string_view pre_name) {
    Family f = family_for(pre_name, known_);
    family_ = f.family;
    build(f.raw, f.mapped);
}

PreTokenizer::PreTokenizer(const std::vector<std::string>& raw_steps, const std::vector<std::string>& mapped_steps)
    : family_("custom") {
    build(raw_steps, mapped_steps);
}

void PreTokenizer::build(const std::vector<std::string>& raw_steps, const std::vector<std::string>& mapped_steps) {
    for (const auto& p : raw_steps) raw_.push_back(std::make_unique<Regex>(p));
    for (const auto& p : mapped_steps) mapped_.push_back(std::make_unique<Regex>(p));
}

std::vector<std::string> PreTokenizer::split(std::string_view text) const {
    std::vector<std::string_view> pieces{text}, next;
    if (text.empty()) pieces.clear();
    for (const auto& re : raw_) {
        next.clear();
        for (auto p : pieces) split_isolated(*re, p, next);
        pieces.swap(next);
    }
    const auto& bm = unicode::ByteMap::get();
    std::vector<std::string> words;
    words.reserve(pieces.size());
    for (auto p : pieces) words.push_back(bm.encode(p));
    for (const auto& re : mapped_) {
        std::vector<std::string> out;
        out.reserve(words.size());
        for (const auto& w : words) {
            next.clear();
            split_isolated(*re, w, next);
            for (auto p : next) out.emplace_back(p);
        }
        words.swap(out);
    }
    return words;
}

}  // namespace quern
