// Backend parity check (quern run --verify, the GPU test suite): runs the same
// prompt through two sessions and compares their last-position logits and
// per-layer residual streams (TraceFn names) by cosine similarity.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/session.h"

namespace quern {

struct VerifyResult {
    bool ok = false;              ///< logits cosine >= threshold
    double threshold = 0.999;
    double logits_cosine = 0;
    int32_t argmax_ref = -1, argmax_test = -1;
    /// How far below its own top the reference scores the test's pick:
    /// ref_logits[argmax_ref] − ref_logits[argmax_test] (0 when they agree),
    /// in logit units; a near-zero gap means the picks differ over a near-tie.
    double argmax_gap = 0;
    /// Cosine of every traced tensor, in evaluation order ("blk.0", ..., "logits").
    std::vector<std::pair<std::string, double>> cosines;
    /// The first traced tensor below the threshold ("" when none).
    std::string first_diverging;
};

/// Clears both sessions, evaluates `tokens` on each (all but the last in one
/// pass, then the last with tracing, as a GPU session traces it) and compares.
/// Throws quern::Error when the sessions' models differ in vocabulary size
/// or a session fails.
VerifyResult verify_sessions(Session& ref, Session& test, const std::vector<int32_t>& tokens,
                             double threshold = 0.999);

/// Cosine similarity of two float vectors of n elements (in double; 1 when both are zero).
double cosine_similarity(const float* a, const float* b, int64_t n);

}  // namespace quern
