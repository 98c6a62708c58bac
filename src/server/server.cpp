#include "server/server.h"

#include <strings.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <regex>

#include "chat/chat.h"
#include "chat/prompt.h"
#include "core/error.h"
#include "runtime/engine.h"
#include "server/anthropic.h"
#include "server/api.h"
#include "server/embeddings.h"
#include "server/generation.h"
#include "server/http_transport.h"
#include "server/metrics.h"
#include "server/responses.h"
#include "server/tool_grammar.h"
#include "server/webui.h"
#include "tokenizer/tokenizer.h"

namespace quern::server {
namespace {

const char* kChatPath = "/v1/chat/completions";
const char* kCompletionsPath = "/v1/completions";
const char* kMessagesPath = "/v1/messages";
const char* kCountTokensPath = "/v1/messages/count_tokens";
const char* kResponsesPath = "/v1/responses";
const char* kTokenizePath = "/v1/tokenize";
const char* kDetokenizePath = "/v1/detokenize";
const char* kEmbeddingsPath = "/v1/embeddings";
const char* kModelsPath = "/v1/models";
const char* kModelPath = R"(/v1/models/(.+))";
const char* kHealthPath = "/health";
const char* kMetricsPath = "/metrics";
const char* kWebPath = R"(/|/webui/[^/]+)";  // the web chat (server/webui.h) unless --no-webui
const char* kRoutes =
    "POST /v1/chat/completions, POST /v1/completions, POST /v1/responses, POST /v1/messages, "
    "POST /v1/messages/count_tokens, POST /v1/embeddings, POST /v1/tokenize, POST /v1/detokenize, "
    "GET /v1/models, GET /health, GET /metrics";

bool equal_constant_time(const std::string& a, const std::string& b) {
    unsigned char diff = a.size() == b.size() ? 0 : 1;
    const size_t n = std::max(a.size(), b.size());
    for (size_t i = 0; i < n; ++i)
        diff |= static_cast<unsigned char>((i < a.size() ? a[i] : 0) ^ (i < b.size() ? b[i] : 0));
    return diff == 0;
}

void send_json(http::Response& res, int status, const Json& body) {
    res.status = status;
    res.set_content(dump(body), "application/json");
    res.stream = nullptr;
}

void send_error(http::Response& res, const ApiError& e) {
    send_json(res, e.status, error_json(e));
    if (e.status == 429) res.set_header("Retry-After", "1");
}

/// The page may load only its own scripts and styles and talk only to this
/// server: model output rendered as markdown cannot pull in anything else.
const char* kWebCsp =
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Answers GET / and /webui/NAME from the embedded files; a browser that
/// holds the same bytes (If-None-Match) gets 304.
void send_web_asset(const http::Request& req, http::Response& res) {
    const WebAsset* a = find_web_asset(req.path);
    if (!a) {
        send_json(res, 404, error_json(404, "the web chat has no file " + req.path));
        return;
    }
    const std::string etag = "\"" + std::to_string(std::hash<std::string_view>{}(a->body)) + "\"";
    res.set_header("ETag", etag);
    res.set_header("Cache-Control", "no-cache");  // revalidate: a new binary may serve new files
    res.set_header("X-Content-Type-Options", "nosniff");
    if (a->path == "/") res.set_header("Content-Security-Policy", kWebCsp);
    if (req.header("If-None-Match") == etag) {
        res.status = 304;
        return;
    }
    std::string type(a->content_type);
    if (type.starts_with("text/")) type += "; charset=utf-8";
    res.set_content(std::string(a->body), type);
}

/// What a generation request keeps between its handler and its content provider.
struct Pending {
    std::shared_ptr<Generation> gen;
    ResponseMeta meta;
    std::string endpoint;
    bool stream = false;
    bool include_usage = false;
    int64_t n_prompt_tokens = 0;  ///< the prompt's tokens (Anthropic's message_start reports them)
    std::string previous;         ///< Responses: previous_response_id ("" for none)
    Json continuation;            ///< Responses: the conversation a later request continues from
    bool store = true;            ///< Responses: keep it for previous_response_id
    double t_arrival = 0;
    bool ran = false;
    bool closed = false;
};

/// Server-sent events: one chunk per piece of text, one per finish.
class SseSink : public Sink {
public:
    SseSink(http::BodyWriter& ds, const Pending& p) : ds_(ds), p_(p) {}
    bool write(const std::string& s) { return ds_.write(s); }
    bool text(int choice, const std::string& text, const std::vector<TokenLogprob>* lps) override {
        return write(sse_event(chunk_json(p_.meta, choice, nullptr, text, lps, "", p_.include_usage)));
    }
    bool delta(int choice, const ChatDelta& d, const std::vector<TokenLogprob>* lps) override {
        return write(sse_event(chat_delta_chunk_json(p_.meta, choice, d, lps, p_.include_usage)));
    }
    bool finish(int choice, const std::string& reason) override {
        return write(sse_event(chunk_json(p_.meta, choice, nullptr, "", nullptr, reason, p_.include_usage)));
    }
    bool alive() override { return ds_.alive(); }

private:
    http::BodyWriter& ds_;
    const Pending& p_;
};

/// A non-streamed response: only watches the connection while generating.
class WatchSink : public Sink {
public:
    explicit WatchSink(http::BodyWriter& ds) : ds_(ds) {}
    bool alive() override { return ds_.alive(); }

private:
    http::BodyWriter& ds_;
};

/// A streamed response whose events a Stream (ResponsesStream,
/// AnthropicStream) renders from chat deltas.
template <class Stream>
class EventSink final : public Sink {
public:
    EventSink(http::BodyWriter& ds, Stream& st) : ds_(ds), st_(st) {}
    /// Writes s (nothing when empty); false when the client is gone.
    bool put(const std::string& s) { return s.empty() || ds_.write(s); }
    bool text(int, const std::string& t, const std::vector<TokenLogprob>*) override {
        ChatDelta d;
        d.content = t;
        return put(st_.delta(d));
    }
    bool delta(int, const ChatDelta& d, const std::vector<TokenLogprob>*) override { return put(st_.delta(d)); }
    bool alive() override { return ds_.alive(); }

private:
    http::BodyWriter& ds_;
    Stream& st_;
};

}  // namespace

struct HttpServer::Impl {
    Engine& engine;
    const Tokenizer& tok;
    const chat::ChatTemplate* tmpl;
    ServerOptions o;
    http::Server svr;
    Metrics metrics;
    ResponseStore responses;  // for previous_response_id
    std::mutex embed_mu;  // embeddings run one at a time (each a CPU pass on every core)
    std::atomic<bool> draining{false};
    std::atomic<int> in_flight{0};
    int64_t created = static_cast<int64_t>(std::time(nullptr));
    int port = 0;

