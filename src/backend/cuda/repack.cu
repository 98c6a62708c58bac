// Upload-time repacking of GGUF blocks into the device layouts of weights.h.
//
// repack_*_kernel
//   Shapes:  src: n_blocks GGUF blocks back to back (rows of K elements, so
//            block i is block i % (K/bs) of row i / (K/bs)); dst: the streams.
//   Grid:    one thread per GGUF block, 256 threads per thread block.
//   Align:   none on src (blocks are read byte by byte: GGUF blocks of 34,
//            20 and 210 bytes sit at any even address); dst streams are
//            16-byte aligned.
//   Types:   the GGUF quants (Q4_0 .. Q6_K) and quern's F8_E4M3_B32 / NVFP4
//            (block_f8_b32, block_nvfp4 of quant/blocks.h).
//   Bound:   runs once per tensor at load; simple rather than fast.
#include <cstddef>

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

// ---- Q4_0, Q5_0, Q5_1, Q5_K, Q2_K, Q3_K

__global__ void repack_q4_0_kernel(const uint8_t* __restrict__ src, int64_t n_blocks, uint8_t* __restrict__ q,
                                   uint16_t* __restrict__ d) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    const uint8_t* s = src + i * static_cast<int64_t>(sizeof(block_q4_0));
    d[i] = rd16(s);
    for (int j = 0; j < 16; ++j) q[16 * i + j] = s[2 + j];
}

// Fifth bits of a 32-element block (bit e = element e, GGUF's qh) re-ordered
// for the GEMV (weights.h): byte k, bit i = element 4i+k; bit 4+i = element
// 16+4i+k.
__device__ __forceinline__ uint32_t q5_high_bits(uint32_t qh) {
    uint32_t r = 0;
    for (int half = 0; half < 2; ++half)
        for (int i = 0; i < 4; ++i)
            for (int k = 0; k < 4; ++k) {
                const int e = 16 * half + 4 * i + k;
                r |= ((qh >> e) & 1u) << (8 * k + 4 * half + i);
            }
    return r;
}
__device__ __forceinline__ uint32_t rd32(const uint8_t* p) {
    return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
           (static_cast<uint32_t>(p[3]) << 24);
}

__global__ void repack_q5_0_kernel(const uint8_t* __restrict__ src, int64_t n_blocks, uint8_t* __restrict__ q,
                                   uint32_t* __restrict__ qh, uint16_t* __restrict__ d) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    const uint8_t* s = src + i * static_cast<int64_t>(sizeof(block_q5_0));
    d[i] = rd16(s);
    qh[i] = q5_high_bits(rd32(s + 2));
    for (int j = 0; j < 16; ++j) q[16 * i + j] = s[6 + j];
}

__global__ void repack_q5_1_kernel(const uint8_t* __restrict__ src, int64_t n_blocks, uint8_t* __restrict__ q,
                                   uint2* __restrict__ dmh) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    const uint8_t* s = src + i * static_cast<int64_t>(sizeof(block_q5_1));
    dmh[i] = make_uint2(static_cast<uint32_t>(rd16(s)) | (static_cast<uint32_t>(rd16(s + 2)) << 16),
                        q5_high_bits(rd32(s + 4)));
    for (int j = 0; j < 16; ++j) q[16 * i + j] = s[8 + j];
}

