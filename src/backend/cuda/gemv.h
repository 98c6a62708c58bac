// Decode matrix-vector products on the GPU: y = W · x for one token.
//
// Quantized weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K, NVFP4) use
// integer dot products: x is quantized once per step with
// quantize_activation() (8-bit blocks of 32, Q8_1's numbers) and the result
// is shared by every matrix that reads the same x (Q, K, V; gate, up). Float
// weights (F32, F16, BF16) and the weight-only FP8 blocks (F8_E4M3_B32,
// decoded to floats in registers) read x as floats;
// gemv_takes_quantized_activation() says which a type takes.
// All calls are asynchronous on the context's stream.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/weights.h"

namespace quern::cuda {

class CudaContext;

/// Level 2's scale of a two-level QuantizedActivation is level 1's divided by this.
inline constexpr float kLevel2Ratio = 254.0f;

/// Per-block record of a QuantizedActivation (16 bytes, one per 32 elements):
/// d = amax/127 and s = float(Σq)·d as quantize_row_ref(Q8_1) computes them
/// before rounding to fp16, and the integer sums of q over elements 0..15 and
/// 16..31 of the block (Q6_K's −32 offset is applied through them). In
/// level 2 of a two-level activation d is level 1's d / kLevel2Ratio.
struct ActBlockInfo {
    float d;
    float s;
    int32_t sum_lo;
    int32_t sum_hi;
};
static_assert(sizeof(ActBlockInfo) == 16);

/// An activation vector of K elements quantized to 8-bit blocks of 32: the
/// int8 values of quantize_row_ref(Q8_1), stored as two planes [2][K/32][16]
/// (plane p, block b, byte i = element 32b+16p+i), followed by K/32
/// ActBlockInfo records.
///
/// With two levels, level 1 holds x's quantization x8 (scale d per block)
/// and level 2 the quantization of the residual x - x8 (in the same format,
/// right after level 1) with the fixed scale d/kLevel2Ratio: |x - x8| ≤ d/2,
/// so its codes fill [−127, 127]. GEMVs then compute W·x8 + W·r8 from one
/// pass over the weights, an activation error of ~1/(2·127·254) instead of
/// ~1/254 of each block's maximum (the CPU backend's default scheme, which
/// gives level 2 a scale of its own; docs/design-notes.md); and since both
/// scales are in a fixed ratio a
/// kernel may add the two integer dot products as 254·s1 + s2 before one
/// float scaling.
class QuantizedActivation {
public:
    QuantizedActivation() = default;
    /// Allocates device memory for K elements (K a positive multiple of 32)
    /// and `levels` (1 or 2) levels, else quern::Error.
    explicit QuantizedActivation(int64_t K, int levels = 1);
    int64_t K() const { return K_; }
    int levels() const { return levels_; }
    /// Bytes of one level: K int8 + K/32 records.
    size_t level_bytes() const { return static_cast<size_t>(K_) + static_cast<size_t>(K_ / 32) * sizeof(ActBlockInfo); }
    const int8_t* q(int level = 0) const { return buf_.as<int8_t>() + level * level_bytes(); }
    int8_t* q(int level = 0) { return buf_.as<int8_t>() + level * level_bytes(); }
    const ActBlockInfo* info(int level = 0) const {
        return reinterpret_cast<const ActBlockInfo*>(buf_.as<uint8_t>() + level * level_bytes() + K_);
    }
    ActBlockInfo* info(int level = 0) {
        return reinterpret_cast<ActBlockInfo*>(buf_.as<uint8_t>() + level * level_bytes() + K_);
    }
    /// Level 2's planes and records, or nullptr for one level.
    int8_t* q2() { return levels_ == 2 ? q(1) : nullptr; }
    ActBlockInfo* info2() { return levels_ == 2 ? info(1) : nullptr; }
    const DeviceBuffer& buffer() const { return buf_; }
    DeviceBuffer& buffer() { return buf_; }

private:
    DeviceBuffer buf_;
    int64_t K_ = 0;
    int levels_ = 1;
};

/// The RMSNorm of a residual stream folded into the GEMVs around it
/// (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization"):
/// RMSNorm(x)·w = scale · (x ⊙ w) with the scalar scale = 1/sqrt(Σx²/dim + eps),
/// and a Q8_1 quantization of scale·v has the codes of v and scale times its
/// d and s. So the GEMV that ends a residual branch (gemv_residual_norm)
/// adds its output to x, quantizes x ⊙ w without the scale and leaves the
/// sum of squares in dim/32 partial sums; the next GEMVs (gemv with a
/// DeferredNormScale) sum the partials in a fixed order and multiply their
/// outputs by the scale. No separate normalization launch.
struct DeferredNormScale {
    const float* parts = nullptr;  ///< n_parts partial sums of x² (device)
    int n_parts = 0;               ///< dim / 32
    int64_t dim = 0;               ///< elements of x
    float eps = 0.0f;              ///< RMSNorm epsilon
};

/// Whether GEMVs with weights of type t read the activation quantized (a
/// QuantizedActivation: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K, NVFP4)
/// rather than as K floats (F32, F16, BF16, F8_E4M3_B32). False for types
/// without a CUDA kernel (see cuda_weight_type_supported).
bool gemv_takes_quantized_activation(DType t);

/// Launch choice for benchmarks and tests: -1 picks the tuned default for the
/// shape; 0 .. gemv_config_count()-1 forces one entry of the kernels'
/// configuration table (rows per block, threads, unroll; see kernels.h).
struct GemvOptions {
    int config = -1;
};
int gemv_config_count();
/// Human-readable description of configuration `config`, e.g. "R2 T128 U2".
const char* gemv_config_name(int config);
/// The configuration the default (-1) picks for this weight type and shape.
/// `levels`: of the quantized activation (1 or 2).
int gemv_default_config(DType type, int64_t N, int64_t K, bool float_activation, int levels = 1);

/// Quantizes x (device pointer, K floats) into xq (xq.K() == K, else
/// quern::Error), both levels when xq has two. Asynchronous on ctx's stream.
void quantize_activation(CudaContext& ctx, const float* x, QuantizedActivation& xq);

/// y[N] = W[N][K] · x[K] for a W that takes a quantized activation
/// (gemv_takes_quantized_activation), with x quantized by
/// quantize_activation (one or two levels: the sum of W times each level).
/// y: device pointer to N floats, every element written. Throws quern::Error
/// for a W that takes float x, xq.K() != W.K, or an unknown options.config.
/// Asynchronous on ctx's stream.
void gemv(CudaContext& ctx, const DeviceWeight& W, const QuantizedActivation& xq, float* y,
          const GemvOptions& opt = {});

/// As gemv above, with xq quantized without its RMSNorm scale (by
/// gemv_residual_norm): y = scale · W·xq, scale from `norm` (its parts
/// written before this launch on the stream). Throws quern::Error as gemv,
/// or when norm.parts is null or norm.n_parts * 32 != norm.dim.
void gemv(CudaContext& ctx, const DeviceWeight& W, const QuantizedActivation& xq, float* y,
          const DeferredNormScale& norm, const GemvOptions& opt = {});

/// y1 = W1·xq and y2 = W2·xq (times the deferred RMSNorm scale when `norm`
/// is given, as the gemv overload above) for two matrices of different
/// weight types that read the same activation — Q4_K_M's Q|K (Q4_K) and V
/// (Q6_K), or a DeltaNet's [q|k|v] and z. One launch where a fused kernel
/// exists for the pair (Q4_K then Q6_K, or both Q4_K: both matrices' rows
/// computed as gemv's R4 T64 U2 configuration computes them — Q4_K's tuned
/// one for Q|K, Q6_K's two-level one for V), else two gemv launches with
/// their default configurations.
/// (Tuning::gemv_config forcing either matrix's configuration takes the two launches.)
/// Throws quern::Error as gemv for either matrix.
void gemv_pair(CudaContext& ctx, const DeviceWeight& W1, float* y1, const DeviceWeight& W2, float* y2,
               const QuantizedActivation& xq, const DeferredNormScale* norm = nullptr);

/// The GEMV that ends a residual branch, with the next RMSNorm folded in:
///   x[i] += (W·a)[i]                       for i < N (x: N floats, in place)
///   xq_next = Q8_1(x ⊙ norm_w)             (without the RMSNorm scale; as
///                                           many levels as xq_next has)
///   ss_parts[b] = Σ_{i in 32b..32b+31} x[i]²  for b < N/32
/// a: W's quantized input; norm_w: N floats (the next RMSNorm's weight);
/// ss_parts: N/32 floats; xq_next.K() == N. The consumers read xq_next with
/// DeferredNormScale{ss_parts, N/32, N, eps}. One thread block per 32 rows.
/// Throws quern::Error for a W that takes float x, N % 32 != 0, or
/// mismatched sizes.
/// Asynchronous on ctx's stream.
void gemv_residual_norm(CudaContext& ctx, const DeviceWeight& W, const QuantizedActivation& a, float* x,
                        const float* norm_w, QuantizedActivation& xq_next, float* ss_parts);

/// The selected matrices of a bank, for mixture-of-experts decode (the
/// "indexed" GEMV). W holds n = W.N / rows matrices of `rows` rows × W.K,
/// matrix e at rows e·rows .. (e+1)·rows − 1 — exactly a GGUF 3-D expert
/// tensor (llama.cpp's ffn_{gate,up,down}_exps, ne = [K, rows, n]) uploaded
/// as one DeviceWeight. For the slots s = 0 .. slots−1:
///   y[s·rows + r] = W[ids[s]·rows + r] · x_s            (r < rows)
/// ids: `slots` int32 in device memory, read by the kernel (so a captured
/// graph routes every replay anew; out-of-range ids are clamped to
/// [0, n)); y: slots × rows floats, every one written.
/// x_s: with per_slot false, every slot reads x (xq.K() == W.K, or K floats);
/// with per_slot true, slot s reads its own K elements: floats x + s·K, or
/// elements s·K .. s·K + K − 1 of ONE quantized row of slots·K elements
/// (xq.K() == slots·W.K; the layout swiglu_q8_1 writes for count = slots·K:
/// block s·K/32 + b of planes [2][slots·K/32][16] and of the records).
/// Configuration as gemv (GemvOptions; default for N = rows). No deferred
/// RMSNorm scale. Throws quern::Error for rows <= 0 or not dividing W.N,
/// slots outside [1, 65535], a null ids or y, the wrong activation kind for
/// W's type, or mismatched sizes. Asynchronous on ctx's stream.
void gemv_indexed(CudaContext& ctx, const DeviceWeight& W, int64_t rows, const QuantizedActivation& xq, bool per_slot,
                  const int32_t* ids, int slots, float* y, const GemvOptions& opt = {});
/// gemv_indexed for banks that take float activations (F32, F16, BF16, F8_E4M3_B32) (x: K
/// floats, or slots × K with per_slot).
void gemv_indexed(CudaContext& ctx, const DeviceWeight& W, int64_t rows, const float* x, bool per_slot,
                  const int32_t* ids, int slots, float* y, const GemvOptions& opt = {});

/// y[N] = W[N][K] · x[K] for F32, F16, BF16 or F8_E4M3_B32 weights, x as K
/// floats (device pointer). Throws quern::Error for a W that takes a
/// quantized activation (use the QuantizedActivation overload) or an unknown
/// options.config. Asynchronous on ctx's stream.
void gemv(CudaContext& ctx, const DeviceWeight& W, const float* x, float* y, const GemvOptions& opt = {});

}  // namespace quern::cuda
