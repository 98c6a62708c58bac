// Mixture-of-experts routing (the moe op of a program, backend/program.h):
// router logits → softmax over all experts → top-k →
// optional renormalisation, and the grouping of (row, slot) pairs by expert so
// each expert's weights are read once per batch.
#pragma once
#include <cstdint>
#include <vector>

namespace quern {

/// Routes n rows. logits: n rows of n_expert router logits (innermost: expert).
/// Per row: p = softmax(logits) (in double, max subtracted), the k experts of
/// largest p in descending order (ties: the lower index first), and their
/// weights p_j, divided by Σ p_j over the k chosen when `renormalise`
/// (Mixtral's softmax over the top-k logits is the same thing; Qwen3-MoE's
/// norm_topk_prob). Writes experts[r * k + slot] and weights[r * k + slot].
/// Each row's result depends on that row alone. Requires 0 < k <= n_expert.
void moe_route(const float* logits, int64_t n, int64_t n_expert, int64_t k, bool renormalise, int32_t* experts,
               float* weights);

/// The (row, slot) entries of n × k routed rows grouped by expert: the entries
/// e = row * k + slot of expert x are entries[offsets[x] .. offsets[x + 1]),
/// in increasing e. offsets gets n_expert + 1 values.
void moe_group(const int32_t* experts, int64_t n, int64_t k, int64_t n_expert, std::vector<int64_t>& offsets,
               std::vector<int64_t>& entries);

}  // namespace quern
