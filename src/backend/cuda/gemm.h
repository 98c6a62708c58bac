// Prefill GEMM of the CUDA backend: Y = X · Wᵀ for n activation rows at once
// (prompt processing), on the tensor cores.
//
// Path ("dequantize to BF16 + cuBLASLt"): the weight matrix, in its device
// layout (weights.h), is dequantized tile by tile into a BF16 scratch buffer
// (dequantize_weight_bf16), the float activation rows are rounded to BF16
// (f32_to_bf16), and cuBLASLt multiplies them with FP32 accumulation and FP32
// output. A quantized (MMQ) path may replace this later behind the same
// PrefillGemm::run.
//
// Shapes innermost first, as everywhere in quern:
//   W: N rows × K elements (DeviceWeight), X: n rows × K floats, Y: n rows ×
//   N floats, row r of X at x + r·ldx, row r of Y at y + r·ldy.
// Numerics: every weight and activation element is rounded once to BF16
// (8 significant bits, round to nearest even: relative error ≤ 2^-8 each),
// products are exact in FP32 and summed in FP32, so |Y − Y_ref| ≤
// (2^-7 + K·2^-24) · Σ_k |x_k·w_k| per element (a worst-case bound; random
// rounding errors stay far below it) against the double product of the
// unrounded values (tests/cuda/prefill_cuda_test.cu checks it).
// All pointers are device pointers; calls are asynchronous on `stream`.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <functional>
#include <tuple>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/weights.h"
#include "core/dtype.h"

namespace quern::cuda {

/// Whether dequantize_weight_bf16 (and so PrefillGemm) handles weights of
/// type t: every type the CUDA backend uploads (F32, F16, BF16, Q8_0, Q4_0,
/// Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, F8_E4M3_B32, NVFP4). A
/// model with a matrix of any other type evaluates prompts token by token.
bool gemm_weight_type_supported(DType t);

/// Dequantizes rows row0 .. row0+rows−1 of `w` (device layout, weights.h)
/// into `out`: rows × w.K BF16 values (uint16 bit patterns), row r at
/// out + r·w.K, each the float value dequantize_row_ref gives for that
/// element (computed in fp32 as the CPU reference does) rounded to nearest
/// even BF16. Throws quern::Error for an unsupported type, a null pointer or
/// a row range outside [0, w.N).
void dequantize_weight_bf16(const DeviceWeight& w, int64_t row0, int64_t rows, uint16_t* out, cudaStream_t stream);

/// out[r·K + k] = bf16(x[r·ldx + k]) for n rows of K floats (round to
/// nearest even; NaN stays NaN). K >= 1, ldx >= K.
void f32_to_bf16(const float* x, int64_t ldx, int64_t n, int64_t K, uint16_t* out, cudaStream_t stream);

/// Converts w (any type gemm_weight_type_supported takes) to FP8 with one
/// scale per row (output channel): scale_r = absmax(row r) / 448 (1 for an
/// all-zero row), code = E4M3(w / scale_r) rounded to nearest even with
/// subnormals kept — quantize_fp8_rows (quant/fp8.h) applied to the values
/// dequantize_row_ref gives, code for code. The result is an F8_E4M3_B32
/// DeviceWeight (its block scales all equal to the row's, and row_scale the
/// N scales once each) with fp8_row_scaled set: the decode GEMVs read it as
/// any FP8 weight, and the prefill GEMM multiplies its codes in FP8 on the
/// tensor cores: fp8_gemm (fp8_gemm.h) where sm_90a runs, else cuBLASLt
/// applying both scales (outer-vector scale modes) where it offers them, else
/// a second pass. Synchronizes
/// `stream`. Throws quern::Error for other types or K % 32 != 0.
DeviceWeight to_fp8_rows(const DeviceWeight& w, cudaStream_t stream);

/// Per-row (per-token) FP8 of n activation rows of K BF16 values (row
/// stride K): sx[r] = absmax / 448 (1 if zero), q[r·K + k] = E4M3(x / sx[r]).
void quantize_fp8_act_rows(const uint16_t* x, int64_t n, int64_t K, uint8_t* q, float* sx, cudaStream_t stream);

/// Dequantizes all of w into a BF16 copy that stays with it (w.bf16, N × K
/// values, 2·N·K bytes of device memory): PrefillGemm then multiplies it
/// directly (one GEMM per matrix, nothing dequantized per call) — for the
/// batch runner, whose every step would otherwise dequantize the model.
/// Throws quern::Error (w unchanged) when the memory cannot be had.
void make_resident_bf16(DeviceWeight& w, cudaStream_t stream);

/// Up to how many activation rows PrefillGemm::uses_qw takes qw_gemm; larger
/// passes (up to 2048 rows: prompt chunks) dequantize tiles for cuBLASLt.
/// On an H100 with Llama-3-8B's matrices qw was faster up to 512 rows on
/// most of them and the tiles from 1024 on all of them; through the engine
/// (QUERN_CUDA_QW=1, 32-256 sequences of 128-token prompts) this limit
/// generated 5-9 % faster than qw for every pass (bench/batched-cuda-h200.md).
inline constexpr int64_t kQwRows = 512;

/// The prefill GEMM with its scratch: a cuBLASLt handle and workspace, the
/// BF16 weight tile and the BF16 activation rows. One per session (not
/// thread-safe); reused for every matrix.
class PrefillGemm {
public:
    /// Scratch for up to max_n activation rows of up to max_k elements, and
    /// two weight tiles of up to max_tile_elems BF16 elements each (a
    /// matrix larger than that is processed in tiles of whole rows, a
    /// multiple of 256; a single row must fit: max_tile_elems >= max_k),
    /// dequantized on an internal stream while the previous tile's GEMM
    /// runs. Throws quern::Error when the memory, the stream or the cuBLASLt
    /// handle cannot be had. Descriptors and the algorithm choice are cached
    /// per (shape, alignment): at most a few per matrix and chunk length.
    /// The algorithm is cuBLASLt's first heuristic choice; with
    /// Tuning::gemm_tune (tuning.h), the fastest of its first
    /// eight, timed on the first product of each shape.
    PrefillGemm(int64_t max_n, int64_t max_k, int64_t max_tile_elems = int64_t{16} << 20);
    ~PrefillGemm();
    PrefillGemm(const PrefillGemm&) = delete;
    PrefillGemm& operator=(const PrefillGemm&) = delete;

