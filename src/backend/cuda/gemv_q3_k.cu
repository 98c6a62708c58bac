// Decode GEMV for Q3_K weights (Q3_K_* files: most matrices). Grid mapping,
// load policy and reduction: gemv_kernel in gemv_common.cuh.
//
// OpQ3_K — integer path
//   Shapes:  W: N rows × K (K % 256 == 0), Q3_K device layout: per row
//            [K/64][16] low two bits, one 16-byte chunk per 64 elements laid
//            out as Q2_K's (word g, byte k, bits 2i.. = element 16g+4i+k of
//            the chunk), [K/64][2] uint32 third bits (word h, byte k, bit
//            4g+i = element 32h+16g+4i+k of the chunk), [K/256] 12-byte scale
//            records (6-bit scales s_n + 32 of sub-blocks n = 0..15: word 0 /
//            word 1 nibble n % 8 = low 4 bits of s_n for n < 8 / n >= 8, word
//            2 byte n/4, bits 2(n%4).. = high 2 bits of s_n), [K/256] fp16 d.
//            All repacked at upload from GGUF's hmask / qs / 12-byte packing.
//   Unit:    64 elements (four 16-element sub-blocks, two Q8 blocks): one
//            16-byte and one 8-byte quant load (512 / 256 contiguous bytes per
//            warp), two 4-byte scale words and the 2-byte d (4 consecutive
//            lanes read the same record); activation: Q8 blocks 2u and 2u+1
//            (four 16-byte loads + records).
//   Math:    w = (d·sc)·(q − 4) per 16-element sub-block, q = low | third << 2
//            in 0..7 (two shifts and masks per word), 16 dp4a;
//            Σ(q − 4)·qx = Σ q·qx − 4·Σqx with Σqx from the record's half-block
//            sums; y += d·Σ_b dx_b·(sc·Σ + sc'·Σ') (sums exact int32).
//   Bound:   memory: 110 bytes per 256 elements, ~3.5 integer ops per byte
//            (the 3-bit unpacking).
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/gemv_lowbit.cuh"
#include "backend/cuda/kernels.h"

namespace quern::cuda {
namespace {
using namespace kern;

struct OpQ3_K {
    static constexpr int kUnitElems = 64;
    struct Args {
        const uint8_t* q;
        const uint2* qh;
        const uint32_t* sc;  // 3 words per super-block
        const uint16_t* d;
        int64_t units_per_row, superblocks_per_row;
        ActQ8Ptrs a;
    };
    struct W {
        uint4 q;
        uint2 qh;
        uint32_t sl;  // low 4 bits of the unit's 4 scales in bits 16(v&1)..
        uint32_t sh;  // high 2 bits, byte v
        uint32_t d;
        int v;  // unit in the super-block, 0..3
    };
    struct A {
        ActQ8 b0, b1;  // Q8 blocks 2u, 2u+1
    };
    static __device__ __forceinline__ W load_w(const Args& g, int row, int u) {
        const int64_t ui = static_cast<int64_t>(row) * g.units_per_row + u;
        const int64_t sb = static_cast<int64_t>(row) * g.superblocks_per_row + (u >> 2);
        W w;
        w.v = u & 3;
        w.q = ldw16(g.q + 16 * ui);
        w.qh = ldw8(g.qh + ui);
        w.sl = ldw4(g.sc + 3 * sb + (w.v >> 1));
        w.sh = ldw4(g.sc + 3 * sb + 2);
        w.d = ldw2(g.d + sb);
        return w;
    }
    static __device__ __forceinline__ A load_a(const Args& g, int u) {
        return A{load_act_q8(g.a, 2 * u), load_act_q8(g.a, 2 * u + 1)};
    }
    static __device__ __forceinline__ int scale(uint32_t lo4, uint32_t hi2, int k) {
        return static_cast<int>(((lo4 >> (4 * k)) & 0xFu) | (((hi2 >> (2 * k)) & 3u) << 4)) - 32;
    }
    static __device__ __forceinline__ float dot(const W& w, const A& x) {
        const int s0 = q3_dot16<0>(w.q.x, w.qh.x, x.b0.lo) - 4 * __float_as_int(x.b0.info.z);
        const int s1 = q3_dot16<4>(w.q.y, w.qh.x, x.b0.hi) - 4 * __float_as_int(x.b0.info.w);
        const int s2 = q3_dot16<0>(w.q.z, w.qh.y, x.b1.lo) - 4 * __float_as_int(x.b1.info.z);
        const int s3 = q3_dot16<4>(w.q.w, w.qh.y, x.b1.hi) - 4 * __float_as_int(x.b1.info.w);
        const uint32_t lo4 = w.sl >> (16 * (w.v & 1)), hi2 = w.sh >> (8 * w.v);
        const int i0 = scale(lo4, hi2, 0) * s0 + scale(lo4, hi2, 1) * s1;
        const int i1 = scale(lo4, hi2, 2) * s2 + scale(lo4, hi2, 3) * s3;
        return half_bits_to_float(w.d) *
               fmaf(x.b0.info.x, static_cast<float>(i0), x.b1.info.x * static_cast<float>(i1));
    }
};

}  // namespace

bool launch_gemv_q3_k(const GemvLaunch& l, int config, cudaStream_t stream) {
    if (l.act != ActKind::Q8) return false;
    const OpQ3_K::Args g{static_cast<const uint8_t*>(l.w.q),  static_cast<const uint2*>(l.w.q2),
                         static_cast<const uint32_t*>(l.w.s), static_cast<const uint16_t*>(l.w.s2),
                         l.K / 64,
                         l.K / 256,
                         ActQ8Ptrs{l.xq, l.xinfo, l.K / 2}};
    return launch_configured<OpQ3_K>(g, l.y, l.N, l.K, config, stream, residual_act(l));
}

}  // namespace quern::cuda
