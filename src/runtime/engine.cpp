// The CPU engine: a worker thread running continuous batching over a fixed
// number of sequence slots (see engine.h).
//
// Each step:
//   1. admits waiting requests into free slots (FIFO) and drops cancelled ones;
//   2. builds one batch: the next token of every generating sequence (decode
//      rows first), then prompt chunks of sequences still reading their
//      prompt, in admission order, while the token budget lasts (at least one
//      chunk per step, so a long prompt always progresses);
//   3. runs Model::forward_batch, samples every sequence that produced logits
//      and reports the events.
// Prompts are cut into chunks at fixed positions (multiples of the token
// budget from position 0), never by how much budget a step has left, so a
// request's computation does not depend on the other requests: with the
// batch-invariant forward pass it produces the same tokens alone or in a
// crowd (for a given seed).
#include "runtime/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "core/thread_pool.h"
#include "runtime/kv_cache.h"
#include "tokenizer/tokenizer.h"

namespace quern {

namespace {

struct Pending {
    uint64_t id;
    GenerationRequest req;
    TokenCallback cb;
};

struct Slot {
    bool active = false;
    uint64_t id = 0;
    GenerationRequest req;
    TokenCallback cb;
    KvCache cache;
    std::unique_ptr<Sampler> sampler;
    int64_t prompt_done = 0;  // prompt tokens evaluated
    int64_t generated = 0;
    int32_t next = -1;        // sampled token to evaluate next (decode phase)
    uint64_t order = 0;       // admission order
    bool cancel = false;
    std::vector<float> logits;

    explicit Slot(KvCache c) : cache(std::move(c)) {}
    bool decoding() const { return active && prompt_done == static_cast<int64_t>(req.prompt.size()); }
};

class CpuEngine final : public Engine {
public:
    CpuEngine(Model& model, const Tokenizer& tok, const EngineOptions& o)
        : model_(model), tok_(tok), opts_(o), pool_(o.n_threads) {
        if (o.n_parallel < 1 || o.n_parallel > 1024) fail("--parallel must be between 1 and 1024 (got {})", o.n_parallel);
        if (o.n_ctx < 2) fail("the context size must be at least 2 (got {})", o.n_ctx);
        if (o.max_queue < 0) fail("--max-queue must not be negative");
        if (o.token_budget < 1) fail("the token budget must be positive");
        for (int i = 0; i < o.n_parallel; ++i) slots_.emplace_back(model.make_cache(o.n_ctx));
        worker_ = std::thread([this] { loop(); });
    }
    ~CpuEngine() override { shutdown(); }

    uint64_t submit(GenerationRequest req, TokenCallback cb) override {
        validate(req);
        std::lock_guard<std::mutex> lk(mu_);
        if (stopping_) throw QueueFullError("the server is shutting down");
        if (static_cast<int>(waiting_.size()) >= opts_.max_queue + free_slots_locked())
            throw QueueFullError(fmt::format("the queue is full ({} requests waiting); retry later", waiting_.size()));
        const uint64_t id = ++next_id_;
        waiting_.push_back(Pending{id, std::move(req), std::move(cb)});
        cv_.notify_all();
        return id;
    }

    void cancel(uint64_t id) override {
        std::lock_guard<std::mutex> lk(mu_);
        cancelled_.push_back(id);
        cv_.notify_all();
    }

    EngineStats stats() const override {
        std::lock_guard<std::mutex> lk(mu_);
        EngineStats s = stats_;
        s.waiting = static_cast<int>(waiting_.size());
        return s;
    }

    const EngineOptions& options() const override { return opts_; }

    void shutdown() override {
        {
            std::lock_guard<std::mutex> lk(mu_);
            if (stopping_ && !worker_.joinable()) return;
            stopping_ = true;
            cv_.notify_all();
        }
        if (worker_.joinable()) worker_.join();
    }

private:
    void validate(const GenerationRequest& r) const {
        const auto& c = model_.config();
        if (r.prompt.empty()) fail("the prompt is empty");
        if (static_cast<int64_t>(r.prompt.size()) + 1 > opts_.n_ctx)
            fail("the prompt has {} tokens; this server's context holds {} (prompt + at least one generated token)",
                 r.prompt.size(), opts_.n_ctx);
        for (int32_t t : r.prompt)
            if (t < 0 || t >= c.n_vocab) fail("token id {} is outside the vocabulary [0, {})", t, c.n_vocab);
        for (const auto& [t, b] : r.logit_bias) {
            if (t < 0 || t >= c.n_vocab) fail("logit_bias token id {} is outside the vocabulary [0, {})", t, c.n_vocab);
            if (!std::isfinite(b)) fail("logit_bias values must be finite numbers");
        }
        const SamplingParams& p = r.sampling;
        if (!std::isfinite(p.temperature) || p.temperature < 0) fail("temperature must be a number >= 0");
        if (!std::isfinite(p.top_p) || p.top_p < 0 || p.top_p > 1) fail("top_p must be between 0 and 1");
        if (!std::isfinite(p.min_p) || p.min_p < 0 || p.min_p > 1) fail("min_p must be between 0 and 1");
        if (!std::isfinite(p.repeat_penalty) || p.repeat_penalty <= 0) fail("repetition_penalty must be > 0");
        if (!std::isfinite(p.presence_penalty) || !std::isfinite(p.frequency_penalty))
            fail("presence_penalty and frequency_penalty must be finite numbers");
        if (r.top_logprobs > 20) fail("top_logprobs must be at most 20");
        if (r.max_tokens == 0 || r.max_tokens < -1) fail("max_tokens must be a positive integer");
    }

