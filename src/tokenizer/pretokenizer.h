// Pre-tokenizers for byte-level BPE: split text into words before merging.
//
// A pre-tokenizer is a sequence of regex splits, each with the Hugging Face
// "Isolated" behaviour: every piece from the previous step is cut into the
// regex matches and the text between them, all kept as separate pieces. Steps
// before the byte-level mapping see the raw text; steps after it see the
// byte-character text (this matters for e.g. Falcon's digit splits, which HF
// applies after ByteLevel). The regex strings are those of each model
// family's tokenizer.json pre_tokenizer, compiled with PCRE2 (UTF + UCP, and
// MATCH_INVALID_UTF so text that is not valid UTF-8 is split, never rejected:
// bytes no branch can match become pieces of their own).
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace quern {

/// A compiled PCRE2 pattern (UTF, UCP, JIT when available). Thread-safe to use
/// from several threads at once (match data is per call).
class Regex {
public:
    /// Compiles `pattern`; throws quern::Error with the PCRE2 message on failure.
    explicit Regex(std::string_view pattern);
    ~Regex();
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;

    /// Calls `fn(begin, end)` for each successive non-overlapping match in
    /// `text` (byte offsets). Empty matches are skipped. If the regex engine
    /// gives up (resource limits on huge inputs), the rest is left unmatched.
    template <class Fn>
    void for_each_match(std::string_view text, Fn&& fn) const {
        Scratch scratch(*this);
        size_t pos = 0, b = 0, e = 0;
        while (next_match(scratch, text, pos, b, e)) {
            fn(b, e);
            pos = e;
        }
    }

    const std::string& pattern() const { return pattern_; }

private:
    /// Per-call match data (keeps one Regex usable from several threads).
    struct Scratch {
        explicit Scratch(const Regex& re);
        ~Scratch();
        Scratch(const Scratch&) = delete;
        Scratch& operator=(const Scratch&) = delete;
        void* md = nullptr;  // pcre2_match_data_8*
    };
    /// Finds the first non-empty match at or after `pos`; false when none.
    bool next_match(Scratch& s, std::string_view text, size_t pos, size_t& begin, size_t& end) const;
    std::string pattern_;
    void* code_ = nullptr;  // pcre2_code_8*
    bool jit_ = false;
};

/// The regex pipeline of one `tokenizer.ggml.pre` value.
class PreTokenizer {
public:
    /// Builds the pipeline for a `tokenizer.ggml.pre` name. Unknown names fall
    /// back to the GPT-2 regex; `known()` tells which happened.
    explicit PreTokenizer(std::string_view pre_name);
    /// Builds a pipeline from explicit regex lists (for tests and new families).
    PreTokenizer(const std::vector<std::string>& raw_steps, const std::vector<std::string>& mapped_steps);

    /// Splits `text` into words, each already mapped to byte characters.
    std::vector<std::string> split(std::string_view text) const;

    bool known() const { return known_; }
    /// Name of the regex family in use (e.g. "gpt2", "llama3", "starcoder").
    const std::string& family() const { return family_; }

private:
    void build(const std::vector<std::string>& raw_steps, const std::vector<std::string>& mapped_steps);
    std::vector<std::unique_ptr<Regex>> raw_;
    std::vector<std::unique_ptr<Regex>> mapped_;
    bool known_ = true;
    std::string family_;
};

}  // namespace quern
