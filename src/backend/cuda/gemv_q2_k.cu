// Decode GEMV for Q2_K weights (Q2_K files: most matrices). Grid mapping,
// load policy and reduction: gemv_kernel in gemv_common.cuh.
//
// OpQ2_K — integer path
//   Shapes:  W: N rows × K (K % 256 == 0), Q2_K device layout: per row
//            [K/64][16] two-bit quants, one 16-byte chunk per 64 elements
//            (word g, byte k, bits 2i..2i+1 = element 16g+4i+k of the chunk;
//            repacked at upload), [K/16] sub-block bytes scale | min << 4
//            (unchanged), [K/256] fp16x2 {d, dmin}. x: Q8 activation.
//   Unit:    64 elements (four 16-element sub-blocks, two Q8 blocks): one
//            16-byte quant load (512 contiguous bytes per warp), one 4-byte
//            scale load (the unit's four sub-block bytes; 128 bytes per warp)
//            and the 4-byte {d, dmin} (4 consecutive lanes read the same one);
//            activation: Q8 blocks 2u and 2u+1 (four 16-byte loads + records).
//   Math:    w = (d·sc)·q − dmin·m per 16-element sub-block, q in 0..3: one
//            shift + mask per word, 16 dp4a; per Q8 block b
//            y += dx_b·(d·Σ sc·Σq·qx − dmin·Σ m·Σqx), Σqx from the record's
//            half-block sums (all sums exact int32).
//   Bound:   memory: 84 bytes per 256 elements, ~3 integer ops per byte (the
//            2-bit unpacking: the highest of the quantized types).
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/gemv_lowbit.cuh"
#include "backend/cuda/kernels.h"

namespace quern::cuda {
namespace {
using namespace kern;

struct OpQ2_K {
    static constexpr int kUnitElems = 64;
    struct Args {
        const uint8_t* q;
        const uint32_t* sc;  // four sub-block bytes per unit
        const uint32_t* dm;  // {d, dmin} per super-block
        int64_t units_per_row, superblocks_per_row;
        ActQ8Ptrs a;
    };
    struct W {
        uint4 q;
        uint32_t sc;
        uint32_t dm;
    };
    struct A {
        ActQ8 b0, b1;  // Q8 blocks 2u, 2u+1
    };
    static __device__ __forceinline__ W load_w(const Args& g, int row, int u) {
        const int64_t v = static_cast<int64_t>(row) * g.units_per_row + u;
        W w;
        w.q = ldw16(g.q + 16 * v);
        w.sc = ldw4(g.sc + v);
        w.dm = ldw4(g.dm + static_cast<int64_t>(row) * g.superblocks_per_row + (u >> 2));
        return w;
    }
    static __device__ __forceinline__ A load_a(const Args& g, int u) {
        return A{load_act_q8(g.a, 2 * u), load_act_q8(g.a, 2 * u + 1)};
    }
    static __device__ __forceinline__ float dot(const W& w, const A& x) {
        const int s0 = q2_dot16(w.q.x, x.b0.lo), s1 = q2_dot16(w.q.y, x.b0.hi);
        const int s2 = q2_dot16(w.q.z, x.b1.lo), s3 = q2_dot16(w.q.w, x.b1.hi);
        // byte k of sc = scale | min << 4 of sub-block k of the unit
        const int isc0 = static_cast<int>(w.sc & 0xFu) * s0 + static_cast<int>((w.sc >> 8) & 0xFu) * s1;
        const int isc1 = static_cast<int>((w.sc >> 16) & 0xFu) * s2 + static_cast<int>((w.sc >> 24) & 0xFu) * s3;
        const int im0 = static_cast<int>((w.sc >> 4) & 0xFu) * __float_as_int(x.b0.info.z) +
                        static_cast<int>((w.sc >> 12) & 0xFu) * __float_as_int(x.b0.info.w);
        const int im1 = static_cast<int>((w.sc >> 20) & 0xFu) * __float_as_int(x.b1.info.z) +
                        static_cast<int>(w.sc >> 28) * __float_as_int(x.b1.info.w);
        const float d = half_bits_to_float(w.dm), dmin = half_bits_to_float(w.dm >> 16);
        const float r0 = fmaf(d * x.b0.info.x, static_cast<float>(isc0), -dmin * x.b0.info.x * static_cast<float>(im0));
        const float r1 = fmaf(d * x.b1.info.x, static_cast<float>(isc1), -dmin * x.b1.info.x * static_cast<float>(im1));
        return r0 + r1;
    }
};

}  // namespace

bool launch_gemv_q2_k(const GemvLaunch& l, int config, cudaStream_t stream) {
    if (l.act != ActKind::Q8) return false;
    const OpQ2_K::Args g{static_cast<const uint8_t*>(l.w.q), static_cast<const uint32_t*>(l.w.s),
                         static_cast<const uint32_t*>(l.w.s2), l.K / 64, l.K / 256, ActQ8Ptrs{l.xq, l.xinfo, l.K / 2}};
    return launch_configured<OpQ2_K>(g, l.y, l.N, l.K, config, stream, residual_act(l));
}

}  // namespace quern::cuda
