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

namespace {

constexpr uint64_t kClosed = uint64_t{1} << 31;
constexpr uint64_t kJoined = kClosed - 1;  // mask of the joined count

/// Spins briefly, then yields, until `done` reaches `want`: the workers
/// usually finish within microseconds of the caller, and yielding lets a
/// worker waiting for a CPU (a busy machine) run here.
void wait_for(const std::atomic<int>& done, int want) {
    for (int spins = 0; done.load(std::memory_order_acquire) != want; ++spins) {
        if (spins < 4096) QUERN_PAUSE();
        else std::this_thread::yield();
    }
}

}  // namespace

void ThreadPool::start(const std::function<void(int, int)>& fn, bool shared) {
    if (n_threads_ == 1) {
        fn(0, 1);
        return;
    }
    job_ = &fn;
    done_.store(0, std::memory_order_relaxed);
    const uint32_t g = generation_.load(std::memory_order_relaxed) + 1;
    gate_.store(uint64_t{g} << 32, std::memory_order_relaxed);
    generation_.store(g, std::memory_order_release);  // publishes job_, done_ and gate_
    generation_.notify_all();
    fn(0, n_threads_);
    if (!shared) return wait_for(done_, n_threads_ - 1);
    const uint64_t gate = gate_.fetch_or(kClosed, std::memory_order_acq_rel);
    wait_for(done_, static_cast<int>(gate & kJoined));
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
        // Join region g unless it has closed (a shared region the caller
        // finished without us) or a later one has begun.
        uint64_t gate = gate_.load(std::memory_order_acquire);
        bool joined = false;
        while ((gate >> 32) == g && !(gate & kClosed))
            if (gate_.compare_exchange_weak(gate, gate + 1, std::memory_order_acq_rel)) {
                joined = true;
                break;
            }
        if (!joined) continue;
        (*job_)(ith, n_threads_);
        done_.fetch_add(1, std::memory_order_acq_rel);
    }
}

}  // namespace quern
