// Decode GEMV for unquantized weights: F32, F16, BF16 against float x. Grid
// mapping, load policy and reduction: gemv_kernel in gemv_common.cuh.
//
// OpF32 / OpF16 / OpBF16
//   Shapes:  W: N rows × K, row-major as stored (row stride 4K or 2K bytes);
//            K % 4 == 0 (F32) or K % 8 == 0 (F16/BF16) so rows are 16-byte
//            aligned. x: K floats. y: N floats.
//   Unit:    one 16-byte weight load (4 floats or 8 halves; 512 contiguous
//            bytes per warp); activation: one or two 16-byte loads from L1.
//   Math:    fp32 FMAs (F16 converted with cvt, BF16 by a shift: exact).
//   Bound:   memory: 4 or 2 bytes per element, 0.25–0.5 FMA per byte.
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/kernels.h"

namespace quern::cuda {
namespace {
using namespace kern;

struct FloatArgs {
    const uint8_t* w;
    int64_t row_bytes;
    const float* x;
};

struct OpF32 {
    static constexpr int kUnitElems = 4;
    using Args = FloatArgs;
    using W = uint4;
    using A = float4;
    static __device__ __forceinline__ W load_w(const Args& g, int row, int u) {
        return ldw16(g.w + static_cast<int64_t>(row) * g.row_bytes + 16 * static_cast<int64_t>(u));
    }
    static __device__ __forceinline__ A load_a(const Args& g, int u) { return lda16f(g.x + 4 * static_cast<int64_t>(u)); }
    static __device__ __forceinline__ float dot(const W& w, const A& x) {
        float s = __uint_as_float(w.x) * x.x;
        s = fmaf(__uint_as_float(w.y), x.y, s);
        s = fmaf(__uint_as_float(w.z), x.z, s);
        return fmaf(__uint_as_float(w.w), x.w, s);
    }
};

struct A8 {
    float4 a, b;
};

template <bool kBf16>
struct OpHalf {
    static constexpr int kUnitElems = 8;
    using Args = FloatArgs;
    using W = uint4;
    using A = A8;
    static __device__ __forceinline__ W load_w(const Args& g, int row, int u) {
        return ldw16(g.w + static_cast<int64_t>(row) * g.row_bytes + 16 * static_cast<int64_t>(u));
    }
    static __device__ __forceinline__ A load_a(const Args& g, int u) {
        const float* p = g.x + 8 * static_cast<int64_t>(u);
        return A8{lda16f(p), lda16f(p + 4)};
    }
    static __device__ __forceinline__ float2 two(uint32_t v) {
        if constexpr (kBf16) {
            return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xFFFF0000u));
        } else {
            return __half22float2(__halves2half2(__ushort_as_half(static_cast<unsigned short>(v & 0xFFFFu)),
                                                 __ushort_as_half(static_cast<unsigned short>(v >> 16))));
        }
    }
    static __device__ __forceinline__ float dot(const W& w, const A& x) {
        const float2 p0 = two(w.x), p1 = two(w.y), p2 = two(w.z), p3 = two(w.w);
        float s = p0.x * x.a.x;
        s = fmaf(p0.y, x.a.y, s);
        s = fmaf(p1.x, x.a.z, s);
        s = fmaf(p1.y, x.a.w, s);
        s = fmaf(p2.x, x.b.x, s);
        s = fmaf(p2.y, x.b.y, s);
        s = fmaf(p3.x, x.b.z, s);
        return fmaf(p3.y, x.b.w, s);
    }
};

}  // namespace

bool launch_gemv_float(const GemvLaunch& l, int config, cudaStream_t stream) {
    if (l.act != ActKind::F32) return false;
    const auto* w = static_cast<const uint8_t*>(l.w.q);
    const ActQ8Ptrs none{nullptr, nullptr, 0};  // float Ops have one activation level
    switch (l.type) {
        case DType::F32:
            return launch_configured<OpF32>(FloatArgs{w, 4 * l.K, l.x}, l.y, l.N, l.K, config, stream, none, &l);
        case DType::F16:
            return launch_configured<OpHalf<false>>(FloatArgs{w, 2 * l.K, l.x}, l.y, l.N, l.K, config, stream, none,
                                                    &l);
        case DType::BF16:
            return launch_configured<OpHalf<true>>(FloatArgs{w, 2 * l.K, l.x}, l.y, l.N, l.K, config, stream, none,
                                                   &l);
        default: return false;
    }
}

}  // namespace quern::cuda
