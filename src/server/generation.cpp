#include "server/generation.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <random>

#include "core/error.h"
#include "server/metrics.h"

namespace quern::server {

double mono_seconds() {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

namespace {

/// Seeds for requests that bring none.
uint64_t random_seed() {
    static std::mutex mu;
    static std::mt19937_64 rng{std::random_device{}()};
    std::lock_guard<std::mutex> lock(mu);
    return rng();
}

/// 9 letters and digits: Mistral's templates refuse other tool-call ids.
std::string mistral_call_id() {
    static const char* alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t a = random_seed();
    std::string id;
    for (int i = 0; i < 9; ++i, a /= 62) id += alnum[a % 62];
    return id;
}

/// "call_" and 24 hex digits, as OpenAI's tool-call ids look.
std::string openai_call_id() { return "call_" + random_hex(24); }

}  // namespace

std::string random_hex(size_t n) {
    static const char* digits = "0123456789abcdef";
    std::string s;
    while (s.size() < n) {
        uint64_t x = random_seed();
        for (int i = 0; i < 16 && s.size() < n; ++i, x >>= 4) s += digits[x & 15];
    }
    return s;
}

// ---------------------------------------------------------------- EventQueue

EventQueue::EventQueue(int n_choices) : done_(new std::atomic<bool>[static_cast<size_t>(n_choices)]) {
    for (int i = 0; i < n_choices; ++i) done_[static_cast<size_t>(i)].store(false);
}

bool EventQueue::deliver(int choice, const TokenEvent& ev) {
    if (closed_.load() || done_[static_cast<size_t>(choice)].load()) return false;
    {
        std::lock_guard<std::mutex> lock(mu_);
        items_.push_back(Item{choice, ev, mono_seconds()});
    }
    cv_.notify_one();
    return true;
}

bool EventQueue::wait(std::deque<Item>& out, double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    if (items_.empty())
        cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return !items_.empty(); });
    if (items_.empty()) return false;
    for (Item& it : items_) out.push_back(std::move(it));
    items_.clear();
    return true;
}

// ---------------------------------------------------------------- Generation

Generation::Generation(Engine& engine, const Tokenizer& tok, const ApiRequest& req,
                       std::vector<std::vector<int32_t>> prompts, double t_arrival, Metrics* metrics)
    : engine_(engine), tok_(tok), req_(req), prompts_(std::move(prompts)), t_arrival_(t_arrival), metrics_(metrics) {
    const int n = std::max(1, req_.n);
    queue_ = std::make_shared<EventQueue>(static_cast<int>(prompts_.size()) * n);
    for (size_t p = 0; p < prompts_.size(); ++p)
        for (int i = 0; i < n; ++i) {
            const bool harmony = req_.endpoint != Endpoint::Completions && req_.output.harmony;
            auto c = std::make_unique<Choice>(tok_, req_.stop, harmony);
            c->index = static_cast<int>(choices_.size());
            c->prompt = static_cast<int>(p);
            if (req_.endpoint != Endpoint::Completions &&
                (req_.output.think || req_.output.harmony || req_.output.tools != ToolFormat::None))
                c->parser = std::make_unique<ChatOutputParser>(
                    req_.output, req_.prompt_in_think, req_.tools,
                    req_.output.tools == ToolFormat::Mistral ? mistral_call_id : openai_call_id);
            choices_.push_back(std::move(c));
        }
}

Generation::~Generation() { abort(); }

void Generation::submit() {
    const int n = std::max(1, req_.n);
    for (auto& cp : choices_) {
        Choice& c = *cp;
        GenerationRequest g;
        g.prompt = prompts_[static_cast<size_t>(c.prompt)];
        g.max_tokens = req_.max_tokens;
        g.sampling = req_.sampling;
        const uint64_t i = static_cast<uint64_t>(c.index % n);
        g.sampling.seed = req_.seed ? static_cast<uint64_t>(*req_.seed) + i : random_seed();
        g.logit_bias = req_.logit_bias;
        g.top_logprobs = req_.top_logprobs;
        g.ignore_eos = req_.ignore_eos;
        g.grammar = req_.grammar;
        std::shared_ptr<EventQueue> q = queue_;
        const int idx = c.index;
        try {
            c.id = engine_.submit(std::move(g), [q, idx](const TokenEvent& ev) { return q->deliver(idx, ev); });
            c.submitted = true;
        } catch (const QueueFullError& e) {
            abort();
            throw ApiError(429, std::string("the server is busy (") + e.what() + "); retry in a moment", "",
                           "rate_limit_exceeded");
        } catch (const Error& e) {
            abort();
            throw ApiError(400, e.what());
        }
    }
}

