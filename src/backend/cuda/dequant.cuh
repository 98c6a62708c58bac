// Device-side readers of the weight layouts in weights.h, shared by the
// kernels that decode quantized weights outside the GEMVs (the prefill
// dequantization in gemm.cu, the small-batch layouts in bq_gemm.cu, the
// grouped expert GEMM in grouped_gemm.cu).
#pragma once
#include <cuda_fp16.h>

#include "backend/cuda/minifloat.cuh"
#include "core/dtype.h"

#include <cstdint>

namespace quern::cuda::deq {

/// Element i of an fp16 array, as float.
__device__ __forceinline__ float half_at(const void* p, int64_t i) {
    return __half2float(static_cast<const __half*>(p)[i]);
}

/// Fifth bit of element e (0..31) of a 32-element group in the "Q5 order" of
/// weights.h: byte k, bit i = element 4i+k, bit 4+i = element 16+4i+k.
__device__ __forceinline__ uint32_t q5_bit(uint32_t bits, int e) {
    const int h = e >> 4, i = (e & 15) >> 2, k = e & 3;
    return (bits >> (8 * k + 4 * h + i)) & 1u;
}

/// Low nibble of byte e (element e < 16) or high nibble of byte e − 16 of a
/// 16-byte chunk holding 32 four-bit values ("as Q4_1" in weights.h).
__device__ __forceinline__ uint32_t nib(const uint8_t* chunk, int e) {
    return e < 16 ? (chunk[e] & 0xFu) : (chunk[e - 16] >> 4);
}

/// 16 bytes read with one 16-byte load (the address 16-byte aligned), for
/// indexing by constants after unrolling (each byte a bit-field extract).
struct Bytes16 {
    uint32_t w[4];
    __device__ __forceinline__ uint32_t byte(int i) const { return (w[i >> 2] >> (8 * (i & 3))) & 0xFFu; }
};
__device__ __forceinline__ Bytes16 ld16(const void* p) {
    const uint4 v = *static_cast<const uint4*>(p);
    return {{v.x, v.y, v.z, v.w}};
}

/// nib() of a chunk already in registers.
__device__ __forceinline__ uint32_t nib(const Bytes16& c, int e) {
    return e < 16 ? (c.byte(e) & 0xFu) : (c.byte(e - 16) >> 4);
}

/// Scale d·sc_j and min dmin·m_j of 32-element sub-block j (0..7) of a
/// Q4_K / Q5_K super-block, from its 16-byte device head (weights.h: fp16 d,
/// fp16 dmin, byte 4+j = sc_j | (m_j & 3) << 6, nibble j of bytes 12..15 =
/// m_j >> 2), in fp32 as dequantize_row_ref computes them.
__device__ __forceinline__ void k_scale_min(const uint8_t* head, int j, float& d1, float& m1) {
    const float d = half_at(head, 0), dmin = half_at(head, 1);
    const uint32_t b = head[4 + j];
    const uint32_t m_hi = (head[12 + j / 2] >> (4 * (j & 1))) & 0xFu;
    d1 = d * static_cast<float>(b & 63u);
    m1 = dmin * static_cast<float>(((b >> 6) & 3u) | (m_hi << 2));
}

/// The streams of one DeviceWeight (weights.h) and its row length K.
struct DeqArgs {
    const uint8_t* q;
    const uint8_t* q2;
    const uint8_t* s;
    const uint8_t* s2;
    int64_t K;
};

/// Decodes 32-element unit u (elements 32u .. 32u+31) of row `row` into v,
/// computing each value in fp32 as dequantize_row_ref does (the block types
/// of weights.h; unit_values below adds F32 / F16 / BF16).
template <DType T>
__device__ __forceinline__ void decode_unit(const DeqArgs& a, int64_t row, int64_t u, float (&v)[32]) {
    const int64_t units = a.K / 32;
    const int64_t gu = row * units + u;  // global unit index
    if constexpr (T == DType::Q8_0) {
        const uint8_t* q = a.q + row * a.K + 16 * u;  // planes 0 and 1 (elements 0..15, 16..31)
        const Bytes16 p[2] = {ld16(q), ld16(q + a.K / 2)};
        const float d = half_at(a.s, gu);
#pragma unroll
        for (int e = 0; e < 32; ++e)
            v[e] = d * static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(p[e >> 4].byte(e & 15))));
    } else if constexpr (T == DType::Q4_0) {
        const Bytes16 c = ld16(a.q + 16 * gu);
        const float d = half_at(a.s, gu);
#pragma unroll
        for (int e = 0; e < 32; ++e) v[e] = (static_cast<float>(nib(c, e)) - 8.0f) * d;
    } else if constexpr (T == DType::Q4_1) {
        const Bytes16 c = ld16(a.q + 16 * gu);
        const float d = half_at(a.s, 2 * gu), m = half_at(a.s, 2 * gu + 1);
#pragma unroll
        for (int e = 0; e < 32; ++e) v[e] = static_cast<float>(nib(c, e)) * d + m;
    } else if constexpr (T == DType::Q5_0) {
        const Bytes16 c = ld16(a.q + 16 * gu);
        const float d = half_at(a.s, gu);
        const uint32_t hb = reinterpret_cast<const uint32_t*>(a.q2)[gu];
#pragma unroll
        for (int e = 0; e < 32; ++e)
            v[e] = (static_cast<float>(nib(c, e) | (q5_bit(hb, e) << 4)) - 16.0f) * d;
    } else if constexpr (T == DType::Q5_1) {
        const Bytes16 c = ld16(a.q + 16 * gu);
        const uint8_t* rec = a.s + 8 * gu;  // {fp16 d, fp16 m, uint32 fifth bits}
        const float d = half_at(rec, 0), m = half_at(rec, 1);
        const uint32_t hb = *reinterpret_cast<const uint32_t*>(rec + 4);
#pragma unroll
        for (int e = 0; e < 32; ++e) v[e] = static_cast<float>(nib(c, e) | (q5_bit(hb, e) << 4)) * d + m;
    } else if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
        const Bytes16 c = ld16(a.q + 16 * gu);
        const uint8_t* head = a.s + 16 * (row * (a.K / 256) + (u >> 3));
        float d1, m1;
        deq::k_scale_min(head, static_cast<int>(u & 7), d1, m1);
        uint32_t hb = 0;
        if constexpr (T == DType::Q5_K) hb = reinterpret_cast<const uint32_t*>(a.q2)[gu];
