// Prefill GEMM: weight dequantization to BF16, activation rounding to BF16,
// and the cuBLASLt product (API and numerics: gemm.h).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/tuning.h"
#include "backend/cuda/bq_gemm.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/fp8_gemm.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/qw_gemm.h"
#include "backend/cuda/minifloat.cuh"
#include "backend/cuda/ops_common.cuh"

namespace quern::cuda {
namespace {

using detail::bf16_bits;
using deq::DeqArgs;
using deq::half_at;
using deq::nib;
using deq::q5_bit;
using deq::decode_unit;
using deq::unit_values;

// dequant_block_kernel<T>
//   Shapes:  W rows row0 .. row0+rows−1, K elements each (K % 32 == 0; the
//            K-quants K % 256 == 0, NVFP4 K % 64 == 0), device layout of
//            weights.h; out: rows ×
//            K BF16 bit patterns, row-major (row stride K).
//   Grid:    one thread per 32-element unit (rows·K/32 threads, 256 per
//            block, grid-stride); the thread decodes its unit in registers
//            and writes 64 contiguous bytes (four 16-byte stores).
//   Align:   out 16-byte aligned (K % 32 == 0 keeps every unit aligned).
//   Bound:   memory (reads ≤ 1 byte, writes 2 bytes per element); run once
//            per matrix per prefill chunk.
template <DType T>
__global__ void __launch_bounds__(256) dequant_block_kernel(DeqArgs a, int64_t row0, int64_t rows,
                                                            uint16_t* __restrict__ out) {
    const int64_t units = a.K / 32;
    const int64_t total = rows * units;
    for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
         t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = t / units, u = t % units;
        float v[32];
        decode_unit<T>(a, row0 + r, u, v);
        uint32_t packed[16];
#pragma unroll
        for (int i = 0; i < 16; ++i)
            packed[i] = static_cast<uint32_t>(bf16_bits(v[2 * i])) | (static_cast<uint32_t>(bf16_bits(v[2 * i + 1])) << 16);
        auto* dst = reinterpret_cast<uint4*>(out + t * 32);
#pragma unroll
        for (int i = 0; i < 4; ++i)
            dst[i] = make_uint4(packed[4 * i], packed[4 * i + 1], packed[4 * i + 2], packed[4 * i + 3]);
    }
}

// dequant_float_kernel<T>  (F32, F16, BF16 weights)
//   Shapes:  as dequant_block_kernel, any K (the values are stored as they
//            are, row stride K elements of T).
//   Grid:    one thread per element, grid-stride, 256 per block.
//   Bound:   memory.
template <DType T>
__global__ void __launch_bounds__(256) dequant_float_kernel(const void* __restrict__ q, int64_t K, int64_t row0,
                                                            int64_t rows, uint16_t* __restrict__ out) {
    const int64_t total = rows * K;
    const int64_t base = row0 * K;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        if constexpr (T == DType::F32) out[i] = bf16_bits(static_cast<const float*>(q)[base + i]);
        else if constexpr (T == DType::F16) out[i] = bf16_bits(__half2float(static_cast<const __half*>(q)[base + i]));
        else out[i] = static_cast<const uint16_t*>(q)[base + i];  // BF16: unchanged
    }
}

// f32_to_bf16_kernel
//   Shapes:  x: n rows of K floats at row stride ldx; out: n × K BF16, row
//            stride K.
//   Grid:    one thread per element, grid-stride, 256 per block.
//   Bound:   memory.
__global__ void __launch_bounds__(256) f32_to_bf16_kernel(const float* __restrict__ x, int64_t ldx, int64_t n,
                                                          int64_t K, uint16_t* __restrict__ out) {
    const int64_t total = n * K;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = i / K, k = i % K;
        out[i] = bf16_bits(x[r * ldx + k]);
    }
}

unsigned grid_for(int64_t threads) {
    return static_cast<unsigned>(std::clamp<int64_t>((threads + 255) / 256, 1, 65535));
}

// ---------------------------------------------------------------- FP8 with one scale per row

