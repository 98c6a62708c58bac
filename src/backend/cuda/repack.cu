// Upload-time repacking of GGUF blocks into the device layouts of weights.h.
//
// repack_*_kernel
//   Shapes:  src: n_blocks GGUF blocks back to back (rows of K elements, so
//            block i is block i % (K/bs) of row i / (K/bs)); dst: the streams.
//   Grid:    one thread per GGUF block, 256 threads per thread block.
//   Align:   none on src (blocks are read byte by byte: GGUF blocks of 34,
//            20 and 210 bytes sit at any even address); dst streams are
//            16-byte aligned.
//   Bound:   runs once per tensor at load; simple rather than fast.
#include "backend/cuda/kernels.h"
#include "quant/blocks.h"

namespace quern::cuda {
namespace {

__device__ __forceinline__ uint16_t rd16(const uint8_t* p) {
    return static_cast<uint16_t>(p[0] | (static_cast<uint16_t>(p[1]) << 8));
}

__global__ void repack_q8_0_kernel(const uint8_t* __restrict__ src, int64_t n_blocks, int64_t K,
                                   uint8_t* __restrict__ q, uint16_t* __restrict__ d) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    const int64_t bpr = K / 32, row = i / bpr, b = i % bpr;
    const uint8_t* s = src + i * static_cast<int64_t>(sizeof(block_q8_0));
    d[i] = rd16(s);
    uint8_t* dst = q + row * K + 16 * b;
    for (int j = 0; j < 16; ++j) {
        dst[j] = s[2 + j];
        dst[K / 2 + j] = s[2 + 16 + j];
    }
}

__global__ void repack_q4_1_kernel(const uint8_t* __restrict__ src, int64_t n_blocks, uint8_t* __restrict__ q,
                                   uint32_t* __restrict__ dm) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    const uint8_t* s = src + i * static_cast<int64_t>(sizeof(block_q4_1));
    dm[i] = static_cast<uint32_t>(rd16(s)) | (static_cast<uint32_t>(rd16(s + 2)) << 16);
    for (int j = 0; j < 16; ++j) q[16 * i + j] = s[4 + j];
}

// GGUF Q4_K: element 64p + l (l < 32) is the low nibble of qs[32p + l], element
// 64p + 32 + l its high nibble. Device: sub-block j's chunk byte i holds
// element 32j + i (low) and 32j + 16 + i (high). The 12-byte scale packing is
// re-laid out for a cheap decode (weights.h).
__global__ void repack_q4_k_kernel(const uint8_t* __restrict__ src, int64_t n_blocks, uint8_t* __restrict__ q,
                                   uint8_t* __restrict__ head) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    const uint8_t* s = src + i * static_cast<int64_t>(sizeof(block_q4_K));
    for (int j = 0; j < 4; ++j) head[16 * i + j] = s[j];  // d, dmin
    uint32_t mhi = 0;
    for (int j = 0; j < 8; ++j) {  // get_scale_min_k4
        const uint8_t* q = s + 4;
        const int sc = j < 4 ? (q[j] & 63) : ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        const int m = j < 4 ? (q[j + 4] & 63) : ((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
        head[16 * i + 4 + j] = static_cast<uint8_t>(sc | ((m & 3) << 6));
        mhi |= static_cast<uint32_t>(m >> 2) << (4 * j);
    }
    for (int j = 0; j < 4; ++j) head[16 * i + 12 + j] = static_cast<uint8_t>(mhi >> (8 * j));
    const uint8_t* qs = s + 16;
    for (int j = 0; j < 8; ++j) {
        const int p = j / 2, shift = 4 * (j & 1);
        for (int b = 0; b < 16; ++b) {
            const int lo = (qs[32 * p + b] >> shift) & 0xF;
            const int hi = (qs[32 * p + 16 + b] >> shift) & 0xF;
            q[128 * i + 16 * j + b] = static_cast<uint8_t>(lo | (hi << 4));
        }
    }
}

// GGUF Q6_K element e = 128h + 32r + l: low 4 bits from ql[64h + 32(r%2) + l]
// (low nibble for r < 2, high for r >= 2), high 2 bits = bits 2r.. of qh[32h + l].
__device__ __forceinline__ int q6_at(const uint8_t* ql, const uint8_t* qh, int e) {
    const int h = e / 128, r = (e % 128) / 32, l = e % 32;
    const int lo = (ql[64 * h + 32 * (r % 2) + l] >> (r < 2 ? 0 : 4)) & 0xF;
    const int hi = (qh[32 * h + l] >> (2 * r)) & 3;
    return lo | (hi << 4);
}

__global__ void repack_q6_k_kernel(const uint8_t* __restrict__ src, int64_t n_blocks, uint8_t* __restrict__ q,
                                   uint32_t* __restrict__ qh_out, int8_t* __restrict__ sc, uint16_t* __restrict__ d) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    const uint8_t* s = src + i * static_cast<int64_t>(sizeof(block_q6_K));
    const uint8_t* ql = s;
    const uint8_t* qh = s + 128;
    for (int j = 0; j < 16; ++j) sc[16 * i + j] = static_cast<int8_t>(s[192 + j]);
    d[i] = rd16(s + 208);
    for (int g = 0; g < 8; ++g) {
        for (int b = 0; b < 16; ++b) {
            const int lo = q6_at(ql, qh, 32 * g + b) & 0xF;
            const int hi = q6_at(ql, qh, 32 * g + 16 + b) & 0xF;
            q[128 * i + 16 * g + b] = static_cast<uint8_t>(lo | (hi << 4));
        }
        for (int h = 0; h < 2; ++h) {
            uint32_t word = 0;
            for (int k = 0; k < 4; ++k)
                for (int e = 0; e < 4; ++e) {
                    const uint32_t bits = static_cast<uint32_t>(q6_at(ql, qh, 32 * g + 16 * h + 4 * e + k) >> 4);
                    word |= bits << (8 * k + 2 * e);
                }
            qh_out[2 * (8 * i + g) + h] = word;
        }
    }
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>((n + 255) / 256); }

}  // namespace

void launch_repack(DType t, const uint8_t* src, int64_t n_blocks, int64_t K, void* q_, void* q2, void* s, void* s2,
                   cudaStream_t stream) {
    if (n_blocks == 0) return;
    auto* q = static_cast<uint8_t*>(q_);
    switch (t) {
        case DType::Q8_0:
            repack_q8_0_kernel<<<grid_for(n_blocks), 256, 0, stream>>>(
                src, n_blocks, K, q, static_cast<uint16_t*>(s));
            break;
        case DType::Q4_1:
            repack_q4_1_kernel<<<grid_for(n_blocks), 256, 0, stream>>>(
                src, n_blocks, q, static_cast<uint32_t*>(s));
            break;
        case DType::Q4_K:
            repack_q4_k_kernel<<<grid_for(n_blocks), 256, 0, stream>>>(
                src, n_blocks, q, static_cast<uint8_t*>(s));
            break;
        case DType::Q6_K:
            repack_q6_k_kernel<<<grid_for(n_blocks), 256, 0, stream>>>(
                src, n_blocks, q, static_cast<uint32_t*>(q2), static_cast<int8_t*>(s),
                static_cast<uint16_t*>(s2));
            break;
        default: break;
    }
}

}  // namespace quern::cuda
