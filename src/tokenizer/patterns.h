// Pre-tokenizer regexes of the model families, as written in each family's
// tokenizer.json pre_tokenizer section (PCRE2 syntax). Shared by the
// pipeline (pretokenizer.cpp) and the hand-written matchers (fast_regex.cpp),
// which are chosen by exact pattern string.
#pragma once

namespace quern::patterns {

// GPT-2 ByteLevel(use_regex=true).
inline constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Llama 3 (tiktoken cl100k style; numbers in groups of up to three).
inline constexpr const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen2 (like Llama 3 but every digit on its own).
inline constexpr const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen3.5 / Qwen3.6: Qwen2's with combining marks (\p{M}) kept in letter
// runs rather than split off as punctuation.
inline constexpr const char* kQwen35 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-4o's o200k (o200k_harmony: gpt-oss; Llama 4): letter runs split by case
// (upper then lower, contractions kept), numbers in groups of up to three,
// punctuation runs taking trailing newlines and slashes.
inline constexpr const char* kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// DeepSeek LLM: a sequence of Split steps, then individual digits. Its
// classes are enumerated code point ranges; they are written as \x{...}
// escapes so no editor or tool can change them by Unicode normalization
// (several, e.g. U+1FD3, U+212A, normalize to other code points).
inline constexpr const char* kDeepseekLlmLetters =
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
inline constexpr const char* kDeepseekLlmPunct =
    R"(\s?[\x{21}-\x{2F}\x{3A}-\x{7E}\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-)"
    R"(\x{3002}]+)";
inline constexpr const char* kDeepseekCjk =
    R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";

// DeepSeek V3.
inline constexpr const char* kDeepseek3Main =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Falcon: Punctuation(Contiguous) (Unicode P plus ASCII punctuation), then the
// GPT-2 regex; after the byte mapping, Digits(contiguous) and 3-digit groups.
// Hugging Face's Punctuation pre-tokenizer (ASCII punctuation or Unicode P);
// its Unicode table is older than the regex engine's (see fast_regex.cpp), so
// the pattern carries a comment that names it for the hand-written matcher.
inline constexpr const char* kFalconPunct = R"([\p{P}\$\+<=>\^~\|`]+(?#hf-punctuation))";
inline constexpr const char* kPunctOne = R"([\p{P}\$\+<=>\^~\|`](?#hf-punctuation))";

// Single-step splits used by several families.
// Hugging Face's Digits pre-tokenizer (Rust char::is_numeric, whose Unicode
// version is newer again than the regex engine's; see fast_regex.cpp).
inline constexpr const char* kDigit = R"(\p{N}(?#hf-digits))";     // Digits(individual_digits=true)
inline constexpr const char* kDigitRun = R"(\p{N}+(?#hf-digits))";  // Digits(individual_digits=false)
inline constexpr const char* kDigits1to3 = R"(\p{N}{1,3})";  // DeepSeek V3 numbers
inline constexpr const char* kThreeAsciiDigits = R"([0-9][0-9][0-9])";
inline constexpr const char* kCrLf = R"([\r\n])";
inline constexpr const char* kSpaceLetters = R"(\s?\p{L}+)";
inline constexpr const char* kSpacePunct = R"(\s?\p{P}+)";
inline constexpr const char* kTrailingSpace = R"(\s+$)";
inline constexpr const char* kDeepseek3Cjk = R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)";

}  // namespace quern::patterns