// E4M3 of x: round to nearest even, beyond ±448 saturated, NaN → 0x7F (the
// hardware conversion; float_to_fp8_e4m3 on the CPU gives the same codes).
__device__ __forceinline__ uint8_t e4m3(float x) {
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// fp8_rows_kernel<T>
//   Shapes:  a: a weight of N rows × K elements (device layout, K % 32 == 0);
//            q: rows × K E4M3 codes (row r at q + r·K); s: rows × K/32 f32,
//            every entry of row r its scale (F8_E4M3_B32's layout); rs: the
//            rows' scales once each (rows f32).
//   Grid:    one block of 256 threads per row (row row0 + blockIdx.x):
//            pass 1 the row's absmax (block max), pass 2 the codes
//            E4M3(w / scale), scale = absmax / 448 (1 for an all-zero row) —
//            quantize_fp8_rows (quant/fp8.h) on the values dequantize_row_ref
//            gives, code for code.
//   Bound:   memory (run once at load).
template <DType T>
__global__ void __launch_bounds__(256) fp8_rows_kernel(DeqArgs a, int64_t row0, uint8_t* __restrict__ q,
                                                       float* __restrict__ s, float* __restrict__ rs) {
    __shared__ float red[32];
    const int64_t r = static_cast<int64_t>(blockIdx.x), row = row0 + r, units = a.K / 32;
    float amax = 0.0f;
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
        float v[32];
        unit_values<T>(a, row, u, v);
#pragma unroll
        for (int e = 0; e < 32; ++e) amax = fmaxf(amax, fabsf(v[e]));
    }
    amax = detail::block_max(amax, red);
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    if (threadIdx.x == 0) rs[r] = scale;
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
        float v[32];
        unit_values<T>(a, row, u, v);
        uint32_t packed[8];
#pragma unroll
        for (int i = 0; i < 8; ++i)
            packed[i] = static_cast<uint32_t>(e4m3(v[4 * i] / scale)) | static_cast<uint32_t>(e4m3(v[4 * i + 1] / scale)) << 8 |
                        static_cast<uint32_t>(e4m3(v[4 * i + 2] / scale)) << 16 |
                        static_cast<uint32_t>(e4m3(v[4 * i + 3] / scale)) << 24;
        auto* dst = reinterpret_cast<uint4*>(q + r * a.K + 32 * u);
        dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
        dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
        s[r * units + u] = scale;
    }
}

// fp8_act_rows_kernel
//   Shapes:  x: n rows × K BF16 (row stride K); q: n × K E4M3; sx: n f32.
//   Grid:    one block of 256 threads per row; as fp8_rows_kernel (absmax,
//            scale = absmax / 448 or 1, codes E4M3(x / scale)) on the BF16
//            values: the activations' per-row (per-token) recipe. Eight
//            values per 16-byte load and 8-byte store where K % 8 == 0 and
//            x, q are so aligned, one at a time otherwise.
//   Bound:   memory.
__device__ __forceinline__ float bf16_bits_to_float(uint32_t b) { return __uint_as_float(b << 16); }

__global__ void __launch_bounds__(256) fp8_act_rows_kernel(const uint16_t* __restrict__ x, int64_t K,
                                                           uint8_t* __restrict__ q, float* __restrict__ sx) {
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    const uint16_t* xr = x + r * K;
    uint8_t* qr = q + r * K;
    const bool vec = K % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 8 == 0;
    const int64_t K8 = vec ? K / 8 : 0;
    const auto* x8 = reinterpret_cast<const uint4*>(xr);
    float amax = 0.0f;
    for (int64_t k = threadIdx.x; k < K8; k += blockDim.x) {
        const uint4 v = x8[k];
        for (const uint32_t w : {v.x, v.y, v.z, v.w})
            amax = fmaxf(amax, fmaxf(fabsf(bf16_bits_to_float(w & 0xFFFFu)), fabsf(bf16_bits_to_float(w >> 16))));
    }
    for (int64_t k = 8 * K8 + threadIdx.x; k < K; k += blockDim.x) amax = fmaxf(amax, fabsf(bf16_bits_to_float(xr[k])));
    amax = detail::block_max(amax, red);
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    for (int64_t k = threadIdx.x; k < K8; k += blockDim.x) {
        const uint4 v = x8[k];
        uint32_t out[2] = {0, 0};
        int e = 0;
        for (const uint32_t w : {v.x, v.y, v.z, v.w})
            for (const uint32_t h : {w & 0xFFFFu, w >> 16}) {
                out[e / 4] |= static_cast<uint32_t>(e4m3(bf16_bits_to_float(h) / scale)) << (8 * (e % 4));
                ++e;
            }
        reinterpret_cast<uint2*>(qr)[k] = make_uint2(out[0], out[1]);
    }
    for (int64_t k = 8 * K8 + threadIdx.x; k < K; k += blockDim.x) qr[k] = e4m3(bf16_bits_to_float(xr[k]) / scale);
    if (threadIdx.x == 0) sx[r] = scale;
}

// fp8_outer_scale_kernel: y[r·ldy + j] *= sx[r] · sw[j·sw_stride] for r < n,
// j < m (the two scales of the FP8 product as outer factors). One thread per
// element, grid-stride. Bound: memory.
__global__ void __launch_bounds__(256) fp8_outer_scale_kernel(float* __restrict__ y, int64_t ldy, int64_t n, int64_t m,
                                                              const float* __restrict__ sx, const float* __restrict__ sw,
                                                              int64_t sw_stride) {
    const int64_t total = n * m;
    for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
         t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = t / m, j = t % m;
        y[r * ldy + j] *= sx[r] * sw[j * sw_stride];
    }
}

