// A scripted Engine for the server tests: every request generates the token
// ids of a fixed text (or of a function of its prompt), one token every
// `interval` on its own worker thread, with n_parallel slots and a bounded
// queue as the real engine has. Honors max_tokens (Length), the end of the
// script (Stop), cancel() and a callback returning false (Cancelled).
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "runtime/engine.h"

namespace quern::test {

class FakeEngine : public Engine {
public:
    using Script = std::function<std::vector<int32_t>(const GenerationRequest&)>;

    FakeEngine(Script script, EngineOptions opts, std::chrono::microseconds interval = std::chrono::microseconds(200))
        : script_(std::move(script)), opts_(opts), interval_(interval), worker_([this] { loop(); }) {}
    ~FakeEngine() override { shutdown(); }

    uint64_t submit(GenerationRequest req, TokenCallback cb) override {
        if (req.prompt.empty()) fail("the prompt is empty");
        if (static_cast<int64_t>(req.prompt.size()) + 1 > opts_.n_ctx) fail("the prompt is longer than the context");
        std::lock_guard<std::mutex> lock(mu_);
        if (stopped_) fail("the engine is shut down");
        if (static_cast<int>(running_.size() + waiting_.size()) >= opts_.n_parallel + opts_.max_queue)
            throw QueueFullError(std::to_string(waiting_.size()) + " requests are waiting");
        const uint64_t id = ++next_id_;
        Seq s;
        s.id = id;
        s.tokens = script_(req);
        s.req = std::move(req);
        s.cb = std::move(cb);
        waiting_.push_back(std::move(s));
        ++submitted_;
        cv_.notify_all();
        return id;
    }
    void cancel(uint64_t id) override {
        std::lock_guard<std::mutex> lock(mu_);
        cancel_requests_.push_back(id);
        cv_.notify_all();
    }
    EngineStats stats() const override {
        std::lock_guard<std::mutex> lock(mu_);
        EngineStats s;
        s.running = static_cast<int>(running_.size());
        s.waiting = static_cast<int>(waiting_.size());
        s.requests_finished = finished_;
        return s;
    }
    const EngineOptions& options() const override { return opts_; }
    void shutdown() override {
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (stopped_) return;
            stopped_ = true;
            cv_.notify_all();
        }
        worker_.join();
    }

    /// While paused, no token is generated (requests stay where they are).
    void pause(bool p) {
        std::lock_guard<std::mutex> lock(mu_);
        paused_ = p;
        cv_.notify_all();
    }
    int64_t cancelled() const { return cancelled_.load(); }
    int64_t submitted() const {
        std::lock_guard<std::mutex> lock(mu_);
        return submitted_;
    }
    int active() const {
        std::lock_guard<std::mutex> lock(mu_);
        return static_cast<int>(running_.size() + waiting_.size());
    }
    /// Every request submitted so far (sampling parameters, seeds).
    std::vector<GenerationRequest> requests() const {
        std::lock_guard<std::mutex> lock(mu_);
        return log_;
    }

private:
    struct Seq {
        uint64_t id = 0;
        GenerationRequest req;
        TokenCallback cb;
        std::vector<int32_t> tokens;
        size_t pos = 0;
    };

    void loop() {
        std::unique_lock<std::mutex> lock(mu_);
        for (;;) {
            cv_.wait_for(lock, interval_, [this] { return stopped_; });  // one step per interval
            if (stopped_) break;
            while (static_cast<int>(running_.size()) < opts_.n_parallel && !waiting_.empty()) {
                log_.push_back(waiting_.front().req);
                running_.push_back(std::move(waiting_.front()));
                waiting_.pop_front();
            }
            std::vector<uint64_t> cancels;
            cancels.swap(cancel_requests_);
            if (paused_ && cancels.empty()) continue;
            // one step: every running sequence gets a token (or its end)
            std::vector<Seq> run;
            run.swap(running_);
            const bool paused = paused_;
            lock.unlock();
            std::vector<Seq> keep;
            for (Seq& s : run) {
                TokenEvent ev;
                ev.n_prompt = static_cast<int64_t>(s.req.prompt.size());
                ev.n_cached = ev.n_prompt / 2;
                bool end = false;
                const bool cancelled = std::find(cancels.begin(), cancels.end(), s.id) != cancels.end();
                if (cancelled) {
                    ev.last = true;
                    ev.finish = FinishReason::Cancelled;
                    end = true;
                } else if (paused) {
                    keep.push_back(std::move(s));
                    continue;
                } else if (s.pos >= s.tokens.size()) {
                    ev.last = true;
                    ev.finish = FinishReason::Stop;
                    end = true;
                } else {
                    ev.token = s.tokens[s.pos++];
                    ev.n_generated = static_cast<int64_t>(s.pos);
                    if (s.req.top_logprobs >= 0) {
                        ev.logprob = -0.25f * static_cast<float>(s.pos % 4);
                        for (int k = 0; k < s.req.top_logprobs; ++k) ev.top_logprobs.emplace_back(ev.token + k, -0.5f * k);
                    }
                    if (s.req.max_tokens >= 0 && static_cast<int64_t>(s.pos) >= s.req.max_tokens) {
                        ev.last = true;
                        ev.finish = FinishReason::Length;
                        end = true;
                    }
                }
                const bool go_on = s.cb(ev);
                if (!go_on && !end) {
                    TokenEvent fin;
                    fin.last = true;
                    fin.finish = FinishReason::Cancelled;
                    s.cb(fin);
                    end = true;
                    ++cancelled_;
                } else if (cancelled) {
                    ++cancelled_;
                }
                if (end) {
                    std::lock_guard<std::mutex> l(mu_);
                    ++finished_;
                } else {
                    keep.push_back(std::move(s));
                }
            }
            lock.lock();
            for (Seq& s : keep) running_.push_back(std::move(s));
            // cancels of waiting requests
            for (uint64_t id : cancels)
                for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
                    if (it->id == id) {
                        TokenEvent fin;
                        fin.last = true;
                        fin.finish = FinishReason::Cancelled;
                        Seq s = std::move(*it);
                        waiting_.erase(it);
                        lock.unlock();
                        s.cb(fin);
                        lock.lock();
                        ++cancelled_;
                        break;
                    }
        }
        // shutdown: cancel everything
        std::vector<Seq> all;
        for (Seq& s : running_) all.push_back(std::move(s));
        for (Seq& s : waiting_) all.push_back(std::move(s));
        running_.clear();
        waiting_.clear();
        lock.unlock();
        for (Seq& s : all) {
            TokenEvent fin;
            fin.last = true;
            fin.finish = FinishReason::Cancelled;
            s.cb(fin);
        }
    }

    Script script_;
    EngineOptions opts_;
    std::chrono::microseconds interval_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Seq> waiting_;
    std::vector<Seq> running_;
    std::vector<uint64_t> cancel_requests_;
    std::vector<GenerationRequest> log_;
    uint64_t next_id_ = 0;
    int64_t submitted_ = 0;
    int64_t finished_ = 0;
    std::atomic<int64_t> cancelled_{0};
    bool stopped_ = false;
    bool paused_ = false;
    std::thread worker_;
};

}  // namespace quern::test
