// The Tensor Memory Accelerator and the shared-memory barriers it signals
// (PTX ISA 8.0+, sm_90): a tile of a global matrix described by a
// CUtensorMap (tma.h makes them on the host) is copied into shared memory by
// one instruction, and the copy's completion is counted in bytes on an
// mbarrier that consumers wait on. For kernels that pipeline operand tiles
// through a ring of stages with a producer warp (fp8_gemm.cu). Everything
// here is emitted only in the device passes that have wgmma (QUERN_WGMMA,
// mma.cuh): its only users are sm_90a kernels.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/mma.cuh"

namespace quern::cuda::tma {

/// The shared-space address of a pointer into shared memory.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// Initializes the mbarrier at `bar` (8 bytes, 8-byte aligned) for `count`
/// arrivals per phase. Once, by one thread, before mbar_init_fence and a
/// block barrier.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#ifdef QUERN_WGMMA
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}

/// Makes the initializations visible to the async proxy (the copies that
/// complete transactions on them); a block barrier after it publishes them.
__device__ __forceinline__ void mbar_init_fence() {
#ifdef QUERN_WGMMA
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

/// One arrival on `bar` that also expects `bytes` more of transactions (the
/// tile copies issued next) before the phase completes.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#ifdef QUERN_WGMMA
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

/// One arrival on `bar`.
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#ifdef QUERN_WGMMA
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}

/// Waits until the phase of `bar` with the given parity has completed. A
/// fresh barrier is in phase 0, so waiting on parity 1 returns at once (the
/// "previous" phase): a producer waits on its empty slots with parity
/// (round & 1) ^ 1 and gets through the first round unblocked.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#ifdef QUERN_WGMMA
    uint32_t done = 0;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
#endif
}

/// Copies the box of `map` at coordinates (c0 innermost, c1) into shared
/// memory at dst (aligned as the map's swizzle needs: 1024 bytes for
/// 128-byte swizzle); elements outside the tensor arrive as zeros. The
/// copy's bytes (the whole box, outside elements included) complete
/// transactions on `bar`. `map` must be a __grid_constant__ kernel
/// parameter (or in global / constant memory).
__device__ __forceinline__ void load_2d(uint32_t dst, const CUtensorMap* map, int32_t c0, int32_t c1, uint32_t bar) {
#ifdef QUERN_WGMMA
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
            dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
#endif
}

}  // namespace quern::cuda::tma
