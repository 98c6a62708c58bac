// Weight matrices resident on the GPU, in a per-type device layout.
//
// Upload reads a host tensor in GGUF block layout (src/quant/blocks.h, the
// layout the CPU backend uses; quern's own F8_E4M3_B32 / NVFP4 blocks
// likewise) and repacks it on the device into separate streams, so that
// every GEMV lane reads whole 16-byte vectors at 16-byte aligned addresses
// and a warp reads contiguous 512-byte spans (GGUF's 34-, 20- and 210-byte
// blocks allow neither, nor do the 36- and 40-byte FP8 / NVFP4 blocks). The
// byte count is unchanged: a GEMV still reads exactly the tensor's size.
//
// Device layouts, per row of K elements (each stream is N rows back to back;
// each stream starts 256-byte aligned in one allocation):
//   F32, F16, BF16  q: the K values as stored (row stride 4K or 2K bytes).
//   Q8_0  q:  [2][K/32][16] int8 — plane p holds bytes 16p..16p+15 of every
//             block's 32 quants (elements 32b+16p+i).
//         s:  [K/32] fp16 d.
//   Q4_1  q:  [K/32][16] the block's qs unchanged: byte i low nibble =
//             element 32b+i, high nibble = element 32b+16+i.
//         s:  [K/32] fp16x2 {d, m} (d at the lower address).
//   Q4_K  q:  [K/32][16] one 16-byte chunk per 32-element sub-block, nibbles
//             ordered as Q4_1 (low = element i, high = element 16+i of the
//             sub-block; GGUF interleaves sub-blocks 2p and 2p+1 instead).
//         s:  [K/256][16] head: fp16 d, fp16 dmin (as GGUF), then the eight
//             6-bit scales sc_j and mins m_j re-packed: byte 4+j =
//             sc_j | (m_j & 3) << 6, bytes 12..15 = m_j >> 2 in nibble j.
//   Q6_K  q:  [K/32][16] low 4 bits of the 32-element group, nibbles ordered
//             as Q4_1.
//         q2: [K/32][2] uint32 high 2 bits: word h, byte k, bits 2i..2i+1
//             hold element 16h+4i+k of the group.
//         s:  [K/16] int8 sub-block scales (unchanged).
//         s2: [K/256] fp16 d.
//   Q4_0  q:  [K/32][16] the block's qs unchanged (nibbles as Q4_1).
//         s:  [K/32] fp16 d.
//   Q5_0  q:  [K/32][16] the block's qs unchanged (low 4 bits, as Q4_1).
//         q2: [K/32] uint32 fifth bits, re-ordered: byte k, bit i (0..3) =
//             element 32b+4i+k, bit 4+i = element 32b+16+4i+k ("Q5 order").
//         s:  [K/32] fp16 d.
//   Q5_1  q:  [K/32][16] the block's qs unchanged (low 4 bits, as Q4_1).
//         s:  [K/32] 8-byte records {fp16 d, fp16 m, uint32 fifth bits in
//             Q5 order} (d at the lowest address).
//   Q5_K  q:  [K/32][16] low 4 bits, one chunk per sub-block, as Q4_K.
//         q2: [K/32] uint32 fifth bits of the sub-block in Q5 order.
//         s:  [K/256][16] head exactly as Q4_K's.
//   Q2_K  q:  [K/32][8] two-bit quants: word g (0, 1), byte k, bits
//             2i..2i+1 = element 32b+16g+4i+k.
//         s:  [K/16] uint8 sub-block scale | min << 4 (unchanged).
//         s2: [K/256] fp16x2 {d, dmin} (d at the lower address).
//   Q3_K  q:  [K/32][8] low two bits, laid out as Q2_K's.
//         q2: [K/32] uint32 third bits (GGUF hmask): byte k, bit 4g+i =
//             element 32b+16g+4i+k.
//         s:  [K/256][12] the 16 six-bit scales (stored + 32) s_n of
//             sub-blocks n: uint32 word n/8, nibble n%8 = s_n & 15; word 2,
//             bits 2n..2n+1 = s_n >> 4.
//         s2: [K/256] fp16 d.
//   F8_E4M3_B32 (weight-only FP8, OCP E4M3; GEMVs read float x)
//         q:  [K/16][16] the E4M3 codes in element order (every block's 32
//             codes unchanged, blocks back to back: K bytes per row).
//         s:  [K/32] f32 block scale d.
//   NVFP4 (NVIDIA ModelOpt NVFP4; GEMVs read the quantized x)
//         q:  [K/32][16] the blocks' qs unchanged, back to back: byte i of
//             chunk c low nibble = E2M1 code of element 32c+2i, high nibble
//             = element 32c+2i+1 (so each 16-bit half-word holds four
//             consecutive elements, nibble j = element j).
//         s:  [K/64] 8-byte records, the block head unchanged: f32 global
//             scale d (lowest address), then the four E4M3 group scales
//             sc[g] of elements 64b+16g .. 64b+16g+15.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace quern::cuda {

