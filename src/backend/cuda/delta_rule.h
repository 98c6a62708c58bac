// Gated DeltaNet (Qwen3.5's linear-attention layers) on the device: the math
// is DeltaNetSpec's (backend/program.h) and cpu::delta_rule_tokens'
// (backend/cpu/delta_rule.h), which tests/cuda/delta_rule_cuda_test.cu
// compares these kernels with.
//
// Rows of one pass belong to sequences, back to back (DeltaSeqs): a decode
// step is one row per sequence, a prompt chunk several rows of one. Each
// sequence's recurrent state (Program::state_floats layout: the conv state,
// conv_kernel − 1 rows of conv_dim floats oldest first, then n_v_heads states
// of head_k × head_v floats, row i a key element) lives in device memory.
// All pointers are device pointers; calls are asynchronous on `stream`.
// Shapes: head_k and head_v each 32, 64 or 128; conv_kernel 2 to 8.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace quern::cuda {

/// Where the rows of each sequence of a pass are and whose state they carry.
/// Arrays of n_seqs on the device.
struct DeltaSeqs {
    const int32_t* row0 = nullptr;   ///< the sequence's first row in the pass
    const int32_t* n_rows = nullptr; ///< its rows (>= 1)
    float* const* state = nullptr;   ///< its recurrent state (this layer's slot)
    int n_seqs = 0;
    /// Or null. Else the state after each row j < n_rows − 1 of sequence s
    /// (the conv rows and the heads, in the state's own layout) is also
    /// written at snap[s] + j · snap_stride: a speculative verification pass
    /// keeps the states a rejected draft would otherwise make it recompute.
    /// Those passes take the token-by-token kernel whatever their rows.
    float* const* snap = nullptr;
    int64_t snap_stride = 0;
};

/// The layer's shape and parameters.
struct DeltaLayer {
    int n_k_heads = 0, n_v_heads = 0, head_k = 0, head_v = 0, conv_kernel = 0;
    bool kv_tiled = false;            ///< value head h reads key head h % n_k (else h / (n_v / n_k))
    const float* conv = nullptr;      ///< conv_dim × conv_kernel taps, oldest first
    const float* a_coef = nullptr;    ///< n_v_heads: −exp(A_log)
    const float* dt_bias = nullptr;   ///< n_v_heads
    int64_t conv_dim() const { return 2 * int64_t{n_k_heads} * head_k + int64_t{n_v_heads} * head_v; }
};

/// The causal depthwise conv (over each row and the conv_kernel − 1 before
/// it: earlier rows of its sequence in this pass, else the sequence's conv
/// state), SiLU, and q / k L2-normalised per key head (q also scaled by
/// 1/sqrt(head_k)), for the pass's n rows: x (n × conv_dim, [q | k | v]
/// before the conv) → xc (n × conv_dim). Then each sequence's conv state
/// becomes the last conv_kernel − 1 rows it has seen. Throws quern::Error for
/// shapes outside the supported ones.
void delta_conv(const float* x, float* xc, int64_t n, const DeltaSeqs& seqs, const DeltaLayer& L,
                cudaStream_t stream);

/// The gated delta rule over each sequence's rows, in order, on its state:
/// per value head, β = sigmoid(b), g = a_coef · softplus(a + dt_bias) from
/// ba (n × 2·n_v_heads, [b | a]); y (n × n_v_heads·head_v) the outputs Sᵀq.
/// n: the pass's rows. Sequences of at least Tuning::delta_chunk_rows rows
/// (when n > n_seqs and delta_rule_chunked_supported) take the chunked
/// kernel, the others the token-by-token one: the state in registers for the
/// whole run (read and written once per call: a decode step is bound by that
/// traffic).
void delta_rule(const float* xc, const float* ba, float* y, int64_t n, const DeltaSeqs& seqs, const DeltaLayer& L,
                cudaStream_t stream);

/// delta_conv then delta_rule for a decode step, in one launch: every
/// sequence has exactly one row (row0[s]; n_rows is not read), no
/// snapshots (seqs.snap null, else quern::Error). Same outputs as the two
/// (the q / k norms' sums in another order: within float rounding), the conv
/// state moved on as delta_conv moves it. counters: n_seqs · n_k_heads ints
/// of device memory, zero before the first call; each call leaves them zero
/// (calls on one array must not overlap: one stream). Errors as
/// check_delta_layer, or a null counters.
void delta_step(const float* x, const float* ba, float* y, const DeltaSeqs& seqs, const DeltaLayer& L, int* counters,
                cudaStream_t stream);

/// Throws quern::Error naming what the kernels do not take: heads other
/// than 32, 64 or 128, a conv of other than 2 to 8 taps, value heads that
/// are not a multiple of the key heads, a null parameter or sequence array.
void check_delta_layer(const DeltaLayer& L, const DeltaSeqs& seqs);

/// Whether delta_rule_chunked takes the layer's heads: square, of 32, 64 or 128.
bool delta_rule_chunked_supported(const DeltaLayer& L);

/// delta_rule's recurrence for the sequences of at least min_rows rows (the
/// others are left alone), in chunks of 64 rows on the tensor cores (TF32
/// products, fp32 accumulation: outputs within ~1e-3 relative of the token
/// recurrence's); delta_rule_chunked.cu has the form. col_groups: blocks per
/// value head of 128 (1, 2 or 4; 0: Tuning::delta_col_groups, else as many
/// as the SMs hold at once; other heads take 1). Throws quern::Error for
/// heads it does not take.
void delta_rule_chunked(const float* xc, const float* ba, float* y, const DeltaSeqs& seqs, const DeltaLayer& L,
                        int min_rows, cudaStream_t stream, int col_groups = 0);

/// delta_rule's token-by-token kernel alone, for the sequences of at most
/// max_rows rows.
void delta_rule_tokens(const float* xc, const float* ba, float* y, const DeltaSeqs& seqs, const DeltaLayer& L,
                       int max_rows, cudaStream_t stream);

}  // namespace quern::cuda
