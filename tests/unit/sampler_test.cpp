#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "core/error.h"
#include "runtime/sampler.h"

using namespace quern;

namespace {
std::vector<float> logits_from_probs(const std::vector<double>& p) {
    std::vector<float> l;
    for (double x : p) l.push_back(static_cast<float>(std::log(x)));
    return l;
}
std::map<int, int> histogram(Sampler& s, const std::vector<float>& l, int n) {
    std::map<int, int> h;
    for (int i = 0; i < n; ++i) h[s.sample(l.data())]++;
    return h;
}
}  // namespace

TEST(Sampler, GreedyIsArgmax) {
    SamplingParams p;
    p.temperature = 0;
    Sampler s(p, 5);
    std::vector<float> l{0.1f, 3.0f, -1.0f, 2.9f, 0.0f};
    EXPECT_EQ(s.sample(l.data()), 1);
}

TEST(Sampler, SeedMakesSamplingReproducible) {
    SamplingParams p;
    p.top_k = 0;
    p.top_p = 1;
    p.min_p = 0;
    p.temperature = 1.0f;
    p.seed = 7;
    std::vector<float> l = logits_from_probs({0.2, 0.3, 0.1, 0.4});
    Sampler a(p, 4), b(p, 4);
    std::vector<int> ra, rb;
    for (int i = 0; i < 100; ++i) {
        ra.push_back(a.sample(l.data()));
        rb.push_back(b.sample(l.data()));
    }
    EXPECT_EQ(ra, rb);
    p.seed = 8;
    Sampler c(p, 4);
    std::vector<int> rc;
    for (int i = 0; i < 100; ++i) rc.push_back(c.sample(l.data()));
    EXPECT_NE(ra, rc);
}

TEST(Sampler, MatchesDistributionAtTemperatureOne) {
    SamplingParams p;
    p.top_k = 0;
    p.top_p = 1;
    p.min_p = 0;
    p.temperature = 1.0f;
    p.seed = 1;
    std::vector<double> probs{0.1, 0.2, 0.3, 0.4};
    auto l = logits_from_probs(probs);
    Sampler s(p, 4);
    const int N = 40000;
    auto h = histogram(s, l, N);
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(h[i] / double(N), probs[i], 0.01) << i;
}

TEST(Sampler, TopKTopPMinP) {
    std::vector<double> probs{0.05, 0.4, 0.3, 0.2, 0.05};
    auto l = logits_from_probs(probs);
    SamplingParams p;
    p.temperature = 1;
    p.seed = 3;
    p.top_p = 1;
    p.min_p = 0;
    p.top_k = 2;
    {
        Sampler s(p, 5);
        auto h = histogram(s, l, 5000);
        EXPECT_EQ(h.size(), 2u);
        EXPECT_TRUE(h.count(1) && h.count(2));
    }
    p.top_k = 0;
    p.top_p = 0.75;  // 0.4 + 0.3 = 0.7 < 0.75 -> also keeps 0.2
    {
        Sampler s(p, 5);
        auto h = histogram(s, l, 5000);
        EXPECT_EQ(h.size(), 3u);
        EXPECT_FALSE(h.count(0) || h.count(4));
    }
    p.top_p = 1;
    p.min_p = 0.6f;  // keeps p >= 0.24: tokens 1 and 2
    {
        Sampler s(p, 5);
        auto h = histogram(s, l, 5000);
        EXPECT_EQ(h.size(), 2u);
        EXPECT_TRUE(h.count(1) && h.count(2));
    }
}

TEST(Sampler, LowTemperatureSharpens) {
    SamplingParams p;
    p.top_k = 0;
    p.top_p = 1;
    p.min_p = 0;
    p.temperature = 0.1f;
    p.seed = 9;
    auto l = logits_from_probs({0.3, 0.35, 0.35 * 0.8});
    Sampler s(p, 3);
    auto h = histogram(s, l, 4000);
    // p_i ∝ p_i^(1/T): (0.3, 0.35, 0.28)^10 normalised -> token 1 has 0.757
    const double w0 = std::pow(0.3, 10), w1 = std::pow(0.35, 10), w2 = std::pow(0.28, 10);
    EXPECT_NEAR(h[1] / 4000.0, w1 / (w0 + w1 + w2), 0.025);
}

TEST(Sampler, Penalties) {
    SamplingParams p;
    p.temperature = 0;
    p.repeat_penalty = 2.0f;
    std::vector<float> l{2.0f, 1.5f, -1.0f};
    Sampler s(p, 3);
    EXPECT_EQ(s.sample(l.data()), 0);
    s.accept(0);  // 2.0 / 2 = 1.0 < 1.5
    EXPECT_EQ(s.sample(l.data()), 1);

    SamplingParams f;
    f.temperature = 0;
    f.frequency_penalty = 0.3f;
    Sampler s2(f, 3);
    s2.accept(0);
    EXPECT_EQ(s2.sample(l.data()), 0);  // 2.0 - 0.3 = 1.7 > 1.5
    s2.accept(0);
    EXPECT_EQ(s2.sample(l.data()), 1);  // 2.0 - 0.6 = 1.4 < 1.5

    SamplingParams pr;
    pr.temperature = 0;
    pr.presence_penalty = 0.6f;
    Sampler s3(pr, 3);
    s3.accept(0);
    s3.accept(0);
    EXPECT_EQ(s3.sample(l.data()), 1);  // 2.0 - 0.6 = 1.4 (once, however often seen)

    // the window forgets old tokens
    SamplingParams w;
    w.temperature = 0;
    w.repeat_penalty = 2.0f;
    w.repeat_last_n = 1;
    Sampler s4(w, 3);
    s4.accept(0);
    s4.accept(2);
    EXPECT_EQ(s4.sample(l.data()), 0);
}

TEST(Sampler, RejectsBadParameters) {
    SamplingParams p;
    p.temperature = -1;
    EXPECT_THROW(Sampler(p, 3), Error);
    p = {};
    p.top_p = 0;
    EXPECT_THROW(Sampler(p, 3), Error);
    p = {};
    p.min_p = 2;
    EXPECT_THROW(Sampler(p, 3), Error);
    p = {};
    EXPECT_THROW(Sampler(p, 0), Error);
}
