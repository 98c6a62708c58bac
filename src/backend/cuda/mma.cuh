// Warp-level tensor-core and asynchronous-copy primitives (PTX ISA 8.x:
// mma.sync.m16n8k16, cp.async), shared by the GEMM kernels that stage their
// operands in shared memory themselves (bq_gemm.cu, grouped_gemm.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace quern::cuda::mma {

/// d += A·B for one m16n8k16 tile, BF16 inputs, fp32 accumulators. Lane
/// L = 4g + c holds: a[0] = A[g][2c, 2c+1], a[1] = A[g+8][2c, 2c+1],
/// a[2] = A[g][2c+8, 2c+9], a[3] = A[g+8][2c+8, 2c+9]; b0 = B[2c, 2c+1][g],
/// b1 = B[2c+8, 2c+9][g] (the lower k in the low half); d[0..1] =
/// D[g][2c, 2c+1], d[2..3] = D[g+8][2c, 2c+1].
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Copies 16 bytes from global to shared memory asynchronously (cp.async.cg:
/// through L2 only); `valid` false writes 16 zero bytes and reads nothing.
/// Both addresses 16-byte aligned.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    const int n = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(gmem), "r"(n));
}

/// Closes this thread's group of cp.async copies issued so far.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

/// Waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace quern::cuda::mma
