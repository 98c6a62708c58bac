// GEMM on the resident quantized weights for any number of activation rows
// ("qw"): Y = X · Wᵀ read straight from the device layout the decode GEMVs
// read (weights.h), so a batch needs no second copy of the model — neither
// the BF16 copies (gemm.h: 16 bits per weight) nor the bq layouts (bq_gemm.h:
// 5.5 or 11) — and each product reads the 4.5 (Q4_K) or 6.56 (Q6_K) bits
// per weight of the GGUF file once per 128 activation rows.
//
// Method, up to kQwSkinnyRows activation rows (the skinny kernel,
// qw_skinny.cu): each warp streams 16 weight rows from global memory into
// registers a super-block ahead, forms them in BF16 there and multiplies
// them with mma.sync.m16n8k16 (8 activation rows per mma); only the
// activations pass through shared memory. A lane decodes whole sub-blocks
// (so its mma k positions hold elements of its own sub-block: the same sum
// over K in another order).
//
// Method above (the tiled kernel, sm_90a only: wgmma): a block of two
// warpgroups multiplies 128 or 256 weight rows by 32, 64, 128 or 256
// activation rows over a range of K.
// Per chunk of 64 elements it copies the weight rows' quants and scales and
// the activation rows (BF16, wgmma's 128-byte swizzle) into a ring of
// shared-memory stages (cp.async, three chunks ahead); each lane turns one
// (row, sub-block) scale into BF16 pairs for its warp, each warp decodes its
// 16-row tiles into the A fragments of wgmma.m64nNk16 in registers (the
// integer-in-mantissa trick of bq_gemm.h: 128 + q as BF16 bits, then one
// HSUB2 and one HFMA2 per pair), and the warpgroup multiplies them by the
// staged activations (B from shared memory) while the next step is decoded.
// K may be split over a thread block cluster whose partial sums are added in
// a fixed order. qw_gemm_pieces puts up to three matrices in one launch.
//
// Speed (one H100, Llama-3-8B's matrices, bench/batched-cuda-h200.md): the
// skinny kernel at 1-16 rows as fast as bq_gemm on its 5.5-bit layout for
// Q4_K and 18-24 % faster for Q6_K (1.8-2.4 TB/s on the large matrices at
// one row). The tiled kernel is bound by the instructions each warp issues
// per chunk (~250 for Q4_K): at 64 rows 1.0-1.1 TB/s of the weights (gate|up
// faster than the BF16 copies with cuBLASLt, which read 3.6x the bytes); at
// 2048 rows 400-480 TFLOP/s against the copies' 750-810. So the batch
// runner takes qw_gemm only with Tuning::qw (tuning.h) or where the copies
// would not fit.
//
// Numerics: as the bq path — each weight is formed in BF16 from its integer
// q and its group's scale rounded to BF16 (the offset folded so that it
// costs at most one more rounding, so_pair in bq_common.cuh), products of
// BF16 summed in fp32: within a few BF16 roundings of each weight of the
// exact product (tests/cuda/qw_gemm_test.cu bounds the error against the
// CPU's dequantize_row_ref values).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/weights.h"
#include "core/dtype.h"

