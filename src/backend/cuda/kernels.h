// Internal interface between the host-side API (weights.cpp, gemv.cpp) and
// the .cu files: plain launchers, no validation (callers validate). Nothing
// outside src/backend/cuda includes this (the benchmark sweeps configurations
// through gemv.h's GemvOptions).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/gemv.h"
#include "core/dtype.h"

namespace quern::cuda {

/// One GEMV launch shape: `rows` output rows per thread block, `threads` per
/// block (a multiple of 32), `unroll` units (gemv_common.cuh) per thread per
/// row loaded before any is used. Every kernel is instantiated
/// for each entry; gemv.cpp picks one per (type, N, K).
struct GemvConfig {
    int rows, threads, unroll, persistent;
};
// X(index, rows, threads, unroll, persistent): the one list both this table
// and the kernel instantiations (gemv_common.cuh) are generated from.
// persistent: one wave of resident blocks loops over the row groups,
// requesting the next group's weights before reducing the current one.
#define QUERN_GEMV_CONFIGS(X) \
    X(0, 1, 128, 4, 0)        \
    X(1, 2, 128, 2, 0)        \
    X(2, 4, 128, 1, 0)        \
    X(3, 2, 64, 2, 0)         \
    X(4, 4, 64, 2, 0)         \
    X(5, 1, 256, 2, 0)        \
    X(6, 1, 64, 2, 0)         \
    X(7, 4, 32, 4, 0)         \
    X(8, 2, 32, 4, 0)         \
    X(9, 1, 32, 4, 0)         \
    X(10, 4, 64, 2, 1)        \
    X(11, 2, 64, 2, 1)        \
    X(12, 4, 32, 4, 1)        \
    X(13, 2, 32, 4, 1)        \
    X(14, 4, 128, 1, 1)
#define QUERN_GEMV_CONFIG_ENTRY(idx, R, NT, UNR, P) GemvConfig{R, NT, UNR, P},
inline constexpr GemvConfig kGemvConfigs[] = {QUERN_GEMV_CONFIGS(QUERN_GEMV_CONFIG_ENTRY)};
#undef QUERN_GEMV_CONFIG_ENTRY
inline constexpr int kNumGemvConfigs = static_cast<int>(sizeof(kGemvConfigs) / sizeof(kGemvConfigs[0]));

/// Device pointers of one weight matrix (see weights.h for the layouts).
struct WeightPtrs {
    const void* q;
    const void* q2;
    const void* s;
    const void* s2;
};

/// How a kernel reads the activation vector.
enum class ActKind {
    Q8,   ///< quantized (int8 planes + ActBlockInfo per 32) — Q4_0 .. Q6_K, NVFP4
    F32,  ///< float vector — F32 / F16 / BF16 and the weight-only F8_E4M3_B32
};

/// DeferredNormScale for the kernels (gemv.h): y *= 1/sqrt(Σ parts·inv_dim + eps).
struct ActScale {
    const float* parts = nullptr;  ///< null: no scale
    int n = 0;
    float inv_dim = 0.0f;
    float eps = 0.0f;
    bool early = false;  ///< trigger the successor before the PDL wait (the decode step's GEMVs)
};

/// gemv_residual_norm's epilogue (gemv.h): x += y, next activation, partial sums.
struct NormEpilogue {
    float* x;              ///< N floats, updated in place
    const float* w;        ///< N floats: the next RMSNorm's weight
    int8_t* xq;            ///< next activation, level 1 (K = N)
    ActBlockInfo* xinfo;
    int8_t* xq2;           ///< level 2, or nullptr
    ActBlockInfo* xinfo2;
    float* ss_parts;       ///< N/32 floats
    bool early = false;    ///< trigger the successor before the PDL wait (the decode step's GEMVs)
};

/// The indexed ("expert") mode of a GEMV (gemv.h's gemv_indexed): W is a
/// bank of n_ids matrices of `rows` rows each (matrix e = rows e·rows ..
/// (e+1)·rows − 1), and slot s = 0 .. slots−1 computes
///   y[s·rows + r] = W[ids[s]·rows + r] · x_s      for r < rows
/// with ids read from device memory (clamped to [0, n_ids)) after the
/// kernel's PDL wait. act_stride = 0: every slot reads the launch's
/// activation; else slot s reads the elements s·act_stride .. of a longer
/// activation row: floats at x + s·act_stride, or, quantized, blocks
/// s·act_stride/32 .. of one QuantizedActivation row whose planes are
/// act_half_k bytes apart (the row's K/2).
struct GemvIndex {
    const int32_t* ids = nullptr;
    int n_ids = 0;
    int slots = 0;
    int64_t act_stride = 0;
    int64_t act_half_k = 0;
};

/// Arguments of one GEMV: y[N] = W[N][K] · x[K].
struct GemvLaunch {
    DType type;
    ActKind act;
    WeightPtrs w;
    int64_t N, K;
    const int8_t* xq;   ///< ActKind::Q8: K int8 in two planes [2][K/32][16]
    const ActBlockInfo* xinfo;  ///< ActKind::Q8: K/32 block records
    const int8_t* xq2;  ///< ActKind::Q8, two-level: the residual's planes (else nullptr)
    const ActBlockInfo* xinfo2;  ///< ActKind::Q8, two-level: the residual's records
    const float* x;     ///< ActKind::F32: K floats
    float* y;           ///< N floats (unused with epi)
    ActScale scale{};   ///< ActKind::Q8: the activation's deferred RMSNorm scale
    const NormEpilogue* epi = nullptr;  ///< ActKind::Q8: gemv_residual_norm (N % 32 == 0)
    /// Indexed mode (N = rows per matrix, y = slots × N floats; no scale, no epi).
    const GemvIndex* index = nullptr;
};

/// Launches the GEMV kernel for l.type / l.act with configuration kGemvConfigs[config]
/// (with l.epi: `config` is ignored; gemv_norm_kernel runs with the Op's kNormUnroll, default 2).
/// Returns false (and launches nothing) if that kernel does not exist.
bool launch_gemv(const GemvLaunch& l, int config, cudaStream_t stream);

/// Both launches (same activation and K, quantized, no epilogue or index) as
/// one gemv_pair_kernel where the pair of types has one (gemv_pair.cu:
/// Q4_K with Q6_K); false (nothing launched) otherwise.
bool launch_gemv_pair(const GemvLaunch& l1, const GemvLaunch& l2, cudaStream_t stream);

// Per-file launchers behind launch_gemv.
bool launch_gemv_q8_0(const GemvLaunch& l, int config, cudaStream_t stream);
bool launch_gemv_q4_1(const GemvLaunch& l, int config, cudaStream_t stream);
bool launch_gemv_q4_k(const GemvLaunch& l, int config, cudaStream_t stream);
bool launch_gemv_q6_k(const GemvLaunch& l, int config, cudaStream_t stream);
bool launch_gemv_q4_0(const GemvLaunch& l, int config, cudaStream_t stream);
bool launch_gemv_q5_0(const GemvLaunch& l, int config, cudaStream_t stream);
bool launch_gemv_q5_1(const GemvLaunch& l, int config, cudaStream_t stream);
bool launch_gemv_q5_k(const GemvLaunch& l, int config, cudaStream_t stream);
bool launch_gemv_q2_k(const GemvLaunch& l, int config, cudaStream_t stream);
bool launch_gemv_q3_k(const GemvLaunch& l, int config, cudaStream_t stream);
bool launch_gemv_float(const GemvLaunch& l, int config, cudaStream_t stream);
/// F8_E4M3_B32 weights (gemv_f8_e4m3.cu) against float x (ActKind::F32);
/// false for any other activation kind.
bool launch_gemv_f8_e4m3(const GemvLaunch& l, int config, cudaStream_t stream);
/// NVFP4 weights (gemv_nvfp4.cu) against the quantized x (ActKind::Q8, one or
/// two levels, deferred norm scale and the residual-norm epilogue as the
/// other quantized types); false for any other activation kind.
bool launch_gemv_nvfp4(const GemvLaunch& l, int config, cudaStream_t stream);

/// x[K] floats -> xq (two planes of int8, see GemvLaunch) and xinfo[K/32].
/// Rounds exactly as quantize_row_ref(Q8_1): d = amax/127, q = round(x/d)
/// (half away from zero), s = float(sum q) * d; d and s are kept in fp32.
/// With xq2/xinfo2 (both or neither), the residual x - d·q (fp32) is
/// quantized with the scale d/kLevel2Ratio into them (two-level activation, gemv.h).
void launch_quantize_q8_1(const float* x, int8_t* xq, ActBlockInfo* xinfo, int64_t K, cudaStream_t stream,
                          int8_t* xq2 = nullptr, ActBlockInfo* xinfo2 = nullptr);

/// Repacks n_blocks GGUF blocks of type t (src, back to back; rows of K
/// elements) into the device layout streams q, q2, s, s2 of weights.h
/// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, and quern's
/// F8_E4M3_B32 / NVFP4 blocks; other types: nothing is launched).
void launch_repack(DType t, const uint8_t* src, int64_t n_blocks, int64_t K, void* q, void* q2, void* s, void* s2,
                   cudaStream_t stream);

}  // namespace quern::cuda