    /// y[r·ldy + j] = Σ_k x[r·ldx + k] · W[j][k] for r < n, j < w.N
    /// (overwrites y; the rest of each y row is untouched), with the BF16
    /// rounding described at the top. Preconditions (else quern::Error):
    /// gemm_weight_type_supported(w.type), 1 <= n <= max_n, w.K <= max_k,
    /// ldx >= w.K, ldy >= w.N.
    void run(const DeviceWeight& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
             cudaStream_t stream);

    /// As run() with X already in BF16: xb holds n rows of w.K values back
    /// to back (row stride w.K). The BF16 activation scratch is not used (the
    /// FP8 path quantizes xb into its own). A weight with a bq layout
    /// (make_resident_bq) goes through bq_gemm instead when uses_bq(w, n)
    /// (bq_gemm.h: its rounding of the weights differs slightly).
    void run_bf16(const DeviceWeight& w, const uint16_t* xb, int64_t n, float* y, int64_t ldy, cudaStream_t stream);

    /// run_bf16 of count (<= 16) matrices sharing xb, matrix i into columns
    /// cols[i] .. of y (row stride ldy): those qw_gemm takes (uses_qw) in
    /// qw_gemm_pieces launches of one type and K each (a layer's Q, K and V
    /// kept apart: one launch instead of three), the rest by run_bf16.
    void run_bf16_pieces(const DeviceWeight* const* ws, const int64_t* cols, int count, const uint16_t* xb,
                         int64_t n, float* y, int64_t ldy, cudaStream_t stream);

    /// Whether run_bf16 multiplies n rows by w with bq_gemm: w has a bq
    /// layout, n <= kBqMaxRows, and — when w also has a resident BF16 copy —
    /// n is at most where bq_gemm is faster than the copy with cuBLASLt on an
    /// H200 (32 rows with its wgmma form, 16 without; all kBqMaxRows for
    /// matrices of 64k rows or more, the output head;
    /// bench/batched-cuda-h200.md). Tuning::bq_rows sets the row limit.
    static bool uses_bq(const DeviceWeight& w, int64_t n);

    /// Whether w is multiplied from its resident layout by qw_gemm
    /// (qw_gemm.h) rather than through a BF16 copy or bq layout: the batch
    /// runner makes neither for it. Q4_K / Q6_K rows of a multiple of 256 on
    /// a device running the sm_90a code, when Tuning::qw is set or the batch
    /// runner marked w (DeviceWeight::qw: the copies would not fit).
    static bool qw_weight(const DeviceWeight& w);

    /// Whether run_bf16 multiplies n rows by w with qw_gemm: qw_weight(w),
    /// no BF16 copy or bq layout made for it after all, and n at most
    /// kQwRows (Tuning::qw_rows).
    static bool uses_qw(const DeviceWeight& w, int64_t n);