void Generation::abort() {
    queue_->close();
    for (auto& cp : choices_) {
        Choice& c = *cp;
        if (c.finished) continue;
        c.finished = true;
        if (c.finish_reason.empty()) c.finish_reason = "cancelled";
        if (c.submitted) engine_.cancel(c.id);
    }
}

bool Generation::run(Sink& sink) {
    bool client_ok = true;
    std::deque<EventQueue::Item> items;
    double next_check = mono_seconds() + 0.1;
    while (client_ok) {
        bool all_done = true;
        for (auto& c : choices_) all_done = all_done && c->finished;
        if (all_done) break;
        queue_->wait(items, 0.1);
        for (const EventQueue::Item& it : items) {
            on_event(*choices_[static_cast<size_t>(it.choice)], it, sink, client_ok);
            if (!client_ok) break;
        }
        items.clear();
        // tokens may flow without pause: look at the connection on a clock
        if (client_ok && mono_seconds() >= next_check) {
            client_ok = sink.alive();
            next_check = mono_seconds() + 0.1;
        }
    }
    if (!client_ok) {
        cancelled_ = true;
        abort();
    }
    return client_ok;
}

void Generation::on_event(Choice& c, const EventQueue::Item& item, Sink& sink, bool& client_ok) {
    if (c.finished) return;  // events that were on their way when a stop string matched
    const TokenEvent& ev = item.ev;
    c.n_cached = ev.n_cached;
    if (ev.token >= 0) {
        ++c.n_tokens;
        if (c.n_tokens == 1) {
            c.t_first = item.t;
            if (metrics_) metrics_->observe_ttft(item.t - t_arrival_);
        } else if (metrics_) {
            metrics_->observe_itl(item.t - c.t_last);
        }
        c.t_last = item.t;
        const size_t start = c.detok_out + c.detok.pending();
        const std::string out = c.detok.push(ev.token);
        c.detok_out += out.size();
        if (req_.top_logprobs >= 0) {
            TokenLogprob lp;
            lp.piece = tok_.token_to_piece(ev.token, true);
            lp.logprob = ev.logprob;
            lp.text_offset = start;
            for (const auto& [id, l] : ev.top_logprobs) lp.top.emplace_back(tok_.token_to_piece(id, true), l);
            c.lp_pending.push_back(std::move(lp));
            c.lp_end.push_back(c.detok_out + c.detok.pending());
        }
        emit(c, out, false, sink, client_ok);
        if (c.finished || !client_ok) return;
    }
    if (!ev.last) return;
    switch (ev.finish) {
        case FinishReason::Stop:
        case FinishReason::None:
            emit(c, {}, true, sink, client_ok);
            if (!c.finished) finish(c, "stop", sink, client_ok);
            break;
        case FinishReason::Length:
            emit(c, {}, true, sink, client_ok);
            if (!c.finished) finish(c, "length", sink, client_ok);
            break;
        case FinishReason::Cancelled:
            // The engine let go of a choice nobody here cancelled: the server
            // is shutting down. What was generated is sent, ended with
            // finish_reason "abort" (as vLLM names it), not as an error.
            emit(c, {}, true, sink, client_ok);
            if (!c.finished) finish(c, "abort", sink, client_ok);
            break;
        case FinishReason::Error:
            c.finished = true;
            c.finish_reason = "error";
            if (error_.empty()) error_ = ev.error.empty() ? "the engine failed on this request" : ev.error;
            if (metrics_) metrics_->count_finish("error");
            break;
    }
}

