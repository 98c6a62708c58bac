#include "backend/kv_budget.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace quern {

namespace {

// Blocks (spare block excluded) that `bytes` hold beside the scratch.
int64_t blocks_in(const KvMemory& m, double bytes) {
    const double b = std::floor((bytes - m.scratch) / m.block) - 1;
    return b < 0 ? 0 : b > 1e15 ? int64_t{1} << 50 : static_cast<int64_t>(b);
}

}  // namespace

std::string kv_refusal(const KvMemory& m, int64_t blocks, const char* flag) {
    const double need = static_cast<double>(blocks + 1) * m.block + m.scratch;
    return fmt::format(
        "the KV cache of {:.0f} positions needs {:.2f} GiB ({:.0f} KiB a token) but {:.2f} of the GPU's {:.2f} GiB is "
        "free, room for about {:.0f} tokens (weights {:.2f} GiB, batch layouts and copies {:.2f} GiB); lower {}",
        static_cast<double>(blocks) * m.block_positions, gib(need), m.block / m.block_positions / 1024.0, gib(m.free),
        gib(m.total), static_cast<double>(blocks_in(m, m.free)) * m.block_positions, gib(m.weights), gib(m.layouts),
        flag);
}

int64_t kv_blocks_to_make(const KvMemory& m, const KvRequest& r) {
    if (!(m.block > 0) || !(m.block_positions > 0) || !(m.total > 0) || m.free < 0 || m.free > m.total)
        fail("KV budget: device memory figures out of range (total {}, free {}, block {})", m.total, m.free, m.block);
    if (r.blocks < 1) fail("KV cache of {} blocks out of range (raise {})", r.blocks, r.flag);
    if (!(r.gpu_mem_fraction >= 0 && r.gpu_mem_fraction <= 1))
        fail("--gpu-mem must be a fraction of the GPU's memory in (0, 1] (got {})", r.gpu_mem_fraction);
    const double used = m.total - m.free;
    if (r.gpu_mem_fraction > 0) {
        const int64_t fit = blocks_in(m, r.gpu_mem_fraction * m.total - used);
        if (fit < 1)
            fail("--gpu-mem {}: the weights, batch layouts and scratch already use {:.2f} of {:.2f} GiB; nothing is "
                 "left for the KV cache (raise --gpu-mem)",
                 r.gpu_mem_fraction, gib(used), gib(m.total));
        return r.fill ? std::min(fit, r.max_blocks) : std::min(r.blocks, fit);
    }
    if (r.fill) {
        const int64_t fit = blocks_in(m, m.free - kKvMarginBytes);
        if (fit < 1)
            fail("the weights ({:.2f} GiB), batch layouts ({:.2f} GiB) and scratch leave {:.2f} of {:.2f} GiB free, "
                 "not enough for a KV cache beside the {:.1f} GiB kept free; free GPU memory, or serve a smaller model",
                 gib(m.weights), gib(m.layouts), gib(m.free), gib(m.total), gib(kKvMarginBytes));
        return std::min(fit, r.max_blocks);
    }
    if (static_cast<double>(r.blocks + 1) * m.block + m.scratch > m.free) throw Error(kv_refusal(m, r.blocks, r.flag));
    return r.blocks;
}

std::string kv_budget_summary(const KvMemory& m, int64_t blocks_made, double free_after, const char* kv_type) {
    const double per_token = m.block / m.block_positions;
    return fmt::format(
        "KV cache {:.0f} tokens × {:.0f} KiB ({}) = {:.2f} GiB; weights {:.2f} GiB, batch layouts and copies {:.2f} GiB; "
        "{:.2f} of {:.2f} GiB free (about {:.0f} more tokens)",
        static_cast<double>(blocks_made) * m.block_positions, per_token / 1024.0, kv_type,
        gib(static_cast<double>(blocks_made + 1) * m.block), gib(m.weights), gib(m.layouts), gib(free_after),
        gib(m.total), std::floor(std::max(0.0, free_after) / per_token));
}

}  // namespace quern
