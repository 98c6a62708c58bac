// The matrices of one qw_gemm launch, shared by its two kernels: the tiled
// wgmma kernel (qw_gemm.cu, 32-256 activation rows per block, weights staged
// in shared memory) and the skinny kernel (qw_skinny.cu, 1-64 activation
// rows per block, weights streamed into registers). Included by those .cu
// files only.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/dequant.cuh"
#include "backend/cuda/qw_gemm.h"

namespace quern::cuda::qw {

// One matrix of a launch: weight rows row0 .. row0 + rows − 1 of a's matrix
// into output columns ycol .. ycol + rows − 1; its blocks start at bx0 in
// the grid's x (set by the launcher).
struct Seg {
    deq::DeqArgs a;
    int64_t row0, rows;
    int64_t ycol;
    int64_t bx0;
};
// Up to kQwMaxPieces matrices of one type and K side by side in the grid's x.
struct Segs {
    Seg s[kQwMaxPieces];
    int count;
};

/// The skinny kernel's launch (qw_skinny.cu) for weights of type t (Q4_K or
/// Q6_K): y[r·ldy + seg.ycol + j] = Σ_k x[r·K + k] · W[seg.row0 + j][k] for
/// r < n and every segment, in token groups of up to 64 rows. Arguments
/// checked by the caller (qw_gemm_pieces). Asynchronous on `stream`.
void launch_skinny(DType t, Segs segs, const uint16_t* x, int n, float* y, int64_t ldy, cudaStream_t stream);

/// The skinny kernel's GLU form (qw_gemm_glu): segs.s[0] the gate rows and
/// segs.s[1] the up rows (one count, segs.count == 2); h[r·ldh + j] =
/// BF16(act(gate · x_r) · (up · x_r)) for r < n, j < rows. Arguments checked
/// by the caller. Asynchronous on `stream`.
void launch_skinny_glu(DType t, Segs segs, const uint16_t* x, int n, uint16_t* h, int64_t ldh, bool gelu,
                       cudaStream_t stream);

}  // namespace quern::cuda::qw
