// bench_gemm_cuda: the batch runner's products of n activation rows by one
// weight matrix (Y = X · Wᵀ, N rows × K, Llama-3-8B shapes), each way the
// CUDA backend can multiply them, to pick which row counts need the resident
// BF16 copies and which can read the quantized weights directly.
//
//   bench_gemm_cuda [--reps N] [--rows 16,32,...] [--shape SUBSTR]
//
// Ways (GB/s counts each way's own weight bytes; TFLOP/s = 2·n·N·K / time):
//   copy  a resident BF16 copy multiplied by cuBLASLt (PrefillGemm::run_bf16
//         on make_resident_bf16: what passes of many rows use today);
//   tile  the quantized weights dequantized to BF16 tile by tile on a second
//         stream, then cuBLASLt (PrefillGemm::run_bf16 without a copy: what
//         the prefill and copy-less batches use);
//   dq    dq_gemm_grouped with one group of all n rows (grouped_gemm.h:
//         decoded in registers, mma.sync, nothing resident but the weights);
//   bq    bq_gemm on the small-batch layout (n <= kBqMaxRows only).
// Method: random blocks with sane scales; enough copies of each form that a
// round of them exceeds the L2 (every call reads DRAM, as a model's layers
// do); 3 warm-up calls, then the median of --reps rounds of 10 calls each,
// timed with CUDA events. A spot check compares dq against copy on one row
// count per shape (both round the weights to BF16 the same way; they may
// differ only in summation order).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/bq_gemm.h"
#include "backend/cuda/context.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/grouped_gemm.h"
#include "backend/cuda/weights.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "quant/blocks.h"

using namespace quern;
using namespace quern::cuda;

