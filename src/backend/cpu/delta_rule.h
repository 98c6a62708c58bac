// The gated delta rule of one value head over a run of tokens (Yang et al.
// 2024, "Gated Delta Networks: Improving Mamba2 with Delta Rule"): the state
// S (dk × dv, row a of dv floats per key element) carried across tokens,
//   S_t = e^{g_t} S_{t-1} + k_t δ_tᵀ,  δ_t = β_t (v_t − e^{g_t} S_{t-1}ᵀ k_t),
//   o_t = S_tᵀ q_t.
// Token by token (the decode step; passes that must be batch-invariant), or
// in chunks (the WY form of the recurrence, as the FLA kernels compute it):
// within a chunk of n tokens with cumulative log decays G_i = g_0 + .. + g_i,
//   δ = (I + L)⁻¹ β ⊙ (V − e^{G} K S_0),  L_ir = β_i e^{G_i − G_r} k_i·k_r (r < i)
//   o_i = e^{G_i} S_0ᵀ q_i + Σ_{s ≤ i} e^{G_i − G_s} (q_i·k_s) δ_s
//   S_n = e^{G_{n−1}} S_0 + Σ_s e^{G_{n−1} − G_s} k_s δ_sᵀ
// — the same values up to rounding, with the work in small matrix products
// and the state read once per chunk rather than once per token. Scalar
// reference and tests: tests/kernel/delta_rule_test.cpp.
#pragma once
#include <cstdint>
#include <vector>

namespace quern::cpu {

/// One head's inputs for T tokens: token t's q and k (dk floats) at
/// q + t·ld_qk and k + t·ld_qk, v (dv floats) at v + t·ld_v, its log decay
/// g[t] (<= 0) and β[t]; outputs o + t·ld_o (dv floats).
struct DeltaRuleRun {
    const float* q = nullptr;
    const float* k = nullptr;
    const float* v = nullptr;
    int64_t ld_qk = 0, ld_v = 0;
    const float* g = nullptr;
    const float* beta = nullptr;
    float* o = nullptr;
    int64_t ld_o = 0;
    int64_t T = 0, dk = 0, dv = 0;
};

/// Token by token: S (dk × dv) updated in place. `mem`: dv floats of scratch.
void delta_rule_tokens(const DeltaRuleRun& r, float* S, float* mem);

/// In chunks of `chunk` tokens (the WY form above). `scratch` is grown as
/// needed and may be reused between calls.
void delta_rule_chunked(const DeltaRuleRun& r, float* S, int64_t chunk, std::vector<float>& scratch);

}  // namespace quern::cpu