    Impl(Engine& e, const Tokenizer& t, const chat::ChatTemplate* tp, ServerOptions opts)
        : engine(e), tok(t), tmpl(tp), o(std::move(opts)), svr(limits(), [this](auto&&... a) { on_error(a...); }) {}

    void log(const std::string& line) {
        if (!o.log_requests) return;
        std::fprintf(stderr, "quern: %s\n", line.c_str());
        std::fflush(stderr);
    }

    void check_auth(const http::Request& req) const {
        if (o.api_key.empty()) return;
        // Anthropic's clients send the key as x-api-key.
        if (req.has_header("x-api-key")) {
            if (!equal_constant_time(req.header("x-api-key"), o.api_key))
                throw ApiError(401, "the API key is not valid: send the key quern serve was started with (--api-key)",
                               "", "invalid_api_key");
            return;
        }
        const std::string h = req.header("Authorization");
        if (h.size() < 7 || strncasecmp(h.c_str(), "bearer ", 7) != 0)
            throw ApiError(401, "this server needs an API key: send the header 'Authorization: Bearer KEY' "
                                "with the key quern serve was started with (--api-key)", "", "missing_api_key");
        std::string key = h.substr(7);
        while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
        while (!key.empty() && (key.front() == ' ' || key.front() == '\t')) key.erase(key.begin());
        if (!equal_constant_time(key, o.api_key))
            throw ApiError(401, "the API key is not valid: send the key quern serve was started with (--api-key)", "",
                           "invalid_api_key");
    }

