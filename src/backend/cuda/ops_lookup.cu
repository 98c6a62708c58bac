// Embedding row lookup (dequantizing one row of a GGUF-layout table) and
// greedy argmax over the logits. API: ops.h.
//
// get_row_kernel
//   Shapes:  table: n_rows rows of row_bytes = row_size(type, dim) bytes in
//            GGUF block layout (src/quant/blocks.h); out: dim floats.
//   Grid:    one thread per output element, 256 per block, ceil(dim/256)
//            blocks. Each thread reads its element's quant and its block's
//            scales (the scale bytes are shared through L1).
//   Math:    as dequantize_row_ref: Q8_0 d·q; Q4_K (d·sc)·q − dmin·m;
//            Q6_K (d·sc)·(q − 32); F16/BF16 widened; F32 copied;
//            F8_E4M3_B32 e4m3(q)·d; NVFP4 e2m1(q)·f32(e4m3(sc)·d) (OCP E4M3,
//            E2M1 decoded exactly; E4M3 NaN codes give NaN as on the CPU).
//   Align:   table 4-byte aligned (fp16 fields sit at even offsets of
//            even-sized blocks; the f32 d of the 36- and 40-byte FP8 /
//            NVFP4 blocks at multiples of 4).
//   Bound:   latency (one row: ≤ tens of KB).
//
// argmax_partial_kernel / argmax_final_kernel
//   Shapes:  x: n floats; partials: kArgmaxBlocks {value, index} pairs.
//   Grid:    partial: min(kArgmaxBlocks, ceil(n/1024)) blocks of 256 threads,
//            grid-stride; final: one block of 256 over the partials.
//            Order: larger value wins, the lower index on ties; NaN skipped.
//   Bound:   bandwidth at vocab sizes (512 KB for 128k logits), mostly latency.
#include "backend/cuda/launch.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/minifloat.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"
#include "core/dtype.h"

namespace quern::cuda {
namespace {

__device__ __forceinline__ float f16_at(const uint8_t* p) {
    return __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t*>(p)));
}

__device__ __forceinline__ float dequant_one(DType type, const uint8_t* row, int64_t e) {
    switch (type) {
        case DType::F32: return reinterpret_cast<const float*>(row)[e];
        case DType::F16: return f16_at(row + 2 * e);
        case DType::BF16:
            return __uint_as_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(row)[e]) << 16);
        case DType::Q8_0: {
            const uint8_t* b = row + (e / 32) * 34;
            return f16_at(b) * static_cast<float>(static_cast<int8_t>(b[2 + e % 32]));
        }
        case DType::Q4_K: {
            // 144-byte block: fp16 d, fp16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles.
            const uint8_t* b = row + (e / 256) * 144;
            const int l = static_cast<int>(e % 256);
            const int p = l / 64, r = l % 64;
            const int j = 2 * p + (r >= 32 ? 1 : 0);  // sub-block
            const uint8_t* sc = b + 4;
            int s, m;
            if (j < 4) {
                s = sc[j] & 63;
                m = sc[j + 4] & 63;
            } else {
                s = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
                m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
            }
            const uint8_t qb = b[16 + 32 * p + (r % 32)];
            const int qv = r < 32 ? (qb & 0xF) : (qb >> 4);
            const float d1 = f16_at(b) * static_cast<float>(s);
            const float m1 = f16_at(b + 2) * static_cast<float>(m);
            return __fsub_rn(__fmul_rn(d1, static_cast<float>(qv)), m1);  // no FMA: as the CPU rounds
        }
        case DType::Q6_K: {
            // 210-byte block: ql[128], qh[64], int8 scales[16], fp16 d.
            const uint8_t* b = row + (e / 256) * 210;
            const int l = static_cast<int>(e % 256);
            const int h = l / 128, r = (l % 128) / 32, ll = l % 32;
            const uint8_t* ql = b + 64 * h;
            const uint8_t* qh = b + 128 + 32 * h;
            const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h;
            const int lo = r < 2 ? (ql[32 * r + ll] & 0xF) : (ql[32 * (r - 2) + ll] >> 4);
            const int qv = (lo | (((qh[ll] >> (2 * r)) & 3) << 4)) - 32;
            const float dl = f16_at(b + 208) * static_cast<float>(sc[2 * r + ll / 16]);
            return dl * static_cast<float>(qv);
        }
        case DType::F8_E4M3_B32: {
            // 36-byte block: f32 d, 32 E4M3 codes.
            const uint8_t* b = row + (e / 32) * 36;
            return __fmul_rn(mf::e4m3_to_float(b[4 + e % 32]), *reinterpret_cast<const float*>(b));
        }
        case DType::NVFP4: {
            // 40-byte block: f32 d, 4 E4M3 group scales, 32 bytes of E2M1 pairs (element 2i low nibble).
            const uint8_t* b = row + (e / 64) * 40;
            const int l = static_cast<int>(e % 64);
            const float s = __fmul_rn(mf::e4m3_to_float(b[4 + l / 16]), *reinterpret_cast<const float*>(b));
            const uint32_t qb = b[8 + l / 2];
            return __fmul_rn(mf::e2m1_to_float(l % 2 ? qb >> 4 : qb & 0xFu), s);
        }
        default: return 0.0f;
    }
}

