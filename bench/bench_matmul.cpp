// bench_matmul: times quern::cpu::matmul per weight type on model-like shapes
// (SmolLM2-135M: hidden 576, FFN 1536, vocab 49152) for decode (n = 1, GEMV)
// and prefill (n = 512, GEMM). Reports medians of per-call wall time as
//   GB/s  = weight bytes / time      (what decode is bound by)
//   GOP/s = 2 * M * K * n / time     (what prefill is bound by)
// Decode cycles through enough copies of the weight matrix to exceed the L3
// cache (like a real forward pass, which streams ~100 MB of weights per token);
// `--hot` times a single cache-resident copy instead.
//
// `--model q4_1|q8_0|q4_k_m` instead times the matmuls of a whole
// SmolLM2-135M forward pass (30 layers of q/k/v/o 576->576/192, gate/up
// 576->1536, down 1536->576, plus the 576x49152 output head), every layer with
// its own weights as in a real model, and reports matmul-only tokens/s for
// decode (n = 1) and prefill (n = 512 tokens in one batch), or for the
// activation-row counts of --n.
//
// `--path gemv|gemm|decode|tile` forces a kernel family or kernel
// (cpu::MatmulPath; default auto: GEMV below 12 rows, the GEMM family from
// there). With two-level activations (the default of `quern run` and `serve`)
// a batch of N tokens is 2N rows.
//
// Usage: bench_matmul [--threads N] [--types Q4_K,Q8_0,...] [--n 1,512]
//                     [--shapes 576x576,...] [--min-time S] [--hot]
//                     [--model q4_1|q8_0|q4_k_m] [--path auto|gemv|gemm|decode|tile]
// The ISA level follows QUERN_CPU (scalar|avx2|avx512), default the best.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul.h"
#include "core/dtype.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "quant/blocks.h"

using namespace quern;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    size_t p = 0;
    while (p <= s.size()) {
        const size_t q = s.find(sep, p);
        out.push_back(s.substr(p, q == std::string::npos ? std::string::npos : q - p));
        if (q == std::string::npos) break;
        p = q + 1;
    }
    return out;
}

// Random valid blocks: random quant bits, sensible fp16 scales (as the tests).
void fill_weights(DType t, uint8_t* w, size_t bytes, std::mt19937& rng) {
    std::uniform_int_distribution<uint32_t> u32;
    for (size_t i = 0; i + 4 <= bytes; i += 4) {
        const uint32_t v = u32(rng);
        std::memcpy(w + i, &v, 4);
    }
    auto put = [](uint8_t* p, float v) {
        const uint16_t h = fp32_to_fp16(v);
        std::memcpy(p, &h, 2);
    };
    const auto& info = dtype_info(t);
    if (t == DType::F32) {
        for (size_t i = 0; i + 4 <= bytes; i += 4) {
            const float f = static_cast<float>(static_cast<int>(u32(rng) % 2001) - 1000) * 1e-3f;
            std::memcpy(w + i, &f, 4);
        }
        return;
    }
    if (t == DType::F16 || t == DType::BF16) {
        for (size_t i = 0; i + 2 <= bytes; i += 2) {
            const float f = static_cast<float>(static_cast<int>(u32(rng) % 2001) - 1000) * 1e-3f;
            const uint16_t h = t == DType::F16 ? fp32_to_fp16(f) : fp32_to_bf16(f);
            std::memcpy(w + i, &h, 2);
        }
        return;
    }
    for (size_t b = 0; b + static_cast<size_t>(info.type_size) <= bytes; b += static_cast<size_t>(info.type_size)) {
        uint8_t* p = w + b;
        switch (t) {
            case DType::Q4_0:
            case DType::Q5_0:
            case DType::Q8_0: put(p, 0.01f); break;
            case DType::Q4_1:
            case DType::Q5_1:
                put(p, 0.01f);
                put(p + 2, -0.05f);
                break;
            case DType::Q2_K:
                put(p + offsetof(block_q2_K, d), 0.01f);
                put(p + offsetof(block_q2_K, dmin), 0.01f);
                break;
            case DType::Q3_K: put(p + offsetof(block_q3_K, d), 0.01f); break;
            case DType::Q4_K:
            case DType::Q5_K:
                put(p, 0.001f);
                put(p + 2, 0.001f);
                break;
            case DType::Q6_K: put(p + offsetof(block_q6_K, d), 0.001f); break;
            default: break;
        }
    }
}

struct Result {
    double sec;  // median seconds per call
};

