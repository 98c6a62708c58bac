#include "backend/cpu/op_profile.h"

#include <algorithm>
#include <cstdio>

namespace quern::cpu {

void OpProfile::begin_pass(int64_t rows) {
    cur_ = rows == 1 ? &decode_ : &prompt_;
    ++cur_->passes;
    cur_->rows += rows;
}

void OpProfile::add(const std::string& label, double seconds, uint64_t bytes) {
    auto& es = cur_->entries;
    auto it = std::find_if(es.begin(), es.end(), [&](const Entry& e) { return e.label == label; });
    if (it == es.end()) {
        es.push_back({label, seconds, bytes});
    } else {
        it->seconds += seconds;
        it->bytes += bytes;
    }
}

void OpProfile::print(const Table& t, const char* what) {
    if (t.passes == 0) return;
    double total = 0;
    uint64_t bytes = 0;
    for (const Entry& e : t.entries) {
        total += e.seconds;
        bytes += e.bytes;
    }
    std::vector<Entry> order = t.entries;
    std::stable_sort(order.begin(), order.end(), [](const Entry& a, const Entry& b) { return a.seconds > b.seconds; });
    const double n = static_cast<double>(t.passes);
    std::fprintf(stderr, "quern: CPU profile of %s (%lld passes, %lld rows; wall time per op, us per pass):\n", what,
                 static_cast<long long>(t.passes), static_cast<long long>(t.rows));
    for (const Entry& e : order) {
        std::fprintf(stderr, "  %-22s %10.1f us  %5.1f%%", e.label.c_str(), 1e6 * e.seconds / n,
                     100.0 * e.seconds / total);
        if (e.bytes > 0)
            std::fprintf(stderr, "  %8.2f MB  %6.2f GB/s", e.bytes / n / 1e6, e.bytes / e.seconds / 1e9);
        std::fputc('\n', stderr);
    }
    std::fprintf(stderr, "  %-22s %10.1f us", "total", 1e6 * total / n);
    if (bytes > 0) std::fprintf(stderr, "          %8.2f MB  %6.2f GB/s", bytes / n / 1e6, bytes / total / 1e9);
    std::fputc('\n', stderr);
}

void OpProfile::print() const {
    print(decode_, "decode steps");
    print(prompt_, "prompt passes");
}

}  // namespace quern::cpu
