// Internal interface between the matmul driver (matmul.cpp) and the per-ISA
// kernel files. Nothing here is used outside src/backend/cpu and the tests.
//
// How a quantized matrix product is computed
// ------------------------------------------
// Activations x are quantized per row to the weight type's 8-bit partner
// (Q8_0 for Q4_0/Q5_0/Q8_0/MXFP4, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants): int8
// values a_k and one float scale per block, da.
//
// Scalar level: one function per weight type computes the dot product of a
// packed weight row with a packed Q8 activation row (integer sums per block,
// then float scaling), like ggml's vec_dot.
//
// SIMD levels (AVX2, AVX-512): every quantized weight row is first *unpacked*
// by a per-type function into a common form
//     w_k = D_s * u_k + Mn_s        (k in sub-block s of G = 16 or 32 elements)
// with u_k an unsigned 8-bit integer (natural element order), D_s and Mn_s
// floats per sub-block. For example Q4_0: u = nibble, D = d, Mn = -8d;
// Q4_K: u = nibble, D = d*sc, Mn = -dmin*m; Q8_0: u = q + 128, D = d,
// Mn = -128d; MXFP4: u = 2 * e2m1(q) + 12 (the doubled E2M1 values are the
// integers 0, ±1, ±2, ±3, ±4, ±6, ±8, ±12), D = 2^(e - 128) (half the block
// scale, mxfp4_half_scale), Mn = -12 D: every weight exactly the reference's.
// The dot product with an activation row is then
//     sum_s  D_s * da_s * (sum_{k in s} u_k a_k)  +  Mn_s * dsa_s
// where da_s is the activation scale of sub-block s and dsa_s = da_s * sum a_k
// over the sub-block. The integer sums are vpdpbusd (u8 x s8) on AVX-512 VNNI
// and vpmaddubsw + vpmaddwd on AVX2. Generic kernels consume this form:
//   * GEMM (prefill): a register tile of NR weight rows x NCP activation rows;
//     activations are packed into column panels [K/4][NCP][4 bytes] so that a
//     broadcast 4-byte group of one weight row meets 16 activation rows per
//     vpdpbusd; the unpacked weight panel is reused against every column panel.
//   * decode kernel (QDecodeFn below; qdecode_avx512.cpp, qdecode_avx2.cpp):
//     the same arithmetic with the roles swapped: 16 (AVX-512) or 8 (AVX2)
//     unpacked weight rows interleaved [K/4][rows][4 bytes] meet one
//     broadcast 4-byte group of an activation row per vpdpbusd (vpmaddubsw +
//     vpmaddwd), so one activation row already fills the vector. Per output
//     element the integer sums are exact and the float steps (convert, * da,
//     fma with D, fma of dsa with Mn, sub-block by sub-block) are the tile's,
//     in the same order: the two kernels of a level give bit-identical
//     results, which is what lets the serving engine mix batch sizes freely
//     (matmul.h, MatmulPath). The AVX-512 kernel also reads the 32-element
//     block types straight from their blocks, with the unpackers' values.
// Only the unpackers (and the activation quantizers) are type-specific there.
// Single-sequence decode uses fused per-type GEMV kernels instead (GemvFn
// below, gemv_avx512.cpp, gemv_avx2.cpp) that read the packed blocks directly:
// for one or two activation rows, a bandwidth-bound kernel cannot afford the
// unpacking pass through an L1 buffer. They round differently from the GEMM.
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "core/dtype.h"

