// Decode GEMV for Q3_K weights (Q3_K_* files: most matrices). Grid mapping,
// load policy and reduction: gemv_kernel in gemv_common.cuh.
//
// OpQ3_K — integer path
//   Shapes:  W: N rows × K (K % 256 == 0), Q3_K device layout: per row
//            [K/32][8] low two bits laid out as Q2_K's (word g, byte k, bits
//            2i.. = element 16g+4i+k of the block), [K/32] uint32 third bits
//            (byte k, bit 4g+i = element 16g+4i+k), [K/256] 12-byte scale
//            records (6-bit scales s_n + 32 of sub-blocks n = 0..15: word 0 /
//            word 1 nibble n % 8 = low 4 bits of s_n for n < 8 / n >= 8, word
//            2 bits 2n.. = high 2 bits of s_n), [K/256] fp16 d. All repacked
//            at upload from GGUF's hmask / qs / 12-byte packing.
//   Unit:    one 32-element block j of super-block u/8 (sub-blocks 2j, 2j+1;
//            one Q8 block): one 8-byte and one 4-byte quant load (256 / 128
//            contiguous bytes per warp), two 4-byte scale words (byte j%4 of
//            word j/4, nibble j of word 2) and the 2-byte d (8 consecutive
//            lanes read the same record); activation: two 16-byte loads + the
//            block record. (64-element units: see gemv_q2_k.cu.)
//   Math:    w = (d·sc)·(q − 4) per sub-block, q = low | third << 2 in 0..7
//            (two shifts and masks per word), 8 dp4a; Σ(q − 4)·qx = Σ q·qx −
//            4·Σ qx with Σ qx from the record's half-block sums;
//            y += d·dx·(sc0·Σ0 + sc1·Σ1) (sums exact int32).
//   Bound:   110 bytes per 256 elements, ~4 integer ops per byte (the 3-bit
//            unpacking); measured at 57-67% of the copy rate on the large 8B
//            shapes, i.e. not at the bandwidth bound (bench/gemv-cuda-h200.md).
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/gemv_lowbit.cuh"
#include "backend/cuda/kernels.h"

namespace quern::cuda {
namespace {
using namespace kern;

struct OpQ3_K {
    static constexpr int kUnitElems = 32;
    struct Args {
        const uint2* q;
        const uint32_t* qh;
        const uint32_t* sc;  // 3 words per super-block
        const uint16_t* d;
        int64_t units_per_row, superblocks_per_row;
        ActQ8Ptrs a;
    };
    struct W {
        uint2 q;
        uint32_t qh;
        uint32_t sl;  // low 4 bits of the unit's 2 scales in bits 8(j&3)..
        uint32_t sh;  // high 2 bits at bits 4j..
        uint32_t d;
        int j;  // unit in the super-block, 0..7
    };
    using A = ActQ8;
    static __device__ __forceinline__ W load_w(const Args& g, int row, int u) {
        const int64_t ui = static_cast<int64_t>(row) * g.units_per_row + u;
        const int64_t sb = static_cast<int64_t>(row) * g.superblocks_per_row + (u >> 3);
        W w;
        w.j = u & 7;
        w.q = ldw8(g.q + ui);
        w.qh = ldw4(g.qh + ui);
        w.sl = ldw4(g.sc + 3 * sb + (w.j >> 2));
        w.sh = ldw4(g.sc + 3 * sb + 2);
        w.d = ldw2(g.d + sb);
        return w;
    }
    static __device__ __forceinline__ A load_a(const Args& g, int u) { return load_act_q8(g.a, u); }
    static __device__ __forceinline__ float dot(const W& w, const A& x) {
        const int s0 = q3_dot16<0>(w.q.x, w.qh, x.lo) - 4 * __float_as_int(x.info.z);
        const int s1 = q3_dot16<4>(w.q.y, w.qh, x.hi) - 4 * __float_as_int(x.info.w);
        const uint32_t lo4 = w.sl >> (8 * (w.j & 3)), hi2 = w.sh >> (4 * w.j);
        const int sc0 = static_cast<int>((lo4 & 0xFu) | ((hi2 & 3u) << 4)) - 32;
        const int sc1 = static_cast<int>(((lo4 >> 4) & 0xFu) | (((hi2 >> 2) & 3u) << 4)) - 32;
        return half_bits_to_float(w.d) * x.info.x * static_cast<float>(sc0 * s0 + sc1 * s1);
    }
};

}  // namespace

bool launch_gemv_q3_k(const GemvLaunch& l, int config, cudaStream_t stream) {
    if (l.act != ActKind::Q8) return false;
    const OpQ3_K::Args g{static_cast<const uint2*>(l.w.q),    static_cast<const uint32_t*>(l.w.q2),
                         static_cast<const uint32_t*>(l.w.s), static_cast<const uint16_t*>(l.w.s2),
                         l.K / 32,
                         l.K / 256,
                         ActQ8Ptrs{l.xq, l.xinfo, l.K / 2}};
    return launch_configured<OpQ3_K>(g, l.y, l.N, l.K, config, stream, residual_act(l), &l);
}

}  // namespace quern::cuda
