// Text normalizers applied to each run of text between special tokens before
// pre-tokenization, with the semantics of the Hugging Face normalizers of the
// same names. Supported: Prepend, Replace (string or regex), Strip, NFC (see
// below); tokenizer.json files with other normalizers are rejected at load.
//
// NFC is accepted but applied as the identity: quern carries no Unicode
// composition tables, so text that is not already in NFC (decomposed accents,
// e.g. "e\u0301") can tokenize differently from Hugging Face for the models
// that declare NFC (GPT-NeoX, Qwen2). Text in NFC, which is nearly all text,
// is unaffected.
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
