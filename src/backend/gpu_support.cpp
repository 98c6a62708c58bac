#include "backend/gpu_support.h"

#include <fmt/format.h>

namespace quern {

std::string cuda_unsupported_feature(const ModelConfig& c) {
    if (c.arch != "llama" && c.arch != "qwen2" && c.arch != "qwen3" && c.arch != "qwen3moe" && c.arch != "phi3" &&
        c.arch != "gemma2" && c.arch != "gemma3")
        return "the " + c.arch + " architecture";
    // Mixture of experts: the limits of the device routing (cuda::moe_route:
    // at most 1024 experts, 16 used per token) and the per-slot activation
    // layout (expert widths in whole 32-element blocks).
    if (c.moe()) {
        if (c.n_expert > 1024) return fmt::format("mixture-of-experts layers of {} experts (at most 1024)", c.n_expert);
        if (c.n_expert_used < 1 || c.n_expert_used > 16 || c.n_expert_used > c.n_expert)
            return fmt::format("mixture-of-experts layers using {} experts per token (1 to 16)", c.n_expert_used);
        if (c.n_ff_exp % 32 != 0) return fmt::format("an expert FFN width of {} (not a multiple of 32)", c.n_ff_exp);
    }
    if (c.out_bias) return "an attention output bias";
    if (c.head_dim != 32 && c.head_dim != 64 && c.head_dim != 96 && c.head_dim != 128 && c.head_dim != 256)
        return fmt::format("attention heads of {} elements", c.head_dim);
    if (c.n_head_kv <= 0 || c.n_head % c.n_head_kv != 0 || c.n_head / c.n_head_kv > 16)
        return fmt::format("{} query heads per KV head (at most 16)", c.n_head_kv > 0 ? c.n_head / c.n_head_kv : 0);
    for (int64_t d : {c.n_embd, c.q_dim(), c.moe() ? c.n_ff_exp : c.n_ff})
        if (d % 32 != 0) return fmt::format("a dimension of {} (not a multiple of 32)", d);
    return "";
}

}  // namespace quern
