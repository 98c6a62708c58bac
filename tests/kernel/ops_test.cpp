// CPU ops against straightforward double-precision references on fresh random data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/fp16.h"
#include "quant/reference.h"

using namespace quern;

namespace {
std::mt19937 make_rng() {
    const unsigned seed = std::random_device{}();
    std::printf("seed %u\n", seed);
    return std::mt19937(seed);
}
std::vector<float> randn(std::mt19937& rng, size_t n, float sd = 1.0f) {
    std::normal_distribution<float> d(0.0f, sd);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}
}  // namespace

TEST(Ops, RmsNorm) {
    auto rng = make_rng();
    const int64_t n = 5, dim = 576;
    auto x = randn(rng, n * dim, 3.0f), w = randn(rng, dim);
    std::vector<float> y(n * dim, NAN);
    cpu::rms_norm(x.data(), w.data(), y.data(), n, dim, 1e-5f);
    for (int64_t r = 0; r < n; ++r) {
        double ss = 0;
        for (int64_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
        const double s = 1.0 / std::sqrt(ss / dim + 1e-5);
        for (int64_t i = 0; i < dim; ++i) EXPECT_NEAR(y[r * dim + i], x[r * dim + i] * s * w[i], 1e-5) << r << "," << i;
    }
    // in place
    auto x2 = x;
    cpu::rms_norm(x2.data(), w.data(), x2.data(), n, dim, 1e-5f);
    for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(x2[i], y[i]);
}

TEST(Ops, RopeNormalAndNeox) {
    auto rng = make_rng();
    const int n = 4, heads = 3, hd = 64, rd = 48;
    std::vector<int32_t> pos{0, 1, 7, 1000};
    std::vector<float> ff(rd / 2);
    for (auto& f : ff) f = 1.0f + std::uniform_real_distribution<float>(0, 3)(rng);
    for (bool neox : {false, true}) {
        for (bool use_ff : {false, true}) {
            auto x = randn(rng, size_t(n) * heads * hd);
            auto y = x;
            cpu::rope(y.data(), pos.data(), n, heads, hd, rd, 10000.0f, neox, use_ff ? ff.data() : nullptr);
            for (int t = 0; t < n; ++t)
                for (int h = 0; h < heads; ++h) {
                    const float* a = &x[(size_t(t) * heads + h) * hd];
                    const float* b = &y[(size_t(t) * heads + h) * hd];
                    for (int i = 0; i < rd / 2; ++i) {
                        double th = pos[t] * std::pow(10000.0, -2.0 * i / rd);
                        if (use_ff) th /= ff[i];
                        const int i0 = neox ? i : 2 * i, i1 = neox ? i + rd / 2 : 2 * i + 1;
                        EXPECT_NEAR(b[i0], a[i0] * std::cos(th) - a[i1] * std::sin(th), 2e-4);
                        EXPECT_NEAR(b[i1], a[i0] * std::sin(th) + a[i1] * std::cos(th), 2e-4);
                    }
                    for (int i = rd; i < hd; ++i) EXPECT_EQ(b[i], a[i]);  // beyond rope_dim untouched
                }
        }
    }
}

TEST(Ops, SwigluAndAdd) {
    auto rng = make_rng();
    auto g = randn(rng, 1000, 4.0f), u = randn(rng, 1000);
    // extremes: exp must neither overflow nor lose the sign
    const float ext[] = {-100.0f, -88.5f, -20.0f, -0.0f, 0.0f, 20.0f, 88.5f, 100.0f};
    for (int i = 0; i < 8; ++i) g[static_cast<size_t>(i * 7)] = ext[i];
    std::vector<float> o(1000, NAN);
    cpu::swiglu(g.data(), u.data(), o.data(), 1000);
    for (int i = 0; i < 1000; ++i) EXPECT_NEAR(o[i], g[i] / (1 + std::exp(-double(g[i]))) * u[i], 1e-5 * (1 + std::fabs(g[i] * u[i])));
    auto y = u;
    cpu::add_inplace(y.data(), g.data(), 1000);
    for (int i = 0; i < 1000; ++i) EXPECT_EQ(y[i], u[i] + g[i]);
}

TEST(Ops, GetRowsDequantizesAndChecksIds) {
    auto rng = make_rng();
    const int64_t dim = 64, rows = 10;
    auto src = randn(rng, dim * rows);
    std::vector<uint8_t> q(row_size(DType::Q8_0, dim) * rows);
    for (int64_t r = 0; r < rows; ++r) quantize_row_ref(DType::Q8_0, &src[r * dim], &q[r * row_size(DType::Q8_0, dim)], dim);
    Tensor t = Tensor::contiguous(DType::Q8_0, {dim, rows, 1, 1}, q.data(), "emb");
    std::vector<int32_t> ids{3, 0, 9, 3};
    std::vector<float> out(ids.size() * dim, NAN), ref(dim);
    cpu::get_rows(t, ids.data(), 4, out.data());
    for (size_t i = 0; i < ids.size(); ++i) {
        dequantize_row_ref(DType::Q8_0, t.row(ids[i]), ref.data(), dim);
        for (int64_t j = 0; j < dim; ++j) EXPECT_EQ(out[i * dim + j], ref[j]);
    }
    int32_t bad = 10;
    EXPECT_THROW(cpu::get_rows(t, &bad, 1, out.data()), Error);
    bad = -1;
    EXPECT_THROW(cpu::get_rows(t, &bad, 1, out.data()), Error);
}

TEST(Ops, CausalGqaAttention) {
    auto rng = make_rng();
    const int n_head = 6, n_kv = 2, hd = 40, ctx = 150;
    const int64_t kvs = n_kv * hd;
    auto k = randn(rng, size_t(ctx) * kvs), v = randn(rng, size_t(ctx) * kvs);
  for (int n : {3, 20, 100}) {
    // few queries: any positions within the cache; many (the GEMM path): a
    // chunk of consecutive positions appended after earlier ones
    std::vector<int32_t> pos{0, 5, 36};
    if (n > 3) {
        pos.clear();
        for (int t = 0; t < n; ++t) pos.push_back(ctx - n + t);
    }
    auto q = randn(rng, size_t(n) * n_head * hd);
    std::vector<float> out(size_t(n) * n_head * hd, NAN);
    const float scale = 1.0f / std::sqrt(float(hd));
    for (int threads : {1, 3}) {
        ThreadPool pool(threads);
        cpu::attention(q.data(), k.data(), v.data(), kvs, pos.data(), n, n_head, n_kv, hd, scale, out.data(), pool);
        for (int t = 0; t < n; ++t)
            for (int h = 0; h < n_head; ++h) {
                const int kh = h / (n_head / n_kv);
                std::vector<double> s(pos[t] + 1);
                double mx = -1e300, sum = 0;
                for (int p = 0; p <= pos[t]; ++p) {
                    double d = 0;
                    for (int i = 0; i < hd; ++i) d += double(q[(t * n_head + h) * hd + i]) * k[p * kvs + kh * hd + i];
                    s[p] = d * scale;
                    mx = std::max(mx, s[p]);
                }
                for (auto& x : s) sum += (x = std::exp(x - mx));
                for (int i = 0; i < hd; ++i) {
                    double o = 0;
                    for (int p = 0; p <= pos[t]; ++p) o += s[p] / sum * v[p * kvs + kh * hd + i];
                    EXPECT_NEAR(out[(t * n_head + h) * hd + i], o, 1e-4) << t << " " << h << " " << i;
                }
            }
    }
  }
}

TEST(Ops, Softmax) {
    std::vector<float> x{1000.0f, 1001.0f, -5.0f};
    cpu::softmax(x.data(), 3);
    EXPECT_NEAR(x[0] + x[1] + x[2], 1.0, 1e-6);
    EXPECT_NEAR(x[1] / x[0], std::exp(1.0), 1e-4);
}

// Paged attention equals contiguous attention on the same keys and values
// (bit for bit on the row-by-row path), and a row's output does not depend on
// the other rows evaluated with it.
TEST(Ops, PagedAttentionMatchesContiguous) {
    std::mt19937 rng(20261130);
    std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
    const int n_head = 8, n_head_kv = 2, hd = 32, kvd = n_head_kv * hd;
    const int64_t L = 70, bs = 16, nblk = (L + bs - 1) / bs;
    std::vector<float> k(static_cast<size_t>(L * kvd)), v(k.size());
    for (auto& x : k) x = ud(rng);
    for (auto& x : v) x = ud(rng);
    // Paged copy with a scrambled block table (blocks 0..nblk-1 in a pool of 8).
    std::vector<int32_t> table = {5, 2, 7, 0, 3};
    std::vector<float> pk(static_cast<size_t>(8 * bs * kvd), NAN), pv(pk.size(), NAN);
    for (int64_t p = 0; p < L; ++p) {
        const int64_t row = table[static_cast<size_t>(p / bs)] * bs + p % bs;
        std::copy_n(k.data() + p * kvd, kvd, pk.data() + row * kvd);
        std::copy_n(v.data() + p * kvd, kvd, pv.data() + row * kvd);
    }
    ASSERT_GE(static_cast<int64_t>(table.size()), nblk);
    const int64_t n = 6;
    std::vector<float> q(static_cast<size_t>(n * n_head * hd));
    for (auto& x : q) x = ud(rng);
    std::vector<int32_t> pos = {3, 15, 16, 40, 64, 69};
    ThreadPool pool(2);
    std::vector<float> a(q.size()), b(q.size());
    cpu::attention(q.data(), k.data(), v.data(), kvd, pos.data(), n, n_head, n_head_kv, hd, 0.2f, a.data(), pool);
    const cpu::PagedKv view{pk.data(), pv.data(), table.data(), bs, kvd};
    cpu::attention_paged(q.data(), view, pos.data(), n, n_head, n_head_kv, hd, 0.2f, b.data(), pool);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
    // Row 4 alone gives the same bits as within the batch.
    std::vector<float> c(static_cast<size_t>(n_head * hd));
    cpu::attention_paged(q.data() + 4 * n_head * hd, view, pos.data() + 4, 1, n_head, n_head_kv, hd, 0.2f, c.data(),
                         pool);
    EXPECT_EQ(0, std::memcmp(c.data(), b.data() + 4 * n_head * hd, c.size() * sizeof(float)));
    // Several sequences in one call give each sequence's own bits: rows 0-2
    // and 3-5 as two sequences over the same cache, and row 4 again as a third.
    std::vector<float> d(q.size(), NAN), e(static_cast<size_t>(n_head * hd), NAN);
    const cpu::PagedAttnSeq seqs[3] = {{q.data(), view, pos.data(), 3, d.data()},
                                       {q.data() + 3 * n_head * hd, view, pos.data() + 3, 3, d.data() + 3 * n_head * hd},
                                       {q.data() + 4 * n_head * hd, view, pos.data() + 4, 1, e.data()}};
    for (int threads : {1, 3}) {
        ThreadPool p2(threads);
        cpu::attention_paged_batch(seqs, 3, n_head, n_head_kv, hd, 0.2f, p2);
        EXPECT_EQ(0, std::memcmp(d.data(), b.data(), d.size() * sizeof(float)));
        EXPECT_EQ(0, std::memcmp(e.data(), c.data(), e.size() * sizeof(float)));
    }
}

TEST(Ops, GegluTanhSoftcapScale) {
    auto rng = make_rng();
    auto g = randn(rng, 1000, 4.0f), u = randn(rng, 1000);
    std::vector<float> o(1000, NAN);
    cpu::geglu_tanh(g.data(), u.data(), o.data(), 1000);
    for (int i = 0; i < 1000; ++i) {
        const double x = g[i];
        const double ref = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))) * u[i];
        EXPECT_NEAR(o[i], ref, 1e-5 * (1 + std::fabs(ref))) << i;
    }
    auto y = g;
    cpu::softcap(y.data(), 1000, 3.0f);
    for (int i = 0; i < 1000; ++i) EXPECT_NEAR(y[i], 3.0 * std::tanh(g[i] / 3.0), 1e-5) << i;
    y = g;
    cpu::scale(y.data(), 1000, 0.5f);
    for (int i = 0; i < 1000; ++i) EXPECT_EQ(y[i], g[i] * 0.5f);
}

