// Error checking for CUDA runtime calls. Every runtime call in the CUDA
// backend goes through QUERN_CUDA_CHECK; a failure throws quern::Error naming
// the CUDA error, the call and the source location, e.g.
//   CUDA error cudaErrorMemoryAllocation (out of memory) in
//   cudaMalloc(&p, bytes) at src/backend/cuda/device_buffer.cpp:21
// This header is free of fmt so that it can be included from .cu files.
#pragma once
#include <cuda_runtime.h>

#include <string>

namespace quern::cuda {

/// Throws quern::Error describing `err` (its name and string), the call text
/// `expr` and the location `file:line`. Never returns.
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);

/// Throws quern::Error with `message` (for argument checks in .cu files).
[[noreturn]] void throw_error(const std::string& message);

/// Throws (see throw_cuda_error) unless err == cudaSuccess.
inline void check(cudaError_t err, const char* expr, const char* file, int line) {
    if (err != cudaSuccess) throw_cuda_error(err, expr, file, line);
}

}  // namespace quern::cuda

/// Checks a CUDA runtime call: QUERN_CUDA_CHECK(cudaMalloc(&p, n));
#define QUERN_CUDA_CHECK(expr) ::quern::cuda::check((expr), #expr, __FILE__, __LINE__)

/// Checks that the last kernel launch was accepted (launch configuration,
/// missing kernel image); does not synchronize, so faults inside the kernel
/// surface at the next synchronizing call.
#define QUERN_CUDA_CHECK_LAUNCH() ::quern::cuda::check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
