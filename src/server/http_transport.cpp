#include "server/http_transport.h"

#include <poll.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>
#include <unordered_set>

#include "core/error.h"
#include "server/worker_pool.h"

namespace quern::server::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

bool iequal(std::string_view a, std::string_view b) {
    return a.size() == b.size() && ::strncasecmp(a.data(), b.data(), a.size()) == 0;
}

std::string find_header(const Headers& hs, std::string_view name) {
    for (const auto& [k, v] : hs)
        if (iequal(k, name)) return v;
    return "";
}

/// Sends all of `data` on a connected socket (blocking or not); false when
/// the peer is gone or read nothing for `idle` (the deadline restarts with
/// each byte the peer takes).
bool send_all(int fd, std::string_view data, std::chrono::milliseconds idle) {
    auto deadline = Clock::now() + idle;
    while (!data.empty()) {
        const ssize_t k = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            data.remove_prefix(static_cast<size_t>(k));
            deadline = Clock::now() + idle;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) return false;
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    }
    return true;
}

/// The status line and headers of `res` (RFC 9112), ending in the blank line.
std::string response_head(const Response& res, size_t body_size, bool chunked, bool keep_alive) {
    bhttp::response_header<> h;
    h.version(11);
    h.result(static_cast<unsigned>(res.status));
    for (const auto& [k, v] : res.headers) h.insert(k, v);
    if (!res.content_type.empty()) h.set(bhttp::field::content_type, res.content_type);
    const bool bodiless = res.status < 200 || res.status == 204 || res.status == 304;
    if (chunked) h.set(bhttp::field::transfer_encoding, "chunked");
    else if (!bodiless) h.set(bhttp::field::content_length, std::to_string(body_size));
    h.set(bhttp::field::connection, keep_alive ? "keep-alive" : "close");
    std::ostringstream os;
    os << h;
    return os.str();
}

/// A streamed body on a connection's socket: one chunk per write.
class ChunkWriter final : public BodyWriter {
public:
    ChunkWriter(int fd, std::chrono::milliseconds idle, bool ok) : fd_(fd), idle_(idle), ok_(ok) {}
    bool write(std::string_view data) override {
        if (!ok_ || data.empty()) return ok_;
        char size[24];
        const int n = std::snprintf(size, sizeof size, "%zx\r\n", data.size());
        chunk_.assign(size, static_cast<size_t>(n));  // keeps its capacity: no allocation per token
        chunk_.append(data);
        chunk_ += "\r\n";
        return ok_ = send_all(fd_, chunk_, idle_);
    }
    bool alive() override {
        if (!ok_) return false;
        pollfd p{fd_, POLLRDHUP, 0};
        if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) ok_ = false;
        return ok_;
    }
    /// The last chunk; false when the body could not be finished.
    bool finish() { return ok_ && (ok_ = send_all(fd_, "0\r\n\r\n", idle_)); }

private:
    int fd_;
    std::chrono::milliseconds idle_;
    bool ok_;
    std::string chunk_;  // size line, data, CRLF
};

struct Route {
    std::string method;
    std::regex re;
    Handler handler;
};

}  // namespace

bool Request::has_header(std::string_view name) const {
    return std::any_of(headers.begin(), headers.end(), [&](const auto& h) { return iequal(h.first, name); });
}
std::string Request::header(std::string_view name) const { return find_header(headers, name); }

class Connection;

struct Server::Impl {
    Limits lim;
    ErrorFn on_error;
    std::vector<Route> routes;
    asio::io_context io;
    tcp::acceptor acceptor{io};
    asio::steady_timer accept_retry{io};
    WorkerPool pool;
    std::atomic<bool> stopping{false};
    mutable std::mutex mu;  // guards open and per_client
    std::unordered_set<std::shared_ptr<Connection>> open;
    std::map<std::string, int> per_client;

    Impl(Limits l, ErrorFn e)
        : lim(l), on_error(std::move(e)),
          pool(static_cast<size_t>(std::min(l.min_idle_workers, l.max_workers)), static_cast<size_t>(l.max_workers)) {
        rlimit r{};  // every connection is a file: keep clear of the process's limit
        if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY && r.rlim_cur > 128)
            lim.max_connections = static_cast<int>(std::min<rlim_t>(lim.max_connections, r.rlim_cur - 64));
    }

    void accept();
    void serve(const std::shared_ptr<Connection>& c, Request req, bool keep_alive);
    void forget(const std::shared_ptr<Connection>& c, const std::string& remote);
};

