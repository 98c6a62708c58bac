// Decode-step bookkeeping on the device, so that a captured decode step can
// be replayed without the host touching positions or token ids.
//
// advance_kernel
//   Shapes:  ctl: one DecodeControl; tokens: n_ctx int32 (the sequence's ids).
//   Grid:    one block; thread 0 moves the position, all zero the counters.
//   Bound:   launch latency (a few bytes).
#include "backend/cuda/launch.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops.h"

namespace quern::cuda {
namespace {

__global__ void advance_kernel(DecodeControl* ctl, int32_t* tokens, int n_ctx, unsigned* handoff, int n_handoff) {
    pdl_wait();
    pdl_trigger();
    for (int i = static_cast<int>(threadIdx.x); i < n_handoff; i += static_cast<int>(blockDim.x)) handoff[i] = 0u;
    if (threadIdx.x != 0) return;
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

void advance_decode_position(DecodeControl* ctl, int32_t* tokens, int n_ctx, cudaStream_t stream, unsigned* handoff,
                             int n_handoff) {
    if (!ctl || !tokens || n_ctx < 1) throw_error("advance_decode_position: null pointer or empty context");
    if (n_handoff < 0 || (n_handoff > 0 && !handoff)) throw_error("advance_decode_position: bad hand-over counters");
    const int threads = n_handoff > 32 ? 256 : 32;
    launch_pdl(advance_kernel, dim3(1), dim3(threads), 0, stream, ctl, tokens, n_ctx, handoff, n_handoff);
    QUERN_CUDA_CHECK_LAUNCH();
}

}  // namespace quern::cuda
