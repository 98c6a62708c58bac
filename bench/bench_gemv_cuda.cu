// bench_gemv_cuda: achieved bandwidth of the CUDA decode GEMV kernels on
// Llama-3-8B shapes, against ceilings measured in the same run.
//
//   bench_gemv_cuda [--reps N] [--quick] [--csv FILE] [--only KERNEL] [--shape SUBSTR] [--rotate-mb MB] [--levels 1|2]
//   (--only takes a type name such as Q4_1 or a kernel label such as "Q4_1 dp4a")
//
// Ceilings: a 1 GiB cudaMemcpy device-to-device (bytes read + written over
// time, the "copy bandwidth") and a 1 GiB read-only streaming kernel.
// Per kernel and shape: weights of random bits with sane scales (never zeros);
// enough copies of the matrix (rotated, >= --rotate-mb MiB in all) that every
// launch reads from DRAM, not from the 50 MB L2; a CUDA graph of L >= 32
// back-to-back launches (as a captured decode step would run them), replayed
// after a warm-up; time per launch = event time / L; the median of --reps
// replays is reported. Bytes counted: weights + activation + output.
// --quick times the default configuration only; otherwise every launch
// configuration is timed and the best is shown next to the default.
// A spot check compares 16 rows of every (kernel, shape) with the CPU reference.
// --levels 2 times the quantized kernels with two-level activations (gemv.h;
// the default of `quern`); the spot check, made for one level, is skipped.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/weights.h"
#include "core/dtype.h"
#include "core/fp16.h"
#include "core/tensor.h"
#include "quant/blocks.h"
#include "quant/reference.h"

using namespace quern;
using namespace quern::cuda;