// A contiguous cache's rows copied into a paged one of blocks of 16 in a
// scrambled order (block b of the sequence at pool block (b * mul + add) % n).
struct ScrambledPages {
    std::vector<int32_t> table;
    std::vector<float> k, v;
    cpu::PagedKv view;
    ScrambledPages(const std::vector<float>& kc, const std::vector<float>& vc, int64_t ctx, int64_t kvs, int64_t mul,
                   int64_t add) {
        const int64_t bs = 16, nblk = (ctx + bs - 1) / bs;
        table.resize(static_cast<size_t>(nblk));
        for (int64_t b = 0; b < nblk; ++b) table[static_cast<size_t>(b)] = static_cast<int32_t>((b * mul + add) % nblk);
        k.assign(static_cast<size_t>(nblk * bs * kvs), NAN);
        v.assign(k.size(), NAN);
        for (int64_t p = 0; p < ctx; ++p) {
            const int64_t row = table[static_cast<size_t>(p / bs)] * bs + p % bs;
            std::copy_n(kc.data() + p * kvs, kvs, k.data() + row * kvs);
            std::copy_n(vc.data() + p * kvs, kvs, v.data() + row * kvs);
        }
        view = cpu::PagedKv{k.data(), v.data(), table.data(), bs, kvs};
    }
};

