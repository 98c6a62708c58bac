// Decode-step bookkeeping on the device, so that a captured decode step can
// be replayed without the host touching positions or token ids.
//
// advance_kernel
//   Shapes:  ctl: one DecodeControl; tokens: n_ctx int32 (the sequence's ids).
//   Grid:    one thread.
//   Bound:   launch latency (a few bytes).
#include "backend/cuda/launch.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace quern::cuda {
namespace {

__global__ void advance_kernel(DecodeControl* ctl, int32_t* tokens, int n_ctx, int32_t* host_out) {
    pdl_wait();
    pdl_trigger();
    detail::advance_control(ctl, tokens, n_ctx, host_out, ctl->sampled);
}

}  // namespace

void advance_decode_position(DecodeControl* ctl, int32_t* tokens, int n_ctx, cudaStream_t stream, int32_t* host_out) {
    if (!ctl || !tokens || n_ctx < 1) throw_error("advance_decode_position: null pointer or empty context");
    launch_pdl(advance_kernel, dim3(1), dim3(1), 0, stream, ctl, tokens, n_ctx, host_out);
    QUERN_CUDA_CHECK_LAUNCH();
}

}  // namespace quern::cuda
