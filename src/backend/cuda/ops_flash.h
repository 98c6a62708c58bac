// Tensor-core prefill attention (ops_flash.cu), used by prefill_attention
// (ops.h) where it applies; internal to the CUDA backend.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/ops.h"

namespace quern::cuda {

/// Whether prefill_flash_attention takes this case: an f16 KV cache, heads
/// of 64, 128 or 256 elements, even row strides (in floats) of q and out.
bool prefill_flash_supported(KvType kv_type, int head_dim, int64_t ldq, int64_t ldo);

/// prefill_attention's contract (ops.h) on the tensor cores, for the cases
/// prefill_flash_supported accepts; the caller has checked the arguments.
/// q·scale and the softmax weights are rounded to f16 (see ops_flash.cu).
void prefill_flash_attention(const float* q, int64_t ldq, const void* k_cache, const void* v_cache, int n, int pos0,
                             int n_head, int n_head_kv, int head_dim, float scale, int window, float softcap,
                             float* out, int64_t ldo, cudaStream_t stream);

}  // namespace quern::cuda
