// CPU implementations of the non-matmul ops of a transformer forward pass.
// All activations are float32, row-major with the innermost dimension first
// (a row of `dim` floats per token). Each op has a scalar reference in
// tests/kernel/ops_test.cpp.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace quern::cpu {

/// RMSNorm (Zhang & Sennrich 2019): y = x / sqrt(mean(x²) + eps) * w, for n rows
/// of `dim` floats. y may alias x.
void rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t dim, float eps);

/// Rotary position embedding (Su et al. 2021, RoFormer) applied in place to n
/// tokens × n_heads heads of head_dim floats (row stride n_heads*head_dim).
/// Only the first rope_dim elements of each head rotate.
///   neox = false: pairs (x[2i], x[2i+1])          (GGML_ROPE_TYPE_NORMAL, llama)
///   neox = true:  pairs (x[i], x[i + rope_dim/2])   (GGML_ROPE_TYPE_NEOX)
/// Angle for pair i at position p: p * base^(-2i/rope_dim) / freq_factors[i]
/// (freq_factors may be null: all 1).
void rope(float* x, const int32_t* pos, int64_t n, int n_heads, int head_dim, int rope_dim,
          float base, bool neox, const float* freq_factors);

/// The inverse frequencies rope() uses: inv_freq[i] = float(base^(-2i/rope_dim)
/// / freq_factors[i]) computed in double, for i < rope_dim/2 (freq_factors may
/// be null). The angle of pair i at position p is then double(p) * inv_freq[i]
/// (cos and sin in double, rounded to float). Shared with the CUDA backend so
/// both rotate by the same angles.
void rope_inv_freq(int rope_dim, float base, const float* freq_factors, float* inv_freq);

/// SwiGLU (Shazeer 2020): out = silu(gate) * up elementwise, count elements.
void swiglu(const float* gate, const float* up, float* out, int64_t count);

/// gpt-oss's clamped SwiGLU (GluAct::SwiGluOai): g = min(gate, limit),
/// u = clamp(up, −limit, limit), out = g · sigmoid(alpha · g) · (u + 1)
/// elementwise, count elements. out may alias gate.
void swiglu_oai(const float* gate, const float* up, float* out, int64_t count, float alpha, float limit);

/// GeGLU with the tanh approximation of GELU (Shazeer 2020; transformers'
/// gelu_pytorch_tanh): out = gelu(gate) * up elementwise,
/// gelu(x) = 0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³))). out may alias gate.
void geglu_tanh(const float* gate, const float* up, float* out, int64_t count);

/// Soft-capping: x = cap * tanh(x / cap) elementwise, in place; cap > 0.
void softcap(float* x, int64_t count, float cap);

/// x *= s elementwise.
void scale(float* x, int64_t count, float s);

/// y += x elementwise.
void add_inplace(float* y, const float* x, int64_t count);

/// Embedding lookup: row ids[i] of table (ne[0] = dim, ne[1] = rows, any type
/// with a reference dequantizer) into out[i*dim ...]. Throws quern::Error for
/// an id outside [0, rows).
void get_rows(const Tensor& table, const int32_t* ids, int64_t n, float* out);

/// Causal grouped-query attention (Ainslie et al. 2023) over a contiguous KV cache.
///   q:   n tokens × n_head × head_dim (row stride n_head*head_dim)
///   k,v: cache rows, one per position: n_head_kv × head_dim floats (row stride kv_stride floats)
///   pos[i]: the position of query token i; it attends to cache positions 0..pos[i].
///   out: n tokens × n_head × head_dim.
/// Query head h reads KV head h / (n_head / n_head_kv). scale is usually 1/sqrt(head_dim).
///   window > 0: sliding-window attention — query i sees only positions
///     pos[i] - window + 1 .. pos[i] (window keys, itself included; the mask
///     of transformers' sliding_attention layers and llama.cpp's
///     LLAMA_SWA_TYPE_STANDARD); 0: the whole prefix.
///   softcap > 0: each scaled score s becomes softcap * tanh(s / softcap)
///     before the softmax (transformers' attn_logit_softcapping); 0: none.
///   sinks: n_head logits, one per query head, each joining its head's
///     softmax denominator without a value (attention sinks; gpt-oss,
///     transformers' s_aux); null: none.
void attention(const float* q, const float* k, const float* v, int64_t kv_stride, const int32_t* pos,
               int64_t n, int n_head, int n_head_kv, int head_dim, float scale, float* out,
               ThreadPool& pool, int64_t window = 0, float softcap = 0.0f, const float* sinks = nullptr);

/// Where a sequence's keys and values live in a paged cache: position p is
/// row (block_table[p / block_size] * block_size + p % block_size) of k and
/// v, rows of kv_stride floats (one layer's pool of blocks).
struct PagedKv {
    const float* k;
    const float* v;
    const int32_t* block_table;
    int64_t block_size;
    int64_t kv_stride;
};

/// attention() over a paged cache, one query row at a time: every output row
/// is computed by the same arithmetic whatever n, pos or the other rows are
/// (the property the serving engine's batch invariance rests on), at the
/// price of no GEMM for long prompts. Same shapes and conventions as
/// attention() (window, softcap and sinks included); the block table must
/// cover positions 0..max(pos).
void attention_paged(const float* q, const PagedKv& kv, const int32_t* pos, int64_t n, int n_head, int n_head_kv,
                     int head_dim, float scale, float* out, ThreadPool& pool, int64_t window = 0,
                     float softcap = 0.0f, const float* sinks = nullptr);

/// One sequence's query rows for attention_paged_batch: q, pos, n and out as
/// in attention_paged, over the cache rows kv.
struct PagedAttnSeq {
    const float* q;
    PagedKv kv;
    const int32_t* pos;
    int64_t n;
    float* out;
};

/// attention_paged for several sequences in one parallel region (the work
/// items are all (query row, KV head) pairs): every row is computed exactly
/// as attention_paged computes it (same window, softcap and sinks for all).
void attention_paged_batch(const PagedAttnSeq* seqs, int n_seqs, int n_head, int n_head_kv, int head_dim, float scale,
                           ThreadPool& pool, int64_t window = 0, float softcap = 0.0f, const float* sinks = nullptr);

/// Numerically stable in-place softmax of n floats.
void softmax(float* x, int64_t n);

}  // namespace quern::cpu
