// GEMM of E4M3 weights by E4M3 activations with one scale per weight row and
// one per activation row (W8A8, the `--gpu-weights fp8` batch products):
// Y = (sx ⊗ sw) ∘ (Qx · Qwᵀ), written in fp32.
//
// Method (sm_90a only: TMA and wgmma): a block of three warpgroups takes 128
// weight rows by 32, 64 or 128 activation rows. One thread of the first
// warpgroup copies each 128-element slice of K of both operands into a ring
// of shared-memory stages with the Tensor Memory Accelerator (128-byte
// swizzle, tensor maps of tma.h), counted on a "full" mbarrier per stage;
// each of the other two warpgroups multiplies its 64 weight rows by the
// stage's activations with four wgmma.m64nNk32 (both operands from shared
// memory), then frees the stage on its "empty" mbarrier. No block-wide
// barrier inside the loop: the copies run as many stages ahead as the ring
// holds (6-8). When the tiles alone leave SMs idle (few weight rows and
// tokens), K is split over more blocks whose sums a second launch adds.
//
// Numerics: each product of codes is exact in the tensor cores; their sums
// over one 128-element slice keep about 14 mantissa bits (Hopper's FP8
// accumulation), and the slices' sums are added in fp32 registers (the
// "promotion" of cuBLASLt's default FP8 mode), so the error is within
// 2^-12 of Σ|terms| for any K (tests/cuda/fp8_gemm_test.cu). The two scales
// multiply the sum at the end.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace quern::cuda {

/// Whether fp8_gemm runs rows of K codes on this device: K a positive
/// multiple of 16 (the tensor maps' row pitch) on a device that runs the
/// sm_90a code (compute capability 9.0, a build with QUERN_CUDA_SM90A).
bool fp8_gemm_supported(int64_t K);

/// y[r·ldy + j] = sx[r] · sw[row0 + j] · Σ_k qx[r·K + k] · qw[(row0 + j)·K + k]
/// for r < n, j < rows (E4M3 codes; overwrites those outputs, the rest of
/// each y row untouched). qw: N rows of K codes (row stride K) with their
/// scales sw (N floats); qx: n rows of K codes (row stride K), scales sx.
/// Both code arrays 16-byte aligned. `work` (work_elems floats, or null):
/// scratch for splitting K over more blocks when the tiles alone leave SMs
/// idle (the sums of splits·n·rows floats meet there, then one more launch
/// adds them in split order: deterministic); null or too small gives fewer
/// or no splits, never a different result beyond the order of fp32 adds.
/// Asynchronous on `stream`; no allocation (graph-safe). Preconditions
/// (else quern::Error): fp8_gemm_supported(K), no null pointer but work,
/// 1 <= n < 2^31, 0 <= row0, 1 <= rows, row0 + rows <= N < 2^31, ldy >= rows.
void fp8_gemm(const uint8_t* qw, const float* sw, int64_t N, int64_t K, int64_t row0, int64_t rows, const uint8_t* qx,
              const float* sx, int64_t n, float* y, int64_t ldy, cudaStream_t stream, float* work = nullptr,
              int64_t work_elems = 0);

}  // namespace quern::cuda
