// Host memory checks made before large allocations, so that an oversized
// context fails at once with a clear error instead of swapping or being
// killed later.
#pragma once
#include <cstdint>

namespace quern {

/// Bytes of memory the system can still give this process without swapping:
/// MemAvailable from /proc/meminfo (Linux), else free physical pages; 0 when
/// it cannot be determined (checks are then skipped).
uint64_t available_memory_bytes();

/// Throws quern::Error when a KV cache of `tokens` positions (K and V of
/// `n_layer` layers, `kv_dim` elements of `elem_bytes` each per position) does
/// not fit in available_memory_bytes(); the message gives both sizes and says
/// to lower `flag` (e.g. "-c" or "--kv-tokens").
void check_kv_cache_fits(int64_t tokens, int64_t n_layer, int64_t kv_dim, int64_t elem_bytes, const char* flag);

}  // namespace quern