    void check_model(const std::string& model) const {
        if (model.empty() || model == o.model_id) return;
        throw ApiError(404, "the model '" + model + "' does not exist: this server serves '" + o.model_id +
                                "' (GET /v1/models lists it)", "model", "model_not_found");
    }

    Json model_json() const {
        return Json{{"id", o.model_id},
                    {"object", "model"},
                    {"created", created},
                    {"owned_by", "quern"},
                    {"max_model_len", engine.options().n_ctx}};
    }

    /// `messages` laid out by the chat template (renders run at once on
    /// their workers: a parsed template is immutable, and each render has
    /// its own step, size and time budgets), their control-token text kept
    /// plain unless --parse-special-in-messages; 400 naming `messages` when
    /// the template refuses.
    chat::RenderedPrompt render(const Json& messages, const chat::ChatOptions& copts) {
        try {
            return chat::render_prompt(*tmpl, messages, copts, tok, o.parse_special_in_messages);
        } catch (const Error& e) {
            throw ApiError(400, std::string("the chat template rejected these messages: ") + e.what(), "messages");
        }
    }

    /// Token ids of each prompt of a request, checked against the context.
    std::vector<std::vector<int32_t>> prompts_of(ApiRequest& r) {
        std::vector<std::vector<int32_t>> prompts;
        if (r.endpoint != Endpoint::Completions) {
            if (!tmpl) throw ApiError(400, "this server has no chat template; use /v1/completions");
            chat::ChatOptions copts;
            copts.add_generation_prompt = true;
            copts.tools = r.tools;
            copts.extra = r.template_kwargs;
            const chat::RenderedPrompt p = render(r.messages, copts);
            const std::string& text = p.text;
            prompts.push_back(tok.encode_prompt(text, true, nullptr, &p.plain));
            // What the model writes besides its answer, as its template shows.
            r.output = detect_output_format(tmpl->source());
            if (o.tool_format) {
                r.output.tools = *o.tool_format;
                r.output.harmony = *o.tool_format == ToolFormat::Harmony;
            }
            if (r.tools.empty() || r.tool_choice == "none") r.output.tools = ToolFormat::None;
            if (!r.parse_reasoning.value_or(o.parse_reasoning)) r.output.think = r.output.harmony = false;
            r.prompt_in_think = r.output.think && prompt_opens_think(text);
            if (r.tool_choice == "required" || r.tool_choice.rfind("function:", 0) == 0) {
                if (r.grammar)
                    throw ApiError(400, "a forced tool call and a response format or grammar cannot be combined",
                                   "tool_choice");
                const std::string only = r.tool_choice == "required" ? "" : r.tool_choice.substr(9);
                try {
                    const ThinkFirst think = !r.output.think ? ThinkFirst::No
                                             : r.prompt_in_think ? ThinkFirst::Open
                                                                 : ThinkFirst::Optional;
                    r.grammar = grammar::Grammar::parse(
                        forced_tool_call_gbnf(r.output.tools, r.tools, only, r.parallel_tool_calls, think));
                } catch (const Error& e) {
                    throw ApiError(400, std::string("'tool_choice' cannot be enforced: ") + e.what(), "tool_choice");
                }
            }
        } else {
            for (const std::string& t : r.prompt_texts) prompts.push_back(tok.encode_prompt(t, true));
            for (const auto& ids : r.prompt_tokens) prompts.push_back(ids);
        }
        const int64_t n_ctx = engine.options().n_ctx;
        const char* param = r.endpoint != Endpoint::Completions ? "messages" : "prompt";
        for (const auto& p : prompts) {
            if (p.empty()) throw ApiError(400, std::string("the prompt is empty: '") + param + "' gives no tokens", param);
            if (static_cast<int64_t>(p.size()) + 1 > n_ctx)
                throw ApiError(400,
                               "this model's context holds " + std::to_string(n_ctx) + " tokens, but the prompt has " +
                                   std::to_string(p.size()) + " (and the reply needs at least 1): shorten the " +
                                   param + " or restart quern serve with a larger -c",
                               param, "context_length_exceeded");
        }
        const EngineOptions& eo = engine.options();
        const int64_t total = static_cast<int64_t>(prompts.size()) * r.n;
        const int64_t cap = static_cast<int64_t>(eo.n_parallel) + eo.max_queue;
        if (total > cap)
            throw ApiError(400,
                           "this request asks for " + std::to_string(total) + " sequences (n x prompts), more than " +
                               "the server runs and queues at once (" + std::to_string(cap) +
                               "); lower 'n' or send fewer prompts per request",
                           "n");
        return prompts;
    }

