// The runtime's Session and BatchRunner over the CUDA executor, for the GPU
// tests (what src/cli/common.cpp makes for --device cuda), and the verify
// helper the session tests share.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/session.h"
#include "model/model.h"
#include "runtime/batch_runner.h"
#include "runtime/session.h"
#include "runtime/verify.h"

namespace quern::test {

/// Whether a CUDA GPU is present; REQUIRE_GPU() skips a test without one.
inline bool have_gpu() { return cuda::device_count() > 0; }
#define REQUIRE_GPU() \
    if (!quern::test::have_gpu()) GTEST_SKIP() << "no CUDA GPU"

inline std::unique_ptr<Session> cuda_session(const Model& m, cuda::SessionOptions o, int64_t n_ctx) {
    o.precise_activations = m.options().precise_activations;
    return make_executor_session(m, cuda::make_executor(m.program(), o), n_ctx);
}

inline std::unique_ptr<BatchRunner> cuda_runner(const Model& m, cuda::SessionOptions o) {
    o.precise_activations = m.options().precise_activations;
    o.batches = true;
    return make_executor_runner(m, cuda::make_executor(m.program(), o));
}

/// A CUDA session of n_ctx positions, quiet; batched_prefill off: prompts
/// token by token through the decode step.
inline std::unique_ptr<Session> gpu_session(const Model& m, int64_t n_ctx = 512, bool batched_prefill = true,
                                            int64_t prefill_chunk = 512) {
    cuda::SessionOptions o;
    o.verbose = false;
    o.batched_prefill = batched_prefill;
    o.prefill_chunk = prefill_chunk;
    return cuda_session(m, o, n_ctx);
}

/// verify_sessions(cpu, gpu, ids) with one report line, "<label> verify:
/// logits cosine …, worst traced …, argmax …", and its verdict as a failure
/// naming the label and the first diverging layer. Returns the result.
inline VerifyResult expect_verify(Session& cpu, Session& gpu, const std::vector<int32_t>& ids, const std::string& label) {
    const VerifyResult v = verify_sessions(cpu, gpu, ids);
    double worst = 1;
    for (const auto& [n, c] : v.cosines) worst = std::min(worst, c);
    std::printf("%s verify: logits cosine %.7f, worst traced %.7f, argmax %d/%d", label.c_str(), v.logits_cosine,
                worst, v.argmax_ref, v.argmax_test);
    if (v.argmax_ref != v.argmax_test)
        std::printf(" (the CPU scores %d %.3g below %d)", v.argmax_test, v.argmax_gap, v.argmax_ref);
    std::printf("\n");
    EXPECT_TRUE(v.ok) << label << " first diverging: " << v.first_diverging;
    return v;
}

}  // namespace quern::test
