// FP8 with one scale per output channel for the layer matrices of a model
// (--gpu-weights fp8): the CPU side of the GPU's conversion, so that
// `quern run --verify --gpu-weights fp8` compares the GPU against the CPU on
// the same weights.
#pragma once
#include <memory>
#include <vector>

#include "core/thread_pool.h"
#include "model/weights.h"
#include "quant/fp8.h"  // round_fp8_activation_rows

namespace quern {

/// Whether `name` is a layer matrix --gpu-weights fp8 converts: the
/// attention projections (attn_q, attn_k, attn_v, attn_qkv, attn_output) and
/// the FFN matrices (ffn_gate, ffn_up, ffn_down; the expert banks
/// ffn_*_exps and per-expert blk.N.ffn_*.E). Embeddings, the output head,
/// expert routers (ffn_gate_inp), norms and biases keep their type.
bool is_fp8_layer_matrix(const std::string& name);

/// A copy of `ws` in which every layer matrix (is_fp8_layer_matrix, rows a
/// multiple of 32 elements) is F8_E4M3_B32 with one scale per row: the row's
/// values as dequantize_row_ref gives them, through quantize_fp8_rows
/// (quant/fp8.h), the row's scale in each of its blocks — code for code what
/// to_fp8_rows (backend/cuda/gemm.h) writes on the GPU. Other tensors are the
/// same views (`ws`'s owners must outlive the result). The converted bytes
/// are owned by the returned store. Rows are converted on `pool`.
WeightStore fp8_per_channel_weights(const WeightStore& ws, ThreadPool& pool);


}  // namespace quern