void check_lt(cublasStatus_t st, const char* what) {
    if (st != CUBLAS_STATUS_SUCCESS) throw_error(std::string("cuBLASLt: ") + what + " failed (status " + std::to_string(static_cast<int>(st)) + ")");
}

}  // namespace

bool gemm_weight_type_supported(DType t) {
    switch (t) {
        case DType::F32: case DType::F16: case DType::BF16: case DType::Q8_0: case DType::Q4_0: case DType::Q4_1:
        case DType::Q5_0: case DType::Q5_1: case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K:
        case DType::Q6_K: case DType::F8_E4M3_B32: case DType::NVFP4:
            return true;
        default:
            return false;
    }
}

void dequantize_weight_bf16(const DeviceWeight& w, int64_t row0, int64_t rows, uint16_t* out, cudaStream_t stream) {
    if (!gemm_weight_type_supported(w.type))
        throw_error(std::string("dequantize_weight_bf16: no BF16 dequantization for weight type ") + std::string(dtype_name(w.type)));
    if (!out || !w.q) throw_error("dequantize_weight_bf16: null pointer");
    if (row0 < 0 || rows < 1 || row0 + rows > w.N) throw_error("dequantize_weight_bf16: rows out of range");
    if (rows == 0) return;
    const DeqArgs a{static_cast<const uint8_t*>(w.q), static_cast<const uint8_t*>(w.q2),
                    static_cast<const uint8_t*>(w.s), static_cast<const uint8_t*>(w.s2), w.K};
    const unsigned gb = grid_for(rows * (w.K / 32)), gf = grid_for(rows * w.K);
    switch (w.type) {
        case DType::F32: dequant_float_kernel<DType::F32><<<gf, 256, 0, stream>>>(w.q, w.K, row0, rows, out); break;
        case DType::F16: dequant_float_kernel<DType::F16><<<gf, 256, 0, stream>>>(w.q, w.K, row0, rows, out); break;
        case DType::BF16: dequant_float_kernel<DType::BF16><<<gf, 256, 0, stream>>>(w.q, w.K, row0, rows, out); break;
        case DType::Q8_0: dequant_block_kernel<DType::Q8_0><<<gb, 256, 0, stream>>>(a, row0, rows, out); break;
        case DType::Q4_0: dequant_block_kernel<DType::Q4_0><<<gb, 256, 0, stream>>>(a, row0, rows, out); break;
        case DType::Q4_1: dequant_block_kernel<DType::Q4_1><<<gb, 256, 0, stream>>>(a, row0, rows, out); break;
        case DType::Q5_0: dequant_block_kernel<DType::Q5_0><<<gb, 256, 0, stream>>>(a, row0, rows, out); break;
        case DType::Q5_1: dequant_block_kernel<DType::Q5_1><<<gb, 256, 0, stream>>>(a, row0, rows, out); break;
        case DType::Q4_K: dequant_block_kernel<DType::Q4_K><<<gb, 256, 0, stream>>>(a, row0, rows, out); break;
        case DType::Q5_K: dequant_block_kernel<DType::Q5_K><<<gb, 256, 0, stream>>>(a, row0, rows, out); break;
        case DType::Q6_K: dequant_block_kernel<DType::Q6_K><<<gb, 256, 0, stream>>>(a, row0, rows, out); break;
        case DType::Q2_K: dequant_block_kernel<DType::Q2_K><<<gb, 256, 0, stream>>>(a, row0, rows, out); break;
        case DType::Q3_K: dequant_block_kernel<DType::Q3_K><<<gb, 256, 0, stream>>>(a, row0, rows, out); break;
        case DType::F8_E4M3_B32:
            dequant_block_kernel<DType::F8_E4M3_B32><<<gb, 256, 0, stream>>>(a, row0, rows, out);
            break;
        case DType::NVFP4: dequant_block_kernel<DType::NVFP4><<<gb, 256, 0, stream>>>(a, row0, rows, out); break;
        default: break;
    }
    QUERN_CUDA_CHECK_LAUNCH();
}

