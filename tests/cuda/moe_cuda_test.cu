// Mixture-of-experts decode kernels vs CPU references: the routing kernel
// (cuda::moe_route) against the CPU's moe_route (src/model/moe.h), the
// weighted sum of the experts' outputs, and the indexed ("expert") GEMV
// against dequantize_row_ref rows of the selected experts.
//
// Needs a GPU at run time: every test skips cleanly (GTEST_SKIP) where
// CudaContext::device_count() is 0.
//
// Routing: ids must equal the CPU's exactly (ties included: equal logits give
// equal probabilities on both sides and go to the lower index); weights
// within 3e-7 relative (CUDA's double exp may differ from the host's in the
// last bit, which can move a weight by one float ulp).
// Indexed GEMV: as gemv_cuda_test — one activation level is compared with
// the device's view of the quantized activation (reference int8 times fp32
// d), tolerance 2e-5 · Σ|w_k x_k|; two levels with the float activation,
// plus the bound of the second level's rounding, Σ|w_k| · amax_b / (2·127·254).
// Every output is poisoned first (NaN bits) with a guard zone after it that
// must stay intact.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/weights.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "backend/cpu/moe_route.h"
#include "quant/blocks.h"
#include "quant/reference.h"
#include "gemv_test_util.h"

using namespace quern;
using namespace quern::cuda;
using quern::gemv_test::dequantized_activation;
using quern::gemv_test::gaussian_weights;

namespace {

constexpr uint32_t kPoison = 0xFFFFFFFFu;  // NaN as a float, -1 as an int32
constexpr int64_t kGuard = 16;             // elements past the output that must keep the poison

class MoeCudaTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (CudaContext::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
        ctx_ = std::make_unique<CudaContext>(0);
    }
    std::unique_ptr<CudaContext> ctx_;
};

template <class T>
DeviceBuffer to_device(const std::vector<T>& v, CudaContext& ctx) {
    DeviceBuffer b(v.size() * sizeof(T));
    b.upload(v.data(), v.size() * sizeof(T), ctx.stream());
    return b;
}

template <class T>
std::vector<T> from_device(const DeviceBuffer& b, size_t n, CudaContext& ctx) {
    std::vector<T> v(n);
    b.download(v.data(), n * sizeof(T), ctx.stream());
    ctx.synchronize();
    return v;
}

template <class T>
void expect_guard(const std::vector<T>& v, size_t from, const char* what) {
    static_assert(sizeof(T) == 4);
    for (size_t i = from; i < v.size(); ++i) {
        uint32_t bits;
        std::memcpy(&bits, &v[i], 4);
        EXPECT_EQ(bits, kPoison) << what << "[" << i << "] past the output was written";
    }
}

// ---------------------------------------------------------------- routing