/// One client connection. Its socket is used by one side at a time: the
/// event loop (on the connection's strand) while a request is read, then the
/// request's worker until its answer is written.
class Connection : public std::enable_shared_from_this<Connection> {
public:
    Connection(Server::Impl& s, tcp::socket sock, std::string remote)
        : srv_(s), socket_(std::move(sock)), timer_(socket_.get_executor()), remote_(std::move(remote)) {}

    void start() { wait_for_request(); }
    const std::string& remote() const { return remote_; }
    int fd() { return static_cast<int>(socket_.native_handle()); }
    auto executor() { return socket_.get_executor(); }

    /// On the strand: closes the connection unless a worker holds it (that
    /// worker closes it when done, seeing the server stop).
    void close_if_idle() {
        if (!busy_) close();
    }

    /// From the worker, when the answer is written: the next request, or close.
    void resume(bool keep_alive) {
        asio::post(socket_.get_executor(), [self = shared_from_this(), keep_alive] {
            self->busy_ = false;
            self->hold_.reset();
            if (keep_alive && !self->srv_.stopping) self->wait_for_request();
            else self->close();
        });
    }

private:
    /// Starts the deadline of the next operation: when it passes, the
    /// operation is cancelled (the socket stays open for a 408).
    void arm(std::chrono::steady_clock::duration d) {
        if (closed_) return;  // a pending timer would keep run() going
        const uint64_t id = ++armed_;
        timed_out_ = false;
        timer_.expires_after(d);
        timer_.async_wait([self = shared_from_this(), id](beast::error_code ec) {
            if (ec || id != self->armed_) return;
            self->timed_out_ = true;
            beast::error_code ignored;
            self->socket_.cancel(ignored);
        });
    }
    /// Ends the current deadline; true when it had passed.
    bool disarm() {
        ++armed_;
        timer_.cancel();
        return std::exchange(timed_out_, false);
    }

