#include "backend/cpu/moe_route.h"

#include <algorithm>
#include <cmath>

namespace quern {

void moe_route(const float* logits, int64_t n, int64_t n_expert, int64_t k, bool renormalise, int32_t* experts,
               float* weights) {
    std::vector<double> p(static_cast<size_t>(n_expert));
    std::vector<int32_t> idx(static_cast<size_t>(n_expert));
    for (int64_t r = 0; r < n; ++r) {
        const float* l = logits + r * n_expert;
        const float mx = *std::max_element(l, l + n_expert);
        double sum = 0;
        for (int64_t x = 0; x < n_expert; ++x) sum += p[static_cast<size_t>(x)] = std::exp(static_cast<double>(l[x] - mx));
        for (int64_t x = 0; x < n_expert; ++x) {
            p[static_cast<size_t>(x)] /= sum;
            idx[static_cast<size_t>(x)] = static_cast<int32_t>(x);
        }
        std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
            const double pa = p[static_cast<size_t>(a)], pb = p[static_cast<size_t>(b)];
            return pa > pb || (pa == pb && a < b);
        });
        double chosen = 0;
        for (int64_t j = 0; j < k; ++j) chosen += p[static_cast<size_t>(idx[static_cast<size_t>(j)])];
        for (int64_t j = 0; j < k; ++j) {
            const int32_t x = idx[static_cast<size_t>(j)];
            experts[r * k + j] = x;
            weights[r * k + j] = static_cast<float>(renormalise ? p[static_cast<size_t>(x)] / chosen : p[static_cast<size_t>(x)]);
        }
    }
}

void moe_group(const int32_t* experts, int64_t n, int64_t k, int64_t n_expert, std::vector<int64_t>& offsets,
               std::vector<int64_t>& entries) {
    offsets.assign(static_cast<size_t>(n_expert + 1), 0);
    for (int64_t e = 0; e < n * k; ++e) ++offsets[static_cast<size_t>(experts[e]) + 1];
    for (int64_t x = 0; x < n_expert; ++x) offsets[static_cast<size_t>(x + 1)] += offsets[static_cast<size_t>(x)];
    entries.resize(static_cast<size_t>(n * k));
    std::vector<int64_t> next(offsets.begin(), offsets.end() - 1);
    for (int64_t e = 0; e < n * k; ++e) entries[static_cast<size_t>(next[static_cast<size_t>(experts[e])]++)] = e;
}

}  // namespace quern