    void handle_generate(const http::Request& hreq, http::Response& res, Endpoint ep) {
        const double t0 = mono_seconds();
        const std::string endpoint = ep == Endpoint::Chat        ? kChatPath
                                     : ep == Endpoint::Messages  ? kMessagesPath
                                     : ep == Endpoint::Responses ? kResponsesPath
                                                                 : kCompletionsPath;
        const std::string id = (ep == Endpoint::Chat        ? "chatcmpl-"
                                : ep == Endpoint::Messages  ? "msg_"
                                : ep == Endpoint::Responses ? "resp_"
                                                            : "cmpl-") +
                               random_hex(24);
        try {
            if (draining.load())
                throw ApiError(503, "the server is shutting down; retry in a moment or against another server");
            check_auth(hreq);
            const Json body = parse_body(hreq.body);
            std::string previous;  // Responses: previous_response_id
            Json history;
            if (ep == Endpoint::Responses && body.contains("previous_response_id") &&
                !body["previous_response_id"].is_null()) {
                if (!body["previous_response_id"].is_string())
                    throw ApiError(400, "'previous_response_id' must be a string", "previous_response_id");
                previous = body["previous_response_id"].get<std::string>();
                history = responses.get(previous);
                if (history.is_null())
                    throw ApiError(404, "no response '" + previous + "' is kept here (this server keeps the last 512, "
                                            "in memory, those made with store true)", "previous_response_id",
                                   "not_found");
            }
            ApiRequest r = ep == Endpoint::Chat       ? parse_chat_request(body, tok.n_vocab(), o.sampling_defaults)
                           : ep == Endpoint::Messages ? parse_messages_request(body, tok.n_vocab(), o.sampling_defaults)
                           : ep == Endpoint::Responses
                               ? parse_responses_request(body, tok.n_vocab(), o.sampling_defaults,
                                                         previous.empty() ? nullptr : &history)
                               : parse_completion_request(body, tok.n_vocab(), o.sampling_defaults);
            check_model(r.model);
            std::vector<std::vector<int32_t>> prompts = prompts_of(r);

            auto p = std::make_shared<Pending>();
            p->n_prompt_tokens = static_cast<int64_t>(prompts.front().size());
            p->previous = previous;
            p->continuation = r.continuation;
            p->store = !(body.contains("store") && body["store"].is_boolean() && !body["store"].get<bool>());
            p->gen = std::make_shared<Generation>(engine, tok, r, std::move(prompts), t0, &metrics);
            p->gen->submit();
            p->meta = ResponseMeta{ep, id, static_cast<int64_t>(std::time(nullptr)), o.model_id};
            p->endpoint = endpoint;
            p->stream = r.stream;
            p->include_usage = r.include_usage;
            p->t_arrival = t0;
            ++in_flight;
            res.status = 200;
            if (r.stream) {
                res.set_header("Cache-Control", "no-cache");
                res.set_header("X-Accel-Buffering", "no");
            }
            res.content_type = r.stream ? "text/event-stream" : "application/json";
            res.stream = [this, p](http::BodyWriter& w) { return provide(*p, w); };
        } catch (const ApiError& e) {
            if (ep == Endpoint::Messages) {
                send_json(res, e.status, anthropic_error_json(e.status, e.what()));
                if (e.status == 429) res.set_header("Retry-After", "1");
            } else {
                send_error(res, e);
            }
            metrics.count_request(endpoint, e.status);
            log(id + " " + std::to_string(e.status) + " " + e.what());
        }
    }

