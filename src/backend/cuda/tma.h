// Host side of the Tensor Memory Accelerator: the CUtensorMap descriptors
// that tma.cuh's copies read (CUDA driver API cuTensorMapEncodeTiled,
// reached through the runtime's entry-point query so that quern links no
// libcuda itself).
#pragma once
#include <cuda.h>

#include <cstdint>

namespace quern::cuda {

/// The descriptor of a row-major matrix of `rows` rows × `cols` elements of
/// one byte each (E4M3 codes, int8), rows `row_stride` bytes apart, copied
/// in boxes of box_rows × box_cols elements with the given swizzle; elements
/// outside the matrix read as zeros. Encoding is host-only work (no device
/// call): cheap enough per launch, and the map is a by-value kernel argument
/// that CUDA graphs capture. Errors (quern::Error): base not 16-byte aligned,
/// row_stride not a multiple of 16 or below cols, a box side of 0 or over
/// 256, a swizzled box row wider than the swizzle span, the driver lacking
/// the entry point, or the driver refusing the map (its CUresult named).
CUtensorMap tensor_map_2d_u8(const void* base, uint64_t cols, uint64_t rows, uint64_t row_stride, uint32_t box_cols,
                             uint32_t box_rows, CUtensorMapSwizzle swizzle);

}  // namespace quern::cuda
