// The CUDA backend's measurement and tuning switches: every QUERN_* variable
// it reads, read once (on first use) into one struct. None of them is needed
// to run quern; each exists to measure or re-derive a choice the code makes
// by default (the figures are in bench/). Leaving one unset keeps that
// default. QUERN_CUDA_SKIP alone changes results (it leaves ops out).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace quern::cuda {

struct Tuning {
    /// QUERN_CUDA_SKIP=norm,qkv,attn,wo,gateup,swiglu,down,router,topk,wsum,
    /// shexp,delta,dnorm: those ops are left out of the decode step (wrong
    /// output; the step's time tells what each costs inside the replayed
    /// graph, bench/decode-cuda-h200.md). topk is the MoE routing kernel,
    /// wsum the experts' weighted sum, shexp the whole shared expert, delta
    /// the DeltaNet conv and recurrence, dnorm its gated RMSNorm.
    std::string skip;
    /// QUERN_GEMV_CONFIG=TYPE=INDEX,TYPE@N=INDEX,...: a GEMV launch
    /// configuration per weight type (indices as bench_gemv_cuda lists them;
    /// TYPE@N only for matrices of N rows) in place of gemv.cpp's rules.
    std::vector<std::pair<std::string, int>> gemv_config;
    /// QUERN_CUDA_PREFILL_CHUNK=N: positions per prefill chunk (0:
    /// SessionOptions::prefill_chunk, 2048).
    int64_t prefill_chunk = 0;
    /// QUERN_CUDA_PREFILL_TILE=M: prefill weight tiles of M·2^20 elements (0:
    /// the largest layer matrix, at most 64·2^20).
    int64_t prefill_tile = 0;
    /// QUERN_CUDA_GEMM_TUNE=1: time cuBLASLt's first eight candidates per GEMM
    /// shape and keep the fastest (default: its first).
    bool gemm_tune = false;
    /// QUERN_CUDA_BQ_ROWS=N: PrefillGemm::uses_bq takes bq_gemm up to N rows
    /// where a BF16 copy exists (-1: 32 with wgmma, else 16).
    int64_t bq_rows = -1;
    /// QUERN_CUDA_BQ_WGMMA=F: the bq_gemm form for 17-64 rows (0 mma.sync, 1
    /// the fastest per shape, 2-4 one wgmma configuration; -1: 1 on sm_90a).
    int bq_wgmma = -1;
    /// QUERN_CUDA_QW=1: the batch runner multiplies the Q4_K / Q6_K matrices
    /// from their resident layout with qw_gemm (qw_gemm.h) instead of making
    /// BF16 copies and bq layouts of them: no second copy of the model; as
    /// fast as the copies at 64 sequences, slower below (bq_gemm) and from
    /// ~128 on (0, the default: only for models whose copies would not fit,
    /// CudaExecutor::choose_copy_free; bench/batched-cuda-h200.md). Only
    /// where sm_90a runs.
    int qw = 0;
    /// QUERN_CUDA_QW_ROWS=N: PrefillGemm::uses_qw takes qw_gemm up to N
    /// activation rows (-1: kQwRows, gemm.h).
    int64_t qw_rows = -1;
    /// QUERN_CUDA_FP8_CUBLAS=1: FP8 products (`--gpu-weights fp8`) through
    /// cuBLASLt instead of fp8_gemm (fp8_gemm.h), where that runs.
    bool fp8_cublas = false;
    /// QUERN_CUDA_BQ_BLOCKS_PER_SM=N: bq_gemm counts N blocks per SM when it
    /// picks its K splits (0: the clusters the device holds at once).
    int bq_blocks_per_sm = 0;
    /// QUERN_CUDA_PAGED_SPLITS=N: the batch runner's attention splits each
    /// row's keys into up to N ranges (0: only when the blocks underfill the GPU).
    int paged_splits = 0;
    /// QUERN_CUDA_DQ_TOKENS=64|128: token tile of dq_gemm_grouped (0: 128
    /// where the groups average more than 96 rows).
    int dq_tokens = 0;
    /// QUERN_CUDA_DELTA_CHUNK_ROWS=N: a pass's sequences of at least N rows
    /// take the chunked delta rule (delta_rule.h), the others the token
    /// recurrence (0: none chunked; default 32).
    int delta_chunk_rows = 32;
    /// QUERN_CUDA_DELTA_COL_GROUPS=1|2|4: blocks per value head of the
    /// chunked delta rule (0: as many as the SMs hold at once).
    int delta_col_groups = 0;
};

/// The switches, read from the environment on the first call.
const Tuning& tuning();

}  // namespace quern::cuda