// Sliding windows (query at p sees p - window + 1 .. p) and soft-capped scores
// against a double reference, on the row path (vectorized head sizes and
// not), the GEMM path, and a paged cache whose windows start mid-block.
TEST(Ops, SlidingWindowAndSoftcapAttention) {
    auto rng = make_rng();
    for (int hd : {40, 12}) {
        const int n_head = 4, n_kv = 2, ctx = 150;
        const int64_t kvs = n_kv * hd;
        auto k = randn(rng, size_t(ctx) * kvs), v = randn(rng, size_t(ctx) * kvs);
        const ScrambledPages pages(k, v, ctx, kvs, 7, 3);
        const cpu::PagedKv& view = pages.view;
        const float scale = 1.0f / std::sqrt(float(hd));
        for (int n : {3, 20, 100})
            for (int64_t window : {1, 7, 40})
                for (float cap : {0.0f, 1.5f}) {
                    std::vector<int32_t> pos{0, 5, 36};
                    if (n > 3) {
                        pos.clear();
                        for (int t = 0; t < n; ++t) pos.push_back(ctx - n + t);
                    }
                    auto q = randn(rng, size_t(n) * n_head * hd);
                    std::vector<float> out(size_t(n) * n_head * hd, NAN), paged(out.size(), NAN);
                    ThreadPool pool(2);
                    cpu::attention(q.data(), k.data(), v.data(), kvs, pos.data(), n, n_head, n_kv, hd, scale,
                                   out.data(), pool, window, cap);
                    cpu::attention_paged(q.data(), view, pos.data(), n, n_head, n_kv, hd, scale, paged.data(), pool,
                                         window, cap);
                    for (int t = 0; t < n; ++t)
                        for (int h = 0; h < n_head; ++h) {
                            const int kh = h / (n_head / n_kv);
                            const int lo = std::max<int>(0, pos[t] - static_cast<int>(window) + 1);
                            std::vector<double> s(pos[t] + 1, 0.0);
                            double mx = -1e300, sum = 0;
                            for (int p = lo; p <= pos[t]; ++p) {
                                double d = 0;
                                for (int i = 0; i < hd; ++i)
                                    d += double(q[(t * n_head + h) * hd + i]) * k[p * kvs + kh * hd + i];
                                s[p] = cap > 0 ? cap * std::tanh(d * scale / cap) : d * scale;
                                mx = std::max(mx, s[p]);
                            }
                            for (int p = lo; p <= pos[t]; ++p) sum += (s[p] = std::exp(s[p] - mx));
                            for (int i = 0; i < hd; ++i) {
                                double o = 0;
                                for (int p = lo; p <= pos[t]; ++p) o += s[p] / sum * v[p * kvs + kh * hd + i];
                                const size_t at = size_t((t * n_head + h) * hd + i);
                                EXPECT_NEAR(out[at], o, 1e-4) << "hd " << hd << " n " << n << " window " << window
                                                              << " cap " << cap << " row " << t;
                                EXPECT_NEAR(paged[at], o, 1e-4) << "paged hd " << hd << " n " << n << " window "
                                                                << window << " cap " << cap << " row " << t;
                            }
                        }
                }
    }
}

