// The HTTP/1.1 transport under quern serve: Boost.Beast parses requests on
// an Asio event loop, so an idle keep-alive connection or a client that sends
// slowly costs a socket and a buffer, never a thread. A request is handed to
// a worker thread only once its headers and body are in; the worker runs the
// route's handler and writes the answer (a streamed body chunk by chunk),
// then gives the connection back to the event loop for its next request.
//
// Every stage is bounded (Limits): header bytes and count, body bytes
// (Content-Length or chunked alike), the time to receive a request's headers
// and its body (in total, not per read), keep-alive idle time and request
// count, a write that the client stops reading, and open connections in all
// and per client address. What breaks a limit is answered 408 / 411 / 413 /
// 431 / 503 and the connection closed.
//
// The transport knows no API: routes are a method, a path pattern and a
// handler; what an error looks like is the ErrorFn's business.
#pragma once
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace quern::server::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

/// A request as its handler sees it: whole, body included.
struct Request {
    std::string method;              ///< as sent ("GET", "POST", ...); HEAD is routed as GET
    std::string target;              ///< the request target: path and query
    std::string path;                ///< the target without its query
    Headers headers;                 ///< in arrival order
    std::string body;
    std::vector<std::string> matches;  ///< the route pattern's match: [0] the path, then its groups
    std::string remote;                ///< the client's address

    bool has_header(std::string_view name) const;
    /// The first value of a header (names compare case-insensitively); ""
    /// when absent.
    std::string header(std::string_view name) const;
};

/// Writes a streamed body; each write is one chunk (chunked transfer
/// encoding), sent before write returns.
class BodyWriter {
public:
    virtual ~BodyWriter() = default;
    /// False when the client is gone or stopped reading (Limits::write_timeout).
    virtual bool write(std::string_view data) = 0;
    /// False once the client has closed its side of the connection.
    virtual bool alive() = 0;
};

struct Response {
    int status = 200;
    Headers headers;
    std::string content_type;
    std::string body;
    /// When set, the body is streamed by this function (called exactly once,
    /// on the request's worker; if the client is already gone, every write
    /// fails). It returns false to end the connection without finishing the
    /// body.
    std::function<bool(BodyWriter&)> stream;
    bool close = false;  ///< close the connection after this response

    void set_header(std::string name, std::string value) { headers.emplace_back(std::move(name), std::move(value)); }
    void set_content(std::string b, std::string type) {
        body = std::move(b);
        content_type = std::move(type);
    }
};

using Handler = std::function<void(const Request&, Response&)>;
class Connection;

/// Fills the response of a request the transport refuses itself: status 400
/// (malformed), 404 (no route), 405 (`allow` lists the methods the path
/// answers), 408, 411, 413, 431, 500 (the handler threw: `message` says
/// what) or 503 (too many connections). `req` holds what was read (method
/// and path at least, except for 503 and a request line that did not
/// parse).
using ErrorFn = std::function<void(const Request& req, int status, const std::string& message,
                                   const std::string& allow, Response& res)>;

/// The transport's bounds. Times count from the first byte of what they
/// bound, not per read: a client that sends a byte a second still runs out.
struct Limits {
    size_t max_body_bytes = size_t{8} << 20;  ///< larger bodies: 413 (chunked ones too)
    size_t max_header_bytes = 16 * 1024;      ///< request line and headers together: 431 beyond
    size_t max_headers = 128;                 ///< header lines: 431 beyond
    std::chrono::milliseconds header_timeout{10000};      ///< from a request's first byte to its blank line: 408
    std::chrono::milliseconds body_timeout{60000};        ///< to read a body: 408
    std::chrono::milliseconds keep_alive_timeout{30000};  ///< an idle connection between requests is closed
    std::chrono::milliseconds write_timeout{30000};       ///< a client that reads nothing for this long is dropped
    int max_keep_alive_requests = 1000;                   ///< requests per connection; the last says close
    int max_connections = 16384;             ///< open connections in all (and at most the file limit allows): 503
    int max_connections_per_client = 4096;   ///< open connections from one address: 503
    int max_workers = 4096;                  ///< threads running handlers (requests beyond wait in order)
    int min_idle_workers = 16;               ///< idle workers kept ready
};

class Server {
public:
    Server(Limits limits, ErrorFn on_error);
    ~Server();
    Server(const Server&) = delete;
    Server& operator=(const Server&) = delete;

    /// Adds a route: `pattern` (ECMAScript regex) must match the whole path.
    /// A GET route answers HEAD too (same headers, no body). Routes are
    /// tried in the order added; add them all before run().
    void route(const std::string& method, const std::string& pattern, Handler h);

    /// Binds host:port (port 0: any free port) and listens; returns the port.
    /// Throws quern::Error when the address cannot be bound.
    int bind(const std::string& host, int port);
    /// Serves until stop(); returns once every connection has closed.
    void run();
    /// Stops accepting, closes idle connections now and each busy one once
    /// its response ends. Safe from any thread, more than once.
    void stop();

private:
    friend class Connection;
    struct Impl;
    std::shared_ptr<Impl> impl_;
};

}  // namespace quern::server::http
