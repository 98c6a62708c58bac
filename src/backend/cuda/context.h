// CudaContext: one device and one stream. The engine creates one per GPU; all
// CUDA backend work of that engine is queued on its stream.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace quern::cuda {

class CudaContext {
public:
    /// Selects device `device` (cudaSetDevice), creates a non-blocking stream
    /// and reads the device properties. Throws quern::Error when no such
    /// device exists or a CUDA call fails.
    explicit CudaContext(int device = 0);
    ~CudaContext();
    CudaContext(const CudaContext&) = delete;
    CudaContext& operator=(const CudaContext&) = delete;

    int device() const { return device_; }
    cudaStream_t stream() const { return stream_; }
    /// Streaming multiprocessors (132 on an H200 SXM).
    int sm_count() const { return sm_count_; }
    /// Compute capability as 10*major + minor (90 for Hopper).
    int compute_capability() const { return cc_; }
    /// L2 cache size in bytes.
    size_t l2_bytes() const { return l2_bytes_; }
    /// Device memory in bytes.
    size_t total_memory() const { return total_mem_; }
    const std::string& name() const { return name_; }

    /// Makes this context's device current for the calling thread.
    void make_current() const;
    /// Blocks until all work queued on the stream has finished; throws
    /// quern::Error if any of it failed.
    void synchronize() const;

    /// Number of CUDA devices usable by this process; 0 when there is no
    /// driver, no device, or any other error (never throws). Tests call it
    /// to skip cleanly on machines without a GPU.
    static int device_count();

    /// Streaming multiprocessors of the current device, read once per
    /// process (132 when it cannot be read: an H200's count), for kernels
    /// that size their grids without a context at hand.
    static int current_sm_count();

private:
    int device_ = 0;
    cudaStream_t stream_ = nullptr;
    int sm_count_ = 0;
    int cc_ = 0;
    size_t l2_bytes_ = 0;
    size_t total_mem_ = 0;
    std::string name_;
};

}  // namespace quern::cuda