__global__ void get_row_kernel(DType type, const uint8_t* __restrict__ table, int64_t n_rows, int64_t row_bytes,
                               int64_t dim, const int32_t* __restrict__ id_ptr, float* __restrict__ out) {
    pdl_wait();
    pdl_trigger();
    const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= dim) return;
    int64_t id = *id_ptr;
    id = id < 0 ? 0 : (id >= n_rows ? n_rows - 1 : id);
    out[e] = dequant_one(type, table + id * row_bytes, e);
}

// get_row_norm_kernel (get_row_norm): get_row_kernel's values, one warp per
// 32-element block b (lane i: element 32b+i), 256 threads per block; then
// as gemv_norm_kernel's epilogue: ss_parts[b] = the warp's butterfly sum of
// x², and x·w quantized as block b (quantize_block_q8_1_l2).
__global__ void get_row_norm_kernel(DType type, const uint8_t* __restrict__ table, int64_t n_rows, int64_t row_bytes,
                                    int64_t dim, const int32_t* __restrict__ id_ptr, float* __restrict__ x,
                                    const float* __restrict__ w, int8_t* __restrict__ xq,
                                    ActBlockInfo* __restrict__ xinfo, int8_t* __restrict__ xq2,
                                    ActBlockInfo* __restrict__ xinfo2, float* __restrict__ ss_parts) {
    const int64_t b = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    const bool on = b < dim / 32;
    const float wi = on ? __ldg(w + 32 * b + lane) : 0.0f;  // a weight: before the wait
    pdl_wait();
    pdl_trigger();
    if (!on) return;  // whole warps leave together
    const int64_t e = 32 * b + lane;
    int64_t id = *id_ptr;
    id = id < 0 ? 0 : (id >= n_rows ? n_rows - 1 : id);
    const float v = dequant_one(type, table + id * row_bytes, e);
    x[e] = v;
    const float ss = detail::warp_sum(v * v);
    if (lane == 0) ss_parts[b] = ss;
    detail::quantize_block_q8_1_l2(v * wi, lane, b, xq, xinfo, xq2, xinfo2, dim / 2);
}

// get_rows_kernel (the prefill's lookup of n tokens)
//   Shapes:  table as get_row_kernel; ids: n int32 (device); out: n rows of
//            dim floats, row r at out + r·dim.
//   Grid:    (ceil(dim/256), n) blocks of 256: block (b, r) writes elements
//            256b .. of row r with dequant_one, as get_row_kernel does (the
//            same values bit for bit). Plain stream order (no PDL).
//   Bound:   memory (n rows of the table read once, n·dim floats written).
__global__ void get_rows_kernel(DType type, const uint8_t* __restrict__ table, int64_t n_rows, int64_t row_bytes,
                                int64_t dim, const int32_t* __restrict__ ids, float* __restrict__ out) {
    const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= dim) return;
    const int64_t r = blockIdx.y;
    int64_t id = ids[r];
    id = id < 0 ? 0 : (id >= n_rows ? n_rows - 1 : id);
    out[r * dim + e] = dequant_one(type, table + id * row_bytes, e);
}