DeviceWeight to_fp8_rows(const DeviceWeight& w, cudaStream_t stream) {
    if (!gemm_weight_type_supported(w.type))
        throw_error(std::string("to_fp8_rows: no FP8 conversion for weight type ") + std::string(dtype_name(w.type)));
    if (!w.q || w.K % 32 != 0 || w.N < 1) throw_error("to_fp8_rows: bad weight");
    DeviceWeight o;
    o.type = DType::F8_E4M3_B32;
    o.K = w.K;
    o.N = w.N;
    o.fp8_row_scaled = true;
    const size_t qbytes = (static_cast<size_t>(w.N * w.K) + 255) / 256 * 256;
    const size_t sbytes = static_cast<size_t>(w.N * (w.K / 32)) * sizeof(float);
    o.buf = DeviceBuffer(qbytes + sbytes + static_cast<size_t>(w.N) * sizeof(float));
    o.q = o.buf.data();
    o.s = static_cast<uint8_t*>(o.buf.data()) + qbytes;
    auto* rs = reinterpret_cast<float*>(static_cast<uint8_t*>(o.buf.data()) + qbytes + sbytes);
    o.row_scale = rs;
    const DeqArgs a{static_cast<const uint8_t*>(w.q), static_cast<const uint8_t*>(w.q2),
                    static_cast<const uint8_t*>(w.s), static_cast<const uint8_t*>(w.s2), w.K};
    auto* q = static_cast<uint8_t*>(o.q);
    auto* sc = static_cast<float*>(o.s);
    for (int64_t r0 = 0; r0 < w.N; r0 += 65535) {  // grid.x rows per launch
        const int64_t rows = std::min<int64_t>(65535, w.N - r0);
        uint8_t* qr = q + r0 * w.K;
        float* sr = sc + r0 * (w.K / 32);
        float* rsr = rs + r0;
        const auto g = static_cast<unsigned>(rows);
        switch (w.type) {
#define QUERN_FP8_CASE(T) \
    case DType::T: fp8_rows_kernel<DType::T><<<g, 256, 0, stream>>>(a, r0, qr, sr, rsr); break;
            QUERN_FP8_CASE(F32) QUERN_FP8_CASE(F16) QUERN_FP8_CASE(BF16) QUERN_FP8_CASE(Q8_0) QUERN_FP8_CASE(Q4_0)
            QUERN_FP8_CASE(Q4_1) QUERN_FP8_CASE(Q5_0) QUERN_FP8_CASE(Q5_1) QUERN_FP8_CASE(Q4_K) QUERN_FP8_CASE(Q5_K)
            QUERN_FP8_CASE(Q6_K) QUERN_FP8_CASE(Q2_K) QUERN_FP8_CASE(Q3_K) QUERN_FP8_CASE(F8_E4M3_B32)
            QUERN_FP8_CASE(NVFP4)
#undef QUERN_FP8_CASE
            default: break;
        }
        QUERN_CUDA_CHECK_LAUNCH();
    }
    QUERN_CUDA_CHECK(cudaStreamSynchronize(stream));
    return o;
}

void make_resident_bf16(DeviceWeight& w, cudaStream_t stream) {
    if (w.bf16) return;
    DeviceBuffer b(static_cast<size_t>(w.N * w.K) * 2);  // quern::Error when out of memory
    dequantize_weight_bf16(w, 0, w.N, b.as<uint16_t>(), stream);
    QUERN_CUDA_CHECK(cudaStreamSynchronize(stream));
    w.bf16_buf = std::move(b);
    w.bf16 = w.bf16_buf.as<uint16_t>();
}

void quantize_fp8_act_rows(const uint16_t* x, int64_t n, int64_t K, uint8_t* q, float* sx, cudaStream_t stream) {
    if (!x || !q || !sx) throw_error("quantize_fp8_act_rows: null pointer");
    if (n < 1 || n > 2147483647 || K < 1) throw_error("quantize_fp8_act_rows: bad shape");
    fp8_act_rows_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(x, K, q, sx);
    QUERN_CUDA_CHECK_LAUNCH();
}

void f32_to_bf16(const float* x, int64_t ldx, int64_t n, int64_t K, uint16_t* out, cudaStream_t stream) {
    if (!x || !out) throw_error("f32_to_bf16: null pointer");
    if (K < 1 || n < 0 || ldx < K) throw_error("f32_to_bf16: bad shape");
    if (n == 0) return;
    f32_to_bf16_kernel<<<grid_for(n * K), 256, 0, stream>>>(x, ldx, n, K, out);
    QUERN_CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- cuBLASLt

struct PrefillGemm::Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    // Tuning::gemm_tune: the heuristic's first candidates, timed on the
    // first product of the shape (then `algo` is the fastest).
    cublasLtMatmulAlgo_t candidates[8]{};  // (a fixed array: nvcc 13.0's front end
    int n_candidates = 0;                  //  fails on a std::vector of them here)
    bool tuned = true;
    // FP8: cuBLASLt applies the weight rows' and the tokens' scales itself
    // (outer-vector scale modes); else a second pass does.
    bool outer = false;
    ~Plan() {
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (c) cublasLtMatrixLayoutDestroy(c);
        if (desc) cublasLtMatmulDescDestroy(desc);
    }
};

