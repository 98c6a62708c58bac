// The CPU backend as the runtime sees it: an Executor (backend/executor.h)
// that interprets a layer program with the CPU kernels (ProgramRunner) over a
// paged KV cache of floats in host memory.
#pragma once
#include <memory>

#include "backend/executor.h"
#include "backend/program.h"
#include "core/thread_pool.h"

namespace quern::cpu {

/// An executor running `program` (and the host tensors it names) on `pool`'s
/// threads with `opts`; both must outlive it. Passes that may take the
/// fastest kernels (ForwardBatch::invariant false, one sequence over blocks
/// 0, 1, 2, ...) run ProgramRunner::forward on a contiguous view of the
/// storage — the arithmetic of Model::forward, bit for bit; others
/// ProgramRunner::forward_batch (batch-invariant GEMMs). The next token is
/// the host's argmax of the logits; no sampling chain runs here. profile:
/// time every op (OpProfile) and print the table when the executor is destroyed.
std::unique_ptr<Executor> make_executor(const Program& program, const ModelOptions& opts, ThreadPool& pool,
                                        bool profile = false);

}  // namespace quern::cpu