constexpr int kArgmaxBlocks = 256;
constexpr int kArgmaxThreads = 256;

struct Best {
    float v;
    int32_t i;  // INT32_MAX: none yet
};

__device__ __forceinline__ Best better(Best a, Best b) {
    if (b.i == INT32_MAX) return a;
    if (a.i == INT32_MAX) return b;
    if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
    return a;
}

__device__ Best block_best(Best b) {
    __shared__ Best red[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        Best o{__shfl_xor_sync(0xFFFFFFFFu, b.v, off), __shfl_xor_sync(0xFFFFFFFFu, b.i, off)};
        b = better(b, o);
    }
    if (lane == 0) red[warp] = b;
    __syncthreads();
    if (warp == 0) {
        b = lane < nw ? red[lane] : Best{0.0f, INT32_MAX};
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            Best o{__shfl_xor_sync(0xFFFFFFFFu, b.v, off), __shfl_xor_sync(0xFFFFFFFFu, b.i, off)};
            b = better(b, o);
        }
    }
    return b;  // valid in thread 0
}

__global__ void argmax_partial_kernel(const float* __restrict__ x, int64_t n, Best* __restrict__ partial,
                                      bool early) {
    pdl_wait_trigger(early);
    Best b{0.0f, INT32_MAX};
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float v = x[i];
        if (v == v && (b.i == INT32_MAX || v > b.v)) b = Best{v, static_cast<int32_t>(i)};  // i ascends per thread
    }
    b = block_best(b);
    if (threadIdx.x == 0) partial[blockIdx.x] = b;
}

// adv (argmax_advance): thread 0 then ends the decode step as
// advance_decode_position does, out being &adv.ctl->sampled.
struct Advance {
    DecodeControl* ctl = nullptr;
    int32_t* tokens = nullptr;
    int n_ctx = 0;
    int32_t* host_out = nullptr;
};

__global__ void argmax_final_kernel(const Best* __restrict__ partial, int n_partial, int32_t* __restrict__ out,
                                    Advance adv) {
    pdl_wait();
    pdl_trigger();
    Best b{0.0f, INT32_MAX};
    for (int i = threadIdx.x; i < n_partial; i += blockDim.x) b = better(b, partial[i]);
    b = block_best(b);
    if (threadIdx.x == 0) {
        const int32_t id = b.i == INT32_MAX ? 0 : b.i;
        *out = id;  // with adv, out is &adv.ctl->sampled: the id is passed on, not read back
        if (adv.ctl) detail::advance_control(adv.ctl, adv.tokens, adv.n_ctx, adv.host_out, id);
    }
}

// argmax_rows_kernel: block (p, r) scans part p of kArgmaxRowParts of row r
// (n floats at x + r·ld; elements p·256 + i·(256·parts), four at a time with
// independent loads, so every block keeps several loads in flight) and
// leaves its best in partial[r·parts + p]; argmax_rows_final_kernel (block
// r, one warp) reduces row r's parts in order. Ties go to the lower index
// as in argmax (each thread's indices ascend; better() orders by value,
// then index). Bound: memory.
constexpr int kArgmaxRowParts = 16;

__global__ void __launch_bounds__(256) argmax_rows_kernel(const float* __restrict__ x, int64_t n, int64_t ld,
                                                          Best* __restrict__ partial) {
    const float* row = x + static_cast<int64_t>(blockIdx.y) * ld;
    const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
    Best b{0.0f, INT32_MAX};
    const auto take = [&](int64_t i, float v) {
        if (v == v && (b.i == INT32_MAX || v > b.v)) b = Best{v, static_cast<int32_t>(i)};
    };
    int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    for (; i + 3 * step < n; i += 4 * step) {
        const float v0 = row[i], v1 = row[i + step], v2 = row[i + 2 * step], v3 = row[i + 3 * step];
        take(i, v0), take(i + step, v1), take(i + 2 * step, v2), take(i + 3 * step, v3);
    }
    for (; i < n; i += step) take(i, row[i]);
    b = block_best(b);
    if (threadIdx.x == 0) partial[static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x] = b;
}