    /// Waits (keep-alive time) for a request's first byte: the header
    /// deadline counts from there, so an idle connection is not a slow one.
    void wait_for_request() {
        if (srv_.stopping) return close();
        if (buffer_.size() > 0) return read_header();  // pipelined
        arm(srv_.lim.keep_alive_timeout);
        socket_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
            self->disarm();
            self->buffer_.commit(n);
            if (ec || n == 0) return self->close();
            self->read_header();
        });
    }

    void read_header() {
        parser_.emplace();
        parser_->header_limit(static_cast<uint32_t>(srv_.lim.max_header_bytes));
        parser_->body_limit(static_cast<uint64_t>(srv_.lim.max_body_bytes));
        arm(srv_.lim.header_timeout);
        bhttp::async_read_header(socket_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
            if (self->disarm()) ec = beast::error::timeout;
            self->on_header(ec);
        });
    }

    void on_header(beast::error_code ec) {
        const Limits& lim = srv_.lim;
        if (ec == beast::error::timeout)
            return refuse(408, "the request's headers did not arrive within " +
                                   std::to_string(lim.header_timeout.count() / 1000) + " s");
        if (ec == bhttp::error::header_limit)
            return refuse(431, "the request line and headers are larger than " +
                                   std::to_string(lim.max_header_bytes / 1024) + " KiB");
        if (ec == bhttp::error::body_limit) return refuse(413, "");
        if (ec == bhttp::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
            ec == asio::error::operation_aborted)
            return close();
        if (ec) return refuse(400, "the request is not valid HTTP/1.1 (" + ec.message() + ")");
        const auto& h = parser_->get();
        if (static_cast<size_t>(std::distance(h.begin(), h.end())) > lim.max_headers)
            return refuse(431, "the request has more than " + std::to_string(lim.max_headers) + " headers");
        const std::string_view m = h.method_string();
        if ((m == "POST" || m == "PUT" || m == "PATCH") && !parser_->content_length() && !parser_->chunked())
            return refuse(411, "");
        if (iequal(h[bhttp::field::expect], "100-continue")) {
            static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
            return asio::async_write(socket_, asio::buffer(kContinue),
                                     [self = shared_from_this()](beast::error_code e, size_t) {
                                         if (e) return self->close();
                                         self->read_body();
                                     });
        }
        read_body();
    }

    void read_body() {
        if (parser_->is_done()) return dispatch();
        arm(srv_.lim.body_timeout);
        bhttp::async_read(socket_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
            if (self->disarm()) ec = beast::error::timeout;
            if (ec == beast::error::timeout)
                return self->refuse(408, "the request body did not arrive within " +
                                             std::to_string(self->srv_.lim.body_timeout.count() / 1000) + " s");
            if (ec == bhttp::error::body_limit) return self->refuse(413, "");
            if (ec) return self->close();
            self->dispatch();
        });
    }

    /// The request line as read (also all an error answer knows).
    Request partial() const {
        Request r;
        if (!parser_) return r;
        const auto& h = parser_->get();
        r.method = std::string(h.method_string());
        r.target = std::string(h.target());
        r.path = r.target.substr(0, r.target.find('?'));
        r.remote = remote_;
        return r;
    }

    /// Answers an error the transport found itself, then closes. The rest
    /// of the request is read and dropped for a little while first
    /// (lingering close): closing on unread bytes resets the connection, and
    /// a client still sending its body would never see the answer.
    void refuse(int status, const std::string& message) {
        Response res;
        res.status = status;
        srv_.on_error(partial(), status, message, "", res);
        auto out = std::make_shared<std::string>(response_head(res, res.body.size(), false, false) + res.body);
        // A declared length is drained whole (up to 64 MiB); a chunked or
        // unknown rest, 1 MiB: a client streaming without end is cut off.
        const std::string declared = parser_ ? std::string(parser_->get()[bhttp::field::content_length]) : "";
        const uint64_t n = declared.empty() ? 0 : std::strtoull(declared.c_str(), nullptr, 10);
        linger_left_ = n > 0 ? std::min<uint64_t>(n + 65536, uint64_t{64} << 20) : uint64_t{1} << 20;
        arm(srv_.lim.write_timeout);
        asio::async_write(socket_, asio::buffer(*out), [self = shared_from_this(), out](beast::error_code ec, size_t) {
            self->disarm();
            beast::error_code ignored;
            self->socket_.shutdown(tcp::socket::shutdown_send, ignored);
            if (ec) return self->close();
            self->arm(std::chrono::seconds(5));
            self->drain();
        });
    }

    void drain() {
        if (linger_left_ == 0) return close();
        socket_.async_read_some(asio::buffer(scratch_), [self = shared_from_this()](beast::error_code ec, size_t n) {
            if (ec || n == 0) return self->close();
            self->linger_left_ -= std::min<uint64_t>(n, self->linger_left_);
            self->drain();
        });
    }

    void dispatch() {
        Request r = partial();
        auto msg = parser_->release();
        parser_.reset();
        for (const auto& f : msg) r.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
        r.body = std::move(msg.body());
        const bool keep_alive = msg.keep_alive() && ++served_ < srv_.lim.max_keep_alive_requests;
        busy_ = true;
        hold_.emplace(srv_.io.get_executor());  // run() lasts while a worker answers
        srv_.pool.enqueue([self = shared_from_this(), r = std::move(r), keep_alive]() mutable {
            self->srv_.serve(self, std::move(r), keep_alive);
        });
    }

    void close() {
        disarm();
        if (closed_) return;
        closed_ = true;
        beast::error_code ignored;
        socket_.shutdown(tcp::socket::shutdown_both, ignored);
        socket_.close(ignored);
        srv_.forget(shared_from_this(), remote_);
    }

    Server::Impl& srv_;
    tcp::socket socket_;
    asio::steady_timer timer_;  // the deadline of the operation in progress
    uint64_t armed_ = 0;        // which deadline is current: a stale expiry is ignored
    bool timed_out_ = false;
    beast::flat_buffer buffer_;
    std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
    std::optional<asio::executor_work_guard<asio::io_context::executor_type>> hold_;
    std::string remote_;
    std::array<char, 16384> scratch_;  // what a lingering close drops
    uint64_t linger_left_ = 0;
    int served_ = 0;
    bool busy_ = false;
    bool closed_ = false;
};

void Server::Impl::accept() {
    acceptor.async_accept(asio::make_strand(io), [this](beast::error_code ec, tcp::socket sock) {
        if (stopping || !acceptor.is_open()) return;
        if (ec) {  // out of files, most likely: let connections close, then go on
            accept_retry.expires_after(std::chrono::milliseconds(50));
            accept_retry.async_wait([this](beast::error_code) { accept(); });
            return;
        }
        beast::error_code e;
        const tcp::endpoint peer = sock.remote_endpoint(e);
        const std::string remote = e ? std::string("?") : peer.address().to_string();
        sock.set_option(tcp::no_delay(true), e);
        auto c = std::make_shared<Connection>(*this, std::move(sock), remote);
        bool over = false;
        {
            std::lock_guard<std::mutex> lock(mu);
            int& mine = per_client[remote];
            over = static_cast<int>(open.size()) >= lim.max_connections || mine >= lim.max_connections_per_client;
            if (!over) {
                ++mine;
                open.insert(c);
            } else if (mine == 0) {
                per_client.erase(remote);
            }
        }
        if (over) {
            Response res;
            res.status = 503;
            Request r;
            r.remote = remote;
            on_error(r, 503, "too many open connections (from this address or in all); close some and retry", "", res);
            send_all(c->fd(), response_head(res, res.body.size(), false, false) + res.body, std::chrono::milliseconds(0));
        } else {
            asio::post(c->executor(), [c] { c->start(); });
        }
        accept();
    });
}