namespace {
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// fp8_gemm's K splits of products with few blocks: 8 MiB holds two splits of
// 256 tokens by 4096 rows (an 8B model's down projection at 256 sequences).
constexpr int64_t kF8WorkElems = int64_t{2} << 20;
constexpr int kTuneCandidates = 8;
}

PrefillGemm::PrefillGemm(int64_t max_n, int64_t max_k, int64_t max_tile_elems)
    : max_n_(max_n), max_k_(max_k), max_tile_(max_tile_elems) {
    tune_ = tuning().gemm_tune;
    if (max_n < 1 || max_k < 1 || max_tile_elems < max_k) throw_error("PrefillGemm: bad scratch sizes");
    cublasLtHandle_t h = nullptr;
    check_lt(cublasLtCreate(&h), "cublasLtCreate");
    handle_ = h;
    try {
        workspace_ = DeviceBuffer(kWorkspaceBytes);
        for (auto& t : wtile_) t = DeviceBuffer(static_cast<size_t>(max_tile_elems) * 2);
        xact_ = DeviceBuffer(static_cast<size_t>(max_n * max_k) * 2);
        qx_ = DeviceBuffer(static_cast<size_t>(max_n * max_k));
        sx_ = DeviceBuffer(static_cast<size_t>(max_n) * sizeof(float));
        f8_work_ = DeviceBuffer(static_cast<size_t>(kF8WorkElems) * sizeof(float));
        QUERN_CUDA_CHECK(cudaStreamCreateWithFlags(&dq_stream_, cudaStreamNonBlocking));
        for (int b = 0; b < 2; ++b) {
            QUERN_CUDA_CHECK(cudaEventCreateWithFlags(&dq_done_[b], cudaEventDisableTiming));
            QUERN_CUDA_CHECK(cudaEventCreateWithFlags(&mm_done_[b], cudaEventDisableTiming));
        }
    } catch (...) {
        release_streams();
        cublasLtDestroy(h);
        throw;
    }
}

void PrefillGemm::release_streams() {
    for (int b = 0; b < 2; ++b) {
        if (dq_done_[b]) cudaEventDestroy(dq_done_[b]);
        if (mm_done_[b]) cudaEventDestroy(mm_done_[b]);
        dq_done_[b] = mm_done_[b] = nullptr;
    }
    if (dq_stream_) cudaStreamDestroy(dq_stream_);
    dq_stream_ = nullptr;
}

PrefillGemm::~PrefillGemm() {
    if (dq_stream_) cudaStreamSynchronize(dq_stream_);
    release_streams();
    for (auto& [k, p] : plans_) delete p;
    if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

// Column-major view (cuBLASLt's): D (m × n, ld ldc) = op(A) · B with
// A = the BF16 weight tile stored as k × m (ld k), op = transpose;
// B = the BF16 activations, k × n (ld k); D in FP32. Row-major, that is
// Y[n][m] = X[n][k] · W[m][k]ᵀ.
// The alignment cuBLASLt may assume for a matrix at p with columns every
// ld_bytes bytes: the largest power of two (at most 256) dividing both.
uint32_t PrefillGemm::alignment(const void* p, int64_t ld_bytes) {
    const auto a = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)) | static_cast<uint64_t>(ld_bytes) | 256u;
    return static_cast<uint32_t>(a & (~a + 1));  // lowest set bit
}