template <class F>
double median_time(F&& call, double min_time, int min_reps) {
    std::vector<double> ts;
    const auto t_end = Clock::now() + std::chrono::duration<double>(min_time);
    call(0);  // warm-up
    for (int i = 0; static_cast<int>(ts.size()) < min_reps || Clock::now() < t_end; ++i) {
        const auto t0 = Clock::now();
        call(i);
        ts.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        if (ts.size() > 100000) break;
    }
    std::nth_element(ts.begin(), ts.begin() + static_cast<ptrdiff_t>(ts.size() / 2), ts.end());
    return ts[ts.size() / 2];
}

struct ModelTensor {
    DType type;
    int64_t K, M;
};

// SmolLM2-135M: hidden 576, 9 heads x 64 (q, o: 576), 3 KV heads (k, v: 192),
// FFN 1536, 30 layers, vocabulary 49152 (output tied to the embedding).
std::vector<ModelTensor> smollm2(const std::string& variant) {
    std::vector<ModelTensor> ts;
    for (int l = 0; l < 30; ++l) {
        DType qko, v, gu, down;
        if (variant == "q4_1") {
            qko = v = gu = down = DType::Q4_1;
        } else if (variant == "q8_0") {
            qko = v = gu = down = DType::Q8_0;
        } else {  // llama.cpp Q4_K_M: 576-wide rows fall back to Q5_0 / Q8_0
            qko = gu = DType::Q5_0;
            v = DType::Q8_0;
            down = (l % 2 == 0) ? DType::Q6_K : DType::Q4_K;
        }
        ts.push_back({qko, 576, 576});
        ts.push_back({qko, 576, 192});
        ts.push_back({v, 576, 192});
        ts.push_back({qko, 576, 576});
        ts.push_back({gu, 576, 1536});
        ts.push_back({gu, 576, 1536});
        ts.push_back({down, 1536, 576});
    }
    ts.push_back({DType::Q8_0, 576, 49152});
    return ts;
}