    /// POST /v1/tokenize: {"prompt": text} (add_special_tokens, default true)
    /// or {"messages": [...]} rendered by the chat template as a request
    /// would be (add_generation_prompt, default true); vLLM's answer shape:
    /// count, max_model_len, tokens (and token_strs with return_token_strs).
    void handle_tokenize(const http::Request& hreq, http::Response& res) {
        try {
            check_auth(hreq);
            const Json body = parse_body(hreq.body);
            std::vector<int32_t> ids;
            if (body.contains("messages")) {
                Json chat_body = Json{{"messages", body["messages"]}};
                if (body.contains("tools")) chat_body["tools"] = body["tools"];
                ApiRequest r = parse_chat_request(chat_body, tok.n_vocab(), o.sampling_defaults);
                if (!tmpl) throw ApiError(400, "this server has no chat template; tokenize a 'prompt'");
                chat::ChatOptions copts;
                copts.add_generation_prompt = !body.contains("add_generation_prompt") ||
                                              (body["add_generation_prompt"].is_boolean() &&
                                               body["add_generation_prompt"].get<bool>());
                copts.tools = r.tools;
                const chat::RenderedPrompt p = render(r.messages, copts);
                ids = tok.encode_prompt(p.text, true, nullptr, &p.plain);
            } else if (body.contains("prompt") && body["prompt"].is_string()) {
                const bool special = !body.contains("add_special_tokens") ||
                                     (body["add_special_tokens"].is_boolean() && body["add_special_tokens"].get<bool>());
                ids = special ? tok.encode_prompt(body["prompt"].get<std::string>(), true)
                              : tok.encode(body["prompt"].get<std::string>(), false, true);
            } else {
                throw ApiError(400, "give 'prompt' (a string) or 'messages'", "prompt");
            }
            Json out{{"count", ids.size()}, {"max_model_len", engine.options().n_ctx}, {"tokens", ids}};
            const Json* strs_flag = body.contains("return_token_strs") ? &body["return_token_strs"] : nullptr;
            if (strs_flag && !strs_flag->is_boolean() && !strs_flag->is_null())
                throw ApiError(400, "'return_token_strs' must be true or false", "return_token_strs");
            if (strs_flag && strs_flag->is_boolean() && strs_flag->get<bool>()) {
                Json strs = Json::array();
                for (int32_t id : ids) strs.push_back(tok.token_to_piece(id, true));
                out["token_strs"] = std::move(strs);
            }
            send_json(res, 200, out);
        } catch (const ApiError& e) {
            send_error(res, e);
        }
    }

    /// POST /v1/embeddings: OpenAI's request and answer (server/embeddings.h).
    void handle_embeddings(const http::Request& hreq, http::Response& res) {
        try {
            check_auth(hreq);
            if (!o.embed) throw ApiError(501, "this server computes no embeddings", "", "not_implemented");
            const EmbeddingRequest r = parse_embeddings_request(parse_body(hreq.body), tok, engine.options().n_ctx, o.n_embd);
            check_model(r.model);
            std::vector<std::vector<float>> vectors;
            {
                std::lock_guard<std::mutex> lock(embed_mu);
                for (const auto& ids : r.inputs) vectors.push_back(o.embed(ids));
            }
            send_json(res, 200, embeddings_response_json(r, o.model_id, std::move(vectors)));
        } catch (const ApiError& e) {
            send_error(res, e);
        } catch (const Error& e) {
            send_error(res, ApiError(500, e.what()));
        }
    }

