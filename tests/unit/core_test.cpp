#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/thread_pool.h"

using namespace quern;

TEST(DType, SizesAndNames) {
    EXPECT_EQ(row_size(DType::Q4_K, 512), 2u * 144u);
    EXPECT_EQ(row_size(DType::F16, 7), 14u);
    EXPECT_THROW(row_size(DType::Q8_0, 33), Error);
    EXPECT_EQ(dtype_from_name("q4_k"), DType::Q4_K);
    EXPECT_FALSE(dtype_from_name("q9_x").has_value());
    EXPECT_EQ(dtype_info(99u), nullptr);
}

TEST(Fp16, RoundTripAllHalfValues) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const float f = fp16_to_fp32(static_cast<uint16_t>(h));
        if (std::isnan(f)) {
            EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f))));
            continue;
        }
        EXPECT_EQ(fp32_to_fp16(f), h) << h;
    }
}

TEST(Fp16, RoundsToNearestEven) {
    // Compare against a double-precision nearest-even search over neighbours.
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> u(-70000.f, 70000.f);
    std::uniform_real_distribution<float> small(-1e-4f, 1e-4f);
    for (int i = 0; i < 200000; ++i) {
        const float f = (i & 1) ? u(rng) : small(rng);
        const uint16_t h = fp32_to_fp16(f);
        const double err = std::fabs(static_cast<double>(fp16_to_fp32(h)) - f);
        if (std::isinf(fp16_to_fp32(h))) {
            EXPECT_GE(std::fabs(f), 65504.f);
            continue;
        }
        for (int d : {-1, 1}) {
            const uint16_t n = static_cast<uint16_t>(h + d);
            const float nf = fp16_to_fp32(n);
            if (std::isnan(nf) || std::isinf(nf) || ((n ^ h) & 0x8000)) continue;
            const double nerr = std::fabs(static_cast<double>(nf) - f);
            EXPECT_TRUE(err < nerr || (err == nerr && (h & 1) == 0)) << f;
        }
    }
}

TEST(Bf16, Conversions) {
    EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
    EXPECT_EQ(fp32_to_bf16(bits_to_f32(0x3f808000u)), 0x3f80);  // tie -> even
    EXPECT_EQ(fp32_to_bf16(bits_to_f32(0x3f818000u)), 0x3f82);  // tie -> even (up)
    EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(NAN))));
}

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
    for (int nt : {1, 2, 3}) {
        ThreadPool pool(nt);
        for (int rep = 0; rep < 200; ++rep) {
            std::vector<std::atomic<int>> hits(1000);
            pool.parallel_for(1000, 7, [&](int64_t b, int64_t e, int) {
                for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
            });
            for (auto& h : hits) ASSERT_EQ(h.load(), 1);
        }
    }
}

// share(): the caller always runs fn as thread 0, each worker at most once,
// and work claimed from a shared counter is all done when it returns, over
// many back-to-back regions (workers joining late or not at all).
TEST(ThreadPool, ShareRunsTheCallerAndFinishesClaimedWork) {
    for (int nt : {2, 3, 4}) {
        ThreadPool pool(nt);
        for (int rep = 0; rep < 500; ++rep) {
            std::vector<std::atomic<int>> hits(257), ran(static_cast<size_t>(nt));
            std::atomic<int64_t> next{0};
            pool.share([&](int ith, int nth) {
                EXPECT_EQ(nth, nt);
                ran[static_cast<size_t>(ith)]++;
                for (int64_t i; (i = next.fetch_add(1)) < 257;) hits[static_cast<size_t>(i)]++;
            });
            ASSERT_EQ(ran[0].load(), 1);
            for (auto& r : ran) ASSERT_LE(r.load(), 1);
            for (auto& h : hits) ASSERT_EQ(h.load(), 1);
        }
        // run() after share(): every thread once, whatever joined before.
        std::vector<std::atomic<int>> seen(static_cast<size_t>(nt));
        pool.run([&](int ith, int) { seen[static_cast<size_t>(ith)]++; });
        for (auto& v : seen) EXPECT_EQ(v.load(), 1);
    }
}

TEST(ThreadPool, RunGivesEachThreadItsIndex) {
    ThreadPool pool(3);
    std::vector<std::atomic<int>> seen(3);
    pool.run([&](int ith, int nth) {
        EXPECT_EQ(nth, 3);
        seen[static_cast<size_t>(ith)]++;
    });
    for (auto& s : seen) EXPECT_EQ(s.load(), 1);
}