    /// run_bf16 on rows row0 .. row0+rows−1 of w only (one expert of a bank
    /// of n_expert × rows): y[r·ldy + j] = Σ_k xb[r·w.K + k] · W[row0 + j][k]
    /// for j < rows. Preconditions as run_bf16, 0 <= row0, row0 + rows <= w.N,
    /// ldy >= rows.
    void run_bf16_rows(const DeviceWeight& w, int64_t row0, int64_t rows, const uint16_t* xb, int64_t n, float* y,
                       int64_t ldy, cudaStream_t stream);

    /// Rounds n rows of K floats (row stride ldx) to BF16 into the
    /// activation scratch and returns it (n × K, row stride K), for several
    /// run_bf16 calls on one input (Q|K|V or gate|up pieces of different
    /// types). Valid until the next run() or to_bf16(). Preconditions as run().
    const uint16_t* to_bf16(const float* x, int64_t ldx, int64_t n, int64_t K, cudaStream_t stream);

    /// The activation scratch (max_n × max_k BF16) for a kernel that writes
    /// a GEMM input in BF16 itself (rms_norm_bf16, glu_rows_bf16) before
    /// run_bf16 on it; the same buffer to_bf16 returns and run() uses.
    uint16_t* act_bf16() { return xact_.as<uint16_t>(); }

    /// Called on the host after each phase is enqueued on the caller's
    /// stream ("to_bf16", "gemm": a tile's GEMM, including any wait for its
    /// dequantization on the internal stream), for profiling.
    void set_phase_hook(std::function<void(const char*)> hook) { hook_ = std::move(hook); }

    /// How many FP8 products (weights with fp8_row_scaled) went through the
    /// BF16 dequantization because cuBLASLt turned their shape down (each
    /// shape counted once; 0: every FP8 product ran in FP8).
    int64_t fp8_fallbacks() const { return fp8_fallbacks_; }
    /// Whether to print the first FP8 fallback on stderr (default true).
    void set_verbose(bool v) { verbose_ = v; }

    int64_t max_n() const { return max_n_; }
    int64_t max_k() const { return max_k_; }

private:
    struct Plan;  // cuBLASLt descriptors and the chosen algorithm of one shape
    Plan& plan(int64_t m, int64_t n, int64_t k, int64_t ldc, uint32_t align_a, uint32_t align_b, uint32_t align_c,
               bool fp8);
    /// The FP8 product for a weight with fp8_row_scaled: fp8_gemm where it
    /// runs (Tuning::fp8_cublas aside), else cuBLASLt; false (nothing
    /// written, the shape remembered) when cuBLASLt has no FP8 kernel for it.
    bool run_fp8_rows(const DeviceWeight& w, int64_t row0, int64_t n_rows, const uint16_t* xb, int64_t n, float* y,
                      int64_t ldy, cudaStream_t stream);
    static uint32_t alignment(const void* p, int64_t ld_bytes);
    /// cublasLtMatmul of plan p (A = weights, B = activations, D = y), first
    /// timing the plan's candidates once when Tuning::gemm_tune left some.
    int launch(Plan& p, const void* a, const void* b, float* y, cudaStream_t stream);
    void matmul(const uint16_t* wb, int64_t m, const uint16_t* xb, int64_t n, int64_t k, float* y, int64_t ldy,
                cudaStream_t stream);

    void release_streams();

    int64_t max_n_, max_k_, max_tile_;
    bool tune_ = false;  // Tuning::gemm_tune: time the heuristic's candidates per shape
    void* handle_ = nullptr;  // cublasLtHandle_t
    DeviceBuffer workspace_, wtile_[2], xact_;
    DeviceBuffer qx_, sx_;  // the activations in E4M3 and their per-row scales (FP8 path)
    DeviceBuffer f8_work_;  // fp8_gemm's K-split sums (kF8WorkElems floats)
    std::set<std::tuple<int64_t, int64_t, int64_t, int64_t, uint32_t, uint32_t, uint32_t>> fp8_refused_;
    int64_t fp8_fallbacks_ = 0;
    bool verbose_ = true;
    // Weight tiles are dequantized on their own stream into two buffers in
    // turn (run_bf16); events order each buffer's dequantization after the
    // GEMM that last read it, and each GEMM after its tile's dequantization.
    cudaStream_t dq_stream_ = nullptr;
    cudaEvent_t dq_done_[2] = {nullptr, nullptr}, mm_done_[2] = {nullptr, nullptr};
    int next_tile_ = 0;
    std::function<void(const char*)> hook_;
    std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, uint32_t, uint32_t, uint32_t>, Plan*> plans_;
};

}  // namespace quern::cuda
