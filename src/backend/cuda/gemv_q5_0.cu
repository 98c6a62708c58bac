// Decode GEMV for Q5_0 weights. Grid mapping, load policy and reduction:
// gemv_kernel in gemv_common.cuh.
//
// OpQ5_0 — integer path
//   Shapes:  W: N rows × K (K % 32 == 0), Q5_0 device layout: per row
//            [K/32][16] low-nibble bytes (the block's qs unchanged: low nibble
//            = element i, high = 16+i), [K/32] uint32 fifth bits re-ordered at
//            upload (byte k, bit i = element 4i+k, bit 4+i = element 16+4i+k)
//            and [K/32] fp16 d. x: Q8 activation (planes + block records).
//   Unit:    one block: one 16-byte, one 4-byte and one 2-byte weight load
//            (each coalesced across the warp's consecutive blocks);
//            activation: two 16-byte loads and the block record.
//   Math:    w = d·(q − 16), q = nibble | bit << 4 in 0..31 (one shift and one
//            LOP3 per word, gemv_lowbit.cuh), so sum w·x = d·dx·(Σ q·qx −
//            16·Σ qx), Σ qx from the record's half-block sums; 8 dp4a (exact
//            int32), one fp32 scale per block.
//   Bound:   memory: 22 bytes per 32 elements, ~1.7 integer ops per byte.
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/gemv_lowbit.cuh"
#include "backend/cuda/kernels.h"

namespace quern::cuda {
namespace {
using namespace kern;

struct OpQ5_0 {
    static constexpr int kUnitElems = 32;
    struct Args {
        const uint8_t* q;
        const uint32_t* qh;
        const uint16_t* d;
        int64_t blocks_per_row;
        ActQ8Ptrs a;
    };
    struct W {
        uint4 q;
        uint32_t qh;
        uint32_t d;
    };
    using A = ActQ8;
    static __device__ __forceinline__ W load_w(const Args& g, int row, int u) {
        const int64_t b = static_cast<int64_t>(row) * g.blocks_per_row + u;
        W w;
        w.q = ldw16(g.q + 16 * b);
        w.qh = ldw4(g.qh + b);
        w.d = ldw2(g.d + b);
        return w;
    }
    static __device__ __forceinline__ A load_a(const Args& g, int u) { return load_act_q8(g.a, u); }
    static __device__ __forceinline__ float dot(const W& w, const A& x) {
        int s = q5_dot(w.q, w.qh, x);
        s -= 16 * (__float_as_int(x.info.z) + __float_as_int(x.info.w));
        return half_bits_to_float(w.d) * x.info.x * static_cast<float>(s);
    }
};

}  // namespace

bool launch_gemv_q5_0(const GemvLaunch& l, int config, cudaStream_t stream) {
    if (l.act != ActKind::Q8) return false;
    const OpQ5_0::Args g{static_cast<const uint8_t*>(l.w.q), static_cast<const uint32_t*>(l.w.q2),
                         static_cast<const uint16_t*>(l.w.s), l.K / 32, ActQ8Ptrs{l.xq, l.xinfo, l.K / 2}};
    return launch_configured<OpQ5_0>(g, l.y, l.N, l.K, config, stream, residual_act(l), &l);
}

}  // namespace quern::cuda