PrefillGemm::Plan& PrefillGemm::plan(int64_t m, int64_t n, int64_t k, int64_t ldc, uint32_t align_a,
                                     uint32_t align_b, uint32_t align_c, bool fp8) {
    const auto key = std::make_tuple(m, n, k, ldc, align_a, align_b, align_c | (fp8 ? 1u << 31 : 0u));
    if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
    auto* p = new Plan;
    try {
        // The FP8 form first asks for the outer-vector scales (cuBLASLt 12.9
        // on); without an algorithm for them it falls back to plain FP8.
        p->outer = fp8;
        const auto make_desc = [&] {
            if (p->desc) cublasLtMatmulDescDestroy(p->desc);
            p->desc = nullptr;
            check_lt(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
            const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
            check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT)), "TRANSA");
            check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)), "TRANSB");
            if (!p->outer) return;
            const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
            check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)),
                     "A_SCALE_MODE");
            check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)),
                     "B_SCALE_MODE");
        };
        make_desc();
        const cudaDataType_t in = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
        check_lt(cublasLtMatrixLayoutCreate(&p->a, in, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k),
                 "layout A");
        check_lt(cublasLtMatrixLayoutCreate(&p->b, in, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k),
                 "layout B");
        check_lt(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, static_cast<uint64_t>(m), static_cast<uint64_t>(n), ldc),
                 "layout C");
        cublasLtMatmulPreference_t pref = nullptr;
        check_lt(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
        const uint64_t ws = kWorkspaceBytes;
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
        // Only algorithms that work at the buffers' actual alignment (the
        // default assumes 256 bytes; the output may start mid-row of Q|K|V).
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a));
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b));
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c));
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c));
        cublasLtMatmulHeuristicResult_t res[kTuneCandidates]{};
        int found = 0;
        const auto heuristic = [&] {
            return cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), p->desc, p->a, p->b, p->c,
                                                  p->c, pref, tune_ ? kTuneCandidates : 1, res, &found);
        };
        cublasStatus_t st = heuristic();
        if (p->outer && (st != CUBLAS_STATUS_SUCCESS || found < 1)) {
            p->outer = false;
            make_desc();
            st = heuristic();
        }
        cublasLtMatmulPreferenceDestroy(pref);
        check_lt(st, "AlgoGetHeuristic");
        if (found < 1) throw_error("cuBLASLt: no algorithm for the prefill GEMM shape");
        p->algo = res[0].algo;
        if (tune_ && found > 1) {
            for (int i = 0; i < found; ++i) p->candidates[p->n_candidates++] = res[i].algo;
            p->tuned = false;
        }
    } catch (...) {
        delete p;
        throw;
    }
    plans_.emplace(key, p);
    return *p;
}

void PrefillGemm::matmul(const uint16_t* wb, int64_t m, const uint16_t* xb, int64_t n, int64_t k, float* y,
                         int64_t ldy, cudaStream_t stream) {
    Plan& p = plan(m, n, k, ldy, alignment(wb, k * 2), alignment(xb, k * 2), alignment(y, ldy * 4), false);
    check_lt(static_cast<cublasStatus_t>(launch(p, wb, xb, y, stream)), "Matmul");
}

int PrefillGemm::launch(Plan& p, const void* a, const void* b, float* y, cudaStream_t stream) {
    const float alpha = 1.0f, beta = 0.0f;
    const auto lt = static_cast<cublasLtHandle_t>(handle_);
    if (!p.tuned) {
        // Time each candidate on this product (it writes y; the call below
        // writes it again) and keep the fastest; a candidate that fails is
        // skipped. Synchronizes the stream, once per shape.
        cudaEvent_t e0, e1;
        QUERN_CUDA_CHECK(cudaEventCreate(&e0));
        QUERN_CUDA_CHECK(cudaEventCreate(&e1));
        float best = 0.0f;
        for (int c = 0; c < p.n_candidates; ++c) {
            const cublasLtMatmulAlgo_t& algo = p.candidates[c];
            float ms = 0.0f;
            bool ok = true;
            for (int rep = 0; rep < 4 && ok; ++rep) {  // the first run warms up
                if (rep == 1) QUERN_CUDA_CHECK(cudaEventRecord(e0, stream));
                ok = cublasLtMatmul(lt, p.desc, &alpha, a, p.a, b, p.b, &beta, y, p.c, y, p.c, &algo,
                                    workspace_.data(), kWorkspaceBytes, stream) == CUBLAS_STATUS_SUCCESS;
            }
            if (!ok) continue;
            QUERN_CUDA_CHECK(cudaEventRecord(e1, stream));
            QUERN_CUDA_CHECK(cudaEventSynchronize(e1));
            QUERN_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            if (best == 0.0f || ms < best) best = ms, p.algo = algo;
        }
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        p.n_candidates = 0;
        p.tuned = true;
    }
    return static_cast<int>(cublasLtMatmul(lt, p.desc, &alpha, a, p.a, b, p.b, &beta, y, p.c, y, p.c, &p.algo,
                                           workspace_.data(), kWorkspaceBytes, stream));
}

void PrefillGemm::run_bf16(const DeviceWeight& w, const uint16_t* xb, int64_t n, float* y, int64_t ldy,
                           cudaStream_t stream) {
    run_bf16_rows(w, 0, w.N, xb, n, y, ldy, stream);
}

