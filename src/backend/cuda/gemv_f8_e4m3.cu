// Decode GEMV for F8_E4M3_B32 weights (quern's layout of FP8 checkpoints:
// OCP FP8 E4M3 codes, one f32 scale per 32 elements; quant/blocks.h). Grid
// mapping, load policy and reduction: gemv_kernel in gemv_common.cuh.
//
// OpF8E4M3 — float path (weight-only FP8, as the CPU computes it)
//   Shapes:  W: N rows × K (K % 32 == 0) in the F8_E4M3_B32 device layout
//            (weights.h): per row K E4M3 codes in element order and K/32 f32
//            block scales d. x: K floats (ActKind::F32). y: N floats.
//   Unit:    16 elements (half a block): one 16-byte code load (a warp reads
//            512 contiguous bytes), the block's 4-byte d (two lanes share
//            it: 64 contiguous bytes per warp); activation: four 16-byte
//            float loads from L1.
//   Math:    E4M3 pairs decoded exactly to f16x2 by cvt.rn.f16x2.e4m3x2
//            (mf::e4m3x2_to_float2, minifloat.cuh; E4M3 ⊂ f16, NaN codes
//            stay NaN), widened to f32;
//            16 fp32 FMAs, then × d: y = Σ_units d · Σ e4m3(q)·x.
//            No integer path: E4M3 values (2^-9 .. 448) are not integers,
//            and an int8 requantization would not be exact.
//   Bound:   memory: 36 bytes per 32 elements; ~2.5 ALU ops per element
//            (cvt, widen, FMA) and 4 bytes of L1 activation traffic per
//            element per row group — more work per weight byte than F16, so
//            the rows-per-block configurations (activation reuse) matter.
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/minifloat.cuh"

namespace quern::cuda {
namespace {
using namespace kern;

struct OpF8E4M3 {
    static constexpr int kUnitElems = 16;
    struct Args {
        const uint8_t* q;   // codes, K bytes per row
        const float* d;     // block scales, K/32 per row
        int64_t K, blocks_per_row;
        const float* x;     // K floats (not named `a`: this Op takes float x)
    };
    struct W {
        uint4 q;
        float d;
    };
    struct A {
        float4 v[4];
    };
    static __device__ __forceinline__ W load_w(const Args& g, int row, int u) {
        W w;
        w.q = ldw16(g.q + static_cast<int64_t>(row) * g.K + 16 * static_cast<int64_t>(u));
        w.d = __uint_as_float(ldw4(g.d + static_cast<int64_t>(row) * g.blocks_per_row + (u >> 1)));
        return w;
    }
    static __device__ __forceinline__ A load_a(const Args& g, int u) {
        const float* p = g.x + 16 * static_cast<int64_t>(u);
        A a;
#pragma unroll
        for (int i = 0; i < 4; ++i) a.v[i] = lda16f(p + 4 * i);
        return a;
    }
    // Four codes (one word) against four floats.
    static __device__ __forceinline__ float dot4(uint32_t codes, float4 x, float s) {
        const float2 lo = mf::e4m3x2_to_float2(codes), hi = mf::e4m3x2_to_float2(codes >> 16);
        s = fmaf(lo.x, x.x, s);
        s = fmaf(lo.y, x.y, s);
        s = fmaf(hi.x, x.z, s);
        return fmaf(hi.y, x.w, s);
    }
    static __device__ __forceinline__ float dot(const W& w, const A& x) {
        float s = dot4(w.q.x, x.v[0], 0.0f);
        s = dot4(w.q.y, x.v[1], s);
        s = dot4(w.q.z, x.v[2], s);
        s = dot4(w.q.w, x.v[3], s);
        return s * w.d;  // W{} (past the row's end): codes 0, d 0 -> exactly 0
    }
};

}  // namespace

bool launch_gemv_f8_e4m3(const GemvLaunch& l, int config, cudaStream_t stream) {
    if (l.act != ActKind::F32) return false;
    const OpF8E4M3::Args g{static_cast<const uint8_t*>(l.w.q), static_cast<const float*>(l.w.s), l.K, l.K / 32,
                           l.x};
    // &l: its index (gemv_indexed over an FP8 expert bank) selects the indexed kernel.
    return launch_configured<OpF8E4M3>(g, l.y, l.N, l.K, config, stream, ActQ8Ptrs{nullptr, nullptr, 0}, &l);
}

}  // namespace quern::cuda
