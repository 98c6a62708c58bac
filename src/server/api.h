// The OpenAI API schema: request parsing and validation for
// /v1/chat/completions and /v1/completions, the error shape, and the JSON
// bodies of responses and stream chunks. No I/O here: the HTTP layer
// (server.h) and the generation driver (generation.h) call these.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/sampler.h"
#include "grammar/grammar.h"
#include "server/chat_output.h"

namespace quern::server {

using Json = nlohmann::ordered_json;

/// A request the server refuses, answered as OpenAI's
/// {"error": {"message", "type", "param", "code"}} with `status`.
struct ApiError : std::runtime_error {
    ApiError(int status, std::string message, std::string param = {}, std::string code = {}, std::string type = {});
    int status;
    std::string param;  ///< the offending request field ("" for none)
    std::string code;   ///< a short machine-readable code ("" for none)
    std::string type;   ///< OpenAI's error type (defaults by status)
};

/// The error body for `status` (type defaults by status when empty).
Json error_json(int status, std::string_view message, std::string_view param = {}, std::string_view code = {},
                std::string_view type = {});
inline Json error_json(const ApiError& e) { return error_json(e.status, e.what(), e.param, e.code, e.type); }

/// Serializes a response body; invalid UTF-8 in strings becomes U+FFFD.
std::string dump(const Json& j);

/// Parses a request body: malformed JSON, a non-object top level, or nesting
/// deeper than 64 levels give ApiError 400.
Json parse_body(std::string_view body);

/// Runs a request parser so that nothing but ApiError leaves it: a body
/// that is not an object, or a field of a type the parser did not expect
/// that reached a typed JSON accessor, is a 400, not an internal error.
template <class F>
auto parse_or_400(const Json& body, F&& parse) -> decltype(parse()) {
    if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
    try {
        return parse();
    } catch (const nlohmann::json::exception& e) {
        throw ApiError(400, std::string("a field of the request has the wrong type: ") + e.what());
    }
}

/// Messages: Anthropic's /v1/messages, Responses: OpenAI's /v1/responses,
/// both chat requests (server/anthropic.h, server/responses.h).
enum class Endpoint { Chat, Completions, Messages, Responses };

/// A validated generation request (chat or completions).
struct ApiRequest {
    Endpoint endpoint = Endpoint::Chat;
    std::string model;  ///< as sent ("" when absent)

    // chat: messages normalized for the template (content as one string,
    // "developer" as "system"); tools and chat_template_kwargs passed through
    Json messages;
    Json tools;
    Json template_kwargs = Json::object();
    std::string tool_choice = "auto";  ///< "auto" or "none"
    bool parallel_tool_calls = true;   ///< false: the first tool call ends the choice
    std::optional<bool> parse_reasoning;  ///< reasoning_format: "auto" true, "none" false (<think> stays in the content); unset: the server's
    /// Set by the server from the chat template and the rendered prompt:
    /// what to parse out of the generated text, and whether the prompt left
    /// the model inside a <think> block.
    OutputFormat output;
    bool prompt_in_think = false;
    /// Responses: the conversation without this request's instructions (what
    /// previous_response_id continues from).
    Json continuation;
    /// Constrained decoding: response_format json_object, or a GBNF `grammar`.
    std::shared_ptr<const grammar::Grammar> grammar;

    // completions: one entry per prompt, text or token ids
    std::vector<std::string> prompt_texts;
    std::vector<std::vector<int32_t>> prompt_tokens;

    int n = 1;                  ///< choices per prompt
    int64_t max_tokens = -1;    ///< -1: until the context is full
    SamplingParams sampling;    ///< every field set; seed below
    std::optional<int64_t> seed;
    std::vector<std::string> stop;
    std::vector<std::pair<int32_t, float>> logit_bias;
    int top_logprobs = -1;      ///< -1: no log-probabilities
    bool stream = false;
    bool include_usage = false;
    bool ignore_eos = false;
    std::string user;

