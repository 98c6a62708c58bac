// The CUDA backend as the runtime sees it: an Executor (backend/executor.h)
// that runs a layer program on one GPU, one sequence at a time or in batches.
// Free of CUDA headers so that host-only code can include it.
#pragma once
#include <cstdint>
#include <memory>

#include "backend/executor.h"
#include "backend/program.h"

namespace quern::cuda {

struct SessionOptions {
    int device = 0;
    /// Two-level 8-bit activations (ModelOptions::precise_activations);
    /// false: one level, as llama.cpp does (--fast-act).
    bool precise_activations = true;
    /// Ready for batches of many sequences (the serving engine): resident
    /// BF16 copies or small-batch layouts of the dense matrices, the row
    /// scratch; batched_prefill on. quern::Error at load when the model has
    /// no batched path on this GPU.
    bool batches = false;
    /// When > 0: make_kv_storage makes only the blocks that fit in this
    /// fraction of the GPU's memory after the weights and scratch (--gpu-mem).
    double gpu_mem_fraction = 0;
    /// make_kv_storage makes as many blocks as the memory budget holds (the
    /// share gpu_mem_fraction leaves, else the free memory less
    /// kKvMarginBytes, backend/kv_budget.h) rather than the blocks asked for:
    /// a server's pool, where every block is room for more sequences and
    /// cached prefixes.
    bool kv_fill = false;
    /// Keys and values stored as fp16 (default) or fp32.
    bool f16_kv = true;
    /// Replay the decode step as a CUDA graph, and a batch runner's passes of
    /// single rows as graphs captured per padded row count (off: launch
    /// kernel by kernel).
    bool cuda_graph = true;
    /// Evaluate prompts of at least kPrefillMinTokens tokens in one batched
    /// pass (GEMMs on the tensor cores, prefill_chunk positions at a time)
    /// instead of one decode step per token, where the model allows it
    /// (weight types with a prefill GEMM, gemm.h).
    bool batched_prefill = true;
    /// Positions per batched-prefill pass: its scratch grows with it (about
    /// 0.6 GB at 2048 for an 8B model); longer passes spread each weight
    /// matrix's dequantization over more rows (H200, llama3-8b Q4_K_M pp2048:
    /// 17.7k tok/s with 512, 28.0k with 2048). Tuning::prefill_chunk
    /// (tuning.h) overrides it.
    int64_t prefill_chunk = 2048;
    /// --gpu-weights fp8: every layer matrix (not the embeddings, the output
    /// head or an expert router) converted at load to FP8 E4M3 with one scale
    /// per output channel (to_fp8_rows, gemm.h); decode reads them as FP8
    /// weights, the prefill multiplies them in FP8 against per-token FP8
    /// activations, both scales applied after the product.
    bool fp8_weights = false;
    /// Notes on stderr (the KV-cache size).
    bool verbose = true;
    /// Steps at positions below this run attention as one split (one block
    /// per query head) with no combine launch, from a graph of their own: at
    /// most two tiles, both requested before the kernel's wait (0: never).
    int64_t short_ctx = 128;
    /// Time every op kind with CUDA events (steps run uncaptured) and print
    /// the GPU time per op kind, per decode step, prefill chunk and batch
    /// pass, when the executor is destroyed (--cuda-profile).
    bool profile = false;
};

/// Prompts shorter than this go through the decode step token by token.
inline constexpr int64_t kPrefillMinTokens = 8;

/// Number of usable CUDA devices (0 without a driver or GPU; never throws).
int device_count();

/// An executor running `program` (and the host tensors it names, which must
/// outlive it) on the GPU: weights are uploaded once and stay resident, the
/// paged KV storage lives in device memory. A lone sequence over blocks 0,
/// 1, 2, ... (a Session) runs each token as one replay of a captured decode
/// step (CUDA graph) whose only host synchronisation is reading the next
/// token or the logits, and prompts of kPrefillMinTokens or more as batched
/// prefill passes.
///
/// With opt.batches (the engine behind `quern serve --device cuda`):
/// the model's weights resident (dense matrices also as BF16 copies, as
/// memory allows), each other pass one pass of GEMMs over all the batch's
/// rows (decode tokens and prompt chunks alike, 2048 rows at a time), RoPE
/// and attention per row over the paged f16 KV storage.
///
/// Passes whose sequences each bring one row (decode steps) run as CUDA
/// graphs: the row count is padded to the next of 1, 2, 4, 8, multiples of 8
/// up to 64, of 32 up to 256 (padding rows read token 0 at position 0 and
/// write their keys into a spare block of the pool that no sequence owns),
/// the longest context to the next power of two from 64; one graph per pair,
/// captured the second time a pair is seen and replayed after that
/// (opt.cuda_graph false: none). Used when every
/// dense layer matrix has a resident BF16 copy or FP8 form (or, up to 64
/// rows, a bq layout) and expert layers group on the device.
///
/// Throws quern::Error when there is no GPU, the program or a shape is not
/// supported by the CUDA kernels (cuda_unsupported, backend/block_plan.h), or
/// the model does not fit.
std::unique_ptr<Executor> make_executor(const Program& program, const SessionOptions& opt);

}  // namespace quern::cuda
