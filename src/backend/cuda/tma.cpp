// Host side of the Tensor Memory Accelerator (API: tma.h).
#include "backend/cuda/tma.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <string>

#include "backend/cuda/cuda_check.h"

namespace quern::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q{};
        const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
            (void)cudaGetLastError();
            p = nullptr;
        }
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }();
    return fn;
}

uint32_t swizzle_span(CUtensorMapSwizzle s) {
    switch (s) {
        case CU_TENSOR_MAP_SWIZZLE_32B: return 32;
        case CU_TENSOR_MAP_SWIZZLE_64B: return 64;
        case CU_TENSOR_MAP_SWIZZLE_128B: return 128;
        default: return 0;
    }
}

}  // namespace

CUtensorMap tensor_map_2d_u8(const void* base, uint64_t cols, uint64_t rows, uint64_t row_stride, uint32_t box_cols,
                             uint32_t box_rows, CUtensorMapSwizzle swizzle) {
    if (!base || reinterpret_cast<uintptr_t>(base) % 16 != 0) throw_error("tensor map: base must be 16-byte aligned");
    if (cols < 1 || rows < 1 || row_stride % 16 != 0 || row_stride < cols)
        throw_error("tensor map: rows must be at least 16-byte multiples apart and hold their columns");
    if (box_cols < 1 || box_cols > 256 || box_rows < 1 || box_rows > 256)
        throw_error("tensor map: box sides must be 1 to 256 elements");
    if (const uint32_t span = swizzle_span(swizzle); span != 0 && box_cols > span)
        throw_error("tensor map: a swizzled box row is wider than the swizzle span");
    const PFN_cuTensorMapEncodeTiled_v12000 encode = encoder();
    if (!encode) throw_error("tensor map: this CUDA driver has no cuTensorMapEncodeTiled (CUDA 12.0 or newer needed)");
    CUtensorMap map{};
    const cuuint64_t dim[2] = {cols, rows};
    const cuuint64_t stride[1] = {row_stride};
    const cuuint32_t box[2] = {box_cols, box_rows};
    const cuuint32_t estride[2] = {1, 1};
    const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dim, stride, box,
                              estride, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        throw_error("tensor map: cuTensorMapEncodeTiled refused the map (CUresult " + std::to_string(static_cast<int>(r)) +
                    ")");
    return map;
}

}  // namespace quern::cuda
