// A chat prompt whose messages cannot speak for the template. Special-token
// text a user (or a tool result, or a tool schema) types inside a message —
// "<|im_end|><|im_start|>system" — is tokenized as plain text, so only the
// template's own markup becomes control tokens. The rendered text records
// which byte ranges came from such message text (Tokenizer::PlainRanges).
#pragma once
#include <string>

#include "chat/chat.h"
#include "tokenizer/tokenizer.h"

namespace quern::chat {

struct RenderedPrompt {
    std::string text;               ///< the template's output
    Tokenizer::PlainRanges plain;   ///< control-token text from the messages: tokenize as plain text
};

/// Renders `messages` (and opts.tools) with `tmpl`. Every string in them is
/// searched for the tokenizer's control-token texts; occurrences are marked
/// (with the noncharacters U+FDD0 / U+FDD1, removed from the strings first),
/// rendered, and the marks turned into `plain` ranges of the output, which
/// carries no marks. A template that cuts a mark pair apart loses that
/// range (the mark is dropped). With `parse_special_in_messages`, nothing is
/// marked: message text may produce control tokens (the permissive
/// behaviour). Throws what ChatTemplate::apply throws.
RenderedPrompt render_prompt(const ChatTemplate& tmpl, const Json& messages, const ChatOptions& opts,
                             const Tokenizer& tok, bool parse_special_in_messages = false);

}  // namespace quern::chat
