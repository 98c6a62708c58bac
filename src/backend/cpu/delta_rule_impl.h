// The gated delta rule kernels' one source (delta_rule.h), compiled twice:
// for the baseline ISA in delta_rule.cpp and with AVX2 + FMA in
// delta_rule_avx2.cpp; the public functions pick one at run time. The loops
// over dv go 8 floats at a time in GCC vector types (SSE pairs on the
// baseline, one AVX register with AVX2), with a scalar tail for widths that
// are not multiples of 8. Include only from those two files: it defines
// functions in an unnamed namespace of whichever includes it.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/delta_rule.h"

// The vector type never crosses a call boundary of another TU (everything
// here is inline in an unnamed namespace), so GCC's ABI note does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace quern::cpu {
namespace {

typedef float V8 __attribute__((vector_size(32)));

inline V8 load8(const float* p) {
    V8 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
inline void store8(float* p, V8 v) { std::memcpy(p, &v, sizeof v); }
inline V8 splat8(float x) { return V8{x, x, x, x, x, x, x, x}; }

/// y[j] = y[j] · a + x[j] · b over n floats.
inline void scale_add(float* y, float a, const float* x, float b, int64_t n) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) store8(y + j, load8(y + j) * splat8(a) + load8(x + j) * splat8(b));
    for (; j < n; ++j) y[j] = y[j] * a + x[j] * b;
}

/// y[j] += x[j] · b over n floats.
inline void axpy(float* y, const float* x, float b, int64_t n) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) store8(y + j, load8(y + j) + load8(x + j) * splat8(b));
    for (; j < n; ++j) y[j] += x[j] * b;
}

inline void tokens_impl(const DeltaRuleRun& r, float* S, float* mem) {
    const int64_t dk = r.dk, dv = r.dv;
    for (int64_t t = 0; t < r.T; ++t) {
        const float* q = r.q + t * r.ld_qk;
        const float* k = r.k + t * r.ld_qk;
        const float* v = r.v + t * r.ld_v;
        const float decay = std::exp(r.g[t]), beta = r.beta[t];
        std::fill(mem, mem + dv, 0.0f);
        for (int64_t i = 0; i < dk; ++i) {  // S ← e^g S; mem = Sᵀ k
            float* row = S + i * dv;
            scale_add(row, decay, row, 0.0f, dv);
            axpy(mem, row, k[i], dv);
        }
        for (int64_t j = 0; j < dv; ++j) mem[j] = (v[j] - mem[j]) * beta;  // the delta
        float* o = r.o + t * r.ld_o;
        std::fill(o, o + dv, 0.0f);
        for (int64_t i = 0; i < dk; ++i) {  // S += k δᵀ; o = Sᵀ q
            float* row = S + i * dv;
            axpy(row, mem, k[i], dv);
            axpy(o, row, q[i], dv);
        }
    }
}

constexpr int kRows = 4;  // chunk rows that share one read of a state row

/// KS[i] = S_0ᵀ k_i and QS[i] = S_0ᵀ q_i for the chunk's n tokens (dv floats
/// each): kRows tokens at a time, 8 columns at a time in registers, so each
/// state row is read n / kRows times rather than 2n.
inline void project_state(const DeltaRuleRun& r, const float* S, const float* Q, const float* K, int64_t n, float* KS,
                          float* QS) {
    const int64_t dk = r.dk, dv = r.dv, dv8 = dv / 8 * 8;
    for (int64_t i0 = 0; i0 < n; i0 += kRows) {
        const int m = static_cast<int>(std::min<int64_t>(kRows, n - i0));
        for (int64_t j = 0; j < dv8; j += 8) {
            V8 ak[kRows] = {}, aq[kRows] = {};
            for (int64_t a = 0; a < dk; ++a) {
                const V8 s = load8(S + a * dv + j);
                for (int ii = 0; ii < m; ++ii) {
                    ak[ii] += s * splat8(K[(i0 + ii) * r.ld_qk + a]);
                    aq[ii] += s * splat8(Q[(i0 + ii) * r.ld_qk + a]);
                }
            }
            for (int ii = 0; ii < m; ++ii) {
                store8(KS + (i0 + ii) * dv + j, ak[ii]);
                store8(QS + (i0 + ii) * dv + j, aq[ii]);
            }
        }
        for (int64_t j = dv8; j < dv; ++j)
            for (int ii = 0; ii < m; ++ii) {
                float ak = 0.0f, aq = 0.0f;
                for (int64_t a = 0; a < dk; ++a) {
                    ak += S[a * dv + j] * K[(i0 + ii) * r.ld_qk + a];
                    aq += S[a * dv + j] * Q[(i0 + ii) * r.ld_qk + a];
                }
                KS[(i0 + ii) * dv + j] = ak;
                QS[(i0 + ii) * dv + j] = aq;
            }
    }
}

