// Launcher of the Q4_K decode GEMV; the Op and its layout: gemv_q4_k.cuh.
#include "backend/cuda/gemv_q4_k.cuh"

namespace quern::cuda {
using namespace kern;

bool launch_gemv_q4_k(const GemvLaunch& l, int config, cudaStream_t stream) {
    if (l.act != ActKind::Q8) return false;
    return launch_configured<OpQ4_K>(q4_k_args(l), l.y, l.N, l.K, config, stream, residual_act(l), &l);
}

}  // namespace quern::cuda