void PrefillGemm::run_bf16_pieces(const DeviceWeight* const* ws, const int64_t* cols, int count, const uint16_t* xb,
                                  int64_t n, float* y, int64_t ldy, cudaStream_t stream) {
    // The pieces qw_gemm takes go in launches of one type and K (Q4_K_M
    // files mix Q4_K and Q6_K among a layer's Q, K and V); the rest one by one.
    const auto qw = [&](int i) {
        return uses_qw(*ws[i], n) && n <= max_n_ && ws[i]->K <= max_k_ && reinterpret_cast<uintptr_t>(xb) % 16 == 0;
    };
    std::array<bool, 16> done{};
    if (count > static_cast<int>(done.size())) throw_error("PrefillGemm: too many pieces");
    for (int i = 0; i < count; ++i) {
        if (done[static_cast<size_t>(i)]) continue;
        if (!qw(i)) {
            run_bf16(*ws[i], xb, n, y + cols[i], ldy, stream);
            continue;
        }
        QwPiece ps[kQwMaxPieces];
        int m = 0;
        for (int j = i; j < count && m < kQwMaxPieces; ++j)
            if (!done[static_cast<size_t>(j)] && qw(j) && ws[j]->type == ws[i]->type && ws[j]->K == ws[i]->K) {
                ps[m++] = QwPiece{ws[j], 0, ws[j]->N, cols[j]};
                done[static_cast<size_t>(j)] = true;
            }
        qw_gemm_pieces(ps, m, xb, n, y, ldy, stream);
        if (hook_) hook_("gemm");
    }
}

bool PrefillGemm::run_fp8_rows(const DeviceWeight& w, int64_t row0, int64_t n_rows, const uint16_t* xb, int64_t n,
                               float* y, int64_t ldy, cudaStream_t stream) {
    if (!tuning().fp8_cublas && w.row_scale && fp8_gemm_supported(w.K)) {
        quantize_fp8_act_rows(xb, n, w.K, qx_.as<uint8_t>(), sx_.as<float>(), stream);
        if (hook_) hook_("fp8_act");
        fp8_gemm(static_cast<const uint8_t*>(w.q), w.row_scale, w.N, w.K, row0, n_rows, qx_.as<uint8_t>(),
                 sx_.as<float>(), n, y, ldy, stream, f8_work_.as<float>(), kF8WorkElems);
        if (hook_) hook_("gemm");
        return true;
    }
    const auto* a = static_cast<const uint8_t*>(w.q) + row0 * w.K;
    const uint32_t aa = alignment(a, w.K), ab = alignment(qx_.data(), w.K), ac = alignment(y, ldy * 4);
    const auto key = std::make_tuple(n_rows, n, w.K, ldy, aa, ab, ac);
    if (fp8_refused_.count(key)) return false;
    // A shape this cuBLASLt has no FP8 kernel for (or one whose launch
    // fails) goes through the BF16 dequantization instead, this time and
    // every later time; y is then written by that path in full.
    const auto refuse = [&](const char* why) {
        fp8_refused_.insert(key);
        ++fp8_fallbacks_;
        if (fp8_fallbacks_ == 1 && verbose_)
            std::fprintf(stderr, "quern: no FP8 GEMM for a %lld x %lld x %lld product (%s); such products dequantize "
                                 "the FP8 weights to BF16\n",
                         static_cast<long long>(n_rows), static_cast<long long>(n), static_cast<long long>(w.K), why);
        return false;
    };
    Plan* p = nullptr;
    try {
        p = &plan(n_rows, n, w.K, ldy, aa, ab, ac, true);
    } catch (const std::exception& e) {
        return refuse(e.what());
    }
    quantize_fp8_act_rows(xb, n, w.K, qx_.as<uint8_t>(), sx_.as<float>(), stream);
    if (hook_) hook_("fp8_act");
    if (p->outer) {
        if (!w.row_scale) throw_error("PrefillGemm: an FP8 weight without its row scales");
        // The scale pointers are the call's (the plan is per shape, shared by
        // every matrix of it); the launch reads them as it is enqueued.
        const float* sa = w.row_scale + row0;
        const float* sb = sx_.as<float>();
        check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)),
                 "A_SCALE_POINTER");
        check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)),
                 "B_SCALE_POINTER");
    }
    const auto st = static_cast<cublasStatus_t>(launch(*p, a, qx_.data(), y, stream));
    if (st != CUBLAS_STATUS_SUCCESS) return refuse("cublasLtMatmul failed");
    if (p->outer) {
        if (hook_) hook_("gemm");
        return true;
    }
    const int64_t units = w.K / 32;
    fp8_outer_scale_kernel<<<grid_for(n * n_rows), 256, 0, stream>>>(
        y, ldy, n, n_rows, sx_.as<float>(), static_cast<const float*>(w.s) + row0 * units, units);
    QUERN_CUDA_CHECK_LAUNCH();
    if (hook_) hook_("gemm");
    return true;
}

bool PrefillGemm::uses_bq(const DeviceWeight& w, int64_t n) {
    if (!w.bq || n > kBqMaxRows) return false;
    // Up to how many rows bq_gemm beats the BF16 copy + cuBLASLt on an H200
    // (bench/batched-cuda-h200.md): 16 with its mma.sync kernels, 32 with the
    // wgmma ones; Tuning::bq_rows sets it (for measurements).
    const int64_t limit = tuning().bq_rows;
    const int64_t rows = limit >= 0 ? limit : bq_gemm_form() > 0 ? 32 : 16;
    return !w.bf16 || w.N >= 65536 || n <= rows;
}