// Router logits of a few shapes: 0 Gaussian; 1 Gaussian with ties copied
// onto the largest values (a tie across the top-k boundary, a tie for first
// place); 2 all equal; 3 values on a coarse grid (many ties everywhere);
// 4 a wide range (exp of the smallest underflows to 0 in double).
std::vector<float> route_logits(int n, int pattern, std::mt19937& rng) {
    std::normal_distribution<float> g(0.0f, 2.0f);
    std::vector<float> l(static_cast<size_t>(n));
    for (auto& v : l) v = g(rng);
    switch (pattern) {
        case 1: {
            std::vector<int> order(static_cast<size_t>(n));
            for (int i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
            std::sort(order.begin(), order.end(), [&](int a, int b) { return l[size_t(a)] > l[size_t(b)]; });
            // Copy the largest onto a random other expert, and the 2nd, 3rd
            // and 8th largest onto later-ranked ones (ties at k = 2 and 8).
            std::uniform_int_distribution<int> any(0, n - 1);
            l[static_cast<size_t>(any(rng))] = l[static_cast<size_t>(order[0])];
            const auto at = [&](int rank) -> float& {
                return l[static_cast<size_t>(order[static_cast<size_t>(rank)])];
            };
            for (int r : {1, 2, 7})
                if (r + 3 < n) at(r + 3) = at(r);
            break;
        }
        case 2:
            for (auto& v : l) v = 0.75f;
            break;
        case 3:
            for (auto& v : l) v = std::round(v) * 0.5f;
            break;
        case 4:
            for (size_t i = 0; i < l.size(); ++i) l[i] = i % 3 == 0 ? -900.0f + l[i] : l[i] * 20.0f;
            break;
        default: break;
    }
    return l;
}

void check_route(CudaContext& ctx, const std::vector<float>& logits, int k, bool renormalise,
                 const std::string& label) {
    const int n = static_cast<int>(logits.size());
    std::vector<int32_t> want_ids(static_cast<size_t>(k));
    std::vector<float> want_w(static_cast<size_t>(k));
    quern::moe_route(logits.data(), 1, n, k, renormalise, want_ids.data(), want_w.data());

    DeviceBuffer ld = to_device(logits, ctx);
    DeviceBuffer idd(static_cast<size_t>(k + kGuard) * 4), wd(static_cast<size_t>(k + kGuard) * 4);
    idd.fill_bytes(0xFF, ctx.stream());
    wd.fill_bytes(0xFF, ctx.stream());
    cuda::moe_route(ld.as<float>(), n, k, renormalise, idd.as<int32_t>(), wd.as<float>(), ctx.stream());
    const auto ids = from_device<int32_t>(idd, static_cast<size_t>(k + kGuard), ctx);
    const auto w = from_device<float>(wd, static_cast<size_t>(k + kGuard), ctx);
    for (int j = 0; j < k; ++j) {
        EXPECT_EQ(ids[size_t(j)], want_ids[size_t(j)]) << label << " slot " << j;
        const float ref = want_w[size_t(j)];
        EXPECT_NEAR(w[size_t(j)], ref, 3e-7 * std::fabs(ref)) << label << " slot " << j;
    }
    expect_guard(ids, static_cast<size_t>(k), "ids");
    expect_guard(w, static_cast<size_t>(k), "weights");
}

TEST_F(MoeCudaTest, RouteMatchesCpuIncludingTies) {
    std::mt19937 rng(7);
    for (int n : {8, 60, 128, 256, 1024})
        for (int k : {1, 2, 8, 16}) {
            if (k > n) continue;
            for (bool renorm : {true, false})
                for (int pattern = 0; pattern < 5; ++pattern)
                    for (int rep = 0; rep < 3; ++rep) {
                        const auto l = route_logits(n, pattern, rng);
                        check_route(*ctx_, l, k, renorm,
                                    "n_expert " + std::to_string(n) + " k " + std::to_string(k) +
                                        (renorm ? " renormalised" : " plain") + " pattern " + std::to_string(pattern));
                    }
        }
    // Every expert chosen (k = n_expert) and the smallest bank.
    std::mt19937 rng2(11);
    check_route(*ctx_, route_logits(8, 1, rng2), 8, true, "k = n = 8");
    check_route(*ctx_, route_logits(1, 0, rng2), 1, true, "n = 1");
}

// moe_route_rows and moe_group_rows (the prefill's device routing) against
// the CPU's moe_route and moe_group on fresh logits, rows mixing every logit
// pattern: the same ids and weights per row, the same group offsets, and a
// grouping consistent with them — each entry's row inside its expert's group
// (pos), that row reading the entry's token (src), every row used once. The
// order of the rows inside a group is free (moe_group_rows' contract).
TEST_F(MoeCudaTest, RowsRouteAndGroupOnTheDeviceMatchCpu) {
    std::mt19937 rng(29);
    const cudaStream_t s = ctx_->stream();
    for (int n_expert : {8, 128, 1024})
        for (int k : {2, 8})
            for (int64_t n : {1, 37, 512}) {
                const std::string label =
                    "experts " + std::to_string(n_expert) + " k " + std::to_string(k) + " rows " + std::to_string(n);
                std::vector<float> logits;
                for (int64_t r = 0; r < n; ++r) {
                    const auto l = route_logits(n_expert, static_cast<int>(r % 5), rng);
                    logits.insert(logits.end(), l.begin(), l.end());
                }
                const int64_t m = n * k;
                std::vector<int32_t> want_ids(static_cast<size_t>(m));
                std::vector<float> want_w(static_cast<size_t>(m));
                quern::moe_route(logits.data(), n, n_expert, k, true, want_ids.data(), want_w.data());
                std::vector<int64_t> want_off, entries;
                quern::moe_group(want_ids.data(), n, k, n_expert, want_off, entries);

                DeviceBuffer ld = to_device(logits, *ctx_);
                DeviceBuffer idd(static_cast<size_t>(m + kGuard) * 4), wd(static_cast<size_t>(m + kGuard) * 4),
                    posd(static_cast<size_t>(m + kGuard) * 4), srcd(static_cast<size_t>(m + kGuard) * 4),
                    offd(static_cast<size_t>(n_expert + 1 + kGuard) * 4);
                for (DeviceBuffer* b : {&idd, &wd, &posd, &srcd, &offd}) b->fill_bytes(0xFF, s);
                cuda::moe_route_rows(ld.as<float>(), n, n_expert, k, true, idd.as<int32_t>(), wd.as<float>(), s);
                cuda::moe_group_rows(idd.as<int32_t>(), n, k, n_expert, posd.as<int32_t>(), srcd.as<int32_t>(),
                                     offd.as<int32_t>(), s);
                const auto ids = from_device<int32_t>(idd, static_cast<size_t>(m + kGuard), *ctx_);
                const auto w = from_device<float>(wd, static_cast<size_t>(m + kGuard), *ctx_);
                const auto pos = from_device<int32_t>(posd, static_cast<size_t>(m + kGuard), *ctx_);
                const auto src = from_device<int32_t>(srcd, static_cast<size_t>(m + kGuard), *ctx_);
                const auto off = from_device<int32_t>(offd, static_cast<size_t>(n_expert + 1 + kGuard), *ctx_);
                int bad = 0;
                for (int64_t e = 0; e < m && bad < 5; ++e) {
                    const auto i = static_cast<size_t>(e);
                    if (ids[i] != want_ids[i]) ++bad, ADD_FAILURE() << label << " entry " << e << " expert " << ids[i];
                    if (!(std::fabs(w[i] - want_w[i]) <= 3e-7f * std::fabs(want_w[i])))
                        ++bad, ADD_FAILURE() << label << " entry " << e << " weight " << w[i] << " vs " << want_w[i];
                }
                for (int x = 0; x <= n_expert; ++x)
                    if (off[static_cast<size_t>(x)] != want_off[static_cast<size_t>(x)] && bad++ < 5)
                        ADD_FAILURE() << label << " offset " << x << ": " << off[static_cast<size_t>(x)] << " vs "
                                      << want_off[static_cast<size_t>(x)];
                std::vector<int> used(static_cast<size_t>(m), 0);
                for (int64_t e = 0; e < m && bad < 5; ++e) {
                    const int32_t g = pos[static_cast<size_t>(e)], x = want_ids[static_cast<size_t>(e)];
                    if (g < want_off[static_cast<size_t>(x)] || g >= want_off[static_cast<size_t>(x) + 1]) {
                        ++bad, ADD_FAILURE() << label << " entry " << e << " in row " << g << " outside expert " << x;
                        continue;
                    }
                    ++used[static_cast<size_t>(g)];
                    if (src[static_cast<size_t>(g)] != e / k)
                        ++bad, ADD_FAILURE() << label << " row " << g << " reads token " << src[static_cast<size_t>(g)];
                }
                EXPECT_EQ(std::count(used.begin(), used.end(), 1), m) << label << ": rows used more than once";
                expect_guard(ids, static_cast<size_t>(m), "ids");
                expect_guard(pos, static_cast<size_t>(m), "pos");
                expect_guard(src, static_cast<size_t>(m), "src");
                expect_guard(off, static_cast<size_t>(n_expert + 1), "offsets");
                EXPECT_EQ(bad, 0) << label;
            }
    // Non-finite logits (a NaN row, a row with +inf): each row still names
    // k distinct experts, so no group outgrows the n rows its grid covers.
    {
        const int n_expert = 16, k = 4;
        const int64_t n = 3;
        std::vector<float> logits(static_cast<size_t>(n * n_expert), 0.5f);
        for (int x = 0; x < n_expert; ++x) logits[static_cast<size_t>(x)] = std::numeric_limits<float>::quiet_NaN();
        logits[static_cast<size_t>(n_expert + 5)] = std::numeric_limits<float>::infinity();
        DeviceBuffer ld = to_device(logits, *ctx_), idd(static_cast<size_t>(n * k) * 4), wd(static_cast<size_t>(n * k) * 4);
        cuda::moe_route_rows(ld.as<float>(), n, n_expert, k, true, idd.as<int32_t>(), wd.as<float>(), s);
        const auto ids = from_device<int32_t>(idd, static_cast<size_t>(n * k), *ctx_);
        for (int64_t r = 0; r < n; ++r) {
            std::vector<int32_t> row(ids.begin() + r * k, ids.begin() + (r + 1) * k);
            for (int32_t x : row) EXPECT_TRUE(x >= 0 && x < n_expert) << "row " << r << " expert " << x;
            std::sort(row.begin(), row.end());
            EXPECT_EQ(std::unique(row.begin(), row.end()), row.end()) << "row " << r << " names an expert twice";
        }
    }
    // Ids out of range (a caller's bug) are clamped: every row still lands in a group.
    {
        const std::vector<int32_t> bad_ids = {-5, 3, 7, 100, 2, 2};
        DeviceBuffer di = to_device(bad_ids, *ctx_), dp(6 * 4), ds(6 * 4), dof(5 * 4);
        cuda::moe_group_rows(di.as<int32_t>(), 3, 2, 4, dp.as<int32_t>(), ds.as<int32_t>(), dof.as<int32_t>(), s);
        const auto off = from_device<int32_t>(dof, 5, *ctx_);
        EXPECT_EQ(off, (std::vector<int32_t>{0, 1, 1, 3, 6}));  // experts 0: {-5}; 2: {2, 2}; 3: {3, 7, 100}
    }
    DeviceBuffer b(64);
    EXPECT_ANY_THROW(cuda::moe_group_rows(b.as<int32_t>(), 2, 2, 2000, b.as<int32_t>(), b.as<int32_t>(),
                                          b.as<int32_t>(), s));
    EXPECT_ANY_THROW(cuda::moe_group_rows(nullptr, 2, 2, 8, b.as<int32_t>(), b.as<int32_t>(), b.as<int32_t>(), s));
    EXPECT_ANY_THROW(cuda::moe_route_rows(b.as<float>(), 0, 8, 2, true, b.as<int32_t>(), b.as<float>(), s));
}

// Captured once in a CUDA graph and replayed on new logits, the kernel routes
// every replay anew (no host value is baked into the graph).
TEST_F(MoeCudaTest, RouteReplaysInAGraph) {
    const int n = 128, k = 8;
    DeviceBuffer ld(n * sizeof(float)), idd(k * sizeof(int32_t)), wd(k * sizeof(float));
    const cudaStream_t s = ctx_->stream();
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    QUERN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cuda::moe_route(ld.as<float>(), n, k, true, idd.as<int32_t>(), wd.as<float>(), s);
    QUERN_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    QUERN_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    std::mt19937 rng(3);
    for (int rep = 0; rep < 4; ++rep) {
        const auto l = route_logits(n, rep % 2, rng);
        ld.upload(l.data(), l.size() * sizeof(float), s);
        QUERN_CUDA_CHECK(cudaGraphLaunch(ge, s));
        const auto ids = from_device<int32_t>(idd, k, *ctx_);
        const auto w = from_device<float>(wd, k, *ctx_);
        std::vector<int32_t> want_ids(k);
        std::vector<float> want_w(k);
        quern::moe_route(l.data(), 1, n, k, true, want_ids.data(), want_w.data());
        for (int j = 0; j < k; ++j) {
            EXPECT_EQ(ids[size_t(j)], want_ids[size_t(j)]) << "replay " << rep << " slot " << j;
            EXPECT_NEAR(w[size_t(j)], want_w[size_t(j)], 3e-7 * std::fabs(want_w[size_t(j)])) << "replay " << rep;
        }
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
}

// With a shared expert gate the kernel routes as before and fills slot k:
// id n_expert, weight sigmoid(w · x) (the float dot product within 1e-6 of
// the double one, relative to Σ|w x|), in one launch and in rows of k + 1.
TEST_F(MoeCudaTest, RouteFillsTheSharedExpertSlot) {
    std::mt19937 rng(31);
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (int n : {8, 256})
        for (int k : {2, 8})
            for (int64_t dim : {int64_t{96}, int64_t{2048}})
                for (int pattern : {0, 1, 3}) {
                    const std::string label = "n_expert " + std::to_string(n) + " k " + std::to_string(k) + " dim " +
                                              std::to_string(dim) + " pattern " + std::to_string(pattern);
                    const auto l = route_logits(n, pattern, rng);
                    std::vector<float> x(static_cast<size_t>(dim)), w(x.size());
                    for (auto& v : x) v = g(rng);
                    for (auto& v : w) v = 0.05f * g(rng);
                    std::vector<int32_t> want_ids(static_cast<size_t>(k));
                    std::vector<float> want_w(static_cast<size_t>(k));
                    quern::moe_route(l.data(), 1, n, k, true, want_ids.data(), want_w.data());
                    double dot = 0, mag = 0;
                    for (size_t i = 0; i < x.size(); ++i) dot += double(x[i]) * w[i], mag += std::fabs(double(x[i]) * w[i]);
                    const double gate = 1.0 / (1.0 + std::exp(-dot));

                    DeviceBuffer ld = to_device(l, *ctx_), xd = to_device(x, *ctx_), gd = to_device(w, *ctx_);
                    DeviceBuffer idd(static_cast<size_t>(k + 1 + kGuard) * 4), wd(static_cast<size_t>(k + 1 + kGuard) * 4);
                    idd.fill_bytes(0xFF, ctx_->stream());
                    wd.fill_bytes(0xFF, ctx_->stream());
                    cuda::moe_route(ld.as<float>(), n, k, true, idd.as<int32_t>(), wd.as<float>(), ctx_->stream(),
                                    SharedExpertGate{xd.as<float>(), gd.as<float>(), dim});
                    const auto ids = from_device<int32_t>(idd, static_cast<size_t>(k + 1 + kGuard), *ctx_);
                    const auto wt = from_device<float>(wd, static_cast<size_t>(k + 1 + kGuard), *ctx_);
                    for (int j = 0; j < k; ++j) {
                        EXPECT_EQ(ids[size_t(j)], want_ids[size_t(j)]) << label << " slot " << j;
                        EXPECT_NEAR(wt[size_t(j)], want_w[size_t(j)], 3e-7 * std::fabs(want_w[size_t(j)])) << label;
                    }
                    EXPECT_EQ(ids[size_t(k)], n) << label;
                    EXPECT_NEAR(wt[size_t(k)], gate, 0.25 * 1e-6 * mag + 1e-7) << label;
                    expect_guard(ids, static_cast<size_t>(k + 1), "ids");
                    expect_guard(wt, static_cast<size_t>(k + 1), "weights");
                }
    DeviceBuffer b(64);
    EXPECT_ANY_THROW(cuda::moe_route(b.as<float>(), 8, 2, true, b.as<int32_t>(), b.as<float>(), ctx_->stream(),
                                     SharedExpertGate{nullptr, b.as<float>(), 8}));
}

TEST_F(MoeCudaTest, RouteRejectsBadSizes) {
    DeviceBuffer ld(8 * sizeof(float)), idd(32 * sizeof(int32_t)), wd(32 * sizeof(float));
    const cudaStream_t s = ctx_->stream();
    EXPECT_ANY_THROW(cuda::moe_route(ld.as<float>(), 8, 9, true, idd.as<int32_t>(), wd.as<float>(), s));
    EXPECT_ANY_THROW(cuda::moe_route(ld.as<float>(), 64, 17, true, idd.as<int32_t>(), wd.as<float>(), s));
    EXPECT_ANY_THROW(cuda::moe_route(ld.as<float>(), 2048, 2, true, idd.as<int32_t>(), wd.as<float>(), s));
    EXPECT_ANY_THROW(cuda::moe_route(ld.as<float>(), 8, 0, true, idd.as<int32_t>(), wd.as<float>(), s));
    EXPECT_ANY_THROW(cuda::moe_route(nullptr, 8, 2, true, idd.as<int32_t>(), wd.as<float>(), s));
}

// ---------------------------------------------------------------- weighted sum

TEST_F(MoeCudaTest, WeightedSumMatchesCpu) {
    std::mt19937 rng(5);
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (int k : {1, 2, 8})
        for (int64_t n : {int64_t{256}, int64_t{1000}, int64_t{4096}}) {
            std::vector<float> y(static_cast<size_t>(k * n)), w(static_cast<size_t>(k));
            for (auto& v : y) v = g(rng);
            for (auto& v : w) v = std::fabs(g(rng));
            DeviceBuffer yd = to_device(y, *ctx_), wd = to_device(w, *ctx_);
            DeviceBuffer od(static_cast<size_t>(n + kGuard) * sizeof(float));
            od.fill_bytes(0xFF, ctx_->stream());
            moe_weighted_sum(yd.as<float>(), wd.as<float>(), k, n, od.as<float>(), ctx_->stream());
            const auto out = from_device<float>(od, static_cast<size_t>(n + kGuard), *ctx_);
            for (int64_t i = 0; i < n; ++i) {
                double ref = 0, mag = 0;
                for (int j = 0; j < k; ++j) {
                    const double p = double(w[size_t(j)]) * y[size_t(j * n + i)];
                    ref += p;
                    mag += std::fabs(p);
                }
                ASSERT_NEAR(out[size_t(i)], ref, 1e-6 * mag + 1e-30) << "k " << k << " n " << n << " i " << i;
            }
            expect_guard(out, static_cast<size_t>(n), "out");
        }
}

// ---------------------------------------------------------------- indexed GEMV

// Gaussian with a per-32 scale spread and one all-zero block.
std::vector<float> random_activation(int64_t n, std::mt19937& rng) {
    std::vector<float> x(static_cast<size_t>(n));
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::uniform_real_distribution<float> sc(0.05f, 4.0f);
    for (int64_t i = 0; i < n; i += 32) {
        const float s = sc(rng);
        for (int64_t j = i; j < i + 32; ++j) x[static_cast<size_t>(j)] = s * g(rng);
    }
    for (int j = 32; j < 64 && j < n; ++j) x[static_cast<size_t>(j)] = 0.0f;
    return x;
}


struct IndexedCase {
    int64_t experts, rows, K;
    std::vector<int32_t> ids;  // one per slot; out-of-range ids are clamped
    bool per_slot;
    // The bank uploaded from two tensors, the last expert on its own (as the
    // decode step appends a shared expert to its bank).
    bool last_apart = false;
};

// Runs gemv_indexed on a bank uploaded as one 3-D tensor and compares every
// output with the reference; returns the number of failures.
int run_indexed(CudaContext& ctx, DType t, const IndexedCase& c, int levels, int config, std::mt19937& rng) {
    const int slots = static_cast<int>(c.ids.size());
    const std::vector<uint8_t> w = gaussian_weights(t, c.experts * c.rows, c.K, rng);
    auto* wp = const_cast<uint8_t*>(w.data());
    const Tensor bank = Tensor::contiguous(t, {c.K, c.rows, c.experts, 1}, wp, "bank");
    const Tensor first = Tensor::contiguous(t, {c.K, c.rows, c.experts - 1, 1}, wp, "experts");
    const Tensor last = Tensor::contiguous(t, {c.K, c.rows, 1, 1},
                                           wp + row_size(t, c.K) * static_cast<size_t>((c.experts - 1) * c.rows), "shared");
    const DeviceWeight W = c.last_apart ? upload_weight(ctx, std::vector<const Tensor*>{&first, &last})
                                        : upload_weight(ctx, bank);
    const int64_t xlen = c.per_slot ? slots * c.K : c.K;
    const std::vector<float> x = random_activation(xlen, rng);
    DeviceBuffer xd = to_device(x, ctx), idd = to_device(c.ids, ctx);
    const int64_t ny = slots * c.rows;
    DeviceBuffer yd(static_cast<size_t>(ny + kGuard) * sizeof(float));
    yd.fill_bytes(0xFF, ctx.stream());
    GemvOptions opt;
    opt.config = config;
    const bool quantized = gemv_takes_quantized_activation(t);
    QuantizedActivation xq;
    if (quantized) {
        xq = QuantizedActivation(xlen, levels);
        quantize_activation(ctx, xd.as<float>(), xq);
        gemv_indexed(ctx, W, c.rows, xq, c.per_slot, idd.as<int32_t>(), slots, yd.as<float>(), opt);
    } else {
        gemv_indexed(ctx, W, c.rows, xd.as<float>(), c.per_slot, idd.as<int32_t>(), slots, yd.as<float>(), opt);
    }
    const auto y = from_device<float>(yd, static_cast<size_t>(ny + kGuard), ctx);
    expect_guard(y, static_cast<size_t>(ny), "y");

    const size_t rb = row_size(t, c.K);
    std::vector<float> wr(static_cast<size_t>(c.K));
    int bad = 0;
    for (int s = 0; s < slots; ++s) {
        const int64_t e = std::clamp<int64_t>(c.ids[size_t(s)], 0, c.experts - 1);
        const std::vector<float> xs(x.begin() + (c.per_slot ? s * c.K : 0),
                                    x.begin() + (c.per_slot ? s * c.K : 0) + c.K);
        const std::vector<float> xr = quantized && levels == 1 ? dequantized_activation(xs) : xs;
        for (int64_t r = 0; r < c.rows; ++r) {
            dequantize_row_ref(t, w.data() + static_cast<size_t>(e * c.rows + r) * rb, wr.data(), c.K);
            double ref = 0, mag = 0, second = 0;
            for (int64_t i = 0; i < c.K; ++i) {
                const double p = double(wr[size_t(i)]) * xr[size_t(i)];
                ref += p;
                mag += std::fabs(p);
                if (quantized && levels == 2) {
                    float amax = 0;
                    for (int64_t j = i / 32 * 32; j < i / 32 * 32 + 32; ++j)
                        amax = std::max(amax, std::fabs(xs[size_t(j)]));
                    second += std::fabs(wr[size_t(i)]) * amax / (2.0 * 127.0 * 254.0);
                }
            }
            const double tol = 2e-5 * mag + 1.01 * second + 1e-30;
            const float got = y[static_cast<size_t>(s * c.rows + r)];
            if (!(std::fabs(got - ref) <= tol)) {
                if (bad < 5)
                    ADD_FAILURE() << dtype_name(t) << " slot " << s << " (expert " << e << ") row " << r << ": " << got
                                  << ", reference " << ref << " (tol " << tol << ")";
                ++bad;
            }
        }
    }
    return bad;
}

TEST_F(MoeCudaTest, IndexedGemvMatchesReference) {
    std::mt19937 rng(17);
    // Gate/up shape: every slot reads one activation; rows not a multiple of
    // any block's row group. Down shape: per-slot activations (one long
    // quantized row, slot s at s·K). Ids repeat an expert and, in the last
    // case, leave the range (clamped to the first / last expert).
    const std::vector<IndexedCase> cases = {
        {6, 70, 512, {4, 0, 5}, false},
        {6, 96, 256, {2, 5, 0, 3}, true},
        {8, 64, 256, {7, 7}, true},
        {5, 40, 256, {9, -3}, false},
        {6, 70, 512, {5, 0, 5}, false, true},
        {4, 96, 256, {3, 1, 3}, true, true},
    };
    for (DType t : {DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::Q4_0, DType::Q5_1, DType::Q5_K, DType::Q3_K,
                    DType::Q2_K, DType::NVFP4, DType::F16, DType::BF16, DType::F32, DType::F8_E4M3_B32}) {
        for (const IndexedCase& c : cases)
            for (int levels : {1, 2}) {
                if (!gemv_takes_quantized_activation(t) && levels == 2) continue;
                SCOPED_TRACE(::testing::Message() << dtype_name(t) << " levels " << levels << " rows " << c.rows
                                                  << " K " << c.K << (c.per_slot ? " per-slot" : " shared"));
                EXPECT_EQ(run_indexed(*ctx_, t, c, levels, -1, rng), 0);
            }
    }
}

// Every launch configuration of the table (persistent ones run as their
// non-persistent twin) for one quantized and one float type.
TEST_F(MoeCudaTest, IndexedGemvEveryConfiguration) {
    std::mt19937 rng(19);
    const IndexedCase shared{6, 70, 512, {1, 4}, false}, per_slot{6, 96, 256, {3, 0, 5}, true};
    for (int config = 0; config < gemv_config_count(); ++config)
        for (DType t : {DType::Q4_K, DType::Q8_0, DType::F16})
            for (const IndexedCase* c : {&shared, &per_slot}) {
                SCOPED_TRACE(::testing::Message() << dtype_name(t) << " config " << gemv_config_name(config)
                                                  << (c->per_slot ? " per-slot" : " shared"));
                EXPECT_EQ(run_indexed(*ctx_, t, *c, dtype_is_quantized(t) ? 2 : 1, config, rng), 0);
            }
}

TEST_F(MoeCudaTest, IndexedGemvRejectsBadArguments) {
    std::mt19937 rng(23);
    const std::vector<uint8_t> w = gaussian_weights(DType::Q8_0, 4 * 64, 256, rng);
    const DeviceWeight W =
        upload_weight(*ctx_, Tensor::contiguous(DType::Q8_0, {256, 64, 4, 1}, const_cast<uint8_t*>(w.data()), "b"));
    DeviceBuffer idd(8 * sizeof(int32_t)), yd(8 * 64 * sizeof(float));
    QuantizedActivation shared(256), two(512);
    idd.fill_bytes(0, ctx_->stream());
    int32_t* ids = idd.as<int32_t>();
    float* y = yd.as<float>();
    EXPECT_ANY_THROW(gemv_indexed(*ctx_, W, 48, shared, false, ids, 2, y));   // 48 does not divide 256 rows
    EXPECT_ANY_THROW(gemv_indexed(*ctx_, W, 64, shared, true, ids, 2, y));    // per-slot needs 2 × 256
    EXPECT_ANY_THROW(gemv_indexed(*ctx_, W, 64, two, false, ids, 2, y));      // shared needs 256
    EXPECT_ANY_THROW(gemv_indexed(*ctx_, W, 64, two, true, nullptr, 2, y));   // null ids
    EXPECT_ANY_THROW(gemv_indexed(*ctx_, W, 64, two, true, ids, 0, y));       // no slot
    DeviceBuffer xf(512 * sizeof(float));
    EXPECT_ANY_THROW(gemv_indexed(*ctx_, W, 64, xf.as<float>(), false, ids, 2, y));  // Q8_0 takes Q8 activations
    EXPECT_NO_THROW(gemv_indexed(*ctx_, W, 64, two, true, ids, 2, y));
    ctx_->synchronize();
}


// ---------------------------------------------------------------- the whole expert FFN

// The session's sequence for one token — router GEMV (F32), moe_route,
// gemv_indexed gate and up (Q4_K, shared two-level activation), one
// swiglu_q8_1 over k·F, gemv_indexed down with per-slot activations (Q8_0),
// moe_weighted_sum — captured once in a CUDA graph and replayed on new
// inputs, against the CPU's order of operations in double (dequantized
// weights, float x): the ids must be the CPU's, h within 2e-3 of its largest
// element (two-level activations: ~1/127² of each block's maximum). Both
// bank layouts of the session: gate and up as two banks (a row of gates,
// then one of ups), and as one bank whose matrix e is expert e's gate rows
// then its up rows (one indexed GEMV of 2F rows a slot; the SwiGLU reads
// [gate | up] rows at stride 2F).
void expert_ffn_in_a_graph(CudaContext& ctx, bool one_bank) {
    constexpr int64_t E = 256, F = 256, X = 16;
    constexpr int k = 4;
    std::mt19937 rng(one_bank ? 37 : 31);
    const auto router = gaussian_weights(DType::F32, X, E, rng);
    const auto wg = gaussian_weights(DType::Q4_K, X * F, E, rng);
    const auto wu = gaussian_weights(DType::Q4_K, X * F, E, rng);
    const auto wd = gaussian_weights(DType::Q8_0, X * E, F, rng);
    const auto bank = [&](DType t, int64_t K, int64_t rows, int64_t n, const std::vector<uint8_t>& data) {
        return upload_weight(ctx, Tensor::contiguous(t, {K, rows, n, 1}, const_cast<uint8_t*>(data.data()), "bank"));
    };
    const DeviceWeight R = bank(DType::F32, E, X, 1, router);
    const DeviceWeight G = bank(DType::Q4_K, E, F, X, wg);
    const DeviceWeight U = bank(DType::Q4_K, E, F, X, wu);
    std::vector<uint8_t> wgu;  // expert e: its F gate rows, then its F up rows
    const size_t mb = static_cast<size_t>(F) * row_size(DType::Q4_K, E);
    for (int64_t e = 0; e < X; ++e) {
        wgu.insert(wgu.end(), wg.begin() + e * mb, wg.begin() + (e + 1) * mb);
        wgu.insert(wgu.end(), wu.begin() + e * mb, wu.begin() + (e + 1) * mb);
    }
    const DeviceWeight GU = bank(DType::Q4_K, E, 2 * F, X, wgu);
    const DeviceWeight D = bank(DType::Q8_0, F, E, X, wd);

    DeviceBuffer xd(E * sizeof(float)), logits(X * sizeof(float)), ids(k * sizeof(int32_t)), w(k * sizeof(float));
    DeviceBuffer gu(2 * k * F * sizeof(float)), f(k * F * sizeof(float)), y(k * E * sizeof(float));
    DeviceBuffer h((E + kGuard) * sizeof(float));
    QuantizedActivation xq(E, 2), fq(k * F, 2);
    const cudaStream_t s = ctx.stream();
    h.fill_bytes(0xFF, s);
    ctx.synchronize();

    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    QUERN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    quantize_activation(ctx, xd.as<float>(), xq);
    gemv(ctx, R, xd.as<float>(), logits.as<float>());
    cuda::moe_route(logits.as<float>(), X, k, true, ids.as<int32_t>(), w.as<float>(), s);
    if (one_bank) {
        gemv_indexed(ctx, GU, 2 * F, xq, false, ids.as<int32_t>(), k, gu.as<float>());
        swiglu_q8_1(gu.as<float>(), gu.as<float>() + F, f.as<float>(), fq.q(), fq.info(), k * F, s, fq.q2(),
                    fq.info2(), kGateSiLU, F, 2 * F);
    } else {
        gemv_indexed(ctx, G, F, xq, false, ids.as<int32_t>(), k, gu.as<float>());
        gemv_indexed(ctx, U, F, xq, false, ids.as<int32_t>(), k, gu.as<float>() + k * F);
        swiglu_q8_1(gu.as<float>(), gu.as<float>() + k * F, f.as<float>(), fq.q(), fq.info(), k * F, s, fq.q2(),
                    fq.info2());
    }
    gemv_indexed(ctx, D, E, fq, true, ids.as<int32_t>(), k, y.as<float>());
    moe_weighted_sum(y.as<float>(), w.as<float>(), k, E, h.as<float>(), s);
    QUERN_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    QUERN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

    const auto rows = [](const std::vector<uint8_t>& bank, DType t, int64_t K, int64_t r) {
        std::vector<float> v(static_cast<size_t>(K));
        dequantize_row_ref(t, bank.data() + static_cast<size_t>(r) * row_size(t, K), v.data(), K);
        return v;
    };
    const auto dot = [](const std::vector<float>& a, const std::vector<float>& b) {
        double acc = 0;
        for (size_t i = 0; i < a.size(); ++i) acc += double(a[i]) * b[i];
        return acc;
    };
    std::normal_distribution<float> g01(0.0f, 1.0f);
    for (int rep = 0; rep < 3; ++rep) {
        std::vector<float> x(E);
        for (auto& v : x) v = g01(rng) * 0.1f;
        xd.upload(x.data(), x.size() * sizeof(float), s);
        QUERN_CUDA_CHECK(cudaGraphLaunch(exec, s));
        const auto got_ids = from_device<int32_t>(ids, k, ctx);
        const auto got_h = from_device<float>(h, E + kGuard, ctx);
        expect_guard(got_h, E, "h");

        std::vector<float> l(X);
        for (int64_t e = 0; e < X; ++e) l[size_t(e)] = static_cast<float>(dot(rows(router, DType::F32, E, e), x));
        std::vector<int32_t> want_ids(k);
        std::vector<float> want_w(k);
        quern::moe_route(l.data(), 1, X, k, true, want_ids.data(), want_w.data());
        std::vector<double> ref(E, 0.0);
        for (int j = 0; j < k; ++j) {
            ASSERT_EQ(got_ids[size_t(j)], want_ids[size_t(j)]) << "one bank " << one_bank << " replay " << rep << " slot " << j;
            const int64_t e = want_ids[size_t(j)];
            std::vector<float> a(F);
            for (int64_t i = 0; i < F; ++i) {
                const float gv = static_cast<float>(dot(rows(wg, DType::Q4_K, E, e * F + i), x));
                const float uv = static_cast<float>(dot(rows(wu, DType::Q4_K, E, e * F + i), x));
                a[size_t(i)] = gv / (1.0f + std::exp(-gv)) * uv;
            }
            for (int64_t o = 0; o < E; ++o)
                ref[size_t(o)] += double(want_w[size_t(j)]) * dot(rows(wd, DType::Q8_0, F, e * E + o), a);
        }
        double mx = 0;
        for (double v : ref) mx = std::max(mx, std::fabs(v));
        for (int64_t o = 0; o < E; ++o)
            EXPECT_NEAR(got_h[size_t(o)], ref[size_t(o)], 2e-3 * mx)
                << "one bank " << one_bank << " replay " << rep << " h[" << o << "]";
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
}

TEST_F(MoeCudaTest, ExpertFfnInAGraphMatchesCpu) {
    expert_ffn_in_a_graph(*ctx_, false);
    expert_ffn_in_a_graph(*ctx_, true);
}

}  // namespace