    int free_slots_locked() const {
        int n = 0;
        for (const Slot& s : slots_) n += !s.active;
        return n;
    }

    /// Ends a slot's request with a final event (no token). The slot is
    /// freed before the callback runs, so a client reacting to the end can
    /// submit again at once.
    void finish(Slot& s, FinishReason why, const std::string& err = {}) {
        TokenEvent e;
        e.last = true;
        e.finish = why;
        e.error = err;
        e.n_prompt = static_cast<int64_t>(s.req.prompt.size());
        e.n_generated = s.generated;
        TokenCallback cb = std::move(s.cb);
        release(s);
        if (cb) cb(e);
    }

    void release(Slot& s) {
        s.active = false;
        s.cb = nullptr;
        s.sampler.reset();
        s.req = GenerationRequest{};
        std::lock_guard<std::mutex> lk(mu_);
        ++stats_.requests_finished;
    }

    void admit() {
        std::unique_lock<std::mutex> lk(mu_);
        for (uint64_t id : cancelled_) {
            for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
                if (it->id == id) {
                    Pending p = std::move(*it);
                    waiting_.erase(it);
                    lk.unlock();
                    TokenEvent e;
                    e.last = true;
                    e.finish = FinishReason::Cancelled;
                    e.n_prompt = static_cast<int64_t>(p.req.prompt.size());
                    if (p.cb) p.cb(e);
                    lk.lock();
                    break;
                }
            for (Slot& s : slots_)
                if (s.active && s.id == id) s.cancel = true;
        }
        cancelled_.clear();
        for (Slot& s : slots_) {
            if (s.active || waiting_.empty()) continue;
            Pending p = std::move(waiting_.front());
            waiting_.pop_front();
            s.active = true;
            s.cancel = false;
            s.id = p.id;
            s.req = std::move(p.req);
            s.cb = std::move(p.cb);
            s.cache.clear();
            s.prompt_done = 0;
            s.generated = 0;
            s.next = -1;
            s.order = ++admitted_;
            s.sampler = std::make_unique<Sampler>(s.req.sampling, model_.config().n_vocab);
            for (int32_t t : s.req.prompt) s.sampler->accept(t);
            stats_.prompt_tokens += static_cast<int64_t>(s.req.prompt.size());
        }
        int running = 0;
        int64_t used = 0;
        for (const Slot& s : slots_) {
            running += s.active;
            if (s.active) used += s.cache.size();
        }
        stats_.running = running;
        stats_.kv_tokens_used = used;
        stats_.kv_tokens_total = opts_.n_ctx * static_cast<int64_t>(slots_.size());
    }

    void loop() {
        for (;;) {
            {
                std::unique_lock<std::mutex> lk(mu_);
                cv_.wait(lk, [&] {
                    if (stopping_) return true;
                    if (!waiting_.empty() || !cancelled_.empty()) return true;
                    for (const Slot& s : slots_)
                        if (s.active) return true;
                    return false;
                });
                if (stopping_) break;
            }
            admit();
            for (Slot& s : slots_)
                if (s.active && s.cancel) finish(s, FinishReason::Cancelled);
            try {
                step();
            } catch (const std::exception& e) {
                // A failing step fails its requests, not the server.
                for (Slot& s : slots_)
                    if (s.active) finish(s, FinishReason::Error, e.what());
            }
        }
        // Shutdown: everything still in flight is cancelled.
        for (Slot& s : slots_)
            if (s.active) finish(s, FinishReason::Cancelled);
        std::deque<Pending> rest;
        {
            std::lock_guard<std::mutex> lk(mu_);
            rest.swap(waiting_);
        }
        for (Pending& p : rest) {
            TokenEvent e;
            e.last = true;
            e.finish = FinishReason::Cancelled;
            if (p.cb) p.cb(e);
        }
    }

