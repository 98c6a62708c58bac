#include "backend/cuda/device_buffer.h"

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace quern::cuda {

DeviceBuffer::DeviceBuffer(size_t bytes) : size_(bytes) {
    if (bytes == 0) return;
    const cudaError_t err = cudaMalloc(&ptr_, bytes);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        size_ = 0;
        ptr_ = nullptr;
        fail("CUDA error {} ({}) allocating {} bytes ({:.1f} MiB) of device memory", cudaGetErrorName(err),
             cudaGetErrorString(err), bytes, static_cast<double>(bytes) / (1024.0 * 1024.0));
    }
}

DeviceBuffer::~DeviceBuffer() {
    if (ptr_) (void)cudaFree(ptr_);  // a destructor must not throw; cudaFree fails only on a broken context
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
        if (ptr_) (void)cudaFree(ptr_);
        ptr_ = o.ptr_;
        size_ = o.size_;
        o.ptr_ = nullptr;
        o.size_ = 0;
    }
    return *this;
}

void DeviceBuffer::upload(const void* host, size_t bytes, cudaStream_t stream, size_t offset) {
    if (offset > size_ || bytes > size_ - offset)
        fail("DeviceBuffer::upload: {} bytes at offset {} exceed the buffer of {} bytes", bytes, offset, size_);
    if (bytes == 0) return;
    QUERN_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(ptr_) + offset, host, bytes, cudaMemcpyHostToDevice, stream));
    QUERN_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void DeviceBuffer::download(void* host, size_t bytes, cudaStream_t stream, size_t offset) const {
    if (offset > size_ || bytes > size_ - offset)
        fail("DeviceBuffer::download: {} bytes at offset {} exceed the buffer of {} bytes", bytes, offset, size_);
    if (bytes == 0) return;
    QUERN_CUDA_CHECK(cudaMemcpyAsync(host, static_cast<const uint8_t*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost, stream));
    QUERN_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void DeviceBuffer::fill_bytes(uint8_t value, cudaStream_t stream) {
    if (size_ == 0) return;
    QUERN_CUDA_CHECK(cudaMemsetAsync(ptr_, value, size_, stream));
}

}  // namespace quern::cuda
