// bench_gemm_cuda: the batch runner's products of n activation rows by one
// weight matrix (Y = X · Wᵀ, N rows × K, Llama-3-8B or -70B shapes), each way the
// CUDA backend can multiply them, to pick which row counts need the resident
// BF16 copies and which can read the quantized weights directly.
//
//   bench_gemm_cuda [--reps N] [--rows 16,32,...] [--shape SUBSTR] [--ways copy,tile,dq,bq,qw,fp8]
//                   [--qw-shapes] [--model llama3-8b|llama3-70b]
//
// One line per (matrix, row count, way). Ways (GB/s counts each way's own
// weight bytes; TFLOP/s = 2·n·N·K / time):
//   copy  a resident BF16 copy multiplied by cuBLASLt (PrefillGemm::run_bf16
//         on make_resident_bf16: what passes of many rows use today);
//   tile  the quantized weights dequantized to BF16 tile by tile on a second
//         stream, then cuBLASLt (PrefillGemm::run_bf16 without a copy: what
//         the prefill and copy-less batches use);
//   dq    dq_gemm_grouped with one group of all n rows (grouped_gemm.h:
//         decoded in registers, mma.sync, nothing resident but the weights);
//   bq    bq_gemm on the small-batch layout (n <= kBqMaxRows only);
//   qw    qw_gemm on the resident layout (qw_gemm.h; sm_90a, Q4_K / Q6_K),
//         its default kernel and shape, and with --qw-shapes the skinny
//         kernel forced (qw-skinny), the tiled one by its rule (qw-tiles), and each forced shape
//         (qw32x1 .. qw128x2, qw256x1: tokens per block × weight groups per
//         warpgroup), and on the gate+up shape the GLU form (qw-glu:
//         qw_gemm_glu, the gated values instead of the two products);
//   fp8   the matrix converted to FP8 with one scale per row (to_fp8_rows:
//         --gpu-weights fp8), the activations quantized per row, the FP8
//         product (PrefillGemm::run_bf16 on it: fp8_gemm on sm_90a, cuBLASLt
//         with QUERN_CUDA_FP8_CUBLAS=1); not in the default list.
// Method: random blocks with sane scales; enough copies of each form that a
// round of them exceeds the L2 (every call reads DRAM, as a model's layers
// do); 3 warm-up calls, then the median of --reps rounds of 10 calls each,
// timed with CUDA events. Each way but copy is spot-checked against copy
// (max |way − copy| over the product, relative to max |copy|: dq rounds the
// weights as copy does, bq and qw from BF16 scales, ~1e-2 of the largest).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/bq_gemm.h"
#include "backend/cuda/context.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/grouped_gemm.h"
#include "backend/cuda/qw_gemm.h"
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
const Shape kShapes8b[] = {{"qkv Q4_K 6144x4096", 6144, 4096, DType::Q4_K},
                         {"wo Q4_K 4096x4096", 4096, 4096, DType::Q4_K},
                         {"gate+up Q4_K 28672x4096", 28672, 4096, DType::Q4_K},
                         {"down Q6_K 4096x14336", 4096, 14336, DType::Q6_K},
                         {"down Q4_K 4096x14336", 4096, 14336, DType::Q4_K},
                         {"head Q6_K 128256x4096", 128256, 4096, DType::Q6_K}};