namespace quern::cpu {

// ---------------------------------------------------------------- activation quantizers
// Q8_0 / Q8_1 / Q8_K rows, byte-identical to quantize_row_ref. k must be a
// multiple of the block size (32 or 256); not checked here.
using QuantizeRowFn = void (*)(const float* x, void* y, int64_t k);
struct ActQuantizers {
    QuantizeRowFn q8_0, q8_1, q8_K;
};

// ---------------------------------------------------------------- scalar dot products
// dot of one packed weight row of K elements with one activation row:
// Q8 blocks for quantized types (the partner type), floats for F32/F16/BF16.
using ScalarDotFn = float (*)(int64_t K, const void* w, const void* act);

// ---------------------------------------------------------------- unpacked form (SIMD levels)
/// Unpacks nr rows (row stride ldw bytes) of K elements into u (nr rows, row
/// stride ldu bytes, K bytes each) and D, Mn (nr rows, row stride lds floats,
/// K/G entries each). K is a multiple of the type's block size.
using UnpackFn = void (*)(const uint8_t* w, size_t ldw, int nr, int64_t K, uint8_t* u, size_t ldu, float* D,
                          float* Mn, size_t lds);

/// Sub-block size and signedness of an unpacked form. signed_u: u holds
/// signed int8 weights (Mn = 0); used by AVX2 for Q8_0, where u + 128 would
/// overflow vpmaddubsw's 16-bit pair sums.
struct UForm {
    int G;
    bool signed_u;
    int umax;  // largest u the unpacker can emit (bounds int16 partial sums)
};
/// Largest unsigned value in the unpacked form of a weight type.
int umax_for(DType weight);

/// Activation column panel for the GEMM tile: NCP activation rows packed as
/// a[K/4][NCP][4] int8, da[K/G][NCP], dsa[K/G][NCP]. Unused columns are zero.
struct ActPanel {
    const int8_t* a;
    const float* da;
    const float* dsa;
};

/// GEMM tile: y[c * ldy + r] = dot(unpacked row r, panel column c) for
/// r < nr <= NR (the kernel's row count), c < nc <= NCP; nothing else written.
using QTileFn = void (*)(int64_t K, UForm f, int nr, int nc, const uint8_t* u, size_t ldu, const float* D,
                         const float* Mn, size_t lds, const ActPanel& act, float* y, size_t ldy);

/// Packs nrows <= ncp rows of Q8 blocks into an ActPanel of ncp columns
/// (missing columns zero).
using PackPanelFn = void (*)(DType act, int G, int64_t K, int ncp, const void* const* rows, int nrows, int8_t* a,
                             float* da, float* dsa);
void pack_panel_generic(DType act, int G, int64_t K, int ncp, const void* const* rows, int nrows, int8_t* a, float* da,
                        float* dsa);

/// Fused GEMV (decode): kernels that read the packed weight blocks directly
/// (no unpacked copy), against one activation row prepared once per call in a
/// layout specific to the weight type's family (see act_prep.cpp):
struct GemvAct {
    const int8_t* a;    // int8 activations, padded, family-specific order
    const float* lf;    // per-lane activation scales (32-element-block types)
    const void* lx;     // per-lane int32 bias corrections or float da*sum(a)
    const float* kd;    // K-quants: Q8_K scale per super-block
    const int16_t* kb;  // K-quants: 16 int16 sums per super-block
};
/// Bytes of scratch gemv_prep needs for a row of K elements (64-byte multiple).
using GemvScratchFn = size_t (*)(DType w, int64_t K);
/// Builds a GemvAct for weight type w from one row of Q8 blocks (the
/// partner type) into buf (gemv_scratch bytes, 64-byte aligned).
using GemvPrepFn = void (*)(DType w, int64_t K, const void* q8row, uint8_t* buf, GemvAct* out);
size_t gemv_scratch_generic(DType w, int64_t K);
void gemv_prep_generic(DType w, int64_t K, const void* q8row, uint8_t* buf, GemvAct* out);
/// How far ahead of its loads a GEMV kernel asks for its weight stream, in
/// bytes (software prefetch, one request per cache line). With the hardware
/// prefetchers alone a core's decode overlapped little of its arithmetic with
/// memory latency: llama3-8b Q4_K_M on one core of the Xeon VM read 5.9 GB/s
/// against a plain read loop's 13; 2048 bytes ahead, 12 GB/s (1024: less;
/// 4096: no better; bench/cpu-decode.md).
constexpr int64_t kGemvPrefetchBytes = 2048;
/// Requests the cache lines of [p, p + bytes) (a compile-time span: unrolled).
template <int Bytes>
inline void prefetch_span(const void* p) {
    const char* c = static_cast<const char*>(p);
#pragma GCC unroll 8
    for (int o = 0; o < Bytes; o += 64) __builtin_prefetch(c + o, 0, 3);
}
/// y[c * ldy + r] = dot(weight row r, acts[c]) for r < nr, c < nc; weight rows
/// stride ldw bytes.
using GemvFn = void (*)(int64_t K, const uint8_t* w, size_t ldw, int nr, const GemvAct* acts, int nc, float* y,
                        size_t ldy);

/// Decode kernel (batch-invariant decode with the GEMM's arithmetic):
///   y[c * ldy + r] = dot(weight row r, activation column c)
/// for weight rows r < nr <= decode_nr (packed rows of K elements of a
/// quantized type, stride ldw bytes) and columns c < nc. Column c is column
/// c % decode_ncp of panels[c / decode_ncp], an ActPanel of decode_ncp columns
/// (pack_panel with ncp = decode_ncp). next_rows (<= decode_nr): rows that
/// follow the panel in memory and may be read ahead (the next panel; they must
/// exist). work: decode_work(K, f.G)
/// bytes, 64-byte aligned. Bit-identical to the GEMM tile (QTileFn) of the
/// same level for every (r, c), whatever nr and nc.
using QDecodeFn = void (*)(int64_t K, DType type, UForm f, const uint8_t* w, size_t ldw, int nr, int next_rows,
                           const ActPanel* panels, int nc, float* y, size_t ldy, uint8_t* work);
/// Bytes of work buffer a QDecodeFn needs for rows of K elements in sub-blocks of G.
using DecodeWorkFn = size_t (*)(int64_t K, int G);

/// Everything one SIMD level provides for quantized types.
struct QKernels {
    int nr;   // weight rows per GEMM tile
    int ncp;  // activation rows (columns of the panel) per GEMM tile
    bool q8_0_signed;  // the Q8_0 unpacker emits signed u (see UForm)
    QTileFn tile;
    PackPanelFn pack_panel;
    // decode kernel; decode == nullptr where the level has none
    int decode_nr;   // weight rows per call
    int decode_ncp;  // columns per activation panel
    QDecodeFn decode;
    DecodeWorkFn decode_work;
    // fused GEMV (decode)
    GemvScratchFn gemv_scratch;
    GemvPrepFn gemv_prep;
    GemvFn (*gemv_for)(DType t);
    // unpack functions indexed by weight type; nullptr where not available
    UnpackFn unpack(DType t) const;
    UnpackFn q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K, mxfp4;
};

/// D of MXFP4's unpacked form: 2^(e - 128), half the block scale 2^(e - 127)
/// because u holds doubled E2M1 values; built from the bits, so exact for
/// every e (e = 0, 1: the subnormals 2^-128, 2^-127; e = 0xFF: NaN, as the
/// reference's scale). The SIMD kernels build the same bits.
inline float mxfp4_half_scale(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : e == 0xFF ? 0x7FC00000u : static_cast<uint32_t>(e - 1) << 23;
    return std::bit_cast<float>(bits);
}
/// u of MXFP4's unpacked form for each E2M1 code: 2 * e2m1(code) + 12.
inline constexpr uint8_t kMxfp4U[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
#if defined(__AVX512F__)
/// mxfp4_half_scale of 16 exponents (one per 32-bit lane, 0..255): the same bits.
inline __m512 mxfp4_half_scale_ps(__m512i e) {
    __m512i bits = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    bits = _mm512_mask_sllv_epi32(bits, _mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(2)),
                                  _mm512_set1_epi32(0x00200000), e);
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(0xFF)),
                                 _mm512_set1_epi32(0x7FC00000));
    return _mm512_castsi512_ps(bits);
}
#endif

