#include "backend/gpu_support.h"

#include <fmt/format.h>

namespace quern {

std::string cuda_unsupported_feature(const ModelConfig& c) {
    if (c.arch != "llama" && c.arch != "qwen2" && c.arch != "qwen3" && c.arch != "phi3" && c.arch != "gemma2" &&
        c.arch != "gemma3")
        return "the " + c.arch + " architecture";
    if (c.moe()) return "mixture-of-experts layers";
    if (c.out_bias) return "an attention output bias";
    if (c.longrope()) return "LongRoPE (Phi-3 long-context scaling)";
    if (c.head_dim != 32 && c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256)
        return fmt::format("attention heads of {} elements", c.head_dim);
    if (c.n_head_kv <= 0 || c.n_head % c.n_head_kv != 0 || c.n_head / c.n_head_kv > 16)
        return fmt::format("{} query heads per KV head (at most 16)", c.n_head_kv > 0 ? c.n_head / c.n_head_kv : 0);
    for (int64_t d : {c.n_embd, c.q_dim(), c.n_ff})
        if (d % 32 != 0) return fmt::format("a dimension of {} (not a multiple of 32)", d);
    return "";
}

}  // namespace quern
