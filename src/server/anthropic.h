// The Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens)
// over the same generation as the OpenAI chat API: a Messages body becomes a
// chat ApiRequest (system prompt, content blocks — text, tool_use,
// tool_result, thinking — tools with input_schema, tool_choice, thinking
// on/off), and the generated parts (reasoning, text, tool calls) become
// Anthropic's content blocks, streamed as its event sequence:
//   message_start, then per block content_block_start / content_block_delta
//   (thinking_delta, text_delta, input_json_delta) / content_block_stop,
//   message_delta (stop_reason, usage), message_stop.
// Errors come as {"type": "error", "error": {"type", "message"}}. No I/O.
#pragma once
#include <string>
#include <vector>

#include "server/api.h"

namespace quern::server {

/// Validates a /v1/messages (or count_tokens) body into a chat request;
/// throws ApiError 400 naming the field. `count_only`: max_tokens may be
/// absent (count_tokens).
ApiRequest parse_messages_request(const Json& body, int32_t n_vocab, const SamplingParams& defaults,
                                  bool count_only = false);

/// Anthropic's error body for an HTTP status.
Json anthropic_error_json(int status, const std::string& message);

/// stop_reason of a finished choice: end_turn, max_tokens, stop_sequence, tool_use.
std::string anthropic_stop_reason(const ChoiceResult& c);

/// The non-streamed response: {"id", "type": "message", "role", "model",
/// "content": [thinking?, text?, tool_use...], "stop_reason",
/// "stop_sequence", "usage"}.
Json messages_response_json(const ResponseMeta& m, const ChoiceResult& c, const Usage& u);

/// The events of one streamed message, as SSE text ("event: NAME\ndata:
/// JSON\n\n"), one block open at a time.
class AnthropicStream {
public:
    explicit AnthropicStream(ResponseMeta m) : m_(std::move(m)) {}
    std::string start(int64_t input_tokens);
    std::string delta(const ChatDelta& d);
    std::string finish(const ChoiceResult& c, const Usage& u);

private:
    enum class Block { None, Thinking, Text, Tool };
    std::string event(const char* name, const Json& data) const;
    std::string open(Block b);
    std::string close();
    ResponseMeta m_;
    Block block_ = Block::None;
    int index_ = -1;
};

}  // namespace quern::server