void Server::Impl::forget(const std::shared_ptr<Connection>& c, const std::string& remote) {
    std::lock_guard<std::mutex> lock(mu);
    if (open.erase(c) == 0) return;
    if (auto it = per_client.find(remote); it != per_client.end() && --it->second <= 0) per_client.erase(it);
}

/// On a worker: routes the request, runs its handler and writes the answer.
void Server::Impl::serve(const std::shared_ptr<Connection>& c, Request req, bool keep_alive) {
    const bool head = req.method == "HEAD";
    const std::string method = head ? "GET" : req.method;
    const Handler* handler = nullptr;
    std::string allow;
    for (const Route& r : routes) {
        std::smatch m;
        if (!std::regex_match(req.path, m, r.re)) continue;
        if (r.method == method && !handler) {
            handler = &r.handler;
            for (const auto& g : m) req.matches.push_back(g.str());
        }
        const std::string names = r.method == "GET" ? "GET, HEAD" : r.method;
        if (allow.find(names) == std::string::npos) allow += (allow.empty() ? "" : ", ") + names;
    }
    Response res;
    if (!handler) {
        res.status = allow.empty() ? 404 : 405;
        if (!allow.empty()) res.set_header("Allow", allow);
        on_error(req, res.status, "", allow, res);
    } else {
        try {
            (*handler)(req, res);
        } catch (const std::exception& e) {
            res = Response{};
            res.status = 500;
            on_error(req, 500, e.what(), "", res);
        }
    }
    keep_alive = keep_alive && !res.close && !stopping;
    const int fd = c->fd();
    bool ok;
    if (res.stream && !head) {
        ok = send_all(fd, response_head(res, 0, true, keep_alive), lim.write_timeout);
        ChunkWriter w(fd, lim.write_timeout, ok);
        ok = res.stream(w) && w.finish();
    } else {
        std::string out = response_head(res, res.body.size(), false, keep_alive);
        if (!head) out += res.body;
        ok = send_all(fd, out, lim.write_timeout);
    }
    c->resume(ok && keep_alive);
}

Server::Server(Limits limits, ErrorFn on_error) : impl_(std::make_shared<Impl>(limits, std::move(on_error))) {}

Server::~Server() {
    stop();
    impl_->pool.shutdown();
}

void Server::route(const std::string& method, const std::string& pattern, Handler h) {
    impl_->routes.push_back(Route{method, std::regex(pattern), std::move(h)});
}

int Server::bind(const std::string& host, int port) {
    Impl& m = *impl_;
    beast::error_code ec;
    const std::string where = host + ":" + std::to_string(port);
    tcp::resolver resolver(m.io);
    auto found = resolver.resolve(host, std::to_string(port), tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec || found.empty())
        fail("cannot listen on {}: the address does not resolve ({}); pick another with --host", host, ec.message());
    const tcp::endpoint ep = found.begin()->endpoint();
    m.acceptor.open(ep.protocol(), ec);
    // SO_REUSEADDR only (restarts while old connections linger); never
    // SO_REUSEPORT, which would let a second server share the port and
    // silently take half the traffic.
    if (!ec) m.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) m.acceptor.bind(ep, ec);
    if (!ec) m.acceptor.listen(1024, ec);
    if (ec) {
        beast::error_code ignored;
        m.acceptor.close(ignored);
        fail("cannot listen on {} ({}: in use, or not an address of this machine); pick another with --port / --host",
             where, ec.message());
    }
    return m.acceptor.local_endpoint().port();
}

void Server::run() {
    Impl& m = *impl_;
    if (!m.acceptor.is_open()) fail("http::Server::run: call bind() first");
    m.accept();
    // A second thread for the event loop: parsing one request never delays
    // accepting the next connection.
    std::thread second([&m] { m.io.run(); });
    m.io.run();
    second.join();
}

void Server::stop() {
    Impl& m = *impl_;
    if (m.stopping.exchange(true)) return;
    asio::post(m.io, [&m] {
        beast::error_code ignored;
        m.acceptor.close(ignored);
        m.accept_retry.cancel();
        std::vector<std::shared_ptr<Connection>> all;
        {
            std::lock_guard<std::mutex> lock(m.mu);
            all.assign(m.open.begin(), m.open.end());
        }
        for (auto& c : all) asio::post(c->executor(), [c] { c->close_if_idle(); });
    });
}

}  // namespace quern::server::http