// Llama-3-70B (Q4_K_M: Q|K|V, wo, gate|up in Q4_K, down and the head in Q6_K).
const Shape kShapes70b[] = {{"qkv Q4_K 10240x8192", 10240, 8192, DType::Q4_K},
                            {"wo Q4_K 8192x8192", 8192, 8192, DType::Q4_K},
                            {"gate+up Q4_K 57344x8192", 57344, 8192, DType::Q4_K},
                            {"down Q6_K 8192x28672", 8192, 28672, DType::Q6_K},
                            {"head Q6_K 128256x8192", 128256, 8192, DType::Q6_K}};

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
    std::string only, ways = "copy,tile,dq,bq,qw";
    bool qw_shapes = false;
    std::string model = "llama3-8b";
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
        else if (a == "--rows" && i + 1 < argc) rows = parse_rows(argv[++i]);
        else if (a == "--shape" && i + 1 < argc) only = argv[++i];
        else if (a == "--ways" && i + 1 < argc) ways = argv[++i];
        else if (a == "--qw-shapes") qw_shapes = true;
        else if (a == "--model" && i + 1 < argc) model = argv[++i];
        else {
            std::fprintf(stderr,
                         "usage: bench_gemm_cuda [--reps N] [--rows 16,32,...] [--shape SUBSTR] "
                         "[--ways copy,tile,dq,bq,qw,fp8] [--qw-shapes] [--model llama3-8b|llama3-70b]\n");
            return a == "-h" || a == "--help" ? 0 : 2;
        }
    }
    const auto way = [&](const char* w) { return ("," + ways + ",").find("," + std::string(w) + ",") != std::string::npos; };
    if (model != "llama3-8b" && model != "llama3-70b") {
        std::fprintf(stderr, "bench_gemm_cuda: --model takes llama3-8b or llama3-70b, not '%s'\n", model.c_str());
        return 2;
    }
    const bool big = model == "llama3-70b";
    const std::vector<Shape> shapes = big ? std::vector<Shape>(std::begin(kShapes70b), std::end(kShapes70b))
                                          : std::vector<Shape>(std::begin(kShapes8b), std::end(kShapes8b));
    const int64_t max_n = *std::max_element(rows.begin(), rows.end());
    int64_t max_k = 0;
    for (const Shape& sh : shapes) max_k = std::max(max_k, sh.K);
    CudaContext ctx;
    cudaStream_t s = ctx.stream();
    PrefillGemm gemm(max_n, max_k, int64_t{64} << 20);
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
    std::printf("%-26s %5s %-8s %9s %6s %8s  %s\n", "shape", "n", "way", "us", "GB/s", "TFLOP/s", "vs copy: max |diff| / max |copy|");
    for (const Shape& sh : shapes) {
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
        const bool has_bq = way("bq") && bq_bytes(wq[0]) > 0;
        if (has_bq)
            for (size_t i = 0; i < copies(qb); ++i) {
                wb.push_back(upload_weight(ctx, src));
                make_resident_bq(wb.back(), s);
            }
        const bool has_qw = way("qw") && qw_supported(sh.t, sh.K);
        std::vector<DeviceWeight> wf;
        const double fb = static_cast<double>(sh.N * sh.K);
        if (way("fp8"))
            for (size_t i = 0; i < copies(fb); ++i) wf.push_back(to_fp8_rows(upload_weight(ctx, src), s));
        std::vector<uint16_t> xh(static_cast<size_t>(max_n * sh.K));
        // BF16 activations in ±[0.5, 2): sign, exponent 126/127, random mantissa.
        for (auto& v : xh) v = static_cast<uint16_t>(((rng() & 1) << 15) | ((126 + (rng() & 1)) << 7) | (rng() & 0x7F));
        DeviceBuffer dx(xh.size() * 2), dy(static_cast<size_t>(max_n * sh.N) * 4), dy2(static_cast<size_t>(max_n * sh.N) * 4),
            doff(8);
        QUERN_CUDA_CHECK(cudaMemcpy(dx.data(), xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
        const uint16_t* x = dx.as<uint16_t>();
        for (int64_t n : rows) {
            const int32_t off[2] = {0, static_cast<int32_t>(n)};
            QUERN_CUDA_CHECK(cudaMemcpy(doff.data(), off, sizeof off, cudaMemcpyHostToDevice));
            const double fl = 2.0 * static_cast<double>(n * sh.N * sh.K);
            std::vector<float> ref(static_cast<size_t>(n * sh.N)), got(ref.size());
            gemm.run_bf16(wc[0], x, n, dy.as<float>(), sh.N, s);
            QUERN_CUDA_CHECK(cudaStreamSynchronize(s));  // cudaMemcpy does not wait for a non-blocking stream
            QUERN_CUDA_CHECK(cudaMemcpy(ref.data(), dy.data(), ref.size() * 4, cudaMemcpyDeviceToHost));
            // Times `call(i)` (the i-th call, rotating over the copies) and prints its line.
            const auto report = [&](const char* name, double bytes_read, auto&& call) {
                size_t i = 0;
                const double us = time([&] { call(i++); });
                std::string check;
                if (std::strcmp(name, "copy") != 0) {
                    QUERN_CUDA_CHECK(cudaMemsetAsync(dy2.data(), 0xFF, got.size() * 4, s));
                    call(0);
                    QUERN_CUDA_CHECK(cudaStreamSynchronize(s));
                    QUERN_CUDA_CHECK(cudaMemcpy(got.data(), dy2.data(), got.size() * 4, cudaMemcpyDeviceToHost));
                    double worst = 0, scale = 0;
                    for (size_t k = 0; k < ref.size(); ++k) {
                        const double d = std::fabs(static_cast<double>(got[k]) - ref[k]);
                        worst = std::isnan(d) ? INFINITY : std::max(worst, d);
                        scale = std::max(scale, static_cast<double>(std::fabs(ref[k])));
                    }
                    char b[64];
                    std::snprintf(b, sizeof b, "%.2g", worst / std::max(scale, 1e-30));
                    check = b;
                }
                std::printf("%-26s %5lld %-8s %9.1f %6.0f %8.1f  %s\n", sh.name, static_cast<long long>(n), name, us,
                            bytes_read / us * 1e-3, fl / us * 1e-6, check.c_str());
                std::fflush(stdout);
            };
            if (way("copy"))
                report("copy", cb, [&](size_t i) { gemm.run_bf16(wc[i % wc.size()], x, n, dy.as<float>(), sh.N, s); });
            if (way("tile"))
                report("tile", qb, [&](size_t i) { gemm.run_bf16(wq[i % wq.size()], x, n, dy2.as<float>(), sh.N, s); });
            if (way("dq"))
                report("dq", qb, [&](size_t i) {
                    dq_gemm_grouped(wq[i % wq.size()], sh.N, doff.as<int32_t>(), 1, n, n, x, dy2.as<float>(), sh.N, s);
                });
            if (!wf.empty())
                report("fp8", fb, [&](size_t i) { gemm.run_bf16(wf[i % wf.size()], x, n, dy2.as<float>(), sh.N, s); });
            if (has_bq && n <= kBqMaxRows)
                report("bq", qb, [&](size_t i) { bq_gemm(wb[i % wb.size()], 0, sh.N, x, n, dy2.as<float>(), sh.N, s); });
            if (has_qw) {
                const auto qw = [&](size_t i) { qw_gemm(wq[i % wq.size()], 0, sh.N, x, n, dy2.as<float>(), sh.N, s); };
                report("qw", qb, qw);
                if (qw_shapes) {
                    qw_gemm_set_form(QwForm::kSkinny);
                    report("qw-skinny", qb, qw);
                    qw_gemm_set_form(QwForm::kTiles);
                    report("qw-tiles", qb, qw);
                    for (int tok : {32, 64, 128, 256})
                        for (int grp : {1, 2}) {
                            if (tok == 256 && grp == 2) continue;  // one group at 256 tokens
                            qw_gemm_set_shape(tok, grp);
                            const std::string name = "qw" + std::to_string(tok) + "x" + std::to_string(grp);
                            report(name.c_str(), qb, qw);
                        }
                }
                qw_gemm_set_shape(0, 0);
                qw_gemm_set_form(QwForm::kAuto);
                // The GLU form on a [gate | up] matrix: both products and the
                // gated values in one launch (its output is h, not y: no check).
                if (qw_shapes && std::strncmp(sh.name, "gate+up", 7) == 0 && n <= kQwGluMaxRows) {
                    const int64_t F = sh.N / 2;
                    size_t i = 0;
                    const double us = time([&] {
                        const DeviceWeight& w = wq[i++ % wq.size()];
                        qw_gemm_glu(w, 0, w, F, F, x, n, reinterpret_cast<uint16_t*>(dy2.data()), F, false, s);
                    });
                    std::printf("%-26s %5lld %-8s %9.1f %6.0f %8.1f  -\n", sh.name, static_cast<long long>(n), "qw-glu", us,
                                qb / us * 1e-3, fl / us * 1e-6);
                }
            }
        }
    }
    return 0;
}
