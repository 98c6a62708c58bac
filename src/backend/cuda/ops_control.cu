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

namespace quern::cuda {
namespace {

__global__ void advance_kernel(DecodeControl* ctl, int32_t* tokens, int n_ctx) {
    pdl_wait();
    pdl_trigger();
    const int pos = ctl->pos + 1;
    ctl->pos = pos;
    if (pos >= n_ctx) return;  // the cache is full; the host stops before using it
    if (pos < ctl->fixed) {
        ctl->cur = tokens[pos];
    } else {
        tokens[pos] = ctl->sampled;
        ctl->cur = ctl->sampled;
    }
}

}  // namespace

void advance_decode_position(DecodeControl* ctl, int32_t* tokens, int n_ctx, cudaStream_t stream) {
    if (!ctl || !tokens || n_ctx < 1) throw_error("advance_decode_position: null pointer or empty context");
    launch_pdl(advance_kernel, dim3(1), dim3(1), 0, stream, ctl, tokens, n_ctx);
    QUERN_CUDA_CHECK_LAUNCH();
}

}  // namespace quern::cuda