#pragma unroll
        for (int e = 0; e < 32; ++e) {
            uint32_t qv = nib(c, e);
            if constexpr (T == DType::Q5_K) qv |= q5_bit(hb, e) << 4;
            v[e] = d1 * static_cast<float>(qv) - m1;
        }
    } else if constexpr (T == DType::Q2_K || T == DType::Q3_K) {
        // Low two bits of element 16g+4i+k: word g, byte k, bits 2i..2i+1;
        // 16-element sub-block n = 2·(u mod 8) + g of the super-block.
        const uint2 qw = reinterpret_cast<const uint2*>(a.q)[gu];
        const uint32_t w0 = qw.x, w1 = qw.y;
        const int64_t sb = row * (a.K / 256) + (u >> 3);
        if constexpr (T == DType::Q2_K) {
            const auto* sc = a.s + 2 * gu;  // scale | min << 4 per sub-block
            const float d = half_at(a.s2, 2 * sb), dmin = half_at(a.s2, 2 * sb + 1);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float dl = d * static_cast<float>(sc[h] & 0xF), ml = dmin * static_cast<float>(sc[h] >> 4);
#pragma unroll
                for (int e = 16 * h; e < 16 * h + 16; ++e) {
                    const int i = (e & 15) >> 2, k = e & 3;
                    const uint32_t qv = ((h ? w1 : w0) >> (8 * k + 2 * i)) & 3u;
                    v[e] = dl * static_cast<float>(qv) - ml;
                }
            }
        } else {
            // Third bit of element 16g+4i+k: byte k, bit 4g+i of the unit's
            // word (set: as is; clear: minus 4). Scale n: nibble n mod 8 of
            // word n/8, high two bits at bits 2n of word 2; stored + 32.
            const uint32_t hb = reinterpret_cast<const uint32_t*>(a.q2)[gu];
            const auto* sw = reinterpret_cast<const uint32_t*>(a.s) + 3 * sb;
            const float d = half_at(a.s2, sb);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int n = 2 * static_cast<int>(u & 7) + h;
                const int sc = static_cast<int>(((sw[n >> 3] >> (4 * (n & 7))) & 0xFu) | (((sw[2] >> (2 * n)) & 3u) << 4)) - 32;
                const float dl = d * static_cast<float>(sc);
#pragma unroll
                for (int e = 16 * h; e < 16 * h + 16; ++e) {
                    const int i = (e & 15) >> 2, k = e & 3;
                    const int lo = static_cast<int>(((h ? w1 : w0) >> (8 * k + 2 * i)) & 3u);
                    const int qv = lo - (((hb >> (8 * k + 4 * h + i)) & 1u) ? 0 : 4);
                    v[e] = dl * static_cast<float>(qv);
                }
            }
        }
    } else if constexpr (T == DType::F8_E4M3_B32) {
        const uint8_t* q = a.q + row * a.K + 32 * u;  // codes in element order
        const Bytes16 c[2] = {ld16(q), ld16(q + 16)};
        const float d = reinterpret_cast<const float*>(a.s)[gu];
#pragma unroll
        for (int e = 0; e < 32; ++e) v[e] = mf::e4m3_to_float(static_cast<uint8_t>(c[e >> 4].byte(e & 15))) * d;
    } else if constexpr (T == DType::NVFP4) {
        // Byte i of the chunk: element 2i (low nibble), 2i+1 (high); the
        // 64-element block's record {f32 d, E4M3 sc[4]} (16 elements per sc).
        const Bytes16 c = ld16(a.q + 16 * gu);
        const uint8_t* rec = a.s + 8 * (row * (a.K / 64) + (u >> 1));
        const float d = *reinterpret_cast<const float*>(rec);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float sc = mf::e4m3_to_float(rec[4 + 2 * static_cast<int>(u & 1) + h]) * d;
#pragma unroll
            for (int e = 16 * h; e < 16 * h + 16; ++e) {
                const uint32_t code = (c.byte(e >> 1) >> (4 * (e & 1))) & 0xFu;
                v[e] = mf::e2m1_to_float(code) * sc;
            }
        }
    } else if constexpr (T == DType::Q6_K) {
        const Bytes16 c = ld16(a.q + 16 * gu);
        const uint2 qh = reinterpret_cast<const uint2*>(a.q2)[gu];
        const auto* sc = reinterpret_cast<const int8_t*>(a.s) + 2 * gu;
        const float d = half_at(a.s2, row * (a.K / 256) + (u >> 3));
        const uint32_t w0 = qh.x, w1 = qh.y;
#pragma unroll
        for (int e = 0; e < 32; ++e) {
            // high 2 bits of element 16h+4i+k: word h, byte k, bits 2i..2i+1
            const int h = e >> 4, i = (e & 15) >> 2, k = e & 3;
            const uint32_t hi = ((h ? w1 : w0) >> (8 * k + 2 * i)) & 3u;
            const int q6 = static_cast<int>(nib(c, e) | (hi << 4)) - 32;
            v[e] = d * static_cast<float>(sc[h]) * static_cast<float>(q6);
        }
    }
}

/// Unit u (elements 32u .. 32u+31) of row `row` as floats: decode_unit for the
/// block types, the stored values for F32 / F16 / BF16.
template <DType T>
__device__ __forceinline__ void unit_values(const DeqArgs& a, int64_t row, int64_t u, float (&v)[32]) {
    const int64_t at = row * a.K + 32 * u;  // 16-byte loads: rows of K % 32 == 0 start aligned
    if constexpr (T == DType::F32) {
        const auto* p = reinterpret_cast<const float4*>(reinterpret_cast<const float*>(a.q) + at);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float4 f = p[i];
            v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
        }
    } else if constexpr (T == DType::F16 || T == DType::BF16) {
        const auto* p = reinterpret_cast<const uint4*>(reinterpret_cast<const uint16_t*>(a.q) + at);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint4 q = p[i];
            const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const auto h = static_cast<uint16_t>(w[j >> 1] >> (16 * (j & 1)));
                if constexpr (T == DType::F16) v[8 * i + j] = __half2float(__ushort_as_half(h));
                else v[8 * i + j] = __uint_as_float(static_cast<uint32_t>(h) << 16);
            }
        }
    } else {
        decode_unit<T>(a, row, u, v);
    }
}

}  // namespace quern::cuda::deq
