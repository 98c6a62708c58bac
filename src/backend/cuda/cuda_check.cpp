#include "backend/cuda/cuda_check.h"

#include "core/error.h"

namespace quern::cuda {

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
    // Reset the last-error state so that later checks do not report this error again.
    (void)cudaGetLastError();
    fail("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(err), cudaGetErrorString(err), expr, file, line);
}

void throw_error(const std::string& message) { throw Error(message); }

}  // namespace quern::cuda
