// The KV pool's memory budget (backend/kv_budget.h): exact requests, the
// --gpu-mem cap, a server's pool filling the free memory, and the refusals'
// numbers.
#include <gtest/gtest.h>

#include <string>

#include "backend/kv_budget.h"
#include "core/error.h"

namespace quern {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// An 80 GiB device with `free_gib` free; blocks of 16 positions of an 8B
// model's f16 K and V (32 layers × 1024 × 2 × 2 bytes = 128 KiB a token).
KvMemory device(double free_gib) {
    KvMemory m;
    m.total = 80 * kGiB;
    m.free = free_gib * kGiB;
    m.weights = 4.6 * kGiB;
    m.block_positions = 16;
    m.block = 16 * 128 * 1024.0;
    m.scratch = 64 << 20;
    return m;
}

std::string refusal(const KvMemory& m, const KvRequest& r) {
    try {
        kv_blocks_to_make(m, r);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(KvBudget, ExactRequestIsMadeAsAsked) {
    EXPECT_EQ(kv_blocks_to_make(device(70), KvRequest{1024, 0, false, int64_t{1} << 40, "--kv-tokens"}), 1024);
}

TEST(KvBudget, ExactRequestThatCannotFitIsRefusedWithItsNumbers) {
    // 1M tokens at 128 KiB are 128 GiB; 10 GiB hold about 81,000 tokens.
    const KvMemory m = device(10);
    const std::string e = refusal(m, KvRequest{65536, 0, false, int64_t{1} << 40, "--kv-tokens"});
    EXPECT_NE(e.find("1048576 positions"), std::string::npos) << e;
    EXPECT_NE(e.find("128 KiB a token"), std::string::npos) << e;
    EXPECT_NE(e.find("10.00 of the GPU's 80.00 GiB is free"), std::string::npos) << e;
    const double fit = (10 * kGiB - m.scratch) / m.block - 1;
    EXPECT_NE(e.find("about " + std::to_string(static_cast<int64_t>(fit) * 16) + " tokens"), std::string::npos) << e;
    EXPECT_NE(e.find("lower --kv-tokens"), std::string::npos) << e;
}

TEST(KvBudget, FillTakesTheFreeMemoryLessTheMargin) {
    const KvMemory m = device(40);
    const int64_t got = kv_blocks_to_make(m, KvRequest{256, 0, true, int64_t{1} << 40, "-c or --parallel"});
    // The pool, its spare block and the scratch fit in free − margin; one
    // more block would not.
    EXPECT_LE(static_cast<double>(got + 1) * m.block + m.scratch, m.free - kKvMarginBytes);
    EXPECT_GT(static_cast<double>(got + 2) * m.block + m.scratch, m.free - kKvMarginBytes);
    EXPECT_GT(got, 256);
}

TEST(KvBudget, FillStopsAtTheIndexRange) {
    EXPECT_EQ(kv_blocks_to_make(device(79), KvRequest{16, 0, true, 1000, "x"}), 1000);
}

TEST(KvBudget, FillWithNothingLeftIsRefused) {
    const std::string e = refusal(device(1.0), KvRequest{16, 0, true, int64_t{1} << 40, "x"});
    EXPECT_NE(e.find("1.00 of 80.00 GiB free"), std::string::npos) << e;
    EXPECT_NE(e.find("1.5 GiB kept free"), std::string::npos) << e;
}

TEST(KvBudget, GpuMemCapsAnExactRequestAndSizesAFilledOne) {
    // Half of 80 GiB with 30 GiB used leaves 10 GiB for the pool.
    const KvMemory m = device(50);
    const auto fit = static_cast<int64_t>((10 * kGiB - m.scratch) / m.block) - 1;
    EXPECT_EQ(kv_blocks_to_make(m, KvRequest{100, 0.5, false, int64_t{1} << 40, "x"}), 100);
    EXPECT_EQ(kv_blocks_to_make(m, KvRequest{int64_t{1} << 30, 0.5, false, int64_t{1} << 40, "x"}), fit);
    EXPECT_EQ(kv_blocks_to_make(m, KvRequest{100, 0.5, true, int64_t{1} << 40, "x"}), fit);
    const std::string e = refusal(m, KvRequest{100, 0.3, true, int64_t{1} << 40, "x"});
    EXPECT_NE(e.find("--gpu-mem 0.3"), std::string::npos) << e;
    EXPECT_NE(e.find("30.00 of 80.00 GiB"), std::string::npos) << e;
}

TEST(KvBudget, OutOfRangeInputsAreRefused) {
    EXPECT_NE(refusal(device(10), KvRequest{0, 0, false, 1, "--kv-tokens"}).find("raise --kv-tokens"), std::string::npos);
    EXPECT_NE(refusal(device(10), KvRequest{1, 1.5, false, 1, "x"}).find("--gpu-mem"), std::string::npos);
    KvMemory bad = device(10);
    bad.block = 0;
    EXPECT_FALSE(refusal(bad, KvRequest{1, 0, false, 1, "x"}).empty());
}

TEST(KvBudget, SummaryNamesTokensBytesAndWhatIsLeft) {
    const KvMemory m = device(40);
    const std::string s = kv_budget_summary(m, 1024, 20 * kGiB, "f16");
    EXPECT_NE(s.find("KV cache 16384 tokens × 128 KiB (f16)"), std::string::npos) << s;
    EXPECT_NE(s.find("weights 4.60 GiB"), std::string::npos) << s;
    EXPECT_NE(s.find("20.00 of 80.00 GiB free (about 163840 more tokens)"), std::string::npos) << s;
}

}  // namespace
}  // namespace quern
