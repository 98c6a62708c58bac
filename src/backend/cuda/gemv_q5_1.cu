// Decode GEMV for Q5_1 weights. Grid mapping, load policy and reduction:
// gemv_kernel in gemv_common.cuh.
//
// OpQ5_1 — integer path
//   Shapes:  W: N rows × K (K % 32 == 0), Q5_1 device layout: per row
//            [K/32][16] low-nibble bytes (the block's qs unchanged: low nibble
//            = element i, high = 16+i) and [K/32] 8-byte records {fp16 d,
//            fp16 m, uint32 fifth bits re-ordered as Q5_0's (byte k, bit i =
//            element 4i+k, bit 4+i = element 16+4i+k)}. x: Q8 activation.
//   Unit:    one block: one 16-byte and one 8-byte weight load (512 and 256
//            contiguous bytes per warp instruction); activation: two 16-byte
//            loads and the block record {d, s}.
//   Math:    w = d·q + m, q = nibble | bit << 4 in 0..31 (one shift and one
//            LOP3 per word, gemv_lowbit.cuh), so sum w·x = d·dx·Σ q·qx + m·s;
//            8 dp4a (exact int32).
//   Bound:   memory: 24 bytes per 32 elements, ~1.6 integer ops per byte.
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/gemv_lowbit.cuh"
#include "backend/cuda/kernels.h"

namespace quern::cuda {
namespace {
using namespace kern;

struct OpQ5_1 {
    static constexpr int kUnitElems = 32;
    struct Args {
        const uint8_t* q;
        const uint2* dmh;  // {d | m << 16, fifth bits}
        int64_t blocks_per_row;
        ActQ8Ptrs a;
    };
    struct W {
        uint4 q;
        uint2 dmh;
    };
    using A = ActQ8;
    static __device__ __forceinline__ W load_w(const Args& g, int row, int u) {
        const int64_t b = static_cast<int64_t>(row) * g.blocks_per_row + u;
        W w;
        w.q = ldw16(g.q + 16 * b);
        w.dmh = ldw8(g.dmh + b);
        return w;
    }
    static __device__ __forceinline__ A load_a(const Args& g, int u) { return load_act_q8(g.a, u); }
    static __device__ __forceinline__ float dot(const W& w, const A& x) {
        const int s = q5_dot(w.q, w.dmh.y, x);
        const float d = half_bits_to_float(w.dmh.x), m = half_bits_to_float(w.dmh.x >> 16);
        return fmaf(d * x.info.x, static_cast<float>(s), m * x.info.y);
    }
};

}  // namespace

bool launch_gemv_q5_1(const GemvLaunch& l, int config, cudaStream_t stream) {
    if (l.act != ActKind::Q8) return false;
    const OpQ5_1::Args g{static_cast<const uint8_t*>(l.w.q), static_cast<const uint2*>(l.w.s), l.K / 32,
                         ActQ8Ptrs{l.xq, l.xinfo, l.K / 2}};
    return launch_configured<OpQ5_1>(g, l.y, l.N, l.K, config, stream, residual_act(l), &l);
}

}  // namespace quern::cuda
