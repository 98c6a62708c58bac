// Decode GEMV for NVFP4 weights (quern's layout of NVIDIA ModelOpt NVFP4
// checkpoints: E2M1 codes, one E4M3 scale per 16 elements, one f32 global
// scale; quant/blocks.h). Grid mapping, load policy and reduction:
// gemv_kernel in gemv_common.cuh.
//
// OpNvfp4 — integer path
//   Shapes:  W: N rows × K (K % 64 == 0) in the NVFP4 device layout
//            (weights.h): per row K/2 code bytes (the blocks' qs back to
//            back: element 2i in the low nibble of byte i, 2i+1 in the high)
//            and K/64 8-byte heads {f32 d, E4M3 sc[4]}. x: Q8 activation
//            (planes + block records).
//   Unit:    one 32-element half of a 64-element block, = one Q8 block of x
//            = two 16-element scale groups: one 16-byte code load (512
//            contiguous bytes per warp) + the block's 8-byte head (two lanes
//            share it); activation: two 16-byte loads + its record (d).
//   Math:    E2M1 values {0, 0.5, 1, 1.5, 2, 3, 4, 6} · sign, doubled, are
//            the integers {0, 1, 2, 3, 4, 6, 8, 12} · sign: each 16-bit
//            half-word of codes (four elements, nibble j = element j) turns
//            into four int8 by two byte permutes (a table of the magnitudes
//            and one of their negations, indexed by the low three bits of
//            each nibble) and a third that picks per byte by the sign bit
//            (mf::e2m1x4_to_s8x4, minifloat.cuh).
//            8 dp4a against the int8 activation give exact int32 sums S_g
//            per group g; with the group scale s_g = f32(e4m3(sc_g) · d)
//            (rounded as the CPU reference rounds it):
//              y += (0.5 · d_x) · (s_0 · S_0 + s_1 · S_1).
//   Bound:   memory: 40 bytes per 64 elements; ~2 integer ops per element
//            (per 4 elements: 3 byte permutes, ~4 masks/shifts, one dp4a),
//            ~3 per weight byte — twice Q4_0's (~1.5), so look at issue slots
//            if an H200 sweep shows it below Q4_0's bandwidth.
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/minifloat.cuh"

namespace quern::cuda {
namespace {
using namespace kern;

// Eight codes (one word: eight consecutive elements, the first in the low
// nibble) against the two activation words of those elements (0..3, 4..7).
__device__ __forceinline__ int dp4a_e2m1x8(uint32_t codes, uint32_t a_lo, uint32_t a_hi, int acc) {
    acc = __dp4a(static_cast<int>(mf::e2m1x4_to_s8x4(codes)), static_cast<int>(a_lo), acc);
    return __dp4a(static_cast<int>(mf::e2m1x4_to_s8x4(codes >> 16)), static_cast<int>(a_hi), acc);
}

struct OpNvfp4 {
    static constexpr int kUnitElems = 32;
    struct Args {
        const uint8_t* q;     // K/2 code bytes per row
        const uint2* head;    // K/64 heads per row
        int64_t units_per_row, blocks_per_row;
        ActQ8Ptrs a;
    };
    struct W {
        uint4 q;
        uint32_t d;    // f32 bits of the global scale
        uint32_t sc;   // the unit's two E4M3 group scales (low byte: first group)
    };
    using A = ActQ8;
    static __device__ __forceinline__ W load_w(const Args& g, int row, int u) {
        W w;
        w.q = ldw16(g.q + 16 * (static_cast<int64_t>(row) * g.units_per_row + u));
        const uint2 h = ldw8(g.head + static_cast<int64_t>(row) * g.blocks_per_row + (u >> 1));
        w.d = h.x;
        w.sc = (u & 1) ? (h.y >> 16) : (h.y & 0xFFFFu);  // groups 2(u&1), 2(u&1)+1
        return w;
    }
    static __device__ __forceinline__ A load_a(const Args& g, int u) { return load_act_q8(g.a, u); }
    static __device__ __forceinline__ float dot(const W& w, const A& x) {
        // Group 0 = elements 0..15 (code words x, y; activation plane lo),
        // group 1 = elements 16..31 (words z, w; plane hi).
        const int s0 = dp4a_e2m1x8(w.q.y, x.lo.z, x.lo.w, dp4a_e2m1x8(w.q.x, x.lo.x, x.lo.y, 0));
        const int s1 = dp4a_e2m1x8(w.q.w, x.hi.z, x.hi.w, dp4a_e2m1x8(w.q.z, x.hi.x, x.hi.y, 0));
        const float2 sc = mf::e4m3x2_to_float2(w.sc);
        const float d = __uint_as_float(w.d);
        const float g0 = __fmul_rn(sc.x, d), g1 = __fmul_rn(sc.y, d);  // f32(e4m3(sc) · d), as the CPU
        // W{} (past the row's end): codes, scales and d zero -> exactly 0.
        return (0.5f * x.info.x) * fmaf(g0, static_cast<float>(s0), g1 * static_cast<float>(s1));
    }
};

}  // namespace

bool launch_gemv_nvfp4(const GemvLaunch& l, int config, cudaStream_t stream) {
    if (l.act != ActKind::Q8) return false;
    const OpNvfp4::Args g{static_cast<const uint8_t*>(l.w.q), static_cast<const uint2*>(l.w.s), l.K / 32, l.K / 64,
                          ActQ8Ptrs{l.xq, l.xinfo, l.K / 2}};
    return launch_configured<OpNvfp4>(g, l.y, l.N, l.K, config, stream, residual_act(l), &l);
}

}  // namespace quern::cuda
