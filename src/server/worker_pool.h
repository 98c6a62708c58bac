// The threads that run the HTTP transport's requests (http_transport.h). A
// request that finds no idle worker gets a new thread, up to a cap (beyond,
// requests wait in order); workers idle for a while exit down to a floor.
// Requests in flight are few next to open connections: idle and slow
// connections wait on the event loop and hold no worker.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace quern::server::http {

class WorkerPool {
public:
    /// Keeps up to `floor` idle workers; never more than `cap` threads
    /// (beyond, requests wait in order for a worker).
    WorkerPool(size_t floor, size_t cap) : floor_(floor), cap_(cap < 1 ? 1 : cap) {}
    ~WorkerPool() { shutdown(); }
    WorkerPool(const WorkerPool&) = delete;
    WorkerPool& operator=(const WorkerPool&) = delete;

    /// Runs fn on a worker.
    void enqueue(std::function<void()> fn) {
        std::lock_guard<std::mutex> lock(mu_);
        jobs_.push_back(std::move(fn));
        if (jobs_.size() > idle_ && threads_ < cap_) {
            ++threads_;
            std::thread([this] { work(); }).detach();
        }
        cv_.notify_one();
    }

    /// Runs the queued requests to their end, then returns once every
    /// worker has exited.
    void shutdown() {
        std::unique_lock<std::mutex> lock(mu_);
        stop_ = true;
        cv_.notify_all();
        done_.wait(lock, [this] { return threads_ == 0; });
    }

private:
    void work() {
        std::unique_lock<std::mutex> lock(mu_);
        for (;;) {
            ++idle_;
            const bool woke = cv_.wait_for(lock, std::chrono::seconds(30), [this] { return stop_ || !jobs_.empty(); });
            --idle_;
            if (jobs_.empty() && (stop_ || (!woke && threads_ > floor_))) break;
            if (jobs_.empty()) continue;
            std::function<void()> fn = std::move(jobs_.front());
            jobs_.pop_front();
            lock.unlock();
            fn();
            lock.lock();
        }
        if (--threads_ == 0) done_.notify_all();
    }

    const size_t floor_, cap_;
    std::mutex mu_;
    std::condition_variable cv_, done_;
    std::deque<std::function<void()>> jobs_;
    size_t threads_ = 0, idle_ = 0;
    bool stop_ = false;
};

}  // namespace quern::server::http
