// The grouped paged attention (ops_paged.cu): the kernel paged_attention and
// paged_rope_attention (ops.h) take for an f16 cache, heads of 32, 64 or 128
// and up to 16 query heads per KV head. Internal to the CUDA backend.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/ops.h"

namespace quern::cuda {

// RoPE and the KV write folded into the grouped paged attention
// (paged_rope_attention): q holds the rows as the QKV projection left them
// ([q | k | v], raw), each row the only one of its sequence in the pass —
// or rows that share a cache row and write it alike (the batch runner's
// padding rows), whose outputs mean nothing. kc / vc (not __restrict__:
// fold.kc / fold.vc write them) are read only by cp.async.
struct RopeFold {
    bool on = false;
    const float* inv_freq = nullptr;  // per map.freq (LongRoPE rows their long table)
    int rope_dim = 0;
    int neox = 0;
    AttentionExtras ex;
    __half* kc = nullptr;  // the caches, written at each row's position
    __half* vc = nullptr;
};

/// Whether paged_grouped_attention takes these rows: not pr.scalar, an f16
/// cache, head_dim 32, 64 or 128, n_head / n_head_kv <= 16, n <= 65535.
bool paged_grouped_applies(const PagedRows& pr, KvType kv_type, int n, int n_head, int n_head_kv, int head_dim);

/// paged_attention's result (same shapes and output forms: out, or
/// pr.out_bf16) by the grouped kernel; with fold.on, first what
/// paged_rope_kv_store would do for the rows (each the only row of its
/// sequence). Keys may be split across blocks and merged (pr.split_ws) when
/// the rows alone would not fill the GPU. Preconditions: paged_grouped_applies
/// and the checks of the public entry points (ops.h).
void paged_grouped_attention(const float* q, int64_t ldq, const void* k_cache, const void* v_cache, int n,
                             const PagedRows& pr, int n_head, int n_head_kv, int head_dim, float scale, int window,
                             float softcap, float* out, int64_t ldo, const RopeFold& fold, cudaStream_t stream);

}  // namespace quern::cuda
