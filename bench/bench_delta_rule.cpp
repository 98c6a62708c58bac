// bench_delta_rule: times the CPU gated delta rule (backend/cpu/delta_rule.h)
// over one Gated DeltaNet layer's value heads for a prompt of T tokens —
// token by token (what batch-invariant passes and the decode step run) and
// in chunks (what a lone sequence's prefill runs) — heads spread over the
// thread pool as the program runner spreads them. Reports the median time
// per layer, tokens/s per layer and the state traffic of the token-by-token
// form (each token reads and writes the dk × dv state twice: 4·dk·dv·4 bytes).
//
// Usage: bench_delta_rule [--threads N] [--heads 48] [--dk 128] [--dv 128]
//                         [--tokens 512] [--chunk 64] [--reps 5]
// Defaults: one layer of the Qwen3.5-27B shape (48 value heads of 128).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/delta_rule.h"
#include "core/thread_pool.h"

using namespace quern;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
    int threads = 0, reps = 5;
    int64_t heads = 48, dk = 128, dv = 128, T = 512, chunk = 64;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        const int64_t v = std::atoll(argv[i + 1]);
        if (a == "--threads") threads = static_cast<int>(v);
        else if (a == "--heads") heads = v;
        else if (a == "--dk") dk = v;
        else if (a == "--dv") dv = v;
        else if (a == "--tokens") T = v;
        else if (a == "--chunk") chunk = v;
        else if (a == "--reps") reps = static_cast<int>(v);
        else {
            std::fprintf(stderr, "bench_delta_rule: unknown option %s\n", a.c_str());
            return 2;
        }
    }
    ThreadPool pool(threads);
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t row = heads * (2 * dk + dv);  // one token: every head's q, k, v
    std::vector<float> x(static_cast<size_t>(T * row)), g(static_cast<size_t>(heads * T)), beta(g.size());
    for (auto& f : x) f = nd(rng) / std::sqrt(static_cast<float>(dk));
    for (size_t i = 0; i < g.size(); ++i) {
        g[i] = -0.1f * std::abs(nd(rng));
        beta[i] = 0.5f;
    }
    std::vector<float> state(static_cast<size_t>(heads * dk * dv)), out(static_cast<size_t>(T * heads * dv));
    std::vector<std::vector<float>> scratch(static_cast<size_t>(pool.size() + 1));
    const auto layer = [&](bool chunked) {
        std::fill(state.begin(), state.end(), 0.0f);
        pool.parallel_for(heads, 1, [&](int64_t h0, int64_t h1, int worker) {
            for (int64_t h = h0; h < h1; ++h) {
                cpu::DeltaRuleRun r;
                r.q = x.data() + h * dk;
                r.k = x.data() + heads * dk + h * dk;
                r.v = x.data() + 2 * heads * dk + h * dv;
                r.ld_qk = r.ld_v = row;
                r.g = g.data() + h * T;
                r.beta = beta.data() + h * T;
                r.o = out.data() + h * dv;
                r.ld_o = heads * dv;
                r.T = T;
                r.dk = dk;
                r.dv = dv;
                float* S = state.data() + h * dk * dv;
                auto& s = scratch[static_cast<size_t>(worker)];
                if (chunked) {
                    cpu::delta_rule_chunked(r, S, chunk, s);
                } else {
                    s.resize(static_cast<size_t>(dv));
                    cpu::delta_rule_tokens(r, S, s.data());
                }
            }
        });
    };
    std::printf("delta rule, %lld heads of %lldx%lld, %lld tokens, %d threads\n", static_cast<long long>(heads),
                static_cast<long long>(dk), static_cast<long long>(dv), static_cast<long long>(T), pool.size());
    for (bool chunked : {false, true}) {
        std::vector<double> t;
        layer(chunked);  // warm-up
        for (int r = 0; r < reps; ++r) {
            const auto t0 = Clock::now();
            layer(chunked);
            t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        }
        std::sort(t.begin(), t.end());
        const double med = t[t.size() / 2];
        const double bytes = 4.0 * static_cast<double>(dk * dv * 4 * heads * T);
        std::printf("  %-22s %8.2f ms/layer  %9.0f tok/s/layer  (token-by-token state traffic %.1f GB/s)\n",
                    chunked ? ("chunks of " + std::to_string(chunk)).c_str() : "token by token", med * 1e3,
                    static_cast<double>(T) / med, bytes / med / 1e9);
    }
    return 0;
}