// GGUF Q5_K: as Q4_K (scales, nibbles), plus bit 4 of element e of sub-block j
// in bit j of qh[e]. Device: quants and head as Q4_K's, fifth bits of
// sub-block j in word 8i + j (q5_high_bits order).
__global__ void repack_q5_k_kernel(const uint8_t* __restrict__ src, int64_t n_blocks, uint8_t* __restrict__ q,
                                   uint32_t* __restrict__ qh_out, uint8_t* __restrict__ head) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    const uint8_t* s = src + i * static_cast<int64_t>(sizeof(block_q5_K));
    for (int j = 0; j < 4; ++j) head[16 * i + j] = s[j];  // d, dmin
    uint32_t mhi = 0;
    for (int j = 0; j < 8; ++j) {  // get_scale_min_k4
        const uint8_t* sc = s + 4;
        const int scale = j < 4 ? (sc[j] & 63) : ((sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4));
        const int m = j < 4 ? (sc[j + 4] & 63) : ((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4));
        head[16 * i + 4 + j] = static_cast<uint8_t>(scale | ((m & 3) << 6));
        mhi |= static_cast<uint32_t>(m >> 2) << (4 * j);
    }
    for (int j = 0; j < 4; ++j) head[16 * i + 12 + j] = static_cast<uint8_t>(mhi >> (8 * j));
    const uint8_t* qh = s + 16;
    const uint8_t* qs = s + 48;
    for (int j = 0; j < 8; ++j) {
        const int p = j / 2, shift = 4 * (j & 1);
        uint32_t bits = 0;
        for (int e = 0; e < 32; ++e) bits |= static_cast<uint32_t>((qh[e] >> j) & 1) << e;
        qh_out[8 * i + j] = q5_high_bits(bits);
        for (int b = 0; b < 16; ++b) {
            const int lo = (qs[32 * p + b] >> shift) & 0xF;
            const int hi = (qs[32 * p + 16 + b] >> shift) & 0xF;
            q[128 * i + 16 * j + b] = static_cast<uint8_t>(lo | (hi << 4));
        }
    }
}

// GGUF Q2_K / Q3_K: element e = 128h + 32j + l of a super-block has its low
// two bits at bits 2j.. of qs[32h + l]. Device: 64-element chunk v, word g,
// byte k, bits 2i.. hold element 64v + 16g + 4i + k.
__device__ __forceinline__ void repack_2bit(const uint8_t* qs, uint8_t* dst) {
    for (int v = 0; v < 4; ++v)
        for (int g = 0; g < 4; ++g)
            for (int k = 0; k < 4; ++k) {
                int byte = 0;
                for (int i = 0; i < 4; ++i) {
                    const int e = 64 * v + 16 * g + 4 * i + k;
                    const int h = e / 128, j = (e % 128) / 32, l = e % 32;
                    byte |= ((qs[32 * h + l] >> (2 * j)) & 3) << (2 * i);
                }
                dst[16 * v + 4 * g + k] = static_cast<uint8_t>(byte);
            }
}

__global__ void repack_q2_k_kernel(const uint8_t* __restrict__ src, int64_t n_blocks, uint8_t* __restrict__ q,
                                   uint8_t* __restrict__ sc, uint32_t* __restrict__ dm) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    const uint8_t* s = src + i * static_cast<int64_t>(sizeof(block_q2_K));
    for (int j = 0; j < 16; ++j) sc[16 * i + j] = s[j];
    repack_2bit(s + 16, q + 64 * i);
    dm[i] = static_cast<uint32_t>(rd16(s + 80)) | (static_cast<uint32_t>(rd16(s + 82)) << 16);
}

// GGUF Q3_K: element e = 128h + 32j + l takes its third bit from bit 4h + j of
// hmask[l]; 6-bit scale n (stored + 32) packed as q3_K_scale in reference.cpp.
__global__ void repack_q3_k_kernel(const uint8_t* __restrict__ src, int64_t n_blocks, uint8_t* __restrict__ q,
                                   uint32_t* __restrict__ qh_out, uint32_t* __restrict__ sc_out,
                                   uint16_t* __restrict__ d) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    const uint8_t* s = src + i * static_cast<int64_t>(sizeof(block_q3_K));
    const uint8_t* hmask = s;
    const uint8_t* sc = s + 96;
    repack_2bit(s + 32, q + 64 * i);
    // third bits: chunk v, word hb, byte k, bit 4g + i2 = element 64v + 32hb + 16g + 4i2 + k
    for (int w = 0; w < 8; ++w) {
        uint32_t word = 0;
        for (int g = 0; g < 2; ++g)
            for (int i2 = 0; i2 < 4; ++i2)
                for (int k = 0; k < 4; ++k) {
                    const int e = 32 * w + 16 * g + 4 * i2 + k;
                    const int h = e / 128, j = (e % 128) / 32, l = e % 32;
                    word |= static_cast<uint32_t>((hmask[l] >> (4 * h + j)) & 1) << (8 * k + 4 * g + i2);
                }
        qh_out[8 * i + w] = word;
    }
    uint32_t lo[2] = {0, 0}, hi = 0;
    for (int n = 0; n < 16; ++n) {
        const int l4 = n < 8 ? (sc[n] & 0xF) : (sc[n - 8] >> 4);
        const int h2 = (sc[8 + n % 4] >> (2 * (n / 4))) & 3;
        lo[n / 8] |= static_cast<uint32_t>(l4) << (4 * (n % 8));
        hi |= static_cast<uint32_t>(h2) << (2 * n);
    }
    sc_out[3 * i] = lo[0];
    sc_out[3 * i + 1] = lo[1];
    sc_out[3 * i + 2] = hi;
    d[i] = rd16(s + 108);
}

