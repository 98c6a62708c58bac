// Pre-tokenizers: split (normalized) text into words before the model merges
// each word on its own.
//
// A pre-tokenizer is a pipeline of steps with the semantics of the Hugging
// Face `tokenizers` pre-tokenizers of the same names:
//   - Split:     cut every piece at the matches of a regex; the matches and
//                the text between them become pieces as the behaviour says
//                (Isolated, Removed, MergedWithPrevious/Next, Contiguous).
//   - ByteLevel: optionally prepend a space to each piece, optionally split it
//                with the GPT-2 regex; later steps see the byte-character text
//                (this matters for e.g. Falcon's digit splits, which HF
//                applies after ByteLevel).
//   - Metaspace: replace spaces by "▁", prepend "▁" (always / first piece of
//                the input / never), optionally split before each "▁".
// Pieces are byte ranges of raw (unmapped) text: the byte-level mapping is a
// bijection of bytes, so the model can work on raw bytes directly.
//
// Regexes are PCRE2 (UTF + UCP, MATCH_INVALID_UTF so text that is not valid
// UTF-8 is split, never rejected: bytes no branch can match become pieces of
// their own). The regexes of the known families have hand-written matchers
// for the common case (code points below U+0800, classified by PCRE2's own
// tables), which fall back to PCRE2 for anything else; both give identical
// splits (tested).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace quern {

namespace fastre {
struct Matcher;
}

/// A compiled PCRE2 pattern (UTF, UCP, JIT when available). Thread-safe to use
/// from several threads at once (match data is per call).
class Regex {
public:
    /// Compiles `pattern`; throws quern::Error with the PCRE2 message on failure.
    /// `use_fast`: use a hand-written matcher when one exists for the pattern.
    explicit Regex(std::string_view pattern, bool use_fast = true);
    ~Regex();
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;

    /// Calls `fn(begin, end)` for each successive non-overlapping match in
    /// `text` (byte offsets), as a leftmost-first regex search does; after an
    /// empty match the search resumes one character further on. If the regex
    /// engine gives up (resource limits on huge inputs), the rest is left
    /// unmatched.
    template <class Fn>
    void for_each_match(std::string_view text, Fn&& fn) const {
        Scratch scratch(*this);
        size_t pos = 0, b = 0, e = 0;
        while (pos <= text.size() && next_match(scratch, text, pos, b, e)) {
            fn(b, e);
            pos = e > b ? e : e + step_len(text, e);
        }
    }

    const std::string& pattern() const { return pattern_; }
    /// True when a hand-written matcher serves the common case.
    bool has_fast_path() const { return fast_ != nullptr; }

private:
    /// Per-call match data (keeps one Regex usable from several threads).
    struct Scratch {
        explicit Scratch(const Regex& re);
        ~Scratch();
        Scratch(const Scratch&) = delete;
        Scratch& operator=(const Scratch&) = delete;
        const Regex& re;
        void* md = nullptr;  // pcre2_match_data_8*, created on first use
    };
    /// Finds the first match at or after `pos`; false when none.
    bool next_match(Scratch& s, std::string_view text, size_t pos, size_t& begin, size_t& end) const;
    bool pcre_match(Scratch& s, std::string_view text, size_t pos, size_t& begin, size_t& end) const;
    static size_t step_len(std::string_view text, size_t pos);
    std::string pattern_;
    void* code_ = nullptr;  // pcre2_code_8*
    bool jit_ = false;
    const fastre::Matcher* fast_ = nullptr;
};

/// What a Split step does with the matches (Hugging Face SplitDelimiterBehavior).
enum class SplitBehavior { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous };

/// When Metaspace prepends "▁" (Hugging Face PrependScheme).
enum class PrependScheme { Always, First, Never };

/// One step of a pre-tokenizer pipeline (see the file comment).
struct PreStep {
    enum class Kind { Split, ByteLevel, Metaspace };
    Kind kind = Kind::Split;
    // Split
    std::string pattern;  // PCRE2 syntax
    SplitBehavior behavior = SplitBehavior::Isolated;
    bool invert = false;
    // ByteLevel
    bool add_prefix_space = false;
    bool use_regex = true;
    // Metaspace
    std::string replacement = "\xE2\x96\x81";  // "▁"
    PrependScheme prepend = PrependScheme::Always;
    bool split = true;

    static PreStep regex(std::string pattern, SplitBehavior b = SplitBehavior::Isolated, bool invert = false);
    static PreStep byte_level(bool add_prefix_space = false, bool use_regex = true);
    static PreStep metaspace(PrependScheme prepend, bool split);
};

/// The words of one text: byte ranges into `text()` (which is the input, or
/// an internal buffer when a step changed the text, e.g. added a prefix).
class PreTokenized {
public:
    std::string_view text() const { return text_; }
    size_t size() const { return spans_.size(); }
    std::string_view operator[](size_t i) const { return text_.substr(spans_[i].first, spans_[i].second); }

private:
    friend class PreTokenizer;
    std::string_view text_;
    std::vector<std::pair<size_t, size_t>> spans_;  // offset, length
    std::vector<std::pair<size_t, size_t>> next_;
    std::string buf_[2];
    std::string mapped_;
};

/// A pre-tokenizer pipeline. Immutable after construction; thread-safe.
class PreTokenizer {
public:
    /// The pipeline of a `tokenizer.ggml.pre` name (byte-level BPE). Unknown
    /// names fall back to the GPT-2 regex; `known()` tells which happened.
    explicit PreTokenizer(std::string_view pre_name);
    /// An explicit pipeline (from a tokenizer.json, or for tests).
    explicit PreTokenizer(const std::vector<PreStep>& steps, std::string family = "custom");
    ~PreTokenizer();

    /// Splits `text` into `out` (reused between calls to save allocations).
    /// `at_input_start`: the text begins the whole input (Metaspace "first").
    void split(std::string_view text, bool at_input_start, PreTokenized& out) const;
    /// Convenience: the words as strings (raw bytes).
    std::vector<std::string> split(std::string_view text) const;

    bool known() const { return known_; }
    /// Name of the regex family in use (e.g. "gpt2", "llama3", "starcoder").
    const std::string& family() const { return family_; }
    /// True when a ByteLevel step is part of the pipeline.
    bool byte_level() const { return byte_level_; }
    /// The steps of a family, for tools and tests (empty for unknown names).
    static std::vector<PreStep> family_steps(std::string_view pre_name, std::string* family = nullptr);
    /// Every `tokenizer.ggml.pre` name with a pipeline of its own (by family).
    static std::vector<std::string> known_names();

private:
    struct Compiled;
    void build(const std::vector<PreStep>& steps);
    std::vector<std::unique_ptr<Compiled>> steps_;
    bool known_ = true;
    bool byte_level_ = false;
    std::string family_;
};

}  // namespace quern
