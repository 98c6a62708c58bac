// Kernel launches with programmatic dependent launch (PDL, sm_90).
//
// Decode runs hundreds of small dependent kernels per token; between two of
// them the GPU would otherwise drain the first grid completely before it
// starts launching the second. Launched with PDL, a kernel's blocks may be
// scheduled while its predecessor's last blocks still run: each decode kernel
// starts with pdl_wait() (griddepcontrol.wait: returns once the predecessor
// grid has completed and its memory is visible) before it reads anything the
// predecessor wrote or writes anything, and then calls pdl_trigger() so that
// its own successor may be launched early. Only data that no kernel of the
// step writes (weights) may be read before pdl_wait(), with one exception:
// since every kernel triggers only after its own wait, a kernel is launched
// only once its predecessor's predecessor has completed, so the decode
// position (written by the kernel that ends a step, advance_decode_position)
// may be read early by kernels that run at least two launches into the next
// step (the attention kernels do). Without the launch
// attribute (or on a GPU before sm_90) both instructions are no-ops, so the
// same kernels run correctly either way. QUERN_CUDA_PDL=0 in the environment
// turns the attribute off (for measurements).
#pragma once
#include <cuda_runtime.h>

#include <utility>

namespace quern::cuda {

/// Whether launches carry the PDL attribute (default yes; QUERN_CUDA_PDL=0: no).
bool pdl_enabled();

/// kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute when
/// enabled. Launch errors surface through cudaGetLastError as usual.
template <class... KArgs, class... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl_enabled() ? 1 : 0;
    (void)cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(std::forward<Args>(args))...);
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace quern::cuda
