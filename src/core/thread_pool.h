// A small fork-join thread pool tuned for inference: one parallel region per
// op, many regions per token. Workers spin briefly between regions (a region
// follows the last one within microseconds during decode) and then sleep, so an
// idle engine uses no CPU.
//
// On a busy machine a worker may not get a core for a whole scheduler slice
// (milliseconds, where a decode op takes tens of microseconds). run() waits
// for every worker; share() only for those that joined before the caller
// finished its own part — with work that threads claim as they go
// (parallel_for, cpu::split_rows), the caller takes what a descheduled
// worker never started.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace quern {

class ThreadPool {
public:
    /// n_threads counts the calling thread; n_threads <= 0 picks the number of
    /// hardware threads.
    explicit ThreadPool(int n_threads = 0);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }

    /// Runs fn(ith, nth) once on each of the nth threads (the caller is ith 0)
    /// and returns when all have finished. Not reentrant: do not call run()
    /// or share() from inside fn. Exceptions must not escape fn.
    void run(const std::function<void(int ith, int nth)>& fn) { start(fn, false); }

    /// Runs fn(0, nth) on the caller and fn(ith, nth) on each worker that
    /// starts before the caller's call returns (at most once each); returns
    /// when those have finished. For work claimed from shared counters: the
    /// caller's fn must not return while work is unclaimed, whichever
    /// workers join. Same rules as run().
    void share(const std::function<void(int ith, int nth)>& fn) { start(fn, true); }

    /// Splits [0, n) into chunks of at most `grain` items handed out
    /// dynamically; fn(begin, end, ith) is called once per chunk.
    template <class F>
    void parallel_for(int64_t n, int64_t grain, F&& fn) {
        if (n <= 0) return;
        if (grain < 1) grain = 1;
        if (n_threads_ == 1 || n <= grain) {
            for (int64_t b = 0; b < n; b += grain) fn(b, b + grain < n ? b + grain : n, 0);
            return;
        }
        std::atomic<int64_t> next{0};
        share([&](int ith, int) {
            for (;;) {
                const int64_t b = next.fetch_add(grain, std::memory_order_relaxed);
                if (b >= n) break;
                fn(b, b + grain < n ? b + grain : n, ith);
            }
        });
    }

    /// Number of hardware threads the process may use.
    static int hardware_threads();

private:
    void start(const std::function<void(int, int)>& fn, bool shared);
    void worker(int ith);

    int n_threads_;
    std::vector<std::thread> threads_;
    const std::function<void(int, int)>* job_ = nullptr;
    alignas(64) std::atomic<uint32_t> generation_{0};
    // The region's entry: its generation (high 32 bits), kClosed once a
    // shared region stops taking workers, and how many have joined (low bits).
    alignas(64) std::atomic<uint64_t> gate_{0};
    alignas(64) std::atomic<int> done_{0};  // workers that joined and finished
    alignas(64) std::atomic<bool> stop_{false};
};

}  // namespace quern