class CudaContext;

/// A weight matrix of N rows by K elements on the device (see the layouts
/// above). Move-only; owns its memory.
struct DeviceWeight {
    DType type = DType::F32;
    int64_t K = 0;  ///< elements per row (GGUF ne[0])
    int64_t N = 0;  ///< rows (GGUF ne[1] * ne[2] * ne[3])
    DeviceBuffer buf;
    void* q = nullptr;   ///< quants / values
    void* q2 = nullptr;  ///< Q6_K / Q5_0 / Q5_K / Q3_K high bits (else nullptr)
    void* s = nullptr;   ///< scales (quantized and FP8 / NVFP4 types only)
    void* s2 = nullptr;  ///< Q6_K / Q3_K d, Q2_K {d, dmin} per super-block (else nullptr)
    /// F8_E4M3_B32 whose block scales are one per row (to_fp8_rows, gemm.h):
    /// the prefill multiplies its codes directly in FP8.
    bool fp8_row_scaled = false;
    /// With fp8_row_scaled: the N row scales once each (N f32, contiguous;
    /// the same values as s holds per 32-element block), the outer-vector
    /// scale cuBLASLt applies to the FP8 product.
    const float* row_scale = nullptr;
    /// A resident BF16 copy of the whole matrix (N × K, row-major; made by
    /// make_resident_bf16, gemm.h), or null: the GEMMs read it instead of
    /// dequantizing tiles on every call.
    const uint16_t* bf16 = nullptr;
    DeviceBuffer bf16_buf;
    /// The small-batch layout of the matrix (make_resident_bq, bq_gemm.h:
    /// 4- or 8-bit integers in tensor-core fragment order), or null.
    const uint8_t* bq = nullptr;
    int bq_bits = 0;  ///< 4 (B4) or 8 (B8) when bq is set
    DeviceBuffer bq_buf;
    /// The batch runner multiplies this matrix with qw_gemm from the layout
    /// above and makes no copy of it (CudaExecutor::choose_copy_free).
    bool qw = false;

    /// Bytes one pass over the matrix reads (the tensor's GGUF size).
    size_t bytes() const { return row_size(type, K) * static_cast<size_t>(N); }
};

/// Whether the CUDA backend holds weights of type t (F32, F16, BF16, Q4_0,
/// Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, and the weight-only
/// F8_E4M3_B32 and NVFP4 of FP8 / NVFP4 checkpoints).
bool cuda_weight_type_supported(DType t);

/// Uploads host tensor `w` (ne[0] = K elements per row, ne[1..3] flattened
/// into N rows; rows at byte stride nb[1], slabs at nb[2], nb[3]; GGUF block
/// layout) to the device and repacks it into the layout above, on ctx's
/// stream; returns when the upload is complete.
/// Preconditions (else quern::Error naming the tensor): w.device == CPU,
/// type supported, K a multiple of the type's block size (32; 256 for the
/// K-quants; 64 for NVFP4) and, for F32, of 4, for F16/BF16, of 8 (16-byte
/// rows); N >= 1; K <= 2^30.
/// Needs transient device memory of one extra copy of the tensor for block
/// types (the host bytes are staged, then repacked).
DeviceWeight upload_weight(CudaContext& ctx, const Tensor& w);

/// upload_weight of the rows of several host tensors as one matrix, in
/// order: parts[0]'s N0 rows, then parts[1]'s, ... (an expert bank with the
/// shared expert appended as one more matrix). Every part must have the
/// first's type and K, else quern::Error naming both; other preconditions
/// as above, per part, with N the total.
DeviceWeight upload_weight(CudaContext& ctx, const std::vector<const Tensor*>& parts);

}  // namespace quern::cuda