__global__ void argmax_rows_final_kernel(const Best* __restrict__ partial, int parts, int32_t* __restrict__ out) {
    Best b{0.0f, INT32_MAX};
    for (int p = static_cast<int>(threadIdx.x); p < parts; p += 32) b = better(b, partial[blockIdx.x * parts + p]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        Best o{__shfl_xor_sync(0xFFFFFFFFu, b.v, off), __shfl_xor_sync(0xFFFFFFFFu, b.i, off)};
        b = better(b, o);
    }
    if (threadIdx.x == 0) out[blockIdx.x] = b.i == INT32_MAX ? 0 : b.i;
}

}  // namespace

bool cuda_get_row_type_supported(DType t) {
    return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::Q8_0 || t == DType::Q4_K ||
           t == DType::Q6_K || t == DType::F8_E4M3_B32 || t == DType::NVFP4;
}

void get_row(DType type, const void* table, int64_t n_rows, int64_t dim, const int32_t* id, float* out,
             cudaStream_t stream) {
    if (!cuda_get_row_type_supported(type)) throw_error("get_row: unsupported table type");
    const int64_t bs = dtype_info(type).block_size;
    if (dim < 1 || dim % bs != 0 || n_rows < 1) throw_error("get_row: dim must be a positive multiple of the block size");
    if (!table || !id || !out) throw_error("get_row: null pointer");
    if (reinterpret_cast<uintptr_t>(table) % 4 != 0) throw_error("get_row: table must be 4-byte aligned");
    const int64_t rb = static_cast<int64_t>(row_size(type, dim));
    launch_pdl(get_row_kernel, dim3(static_cast<unsigned>((dim + 255) / 256)), dim3(256), 0, stream, type,
               static_cast<const uint8_t*>(table), n_rows, rb, dim, id, out);
    QUERN_CUDA_CHECK_LAUNCH();
}

void get_row_norm(DType type, const void* table, int64_t n_rows, int64_t dim, const int32_t* id, float* x,
                  const float* w, int8_t* xq, ActBlockInfo* xinfo, int8_t* xq2, ActBlockInfo* xinfo2, float* ss_parts,
                  cudaStream_t stream) {
    if (!cuda_get_row_type_supported(type)) throw_error("get_row_norm: unsupported table type");
    const int64_t bs = dtype_info(type).block_size;
    if (dim < 32 || dim % 32 != 0 || dim % bs != 0 || n_rows < 1)
        throw_error("get_row_norm: dim must be a positive multiple of 32 and of the block size");
    if (!table || !id || !x || !w || !xq || !xinfo || !ss_parts) throw_error("get_row_norm: null pointer");
    if ((xq2 == nullptr) != (xinfo2 == nullptr)) throw_error("get_row_norm: give both xq2 and xinfo2, or neither");
    if (reinterpret_cast<uintptr_t>(table) % 4 != 0) throw_error("get_row_norm: table must be 4-byte aligned");
    const int64_t rb = static_cast<int64_t>(row_size(type, dim));
    launch_pdl(get_row_norm_kernel, dim3(static_cast<unsigned>((dim + 255) / 256)), dim3(256), 0, stream, type,
               static_cast<const uint8_t*>(table), n_rows, rb, dim, id, x, w, xq, xinfo, xq2, xinfo2, ss_parts);
    QUERN_CUDA_CHECK_LAUNCH();
}