/// S ← e^{G_last} S + Σ_s W_s k_s δ_sᵀ (W_s = e^{G_last − G_s}), 8 columns of
/// a state row at a time in a register across the chunk's tokens.
inline void update_state(const DeltaRuleRun& r, float* S, const float* K, const float* D, const float* W, int64_t n,
                         float e_last) {
    const int64_t dk = r.dk, dv = r.dv, dv8 = dv / 8 * 8;
    for (int64_t a = 0; a < dk; ++a) {
        float* row = S + a * dv;
        for (int64_t j = 0; j < dv8; j += 8) {
            V8 acc = load8(row + j) * splat8(e_last);
            for (int64_t s = 0; s < n; ++s) acc += load8(D + s * dv + j) * splat8(W[s] * K[s * r.ld_qk + a]);
            store8(row + j, acc);
        }
        for (int64_t j = dv8; j < dv; ++j) {
            float acc = row[j] * e_last;
            for (int64_t s = 0; s < n; ++s) acc += D[s * dv + j] * (W[s] * K[s * r.ld_qk + a]);
            row[j] = acc;
        }
    }
}

inline float dot(const float* a, const float* b, int64_t n) {
    V8 acc = {};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc += load8(a + i) * load8(b + i);
    float s = 0.0f;
    for (int l = 0; l < 8; ++l) s += acc[l];
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

inline void chunked_impl(const DeltaRuleRun& r, float* S, int64_t chunk, std::vector<float>& scratch) {
    const int64_t dk = r.dk, dv = r.dv, C = std::max<int64_t>(chunk, 1);
    // G, e^G, W (C each); D: the deltas, KS, QS (C × dv each).
    scratch.resize(static_cast<size_t>(3 * C + 3 * C * dv));
    float* G = scratch.data();
    float* eG = G + C;
    float* W = eG + C;
    float* D = W + C;
    float* KS = D + C * dv;
    float* QS = KS + C * dv;
    for (int64_t t0 = 0; t0 < r.T; t0 += C) {
        const int64_t n = std::min(C, r.T - t0);
        const float* Q = r.q + t0 * r.ld_qk;
        const float* K = r.k + t0 * r.ld_qk;
        const float* V = r.v + t0 * r.ld_v;
        float acc = 0.0f;
        for (int64_t i = 0; i < n; ++i) {
            acc += r.g[t0 + i];
            G[i] = acc;
            eG[i] = std::exp(acc);
        }
        project_state(r, S, Q, K, n, KS, QS);
        // δ_i = β_i (v_i − e^{G_i} S_0ᵀ k_i) − Σ_{s<i} β_i e^{G_i − G_s} (k_i·k_s) δ_s
        // (forward substitution: δ_i needs the δ_s before it), and the
        // output o_i = e^{G_i} S_0ᵀ q_i + Σ_{s≤i} e^{G_i − G_s} (q_i·k_s) δ_s.
        for (int64_t i = 0; i < n; ++i) {
            const float* k = K + i * r.ld_qk;
            const float* q = Q + i * r.ld_qk;
            const float* v = V + i * r.ld_v;
            const float b = r.beta[t0 + i];
            float* d = D + i * dv;
            const float* ks = KS + i * dv;
            for (int64_t j = 0; j < dv; ++j) d[j] = b * (v[j] - eG[i] * ks[j]);
            float* o = r.o + (t0 + i) * r.ld_o;
            const float* qs = QS + i * dv;
            for (int64_t j = 0; j < dv; ++j) o[j] = eG[i] * qs[j];
            for (int64_t s = 0; s < i; ++s) {
                const float* kv = K + s * r.ld_qk;
                const float e = std::exp(G[i] - G[s]);
                const float* ds = D + s * dv;
                axpy(d, ds, -(b * e * dot(k, kv, dk)), dv);
                axpy(o, ds, e * dot(q, kv, dk), dv);
            }
            axpy(o, d, dot(q, k, dk), dv);  // s = i: the token's own delta
        }
        const float last = G[n - 1];
        for (int64_t s = 0; s < n; ++s) W[s] = std::exp(last - G[s]);
        update_state(r, S, K, D, W, n, eG[n - 1]);
    }
}

}  // namespace
}  // namespace quern::cpu