// ---------------------------------------------------------------- float weights
/// y[c*ldy + r] = dot(W row r, x row c) for r < nr, c < nc. W rows have stride
/// ldw bytes (type F32/F16/BF16, or a weight-only type below), x rows stride
/// ldx floats.
///
/// Weight-only FP8 / NVFP4 (F8_E4M3_B32, NVFP4; quant/blocks.h) run through
/// the same kernels: the per-type loader turns the codes of one vector's worth
/// of elements (16 on AVX-512, 8 on AVX2; always inside one block, K being a
/// multiple of the block size) into f32 weights in registers — E4M3 codes
/// through F16 (sign-extend, shift, mask: the E4M3 bits become an F16 value
/// 2^-8 times theirs, converted exactly by vcvtph2ps) times d * 256; E2M1
/// codes through a 16-entry table (vpermps) times the group's
/// f32(e4m3(sc) * d) — so every weight is exactly the scalar reference's
/// value (quant/reference_fp.cpp) and the product with f32 activations
/// rounds as for F32 weights. The kernels stay memory-bound in decode; the
/// dequantization costs a few instructions per vector.
/// A later W8A8 / W4A4 path (activations quantized to FP8 / E2M1 with their
/// own block scales) would keep these block layouts and the loaders' decode of
/// codes, and pair them with an activation type instead of f32 (QuantTraits::
/// vec_dot_type): per block an integer or low-precision dot product, then the
/// product of the two block scales, as the 8-bit families above do.
using FGemmFn = void (*)(int64_t K, const void* w, size_t ldw, int nr, const float* x, size_t ldx, int nc, float* y,
                         size_t ldy);