// ---- F8_E4M3_B32, NVFP4 (quern's blocks of FP8 / NVFP4 checkpoints)

// block_f8_b32 {f32 d; 32 E4M3 codes}: the codes go to the code stream in
// element order (block i at byte 32i: rows of K/32 blocks are contiguous),
// d to the scale stream.
__global__ void repack_f8_b32_kernel(const uint8_t* __restrict__ src, int64_t n_blocks, uint8_t* __restrict__ q,
                                     uint32_t* __restrict__ d) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    const uint8_t* s = src + i * static_cast<int64_t>(sizeof(block_f8_b32));
    d[i] = rd32(s + offsetof(block_f8_b32, d));
    for (int j = 0; j < QK_F8; ++j) q[QK_F8 * i + j] = s[offsetof(block_f8_b32, qs) + j];
}

// block_nvfp4 {f32 d; 4 E4M3 sc; 32 bytes of E2M1 pairs}: the head (d, sc)
// unchanged as one 8-byte record, the code bytes unchanged in the code stream.
__global__ void repack_nvfp4_kernel(const uint8_t* __restrict__ src, int64_t n_blocks, uint8_t* __restrict__ q,
                                    uint8_t* __restrict__ head) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    const uint8_t* s = src + i * static_cast<int64_t>(sizeof(block_nvfp4));
    static_assert(offsetof(block_nvfp4, d) == 0 && offsetof(block_nvfp4, sc) == 4 && offsetof(block_nvfp4, qs) == 8);
    for (int j = 0; j < 8; ++j) head[8 * i + j] = s[j];
    for (int j = 0; j < QK_NVFP4 / 2; ++j) q[(QK_NVFP4 / 2) * i + j] = s[8 + j];
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
        case DType::Q4_0:
            repack_q4_0_kernel<<<grid_for(n_blocks), 256, 0, stream>>>(
                src, n_blocks, q, static_cast<uint16_t*>(s));
            break;
        case DType::Q5_0:
            repack_q5_0_kernel<<<grid_for(n_blocks), 256, 0, stream>>>(
                src, n_blocks, q, static_cast<uint32_t*>(q2), static_cast<uint16_t*>(s));
            break;
        case DType::Q5_1:
            repack_q5_1_kernel<<<grid_for(n_blocks), 256, 0, stream>>>(
                src, n_blocks, q, static_cast<uint2*>(s));
            break;
        case DType::Q5_K:
            repack_q5_k_kernel<<<grid_for(n_blocks), 256, 0, stream>>>(
                src, n_blocks, q, static_cast<uint32_t*>(q2), static_cast<uint8_t*>(s));
            break;
        case DType::Q2_K:
            repack_q2_k_kernel<<<grid_for(n_blocks), 256, 0, stream>>>(
                src, n_blocks, q, static_cast<uint8_t*>(s), static_cast<uint32_t*>(s2));
            break;
        case DType::Q3_K:
            repack_q3_k_kernel<<<grid_for(n_blocks), 256, 0, stream>>>(
                src, n_blocks, q, static_cast<uint32_t*>(q2), static_cast<uint32_t*>(s), static_cast<uint16_t*>(s2));
            break;
        case DType::F8_E4M3_B32:
            repack_f8_b32_kernel<<<grid_for(n_blocks), 256, 0, stream>>>(src, n_blocks, q, static_cast<uint32_t*>(s));
            break;
        case DType::NVFP4:
            repack_nvfp4_kernel<<<grid_for(n_blocks), 256, 0, stream>>>(src, n_blocks, q, static_cast<uint8_t*>(s));
            break;
        default: break;
    }
}

}  // namespace quern::cuda
