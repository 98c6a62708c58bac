// Decode GEMV for Q6_K weights (Q4_K_M files: the output matrix and half of
// the V / FFN-down matrices). Grid mapping, load policy and reduction:
// gemv_kernel in gemv_common.cuh.
//
// OpQ6_K — integer path
//   Shapes:  W: N rows × K (K % 256 == 0), Q6_K device layout: per row
//            [K/32][16] low-4-bit bytes (low nibble = element i, high = 16+i
//            of the 32-element group), [K/32] 8-byte high-2-bit words (word h,
//            byte k, bits 2i.. = element 16h+4i+k), [K/16] int8 sub-block
//            scales, [K/256] fp16 d. x: Q8 activation.
//   Unit:    one 32-element group (two 16-element sub-blocks): one 16-byte,
//            one 8-byte, two 2-byte weight loads (coalesced across lanes);
//            activation: two 16-byte loads + the record of Q8 block u.
//   Math:    q6 = lo | hi << 4 in 0..63 (one shift and one LOP3 per word),
//            8 dp4a.u32.s32 into two sub-block sums, −32·Σa per sub-block from
//            the activation record's half-block sums;
//            y += d·dx·(sc0·Σ0 + sc1·Σ1) (int32 exact: |Σ| < 2^17).
//   Bound:   memory: 210 bytes per 256 elements, ~1.5 integer ops per byte.
#pragma once
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/kernels.h"

namespace quern::cuda::kern {

// Unsigned 6-bit values (0..63) of 4 elements: low nibbles `lo` (masked to
// 0x0F per byte) and the high 2 bits already at bits 4..5 of each byte of `hb`.
__device__ __forceinline__ uint32_t q6_word(uint32_t lo, uint32_t hb) { return lo | (hb & 0x30303030u); }

struct OpQ6_K {
    static constexpr int kUnitElems = 32;
    struct Args {
        const uint8_t* ql;
        const uint2* qh;
        const uint8_t* sc;
        const uint16_t* d;
        int64_t groups_per_row, superblocks_per_row;
        ActQ8Ptrs a;
    };
    struct W {
        uint4 ql;
        uint2 qh;
        uint32_t sc;  // two int8 scales (sub-blocks 2u, 2u+1)
        uint32_t d;
    };
    using A = ActQ8;
    static __device__ __forceinline__ W load_w(const Args& g, int row, int u) {
        const int64_t gi = static_cast<int64_t>(row) * g.groups_per_row + u;
        W w;
        w.ql = ldw16(g.ql + 16 * gi);
        w.qh = ldw8(g.qh + gi);
        w.sc = ldw2(g.sc + 2 * gi);
        w.d = ldw2(g.d + static_cast<int64_t>(row) * g.superblocks_per_row + (u >> 3));
        return w;
    }
    static __device__ __forceinline__ A load_a(const Args& g, int u) { return load_act_q8(g.a, u); }
    static __device__ __forceinline__ float dot(const W& w, const A& x) {
        const uint4 lo = lo_nibbles(w.ql), hi = hi_nibbles(w.ql);
        // high bits of element 16h+4i+k sit at bits 2i.. of byte k of word h
        int s0 = dp4a_us(q6_word(lo.x, w.qh.x << 4), x.lo.x, 0);
        s0 = dp4a_us(q6_word(lo.y, w.qh.x << 2), x.lo.y, s0);
        s0 = dp4a_us(q6_word(lo.z, w.qh.x), x.lo.z, s0);
        s0 = dp4a_us(q6_word(lo.w, w.qh.x >> 2), x.lo.w, s0);
        int s1 = dp4a_us(q6_word(hi.x, w.qh.y << 4), x.hi.x, 0);
        s1 = dp4a_us(q6_word(hi.y, w.qh.y << 2), x.hi.y, s1);
        s1 = dp4a_us(q6_word(hi.z, w.qh.y), x.hi.z, s1);
        s1 = dp4a_us(q6_word(hi.w, w.qh.y >> 2), x.hi.w, s1);
        // Σ (q − 32)·a = Σ q·a − 32·Σ a, with Σ a per half-block from the activation record
        s0 -= 32 * __float_as_int(x.info.z);
        s1 -= 32 * __float_as_int(x.info.w);
        const int sc0 = static_cast<int>(static_cast<int8_t>(w.sc & 0xFFu));
        const int sc1 = static_cast<int>(static_cast<int8_t>((w.sc >> 8) & 0xFFu));
        return half_bits_to_float(w.d) * x.info.x * static_cast<float>(sc0 * s0 + sc1 * s1);
    }
};

/// The Op's arguments for a launch (weight streams of weights.h, quantized x).
inline OpQ6_K::Args q6_k_args(const GemvLaunch& l) {
    return OpQ6_K::Args{static_cast<const uint8_t*>(l.w.q),  static_cast<const uint2*>(l.w.q2),
                        static_cast<const uint8_t*>(l.w.s),  static_cast<const uint16_t*>(l.w.s2),
                        l.K / 32,
                        l.K / 256,
                        ActQ8Ptrs{l.xq, l.xinfo, l.K / 2}};
}

}  // namespace quern::cuda::kern
