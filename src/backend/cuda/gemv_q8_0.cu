// Decode GEMV for Q8_0 weights (gemv_kernel in gemv_common.cuh holds the grid
// mapping, load policy and reduction common to all types).
//
// OpQ8_0 — integer path (default)
//   Shapes:  W: N rows × K (K % 32 == 0) in the Q8_0 device layout: quants in
//            two 16-byte planes per 32-block ([2][K/32][16] int8 per row), fp16
//            d per block. x: Q8 activation (planes + block records).
//   Unit:    one 32-element block: two 16-byte weight loads (plane 0 / plane 1,
//            each coalesced to 512 bytes per warp), one 2-byte d; two 16-byte
//            activation loads and its block record (d).
//   Math:    8 dp4a (int8 × int8, exact int32), then y += (d_w · d_x) · sum.
//   Bound:   memory: 34 bytes per 32 elements, ~0.4 integer ops per byte.
//
// Dequantization in registers against float x was measured 2-3x slower than
// this integer path on the H200 and removed (bench/gemv-cuda-h200.md).
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/kernels.h"

namespace quern::cuda {
namespace {
using namespace kern;

struct OpQ8_0 {
    static constexpr int kUnitElems = 32;
    static constexpr int kNormUnroll = 3;  // gemv_residual_norm: 3 loads in flight per row (+1.8% on Q8_0 decode)
    struct Args {
        const uint8_t* q;
        const uint16_t* d;
        int64_t K, half_k, blocks_per_row;
        ActQ8Ptrs a;
    };
    struct W {
        uint4 lo, hi;
        uint32_t d;
    };
    using A = ActQ8;
    static __device__ __forceinline__ W load_w(const Args& g, int row, int u) {
        const uint8_t* base = g.q + static_cast<int64_t>(row) * g.K + 16 * static_cast<int64_t>(u);
        W w;
        w.lo = ldw16(base);
        w.hi = ldw16(base + g.half_k);
        w.d = ldw2(g.d + static_cast<int64_t>(row) * g.blocks_per_row + u);
        return w;
    }
    static __device__ __forceinline__ A load_a(const Args& g, int u) { return load_act_q8(g.a, u); }
    static __device__ __forceinline__ float dot(const W& w, const A& x) {
        const int s = dp4a_16(w.hi, x.hi, dp4a_16(w.lo, x.lo, 0));
        return half_bits_to_float(w.d) * x.info.x * static_cast<float>(s);
    }
};

}  // namespace

bool launch_gemv_q8_0(const GemvLaunch& l, int config, cudaStream_t stream) {
    if (l.act != ActKind::Q8) return false;
    const OpQ8_0::Args g{static_cast<const uint8_t*>(l.w.q), static_cast<const uint16_t*>(l.w.s), l.K, l.K / 2,
                         l.K / 32, ActQ8Ptrs{l.xq, l.xinfo, l.K / 2}};
    return launch_configured<OpQ8_0>(g, l.y, l.N, l.K, config, stream, residual_act(l), &l);
}

}  // namespace quern::cuda