    /// POST /v1/detokenize: {"tokens": [ids]} → {"prompt": text}.
    void handle_detokenize(const http::Request& hreq, http::Response& res) {
        try {
            check_auth(hreq);
            const Json body = parse_body(hreq.body);
            if (!body.contains("tokens") || !body["tokens"].is_array())
                throw ApiError(400, "'tokens' is required: a list of token ids", "tokens");
            std::vector<int32_t> ids;
            for (const Json& t : body["tokens"]) {
                if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.n_vocab())
                    throw ApiError(400, "'tokens' must hold token ids from 0 to " + std::to_string(tok.n_vocab() - 1),
                                   "tokens");
                ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
            }
            send_json(res, 200, Json{{"prompt", tok.decode(ids, true)}});
        } catch (const ApiError& e) {
            send_error(res, e);
        }
    }

    /// POST /v1/messages/count_tokens: the prompt's tokens as the template renders it.
    void handle_count_tokens(const http::Request& hreq, http::Response& res) {
        try {
            check_auth(hreq);
            ApiRequest r = parse_messages_request(parse_body(hreq.body), tok.n_vocab(), o.sampling_defaults, true);
            check_model(r.model);
            const auto prompts = prompts_of(r);
            send_json(res, 200, Json{{"input_tokens", static_cast<int64_t>(prompts.front().size())}});
        } catch (const ApiError& e) {
            send_json(res, e.status, anthropic_error_json(e.status, e.what()));
        }
    }

    /// A /v1/responses response, streamed (its event sequence) or not; kept
    /// for previous_response_id when it completed.
    bool provide_response(Pending& p, http::BodyWriter& ds) {
        Generation& g = *p.gen;
        const auto error_body = [&] { return dump(error_json(500, g.error(), "", "", "server_error")); };
        if (p.stream) {
            ResponsesStream st(p.meta, p.previous);
            EventSink<ResponsesStream> sink(ds, st);
            if (!sink.put(st.start()) || !g.run(sink)) return false;
            if (!g.error().empty()) return sink.put("event: error\ndata: " + error_body() + "\n\n");
            const ChoiceResult r = g.results().front();
            if (!sink.put(st.finish(r, g.usage()))) return false;
            if (p.store) responses.put(p.meta.id, response_history(p.continuation, r));
            return true;
        }
        WatchSink sink(ds);
        if (!g.run(sink)) return false;
        if (!g.error().empty()) {
            return ds.write(error_body());
        }
        const ChoiceResult r = g.results().front();
        const std::string body = dump(response_object_json(
            p.meta, r, g.usage(), response_output_items(r, p.meta.id.substr(5)), p.previous));
        if (!ds.write(body)) return false;
        if (p.store) responses.put(p.meta.id, response_history(p.continuation, r));
        return true;
    }

    /// A streamed /v1/messages response: Anthropic's events.
    bool provide_messages_stream(Pending& p, http::BodyWriter& ds) {
        Generation& g = *p.gen;
        AnthropicStream st(p.meta);
        EventSink<AnthropicStream> sink(ds, st);
        bool ok = sink.put(st.start(p.n_prompt_tokens));
        ok = ok && g.run(sink);
        if (ok && !g.error().empty()) {
            const std::string e = "event: error\ndata: " + dump(anthropic_error_json(500, g.error())) + "\n\n";
            ok = sink.put(e);
        } else if (ok) {
            ok = sink.put(st.finish(g.results().front(), g.usage()));
        }
        return ok;
    }