void get_rows(DType type, const void* table, int64_t n_rows, int64_t dim, const int32_t* ids, int64_t n, float* out,
              cudaStream_t stream) {
    if (!cuda_get_row_type_supported(type)) throw_error("get_rows: unsupported table type");
    const int64_t bs = dtype_info(type).block_size;
    if (dim < 1 || dim % bs != 0 || n_rows < 1) throw_error("get_rows: dim must be a positive multiple of the block size");
    if (n < 1 || n > 65535) throw_error("get_rows: n must be in 1 .. 65535");
    if (!table || !ids || !out) throw_error("get_rows: null pointer");
    if (reinterpret_cast<uintptr_t>(table) % 4 != 0) throw_error("get_rows: table must be 4-byte aligned");
    const int64_t rb = static_cast<int64_t>(row_size(type, dim));
    get_rows_kernel<<<dim3(static_cast<unsigned>((dim + 255) / 256), static_cast<unsigned>(n)), dim3(256), 0, stream>>>(
        type, static_cast<const uint8_t*>(table), n_rows, rb, dim, ids, out);
    QUERN_CUDA_CHECK_LAUNCH();
}

size_t argmax_scratch_bytes(int64_t) { return kArgmaxBlocks * sizeof(Best); }

namespace {
void argmax_impl(const float* x, int64_t n, void* scratch, int32_t* out_id, const Advance& adv, cudaStream_t stream) {
    const int64_t want = (n + 1023) / 1024;
    const int blocks = static_cast<int>(want < kArgmaxBlocks ? want : kArgmaxBlocks);
    Best* partial = static_cast<Best*>(scratch);
    launch_pdl(argmax_partial_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kArgmaxThreads), 0, stream, x, n, partial,
               true);
    QUERN_CUDA_CHECK_LAUNCH();
    launch_pdl(argmax_final_kernel, dim3(1), dim3(kArgmaxThreads), 0, stream, partial, blocks, out_id, adv);
    QUERN_CUDA_CHECK_LAUNCH();
}
}  // namespace

void argmax(const float* x, int64_t n, void* scratch, int32_t* out_id, cudaStream_t stream) {
    if (n < 1 || n > INT32_MAX) throw_error("argmax: need 1 <= n < 2^31");
    if (!x || !scratch || !out_id) throw_error("argmax: null pointer");
    argmax_impl(x, n, scratch, out_id, Advance{}, stream);
}

void argmax_advance(const float* x, int64_t n, void* scratch, DecodeControl* ctl, int32_t* tokens, int n_ctx,
                    int32_t* host_out, cudaStream_t stream) {
    if (n < 1 || n > INT32_MAX) throw_error("argmax_advance: need 1 <= n < 2^31");
    if (!x || !scratch || !ctl || !tokens || n_ctx < 1) throw_error("argmax_advance: null pointer or empty context");
    argmax_impl(x, n, scratch, &ctl->sampled, Advance{ctl, tokens, n_ctx, host_out}, stream);
}

size_t argmax_rows_scratch_bytes(int64_t m) { return static_cast<size_t>(m) * kArgmaxRowParts * sizeof(Best); }

void argmax_rows(const float* x, int64_t m, int64_t n, int64_t ld, void* scratch, int32_t* out_ids,
                 cudaStream_t stream) {
    if (m < 1 || m > 65535 || n < 1 || n > INT32_MAX || ld < n) throw_error("argmax_rows: shape out of range");
    if (!x || !scratch || !out_ids) throw_error("argmax_rows: null pointer");
    const int parts = static_cast<int>(std::min<int64_t>(kArgmaxRowParts, (n + 1023) / 1024));
    Best* partial = static_cast<Best*>(scratch);
    argmax_rows_kernel<<<dim3(static_cast<unsigned>(parts), static_cast<unsigned>(m)), 256, 0, stream>>>(x, n, ld,
                                                                                                        partial);
    QUERN_CUDA_CHECK_LAUNCH();
    argmax_rows_final_kernel<<<static_cast<unsigned>(m), 32, 0, stream>>>(partial, parts, out_ids);
    QUERN_CUDA_CHECK_LAUNCH();
}

}  // namespace quern::cuda
