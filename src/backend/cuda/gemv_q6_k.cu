// Launcher of the Q6_K decode GEMV; the Op and its layout: gemv_q6_k.cuh.
#include "backend/cuda/gemv_q6_k.cuh"

namespace quern::cuda {
using namespace kern;

bool launch_gemv_q6_k(const GemvLaunch& l, int config, cudaStream_t stream) {
    if (l.act != ActKind::Q8) return false;
    return launch_configured<OpQ6_K>(q6_k_args(l), l.y, l.N, l.K, config, stream, residual_act(l), &l);
}

}  // namespace quern::cuda
