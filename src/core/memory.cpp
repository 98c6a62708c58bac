#include "core/memory.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"

namespace quern {

uint64_t available_memory_bytes() {
    std::ifstream f("/proc/meminfo");
    std::string line;
    while (std::getline(f, line)) {
        if (line.rfind("MemAvailable:", 0) == 0) {
            std::istringstream is(line.substr(13));
            uint64_t kib = 0;
            if (is >> kib) return kib * 1024;
        }
    }
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

void check_kv_cache_fits(int64_t tokens, int64_t n_layer, int64_t kv_dim, int64_t elem_bytes, const char* flag) {
    const double need = 2.0 * static_cast<double>(tokens) * static_cast<double>(n_layer) *
                        static_cast<double>(kv_dim) * static_cast<double>(elem_bytes);
    const uint64_t have = available_memory_bytes();
    if (have == 0 || need <= static_cast<double>(have)) return;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    const double per_token = need / static_cast<double>(tokens);
    fail("the KV cache for {} tokens needs {:.2f} GiB but only {:.2f} GiB of memory is available; lower {} "
         "(at most ~{} tokens fit)",
         tokens, need / gib, static_cast<double>(have) / gib, flag,
         static_cast<int64_t>(static_cast<double>(have) * 0.9 / per_token));
}

}  // namespace quern
