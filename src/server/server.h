// The OpenAI-compatible HTTP server over an Engine, on the event-driven
// transport of server/http_transport.h:
//   POST /v1/chat/completions   POST /v1/completions   GET /v1/models[/ID]
//   GET /health                 GET /metrics (Prometheus text)
// A request, once read whole, runs on a worker thread: a generation request
// validates and tokenizes there, submits to the engine and then waits on its
// own event queue (see generation.h), so the engine thread never waits on
// the network. Errors use OpenAI's JSON error shape.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "server/api.h"
#include "server/chat_output.h"
#include "server/http_transport.h"

namespace quern {
class Engine;
class Tokenizer;
namespace chat {
class ChatTemplate;
}
}  // namespace quern

namespace quern::server {

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;                       ///< 0: any free port (bind() says which)
    std::string model_id = "default";      ///< what /v1/models lists and requests may name
    std::string api_key;                   ///< "": no authentication
    /// The HTTP transport's bounds: body and header sizes, the time to
    /// receive a request, keep-alive, connections and workers.
    /// min_idle_workers is raised to cover every running and waiting request.
    http::Limits http;
    bool log_requests = true;              ///< one line per request on stderr
    /// What a request's absent sampling fields become: OpenAI's defaults, or
    /// the model's generation_config.json over them (quern serve).
    SamplingParams sampling_defaults = api_default_sampling();
    /// The embedding of a text's tokens (unit length; runtime/embed.h), for
    /// POST /v1/embeddings; called one at a time. Null: that route answers
    /// 501.
    std::function<std::vector<float>(const std::vector<int32_t>&)> embed;
    int64_t n_embd = 0;  ///< the width of those vectors
    /// The tool-call format to parse and force, instead of the one read from
    /// the chat template (quern serve --tool-call-format); unset: the
    /// template's.
    std::optional<ToolFormat> tool_format;
    /// Reasoning (<think>) apart in reasoning_content, unless a request's
    /// reasoning_format says otherwise (quern serve --reasoning-format).
    bool parse_reasoning = true;
    /// The web chat page at / (server/webui.h); quern serve --no-webui
    /// turns it off.
    bool webui = true;
    /// Control-token text inside messages becomes control tokens (quern
    /// serve --parse-special-in-messages); by default it stays plain text, so
    /// only the chat template's markup makes them (chat/prompt.h).
    bool parse_special_in_messages = false;
};

class HttpServer {
public:
    /// `tmpl` may be null (then /v1/chat/completions answers 400). All
    /// references must outlive the server.
    HttpServer(Engine& engine, const Tokenizer& tok, const chat::ChatTemplate* tmpl, ServerOptions opts);
    ~HttpServer();
    HttpServer(const HttpServer&) = delete;
    HttpServer& operator=(const HttpServer&) = delete;

    /// Binds the listening socket; returns the port. Throws quern::Error when
    /// the address cannot be bound.
    int bind();
    /// Serves until stop() (call bind() first).
    void run();
    /// From now on generation requests get 503 and /health reports it.
    void begin_shutdown();
    /// Generation requests being answered now.
    int in_flight() const;
    /// Stops listening and returns from run() once open connections finish.
    void stop();

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace quern::server
