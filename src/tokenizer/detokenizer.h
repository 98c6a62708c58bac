// Streaming detokenizer: token ids in, UTF-8-safe text chunks out.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace quern {

/// Turns a stream of token ids into text chunks that never end inside a UTF-8
/// character: bytes of an incomplete (but so far valid) sequence are held back
/// until the sequence completes. Invalid bytes are passed through, never
/// dropped.
///
/// `starts_text`: the ids begin a text (not a continuation of a prompt), so
/// the SentencePiece dummy-prefix space of the first piece is removed exactly
/// as Tokenizer::decode() does; then the concatenation of every push() and
/// the final flush() equals decode() of the same ids. Leave it false when
/// streaming generated tokens, whose leading space is real text
/// ("The capital is" + "▁Paris" -> " Paris"). It only matters for SPM
/// vocabularies with add_space_prefix.
class Detokenizer {
public:
    /// `tok` must outlive the detokenizer.
    explicit Detokenizer(const Tokenizer& tok, bool render_special = true, bool starts_text = false)
        : tok_(&tok), render_special_(render_special), starts_text_(starts_text) {
        state_.at_start = starts_text;
    }

    /// Adds one token; returns the text that is now safe to emit (may be empty).
    std::string push(int32_t id);
    /// Adds several tokens at once (same result as pushing them one by one
    /// and concatenating what each push returned).
    std::string push(const std::vector<int32_t>& ids);
    /// Returns whatever is still held back (possibly an incomplete sequence)
    /// and resets the stream for reuse.
    std::string flush();
    /// Bytes currently held back.
    size_t pending() const { return held_.size(); }

private:
    const Tokenizer* tok_;
    bool render_special_;
    bool starts_text_;
    DecodeState state_;
    std::string held_;
};

}  // namespace quern