namespace {

struct Shape {
    const char* name;
    int64_t N, K;
};
const Shape kShapes[] = {
    {"q/o 4096x4096", 4096, 4096},       {"k/v 1024x4096", 1024, 4096},         {"gate/up 14336x4096", 14336, 4096},
    {"down 4096x14336", 4096, 14336},    {"output 128256x4096", 128256, 4096},
};

struct Kernel {
    DType type;
    bool float_act;
    const char* label;
};
const Kernel kKernels[] = {
    {DType::Q4_1, false, "Q4_1 dp4a"}, {DType::Q8_0, false, "Q8_0 dp4a"}, {DType::Q4_K, false, "Q4_K dp4a"},
    {DType::Q6_K, false, "Q6_K dp4a"}, {DType::F16, true, "F16"},        {DType::BF16, true, "BF16"},
    {DType::F32, true, "F32"},         {DType::Q4_0, false, "Q4_0 dp4a"}, {DType::Q5_0, false, "Q5_0 dp4a"},
    {DType::Q5_1, false, "Q5_1 dp4a"}, {DType::Q5_K, false, "Q5_K dp4a"}, {DType::Q2_K, false, "Q2_K dp4a"},
    {DType::Q3_K, false, "Q3_K dp4a"}, {DType::NVFP4, false, "NVFP4 dp4a"}, {DType::F8_E4M3_B32, true, "F8_E4M3_B32"},
};

uint64_t splitmix(uint64_t& s) {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

template <class F>
void parallel_for(int64_t n, F f) {
    const int nt = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
    std::vector<std::thread> th;
    for (int t = 0; t < nt; ++t)
        th.emplace_back([=] {
            for (int64_t i = n * t / nt; i < n * (t + 1) / nt; ++i) f(i);
        });
    for (auto& x : th) x.join();
}

void put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// Random bits with sensible scales (per block), or random values for float types.
std::vector<uint8_t> make_weights(DType t, int64_t N, int64_t K, uint64_t seed) {
    const size_t rb = row_size(t, K);
    std::vector<uint8_t> w(rb * static_cast<size_t>(N));
    parallel_for(N, [&](int64_t r) {
        uint64_t s = seed * 0x100000001B3ull + static_cast<uint64_t>(r);
        uint8_t* row = w.data() + static_cast<size_t>(r) * rb;
        auto uni = [&](float lo, float hi) {
            return lo + (hi - lo) * static_cast<float>(splitmix(s) >> 40) * (1.0f / 16777216.0f);
        };
        if (t == DType::F32) {
            for (int64_t k = 0; k < K; ++k) {
                const float v = uni(-1, 1);
                std::memcpy(row + 4 * k, &v, 4);
            }
            return;
        }
        if (t == DType::F16 || t == DType::BF16) {
            for (int64_t k = 0; k < K; ++k) put16(row + 2 * k, t == DType::F16 ? fp32_to_fp16(uni(-1, 1)) : fp32_to_bf16(uni(-1, 1)));
            return;
        }
        for (size_t i = 0; i + 8 <= rb; i += 8) {
            const uint64_t v = splitmix(s);
            std::memcpy(row + i, &v, 8);
        }
        for (size_t i = rb / 8 * 8; i < rb; ++i) row[i] = static_cast<uint8_t>(splitmix(s));
        const auto& info = dtype_info(t);
        for (int64_t b = 0; b < K / info.block_size; ++b) {
            uint8_t* p = row + b * info.type_size;
            switch (t) {
                case DType::Q8_0: put16(p, fp32_to_fp16(uni(0.002f, 0.02f))); break;
                case DType::Q4_1:
                    put16(p, fp32_to_fp16(uni(0.002f, 0.02f)));
                    put16(p + 2, fp32_to_fp16(uni(-0.1f, 0.1f)));
                    break;
                case DType::Q4_K:
                    put16(p, fp32_to_fp16(uni(0.0002f, 0.002f)));
                    put16(p + 2, fp32_to_fp16(uni(0.0002f, 0.002f)));
                    break;
                case DType::Q6_K: put16(p + offsetof(block_q6_K, d), fp32_to_fp16(uni(0.0002f, 0.002f))); break;
                case DType::Q4_0:
                case DType::Q5_0: put16(p, fp32_to_fp16(uni(0.002f, 0.02f))); break;
                case DType::Q5_1:
                    put16(p, fp32_to_fp16(uni(0.002f, 0.02f)));
                    put16(p + 2, fp32_to_fp16(uni(-0.1f, 0.1f)));
                    break;
                case DType::Q5_K:
                    put16(p, fp32_to_fp16(uni(0.0002f, 0.002f)));
                    put16(p + 2, fp32_to_fp16(uni(0.0002f, 0.002f)));
                    break;
                case DType::Q2_K:
                    put16(p + offsetof(block_q2_K, d), fp32_to_fp16(uni(0.002f, 0.02f)));
                    put16(p + offsetof(block_q2_K, dmin), fp32_to_fp16(uni(0.002f, 0.02f)));
                    break;
                case DType::Q3_K: put16(p + offsetof(block_q3_K, d), fp32_to_fp16(uni(0.0002f, 0.002f))); break;
                case DType::F8_E4M3_B32: {  // f32 d; E4M3 codes random but never NaN (0x7F, 0xFF)
                    const float d = uni(0.002f, 0.02f);
                    std::memcpy(p + offsetof(block_f8_b32, d), &d, 4);
                    for (int j = 0; j < QK_F8; ++j)
                        if ((p[offsetof(block_f8_b32, qs) + j] & 0x7F) == 0x7F) p[offsetof(block_f8_b32, qs) + j] ^= 1;
                    break;
                }
                case DType::NVFP4: {  // f32 global scale; E4M3 group scales in 2^-3 .. 15
                    const float d = uni(0.002f, 0.02f);
                    std::memcpy(p + offsetof(block_nvfp4, d), &d, 4);
                    for (int g = 0; g < QK_NVFP4 / NVFP4_GROUP; ++g)
                        p[offsetof(block_nvfp4, sc) + g] = static_cast<uint8_t>(0x20 + splitmix(s) % 0x38);
                    break;
                }
                default: break;
            }
        }
    });
    return w;
}

__global__ void empty_kernel() {}

// Read-only streaming kernel: the read-bandwidth ceiling.
__global__ void read_kernel(const uint4* __restrict__ p, int64_t n, uint32_t* out) {
    uint32_t acc = 0;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        uint4 v;
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p + i));
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) out[0] = acc;  // keeps the loads alive
}

