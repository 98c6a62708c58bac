#include "backend/cuda/context.h"

#include "backend/cuda/cuda_check.h"

#include <cstdlib>
#include <string>
#include <vector>
#include "core/error.h"

namespace quern::cuda {

int CudaContext::device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

int CudaContext::current_sm_count() {
    static const int count = [] {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            return 132;
        }
        return v;
    }();
    return count;
}

CudaContext::CudaContext(int device) : device_(device) {
    const int n = device_count();
    if (device < 0 || device >= n) fail("CUDA device {} requested but {} device(s) are usable", device, n);
    QUERN_CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp prop{};
    QUERN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    sm_count_ = prop.multiProcessorCount;
    cc_ = prop.major * 10 + prop.minor;
    l2_bytes_ = static_cast<size_t>(prop.l2CacheSize);
    total_mem_ = prop.totalGlobalMem;
    name_ = prop.name;
    QUERN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

CudaContext::~CudaContext() {
    if (stream_) {
        (void)cudaSetDevice(device_);
        (void)cudaStreamSynchronize(stream_);
        (void)cudaStreamDestroy(stream_);
    }
}

void CudaContext::make_current() const { QUERN_CUDA_CHECK(cudaSetDevice(device_)); }

void CudaContext::synchronize() const { QUERN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

}  // namespace quern::cuda

