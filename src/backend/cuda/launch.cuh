// Kernel launches with programmatic dependent launch (PDL, sm_90).
//
// Decode runs hundreds of small dependent kernels per token; between two of
// them the GPU would otherwise drain the first grid completely before it
// starts launching the second. Launched with PDL, a kernel's blocks may be
// scheduled while its predecessor's last blocks still run: each decode kernel
// calls pdl_wait() (griddepcontrol.wait: returns once the predecessor grid
// has completed and its memory is visible) before it reads anything the
// predecessor wrote or writes anything, and pdl_trigger()
// (griddepcontrol.launch_dependents) so that its own successor may be
// launched early: after its wait, or (pdl_wait_trigger(true): the GEMVs,
// attention and its combine, SwiGLU and argmax's partial launches) before it,
// so that the successor's blocks are
// launched while this grid's predecessor still runs and start loading their
// weights as soon as they fit on a multiprocessor. Since every kernel waits
// for its predecessor, which waited for its own, a kernel past its wait sees
// everything earlier in the stream completed.
//
// Only data that no kernel of the step writes (weights) may be read before
// pdl_wait(), with one exception: the first kernel of a decode step
// (get_row / get_row_norm) and the kernels that end one (argmax's final
// launch, advance_decode_position) trigger only after their wait, so every
// kernel of a step is launched after the previous step has completed, and
// the decode position (written by the kernel that ends a step) and the KV
// rows of earlier positions may be read early by the kernels of the step
// after its first (the attention kernels do). The DeltaNet token recurrence
// also loads its recurrent state before its wait (delta_rule.cu): in the
// step or pass only it writes that state (the conv before it writes the
// conv rows), and the state's earlier writers (itself in an earlier step,
// the chunked kernel, state copies) have completed: a step starts after the
// previous one, and a pass's ordinary launches before each layer (GEMMs,
// copies) wait for everything before them. Without the launch attribute
// (or on a GPU before sm_90) both instructions are no-ops, so the same
// kernels run correctly either way (bench/decode-cuda-h200.md has the
// figures without the attribute and without the early triggers).
#pragma once
#include <cuda_runtime.h>

#include <utility>

namespace quern::cuda {

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
    cfg.numAttrs = 1;
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

/// pdl_wait() and pdl_trigger() in the usual order, or (early) the trigger
/// first: the successor may then be launched as soon as every block of this
/// grid runs, before this grid's own predecessor has completed.
__device__ __forceinline__ void pdl_wait_trigger(bool early) {
    if (early) pdl_trigger();
    pdl_wait();
    if (!early) pdl_trigger();
}

}  // namespace quern::cuda
