// Tokenizers built from GGUF vocabularies (tokenizer.ggml.* keys) or from
// Hugging Face tokenizer.json files.
//
// Three models are supported:
//   - Bpe:    byte-level BPE. Text is split by a pre-tokenizer (the regexes
//             of `tokenizer.ggml.pre`, or the tokenizer.json pipeline; see
//             pretokenizer.h), each word is merged by merge rank.
//   - Spm:    SentencePiece ("llama" GGUF model). Spaces become U+2581 "▁",
//             a dummy "▁" prefix is added (add_space_prefix), symbols are
//             merged greedily by the score of the merged piece, and
//             characters outside the vocabulary fall back to <0xNN> byte
//             tokens (or <unk>).
//   - SpmBpe: SentencePiece vocabularies as tokenizer.json stores them (Llama,
//             Mistral, Gemma, Phi-3): a normalizer or Metaspace makes the
//             "▁" text, then BPE by merge rank over characters with <0xNN>
//             byte fallback.
//
// Text runs through: special-token split -> normalizer (per run of text) ->
// pre-tokenizer -> model (per word, results cached) -> ids.
//
// Special tokens: tokens of type CONTROL, USER_DEFINED and UNKNOWN are matched
// in the text before the model runs (leftmost, longest first). USER_DEFINED
// tokens (Hugging Face's non-special added tokens) are always matched;
// CONTROL/UNKNOWN ones (<|im_end|>, <s>, ...) only when `parse_special` is
// true; otherwise their text is tokenized as ordinary text. An added token
// may strip the whitespace on its left/right (lstrip/rstrip), as Hugging Face
// does (tokenizer.json flags; Phi-3's from GGUF).
//
// Text that is not valid UTF-8 never throws: byte-level BPE encodes the bytes
// (a byte whose character the vocabulary lacks — SmolLM2 has none for 0xC0,
// 0xC1, 0xF5..0xFF, which valid UTF-8 never holds — is dropped), SentencePiece
// uses a byte token per invalid byte.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenizer.h"

namespace quern {

class GgufFile;
class BpeModel;
class SpmModel;
class PieceMap;

/// Token types as stored in tokenizer.ggml.token_type.
enum class TokenType : int32_t {
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    Control = 3,
    UserDefined = 4,
    Unused = 5,
    Byte = 6,
};

/// The tokenizer model family (see the file comment).
enum class VocabKind { Bpe, Spm, SpmBpe };

/// Matching options of an added (special or user-defined) token.
struct AddedTokenFlags {
    bool lstrip = false;       // swallow whitespace just before the token
    bool rstrip = false;       // swallow whitespace just after the token
    bool single_word = false;  // match only when not inside a word
};

/// Everything a Tokenizer is built from; vocab_from_gguf and
/// vocab_from_hf_json fill it, tests may fill it directly. Ids that are
/// absent or out of range are -1.
struct VocabData {
    VocabKind kind = VocabKind::Bpe;
    std::string pre = "default";            // tokenizer.ggml.pre (BPE without pre_steps)
    std::string arch;                       // general.architecture (GGUF; implies NFC for gptneox)
    std::vector<std::string> tokens;        // token text (byte characters for BPE)
    std::vector<float> scores;              // SPM merge scores (may be empty)
    std::vector<TokenType> types;           // may be empty: all Normal
    std::vector<std::string> merges;        // BPE merges "left right", by rank
    std::vector<std::pair<std::string, std::string>> merge_pairs;  // or as pairs (used when not empty)
    int32_t bos = -1, eos = -1, unk = -1, pad = -1, eot = -1, eom = -1;
    bool add_bos = false;
    bool add_eos = false;
    /// SPM: a "▁" is prepended to each run of text (GGUF), and decoding drops
    /// the leading space of the text. Byte-level BPE: a space is prepended
    /// to the input.
    bool add_space_prefix = false;

    // Set by tokenizer.json loading (an explicit pipeline instead of the
    // GGUF conventions above).
    bool explicit_pipeline = false;
    std::vector<NormStep> normalizer;
    std::vector<PreStep> pre_steps;
    bool byte_fallback = false;
    bool fuse_unk = false;
    bool ignore_merges = false;
    std::unordered_map<int32_t, AddedTokenFlags> added_flags;
    std::vector<int32_t> extra_eog;  // more end-of-generation ids (generation_config.json)
};

/// State carried between pieces while decoding (the SentencePiece dummy-prefix
/// space is removed from the first piece of the text only).
struct DecodeState {
    bool at_start = true;
};

/// A text <-> token-id converter. Immutable after construction and safe to use
/// from several threads at once.
class Tokenizer {
public:
    /// Builds from prepared vocabulary data; throws quern::Error if it is
    /// inconsistent (empty vocabulary, size mismatches).
    explicit Tokenizer(VocabData data);
    ~Tokenizer();
    Tokenizer(const Tokenizer&) = delete;
    Tokenizer& operator=(const Tokenizer&) = delete;

    /// Reads the tokenizer.ggml.* keys of a GGUF file. Throws quern::Error
    /// naming the key when one is missing or malformed, or for an unsupported
    /// tokenizer model.
    static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& f);
    /// Builds VocabData from the tokenizer.ggml.* keys (no validation beyond types).
    static VocabData vocab_from_gguf(const GgufFile& f);

