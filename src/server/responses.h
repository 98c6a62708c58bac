// The OpenAI Responses API (POST /v1/responses) over the same generation as
// the chat API: `input` (a string, or items: messages with input_text /
// output_text parts, function_call and function_call_output items, reasoning
// items), `instructions`, function tools, tool_choice auto / none,
// max_output_tokens, `previous_response_id` (the earlier exchange, kept in
// memory, prepended) become a chat request; the generated parts become
// output items (reasoning, message with output_text, function_call), streamed
// as the Responses event sequence (response.created … response.completed,
// each event with its sequence_number). No I/O here.
#pragma once
#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>

#include "server/api.h"

namespace quern::server {

/// Validates a /v1/responses body into a chat request; throws ApiError 400
/// naming the field. `history`: the chat messages of the response named by
/// previous_response_id (null when the body names none; the caller looks it
/// up and answers 404 for an unknown id).
ApiRequest parse_responses_request(const Json& body, int32_t n_vocab, const SamplingParams& defaults,
                                   const Json* history);

/// The output items of a finished choice, with ids made from `id_prefix`.
Json response_output_items(const ChoiceResult& c, const std::string& id_prefix);
/// The response object: status completed (or incomplete at max_output_tokens).
Json response_object_json(const ResponseMeta& m, const ChoiceResult& c, const Usage& u, const Json& output,
                          const std::string& previous_id);
/// The exchange as the chat messages a later request continues from: the
/// request's conversation (ApiRequest::continuation) and the choice.
Json response_history(const Json& continuation, const ChoiceResult& c);

/// Responses kept for previous_response_id: the newest `capacity`, oldest out.
class ResponseStore {
public:
    explicit ResponseStore(size_t capacity = 512) : cap_(capacity) {}
    void put(const std::string& id, Json messages);
    /// A copy of the messages, or null JSON when unknown (or evicted).
    Json get(const std::string& id);

private:
    std::mutex mu_;
    size_t cap_;
    std::list<std::string> order_;
    std::unordered_map<std::string, Json> items_;
};

/// The events of one streamed response, as SSE text ("event: TYPE\ndata:
/// JSON\n\n"), sequence numbers from 0.
class ResponsesStream {
public:
    ResponsesStream(ResponseMeta m, std::string previous_id) : m_(std::move(m)), prev_(std::move(previous_id)) {}
    std::string start();
    std::string delta(const ChatDelta& d);
    std::string finish(const ChoiceResult& c, const Usage& u);

private:
    enum class Item { None, Reasoning, Message, Call };
    std::string event(const std::string& type, Json data);
    std::string open(Item it);
    std::string close();
    ResponseMeta m_;
    std::string prev_;
    int64_t seq_ = 0;
    int index_ = -1;
    Item item_ = Item::None;
    std::string item_id_, text_;
    ToolCall call_;  // the function_call item open
    Json done_ = Json::array();  // finished output items
};

}  // namespace quern::server