struct FKernels {
    int nr, nc;  // preferred tile (rows x columns)
    FGemmFn f32, f16, bf16;
    // the same without the decode special case (nc <= 3): every output
    // element computed alike whatever nr and nc (batch-invariant)
    FGemmFn f32_tiled, f16_tiled, bf16_tiled;
    // weight-only F8_E4M3_B32 and NVFP4, with and without the decode case
    FGemmFn f8, nvfp4, f8_tiled, nvfp4_tiled;
};
/// True for the types the float kernels run although their blocks hold more
/// than one element (F8_E4M3_B32, NVFP4). MXFP4 is not one of them: its
/// doubled E2M1 values are small integers, so it takes Q8_0 activations and
/// the integer kernels, as Q4_0 does.
inline bool is_weight_only_type(DType t) { return t == DType::F8_E4M3_B32 || t == DType::NVFP4; }

// ---------------------------------------------------------------- per-level tables
#define QUERN_CPU_DECLARE_UNPACKERS(X)                                                                           \
    void X##q4_0(const uint8_t*, size_t, int, int64_t, uint8_t*, size_t, float*, float*, size_t);                 \
    void X##q4_1(const uint8_t*, size_t, int, int64_t, uint8_t*, size_t, float*, float*, size_t);                 \
    void X##q5_0(const uint8_t*, size_t, int, int64_t, uint8_t*, size_t, float*, float*, size_t);                 \
    void X##q5_1(const uint8_t*, size_t, int, int64_t, uint8_t*, size_t, float*, float*, size_t);                 \
    void X##q8_0(const uint8_t*, size_t, int, int64_t, uint8_t*, size_t, float*, float*, size_t);                 \
    void X##q2_K(const uint8_t*, size_t, int, int64_t, uint8_t*, size_t, float*, float*, size_t);                 \
    void X##q3_K(const uint8_t*, size_t, int, int64_t, uint8_t*, size_t, float*, float*, size_t);                 \
    void X##q4_K(const uint8_t*, size_t, int, int64_t, uint8_t*, size_t, float*, float*, size_t);                 \
    void X##q5_K(const uint8_t*, size_t, int, int64_t, uint8_t*, size_t, float*, float*, size_t);                 \
    void X##q6_K(const uint8_t*, size_t, int, int64_t, uint8_t*, size_t, float*, float*, size_t);                 \
    void X##mxfp4(const uint8_t*, size_t, int, int64_t, uint8_t*, size_t, float*, float*, size_t);
namespace scalar {
extern const ActQuantizers quantizers;
ScalarDotFn dot_fn(DType t);  // nullptr if unsupported
extern const FKernels fkernels;
}  // namespace scalar
namespace avx2 {
QUERN_CPU_DECLARE_UNPACKERS(unpack_)
GemvFn gemv_for(DType t);
void decode(int64_t K, DType type, UForm f, const uint8_t* w, size_t ldw, int nr, int next_rows,
            const ActPanel* panels, int nc, float* y, size_t ldy, uint8_t* work);
size_t decode_work_bytes(int64_t K, int G);
extern const ActQuantizers quantizers;
extern const QKernels qkernels;
extern const FKernels fkernels;
}  // namespace avx2
namespace avx512 {
QUERN_CPU_DECLARE_UNPACKERS(unpack_)
GemvFn gemv_for(DType t);
void decode(int64_t K, DType type, UForm f, const uint8_t* w, size_t ldw, int nr, int next_rows,
            const ActPanel* panels, int nc, float* y, size_t ldy, uint8_t* work);
size_t decode_work_bytes(int64_t K, int G);
extern const ActQuantizers quantizers;
extern const QKernels qkernels;
extern const FKernels fkernels;
void pack_panel(DType act, int G, int64_t K, int ncp, const void* const* rows, int nrows, int8_t* a, float* da,
                float* dsa);
}  // namespace avx512

/// Activation partner of a quantized weight type (Q8_0, Q8_1 or Q8_K).
DType act_type_for(DType weight);
/// Sub-block size G of the unpacked form of a weight type (16 or 32).
int subblock_for(DType weight);

}  // namespace quern::cpu
