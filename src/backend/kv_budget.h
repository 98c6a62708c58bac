// How large a device's paged KV cache is made: the arithmetic of the memory
// budget (what the weights left, --gpu-mem's share, the margin kept free),
// apart from any device API so that it can be tested without one.
#pragma once
#include <cstdint>
#include <string>

namespace quern {

/// Bytes in GiB (2^30), for messages.
inline double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

/// Memory kept free when the KV pool is sized to the free memory (no
/// --gpu-mem): what is made after the pool (CUDA graphs of the batch
/// passes, a few small index buffers) and room for the driver, with slack.
inline constexpr double kKvMarginBytes = 1.5 * (1 << 30);

/// The device's memory when the pool is made, in bytes.
struct KvMemory {
    double total = 0;    ///< the device's memory
    double free = 0;     ///< free now: after the weights, batch layouts and scratch
    double weights = 0;  ///< the weights' share of what is used (for the messages)
    double layouts = 0;  ///< batch layouts and copies of the weights (for the messages)
    double block = 0;    ///< one block of positions: K and V of every attention layer
    double block_positions = 0;  ///< positions per block
    double scratch = 0;  ///< made with the pool and growing with it (attention partials), at most this
};

/// What the pool is asked to hold.
struct KvRequest {
    int64_t blocks = 0;        ///< blocks asked for (≥ 1)
    double gpu_mem_fraction = 0;  ///< > 0: the pool's share ends where quern holds this fraction of `total`
    bool fill = false;         ///< make as many blocks as the budget holds (up to max_blocks), not `blocks`
    int64_t max_blocks = int64_t{1} << 40;  ///< the most a filled pool gets (the device's index range)
    const char* flag = "";     ///< the option that sized the request, for the messages
};

/// The blocks to make, one more than that (the pool's spare block) included
/// in the budget. The budget is `gpu_mem_fraction · total − used` with
/// --gpu-mem, else `free − kKvMarginBytes`.
/// - fill: every block the budget holds (at most max_blocks);
/// - gpu_mem_fraction > 0: min(blocks, what the budget holds);
/// - otherwise exactly `blocks`, refused when they need more than is free.
/// quern::Error, with the bytes per token, the free memory and the tokens
/// that would fit, when not even one block fits or an exact request cannot.
int64_t kv_blocks_to_make(const KvMemory& m, const KvRequest& r);

/// The refusal of an exact request for `blocks` blocks: the bytes needed
/// and per token, the free memory and the tokens it holds, the weights and
/// layouts, and `flag` to lower.
std::string kv_refusal(const KvMemory& m, int64_t blocks, const char* flag);

/// One line for the log: the pool's positions and bytes, bytes per token,
/// the weights and layouts, and the memory left (`free_after` bytes) in
/// tokens. `kv_type` names the element type ("f16").
std::string kv_budget_summary(const KvMemory& m, int64_t blocks_made, double free_after, const char* kv_type);

}  // namespace quern