float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

struct Timer {
    cudaEvent_t a, b;
    Timer() {
        QUERN_CUDA_CHECK(cudaEventCreate(&a));
        QUERN_CUDA_CHECK(cudaEventCreate(&b));
    }
    ~Timer() {
        cudaEventDestroy(a);
        cudaEventDestroy(b);
    }
};

// Median over `reps` of the time (ms) of enqueue() on `stream`, after 3 warm-ups.
template <class F>
float time_ms(cudaStream_t stream, int reps, F enqueue) {
    Timer t;
    for (int i = 0; i < 3; ++i) enqueue();
    QUERN_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<float> ms;
    for (int i = 0; i < reps; ++i) {
        QUERN_CUDA_CHECK(cudaEventRecord(t.a, stream));
        enqueue();
        QUERN_CUDA_CHECK(cudaEventRecord(t.b, stream));
        QUERN_CUDA_CHECK(cudaEventSynchronize(t.b));
        float e = 0;
        QUERN_CUDA_CHECK(cudaEventElapsedTime(&e, t.a, t.b));
        ms.push_back(e);
    }
    return median(ms);
}

// Captures `body` (L launches) into a graph; returns the median time per launch in microseconds.
template <class F>
float time_graph_us(CudaContext& ctx, int L, int reps, F body) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    QUERN_CUDA_CHECK(cudaStreamBeginCapture(ctx.stream(), cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < L; ++i) body(i);
    QUERN_CUDA_CHECK(cudaStreamEndCapture(ctx.stream(), &g));
    QUERN_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    const float ms = time_ms(ctx.stream(), reps, [&] { QUERN_CUDA_CHECK(cudaGraphLaunch(ge, ctx.stream())); });
    QUERN_CUDA_CHECK(cudaGraphExecDestroy(ge));
    QUERN_CUDA_CHECK(cudaGraphDestroy(g));
    return ms * 1000.0f / static_cast<float>(L);
}

// Max over 16 rows of |y - ref| / sum|w x| (reference as in tests/cuda).
double spot_check(DType t, bool float_act, const std::vector<uint8_t>& w, int64_t N, int64_t K,
                  const std::vector<float>& x, const std::vector<float>& y) {
    std::vector<float> xr = x;
    if (!float_act) {
        std::vector<uint8_t> q(row_size(DType::Q8_1, K));
        quantize_row_ref(DType::Q8_1, x.data(), q.data(), K);
        for (int64_t b = 0; b < K / 32; ++b) {
            float amax = 0;
            for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[static_cast<size_t>(32 * b + j)]));
            block_q8_1 blk;
            std::memcpy(&blk, q.data() + b * sizeof blk, sizeof blk);
            for (int j = 0; j < 32; ++j) xr[static_cast<size_t>(32 * b + j)] = static_cast<float>(blk.qs[j]) * (amax / 127);
        }
    }
    std::vector<float> wr(static_cast<size_t>(K));
    double worst = 0;
    for (int i = 0; i < 16; ++i) {
        const int64_t r = (N - 1) * i / 15;
        dequantize_row_ref(t, w.data() + static_cast<size_t>(r) * row_size(t, K), wr.data(), K);
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
            const double p = static_cast<double>(wr[static_cast<size_t>(k)]) * xr[static_cast<size_t>(k)];
            ref += p;
            mag += std::fabs(p);
        }
        const double e = std::fabs(y[static_cast<size_t>(r)] - ref) / (mag + 1e-30);
        worst = std::isnan(e) ? 1e30 : std::max(worst, e);
    }
    return worst;
}

}  // namespace

