#include "core/thread_pool.h"

#include <sched.h>

#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#define QUERN_PAUSE() _mm_pause()
#else
#define QUERN_PAUSE() std::this_thread::yield()
#endif

namespace quern {

int ThreadPool::hardware_threads() {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        const int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    const unsigned n = std::thread::hardware_concurrency();
    return n ? static_cast<int>(n) : 1;
}

ThreadPool::ThreadPool(int n_threads) {
    n_threads_ = n_threads > 0 ? n_threads : hardware_threads();
    threads_.reserve(static_cast<size_t>(n_threads_ - 1));
    for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    stop_.store(true);
    generation_.fetch_add(1);
    generation_.notify_all();
    for (auto& t : threads_) t.join();
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
    if (n_threads_ == 1) {
        fn(0, 1);
        return;
    }
    job_ = &fn;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    fn(0, n_threads_);
    // Spin briefly (the workers usually finish within microseconds of us), then
    // yield so that a worker waiting for a CPU (a busy machine) can run here.
    for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
        if (spins < 4096) QUERN_PAUSE();
        else std::this_thread::yield();
    }
}

void ThreadPool::worker(int ith) {
    uint32_t seen = 0;
    for (;;) {
        // Spin for a short while (~1 ms) before sleeping on the generation word.
        uint32_t g = generation_.load(std::memory_order_acquire);
        if (g == seen) {
            const auto t0 = std::chrono::steady_clock::now();
            int spins = 0;
            while ((g = generation_.load(std::memory_order_acquire)) == seen) {
                QUERN_PAUSE();
                if ((++spins & 1023) == 0) {
                    std::this_thread::yield();
                    if (std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(1)) {
                        generation_.wait(seen, std::memory_order_acquire);
                    }
                }
            }
        }
        seen = g;
        if (stop_.load()) return;
        (*job_)(ith, n_threads_);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
}

}  // namespace quern