bool PrefillGemm::qw_weight(const DeviceWeight& w) {
    return (tuning().qw != 0 || w.qw) && w.q && !w.fp8_row_scaled && qw_supported(w.type, w.K);
}

bool PrefillGemm::uses_qw(const DeviceWeight& w, int64_t n) {
    const int64_t limit = tuning().qw_rows >= 0 ? tuning().qw_rows : kQwRows;
    return !w.bf16 && !w.bq && n <= limit && qw_weight(w);
}

void PrefillGemm::run_bf16_rows(const DeviceWeight& w, int64_t row0, int64_t n_rows, const uint16_t* xb, int64_t n,
                                float* y, int64_t ldy, cudaStream_t stream) {
    if (!gemm_weight_type_supported(w.type))
        throw_error(std::string("PrefillGemm: no prefill GEMM for weight type ") + std::string(dtype_name(w.type)));
    if (!xb || !y) throw_error("PrefillGemm: null pointer");
    if (n < 1 || n > max_n_ || w.K > max_k_ || row0 < 0 || n_rows < 1 || row0 + n_rows > w.N || ldy < n_rows)
        throw_error("PrefillGemm: shape out of range");
    if (w.fp8_row_scaled && w.K % 16 == 0 && run_fp8_rows(w, row0, n_rows, xb, n, y, ldy, stream)) return;
    if (uses_bq(w, n) && row0 % 16 == 0 && reinterpret_cast<uintptr_t>(xb) % 16 == 0) {
        bq_gemm(w, row0, n_rows, xb, n, y, ldy, stream);  // few rows: read the quantized weights once
        if (hook_) hook_("gemm");
        return;
    }
    if (uses_qw(w, n) && reinterpret_cast<uintptr_t>(xb) % 16 == 0) {
        qw_gemm(w, row0, n_rows, xb, n, y, ldy, stream);  // the quantized weights, no copy
        if (hook_) hook_("gemm");
        return;
    }
    if (w.bf16) {  // resident copy: one GEMM, nothing to dequantize
        matmul(w.bf16 + row0 * w.K, n_rows, xb, n, w.K, y, ldy, stream);
        if (hook_) hook_("gemm");
        return;
    }
    // Tiles of whole rows, a multiple of 256 rows (so that every tile's
    // output starts as aligned as y) unless one tile takes the rows.
    int64_t tile = std::min<int64_t>(n_rows, max_tile_ / w.K);
    if (tile < n_rows && tile >= 256) tile -= tile % 256;
    for (int64_t t0 = 0; t0 < n_rows; t0 += tile) {
        const int64_t rows = std::min(tile, n_rows - t0), r0 = row0 + t0;
        // Double buffering: tile buffer b is dequantized on dq_stream_ once
        // the GEMM that last read it is done, and the GEMM on `stream` waits
        // for its dequantization; the next tile's (or the next matrix's)
        // dequantization overlaps this GEMM and whatever `stream` runs
        // between GEMMs (the weights do not depend on the activations).
        const int b = next_tile_;
        next_tile_ ^= 1;
        auto* wb = wtile_[b].as<uint16_t>();
        QUERN_CUDA_CHECK(cudaStreamWaitEvent(dq_stream_, mm_done_[b], 0));
        dequantize_weight_bf16(w, r0, rows, wb, dq_stream_);
        QUERN_CUDA_CHECK(cudaEventRecord(dq_done_[b], dq_stream_));
        QUERN_CUDA_CHECK(cudaStreamWaitEvent(stream, dq_done_[b], 0));
        matmul(wb, rows, xb, n, w.K, y + t0, ldy, stream);
        QUERN_CUDA_CHECK(cudaEventRecord(mm_done_[b], stream));
        if (hook_) hook_("gemm");
    }
}

const uint16_t* PrefillGemm::to_bf16(const float* x, int64_t ldx, int64_t n, int64_t K, cudaStream_t stream) {
    if (!x) throw_error("PrefillGemm: null pointer");
    if (n < 1 || n > max_n_ || K < 1 || K > max_k_ || ldx < K) throw_error("PrefillGemm: shape out of range");
    f32_to_bf16(x, ldx, n, K, xact_.as<uint16_t>(), stream);
    if (hook_) hook_("to_bf16");
    return xact_.as<uint16_t>();
}

void PrefillGemm::run(const DeviceWeight& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
                      cudaStream_t stream) {
    run_bf16(w, to_bf16(x, ldx, n, w.K, stream), n, y, ldy, stream);
}

}  // namespace quern::cuda
