// The runtime's Session and BatchRunner over the CUDA executor, for the GPU
// tests (what src/cli/common.cpp makes for --device cuda).
#pragma once
#include <memory>

#include "backend/cuda/session.h"
#include "model/model.h"
#include "runtime/batch_runner.h"
#include "runtime/session.h"

namespace quern::test {

inline std::unique_ptr<Session> cuda_session(const Model& m, cuda::SessionOptions o, int64_t n_ctx) {
    o.precise_activations = m.options().precise_activations;
    return make_executor_session(m, cuda::make_executor(m.program(), o), n_ctx);
}

inline std::unique_ptr<BatchRunner> cuda_runner(const Model& m, cuda::SessionOptions o) {
    o.precise_activations = m.options().precise_activations;
    o.batches = true;
    return make_executor_runner(m, cuda::make_executor(m.program(), o));
}

}  // namespace quern::test
