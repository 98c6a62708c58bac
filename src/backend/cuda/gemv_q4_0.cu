// Decode GEMV for Q4_0 weights. Grid mapping, load policy and reduction:
// gemv_kernel in gemv_common.cuh.
//
// OpQ4_0 — integer path
//   Shapes:  W: N rows × K (K % 32 == 0), Q4_0 device layout: per row
//            [K/32][16] quant bytes (the block's qs unchanged: low nibble =
//            element i, high = 16+i) and [K/32] fp16 d. x: Q8 activation
//            (planes + block records).
//   Unit:    one block = one 16-byte weight load (512 contiguous bytes per warp
//            instruction) + one 2-byte d; activation: two 16-byte loads
//            (elements 0..15 / 16..31) and the block record.
//   Math:    w = d·(q − 8), so sum w·x = d·dx·(Σ q·qx − 8·Σ qx), with Σ qx
//            from the record's half-block sums; 8 dp4a on masked nibbles
//            (exact int32: |Σ| < 2^15), one fp32 scale per block.
//   Bound:   memory: 18 bytes per 32 elements, ~1.2 integer ops per byte.
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/kernels.h"

namespace quern::cuda {
namespace {
using namespace kern;

struct OpQ4_0 {
    static constexpr int kUnitElems = 32;
    struct Args {
        const uint8_t* q;
        const uint16_t* d;
        int64_t blocks_per_row;
        ActQ8Ptrs a;
    };
    struct W {
        uint4 q;
        uint32_t d;
    };
    using A = ActQ8;
    static __device__ __forceinline__ W load_w(const Args& g, int row, int u) {
        const int64_t b = static_cast<int64_t>(row) * g.blocks_per_row + u;
        W w;
        w.q = ldw16(g.q + 16 * b);
        w.d = ldw2(g.d + b);
        return w;
    }
    static __device__ __forceinline__ A load_a(const Args& g, int u) { return load_act_q8(g.a, u); }
    static __device__ __forceinline__ float dot(const W& w, const A& x) {
        int s = dp4a_16(hi_nibbles(w.q), x.hi, dp4a_16(lo_nibbles(w.q), x.lo, 0));
        s -= 8 * (__float_as_int(x.info.z) + __float_as_int(x.info.w));
        return half_bits_to_float(w.d) * x.info.x * static_cast<float>(s);
    }
};

}  // namespace

bool launch_gemv_q4_0(const GemvLaunch& l, int config, cudaStream_t stream) {
    if (l.act != ActKind::Q8) return false;
    const OpQ4_0::Args g{static_cast<const uint8_t*>(l.w.q), static_cast<const uint16_t*>(l.w.s), l.K / 32,
                         ActQ8Ptrs{l.xq, l.xinfo, l.K / 2}};
    return launch_configured<OpQ4_0>(g, l.y, l.N, l.K, config, stream, residual_act(l), &l);
}

}  // namespace quern::cuda
