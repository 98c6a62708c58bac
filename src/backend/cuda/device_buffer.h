// DeviceBuffer: an owning, move-only handle to plain device memory
// (cudaMalloc; never managed memory). Copies go through a caller-given stream
// and are followed by a synchronization of that stream, so they are safe
// with non-blocking streams; they are meant for set-up and tests, not for the
// decode loop.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace quern::cuda {

class DeviceBuffer {
public:
    DeviceBuffer() = default;
    /// Allocates `bytes` bytes of device memory on the current device
    /// (256-byte aligned, as cudaMalloc returns). Zero bytes gives an empty
    /// buffer. Throws quern::Error when the allocation fails.
    explicit DeviceBuffer(size_t bytes);
    ~DeviceBuffer();
    DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), size_(o.size_) {
        o.ptr_ = nullptr;
        o.size_ = 0;
    }
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    void* data() const { return ptr_; }
    template <class T>
    T* as() const {
        return static_cast<T*>(ptr_);
    }
    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }

    /// Copies `bytes` bytes from host memory to offset `offset` of this buffer
    /// on `stream`, then synchronizes the stream. Throws quern::Error when the
    /// range exceeds the buffer or a CUDA call fails.
    void upload(const void* host, size_t bytes, cudaStream_t stream, size_t offset = 0);
    /// Copies `bytes` bytes at offset `offset` to host memory on `stream`,
    /// then synchronizes the stream. Errors as upload().
    void download(void* host, size_t bytes, cudaStream_t stream, size_t offset = 0) const;
    /// Sets every byte to `value` on `stream` (asynchronous).
    void fill_bytes(uint8_t value, cudaStream_t stream);

private:
    void* ptr_ = nullptr;
    size_t size_ = 0;
};

}  // namespace quern::cuda
