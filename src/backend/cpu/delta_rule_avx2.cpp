// The gated delta rule kernels compiled with AVX2 + FMA (delta_rule_impl.h).
#include "backend/cpu/delta_rule_impl.h"

namespace quern::cpu {

void delta_rule_tokens_avx2(const DeltaRuleRun& r, float* S, float* mem) { tokens_impl(r, S, mem); }

void delta_rule_chunked_avx2(const DeltaRuleRun& r, float* S, int64_t chunk, std::vector<float>& scratch) {
    chunked_impl(r, S, chunk, scratch);
}

}  // namespace quern::cpu
