// The memory roofline a CPU decode is held to: how fast 1..N threads stream
// a buffer far larger than the caches with plain 64-byte loads (no compute),
// the figure bench/cpu-decode.md compares the GEMV kernels' GB/s with.
//   bench_read_bw [--mb 1024] [--threads 1,2] [--reps 5]    prints "threads GB/s" (median)
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

// Sums 64-byte vectors of [p, p + n) (n a multiple of 256) so the loads cannot be elided.
uint64_t read_span(const uint8_t* p, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i < n; i += 256) {
        a = _mm256_add_epi64(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
        b = _mm256_add_epi64(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
        c = _mm256_add_epi64(c, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 128)));
        d = _mm256_add_epi64(d, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 192)));
    }
    alignas(32) uint64_t v[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(v), _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d)));
    return v[0] + v[1] + v[2] + v[3];
}

}  // namespace

int main(int argc, char** argv) {
    size_t mb = 1024;
    int reps = 5;
    std::vector<int> threads = {1, 2};
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--mb" && i + 1 < argc) mb = std::strtoull(argv[++i], nullptr, 10);
        else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
        else if (a == "--threads" && i + 1 < argc) {
            threads.clear();
            for (const char* s = argv[++i]; *s;) {
                threads.push_back(std::atoi(s));
                while (*s && *s != ',') ++s;
                if (*s) ++s;
            }
        } else {
            std::fprintf(stderr, "usage: %s [--mb 1024] [--threads 1,2] [--reps 5]\n", argv[0]);
            return a == "-h" || a == "--help" ? 0 : 2;
        }
    }
    const size_t n = mb << 20;
    auto* buf = static_cast<uint8_t*>(std::aligned_alloc(4096, n));
    if (!buf) return 1;
    std::memset(buf, 1, n);  // fault every page in before timing
    uint64_t sink = 0;
    for (int nt : threads) {
        std::vector<double> gbs;
        for (int r = 0; r < reps; ++r) {
            std::vector<uint64_t> sums(static_cast<size_t>(nt));
            const auto t0 = std::chrono::steady_clock::now();
            std::vector<std::thread> ts;
            const size_t part = n / static_cast<size_t>(nt) / 256 * 256;
            for (int t = 0; t < nt; ++t)
                ts.emplace_back([&, t] { sums[static_cast<size_t>(t)] = read_span(buf + part * static_cast<size_t>(t), part); });
            for (auto& t : ts) t.join();
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            for (uint64_t v : sums) sink += v;
            gbs.push_back(static_cast<double>(part) * nt / s / 1e9);
        }
        std::sort(gbs.begin(), gbs.end());
        std::printf("%d %.2f\n", nt, gbs[gbs.size() / 2]);
    }
    std::free(buf);
    return sink == 42 ? 3 : 0;  // keeps the sums live
}
