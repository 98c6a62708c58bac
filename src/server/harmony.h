// gpt-oss's output in OpenAI's harmony format, split as the chat API returns
// it. The model writes messages, each a header and a body:
//
//   <|channel|>analysis<|message|>REASONING<|end|>
//   <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>ARGS<|call|>
//   <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>
//
// (the recipient may also follow the channel: "<|channel|>commentary
// to=functions.NAME <|constrain|>json"). The analysis channel is reasoning,
// a message to functions.NAME a tool call whose arguments stream as they come,
// final and commentary without a recipient the answer. The markers are
// special tokens: the detokenizer must write them (Generation does for
// models whose template speaks harmony). Text with no harmony header at all
// is the answer, as written.
#pragma once
#include <functional>
#include <string>
#include <string_view>

#include "server/chat_output.h"

namespace quern::server {

class HarmonyParser {
public:
    /// `calls`: messages to functions.* are tool calls (else they stay
    /// content); `new_id` names each call.
    HarmonyParser(bool calls, std::function<std::string()> new_id);
    ChatDelta push(std::string_view text);
    /// The end of the text: what was held back; an open call ends.
    ChatDelta finish();

private:
    enum class Dest { Reasoning, Content, Call };
    /// The header (the text before <|message|>) decides where the body goes.
    void open(ChatDelta& d, std::string_view header);
    void body(ChatDelta& d, std::string_view text);
    void close(ChatDelta& d);

    bool calls_;
    std::function<std::string()> new_id_;
    bool in_body_ = false;
    bool seen_header_ = false;  // some <|message|> came: unstructured text is not the whole answer
    Dest dest_ = Dest::Content;
    std::string held_;  // text that may begin a marker, or a header still open
    int n_calls_ = 0;
};

}  // namespace quern::server
