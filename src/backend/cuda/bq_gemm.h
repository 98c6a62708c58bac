// Small-batch GEMM on quantized weights ("bq"): Y = X · Wᵀ for 1 to 64
// activation rows — the decode steps of many sequences at once, where a
// product is bound by reading the weights. The BF16 path (gemm.h) reads 2
// bytes per weight from a resident BF16 copy; this one reads the weights
// once more in 4 or 8 bits plus a scale and offset per group, converted at
// load into a layout shaped for the tensor cores' operand fragments.
//
// The bq layouts (made on the device by make_resident_bq from the layout of
// weights.h; N rows padded to whole tiles of 16 rows, K a multiple of 64):
//   Every element is value = s·q + o with an integer q and the s, o of its
//   group (32 elements for the 4-bit types, 16 for the others). Stored per
//   group: s' = BF16(s)/m, a centre z (c = 128 + m·z as BF16 bits) and
//   o' = s·z + o (BF16), so that value ≈ BF16(s)·(q − z) + o' with |o'| at
//   most s/2 (m = 8 for B4, 1 for B8; see so_pair in bq_gemm.cu).
//   Records per (tile of 16 rows, chunk of 64 elements): 32 lane records,
//   lane L = 4g + c holding rows g and g+8 of the tile at the chunk's
//   elements 16c .. 16c+15 — exactly the A fragments of four
//   mma.m16n8k16 steps, step j taking elements 16c+4j .. 16c+4j+3 of lane
//   c's range (the K order inside a chunk is permuted; the activations'
//   B fragments follow the same permutation, which is their natural order).
//   B4 (Q4_0, Q4_1, Q4_K): q in 4 bits; 16-byte lane records, word j = step
//     j: nibble pair p (bits 4p and 16+4p) = fragment register p (a0: row g
//     elements 4j, 4j+1; a1: row g+8; a2: row g elements 4j+2, 4j+3; a3).
//     Then 128 bytes of {s', o'} per [g][unit 0..1][row g, g+8] and 64 bytes
//     of {c(row g), c(row g+8)} per [g][unit].
//   B8 (Q5_0, Q5_1, Q5_K, Q6_K): q in 8 bits (< 128); 32-byte lane
//     records, words 2j, 2j+1 = step j: bytes {a0.lo, a1.lo, a0.hi, a1.hi},
//     {a2.lo, a3.lo, a2.hi, a3.hi}. Then 256 bytes of {s', o'} per
//     [g][16-element group c][row g, g+8] and 128 bytes of centres per [g][c].
//   The lane records of all (tile, chunk) pairs come first (tile·K/64 +
//   chunk), then their scale records in the same order.
// Size: B4 5.5 bits per weight (Q4_K is 4.5), B8 11 (Q6_K is 6.56).
//
// Numerics: each weight is formed in BF16 as (x − c)·s' + o' (x − c exact,
// one rounding in the HFMA2), activations are BF16, products summed in fp32
// by the tensor cores: within a few BF16 roundings of each weight, like the
// BF16 copy path (tests/cuda/prefill_cuda_test.cu bounds the error).
//
// Kernels: mma.sync.m16n8k16 with the records and activation rows staged in
// shared memory (cp.async), for every row count; and for 17-64 rows on
// sm_90a wgmma.m64n{32,64}k16 with the decoded fragments as the A operand from
// registers and only the activations in shared memory (bq_gemm_set_form).
// K is split over a thread block cluster of up to 8 blocks, as many as make
// the fewest waves of resident clusters × chunks per block.
//
// Speed (H200, bench/batched-cuda-h200.md, Llama-3-8B's shapes): 0.9-2.1 TB/s
// of its bytes at 1-16 rows on the 4k-28k-row matrices, 3.8-4.2 TB/s on the
// output head; at 32 rows 13.3 us (4096 x 4096 Q4_K), 27.4 (14336 x 4096), 28.6
// (4096 x 14336) against 16.8, 33.2, 34.1 for the BF16 copies with cuBLASLt,
// which win again at 48-64 rows. The batch runner uses it up to 32 rows (16
// without sm_90a, 64 on the output head: PrefillGemm::uses_bq); the expert
// banks' grouped form is the fastest MoE prefill of the types it takes
// (bench/models-cuda-h200.md).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/weights.h"
#include "core/dtype.h"

