// Non-GEMV decode kernels of the CUDA backend: RMSNorm (+ residual add) fused
// with the Q8_1 activation quantizer, RoPE fused with the KV-cache write,
// split-K ("flash-decoding") GQA attention over a device KV cache (also with
// the RoPE and the KV-cache write fused in), SwiGLU
// fused with the quantizer, residual add, embedding row lookup, greedy
// argmax, and the routing and output mixture of mixture-of-experts layers.
//
// Conventions (shapes innermost first, as everywhere in quern):
//   - All pointers are device pointers; every call is asynchronous on
//     `stream` and never synchronizes, so a decode step can be captured in a
//     CUDA graph. Positions and token ids are read from device memory for the
//     same reason (a graph is replayed with new values, not re-captured).
//   - Quantized activations use exactly the format of QuantizedActivation
//     (gemv.h): for a row of K elements, K int8 in two planes [2][K/32][16]
//     followed (elsewhere) by K/32 ActBlockInfo records. For n rows, row r's
//     int8 planes start at xq + r*K and its records at xinfo + r*K/32; for
//     n = 1, (xq, xinfo) = (a.q(), a.info()) of a QuantizedActivation.
//   - Argument errors (shapes, unsupported types, null pointers that are
//     required) throw quern::Error before anything is launched; launch
//     failures throw via QUERN_CUDA_CHECK_LAUNCH. Out-of-range positions or
//     token ids in device memory cannot be checked on the host: kernels clamp
//     them (documented per call) instead of reading out of bounds.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/gemv.h"
#include "core/dtype.h"