int run_model(const std::string& variant, ThreadPool& pool, double min_time, const std::vector<int64_t>& ns,
              cpu::MatmulPath path) {
    if (variant != "q4_1" && variant != "q8_0" && variant != "q4_k_m") {
        std::fprintf(stderr, "unknown model variant %s (q4_1, q8_0, q4_k_m)\n", variant.c_str());
        return 2;
    }
    const std::vector<ModelTensor> ts = smollm2(variant);
    std::mt19937 rng(3);
    std::vector<std::vector<uint8_t>> store;
    std::vector<Tensor> Ws;
    size_t total = 0;
    double ops = 0;
    for (const auto& t : ts) {
        const size_t bytes = row_size(t.type, t.K) * static_cast<size_t>(t.M);
        store.emplace_back(bytes);
        fill_weights(t.type, store.back().data(), bytes, rng);
        Ws.push_back(Tensor::contiguous(t.type, {t.K, t.M, 1, 1}, store.back().data(), "w"));
        total += bytes;
        ops += 2.0 * static_cast<double>(t.K * t.M);
    }
    std::printf("# SmolLM2-135M %s: %zu matmuls, %.1f MB of weights per token\n", variant.c_str(), ts.size(),
                static_cast<double>(total) / 1e6);
    std::printf("| phase | n | median ms per pass | rows/s (matmul only) | GB/s | GOP/s |\n|---|---|---|---|---|---|\n");
    for (int64_t n : ns) {
        std::vector<float> x(static_cast<size_t>(n * 1536)), y(static_cast<size_t>(n * 49152));
        std::normal_distribution<float> g;
        for (auto& v : x) v = g(rng);
        const double sec = median_time(
            [&](int) {
                for (const Tensor& W : Ws) cpu::matmul(W, x.data(), n, y.data(), W.ne[1], pool, path);
            },
            min_time, n == 1 ? 20 : 3);
        std::printf("| %s | %lld | %.3f | %.0f | %.1f | %.1f |\n", n < 12 ? "decode" : n < 512 ? "batch" : "prefill",
                    static_cast<long long>(n), sec * 1e3, static_cast<double>(n) / sec,
                    static_cast<double>(total) / sec * 1e-9, ops * static_cast<double>(n) / sec * 1e-9);
        std::fflush(stdout);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    int threads = 2;
    std::string types = "F32,F16,BF16,Q4_0,Q4_1,Q5_0,Q5_1,Q8_0,Q2_K,Q3_K,Q4_K,Q5_K,Q6_K";
    std::string shapes = "576x576,576x1536,1536x576,576x49152";
    std::string ns = "1,512";
    double min_time = 0.3;
    bool hot = false;
    std::string model;
    cpu::MatmulPath path = cpu::MatmulPath::Auto;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "missing value for %s\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--threads") threads = std::stoi(next());
        else if (a == "--types") types = next();
        else if (a == "--shapes") shapes = next();
        else if (a == "--n") ns = next();
        else if (a == "--min-time") min_time = std::stod(next());
        else if (a == "--hot") hot = true;
        else if (a == "--model") model = next();
        else if (a == "--path") {
            const std::string v = next();
            if (v == "auto") path = cpu::MatmulPath::Auto;
            else if (v == "gemv") path = cpu::MatmulPath::Gemv;
            else if (v == "gemm") path = cpu::MatmulPath::Gemm;
            else if (v == "decode") path = cpu::MatmulPath::Decode;
            else if (v == "tile") path = cpu::MatmulPath::Tile;
            else {
                std::fprintf(stderr, "unknown path %s (auto, gemv, gemm, decode, tile)\n", v.c_str());
                return 2;
            }
        } else {
            std::fprintf(stderr, "usage: %s [--threads N] [--types T,..] [--shapes KxM,..] [--n 1,512] [--min-time S] [--hot] [--model q4_1|q8_0|q4_k_m] [--path auto|gemv|gemm|decode|tile]\n",
                         argv[0]);
            return 2;
        }
    }
    ThreadPool pool(threads);
    static const char* const kPathNames[] = {"auto", "gemv", "gemm", "decode", "tile"};
    const char* pname = kPathNames[static_cast<int>(path)];
    std::vector<int64_t> nlist;
    for (const std::string& v : split(ns, ',')) nlist.push_back(std::stoll(v));
    if (!model.empty()) {
        std::printf("# isa=%s threads=%d path=%s\n", std::string(cpu::isa_name(cpu::active_isa())).c_str(), threads,
                    pname);
        return run_model(model, pool, min_time, nlist, path);
    }
    std::printf("# isa=%s threads=%d path=%s %s\n", std::string(cpu::isa_name(cpu::active_isa())).c_str(), threads,
                pname, hot ? "(hot: weights cache-resident)" : "(decode: weights streamed from DRAM)");
    std::printf("| type | K x M | n | median us | GB/s | GOP/s |\n|---|---|---|---|---|---|\n");
    std::mt19937 rng(1);
    for (const std::string& tn : split(types, ',')) {
        const auto t = dtype_from_name(tn);
        if (!t) {
            std::fprintf(stderr, "unknown type %s\n", tn.c_str());
            return 2;
        }
        for (const std::string& sh : split(shapes, ',')) {
            const auto km = split(sh, 'x');
            const int64_t K = std::stoll(km.at(0)), M = std::stoll(km.at(1));
            if (K % dtype_info(*t).block_size != 0) continue;  // e.g. K-quants need K % 256 == 0
            const size_t bytes = row_size(*t, K) * static_cast<size_t>(M);
            for (const int64_t n : nlist) {
                // decode and batches below prefill size: enough copies to exceed a 32 MiB L3 twice over
                const size_t copies =
                    (n < 512 && !hot) ? std::max<size_t>(1, (96u << 20) / bytes + 1) : size_t(1);
                std::vector<uint8_t> w(bytes * copies);
                fill_weights(*t, w.data(), bytes, rng);
                for (size_t c = 1; c < copies; ++c) std::memcpy(w.data() + c * bytes, w.data(), bytes);
                std::vector<float> x(static_cast<size_t>(n * K)), y(static_cast<size_t>(n * M));
                std::normal_distribution<float> g;
                for (auto& v : x) v = g(rng);
                std::vector<Tensor> Ws;
                for (size_t c = 0; c < copies; ++c)
                    Ws.push_back(Tensor::contiguous(*t, {K, M, 1, 1}, w.data() + c * bytes, "w"));
                const double sec = median_time(
                    [&](int i) { cpu::matmul(Ws[static_cast<size_t>(i) % copies], x.data(), n, y.data(), M, pool, path); },
                    min_time, n == 1 ? 50 : 5);
                std::printf("| %s | %lldx%lld | %lld | %.1f | %.1f | %.1f |\n", tn.c_str(), static_cast<long long>(K),
                            static_cast<long long>(M), static_cast<long long>(n), sec * 1e6,
                            static_cast<double>(bytes) / sec * 1e-9, 2.0 * K * M * n / sec * 1e-9);
                std::fflush(stdout);
            }
        }
    }
    return 0;
}
