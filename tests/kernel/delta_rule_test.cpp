// The gated delta rule kernels (backend/cpu/delta_rule.h) against a scalar
// float64 reference of the recurrence, on fresh random data: token by token
// and in chunks of several sizes (a chunk longer than the run, one token,
// sizes that do not divide it), outputs and the final state, for head sizes
// the models use and odd ones.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/delta_rule.h"

namespace quern::cpu {
namespace {

struct Data {
    int64_t T, dk, dv;
    std::vector<float> q, k, v, g, beta, S0;
};

Data random_data(int64_t T, int64_t dk, int64_t dv, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> uni(0.0f, 1.0f);
    Data d{T, dk, dv, {}, {}, {}, {}, {}, {}};
    const auto unit = [&](std::vector<float>& x, float scale) {  // L2-normalised rows, as the model feeds them
        x.resize(static_cast<size_t>(T * dk));
        for (int64_t t = 0; t < T; ++t) {
            double ss = 0;
            for (int64_t i = 0; i < dk; ++i) ss += std::pow(x[static_cast<size_t>(t * dk + i)] = nd(rng), 2);
            for (int64_t i = 0; i < dk; ++i) x[static_cast<size_t>(t * dk + i)] *= scale / static_cast<float>(std::sqrt(ss));
        }
    };
    unit(d.q, 1.0f / std::sqrt(static_cast<float>(dk)));
    unit(d.k, 1.0f);
    for (int64_t i = 0; i < T * dv; ++i) d.v.push_back(nd(rng));
    for (int64_t t = 0; t < T; ++t) {
        d.g.push_back(t % 17 == 5 ? -8.0f * uni(rng) : -0.3f * uni(rng));  // mostly mild, sometimes a near reset
        d.beta.push_back(uni(rng));
    }
    for (int64_t i = 0; i < dk * dv; ++i) d.S0.push_back(0.3f * nd(rng));
    return d;
}

/// The recurrence in float64, one token at a time.
void reference(const Data& d, std::vector<double>& o, std::vector<double>& S) {
    S.assign(d.S0.begin(), d.S0.end());
    o.assign(static_cast<size_t>(d.T * d.dv), 0.0);
    std::vector<double> mem(static_cast<size_t>(d.dv));
    for (int64_t t = 0; t < d.T; ++t) {
        const double decay = std::exp(static_cast<double>(d.g[static_cast<size_t>(t)]));
        for (auto& s : S) s *= decay;
        for (int64_t j = 0; j < d.dv; ++j) {
            double m = 0;
            for (int64_t a = 0; a < d.dk; ++a) m += S[static_cast<size_t>(a * d.dv + j)] * d.k[static_cast<size_t>(t * d.dk + a)];
            mem[static_cast<size_t>(j)] = d.beta[static_cast<size_t>(t)] * (d.v[static_cast<size_t>(t * d.dv + j)] - m);
        }
        for (int64_t a = 0; a < d.dk; ++a)
            for (int64_t j = 0; j < d.dv; ++j)
                S[static_cast<size_t>(a * d.dv + j)] += d.k[static_cast<size_t>(t * d.dk + a)] * mem[static_cast<size_t>(j)];
        for (int64_t j = 0; j < d.dv; ++j) {
            double x = 0;
            for (int64_t a = 0; a < d.dk; ++a) x += S[static_cast<size_t>(a * d.dv + j)] * d.q[static_cast<size_t>(t * d.dk + a)];
            o[static_cast<size_t>(t * d.dv + j)] = x;
        }
    }
}

double max_rel(const std::vector<float>& got, const std::vector<double>& want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        num = std::max(num, std::abs(got[i] - want[i]));
        den = std::max(den, std::abs(want[i]));
    }
    return num / std::max(den, 1e-30);
}

TEST(DeltaRule, TokensAndChunksMatchTheRecurrence) {
    struct Shape {
        int64_t T, dk, dv;
    };
    uint32_t seed = 11;
    for (const Shape sh : {Shape{100, 16, 16}, Shape{130, 13, 7}, Shape{64, 128, 128}, Shape{1, 8, 8}, Shape{37, 32, 64}}) {
        const Data d = random_data(sh.T, sh.dk, sh.dv, seed++);
        std::vector<double> ro, rS;
        reference(d, ro, rS);
        DeltaRuleRun r;
        r.q = d.q.data();
        r.k = d.k.data();
        r.v = d.v.data();
        r.ld_qk = d.dk;
        r.ld_v = d.dv;
        r.g = d.g.data();
        r.beta = d.beta.data();
        r.ld_o = d.dv;
        r.T = d.T;
        r.dk = d.dk;
        r.dv = d.dv;
        std::vector<float> o(static_cast<size_t>(d.T * d.dv)), S = d.S0, mem(static_cast<size_t>(d.dv));
        r.o = o.data();
        delta_rule_tokens(r, S.data(), mem.data());
        EXPECT_LT(max_rel(o, ro), 1e-5) << sh.T << "x" << sh.dk << "x" << sh.dv << " tokens";
        EXPECT_LT(max_rel(S, rS), 1e-5) << sh.T << "x" << sh.dk << "x" << sh.dv << " tokens, state";
        std::vector<float> scratch;
        for (int64_t chunk : {1, 7, 16, 64, 1000}) {
            S = d.S0;
            std::fill(o.begin(), o.end(), 0.0f);
            delta_rule_chunked(r, S.data(), chunk, scratch);
            EXPECT_LT(max_rel(o, ro), 1e-5) << sh.T << "x" << sh.dk << "x" << sh.dv << " chunks of " << chunk;
            EXPECT_LT(max_rel(S, rS), 1e-5) << sh.T << "x" << sh.dk << "x" << sh.dv << " chunks of " << chunk << ", state";
        }
    }
}

// Strides: q and k inside wider rows ([q | k | v] as the layer holds them),
// outputs into a wider row.
TEST(DeltaRule, StridedRowsMatchPackedOnes) {
    const Data d = random_data(50, 16, 8, 99);
    const int64_t W = 2 * 16 + 8 + 3;  // one row: q, k, v, padding
    std::vector<float> rows(static_cast<size_t>(50 * W), 0.0f);
    for (int64_t t = 0; t < 50; ++t) {
        std::copy_n(d.q.begin() + t * 16, 16, rows.begin() + t * W);
        std::copy_n(d.k.begin() + t * 16, 16, rows.begin() + t * W + 16);
        std::copy_n(d.v.begin() + t * 8, 8, rows.begin() + t * W + 32);
    }
    DeltaRuleRun r{rows.data(), rows.data() + 16, rows.data() + 32, W, W, d.g.data(), d.beta.data(), nullptr, 11, 50, 16, 8};
    std::vector<float> o(static_cast<size_t>(50 * 11)), S = d.S0, scratch;
    r.o = o.data();
    delta_rule_chunked(r, S.data(), 16, scratch);
    std::vector<double> ro, rS;
    reference(d, ro, rS);
    std::vector<float> packed;
    for (int64_t t = 0; t < 50; ++t) packed.insert(packed.end(), o.begin() + t * 11, o.begin() + t * 11 + 8);
    EXPECT_LT(max_rel(packed, ro), 1e-5);
}

}  // namespace
}  // namespace quern::cpu