namespace quern::cuda {

/// Whether qw_gemm takes weights of type t with rows of K elements on this
/// device: Q4_K or Q6_K, K % 256 == 0, and a device that runs the sm_90a
/// code (compute capability 9.0, a build with QUERN_CUDA_SM90A).
bool qw_supported(DType t, int64_t K);

/// y[r·ldy + j] = Σ_k xb[r·w.K + k] · W[row0 + j][k] for r < n, j < rows
/// (overwrites those outputs; the rest of each y row is untouched), from
/// w's resident layout. xb: n rows of w.K BF16 values (row stride w.K),
/// 16-byte aligned. Asynchronous on `stream`; no allocation (graph-safe).
/// Preconditions (else quern::Error): qw_supported(w.type, w.K), xb and y
/// not null, n >= 1, row0 >= 0, rows >= 1, row0 + rows <= w.N, ldy >= rows.
void qw_gemm(const DeviceWeight& w, int64_t row0, int64_t rows, const uint16_t* xb, int64_t n, float* y,
             int64_t ldy, cudaStream_t stream);

/// The most matrices one qw_gemm_pieces launch multiplies.
inline constexpr int kQwMaxPieces = 3;

/// One matrix of a qw_gemm_pieces launch: weight rows row0 .. row0+rows−1
/// of *w into output columns ycol .. ycol+rows−1.
struct QwPiece {
    const DeviceWeight* w = nullptr;
    int64_t row0 = 0, rows = 0, ycol = 0;
};

/// qw_gemm of up to kQwMaxPieces matrices sharing the activations xb in one
/// launch (a layer's Q, K and V, or gate and up, kept apart in memory): for
/// each piece p, y[r·ldy + p.ycol + j] = Σ_k xb[r·K + k] · p.w[p.row0 + j][k]
/// for r < n, j < p.rows. One launch instead of one per matrix: the small
/// matrices (K and V of GQA models) alone fill few of the GPU's SMs.
/// Preconditions (else quern::Error): 1 <= count <= kQwMaxPieces, every
/// piece's w of one type and K that qw_supported takes, row ranges inside
/// their matrices, ycol >= 0 and ycol + rows <= ldy; xb, y, n as qw_gemm.
void qw_gemm_pieces(const QwPiece* pieces, int count, const uint16_t* xb, int64_t n, float* y, int64_t ldy,
                    cudaStream_t stream);

/// Most activation rows qw_gemm_glu takes: the form keeps two matrices'
/// weights in flight per lane (one block per SM); through the engine it was
/// measured at 8 and 16 rows only.
inline constexpr int64_t kQwGluMaxRows = 16;

/// Whether qw_gemm_glu takes gate and up for n activation rows: both of one
/// type and K that qw_supported takes, 1 <= n <= kQwGluMaxRows.
bool qw_glu_supported(const DeviceWeight& gate, const DeviceWeight& up, int64_t n);

/// A GLU feed-forward layer's gated values straight from its two products
/// on the resident layout (one launch of the skinny kernel, no float
/// intermediate): for r < n, j < rows
///   h[r·ldh + j] = BF16(act(Σ_k x_rk·G[gate_row0 + j][k]) · Σ_k x_rk·U[up_row0 + j][k])
/// with x_rk = xb[r·K + k] (BF16, row stride K = gate.K), act = SiLU, or
/// GELU in its tanh form when gelu: glu_rows_bf16 applied to the two qw_gemm
/// products up to the order of the fp32 sums. gate and up may be one weight
/// (a fused [gate | up] matrix: up_row0 = rows). h: n rows at stride ldh
/// BF16, must not overlap xb. Preconditions (else quern::Error):
/// qw_glu_supported(gate, up, n), row ranges inside both matrices, ldh >=
/// rows, xb 16-byte aligned. Asynchronous on `stream`; graph-safe.
void qw_gemm_glu(const DeviceWeight& gate, int64_t gate_row0, const DeviceWeight& up, int64_t up_row0, int64_t rows,
                 const uint16_t* xb, int64_t n, uint16_t* h, int64_t ldh, bool gelu, cudaStream_t stream);

/// Up to how many activation rows qw_gemm takes the skinny kernel
/// (qw_gemm_set_form: kAuto). On an H100 with Llama-3-8B's matrices it beat
/// the tiled kernel on every shape at 1-32 rows and lost on every Q4_K shape
/// at 64 (bench/batched-cuda-h200.md).
inline constexpr int64_t kQwSkinnyRows = 32;

/// Which kernel qw_gemm runs, for measurements and tests: kAuto the skinny
/// one up to kQwSkinnyRows rows and the tiled one above (or whenever
/// qw_gemm_set_shape forced a tile shape); kSkinny the skinny one for every
/// row count (token groups of 64 rows); kTiles the tiled one.
enum class QwForm { kAuto, kSkinny, kTiles };
void qw_gemm_set_form(QwForm form);

/// The tiled kernel's shape, for measurements (bench_gemm_cuda):
/// tokens 32, 64, 128 or 256 activation rows per block (0: by n and the
/// matrices' rows, default_tokens in qw_gemm.cu), groups 1
/// or 2 64-row weight groups per warpgroup (0: by the shape; 256 tokens
/// take one). Out-of-range values are clamped; set both to 0 to restore the
/// default.
void qw_gemm_set_shape(int tokens, int groups);

}  // namespace quern::cuda
