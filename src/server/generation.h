// One API request in flight: its engine requests (n choices per prompt), the
// events the engine hands over, and the text they become.
//
// The engine calls back on its worker thread; the callback only appends the
// event to this request's queue (a mutex and a condition variable) and
// returns at once. The HTTP thread waits on the queue, detokenizes (UTF-8
// safe), matches stop strings (holding back text that may begin one), keeps
// the log-probabilities in step with the text, and passes the result to a
// Sink (SSE chunks or the final JSON body). A stop string or a vanished
// client cancels the engine requests at once.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "server/api.h"
#include "server/stop.h"
#include "tokenizer/detokenizer.h"

namespace quern::server {

/// n lowercase hex digits from a process-wide random source (ids such as
/// "chatcmpl-…" and "call_…"); thread-safe.
std::string random_hex(size_t n);

class Metrics;

/// Seconds on a monotonic clock.
double mono_seconds();

/// Events of one API request, handed from the engine thread to the HTTP thread.
class EventQueue {
public:
    struct Item {
        int choice = 0;
        TokenEvent ev;
        double t = 0;  ///< mono_seconds() when the engine reported it
    };
    explicit EventQueue(int n_choices);
    /// The engine callback for `choice`: queues the event; false (cancel)
    /// once the choice is done or the queue closed.
    bool deliver(int choice, const TokenEvent& ev);
    /// Moves every queued event to `out`, waiting up to `timeout_s` for one.
    /// Returns false when none came.
    bool wait(std::deque<Item>& out, double timeout_s);
    void mark_done(int choice) { done_[static_cast<size_t>(choice)].store(true); }
    /// Every later deliver() returns false.
    void close() { closed_.store(true); }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Item> items_;
    std::unique_ptr<std::atomic<bool>[]> done_;
    std::atomic<bool> closed_{false};
};

/// Where a generation's output goes (the HTTP layer implements it).
class Sink {
public:
    virtual ~Sink() = default;
    /// New text of a choice and the log-probabilities of the tokens it
    /// completes (nullptr when not requested). False: the client is gone.
    virtual bool text(int choice, const std::string& text, const std::vector<TokenLogprob>* logprobs) { return true; }
    /// Parsed chat output (reasoning, content, pieces of tool calls), for
    /// chat requests whose model writes reasoning or tool calls
    /// (ApiRequest::output); plain text by default.
    virtual bool delta(int choice, const ChatDelta& d, const std::vector<TokenLogprob>* logprobs) {
        return text(choice, d.content, logprobs);
    }
    /// A choice finished with "stop" or "length".
    virtual bool finish(int choice, const std::string& reason) { return true; }
    /// Whether the client is still connected (asked while waiting).
    virtual bool alive() { return true; }
};

class Generation {
public:
    /// `prompts`: token ids per prompt; each gets req.n choices (choice
    /// index prompt * n + i, seed + i). `t_arrival`: mono_seconds() when the
    /// request arrived (for the time to first token).
    Generation(Engine& engine, const Tokenizer& tok, const ApiRequest& req, std::vector<std::vector<int32_t>> prompts,
               double t_arrival, Metrics* metrics = nullptr);
    /// Cancels whatever still runs.
    ~Generation();
    Generation(const Generation&) = delete;
    Generation& operator=(const Generation&) = delete;

    /// Submits every choice to the engine. Throws ApiError 429 (queue full)
    /// or 400 (the engine refuses the request), after cancelling the
    /// choices already submitted.
    void submit();
    /// Feeds engine events to `sink` until every choice has finished.
    /// Returns false when the sink reported the client gone (everything is
    /// cancelled then).
    bool run(Sink& sink);
    /// Cancels every unfinished choice (idempotent, thread-safe enough to
    /// call from the HTTP thread only).
    void abort();

    int n_choices() const { return static_cast<int>(choices_.size()); }
    /// Per choice: text, finish reason, log-probabilities (after run()).
    std::vector<ChoiceResult> results() const;
    Usage usage() const;
    /// The engine's error when a choice ended in one ("" otherwise).
    const std::string& error() const { return error_; }
    /// Seconds from arrival to the first token (nullopt: no token yet).
    std::optional<double> ttft() const;
    /// Generated tokens per second after the first token (0 with < 2 tokens).
    double tokens_per_second() const;
    /// "stop", "length", "error", or "cancelled" for the request as a whole.
    std::string summary_reason() const;

private:
    struct Choice {
        int index = 0;
        int prompt = 0;
        uint64_t id = 0;
        bool submitted = false;
        bool finished = false;
        std::string finish_reason;
        Detokenizer detok;
        StopMatcher stop;
        size_t detok_out = 0;   ///< bytes the detokenizer has released
        size_t emitted = 0;     ///< bytes passed on (after stop-string holdback)
        std::string text;
        int64_t n_tokens = 0;
        int64_t n_cached = 0;
        double t_first = 0, t_last = 0;
        std::vector<TokenLogprob> lp_pending;  ///< not yet complete in the emitted text
        std::vector<TokenLogprob> lp_done;     ///< all released (non-streamed result)
        std::vector<size_t> lp_end;            ///< end offsets of lp_pending
        std::unique_ptr<ChatOutputParser> parser;  ///< chat output with reasoning or tool calls
        std::string reasoning;
        std::vector<ToolCall> calls;
        bool first_call_done = false;  ///< the first tool call has ended
        /// `specials`: special tokens are written (harmony's markers are).
        Choice(const Tokenizer& tok, std::vector<std::string> stops, bool specials)
            : detok(tok, specials), stop(std::move(stops)) {}
    };
    void on_event(Choice& c, const EventQueue::Item& item, Sink& sink, bool& client_ok);
    void emit(Choice& c, const std::string& text, bool final, Sink& sink, bool& client_ok);
    void finish(Choice& c, const std::string& reason, Sink& sink, bool& client_ok);

    Engine& engine_;
    const Tokenizer& tok_;
    ApiRequest req_;
    std::vector<std::vector<int32_t>> prompts_;
    double t_arrival_;
    Metrics* metrics_;
    std::shared_ptr<EventQueue> queue_;
    std::vector<std::unique_ptr<Choice>> choices_;
    std::string error_;
    bool cancelled_ = false;  ///< the request as a whole ended early (client gone, shutdown)
};

}  // namespace quern::server