namespace quern::cuda {

/// Element type of the device KV cache. F16 halves the bytes attention
/// reads (the decode bottleneck at long context); F32 matches the CPU cache.
enum class KvType { F32, F16 };

/// For n rows of dim floats (x: n × dim, dim a positive multiple of 32):
///   if residual: x[r] += residual[r] (written back to x)
///   y = x / sqrt(mean(x²) + eps) * w           (w: dim floats)
///   y_out[r] = y (if y_out is not null), and y quantized into (xq, xinfo)
///   (if xq is not null; both or neither) with quantize_row_ref(Q8_1)'s
///   rounding applied to the float y this kernel computes; with (xq2,
///   xinfo2) also the residual y - d·q quantized with the scale d/254 (the second
///   level of a two-level QuantizedActivation).
/// The sum of squares is accumulated in fp32 (the CPU uses double).
/// With residual_k > 0, row r's residual is the weighted sum of residual_k
/// rows, Σ_j residual_w[r·k + j] · residual[(r·k + j)·dim ..], in slot order
/// with moe_weighted_sum's arithmetic: a mixture-of-experts layer's expert
/// outputs summed where they are added, without a launch of their own.
void rms_norm_q8_1(float* x, const float* residual, const float* w, float* y_out, int8_t* xq, ActBlockInfo* xinfo,
                   int64_t n, int64_t dim, float eps, cudaStream_t stream, int8_t* xq2 = nullptr,
                   ActBlockInfo* xinfo2 = nullptr, const float* residual_w = nullptr, int residual_k = 0);

/// The activation act(g) of a gated value act(g)·u: SiLU (SwiGLU), GELU
/// with its tanh form (GeGLU, cpu::geglu_tanh), or the sigmoid (an output
/// gate, OpKind::Gate).
enum GateAct : int { kGateSiLU = 0, kGateGelu = 1, kGateSigmoid = 2 };

/// A gated value for `count` elements (a positive multiple of 32):
///   h = act(gate) · up (act a GateAct; SiLU: SwiGLU); h_out = h (if not
///   null); h quantized into (xq, xinfo) as one row of `count` elements (if
///   not null); the residual into (xq2, xinfo2) when given (two-level, as
///   rms_norm_q8_1).
/// With width > 0, gate and up are count / width rows of `width` floats at
/// stride ld (>= width): element i reads gate[(i / width)·ld + i % width]
/// (up likewise) — an expert bank's per-slot [gate | up] rows (gate = gu,
/// up = gu + width, ld = 2·width); h stays count floats back to back. Throws
/// quern::Error where the rows do not tile count.
void swiglu_q8_1(const float* gate, const float* up, float* h_out, int8_t* xq, ActBlockInfo* xinfo, int64_t count,
                 cudaStream_t stream, int8_t* xq2 = nullptr, ActBlockInfo* xinfo2 = nullptr, int act = kGateSiLU,
                 int64_t width = 0, int64_t ld = 0);

/// Per-group RMSNorm of n rows of `width` floats (width a multiple of
/// `group`): y[r·ldy + i] = x[r·width + i] / sqrt(mean over i's group of x²
/// + eps) · w[i mod group] (a per-head norm, as cpu's rms_norm with a group).
void rms_norm_groups(const float* x, const float* w, float* y, int64_t ldy, int64_t n, int64_t width, int64_t group,
                     float eps, cudaStream_t stream);

/// The gated RMSNorm of one row of `width` floats in groups of `group` (a
/// Gated DeltaNet's output: per value head RMSNorm, then SiLU of the z gate;
/// FLA's / transformers' RMSNormGated), in one launch:
///   h[i] = SiLU(z[i]) · y[i] / sqrt(mean over i's group of y² + eps) · w[i mod group]
/// h (if not null) as floats and quantized into (xq, xinfo) as one row of
/// width elements (if not null; the residual level into (xq2, xinfo2) when
/// given), as rms_norm_groups followed by swiglu_q8_1(z, ·) computes it.
/// Throws quern::Error for null y/w/z, group not a multiple of 32 in
/// [32, 1024], width not a multiple of group, or mismatched quantization
/// pointers.
void gated_rms_norm_q8_1(const float* y, const float* w, const float* z, float* h, int8_t* xq, ActBlockInfo* xinfo,
                         int8_t* xq2, ActBlockInfo* xinfo2, int64_t width, int64_t group, float eps,
                         cudaStream_t stream);

/// out[r·dim + i] += sigmoid(Σ_j x[r·dim + j] · w[j]) · y[r·dim + i] for n rows
/// of dim (a shared expert's per-token gate): x floats, or BF16 bit patterns.
void add_sigmoid_gated(const float* x, const float* w, const float* y, float* out, int64_t n, int64_t dim,
                       cudaStream_t stream);
void add_sigmoid_gated(const uint16_t* x, const float* w, const float* y, float* out, int64_t n, int64_t dim,
                       cudaStream_t stream);

/// x[i] = s·x[i], then, when cap > 0, cap·tanh(x[i]/cap) (cpu::softcap), for
/// `count` floats: a program's scale op (cap 0) and soft-cap op (s 1). Throws for a null x, count < 0 or cap < 0.
void scale_softcap(float* x, int64_t count, float scale, float cap, cudaStream_t stream);

/// y[i] += x[i] for `count` floats (any count; 16-byte alignment of both
/// pointers gives vector loads, else scalar).
void add_inplace(float* y, const float* x, int64_t count, cudaStream_t stream);

/// Rotary embedding for one decode token at position *pos (device int32),
/// fused with the KV-cache write.
///   q: n_head × head_dim floats, rotated in place.
///   k: n_head_kv × head_dim floats, rotated and stored (converted to
///      kv_type) at k_cache + (*pos) * n_head_kv * head_dim elements; k itself
///      is left unchanged.
///   v: n_head_kv × head_dim floats, copied to v_cache at the same offset.
/// Rotation as cpu::rope: pairs (2i, 2i+1) or, neox, (i, i + rope_dim/2) for
/// i < rope_dim/2, angle pos * base^(-2i/rope_dim) / freq_factors[i]
/// (freq_factors: rope_dim/2 floats on the device, or null); elements past
/// rope_dim pass through. head_dim even, rope_dim even and <= head_dim,
/// head_dim <= 1024. *pos is clamped to [0, n_ctx).
void rope_kv_store(float* q, const float* k, const float* v, void* k_cache, void* v_cache, KvType kv_type,
                   const int32_t* pos, int n_ctx, int n_head, int n_head_kv, int head_dim, int rope_dim, float base,
                   bool neox, const float* freq_factors, cudaStream_t stream);

/// The optional parts of an attention op (AttentionSpec, backend/program.h)
/// that decode_attention_rope computes (device pointers of floats):
///   q_bias, k_bias, v_bias: n_head·head_dim / n_head_kv·head_dim / same,
///     added to q, k, v as the QKV projection left them (all three or none)
///   q_norm, k_norm: head_dim weights of a per-head RMSNorm of q and k after
///     the bias and before RoPE, epsilon norm_eps (both or neither)
///   window > 0: the query sees keys pos − window + 1 .. pos only (sliding-
///     window layers; cpu::attention's window)
///   softcap > 0: scores (already scaled) s → softcap·tanh(s/softcap) before
///     the softmax (cpu::attention's softcap)
/// The order follows the CPU's (cpu::ProgramRunner).
struct AttentionExtras {
    const float* q_bias = nullptr;
    const float* k_bias = nullptr;
    const float* v_bias = nullptr;
    const float* q_norm = nullptr;
    const float* k_norm = nullptr;
    float norm_eps = 1e-6f;
    int window = 0;
    float softcap = 0.0f;  ///< > 0: scaled scores s become softcap·tanh(s/softcap)
    /// 1: one split per query head whatever n_ctx (its block takes every
    /// tile in turn) and no combine launch: for steps known to be at short
    /// context (a CUDA graph captured for them). 0: splits by n_ctx, one
    /// block per (split, KV head).
    int one_split = 0;
    /// A paged cache (the serving engine's sequences, runtime/paged_kv.h):
    /// position p lives in cache row table[p >> block_shift] · 2^block_shift
    /// + (p mod 2^block_shift), its sequence's block table (device int32,
    /// entries for positions 0 .. *pos, read by the launch). Null: row p.
    const int32_t* block_table = nullptr;
    int block_shift = 0;
};

/// Scratch of decode_attention and decode_attention_rope: partial results
/// of every (split, head). Size in bytes for a cache of n_ctx positions and
/// n_head query heads.
size_t decode_attention_scratch_bytes(int n_ctx, int n_head, int head_dim);

/// Causal GQA decode attention of one query token at position *pos over the
/// cache positions 0..*pos (as cpu::attention with n = 1):
///   q:   n_head × head_dim floats
///   k_cache, v_cache: n_ctx rows of n_head_kv × head_dim kv_type elements
///   out: n_head × head_dim floats; query head h reads KV head h / (n_head / n_head_kv)
///   scratch: decode_attention_scratch_bytes(n_ctx, n_head, head_dim) bytes
/// head_dim in {32, 64, 96, 128, 256} (256 with an f16 cache only); n_head a multiple of n_head_kv with
/// n_head / n_head_kv <= 16; *pos clamped to [0, n_ctx).
/// Split-K: the grid has min(128, ceil(n_ctx/64)) splits per KV head; the
/// positions 0..*pos are cut into 64-position tiles and each split takes
/// ceil(tiles/splits) consecutive tiles (chosen on the device from *pos:
/// short context → many one-tile splits, long context → all splits, several
/// tiles each). One thread block per (split, KV head) computes, for each of
/// its query heads, the split's max score, sum of exponentials and
/// unnormalised output (online softmax over its tiles); a second kernel
/// combines the active splits. Blocks of inactive splits exit at once.
/// With xq/xinfo (and xq2/xinfo2), `out` is also quantized as one row of
/// n_head × head_dim elements in the QuantizedActivation format (one or two
/// levels, as rms_norm_q8_1 does), for the output projection.
void decode_attention(const float* q, const void* k_cache, const void* v_cache, KvType kv_type,
                      const int32_t* pos, int n_ctx, int n_head, int n_head_kv, int head_dim, float scale,
                      void* scratch, float* out, cudaStream_t stream, int8_t* xq = nullptr,
                      ActBlockInfo* xinfo = nullptr, int8_t* xq2 = nullptr, ActBlockInfo* xinfo2 = nullptr);

/// decode_attention with rope_kv_store folded into its split kernel (one
/// launch less per layer): q (n_head × head_dim floats),
/// k and v (n_head_kv × head_dim floats: the new token's keys and values) are
/// the QKV projection's output, not rotated. q and k are rotated as cpu::rope
/// does with the angles double(*pos) · inv_freq[i] (up to float rounding of
/// cos and sin; inv_freq: rope_dim/2
/// floats on the device, from cpu::rope_inv_freq; pairs (2i, 2i+1) or, neox,
/// (i, i + rope_dim/2); elements past rope_dim pass through); k and v are
/// stored (as kv_type) in cache row *pos (through ex.block_table where it
/// is given), which the attention then includes.
/// q, k and v are left unchanged. Other arguments, limits and the scratch as
/// decode_attention; rope_dim even and <= head_dim.
void decode_attention_rope(const float* q, const float* k, const float* v, void* k_cache, void* v_cache,
                           KvType kv_type, const int32_t* pos, int n_ctx, int n_head, int n_head_kv, int head_dim,
                           const float* inv_freq, int rope_dim, bool neox, float scale, void* scratch, float* out,
                           cudaStream_t stream, int8_t* xq = nullptr, ActBlockInfo* xinfo = nullptr,
                           int8_t* xq2 = nullptr, ActBlockInfo* xinfo2 = nullptr, const AttentionExtras& ex = {});

// ---------------------------------------------------------------- prefill
// Row-batched ops of the prompt-processing path (ops_prefill.cu): n
// consecutive positions pos0 .. pos0+n−1 of one sequence at once, rows at a
// given stride (floats). Ordinary stream order; no device-side positions
// (the prefill is not captured in a graph).

/// For each row r < n of qkv (row stride ld >= (n_head + 2·n_head_kv)·head_dim
/// floats, laid out [q | k | v] as the QKV projection writes them), as
/// decode_attention_rope does for one token at position pos0 + r: adds the
/// biases of `ex`, applies the per-head q/k RMSNorm of `ex`, rotates q and k
/// (angles double(pos)·inv_freq[i], pairs (2i, 2i+1) or, neox, (i, i +
/// rope_dim/2)); q is rotated in place (unscaled), the rotated k and the
/// biased v are stored (as kv_type) in cache row pos0 + r. k and v in qkv are
/// left unchanged. ex.window / ex.softcap are ignored here.
/// Preconditions (else quern::Error): 1 <= n, 0 <= pos0, pos0 + n <= n_ctx;
/// head_dim even and <= 256; rope_dim even and <= head_dim; n_head a
/// multiple of n_head_kv; biases all or none, norms both or neither.
void prefill_rope_kv_store(float* qkv, int64_t ld, int n, int pos0, void* k_cache, void* v_cache, KvType kv_type,
                           int n_ctx, int n_head, int n_head_kv, int head_dim, const float* inv_freq, int rope_dim,
                           bool neox, const AttentionExtras& ex, cudaStream_t stream);

/// Whether prefill_attention takes heads of head_dim elements (32, 64, 96, 128, 256).
bool prefill_attention_head_dim_supported(int head_dim);

/// Causal GQA attention of n query rows at positions pos0 .. pos0+n−1 over
/// the cache (as cpu::attention with pos[r] = pos0 + r):
///   q:   n rows at stride ldq floats of n_head × head_dim (rotated, unscaled)
///   k_cache, v_cache: rows of n_head_kv × head_dim kv_type elements, the
///        row of position p at p; rows 0 .. pos0+n−1 must be written
///   out: n rows at stride ldo floats of n_head × head_dim
/// Query head h reads KV head h / (n_head / n_head_kv); scores are
/// scale·q·k, then softcap·tanh(s/softcap) when softcap > 0; window > 0:
/// row r sees positions pos0+r−window+1 .. pos0+r only. fp32 online
/// softmax. O(n·(pos0+n)·n_head·head_dim) work, one warp per (row, head),
/// 32 keys per step.
/// Preconditions (else quern::Error): head_dim supported, n_head a multiple
/// of n_head_kv, 1 <= n, pos0 >= 0, pos0 + n <= n_ctx, strides >= n_head·head_dim,
/// caches 16-byte aligned.
void prefill_attention(const float* q, int64_t ldq, const void* k_cache, const void* v_cache, KvType kv_type, int n,
                       int pos0, int n_ctx, int n_head, int n_head_kv, int head_dim, float scale, int window,
                       float softcap, float* out, int64_t ldo, cudaStream_t stream);

/// Rows of several sequences in one pass over a paged KV cache (the batch
/// runner): query row r is at position pos[r] of its sequence, whose block
/// table starts at tables[table_off[r]]; position p of that sequence lives
/// in cache row tables[table_off[r] + p / block_size] · block_size +
/// p % block_size (runtime/paged_kv.h's layout, per layer). Device pointers;
/// the caller guarantees that the tables cover positions 0 .. pos[r].
struct PagedRows {
    const int32_t* pos = nullptr;        ///< n positions
    const int32_t* table_off = nullptr;  ///< n offsets into tables
    const int32_t* tables = nullptr;     ///< the sequences' block tables, back to back
    int block_size = 16;
    /// paged_attention: the scalar kernel even where the grouped one applies
    /// (tests compare the two).
    bool scalar = false;
    /// Split-KV (flash-decoding) for the grouped kernel: with split_ws set,
    /// each row's keys may be cut into up to max_splits ranges of at least
    /// 64 keys, attended by separate blocks and merged by a second kernel —
    /// when the rows alone would not fill the GPU. split_ws: device scratch
    /// of split_ws_floats floats (a split pass needs n · n_head · splits ·
    /// (head_dim + 2)); max_keys: the most keys any row attends to (0: no
    /// split).
    float* split_ws = nullptr;
    int64_t split_ws_floats = 0;
    int max_splits = 8;
    int max_keys = 0;
    /// paged_attention: when set, the output goes here as BF16 (n rows of
    /// n_head · head_dim, row stride n_head · head_dim: the output
    /// projection's GEMM input) instead of into `out` (which the scalar
    /// kernel then uses as scratch).
    uint16_t* out_bf16 = nullptr;
    /// paged_rope_kv_store: LongRoPE's second table. Where rope_long is set,
    /// row r with rope_long[r] != 0 turns by inv_freq_long instead of the
    /// inv_freq argument (its sequence has reached the original context;
    /// ModelConfig::rope_factors_long).
    const int32_t* rope_long = nullptr;
    const float* inv_freq_long = nullptr;
    /// Every row is the only row of its sequence in the pass (decode
    /// steps): the batch runner then calls paged_rope_attention.
    bool one_row_per_seq = false;
};

/// prefill_rope_kv_store for rows of several sequences: row r rotated at
/// position pr.pos[r], its keys and values written to its sequence's cache
/// row of that position (PagedRows). Same layouts, extras and errors.
void paged_rope_kv_store(float* qkv, int64_t ld, int n, const PagedRows& pr, void* k_cache, void* v_cache,
                         KvType kv_type, int n_head, int n_head_kv, int head_dim, const float* inv_freq, int rope_dim,
                         bool neox, const AttentionExtras& ex, cudaStream_t stream);

/// prefill_attention for rows of several sequences: row r attends to its
/// own sequence's positions 0 .. pr.pos[r] (window: the last `window`) in
/// the paged cache, decode rows and prompt chunks alike. With an f16 cache,
/// heads of 32 to 128 and at most 16 query heads per KV head: one block per
/// row and KV head stages each 32 keys' K and V rows once for all its query
/// heads; otherwise the scalar kernel (one warp per row and head). Same
/// layouts and errors as prefill_attention.
void paged_attention(const float* q, int64_t ldq, const void* k_cache, const void* v_cache, KvType kv_type, int n,
                     const PagedRows& pr, int n_head, int n_head_kv, int head_dim, float scale, int window,
                     float softcap, float* out, int64_t ldo, cudaStream_t stream);

/// paged_rope_kv_store then paged_attention, for passes where every row is
/// the only row of its sequence (decode steps; else a row would attend to
/// keys another block has yet to write): qkv holds the rows as the QKV
/// projection left them ([q | k | v] per row, row stride ld); the cache
/// rows at pr.pos are written as paged_rope_kv_store writes them, the
/// output is paged_attention's (qkv's q may be left rotated in place, as
/// paged_rope_kv_store leaves it). Where the grouped
/// kernel applies (paged_attention) it is one launch: each block readies its
/// query heads itself (bias, q norm, RoPE, in shared memory), and the block
/// whose key range ends at the row's position also its key, writing it and
/// the value before that position is read; otherwise the two calls. Rows
/// that share one cache row (the batch runner's padding rows, all at
/// position 0 of a spare block) must write it alike; what they read of it
/// and their outputs are then undefined. Errors as the two.
void paged_rope_attention(float* qkv, int64_t ld, void* k_cache, void* v_cache, KvType kv_type, int n,
                          const PagedRows& pr, int n_head, int n_head_kv, int head_dim, float scale, int window,
                          float softcap, const float* inv_freq, int rope_dim, bool neox, const AttentionExtras& ex,
                          float* out, int64_t ldo, cudaStream_t stream);

/// Gating on rows: out[r·ldo + i] = act(gu[r·ld + i]) · gu[r·ld + n_ff + i]
/// for r < n, i < n_ff, act a GateAct — the arithmetic of swiglu_q8_1.
/// ld >= 2·n_ff, ldo >= n_ff.
void glu_rows(const float* gu, int64_t ld, int64_t n, int64_t n_ff, float* out, int64_t ldo, int act,
              cudaStream_t stream);

/// glu_rows with the values rounded to nearest even BF16 (uint16 bit
/// patterns), out: n rows of n_ff back to back — the down projection's
/// GEMM input (PrefillGemm::run_bf16). ld >= 2·n_ff.
void glu_rows_bf16(const float* gu, int64_t ld, int64_t n, int64_t n_ff, uint16_t* out, int act,
                   cudaStream_t stream);

/// RMSNorm of n rows of dim floats into BF16, for the prefill GEMMs:
///   if residual: x[r] += residual[r] (written back to x)
///   out[r·dim + i] = bf16(x[r][i] / sqrt(mean(x[r]²) + eps) · w[i])
/// (rms_norm_q8_1's float y, fp32 sum of squares, rounded to nearest even).
void rms_norm_bf16(float* x, const float* residual, const float* w, uint16_t* out, int64_t n, int64_t dim, float eps,
                   cudaStream_t stream);

/// Embedding lookup: out[dim] = row *id of `table`, rows of dim elements in
/// GGUF block layout stored back to back (row stride row_size(type, dim);
/// upload the tensor bytes as they are, NOT with upload_weight's repacked
/// layout). Types: F32, F16, BF16, Q8_0, Q4_K, Q6_K, F8_E4M3_B32, NVFP4 (the
/// last two: quern's blocks of FP8 / NVFP4 checkpoints, quant/blocks.h); dim
/// a multiple of the type's block size. Values equal dequantize_row_ref's bit
/// for bit. *id is clamped to [0, n_rows).
void get_row(DType type, const void* table, int64_t n_rows, int64_t dim, const int32_t* id, float* out,
             cudaStream_t stream);
bool cuda_get_row_type_supported(DType t);

/// get_row, and the row's RMSNorm left to its consumers as
/// gemv_residual_norm's epilogue leaves the residual stream (gemv.h,
/// DeferredNormScale): x = row *id (dim floats, get_row's values);
/// ss_parts[b] = Σ x[i]² over i in 32b .. 32b+31 (dim/32 floats); x ⊙ w
/// (w: dim floats, the norm's weight) quantized into the QuantizedActivation
/// planes xq/xinfo (and the residual level xq2/xinfo2, or both null) without
/// the 1/rms scale. A decode step's first kernel, so that layer 0 reads its
/// activation as later layers do (one launch instead of get_row +
/// rms_norm_q8_1). dim a multiple of 32 and of the type's block size.
void get_row_norm(DType type, const void* table, int64_t n_rows, int64_t dim, const int32_t* id, float* x,
                  const float* w, int8_t* xq, ActBlockInfo* xinfo, int8_t* xq2, ActBlockInfo* xinfo2, float* ss_parts,
                  cudaStream_t stream);

/// get_row for n ids at once (the prefill's embedding lookup): row r of out
/// (out + r·dim) = row ids[r] of `table`, the same values bit for bit. ids:
/// n device int32, each clamped to [0, n_rows). 1 <= n <= 65535; other
/// conditions as get_row.
void get_rows(DType type, const void* table, int64_t n_rows, int64_t dim, const int32_t* ids, int64_t n, float* out,
              cudaStream_t stream);

/// Scratch of argmax (bytes) for n floats.
size_t argmax_scratch_bytes(int64_t n);
/// *out_id = the index of the largest of x[0..n) (the lowest such index on
/// ties; NaNs are skipped; all-NaN gives 0). n >= 1.
void argmax(const float* x, int64_t n, void* scratch, int32_t* out_id, cudaStream_t stream);
/// Scratch of argmax_rows (bytes) for m rows.
size_t argmax_rows_scratch_bytes(int64_t m);
/// argmax of each of m rows at once (row r: n floats at x + r·ld) into
/// out_ids[r], with argmax's ties and NaNs: two launches whatever m (the
/// batch runner's greedy rows). 1 <= m <= 65535, ld >= n >= 1; scratch of
/// argmax_rows_scratch_bytes(m).
void argmax_rows(const float* x, int64_t m, int64_t n, int64_t ld, void* scratch, int32_t* out_ids,
                 cudaStream_t stream);

/// Sampling parameters of sample_token, in device memory (the host updates
/// them between steps; a captured graph reads the current values). The
/// meaning of every field is SamplingParams' (runtime/sampler.h); u is the
/// step's uniform draw in [0, 1), taken by the host from the Sampler's
/// generator so that a seed gives the same draws on every backend.
struct DeviceSampling {
    float temperature;
    int top_k;             ///< 1 .. kMaxSampleTopK
    float top_p;
    float min_p;
    float repeat_penalty;
    float presence_penalty;
    float frequency_penalty;
    int repeat_last_n;     ///< 0 .. kMaxSampleWindow (the window is the last repeat_last_n tokens)
    double u;
};
inline constexpr int kMaxSampleTopK = 1024;
inline constexpr int kMaxSampleWindow = 1024;
/// Whether sample_token can run a sampler with these settings (else sample
/// on the host): top_k in [1, kMaxSampleTopK] and, with penalties, a window
/// of at most kMaxSampleWindow tokens.
bool device_sampling_supported(int top_k, int repeat_last_n, bool penalties);

/// Picks the next token as Sampler::sample does (penalties over the last
/// repeat_last_n tokens of tokens[0 .. *pos], top-k, top-p and min-p on the
/// untempered distribution, temperature, the draw u; temperature <= 0:
/// argmax after penalties) and writes it to *out_id. logits: n_vocab floats,
/// penalized in place. tokens: the sequence's ids by position; *pos clamped
/// to [0, n_ctx). One thread block; for the same logits and u the result is
/// Sampler's except where expf's last bit decides a cut or the draw.
void sample_token(float* logits, int64_t n_vocab, const int32_t* tokens, const int32_t* pos, int n_ctx,
                  const DeviceSampling* params, int32_t* out_id, cudaStream_t stream);

/// Limits of moe_route: experts in the bank, experts chosen per token.
inline constexpr int kMaxExperts = 1024;
inline constexpr int kMaxExpertsUsed = 16;

/// Mixture-of-experts routing of one token, on the device, as moe_route
/// (backend/cpu/moe_route.h) computes it (softmax gating of Shazeer et al. 2017,
/// "Outrageously Large Neural Networks", top-k as in Mixtral, Jiang et al.
/// 2024; renormalised weights are Mixtral's softmax over the top-k logits and
/// Qwen3-MoE's norm_topk_prob):
///   p = softmax(logits) over all n_expert experts (in double, max subtracted);
///   ids[0..k) = the k experts of largest p in descending order, ties to the
///   lower index; weights[j] = p[ids[j]] / Σ_j p[ids[j]] when renormalise,
///   else p[ids[j]] (converted to float).
/// logits: n_expert floats (the router GEMV's output); ids: k int32;
/// weights: k floats (all device pointers). One warp, no host
/// synchronization (graph-capturable). Throws quern::Error for null pointers,
/// n_expert outside [1, kMaxExperts] or k outside [1, min(n_expert,
/// kMaxExpertsUsed)]. NaN logits give distinct in-range ids (which ones is
/// unspecified).
/// With shared.w set, slot k also gets a shared expert (Qwen2-MoE / Qwen3.5's
/// shared_expert, kept as matrix n_expert of the banks): ids[k] = n_expert,
/// weights[k] = sigmoid(Σ_i shared.w[i] · shared.x[i]) over shared.dim
/// floats, add_sigmoid_gated's arithmetic summed in a warp's order (within
/// float rounding of it); ids and weights then hold k + 1.
struct SharedExpertGate {
    const float* x = nullptr;  ///< the layer's normed input (dim floats)
    const float* w = nullptr;  ///< the gate's weight row (dim floats), or null: no shared slot
    int64_t dim = 0;
};
void moe_route(const float* logits, int n_expert, int k, bool renormalise, int32_t* ids, float* weights,
               cudaStream_t stream, const SharedExpertGate& shared = {});

/// moe_route for n rows of logits at once (row r: logits + r·n_expert; its
/// ids and weights at r·k), one warp per row; same results and
/// errors as moe_route, plus n outside [1, 2^31).
void moe_route_rows(const float* logits, int64_t n, int n_expert, int k, bool renormalise, int32_t* ids,
                    float* weights, cudaStream_t stream);

/// The grouping of moe_group (backend/cpu/moe_route.h) on the device, for the prefill's
/// mixture-of-experts path without a host round trip: from the m = n·k
/// expert ids of n rows (ids[r·k + j] in [0, n_expert)), offsets[0..n_expert]
/// = the start of each expert's group of rows (exclusive prefix sum of the
/// counts, offsets[n_expert] = m), and for every entry e a row of its
/// expert's group: pos[e] = g, src[g] = e / k (the activation row it reads).
/// Unlike moe_group the order of the rows inside a group is unspecified
/// (they are multiplied independently and summed back per entry, so results
/// do not depend on it). Ids out of range are clamped into it. One thread
/// block; device pointers. Throws
/// quern::Error for null pointers or shapes out of range (n·k < 2^31,
/// n_expert ≤ kMaxExperts).
void moe_group_rows(const int32_t* ids, int64_t n, int k, int n_expert, int32_t* pos, int32_t* src, int32_t* offsets,
                    cudaStream_t stream);

/// out[i] = Σ_j weights[j] · y[j·n + i] for i < n, summed in slot order
/// j = 0 .. k−1 (the CPU's moe_ffn order; fp32 multiply then add): the
/// mixture of the k experts' outputs (y: k rows of n floats; weights: k
/// floats; out: n floats; device pointers). Throws for null pointers, k < 1
/// or n < 1.
void moe_weighted_sum(const float* y, const float* weights, int k, int64_t n, float* out, cudaStream_t stream);

/// Mixture-of-experts prefill (rows grouped by expert, on the host with
/// moe_route / moe_group, backend/cpu/moe_route.h, or on the device with moe_route_rows /
/// moe_group_rows):
/// gather_rows_bf16: out row i (K BF16 values) = x row src[i], i < m (the
/// activation rows of each expert's entries back to back). src: m device
/// int32 in [0, rows of x).
void gather_rows_bf16(const uint16_t* x, int64_t K, const int32_t* src, int64_t m, uint16_t* out,
                      cudaStream_t stream);

/// moe_weighted_sum for n rows at once: out[r·dim + i] = Σ_j weights[r·k + j]
/// · y[pos[r·k + j]·dim + i], in slot order with moe_weighted_sum's
/// arithmetic; pos[r·k + j] is the grouped row that holds row r's slot j
/// (device int32), weights n·k floats.
void moe_weighted_sum_rows(const float* y, const int32_t* pos, const float* weights, int64_t n, int k, int64_t dim,
                           float* out, cudaStream_t stream);

/// Device-side state of a sequence's decode step: the position being
/// evaluated, the token id there, the first position whose token is not
/// given by the host (from there on the sampled token is fed back), and the
/// last sampled token. Kernels read `pos` and `cur` from here.
struct DecodeControl {
    int32_t pos;
    int32_t cur;
    int32_t fixed;
    int32_t sampled;
};

/// Ends a decode step: pos += 1; then cur = tokens[pos] when pos < fixed
/// (prompt tokens the host uploaded), else tokens[pos] = cur = sampled
/// (greedy decoding feeds its own output). Nothing else when pos >= n_ctx.
/// host_out (optional): two int32 slots of mapped pinned host memory
/// (cudaHostAllocMapped, its device pointer); the step's sampled token goes
/// to slot p & 1, p the position evaluated, so the host reads it after the
/// step without a copy, also while the next step runs.
void advance_decode_position(DecodeControl* ctl, int32_t* tokens, int n_ctx, cudaStream_t stream,
                             int32_t* host_out = nullptr);

/// argmax (above) into ctl->sampled, and advance_decode_position in argmax's
/// final launch: a greedy step's end in two launches instead of three.
void argmax_advance(const float* x, int64_t n, void* scratch, DecodeControl* ctl, int32_t* tokens, int n_ctx,
                    int32_t* host_out, cudaStream_t stream);

}  // namespace quern::cuda
