// Decode GEMV for Q4_1 weights (the default model's main type). Grid mapping,
// load policy and reduction: gemv_kernel in gemv_common.cuh.
//
// OpQ4_1 — integer path (default)
//   Shapes:  W: N rows × K (K % 32 == 0), Q4_1 device layout: per row
//            [K/32][16] quant bytes (low nibble = element i, high = 16+i) and
//            [K/32] fp16x2 {d, m}. x: Q8 activation (planes + {d, s}).
//   Unit:    one block = one 16-byte weight load (512 contiguous bytes per warp
//            instruction) + one 4-byte {d, m}; activation: two 16-byte loads
//            (elements 0..15 / 16..31) and {d, s}.
//   Math:    w = d·q + m, so  sum w·x = d·dx·Σ q·qx + m·(dx·Σ qx) = d·dx·Σ + m·s;
//            8 dp4a on masked nibbles (exact int32).
//   Bound:   memory: 20 bytes per 32 elements, ~1.2 integer ops per byte.
//
// Dequantization in registers against float x was measured 2-3x slower than
// this integer path on the H200 and removed (bench/gemv-cuda-h200.md).
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/kernels.h"

namespace quern::cuda {
namespace {
using namespace kern;

struct OpQ4_1 {
    static constexpr int kUnitElems = 32;
    struct Args {
        const uint8_t* q;
        const uint32_t* dm;
        int64_t blocks_per_row;
        ActQ8Ptrs a;
    };
    struct W {
        uint4 q;
        uint32_t dm;
    };
    using A = ActQ8;
    static __device__ __forceinline__ W load_w(const Args& g, int row, int u) {
        const int64_t b = static_cast<int64_t>(row) * g.blocks_per_row + u;
        W w;
        w.q = ldw16(g.q + 16 * b);
        w.dm = ldw4(g.dm + b);
        return w;
    }
    static __device__ __forceinline__ A load_a(const Args& g, int u) { return load_act_q8(g.a, u); }
    static __device__ __forceinline__ float dot(const W& w, const A& x) {
        const int s = dp4a_16(hi_nibbles(w.q), x.hi, dp4a_16(lo_nibbles(w.q), x.lo, 0));
        const float d = half_bits_to_float(w.dm), m = half_bits_to_float(w.dm >> 16);
        return fmaf(d * x.info.x, static_cast<float>(s), m * x.info.y);
    }
};

}  // namespace

bool launch_gemv_q4_1(const GemvLaunch& l, int config, cudaStream_t stream) {
    if (l.act != ActKind::Q8) return false;
    const OpQ4_1::Args g{static_cast<const uint8_t*>(l.w.q), static_cast<const uint32_t*>(l.w.s), l.K / 32,
                         ActQ8Ptrs{l.xq, l.xinfo, l.K / 2}};
    return launch_configured<OpQ4_1>(g, l.y, l.N, l.K, config, stream, residual_act(l), &l);
}

}  // namespace quern::cuda
