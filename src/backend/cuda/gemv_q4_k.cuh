// Decode GEMV for Q4_K weights (Q4_K_M files: most matrices). Grid mapping,
// load policy and reduction: gemv_kernel in gemv_common.cuh.
//
// OpQ4_K — integer path
//   Shapes:  W: N rows × K (K % 256 == 0), Q4_K device layout: per row
//            [K/32][16] quant bytes, one 16-byte chunk per 32-element
//            sub-block (low nibble = element i, high = 16+i; repacked at
//            upload), and [K/256] 16-byte heads {fp16 d, fp16 dmin, 8 bytes
//            sc_j | (m_j & 3) << 6, 4 bytes of m_j >> 2 nibbles} (repacked
//            from GGUF's 12-byte packing). x: Q8 activation.
//   Unit:    one 32-element sub-block j of super-block u/8: one 16-byte quant
//            load (512 contiguous bytes per warp) + the 16-byte head (8
//            consecutive lanes read the same head: one request); activation:
//            two 16-byte loads + {d, s} of Q8 block u (sub-blocks and Q8
//            blocks coincide).
//   Math:    w = (d·sc_j)·q − dmin·m_j, so sum w·x = d·sc_j·dx·Σ q·qx − dmin·m_j·s;
//            8 dp4a, the high nibbles masked in place (16·q, unsigned dp4a,
//            the 16 folded into dx); sc_j, m_j by one byte permute and a few
//            shifts, no branches (lanes of a warp hold different j). Two
//            levels: 254·Σq·qx1 + Σq·qx2 in integers, one scaling (dot2).
//   Bound:   memory: 144 bytes per 256 elements, ~1.5 integer ops per byte.
#pragma once
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/kernels.h"

namespace quern::cuda::kern {

struct OpQ4_K {
    static constexpr int kUnitElems = 32;
    struct Args {
        const uint8_t* q;
        const uint8_t* head;
        int64_t subblocks_per_row, superblocks_per_row;
        ActQ8Ptrs a;
    };
    struct W {
        uint4 q;
        uint4 head;
        int j;  // sub-block 0..7
    };
    using A = ActQ8;
    static __device__ __forceinline__ W load_w(const Args& g, int row, int u) {
        W w;
        w.q = ldw16(g.q + 16 * (static_cast<int64_t>(row) * g.subblocks_per_row + u));
        w.head = ldw16(g.head + 16 * (static_cast<int64_t>(row) * g.superblocks_per_row + (u >> 3)));
        w.j = u & 7;
        return w;
    }
    static __device__ __forceinline__ A load_a(const Args& g, int u) { return load_act_q8(g.a, u); }
    // Σ q·qx over the unit, times 16: the high nibbles are used in place.
    static __device__ __forceinline__ int dot16(uint4 lo, uint4 hi16, const A& x) {
        return dp4a_us_16(hi16, x.hi, 16 * dp4a_16(lo, x.lo, 0));
    }
    // d·sc_j and dmin·m_j of the unit's sub-block. Device head (weights.h):
    // byte j of {y, z} = sc_j | (m_j & 3) << 6, nibble j of w = m_j >> 2.
    static __device__ __forceinline__ float2 scales(const W& w) {
        const uint32_t b = __byte_perm(w.head.y, w.head.z, static_cast<uint32_t>(w.j));
        const uint32_t sc = b & 63u;
        const uint32_t mn = ((b >> 6) & 3u) | (((w.head.w >> (4 * w.j)) & 0xFu) << 2);
        const float d = half_bits_to_float(w.head.x), dmin = half_bits_to_float(w.head.x >> 16);
        return make_float2(d * static_cast<float>(sc), dmin * static_cast<float>(mn));
    }
    static __device__ __forceinline__ float dot(const W& w, const A& x) {
        const int s16 = dot16(lo_nibbles(w.q), hi_nibbles_x16(w.q), x);
        const float2 dm = scales(w);
        return fmaf(dm.x * (x.info.x * 0.0625f), static_cast<float>(s16), -dm.y * x.info.y);
    }
    // Both levels: 16·(254·s1 + s2) in integers (x2's d is x1's / 254), one
    // float scaling by level 2's d, the min term against s1 + s2.
    static __device__ __forceinline__ float dot2(float acc, const W& w, const A& x1, const A& x2) {
        const uint4 lo = lo_nibbles(w.q), hi16 = hi_nibbles_x16(w.q);
        const int s = dot16(lo, hi16, x1) * static_cast<int>(kLevel2Ratio) + dot16(lo, hi16, x2);
        const float2 dm = scales(w);
        acc = fmaf(dm.x * (x2.info.x * 0.0625f), static_cast<float>(s), acc);
        return fmaf(-dm.y, x1.info.y + x2.info.y, acc);
    }
};

/// The Op's arguments for a launch (weight streams of weights.h, quantized x).
inline OpQ4_K::Args q4_k_args(const GemvLaunch& l) {
    return OpQ4_K::Args{static_cast<const uint8_t*>(l.w.q), static_cast<const uint8_t*>(l.w.s), l.K / 32, l.K / 256,
                        ActQ8Ptrs{l.xq, l.xinfo, l.K / 2}};
}

}  // namespace quern::cuda::kern
