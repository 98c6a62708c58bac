// The threads that serve httplib's connections. httplib's own ThreadPool has
// a fixed size: connections that send slowly (slowloris) or sit idle between
// keep-alive requests each hold a worker, and once they hold all of them
// /health and every request wait. Here a connection that finds no idle
// worker gets a new thread (up to a cap), so slow or idle clients only park
// threads of their own; workers idle for a while exit down to a floor.
// Header-only: httplib's build flags change its types, so only server.cpp
// (compiled with them) includes it.
#pragma once
#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace quern::server {

class ConnectionPool : public httplib::TaskQueue {
public:
    /// Keeps up to `floor` idle workers; never more than `cap` threads
    /// (beyond, connections wait in order for a worker).
    ConnectionPool(size_t floor, size_t cap) : floor_(floor), cap_(cap < 1 ? 1 : cap) {}
    ~ConnectionPool() override { shutdown(); }
    ConnectionPool(const ConnectionPool&) = delete;
    ConnectionPool& operator=(const ConnectionPool&) = delete;

    void enqueue(std::function<void()> fn) override {
        std::lock_guard<std::mutex> lock(mu_);
        jobs_.push_back(std::move(fn));
        if (jobs_.size() > idle_ && threads_ < cap_) {
            ++threads_;
            std::thread([this] { work(); }).detach();
        }
        cv_.notify_one();
    }

    /// Runs the queued connections to their end, then returns once every
    /// worker has exited.
    void shutdown() override {
        std::unique_lock<std::mutex> lock(mu_);
        stop_ = true;
        cv_.notify_all();
        done_.wait(lock, [this] { return threads_ == 0; });
    }

    size_t threads() const {
        std::lock_guard<std::mutex> lock(mu_);
        return threads_;
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
    mutable std::mutex mu_;
    std::condition_variable cv_, done_;
    std::deque<std::function<void()>> jobs_;
    size_t threads_ = 0, idle_ = 0;
    bool stop_ = false;
};

}  // namespace quern::server
