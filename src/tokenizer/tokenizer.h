// Tokenizers built from GGUF vocabularies (tokenizer.ggml.* keys).
//
// Two models are supported:
//   - "gpt2":  byte-level BPE. Text is split by the pre-tokenizer regexes of
//              `tokenizer.ggml.pre` (see pretokenizer.h), each word is mapped
//              to byte characters and merged by `tokenizer.ggml.merges` rank.
//   - "llama": SentencePiece. Spaces become U+2581 "▁", a dummy "▁" prefix is
//              added (add_space_prefix), symbols are merged greedily by the
//              score of the merged piece, and characters outside the
//              vocabulary fall back to <0xNN> byte tokens (or <unk>).
//
// Special tokens: tokens of type CONTROL and USER_DEFINED are matched in the
// text before the model runs (leftmost, longest first). USER_DEFINED tokens
// are always matched (as Hugging Face does for added tokens); CONTROL tokens
// (<|im_end|>, <s>, ...) only when `parse_special` is true; otherwise their
// text is tokenized as ordinary text.
//
// Text that is not valid UTF-8 never throws: byte-level BPE encodes the bytes,
// SentencePiece uses a byte token per invalid byte.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace quern {

class GgufFile;
class PreTokenizer;
class BpeModel;
class SpmModel;

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

/// The tokenizer model family (tokenizer.ggml.model).
enum class VocabKind { Bpe, Spm };

/// Everything a Tokenizer is built from; from_gguf fills it from the GGUF
/// keys, tests and other formats may fill it directly. Ids that are absent or
/// out of range are -1.
struct VocabData {
    VocabKind kind = VocabKind::Bpe;
    std::string pre = "default";            // tokenizer.ggml.pre (BPE only)
    std::vector<std::string> tokens;        // token text (byte characters for BPE)
    std::vector<float> scores;              // SPM merge scores (may be empty)
    std::vector<TokenType> types;           // may be empty: all Normal
    std::vector<std::string> merges;        // BPE merges "left right", by rank
    int32_t bos = -1, eos = -1, unk = -1, pad = -1, eot = -1, eom = -1;
    bool add_bos = false;
    bool add_eos = false;
    bool add_space_prefix = false;
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

    /// Text to ids. `add_special` adds BOS/EOS as add_bos/add_eos say;
    /// `parse_special` lets CONTROL token text in `text` become those tokens.
    std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

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
    /// The pre-tokenizer family in use for BPE ("gpt2", "llama3", ...), "" for SPM.
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

private:
    struct StringHash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    using TextMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

    /// A run of plain text or one matched special token.
    struct Fragment {
        std::string_view text;
        int32_t id = -1;  // >= 0 for a special token
    };
    std::vector<Fragment> split_special(std::string_view text, bool parse_special) const;
    void encode_text(std::string_view text, bool first_fragment, std::vector<int32_t>& out) const;

    VocabData d_;
    TextMap text_to_id_;
    std::vector<int32_t> specials_;                     // CONTROL + USER_DEFINED, longest first
    std::vector<std::vector<int32_t>> specials_by_byte_;  // by first byte, longest first
    std::vector<int32_t> eog_;
    std::unique_ptr<PreTokenizer> pre_;
    std::unique_ptr<BpeModel> bpe_;
    std::unique_ptr<SpmModel> spm_;
    std::string empty_;
};

}  // namespace quern
