// Text normalizers applied to each run of text between special tokens before
// pre-tokenization, with the semantics of the Hugging Face normalizers of the
// same names. Supported: Prepend, Replace (string or regex), Strip, NFC (see
// below); tokenizer.json files with other normalizers are rejected at load.
//
// NFC is Unicode Normalization Form C with the Unicode 9.0 data of Hugging
// Face `tokenizers` 0.23 (src/tokenizer/unicode_nfc.h); text already in NFC,
// such as all ASCII, passes through a quick check without a copy. Invalid
// UTF-8 bytes are kept as they are. tokenizer.json files declare it (GPT-NeoX,
// Qwen2); GGUF vocabularies imply it as gguf_bpe_normalizer() says.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace quern {

class Regex;

/// One normalizer step.
struct NormStep {
    enum class Kind { Prepend, Replace, ReplaceRegex, Strip, Nfc };
    Kind kind = Kind::Replace;
    std::string a;  // Prepend: text; Replace: pattern; ReplaceRegex: PCRE2 regex
    std::string b;  // Replace / ReplaceRegex: replacement
    bool left = false, right = false;  // Strip

    static NormStep prepend(std::string text);
    static NormStep replace(std::string from, std::string to);
    static NormStep replace_regex(std::string pattern, std::string to);
    static NormStep strip(bool left, bool right);
    static NormStep nfc();
};

/// The normalizer of the Hugging Face tokenizer behind a GGUF byte-level BPE
/// vocabulary with the pre-tokenizer family `family` (PreTokenizer::family())
/// and `general.architecture` `arch`: NFC for the Qwen2 family (qwen2,
/// stablelm2, hunyuan, megrez, deepseek-r1-qwen) and for GPT-NeoX models
/// (arch gptneox with the GPT-2 pre-tokenizer, as EleutherAI's tokenizer.json
/// files), none otherwise. tools/tok_gguf_to_tokenizer_json.py writes the same.
std::vector<NormStep> gguf_bpe_normalizer(std::string_view family, std::string_view arch);

/// A sequence of normalizer steps. Immutable after construction; thread-safe.
class Normalizer {
public:
    Normalizer() = default;
    explicit Normalizer(std::vector<NormStep> steps);
    ~Normalizer();
    Normalizer(Normalizer&&) noexcept;
    Normalizer& operator=(Normalizer&&) noexcept;

    bool empty() const { return steps_.empty(); }
    /// The normalized text: `text` itself (or a part of it) when nothing
    /// changes it, else a view of `buf`.
    std::string_view apply(std::string_view text, std::string& buf) const;
    const std::vector<NormStep>& steps() const { return steps_; }

private:
    std::vector<NormStep> steps_;
    std::vector<std::unique_ptr<Regex>> regexes_;  // per step (null unless ReplaceRegex)
};

}  // namespace quern