namespace {

struct Shape {
    const char* name;
    int64_t N, K;
    DType t;
};
const Shape kShapes[] = {{"qkv Q4_K 6144x4096", 6144, 4096, DType::Q4_K},
                         {"wo Q4_K 4096x4096", 4096, 4096, DType::Q4_K},
                         {"gate+up Q4_K 28672x4096", 28672, 4096, DType::Q4_K},
                         {"down Q6_K 4096x14336", 4096, 14336, DType::Q6_K},
                         {"down Q4_K 4096x14336", 4096, 14336, DType::Q4_K},
                         {"head Q6_K 128256x4096", 128256, 4096, DType::Q6_K}};

/// Random blocks of type t whose scales are sane (fp16 1.0 for d, 0.01 for
/// Q4_K's dmin): no infinities or NaNs in the products.
std::vector<uint8_t> random_blocks(DType t, int64_t N, int64_t K, std::mt19937& rng) {
    std::vector<uint8_t> bytes(row_size(t, K) * static_cast<size_t>(N));
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    const auto bb = static_cast<size_t>(dtype_info(t).type_size);
    for (size_t o = 0; o < bytes.size(); o += bb) {
        const size_t at = t == DType::Q6_K ? o + 208 : o;
        bytes[at] = 0x00, bytes[at + 1] = 0x3C;
        if (t == DType::Q4_K) bytes[o + 2] = 0x1F, bytes[o + 3] = 0x21;
    }
    return bytes;
}

std::vector<int64_t> parse_rows(const char* s) {
    std::vector<int64_t> r;
    for (const char* p = s; *p;) {
        r.push_back(std::strtoll(p, const_cast<char**>(&p), 10));
        if (*p == ',') ++p;
        else if (*p) break;
    }
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    int reps = 9;
    std::vector<int64_t> rows = {16, 32, 64, 128, 256, 512, 1024, 2048};
    std::string only;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
        else if (a == "--rows" && i + 1 < argc) rows = parse_rows(argv[++i]);
        else if (a == "--shape" && i + 1 < argc) only = argv[++i];
        else {
            std::fprintf(stderr, "usage: bench_gemm_cuda [--reps N] [--rows 16,32,...] [--shape SUBSTR]\n");
            return a == "-h" || a == "--help" ? 0 : 2;
        }
    }
    const int64_t max_n = *std::max_element(rows.begin(), rows.end());
    CudaContext ctx;
    cudaStream_t s = ctx.stream();
    PrefillGemm gemm(max_n, 14336, int64_t{64} << 20);
    gemm.set_verbose(false);
    cudaEvent_t e0, e1;
    QUERN_CUDA_CHECK(cudaEventCreate(&e0));
    QUERN_CUDA_CHECK(cudaEventCreate(&e1));
    // Median µs per call of f over `reps` rounds of 10 calls.
    const auto time = [&](auto&& f) {
        for (int i = 0; i < 3; ++i) f();
        std::vector<float> ms;
        for (int r = 0; r < reps; ++r) {
            QUERN_CUDA_CHECK(cudaEventRecord(e0, s));
            for (int i = 0; i < 10; ++i) f();
            QUERN_CUDA_CHECK(cudaEventRecord(e1, s));
            QUERN_CUDA_CHECK(cudaEventSynchronize(e1));
            float m = 0;
            QUERN_CUDA_CHECK(cudaEventElapsedTime(&m, e0, e1));
            ms.push_back(m);
        }
        std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
        return 1e2 * ms[reps / 2];  // 10 calls per round: ms·1e3/10
    };
    std::mt19937 rng(11);
    std::printf("%-26s %5s | %-22s | %-22s | %-22s | %-16s | dq vs copy\n", "shape", "n", "copy us  GB/s  TFLOP/s",
                "tile us  GB/s  TFLOP/s", "dq us  GB/s  TFLOP/s", "bq us  GB/s");
    for (const Shape& sh : kShapes) {
        if (!only.empty() && std::string(sh.name).find(only) == std::string::npos) continue;
        const std::vector<uint8_t> bytes = random_blocks(sh.t, sh.N, sh.K, rng);
        const Tensor src = Tensor::contiguous(sh.t, {sh.K, sh.N, 1, 1}, const_cast<uint8_t*>(bytes.data()), "w");
        const double qb = static_cast<double>(bytes.size()), cb = 2.0 * static_cast<double>(sh.N * sh.K);
        const auto copies = [](double b) { return static_cast<size_t>(std::clamp(std::ceil(160e6 / b), 1.0, 12.0)); };
        std::vector<DeviceWeight> wq, wc, wb;
        for (size_t i = 0; i < copies(qb); ++i) wq.push_back(upload_weight(ctx, src));
        for (size_t i = 0; i < copies(cb); ++i) {
            wc.push_back(upload_weight(ctx, src));
            make_resident_bf16(wc.back(), s);
        }
        const bool has_bq = bq_bytes(wq[0]) > 0;
        if (has_bq)
            for (size_t i = 0; i < copies(qb); ++i) {
                wb.push_back(upload_weight(ctx, src));
                make_resident_bq(wb.back(), s);
            }
        std::vector<uint16_t> xh(static_cast<size_t>(max_n * sh.K));
        // BF16 activations in ±[0.5, 2): sign, exponent 126/127, random mantissa.
        for (auto& v : xh) v = static_cast<uint16_t>(((rng() & 1) << 15) | ((126 + (rng() & 1)) << 7) | (rng() & 0x7F));
        DeviceBuffer dx(xh.size() * 2), dy(static_cast<size_t>(max_n * sh.N) * 4), dy2(static_cast<size_t>(max_n * sh.N) * 4),
            doff(8);
        QUERN_CUDA_CHECK(cudaMemcpy(dx.data(), xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
        for (int64_t n : rows) {
            const int32_t off[2] = {0, static_cast<int32_t>(n)};
            QUERN_CUDA_CHECK(cudaMemcpy(doff.data(), off, sizeof off, cudaMemcpyHostToDevice));
            size_t ic = 0, it = 0, id = 0, ib = 0;
            const double tc = time([&] {
                gemm.run_bf16(wc[ic++ % wc.size()], dx.as<uint16_t>(), n, dy.as<float>(), sh.N, s);
            });
            const double tt = time([&] {
                gemm.run_bf16(wq[it++ % wq.size()], dx.as<uint16_t>(), n, dy.as<float>(), sh.N, s);
            });
            const double td = time([&] {
                dq_gemm_grouped(wq[id++ % wq.size()], sh.N, doff.as<int32_t>(), 1, n, n, dx.as<uint16_t>(),
                                dy2.as<float>(), sh.N, s);
            });
            double tb = 0;
            if (has_bq && n <= kBqMaxRows)
                tb = time([&] { bq_gemm(wb[ib++ % wb.size()], 0, sh.N, dx.as<uint16_t>(), n, dy.as<float>(), sh.N, s); });
            // Spot check: dq against the copy on this n (same BF16 weights).
            gemm.run_bf16(wc[0], dx.as<uint16_t>(), n, dy.as<float>(), sh.N, s);
            dq_gemm_grouped(wq[0], sh.N, doff.as<int32_t>(), 1, n, n, dx.as<uint16_t>(), dy2.as<float>(), sh.N, s);
            std::vector<float> a(static_cast<size_t>(n * sh.N)), b(a.size());
            QUERN_CUDA_CHECK(cudaMemcpy(a.data(), dy.data(), a.size() * 4, cudaMemcpyDeviceToHost));
            QUERN_CUDA_CHECK(cudaMemcpy(b.data(), dy2.data(), b.size() * 4, cudaMemcpyDeviceToHost));
            double worst = 0, scale = 0;
            for (size_t i = 0; i < a.size(); ++i) {
                worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
                scale = std::max(scale, static_cast<double>(std::fabs(a[i])));
            }
            const double fl = 2.0 * static_cast<double>(n * sh.N * sh.K);
            char bqs[40] = "";
            if (tb > 0) std::snprintf(bqs, sizeof bqs, "%7.1f %5.0f", tb, qb / tb * 1e-3);
            std::printf("%-26s %5lld | %7.1f %5.0f %7.1f | %7.1f %5.0f %7.1f | %7.1f %5.0f %7.1f | %-16s | %.2fx  (max |dq-copy| %.2g of %.2g)\n",
                        sh.name, static_cast<long long>(n), tc, cb / tc * 1e-3, fl / tc * 1e-6, tt, qb / tt * 1e-3,
                        fl / tt * 1e-6, td, qb / td * 1e-3, fl / td * 1e-6, bqs, tc / td, worst, scale);
            std::fflush(stdout);
        }
    }
    return 0;
}