    /// Writes the response of an admitted request (on its HTTP thread).
    bool provide(Pending& p, http::BodyWriter& ds) {
        if (p.ran) return false;
        p.ran = true;
        Generation& g = *p.gen;
        bool ok = true;
        if (p.meta.endpoint == Endpoint::Responses) {
            ok = provide_response(p, ds);
        } else if (p.meta.endpoint == Endpoint::Messages) {
            if (p.stream) {
                ok = provide_messages_stream(p, ds);
            } else {
                WatchSink sink(ds);
                ok = g.run(sink);
                if (ok) {
                    const std::string body = g.error().empty()
                                                 ? dump(messages_response_json(p.meta, g.results().front(), g.usage()))
                                                 : dump(anthropic_error_json(500, g.error()));
                    ok = ds.write(body);
                }
            }
        } else if (p.stream) {
            SseSink sink(ds, p);
            if (p.meta.endpoint == Endpoint::Chat) {
                const std::string role = "assistant";
                for (int i = 0; i < g.n_choices() && ok; ++i)
                    ok = sink.write(sse_event(chunk_json(p.meta, i, &role, "", nullptr, "", p.include_usage)));
            }
            ok = ok && g.run(sink);
            if (ok && !g.error().empty()) ok = sink.write(sse_event(error_json(500, g.error(), "", "", "server_error")));
            else if (ok && p.include_usage) ok = sink.write(sse_event(usage_chunk_json(p.meta, g.usage())));
            ok = ok && sink.write(sse_done());
        } else {
            WatchSink sink(ds);
            ok = g.run(sink);
            if (ok) {
                const std::string body = g.error().empty() ? dump(response_json(p.meta, g.results(), g.usage()))
                                                           : dump(error_json(500, g.error(), "", "", "server_error"));
                ok = ds.write(body);
            }
        }
        if (!ok) {
            g.abort();
            close(p, 499);
            return false;
        }
        close(p, g.error().empty() ? 200 : 500);
        return true;
    }

    /// Once per admitted request: cancels what still runs, counts and logs it.
    void close(Pending& p, int status) {
        if (p.closed) return;
        p.closed = true;
        Generation& g = *p.gen;
        g.abort();
        --in_flight;
        metrics.count_request(p.endpoint, status);
        metrics.observe_e2e(mono_seconds() - p.t_arrival);
        const Usage u = g.usage();
        const std::optional<double> ttft = g.ttft();
        std::string line = p.meta.id + " " + std::to_string(status) + " prompt " + std::to_string(u.prompt_tokens) +
                           " (cached " + std::to_string(u.cached_tokens) + ") completion " +
                           std::to_string(u.completion_tokens);
        char buf[96];
        if (ttft) {
            // tok/s needs two tokens of one choice (a rate between tokens)
            const double tps = g.tokens_per_second();
            if (tps > 0) std::snprintf(buf, sizeof buf, " ttft %.3f s %.1f tok/s", *ttft, tps);
            else std::snprintf(buf, sizeof buf, " ttft %.3f s", *ttft);
            line += buf;
        }
        line += " " + (status == 499 ? std::string("client gone") : g.summary_reason());
        if (!g.error().empty()) line += ": " + g.error();
        log(line);
    }

    /// The transport's bounds from the server's options.
    http::Limits limits() const {
        const EngineOptions& eo = engine.options();
        http::Limits l = o.http;
        l.min_idle_workers = std::min(std::max(l.min_idle_workers, std::min(eo.n_parallel + eo.max_queue + 8, 512)),
                                      l.max_workers);
        return l;
    }

    std::string too_large_message() const {
        const size_t n = o.http.max_body_bytes;
        const std::string size = n >= (size_t{1} << 20) ? std::to_string(n >> 20) + " MiB" : std::to_string(n >> 10) + " KiB";
        return "the request body is larger than " + size + "; send a shorter prompt";
    }