void Generation::emit(Choice& c, const std::string& text, bool final, Sink& sink, bool& client_ok) {
    std::string out = c.stop.push(text);
    if (final && !c.stop.stopped()) {
        c.detok.flush();  // an incomplete UTF-8 sequence at the very end is dropped, never sent as U+FFFD
        out += c.stop.flush();
    }
    c.emitted += out.size();
    const bool stopped = c.stop.stopped();
    // log-probabilities go out with the text of their token: complete tokens
    // while running; at a stop string, the tokens that began before it
    size_t k = 0;
    while (k < c.lp_pending.size()) {
        const bool release = stopped ? c.lp_pending[k].text_offset < c.emitted : (final || c.lp_end[k] <= c.emitted);
        if (!release) break;
        ++k;
    }
    std::vector<TokenLogprob> released(std::make_move_iterator(c.lp_pending.begin()),
                                       std::make_move_iterator(c.lp_pending.begin() + static_cast<std::ptrdiff_t>(k)));
    c.lp_pending.erase(c.lp_pending.begin(), c.lp_pending.begin() + static_cast<std::ptrdiff_t>(k));
    c.lp_end.erase(c.lp_end.begin(), c.lp_end.begin() + static_cast<std::ptrdiff_t>(k));
    if (stopped) {
        c.lp_pending.clear();
        c.lp_end.clear();
    }
    const bool want_lp = req_.top_logprobs >= 0;
    if (c.parser) {
        // Reasoning, content and tool calls apart; the text the parser holds
        // back (a marker's start) comes at the end.
        ChatDelta d = c.parser->push(out);
        if (final || stopped) d.append(c.parser->finish());
        if (!req_.parallel_tool_calls)  // the first call only
            std::erase_if(d.calls, [](const ToolCallPiece& p) { return p.index > 0; });
        c.text += d.content;
        c.reasoning += d.reasoning;
        for (const ToolCallPiece& p : d.calls) {
            merge_call_piece(c.calls, p);
            c.first_call_done = c.first_call_done || p.last;
        }
        if ((!d.empty() || !released.empty()) && client_ok && !sink.delta(c.index, d, want_lp ? &released : nullptr))
            client_ok = false;
    } else {
        c.text += out;
        if ((!out.empty() || !released.empty()) && client_ok && !sink.text(c.index, out, want_lp ? &released : nullptr))
            client_ok = false;
    }
    if (want_lp) c.lp_done.insert(c.lp_done.end(), released.begin(), released.end());
    // parallel_tool_calls false: the first call ends the choice.
    if (!stopped && !c.finished && c.parser && !req_.parallel_tool_calls && c.first_call_done) {
        c.parser->finish();
        finish(c, "tool_calls", sink, client_ok);
        if (c.submitted) engine_.cancel(c.id);
        return;
    }
    if (stopped) {
        finish(c, "stop", sink, client_ok);
        if (c.submitted) engine_.cancel(c.id);  // the engine need not run past the stop string
    }
}

void Generation::finish(Choice& c, const std::string& reason_in, Sink& sink, bool& client_ok) {
    // A choice that made tool calls and stopped: OpenAI's "tool_calls".
    const std::string reason = reason_in == "stop" && !c.calls.empty() ? "tool_calls" : reason_in;
    c.finished = true;
    c.finish_reason = reason;
    queue_->mark_done(c.index);
    if (metrics_) metrics_->count_finish(reason);
    if (client_ok && !sink.finish(c.index, reason)) client_ok = false;
}

std::vector<ChoiceResult> Generation::results() const {
    std::vector<ChoiceResult> out;
    for (const auto& c : choices_) {
        ChoiceResult r;
        r.index = c->index;
        r.text = c->text;
        r.reasoning = c->reasoning;
        r.stop_sequence = c->stop.matched();
        r.tool_calls = c->calls;
        r.finish_reason = c->finish_reason;
        r.want_logprobs = req_.top_logprobs >= 0;
        r.logprobs = c->lp_done;
        out.push_back(std::move(r));
    }
    return out;
}

Usage Generation::usage() const {
    Usage u;
    std::vector<int64_t> cached(prompts_.size(), std::numeric_limits<int64_t>::max());
    for (const auto& c : choices_) {
        u.completion_tokens += c->n_tokens;
        int64_t& m = cached[static_cast<size_t>(c->prompt)];
        m = std::min(m, c->n_cached);
    }
    for (size_t p = 0; p < prompts_.size(); ++p) {
        u.prompt_tokens += static_cast<int64_t>(prompts_[p].size());
        if (cached[p] != std::numeric_limits<int64_t>::max()) u.cached_tokens += cached[p];
    }
    return u;
}

std::optional<double> Generation::ttft() const {
    std::optional<double> best;
    for (const auto& c : choices_)
        if (c->n_tokens > 0 && (!best || c->t_first - t_arrival_ < *best)) best = c->t_first - t_arrival_;
    return best;
}

double Generation::tokens_per_second() const {
    int64_t n = 0, with_tokens = 0;
    double t0 = 0, t1 = 0;
    for (const auto& c : choices_) {
        if (c->n_tokens == 0) continue;
        if (with_tokens == 0 || c->t_first < t0) t0 = c->t_first;
        if (with_tokens == 0 || c->t_last > t1) t1 = c->t_last;
        n += c->n_tokens;
        ++with_tokens;
    }
    if (n - with_tokens < 1 || t1 <= t0) return 0;
    return static_cast<double>(n - with_tokens) / (t1 - t0);
}

std::string Generation::summary_reason() const {
    if (!error_.empty()) return "error";
    if (cancelled_) return "cancelled";
    std::string out;
    for (const auto& c : choices_)
        if (out.find(c->finish_reason) == std::string::npos) out += (out.empty() ? "" : ",") + c->finish_reason;
    return out;
}

}  // namespace quern::server
