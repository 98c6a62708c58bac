// Streaming detokenizer: token ids in, UTF-8-safe text chunks out.
#pragma once
#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace quern {

/// Turns a stream of token ids into text chunks that never end inside a UTF-8
/// character: bytes of an incomplete (but so far valid) sequence are held back
/// until the sequence completes. Invalid bytes are passed through, never
/// dropped. The concatenation of every push() and the final flush() equals
/// Tokenizer::decode() of the same ids.
class Detokenizer {
public:
    /// `tok` must outlive the detokenizer.
    explicit Detokenizer(const Tokenizer& tok, bool render_special = true)
        : tok_(&tok), render_special_(render_special) {}

    /// Adds one token; returns the text that is now safe to emit (may be empty).
    std::string push(int32_t id);
    /// Returns whatever is still held back (possibly an incomplete sequence)
    /// and resets the stream for reuse.
    std::string flush();
    /// Bytes currently held back.
    size_t pending() const { return held_.size(); }

private:
    const Tokenizer* tok_;
    bool render_special_;
    DecodeState state_;
    std::string held_;
};

}  // namespace quern
