#include "backend/cpu/delta_rule.h"

#include "backend/cpu/delta_rule_impl.h"

namespace quern::cpu {

// Defined in delta_rule_avx2.cpp.
void delta_rule_tokens_avx2(const DeltaRuleRun& r, float* S, float* mem);
void delta_rule_chunked_avx2(const DeltaRuleRun& r, float* S, int64_t chunk, std::vector<float>& scratch);

namespace {
const bool kHaveAvx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

void delta_rule_tokens(const DeltaRuleRun& r, float* S, float* mem) {
    if (kHaveAvx2) return delta_rule_tokens_avx2(r, S, mem);
    tokens_impl(r, S, mem);
}

void delta_rule_chunked(const DeltaRuleRun& r, float* S, int64_t chunk, std::vector<float>& scratch) {
    if (kHaveAvx2) return delta_rule_chunked_avx2(r, S, chunk, scratch);
    chunked_impl(r, S, chunk, scratch);
}

}  // namespace quern::cpu
