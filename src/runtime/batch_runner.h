// BatchRunner: where the engine's batched forward passes run (the CPU, or a
// GPU's memory and kernels). It evaluates several sequences' new tokens in
// one batch-invariant pass (ForwardBatch::invariant) of a backend's Executor
// over a paged KV cache, and makes the pool that cache lives in.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "backend/executor.h"
#include "model/model.h"
#include "runtime/paged_kv.h"

namespace quern {

class ThreadPool;

class BatchRunner {
public:
    virtual ~BatchRunner() = default;
    virtual const ModelConfig& config() const = 0;
    /// "CPU" or the GPU's name.
    virtual std::string backend_name() const = 0;
    /// The paged KV cache: n_blocks blocks of block_size positions (fewer
    /// where the executor has a memory budget, --gpu-mem), its storage where
    /// forward_batch reads it. quern::Error (naming `flag`, the option that
    /// sized it) when it does not fit in memory.
    virtual std::unique_ptr<PagedKvPool> make_kv_pool(int64_t n_blocks, int64_t block_size, const char* flag) = 0;
    /// Recurrent-state slots for n sequences (models with linear-attention
    /// layers: Executor::make_state_slots).
    virtual void make_state_slots(int64_t n) = 0;
    /// Executor::copy_state_slot.
    virtual void copy_state_slot(int32_t from, int32_t to) = 0;
    /// Executor::forward of a batch-invariant pass, over a pool made by
    /// make_kv_pool: the sequences' new tokens, their keys and values written
    /// into their blocks, logits (n_vocab floats on the host) or the next
    /// token for the sequences that ask.
    virtual void forward_batch(const SeqBatch* seqs, int n_seqs, PagedKvPool& kv) = 0;
    /// Passes replayed from CUDA graphs so far (0 for runners without graphs):
    /// for tests and benchmarks.
    virtual int64_t graph_replays() const { return 0; }
};

/// A runner that forwards to `r` (which must outlive it), so that engines
/// made one after another share one loaded runner (benchmarks).
std::unique_ptr<BatchRunner> borrow_runner(BatchRunner& r);

/// A runner on a backend's executor (cpu::make_executor, cuda::make_executor
/// over model.program()), whose storage holds the pool's keys and values;
/// `model` must outlive it.
std::unique_ptr<BatchRunner> make_executor_runner(const Model& model, std::unique_ptr<Executor> executor);

/// The CPU runner: the model's program on `pool`'s threads (cpu::make_executor
/// with the model's options), the KV cache in host memory (floats). `model`
/// and `pool` must outlive it.
std::unique_ptr<BatchRunner> make_cpu_batch_runner(Model& model, ThreadPool& pool);

}  // namespace quern