    /// Reads a Hugging Face tokenizer.json (text), with the optional
    /// tokenizer_config.json / generation_config.json texts ("" when absent)
    /// for add_bos/add_eos, the special tokens and end-of-generation ids.
    /// `where` names the source in error messages, `config_where` and
    /// `generation_where` the other two files (their paths, from from_file).
    /// Throws quern::Error for malformed JSON, and for an eos_token_id that is
    /// not a token id or a list of them.
    static VocabData vocab_from_hf_json(std::string_view tokenizer_json, std::string_view tokenizer_config_json,
                                        std::string_view generation_config_json, const std::string& where,
                                        const std::string& config_where = "tokenizer_config.json",
                                        const std::string& generation_where = "generation_config.json");
    /// Loads a tokenizer from a GGUF file, a tokenizer.json file, or a folder
    /// holding tokenizer.json (and tokenizer_config.json etc.).
    static std::unique_ptr<Tokenizer> from_file(const std::string& path);

    /// Byte ranges [begin, end) of a text, sorted and disjoint, where control
    /// token text stays plain text even with parse_special (the message
    /// contents of a rendered chat prompt: chat::render_prompt).
    using PlainRanges = std::vector<std::pair<size_t, size_t>>;

    /// Text to ids. `add_special` adds BOS/EOS as add_bos/add_eos say;
    /// `parse_special` lets CONTROL token text in `text` become those tokens,
    /// except where it overlaps one of `plain`.
    std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special,
                                const PlainRanges* plain = nullptr) const;
    /// A prompt's ids, by the one rule every command follows (run, chat,
    /// serve, template's --tokens): encode(text, no specials, parse_special)
    /// with BOS in front where the model adds one (add_bos), unless the text
    /// already begins with it — then not twice, as transformers does, and
    /// *bos_in_text is set (callers warn). Never EOS.
    std::vector<int32_t> encode_prompt(std::string_view text, bool parse_special, bool* bos_in_text = nullptr,
                                       const PlainRanges* plain = nullptr) const;
    /// Where control and unknown token text stands in `text` (what
    /// parse_special would turn into those tokens; longest match first, no
    /// overlaps), sorted.
    PlainRanges control_spans(std::string_view text) const;

    /// Raw bytes the token stands for: byte characters mapped back to bytes
    /// (BPE); "▁" -> space and <0xNN> -> that byte (SPM). Control and unknown
    /// tokens give their text when `render_special`, else nothing. Out-of-range
    /// ids give an empty string.
    std::string token_to_piece(int32_t id, bool render_special = true) const;

    /// Concatenated pieces. For SPM with add_space_prefix the dummy-prefix
    /// space of the first text piece is removed, so decode(encode(s)) == s.
    std::string decode(const std::vector<int32_t>& ids, bool render_special = true) const;
    /// Appends one token's piece to `out`, updating `st` (used by decode and
    /// the streaming Detokenizer so both give identical bytes).
    void append_piece(std::string& out, int32_t id, DecodeState& st, bool render_special = true) const;

    int32_t bos() const { return d_.bos; }
    int32_t eos() const { return d_.eos; }
    int32_t unk() const { return d_.unk; }
    int32_t pad() const { return d_.pad; }
    bool add_bos() const { return d_.add_bos; }
    bool add_eos() const { return d_.add_eos; }
    VocabKind kind() const { return d_.kind; }
    /// True for Spm and SpmBpe ("▁" for spaces, <0xNN> byte tokens).
    bool spm_like() const { return d_.kind != VocabKind::Bpe; }
    /// The pre-tokenizer family in use for BPE ("gpt2", "llama3", ...,
    /// "custom" for a tokenizer.json pipeline), "" when there is none.
    std::string pre_family() const;

    /// End of generation: eos, eot, eom, and control tokens such as
    /// <|im_end|>, <|endoftext|>, <|eot_id|>, <end_of_turn> present in the vocab.
    bool is_eog(int32_t id) const;
    /// Control / user-defined / unknown tokens (not ordinary text).
    bool is_special(int32_t id) const;

    const std::vector<int32_t>& eog_ids() const { return eog_; }

    int32_t n_vocab() const { return static_cast<int32_t>(d_.tokens.size()); }
    /// The id of a token by its stored text (byte characters for BPE).
    std::optional<int32_t> token_id(std::string_view piece) const;
    /// The stored text of a token (byte characters for BPE); "" when out of range.
    const std::string& token_text(int32_t id) const;
    TokenType token_type(int32_t id) const;
    /// Empties the models' word caches (for benchmarks of the uncached path).
    void clear_caches() const;

private:
    struct StringHash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    using TextMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;
    struct Scratch;

    /// A run of plain text or one matched special token.
    struct Fragment {
        std::string_view text;
        int32_t id = -1;  // >= 0 for a special token
        size_t offset = 0;  // where the text starts in the input
    };
    void split_special(std::string_view text, bool parse_special, const PlainRanges* plain,
                       std::vector<Fragment>& frags) const;
    /// Whether a special token may start at text[i] (its first one or two bytes).
    bool may_start_special(std::string_view text, size_t i) const;
    void encode_text(std::string_view text, bool at_input_start, std::vector<int32_t>& out, Scratch& sc) const;
    void encode_piece(std::string_view piece, std::vector<int32_t>& out, Scratch& sc) const;
    void build_models();

    VocabData d_;
    TextMap text_to_id_;
    std::vector<int32_t> specials_;                       // CONTROL + USER_DEFINED + UNKNOWN, longest first
    std::vector<std::vector<int32_t>> specials_by_byte_;  // by first byte, longest first
    std::vector<uint8_t> special_pair_;                   // [b0 * 256 + b1]: a special starts with b0 b1
    std::array<uint8_t, 256> special_single_{};           // a one-byte special is this byte
    std::vector<int32_t> eog_;
    std::vector<std::string> pieces_;                     // decoded bytes of every token
    Normalizer normalizer_;
    std::unique_ptr<PreTokenizer> pre_;
    std::unique_ptr<BpeModel> bpe_;
    std::unique_ptr<SpmModel> spm_;
    bool split_at_marker_ = false;  // SPM text may be cut before each "▁" that follows another character
    std::string empty_;
};

}  // namespace quern