    /// Requests the transport refuses itself (no route, wrong method,
    /// malformed or oversized, too slow, too many connections) get the same
    /// JSON error shape as the API's own refusals.
    void on_error(const http::Request& req, int status, const std::string& message, const std::string& allow,
                  http::Response& res) {
        std::string msg = message;
        if (status == 404) {
            msg = "no route " + req.method + " " + req.path + "; this server answers " + kRoutes +
                  (o.webui ? ", GET / (the web chat)" : "");
        } else if (status == 405) {
            msg = req.method + " is not allowed on " + req.path + "; it answers " + allow;
        } else if (status == 413) {
            msg = too_large_message();
        } else if (status == 411) {
            msg = req.method + " " + req.path +
                  " has no Content-Length; send the JSON body with one (or with chunked Transfer-Encoding)";
        } else if (status == 500) {
            msg = "internal error: " + message;
        } else if (msg.empty()) {
            msg = "the request could not be read (HTTP status " + std::to_string(status) + ")";
        }
        send_json(res, status, error_json(status, msg));
        if (req.path == kChatPath || req.path == kCompletionsPath) metrics.count_request(req.path, status);
        log((req.method.empty() ? std::string("-") : req.method + " " + req.path) + " " + std::to_string(status) + " " +
            msg);
    }

    void setup() {
        const auto route = [this](const char* method, const char* path, void (Impl::*fn)(const http::Request&, http::Response&)) {
            svr.route(method, path, [this, fn](const http::Request& req, http::Response& res) { (this->*fn)(req, res); });
        };
        svr.route("POST", kChatPath, [this](const http::Request& req, http::Response& res) {
            handle_generate(req, res, Endpoint::Chat);
        });
        svr.route("POST", kCompletionsPath, [this](const http::Request& req, http::Response& res) {
            handle_generate(req, res, Endpoint::Completions);
        });
        svr.route("POST", kResponsesPath, [this](const http::Request& req, http::Response& res) {
            handle_generate(req, res, Endpoint::Responses);
        });
        svr.route("POST", kMessagesPath, [this](const http::Request& req, http::Response& res) {
            handle_generate(req, res, Endpoint::Messages);
        });
        route("POST", kTokenizePath, &Impl::handle_tokenize);
        route("POST", kEmbeddingsPath, &Impl::handle_embeddings);
        route("POST", kDetokenizePath, &Impl::handle_detokenize);
        route("POST", kCountTokensPath, &Impl::handle_count_tokens);
        svr.route("GET", kModelsPath, [this](const http::Request& req, http::Response& res) {
            try {
                check_auth(req);
                send_json(res, 200, Json{{"object", "list"}, {"data", Json::array({model_json()})}});
            } catch (const ApiError& e) {
                send_error(res, e);
            }
        });
        svr.route("GET", kModelPath, [this](const http::Request& req, http::Response& res) {
            try {
                check_auth(req);
                const std::string& name = req.matches.at(1);
                if (name != o.model_id) check_model(name);
                send_json(res, 200, model_json());
            } catch (const ApiError& e) {
                send_error(res, e);
            }
        });
        svr.route("GET", kHealthPath, [this](const http::Request&, http::Response& res) {
            if (draining.load()) send_json(res, 503, Json{{"status", "shutting down"}});
            else send_json(res, 200, Json{{"status", "ok"}});
        });
        if (o.webui) svr.route("GET", kWebPath, send_web_asset);
        svr.route("GET", kMetricsPath, [this](const http::Request&, http::Response& res) {
            res.set_content(metrics.render(engine.stats(), engine.options(), in_flight.load()),
                            "text/plain; version=0.0.4; charset=utf-8");
        });
    }
};

HttpServer::HttpServer(Engine& engine, const Tokenizer& tok, const chat::ChatTemplate* tmpl, ServerOptions opts)
    : impl_(std::make_unique<Impl>(engine, tok, tmpl, std::move(opts))) {
    impl_->setup();
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind() { return impl_->port = impl_->svr.bind(impl_->o.host, impl_->o.port); }

void HttpServer::run() { impl_->svr.run(); }

void HttpServer::begin_shutdown() { impl_->draining.store(true); }

int HttpServer::in_flight() const { return impl_->in_flight.load(); }

void HttpServer::stop() { impl_->svr.stop(); }

}  // namespace quern::server
