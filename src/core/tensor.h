// Tensor: a non-owning view of typed data. Shapes are innermost dimension
// first, as GGUF stores them: ne[0] is the row length (contiguous), ne[1] the
// number of rows, and so on. nb[i] is the byte stride of dimension i; for
// block-quantized types nb[0] is the block size in bytes and a row holds
// ne[0] / block_size blocks.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace quern {

enum class Device : uint8_t { CPU = 0, CUDA = 1 };

struct Tensor {
    std::string name;
    DType type = DType::F32;
    std::array<int64_t, 4> ne{1, 1, 1, 1};
    std::array<size_t, 4> nb{0, 0, 0, 0};
    void* data = nullptr;
    Device device = Device::CPU;

    int64_t nelements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    int64_t nrows() const { return ne[1] * ne[2] * ne[3]; }
    size_t row_bytes() const { return row_size(type, ne[0]); }
    size_t nbytes() const { return row_bytes() * static_cast<size_t>(nrows()); }
    template <class T = void>
    T* row(int64_t i1, int64_t i2 = 0, int64_t i3 = 0) const {
        return reinterpret_cast<T*>(static_cast<uint8_t*>(data) + i1 * nb[1] + i2 * nb[2] + i3 * nb[3]);
    }

    /// A contiguous view over `data` with the given shape (unused trailing dims = 1).
    static Tensor contiguous(DType type, std::array<int64_t, 4> ne, void* data, std::string name = {}) {
        Tensor t;
        t.name = std::move(name);
        t.type = type;
        t.ne = ne;
        const auto& info = dtype_info(type);
        t.nb[0] = static_cast<size_t>(info.type_size);
        t.nb[1] = row_size(type, ne[0]);
        t.nb[2] = t.nb[1] * static_cast<size_t>(ne[1]);
        t.nb[3] = t.nb[2] * static_cast<size_t>(ne[2]);
        t.data = data;
        return t;
    }
};

}  // namespace quern