    /// Prompts in this request (1 for chat).
    size_t n_prompts() const {
        return endpoint != Endpoint::Completions ? 1 : prompt_texts.size() + prompt_tokens.size();
    }
};

/// OpenAI's sampling defaults: temperature 1, top_p 1, no top-k, min-p or
/// penalties (repeat_last_n and seed are set by the parser).
SamplingParams api_default_sampling();
/// Validates a /v1/chat/completions body; throws ApiError 400 naming the
/// field. `n_vocab` bounds token ids (logit_bias). Sampling fields the body
/// leaves out (or sends as null) take their values from `defaults`
/// (temperature, top_p, top_k, min_p, presence/frequency/repetition penalty).
ApiRequest parse_chat_request(const Json& body, int32_t n_vocab,
                              const SamplingParams& defaults = api_default_sampling());
/// Validates a /v1/completions body (prompt: string, list of strings, token
/// ids or list of token-id lists); `defaults` as for parse_chat_request.
ApiRequest parse_completion_request(const Json& body, int32_t n_vocab,
                                    const SamplingParams& defaults = api_default_sampling());

/// Log-probability of one generated token as the API reports it.
struct TokenLogprob {
    std::string piece;  ///< the token's bytes (may be part of a character)
    float logprob = 0;
    std::vector<std::pair<std::string, float>> top;  ///< alternatives, most likely first
    size_t text_offset = 0;  ///< where the token's text starts in the choice's text
};

/// Token counts of a response.
struct Usage {
    int64_t prompt_tokens = 0;
    int64_t completion_tokens = 0;
    int64_t cached_tokens = 0;
};
Json usage_json(const Usage& u);

/// chat: {"content": [{"token", "logprob", "bytes", "top_logprobs"}]}.
Json chat_logprobs_json(const std::vector<TokenLogprob>& lps);
/// completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}.
Json completion_logprobs_json(const std::vector<TokenLogprob>& lps);

/// One finished choice of a non-streamed response.
struct ChoiceResult {
    int index = 0;
    std::string text;
    std::string finish_reason;
    std::vector<TokenLogprob> logprobs;
    bool want_logprobs = false;
    std::string stop_sequence;         ///< the stop string that ended it ("" for none)
    std::string reasoning;             ///< chat: the <think> text, when parsed out
    std::vector<ToolCall> tool_calls;  ///< chat: parsed tool calls
};

/// What every response and chunk of one request shares.
struct ResponseMeta {
    Endpoint endpoint = Endpoint::Chat;
    std::string id;     ///< chatcmpl-... / cmpl-...
    int64_t created = 0;
    std::string model;
};

/// The non-streamed response body.
Json response_json(const ResponseMeta& m, const std::vector<ChoiceResult>& choices, const Usage& usage);

/// A stream chunk for one choice: `role` (chat, first chunk), `text`,
/// `logprobs` (when wanted), `finish_reason` ("" while running).
/// `usage_null`: include "usage": null (stream_options.include_usage).
Json chunk_json(const ResponseMeta& m, int index, const std::string* role, const std::string& text,
                const std::vector<TokenLogprob>* logprobs, const std::string& finish_reason, bool usage_null);
/// A chat stream chunk of parsed output: delta.reasoning_content,
/// delta.content and delta.tool_calls (OpenAI's shape: a call's first chunk
/// with its id and name, then its arguments as they stream), with
/// `logprobs` when wanted.
Json chat_delta_chunk_json(const ResponseMeta& m, int index, const ChatDelta& d, const std::vector<TokenLogprob>* logprobs,
                           bool usage_null);
/// The final usage chunk (empty choices).
Json usage_chunk_json(const ResponseMeta& m, const Usage& usage);

/// "data: JSON\n\n".
std::string sse_event(const Json& j);
/// "data: [DONE]\n\n".
inline std::string sse_done() { return "data: [DONE]\n\n"; }

}  // namespace quern::server