int main(int argc, char** argv) {
    int reps = 20;
    bool quick = false;
    int levels = 1;
    std::string csv_path, only, shape_filter;
    double rotate_mb = 256;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
        else if (a == "--quick") quick = true;
        else if (a == "--levels" && i + 1 < argc) levels = std::atoi(argv[++i]) == 2 ? 2 : 1;
        else if (a == "--csv" && i + 1 < argc) csv_path = argv[++i];
        else if (a == "--only" && i + 1 < argc) only = argv[++i];
        else if (a == "--shape" && i + 1 < argc) shape_filter = argv[++i];
        else if (a == "--rotate-mb" && i + 1 < argc) rotate_mb = std::atof(argv[++i]);
        else {
            std::fprintf(stderr, "usage: %s [--reps N] [--quick] [--csv FILE] [--only KERNEL] [--shape SUBSTR] [--rotate-mb MB] [--levels 1|2]\n", argv[0]);
            return 2;
        }
    }
    if (CudaContext::device_count() == 0) {
        std::fprintf(stderr, "bench_gemv_cuda: no CUDA device\n");
        return 1;
    }
    try {
        CudaContext ctx(0);
        const cudaStream_t st = ctx.stream();
        std::printf("device: %s, %d SMs, L2 %.0f MB, cc %d\n", ctx.name().c_str(), ctx.sm_count(),
                    static_cast<double>(ctx.l2_bytes()) / 1e6, ctx.compute_capability());

        // ---- ceilings
        const size_t big = size_t{1} << 30;
        double copy_gbs = 0, read_gbs = 0;
        {
            DeviceBuffer a(big), b(big);
            a.fill_bytes(0x5A, st);
            b.fill_bytes(0x00, st);
            const float ms = time_ms(st, reps, [&] {
                QUERN_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), big, cudaMemcpyDeviceToDevice, st));
            });
            copy_gbs = 2.0 * static_cast<double>(big) / (ms * 1e-3) / 1e9;
            DeviceBuffer out(4);
            const float rms = time_ms(st, reps, [&] {
                read_kernel<<<ctx.sm_count() * 16, 256, 0, st>>>(a.as<uint4>(), static_cast<int64_t>(big / 16),
                                                                  out.as<uint32_t>());
            });
            QUERN_CUDA_CHECK_LAUNCH();
            read_gbs = static_cast<double>(big) / (rms * 1e-3) / 1e9;
        }
        std::printf("ceilings: cudaMemcpy D2D 1 GiB %.0f GB/s (read+write); read-only kernel 1 GiB %.0f GB/s\n",
                    copy_gbs, read_gbs);
        const float floor_us = time_graph_us(ctx, 32, reps, [&](int) { empty_kernel<<<1, 32, 0, st>>>(); });
        std::printf("launch floor: empty kernel in a graph %.2f us per launch\n", floor_us);

        FILE* csv = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
        if (csv)
            std::fprintf(csv, "kernel,shape,N,K,bytes,copies,config,us,GBps,pct_copy,default\n");

        // ---- activation quantizer
        for (int64_t K : {int64_t{4096}, int64_t{14336}}) {
            DeviceBuffer x(static_cast<size_t>(K) * 4);
            std::vector<float> xh(static_cast<size_t>(K));
            for (int64_t k = 0; k < K; ++k) xh[static_cast<size_t>(k)] = std::sin(0.37f * static_cast<float>(k));
            x.upload(xh.data(), xh.size() * 4, st);
            QuantizedActivation xq(K);
            const float us = time_graph_us(ctx, 32, reps, [&](int) { quantize_activation(ctx, x.as<float>(), xq); });
            std::printf("quantize_activation K=%lld: %.2f us per launch\n", static_cast<long long>(K), us);
        }

        std::printf("\n| kernel | shape | MB | default config | us | GB/s | %% copy | best config | us | GB/s | %% copy | spot err |\n");
        std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        std::fflush(stdout);

        for (const Kernel& kern : kKernels) {
            if (!only.empty() && only != dtype_name(kern.type) && only != kern.label) continue;
            for (const Shape& sh : kShapes) {
                if (!shape_filter.empty() && std::string(sh.name).find(shape_filter) == std::string::npos) continue;
                const int64_t N = sh.N, K = sh.K;
                const std::vector<uint8_t> w = make_weights(kern.type, N, K, 42);
                const size_t bytes = w.size();
                const int copies =
                    std::max(1, static_cast<int>(std::ceil(rotate_mb * 1024 * 1024 / static_cast<double>(bytes))));
                std::vector<DeviceWeight> Ws;
                for (int c = 0; c < copies; ++c)
                    Ws.push_back(upload_weight(ctx, Tensor::contiguous(kern.type, {K, N, 1, 1},
                                                                       const_cast<uint8_t*>(w.data()), sh.name)));
                std::vector<float> xh(static_cast<size_t>(K));
                {
                    uint64_t s = 7;
                    for (auto& v : xh)
                        v = (static_cast<float>(splitmix(s) >> 40) * (1.0f / 16777216.0f) - 0.5f) * 4.0f;
                }
                DeviceBuffer x(static_cast<size_t>(K) * 4), y(static_cast<size_t>(N) * 4);
                x.upload(xh.data(), xh.size() * 4, st);
                QuantizedActivation xq(K, levels);
                quantize_activation(ctx, x.as<float>(), xq);
                const double moved = static_cast<double>(bytes) + static_cast<double>(N) * 4 +
                                     (kern.float_act ? 4.0 * K : 1.25 * K * levels);
                const int L = std::max(copies, 32);
                auto run_one = [&](int i, int config) {
                    GemvOptions o;
                    o.config = config;
                    const DeviceWeight& W = Ws[static_cast<size_t>(i % copies)];
                    if (kern.float_act) gemv(ctx, W, x.as<float>(), y.as<float>(), o);
                    else gemv(ctx, W, xq, y.as<float>(), o);
                };
                const int def = gemv_default_config(kern.type, N, K, kern.float_act, kern.float_act ? 1 : levels);
                // spot check with the default configuration
                y.fill_bytes(0xFF, st);
                run_one(0, def);
                ctx.synchronize();
                std::vector<float> yh(static_cast<size_t>(N));
                y.download(yh.data(), yh.size() * 4, st);
                const double err = levels == 1 || kern.float_act ? spot_check(kern.type, kern.float_act, w, N, K, xh, yh) : 0.0;

                float def_us = 0, best_us = 1e30f;
                int best = def;
                for (int c = 0; c < gemv_config_count(); ++c) {
                    if (quick && c != def) continue;
                    const float us = time_graph_us(ctx, L, reps, [&](int i) { run_one(i, c); });
                    const double gbs = moved / (us * 1e-6) / 1e9;
                    if (csv)
                        std::fprintf(csv, "%s,%s,%lld,%lld,%zu,%d,%s,%.3f,%.1f,%.1f,%d\n", kern.label, sh.name,
                                     static_cast<long long>(N), static_cast<long long>(K), bytes, copies,
                                     gemv_config_name(c), us, gbs, 100.0 * gbs / copy_gbs, c == def ? 1 : 0);
                    if (c == def) def_us = us;
                    if (us < best_us) {
                        best_us = us;
                        best = c;
                    }
                }
                auto gbs = [&](float us) { return moved / (us * 1e-6) / 1e9; };
                std::printf("| %s | %s | %.1f | %s | %.2f | %.0f | %.0f%% | %s | %.2f | %.0f | %.0f%% | %.1e%s |\n",
                            kern.label, sh.name, static_cast<double>(bytes) / 1e6, gemv_config_name(def), def_us,
                            gbs(def_us), 100.0 * gbs(def_us) / copy_gbs, gemv_config_name(best), best_us, gbs(best_us),
                            100.0 * gbs(best_us) / copy_gbs, err, err > 1e-4 ? " FAIL" : "");
                std::fflush(stdout);
            }
        }
        if (csv) std::fclose(csv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_gemv_cuda: %s\n", e.what());
        return 1;
    }
    return 0;
}