    void step() {
        std::vector<Slot*> dec, pre;
        for (Slot& s : slots_) {
            if (!s.active) continue;
            (s.decoding() ? dec : pre).push_back(&s);
        }
        if (dec.empty() && pre.empty()) return;
        std::sort(pre.begin(), pre.end(), [](const Slot* a, const Slot* b) { return a->order < b->order; });
        const auto nv = static_cast<size_t>(model_.config().n_vocab);
        std::vector<SeqBatch> batch;
        std::vector<Slot*> owners;
        int64_t budget = opts_.token_budget - static_cast<int64_t>(dec.size());
        for (Slot* s : dec) {
            s->logits.resize(nv);
            batch.push_back(SeqBatch{&s->next, 1, &s->cache, s->logits.data()});
            owners.push_back(s);
        }
        // Prompt chunks at fixed boundaries; one-token chunks count as decode
        // rows and must precede longer ones.
        std::vector<SeqBatch> one, longer;
        std::vector<Slot*> one_o, longer_o;
        bool any_chunk = false;
        for (Slot* s : pre) {
            const int64_t len = static_cast<int64_t>(s->req.prompt.size());
            const int64_t end = std::min(len, (s->prompt_done / opts_.token_budget + 1) * opts_.token_budget);
            const int64_t n = end - s->prompt_done;
            if (any_chunk && n > budget) continue;
            any_chunk = true;
            budget -= n;
            float* lg = nullptr;
            if (end == len) {
                s->logits.resize(nv);
                lg = s->logits.data();
            }
            SeqBatch b{s->req.prompt.data() + s->prompt_done, n, &s->cache, lg};
            (n == 1 ? one : longer).push_back(b);
            (n == 1 ? one_o : longer_o).push_back(s);
        }
        batch.insert(batch.end(), one.begin(), one.end());
        owners.insert(owners.end(), one_o.begin(), one_o.end());
        batch.insert(batch.end(), longer.begin(), longer.end());
        owners.insert(owners.end(), longer_o.begin(), longer_o.end());

        model_.forward_batch(batch.data(), static_cast<int>(batch.size()), pool_);
        {
            std::lock_guard<std::mutex> lk(mu_);
            ++stats_.steps;
        }

        for (size_t i = 0; i < batch.size(); ++i) {
            Slot& s = *owners[i];
            if (!s.decoding()) {
                s.prompt_done += batch[i].n;
                if (!batch[i].logits) continue;  // more prompt to come
            }
            sample_and_report(s);
        }
    }

    void sample_and_report(Slot& s) {
        float* lg = s.logits.data();
        const int64_t nv = model_.config().n_vocab;
        for (const auto& [t, b] : s.req.logit_bias) lg[t] += b;
        const int32_t tok = s.sampler->sample(lg);
        TokenEvent e;
        e.n_prompt = static_cast<int64_t>(s.req.prompt.size());
        if (s.req.top_logprobs >= 0) {
            double mx = -INFINITY;
            for (int64_t i = 0; i < nv; ++i) mx = std::max(mx, static_cast<double>(lg[i]));
            double z = 0;
            for (int64_t i = 0; i < nv; ++i) z += std::exp(static_cast<double>(lg[i]) - mx);
            const double lz = mx + std::log(z);
            e.logprob = static_cast<float>(lg[tok] - lz);
            if (s.req.top_logprobs > 0) {
                std::vector<int32_t> idx(static_cast<size_t>(nv));
                for (int64_t i = 0; i < nv; ++i) idx[static_cast<size_t>(i)] = static_cast<int32_t>(i);
                const int k = std::min<int>(s.req.top_logprobs, static_cast<int>(nv));
                std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                                  [&](int32_t a, int32_t b) { return lg[a] > lg[b] || (lg[a] == lg[b] && a < b); });
                for (int j = 0; j < k; ++j)
                    e.top_logprobs.emplace_back(idx[static_cast<size_t>(j)],
                                                static_cast<float>(lg[idx[static_cast<size_t>(j)]] - lz));
            }
        }
        if (!s.req.ignore_eos && tok_.is_eog(tok)) {
            finish(s, FinishReason::Stop);
            return;
        }
        s.sampler->accept(tok);
        ++s.generated;
        {
            std::lock_guard<std::mutex> lk(mu_);
            ++stats_.generated_tokens;
        }
        e.token = tok;
        e.n_generated = s.generated;
        const bool length = (s.req.max_tokens > 0 && s.generated >= s.req.max_tokens) || s.cache.size() + 1 > s.cache.n_ctx();
        if (length) {
            e.last = true;
            e.finish = FinishReason::Length;
        }
        if (length) {
            TokenCallback cb = std::move(s.cb);
            release(s);
            if (cb) cb(e);
            return;
        }
        const bool keep = s.cb ? s.cb(e) : true;
        if (!keep || s.cancel) {
            finish(s, FinishReason::Cancelled);
            return;
        }
        s.next = tok;
    }

    Model& model_;
    const Tokenizer& tok_;
    EngineOptions opts_;
    ThreadPool pool_;
    std::vector<Slot> slots_;

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Pending> waiting_;
    std::vector<uint64_t> cancelled_;
    bool stopping_ = false;
    uint64_t next_id_ = 0;
    uint64_t admitted_ = 0;
    EngineStats stats_;
    std::thread worker_;
};

}  // namespace

std::unique_ptr<Engine> make_engine(Model& model, const Tokenizer& tokenizer, const EngineOptions& opts) {
    return std::make_unique<CpuEngine>(model, tokenizer, opts);
}

}  // namespace quern
