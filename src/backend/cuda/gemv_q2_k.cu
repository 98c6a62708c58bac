// Decode GEMV for Q2_K weights (Q2_K files: most matrices). Grid mapping,
// load policy and reduction: gemv_kernel in gemv_common.cuh.
//
// OpQ2_K — integer path
//   Shapes:  W: N rows × K (K % 256 == 0), Q2_K device layout: per row
//            [K/32][8] two-bit quants, 8 bytes per 32-element block (word g,
//            byte k, bits 2i..2i+1 = element 16g+4i+k of the block; repacked
//            at upload), [K/16] sub-block bytes scale | min << 4 (unchanged),
//            [K/256] fp16x2 {d, dmin}. x: Q8 activation.
//   Unit:    one 32-element block (two 16-element sub-blocks, one Q8 block):
//            one 8-byte quant load (256 contiguous bytes per warp), one 2-byte
//            scale load and the 4-byte {d, dmin} (8 consecutive lanes read the
//            same one); activation: two 16-byte loads + the block record.
//            (64-element units, one 16-byte quant load each, same layout, were
//            slower on most 8B shapes: a K = 4096 row then has only 64 units,
//            one per thread of the T64 configurations; bench/gemv-cuda-h200.md.)
//   Math:    w = (d·sc)·q − dmin·m per sub-block, q in 0..3: one shift + mask
//            per word, 8 dp4a; y += dx·(d·(sc0·Σ0 + sc1·Σ1) − dmin·(m0·A0 +
//            m1·A1)), Σ = Σ q·qx per sub-block, A = Σ qx from the record's
//            half-block sums (all sums exact int32).
//   Bound:   84 bytes per 256 elements, ~3 integer ops per byte (the 2-bit
//            unpacking); measured at 49-73% of the copy rate on the large 8B
//            shapes, i.e. not at the bandwidth bound (bench/gemv-cuda-h200.md).
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/gemv_lowbit.cuh"
#include "backend/cuda/kernels.h"

namespace quern::cuda {
namespace {
using namespace kern;

struct OpQ2_K {
    static constexpr int kUnitElems = 32;
    struct Args {
        const uint2* q;
        const uint16_t* sc;  // two sub-block bytes per unit
        const uint32_t* dm;  // {d, dmin} per super-block
        int64_t units_per_row, superblocks_per_row;
        ActQ8Ptrs a;
    };
    struct W {
        uint2 q;
        uint32_t sc;
        uint32_t dm;
    };
    using A = ActQ8;
    static __device__ __forceinline__ W load_w(const Args& g, int row, int u) {
        const int64_t v = static_cast<int64_t>(row) * g.units_per_row + u;
        W w;
        w.q = ldw8(g.q + v);
        w.sc = ldw2(g.sc + v);
        w.dm = ldw4(g.dm + static_cast<int64_t>(row) * g.superblocks_per_row + (u >> 3));
        return w;
    }
    static __device__ __forceinline__ A load_a(const Args& g, int u) { return load_act_q8(g.a, u); }
    static __device__ __forceinline__ float dot(const W& w, const A& x) {
        const int s0 = q2_dot16(w.q.x, x.lo), s1 = q2_dot16(w.q.y, x.hi);
        const int isc = static_cast<int>(w.sc & 0xFu) * s0 + static_cast<int>((w.sc >> 8) & 0xFu) * s1;
        const int im = static_cast<int>((w.sc >> 4) & 0xFu) * __float_as_int(x.info.z) +
                       static_cast<int>((w.sc >> 12) & 0xFu) * __float_as_int(x.info.w);
        const float d = half_bits_to_float(w.dm), dmin = half_bits_to_float(w.dm >> 16);
        return fmaf(d * x.info.x, static_cast<float>(isc), -dmin * x.info.x * static_cast<float>(im));
    }
};

}  // namespace

bool launch_gemv_q2_k(const GemvLaunch& l, int config, cudaStream_t stream) {
    if (l.act != ActKind::Q8) return false;
    const OpQ2_K::Args g{static_cast<const uint2*>(l.w.q), static_cast<const uint16_t*>(l.w.s),
                         static_cast<const uint32_t*>(l.w.s2), l.K / 32, l.K / 256, ActQ8Ptrs{l.xq, l.xinfo, l.K / 2}};
    return launch_configured<OpQ2_K>(g, l.y, l.N, l.K, config, stream, residual_act(l), &l);
}

}  // namespace quern::cuda