// Attention sinks (gpt-oss; transformers' eager attention with s_aux): each
// head's sink logit joins its softmax denominator and weighs no value. Against
// a double reference, with windows, on the row path (vectorized head sizes
// and not), the GEMM path, a paged cache and the batched paged entry point;
// sinks up to several times the scores' scale, so that some heads give most
// of their weight to the sink.
TEST(Ops, AttentionSinksJoinTheDenominator) {
    auto rng = make_rng();
    for (int hd : {40, 12}) {
        const int n_head = 4, n_kv = 2, ctx = 120;
        const int64_t kvs = n_kv * hd;
        auto k = randn(rng, size_t(ctx) * kvs), v = randn(rng, size_t(ctx) * kvs);
        const ScrambledPages pages(k, v, ctx, kvs, 5, 2);
        const cpu::PagedKv& view = pages.view;
        const float scale = 1.0f / std::sqrt(float(hd));
        auto sinks = randn(rng, n_head, 3.0f);
        sinks[0] = 8.0f;  // a head that mostly attends to nothing
        for (int n : {3, 20, 100})
            for (int64_t window : {int64_t{0}, int64_t{7}}) {
                std::vector<int32_t> pos{0, 5, 36};
                if (n > 3) {
                    pos.clear();
                    for (int t = 0; t < n; ++t) pos.push_back(ctx - n + t);
                }
                auto q = randn(rng, size_t(n) * n_head * hd);
                std::vector<float> out(size_t(n) * n_head * hd, NAN), paged(out.size(), NAN), batched(out.size(), NAN);
                ThreadPool pool(2);
                cpu::attention(q.data(), k.data(), v.data(), kvs, pos.data(), n, n_head, n_kv, hd, scale, out.data(),
                               pool, window, 0.0f, sinks.data());
                cpu::attention_paged(q.data(), view, pos.data(), n, n_head, n_kv, hd, scale, paged.data(), pool, window,
                                     0.0f, sinks.data());
                const cpu::PagedAttnSeq seq{q.data(), view, pos.data(), n, batched.data()};
                cpu::attention_paged_batch(&seq, 1, n_head, n_kv, hd, scale, pool, window, 0.0f, sinks.data());
                for (int t = 0; t < n; ++t)
                    for (int h = 0; h < n_head; ++h) {
                        const int kh = h / (n_head / n_kv);
                        const int lo = window > 0 ? std::max<int>(0, pos[t] - static_cast<int>(window) + 1) : 0;
                        std::vector<double> s(pos[t] + 1, 0.0);
                        double mx = sinks[h], sum = 0;
                        for (int p = lo; p <= pos[t]; ++p) {
                            double d = 0;
                            for (int i = 0; i < hd; ++i) d += double(q[(t * n_head + h) * hd + i]) * k[p * kvs + kh * hd + i];
                            mx = std::max(mx, s[p] = d * scale);
                        }
                        for (int p = lo; p <= pos[t]; ++p) sum += (s[p] = std::exp(s[p] - mx));
                        sum += std::exp(sinks[h] - mx);
                        for (int i = 0; i < hd; ++i) {
                            double o = 0;
                            for (int p = lo; p <= pos[t]; ++p) o += s[p] / sum * v[p * kvs + kh * hd + i];
                            const size_t at = size_t((t * n_head + h) * hd + i);
                            const auto where = [&] {
                                return ::testing::Message() << "hd " << hd << " n " << n << " window " << window
                                                            << " row " << t << " head " << h;
                            };
                            EXPECT_NEAR(out[at], o, 1e-4) << where();
                            EXPECT_NEAR(paged[at], o, 1e-4) << "paged " << where();
                            EXPECT_NEAR(batched[at], o, 1e-4) << "batched " << where();
                        }
                    }
            }
    }
}

// gpt-oss's clamped SwiGLU against its definition, with gates and ups past
// the clamp on both sides.
TEST(Ops, ClampedSwigluOfGptOss) {
    auto rng = make_rng();
    auto g = randn(rng, 1000, 6.0f), u = randn(rng, 1000, 6.0f);
    std::vector<float> o(1000, NAN);
    cpu::swiglu_oai(g.data(), u.data(), o.data(), 1000, 1.702f, 7.0f);
    int clamped = 0;
    for (int i = 0; i < 1000; ++i) {
        const double x = std::min<double>(g[i], 7.0), y = std::clamp<double>(u[i], -7.0, 7.0);
        clamped += g[i] > 7.0f || std::fabs(u[i]) > 7.0f;
        const double ref = x / (1.0 + std::exp(-1.702 * x)) * (y + 1.0);
        EXPECT_NEAR(o[i], ref, 1e-5 * (1 + std::fabs(ref))) << i;
    }
    EXPECT_GT(clamped, 100);
}