namespace quern::cuda {

/// Most activation rows bq_gemm takes.
inline constexpr int64_t kBqMaxRows = 64;

/// Whether weights of type t with rows of K elements have a bq layout:
/// Q4_0, Q4_1, Q4_K (B4) and Q5_0, Q5_1, Q5_K, Q6_K (B8), K % 64 == 0.
bool bq_supported(DType t, int64_t K);

/// Device bytes make_resident_bq allocates for w (0 when not supported).
size_t bq_bytes(const DeviceWeight& w);

/// Converts w into its bq layout, kept with it (w.bq, w.bq_bits); nothing
/// when it already has one. Synchronizes `stream`. quern::Error when the
/// type is not supported or the memory cannot be had.
void make_resident_bq(DeviceWeight& w, cudaStream_t stream);

/// y[r·ldy + j] = Σ_k xb[r·w.K + k] · W[row0 + j][k] for r < n, j < rows,
/// from w's bq layout (overwrites those outputs; the rest of each y row is
/// untouched). xb: n rows of w.K BF16 values, row stride w.K, 16-byte
/// aligned. Long K may be split across the blocks of a thread block cluster,
/// whose partial sums are added in a fixed order (deterministic). Needs a GPU
/// with clusters (sm_90). Preconditions (else
/// quern::Error): w.bq set, 1 <= n <= kBqMaxRows, row0 % 16 == 0, 1 <= rows,
/// row0 + rows <= w.N, ldy >= rows.
void bq_gemm(const DeviceWeight& w, int64_t row0, int64_t rows, const uint16_t* xb, int64_t n, float* y, int64_t ldy,
             cudaStream_t stream);

/// Most activation rows bq_gemm_glu takes.
inline constexpr int64_t kBqGluMaxRows = 32;

/// Whether bq_gemm_glu takes gate and up for n activation rows: both have bq
/// layouts of one width (bq_bits) and the same K, 1 <= n <= kBqGluMaxRows,
/// and the kernel it would take fits the device's shared memory per block
/// (the 8-bit layouts' mma.sync form at 17-32 rows needs 108 KB).
bool bq_glu_supported(const DeviceWeight& gate, const DeviceWeight& up, int64_t n);

/// A GLU feed-forward layer's gated values straight from its two products
/// (one launch, no float intermediate): for r < n, j < rows
///   h[r·ldh + j] = BF16(act(Σ_k x_rk·G[gate_row0 + j][k]) · Σ_k x_rk·U[up_row0 + j][k])
/// with x_rk = xb[r·K + k] (BF16, row stride K = gate.K), act = SiLU, or
/// GELU in its tanh form when gelu — glu_rows_bf16 applied to the two
/// bq_gemm products up to the order of the fp32 sums (the kernel form and
/// K splits are chosen for the pair; the gate and up sums of an element
/// meet in one thread). gate and up may be one weight (a fused
/// [gate | up] matrix: up_row0 = rows). h: n rows at stride ldh BF16, must
/// not overlap xb. Kernels: the bq_gemm ones with each warp (warpgroup)
/// multiplying a gate tile and the matching up tile. Preconditions (else
/// quern::Error): bq_glu_supported(gate, up, n), row0s % 16 == 0, row0 +
/// rows <= N for both, ldh >= rows, xb 16-byte aligned.
void bq_gemm_glu(const DeviceWeight& gate, int64_t gate_row0, const DeviceWeight& up, int64_t up_row0, int64_t rows,
                 const uint16_t* xb, int64_t n, uint16_t* h, int64_t ldh, bool gelu, cudaStream_t stream);

/// The last form of bq_gemm for 17 to 64 activation rows (forms 0 ..
/// kBqLastForm: bq_gemm_set_form).
inline constexpr int kBqLastForm = 4;

/// Which kernel bq_gemm runs for 17 to 64 activation rows:
///   0  mma.sync kernels (weights and activations staged through shared
///      memory; the only form off sm_90a);
///   1  per shape, the fastest measured on an H200 (the default on compute
///      capability 9.0 devices): the output head (>= 64k rows) on mma.sync,
///      the rest mostly on the wgmma kernel (the decoded weights as the A
///      operand straight from registers);
///   2, 3, 4  the wgmma kernel only: two or four chunks of weights in flight
///      per warp, or two 64-row groups per warpgroup (17-32 rows).
/// Tuning::bq_wgmma (tuning.h) sets it at the first product;
/// the setter (for tests and benchmarks) clamps to 0 .. kBqLastForm;
/// devices without sm_90a code (or a build without it) always get 0.
void bq_gemm_set_form(int form);
/// The form in use (decided at the first call when never set).
int bq_gemm_form();

/// The products of a mixture-of-experts bank in one launch (tokens grouped
/// by expert, as the prefill's MoE path groups them): for every expert e <
/// n_expert and t < off[e+1] − off[e],
///   y[(off[e] + t)·ldy + j] = Σ_k xb[(off[e] + t)·w.K + k] · W[e·rows + j][k]
/// for j < rows (the rest of each y row untouched). off: n_expert + 1 int32
/// offsets on the device (off[0] = 0, non-decreasing); max_rows: at least
/// the largest group (host side; sizes the grid; groups of any size work,
/// each in tiles of up to 64 rows that read the expert's weights again).
/// w: the bank (n_expert · rows rows or more) with a bq layout; rows % 16 ==
/// 0; xb 16-byte aligned. Numerics as bq_gemm. Throws quern::Error for a
/// missing layout or a shape out of range.
void bq_gemm_grouped(const DeviceWeight& w, int64_t rows, const int32_t* off, int64_t n_expert, int64_t max_rows,
                     const uint16_t* xb, float* y, int64_t ldy, cudaStream_t stream);

}  // namespace quern::cuda
