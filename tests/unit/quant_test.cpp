// Tests of the scalar reference (de)quantizers (src/quant/reference.*):
//  1. bit-exact agreement with the `gguf` Python package (gguf.quants) on fresh
//     random blocks / floats, through tests/python/dequant_check.py;
//  2. hand-computed cases for Q8_1 and Q8_K (gguf.quants does not know them);
//  3. round-trip accuracy of every quantizer on Gaussian data, outliers and
//     all-zero rows;
//  4. malformed arguments.
// Random data is seeded from std::random_device; set QUERN_TEST_SEED to replay.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "../data/quant/fixture_input.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/fp16.h"
#include "quant/blocks.h"
#include "quant/ref_rows.h"
#include "quant/reference.h"
#include "quant/traits.h"

using namespace quern;
namespace fs = std::filesystem;

namespace {

uint64_t test_seed() {
    static const uint64_t seed = [] {
        if (const char* s = std::getenv("QUERN_TEST_SEED")) return static_cast<uint64_t>(std::strtoull(s, nullptr, 10));
        std::random_device rd;
        return (static_cast<uint64_t>(rd()) << 32) ^ rd();
    }();
    return seed;
}

std::string seed_note() {
    return "seed " + std::to_string(test_seed()) + " (replay with QUERN_TEST_SEED=" + std::to_string(test_seed()) + ")";
}

// A separate, reproducible stream per purpose so that tests do not depend on
// the order in which they run.
std::mt19937_64 rng_for(uint64_t salt) { return std::mt19937_64(test_seed() ^ (salt * 0x9E3779B97F4A7C15ull)); }

std::string type_name(DType t) { return std::string(dtype_name(t)); }

// ------------------------------------------------------------ random inputs

// Any finite binary16 value, subnormals included.
uint16_t random_finite_fp16(std::mt19937_64& rng) {
    const uint32_t r = static_cast<uint32_t>(rng());
    const uint32_t exp = r % 31;  // 0..30, never 31 (inf/NaN)
    return static_cast<uint16_t>(((r >> 8) & 0x8000u) | (exp << 10) | ((r >> 12) & 0x3ffu));
}

// Any finite bfloat16 value.
uint16_t random_finite_bf16(std::mt19937_64& rng) {
    for (;;) {
        const auto h = static_cast<uint16_t>(rng());
        if ((h & 0x7f80u) != 0x7f80u) return h;
    }
}

void put_u16(std::vector<uint8_t>& buf, size_t off, uint16_t v) { std::memcpy(buf.data() + off, &v, 2); }

// Random bytes for n blocks of t, with every fp16 scale made finite.
std::vector<uint8_t> random_blocks(DType t, int64_t n, std::mt19937_64& rng) {
    const auto& info = dtype_info(t);
    std::vector<uint8_t> buf(static_cast<size_t>(n * info.type_size));
    for (auto& b : buf) b = static_cast<uint8_t>(rng());
    std::vector<size_t> fp16_fields;
    switch (t) {
        case DType::F16:
            for (int64_t i = 0; i < n; ++i) put_u16(buf, static_cast<size_t>(2 * i), random_finite_fp16(rng));
            return buf;
        case DType::BF16:
            for (int64_t i = 0; i < n; ++i) put_u16(buf, static_cast<size_t>(2 * i), random_finite_bf16(rng));
            return buf;
        case DType::Q4_0: fp16_fields = {offsetof(block_q4_0, d)}; break;
        case DType::Q4_1: fp16_fields = {offsetof(block_q4_1, d), offsetof(block_q4_1, m)}; break;
        case DType::Q5_0: fp16_fields = {offsetof(block_q5_0, d)}; break;
        case DType::Q5_1: fp16_fields = {offsetof(block_q5_1, d), offsetof(block_q5_1, m)}; break;
        case DType::Q8_0: fp16_fields = {offsetof(block_q8_0, d)}; break;
        case DType::Q8_1: fp16_fields = {offsetof(block_q8_1, d), offsetof(block_q8_1, s)}; break;
        case DType::Q2_K: fp16_fields = {offsetof(block_q2_K, d), offsetof(block_q2_K, dmin)}; break;
        case DType::Q3_K: fp16_fields = {offsetof(block_q3_K, d)}; break;
        case DType::Q4_K: fp16_fields = {offsetof(block_q4_K, d), offsetof(block_q4_K, dmin)}; break;
        case DType::Q5_K: fp16_fields = {offsetof(block_q5_K, d), offsetof(block_q5_K, dmin)}; break;
        case DType::Q6_K: fp16_fields = {offsetof(block_q6_K, d)}; break;
        default: ADD_FAILURE() << "random_blocks: no layout for " << type_name(t); return buf;
    }
    for (int64_t i = 0; i < n; ++i)
        for (size_t off : fp16_fields) put_u16(buf, static_cast<size_t>(i * info.type_size) + off, random_finite_fp16(rng));
    return buf;
}

// Floats for quantizer comparisons: blocks of different character (Gaussian
// at random magnitudes, uniform, small integers and half-integers that hit
// rounding ties, repeated ±max ties, constant, all zero, fp16-subnormal range).
std::vector<float> random_floats(int64_t n, int block, std::mt19937_64& rng) {
    std::vector<float> x(static_cast<size_t>(n));
    std::normal_distribution<float> gauss(0.f, 1.f);
    std::uniform_real_distribution<float> unif(-1.f, 1.f);
    std::uniform_real_distribution<float> log_mag(-6.f, 4.f);
    for (int64_t b = 0; b < n / block; ++b) {
        float* v = x.data() + b * block;
        const float mag = std::pow(10.f, log_mag(rng));
        switch (rng() % 8) {
            case 0:
            case 1:
                for (int j = 0; j < block; ++j) v[j] = gauss(rng) * mag;
                break;
            case 2:
                for (int j = 0; j < block; ++j) v[j] = unif(rng) * mag;
                break;
            case 3:  // multiples of 1/2 up to ±127: exact roundf / truncation ties
                for (int j = 0; j < block; ++j) v[j] = static_cast<float>(static_cast<int>(rng() % 509) - 254) * 0.5f;
                v[rng() % block] = (rng() & 1) ? 127.f : -127.f;
                break;
            case 4: {  // the extreme magnitude appears with both signs
                for (int j = 0; j < block; ++j) v[j] = unif(rng) * mag;
                const float m = 1.5f * mag;
                v[rng() % block] = -m;
                v[rng() % block] = m;
                break;
            }
            case 5: {
                const float c = gauss(rng) * mag;
                for (int j = 0; j < block; ++j) v[j] = c;
                break;
            }
            case 6:
                for (int j = 0; j < block; ++j) v[j] = 0.f;
                break;
            default:  // around the fp16 subnormal range
                for (int j = 0; j < block; ++j) v[j] = gauss(rng) * 1e-6f;
                break;
        }
    }
    return x;
}

std::string hex_bits(float f) {
    char s[16];
    std::snprintf(s, sizeof s, "0x%08x", f32_to_bits(f));
    return s;
}

void write_file(const fs::path& p, const void* data, size_t n) {
    std::ofstream f(p, std::ios::binary);
    f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
    ASSERT_TRUE(f.good()) << "cannot write " << p;
}

std::vector<uint8_t> read_file(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// ------------------------------------------------------------ gguf.quants fixture

const std::vector<DType> kGgufDequantTypes = {DType::F16,  DType::BF16, DType::Q4_0, DType::Q4_1,
                                              DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K,
                                              DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};
const std::vector<DType> kGgufQuantTypes = {DType::F16,  DType::BF16, DType::Q4_0, DType::Q4_1,
                                            DType::Q5_0, DType::Q5_1, DType::Q8_0};

constexpr int64_t kBlocksPerType = 4096;

struct GgufCase {
    std::vector<uint8_t> input;   // raw blocks (dequant) or float32 (quant)
    std::vector<uint8_t> output;  // gguf's answer
};

// Generates the inputs for every type, runs the Python script once for all of
// them and keeps its answers. `skip_reason` is set when Python or gguf is absent.
class GgufReference {
public:
    static GgufReference& get() {
        static GgufReference r;
        return r;
    }
    std::string skip_reason;
    std::string error;
    std::map<DType, GgufCase> dequant, quant;

private:
    GgufReference() {
        const char* py_env = std::getenv("QUERN_PYTHON");
        const std::string python = py_env ? py_env : "python3";
        const fs::path dir = fs::temp_directory_path() / ("quern_quant_test_" + std::to_string(test_seed()) + "_" +
                                                          std::to_string(reinterpret_cast<uintptr_t>(this)));
        fs::create_directories(dir);
        std::ofstream manifest(dir / "manifest.txt");
        auto rng = rng_for(1);
        for (DType t : kGgufDequantTypes) {
            const auto& info = dtype_info(t);
            const int64_t n = info.block_size == 1 ? kBlocksPerType * 32 : kBlocksPerType;
            auto& c = dequant[t];
            c.input = random_blocks(t, n, rng);
            const fs::path in = dir / ("dq_" + type_name(t) + ".bin"), out = dir / ("dq_" + type_name(t) + ".out");
            write_file(in, c.input.data(), c.input.size());
            manifest << "dequant " << info.name << ' ' << in.string() << ' ' << out.string() << '\n';
        }
        for (DType t : kGgufQuantTypes) {
            const auto& info = dtype_info(t);
            const int block = info.block_size == 1 ? 32 : info.block_size;
            const auto x = random_floats(kBlocksPerType * block, block, rng);
            auto& c = quant[t];
            c.input.resize(x.size() * sizeof(float));
            std::memcpy(c.input.data(), x.data(), c.input.size());
            const fs::path in = dir / ("q_" + type_name(t) + ".bin"), out = dir / ("q_" + type_name(t) + ".out");
            write_file(in, c.input.data(), c.input.size());
            manifest << "quant " << info.name << ' ' << in.string() << ' ' << out.string() << '\n';
        }
        manifest.close();

        const std::string script = std::string(QUERN_SOURCE_DIR) + "/tests/python/dequant_check.py";
        const std::string cmd = python + " \"" + script + "\" \"" + (dir / "manifest.txt").string() + "\"";
        const int rc = std::system(cmd.c_str());
        const int status = (rc != -1 && WIFEXITED(rc)) ? WEXITSTATUS(rc) : -1;
        if (status == 127) {
            skip_reason = python + " not found";
        } else if (status == 3) {
            skip_reason = "the gguf or numpy Python package is not installed (tools/install-deps.sh installs it)";
        } else if (status != 0) {
            error = "`" + cmd + "` failed with status " + std::to_string(status);
        } else {
            for (auto& [t, c] : dequant) c.output = read_file(dir / ("dq_" + type_name(t) + ".out"));
            for (auto& [t, c] : quant) c.output = read_file(dir / ("q_" + type_name(t) + ".out"));
        }
        std::error_code ec;
        fs::remove_all(dir, ec);
    }
};

std::string type_param_name(const testing::TestParamInfo<DType>& info) { return type_name(info.param); }

// ------------------------------------------------------------ 1. bit-exact vs gguf

class DequantVsGguf : public testing::TestWithParam<DType> {};

TEST_P(DequantVsGguf, BitExact) {
    auto& ref = GgufReference::get();
    if (!ref.skip_reason.empty()) GTEST_SKIP() << ref.skip_reason;
    ASSERT_TRUE(ref.error.empty()) << ref.error;
    const DType t = GetParam();
    const auto& c = ref.dequant.at(t);
    const auto& info = dtype_info(t);
    const int64_t k = static_cast<int64_t>(c.input.size()) / info.type_size * info.block_size;
    ASSERT_EQ(c.output.size(), static_cast<size_t>(k) * sizeof(float)) << "gguf output size, " << seed_note();

    std::vector<float> y(static_cast<size_t>(k), std::numeric_limits<float>::quiet_NaN());  // poison
    dequantize_row_ref(t, c.input.data(), y.data(), k);
    if (std::memcmp(y.data(), c.output.data(), c.output.size()) != 0) {
        int shown = 0;
        for (int64_t i = 0; i < k && shown < 8; ++i) {
            float want;
            std::memcpy(&want, c.output.data() + i * 4, 4);
            if (f32_to_bits(want) != f32_to_bits(y[static_cast<size_t>(i)])) {
                ADD_FAILURE() << type_name(t) << " element " << i << " (block " << i / info.block_size << "): got "
                              << y[static_cast<size_t>(i)] << " " << hex_bits(y[static_cast<size_t>(i)])
                              << ", gguf " << want << " " << hex_bits(want) << "; " << seed_note();
                ++shown;
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Types, DequantVsGguf, testing::ValuesIn(kGgufDequantTypes), type_param_name);

class QuantVsGguf : public testing::TestWithParam<DType> {};

TEST_P(QuantVsGguf, BitExact) {
    auto& ref = GgufReference::get();
    if (!ref.skip_reason.empty()) GTEST_SKIP() << ref.skip_reason;
    ASSERT_TRUE(ref.error.empty()) << ref.error;
    const DType t = GetParam();
    const auto& c = ref.quant.at(t);
    const auto& info = dtype_info(t);
    const int64_t k = static_cast<int64_t>(c.input.size() / sizeof(float));
    const size_t bytes = row_size(t, k);
    ASSERT_EQ(c.output.size(), bytes) << "gguf output size, " << seed_note();

    std::vector<float> x(static_cast<size_t>(k));
    std::memcpy(x.data(), c.input.data(), c.input.size());
    std::vector<uint8_t> q(bytes, 0xA5);  // poison
    quantize_row_ref(t, x.data(), q.data(), k);
    const size_t unit = static_cast<size_t>(info.type_size);
    int shown = 0;
    for (size_t b = 0; b < bytes / unit && shown < 8; ++b) {
        if (std::memcmp(q.data() + b * unit, c.output.data() + b * unit, unit) != 0) {
            std::string got, want, in;
            for (size_t j = 0; j < unit; ++j) {
                char s[4];
                std::snprintf(s, sizeof s, "%02x", q[b * unit + j]);
                got += s;
                std::snprintf(s, sizeof s, "%02x", c.output[b * unit + j]);
                want += s;
            }
            const int64_t per = info.block_size;
            for (int64_t j = 0; j < per && j < 8; ++j) in += std::to_string(x[b * per + j]) + " ";
            ADD_FAILURE() << type_name(t) << " block " << b << ": got " << got << ", gguf " << want
                          << "; input starts " << in << "; " << seed_note();
            ++shown;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Types, QuantVsGguf, testing::ValuesIn(kGgufQuantTypes), type_param_name);

// ------------------------------------------------------------ 1b. bit-exact vs ggml itself
// Fixtures made by ggml's quantize_row_*_ref (tests/data/quant/README.md):
// the only independent check of the K-quant, Q8_1 and Q8_K quantizers.

/// Block by block, naming the first ones that differ from ggml's.
void expect_blocks_equal(DType t, const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                         const std::string& name) {
    const auto unit = static_cast<size_t>(dtype_info(t).type_size);
    for (size_t b = 0; b < want.size() / unit; ++b)
        EXPECT_EQ(std::memcmp(got.data() + b * unit, want.data() + b * unit, unit), 0)
            << name << " block " << b << " (super-block " << b * dtype_info(t).block_size / 256
            << ") differs from ggml";
}

class QuantVsGgml : public testing::TestWithParam<std::string> {};

TEST_P(QuantVsGgml, BitExact) {
    const DType t = *dtype_from_name(GetParam());
    const auto want = read_file(fs::path(QUERN_SOURCE_DIR) / "tests/data/quant" / ("ggml_" + GetParam() + ".bin"));
    const auto x = quern_fixture::make_input();
    const auto k = static_cast<int64_t>(x.size());
    ASSERT_EQ(want.size(), row_size(t, k)) << "fixture size";
    std::vector<uint8_t> got(want.size(), 0xA5);
    quantize_row_ref(t, x.data(), got.data(), k);
    expect_blocks_equal(t, got, want, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Types, QuantVsGgml,
                         testing::ValuesIn(std::vector<std::string>(std::begin(quern_fixture::kTypes),
                                                                    std::end(quern_fixture::kTypes))),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

// The importance-weighted quantizers against ggml's quantize_<type> with
// quant_weights on the same input, as rows of kImatrixRow.
class QuantWeightedVsGgml : public testing::TestWithParam<std::string> {};

TEST_P(QuantWeightedVsGgml, BitExact) {
    const DType t = *dtype_from_name(GetParam());
    const auto want =
        read_file(fs::path(QUERN_SOURCE_DIR) / "tests/data/quant" / ("ggml_" + GetParam() + "_imatrix.bin"));
    const auto x = quern_fixture::make_input();
    const auto w = quern_fixture::make_importance();
    const int64_t n = quern_fixture::kImatrixRow;
    const size_t rs = row_size(t, n);
    ASSERT_EQ(want.size(), rs * quern_fixture::kImatrixRows) << "fixture size";
    std::vector<uint8_t> got(want.size(), 0xA5);
    for (int r = 0; r < quern_fixture::kImatrixRows; ++r)
        quantize_row_weighted(t, x.data() + r * n, got.data() + r * rs, n, w.data());
    expect_blocks_equal(t, got, want, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Types, QuantWeightedVsGgml,
                         testing::Values("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

// What the weights are for: on fresh random rows whose columns matter very
// unequally, the weighted quantizers' error measured with those weights is
// well below the unweighted ones' (summed over many rows).
TEST(QuantWeighted, WeightsLowerTheWeightedError) {
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(0.0f, 1.0f);
    const int64_t n = 512;
    for (const char* name : {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}) {
        const DType t = *dtype_from_name(name);
        std::vector<float> imp(n);
        for (float& v : imp) v = std::pow(ud(rng), 6.0f) * 100.0f + 1e-3f;  // a few columns dominate
        double err_w = 0, err_u = 0;
        std::vector<float> x(n), back(n);
        std::vector<uint8_t> q(row_size(t, n));
        for (int r = 0; r < 64; ++r) {
            for (float& v : x) v = nd(rng);
            const auto weighted_error = [&] {
                dequantize_row_ref(t, q.data(), back.data(), n);
                double e = 0;
                for (int64_t j = 0; j < n; ++j) e += imp[j] * (back[j] - x[j]) * (back[j] - x[j]);
                return e;
            };
            quantize_row_weighted(t, x.data(), q.data(), n, imp.data());
            err_w += weighted_error();
            quantize_row_ref(t, x.data(), q.data(), n);
            err_u += weighted_error();
        }
        EXPECT_LT(err_w, 0.85 * err_u) << name;
    }
    // Types without importance weights, and null weights, quantize as the reference.
    std::vector<float> x(256), imp(256, 1.0f);
    for (float& v : x) v = nd(rng);
    for (DType t : {DType::Q8_0, DType::Q4_K}) {
        std::vector<uint8_t> a(row_size(t, 256)), b(row_size(t, 256));
        quantize_row_ref(t, x.data(), a.data(), 256);
        quantize_row_weighted(t, x.data(), b.data(), 256, t == DType::Q8_0 ? imp.data() : nullptr);
        EXPECT_EQ(a, b) << dtype_name(t);
    }
}

TEST(QuantVsGgml, FixtureInputHasItsIntendedShape) {
    const auto x = quern_fixture::make_input();
    ASSERT_EQ(x.size(), 4096u);
    for (int j = 0; j < 256; ++j) ASSERT_EQ(x[7 * 256 + j], 0.0f);              // an all-zero block
    for (int j = 1; j < 256; ++j) ASSERT_EQ(x[15 * 256 + j], x[15 * 256]);      // a constant block
    for (int j = 0; j < 16; ++j) ASSERT_EQ(x[3 * 256 + j], 0.0f);               // a zero sub-block
    for (int j = 0; j < 256; ++j) ASSERT_GT(x[4 * 256 + j], 0.0f);              // all positive
    for (int j = 0; j < 256; ++j) ASSERT_LT(x[5 * 256 + j], 0.0f);              // all negative
}

// ------------------------------------------------------------ 2. Q8_1 / Q8_K by definition

TEST(QuantRef, NearestIntRoundsHalfToEven) {
    EXPECT_EQ(ref::nearest_int(2.5f), 2);
    EXPECT_EQ(ref::nearest_int(3.5f), 4);
    EXPECT_EQ(ref::nearest_int(-2.5f), -2);
    EXPECT_EQ(ref::nearest_int(-3.5f), -4);
    EXPECT_EQ(ref::nearest_int(0.49999997f), 0);
    EXPECT_EQ(ref::nearest_int(-127.4f), -127);
    EXPECT_EQ(ref::nearest_int(4194303.f), 4194303);
    EXPECT_EQ(ref::nearest_int(-4194303.f), -4194303);
}

TEST(QuantRef, Q8_1HandComputed) {
    // amax = 127 -> d = 1, id = 1: q = roundf(x) (ties away from zero).
    float x[32];
    for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j) - 16.f;  // -16 .. 15
    x[0] = 127.f;
    x[1] = 2.5f;
    x[2] = -2.5f;
    x[3] = 0.5f;
    x[4] = -0.49f;
    block_q8_1 b;
    quantize_row_ref(DType::Q8_1, x, &b, 32);
    EXPECT_EQ(b.d, 0x3c00);  // 1.0
    EXPECT_EQ(b.qs[0], 127);
    EXPECT_EQ(b.qs[1], 3);
    EXPECT_EQ(b.qs[2], -3);
    EXPECT_EQ(b.qs[3], 1);
    EXPECT_EQ(b.qs[4], 0);
    for (int j = 5; j < 32; ++j) EXPECT_EQ(b.qs[j], j - 16);
    // sum = 127 + 3 - 3 + 1 + 0 + sum(-11..15) = 128 + 54 = 182; s = fp16(182 * 1)
    EXPECT_EQ(b.s, fp32_to_fp16(182.f));
    EXPECT_EQ(b.s, 0x59b0);

    // amax = 16 -> d = 16/127, id = 127/16 = 7.9375 exactly; x*id is exact.
    for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j) - 16.f;
    quantize_row_ref(DType::Q8_1, x, &b, 32);
    const float d = 16.f / 127.f;
    EXPECT_EQ(b.d, fp32_to_fp16(d));
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
        const double v = (j - 16) * 7.9375;  // roundf: ties away from zero
        const int want = static_cast<int>(v < 0 ? -std::floor(-v + 0.5) : std::floor(v + 0.5));
        EXPECT_EQ(b.qs[j], want) << j;
        sum += want;
    }
    EXPECT_EQ(b.qs[0], -127);
    EXPECT_EQ(b.qs[1], -119);  // -15 * 7.9375 = -119.0625
    EXPECT_EQ(b.qs[8], -64);   // -8 * 7.9375 = -63.5 -> away from zero
    EXPECT_EQ(b.s, fp32_to_fp16(static_cast<float>(sum) * d));  // s uses the fp32 d, not fp16(d)

    // All zero: d = 0, qs = 0, s = 0.
    for (float& v : x) v = 0.f;
    quantize_row_ref(DType::Q8_1, x, &b, 32);
    EXPECT_EQ(b.d, 0);
    EXPECT_EQ(b.s, 0);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(b.qs[j], 0);

    // Dequantize: q * fp16(d).
    float y[32];
    for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j * 8 - 128);
    b.d = fp32_to_fp16(0.25f);
    dequantize_row_ref(DType::Q8_1, &b, y, 32);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], static_cast<float>(j * 8 - 128) * 0.25f);
}

TEST(QuantRef, Q8_1MatchesDefinitionOnRandomData) {
    auto rng = rng_for(2);
    const auto x = random_floats(32 * 2048, 32, rng);
    std::vector<block_q8_1> q(2048);
    quantize_row_ref(DType::Q8_1, x.data(), q.data(), static_cast<int64_t>(x.size()));
    std::vector<block_q8_0> q0(2048);
    quantize_row_ref(DType::Q8_0, x.data(), q0.data(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < q.size(); ++i) {
        // d and qs are those of Q8_0 (checked bit-exact against gguf above).
        ASSERT_EQ(q[i].d, q0[i].d) << i << "; " << seed_note();
        ASSERT_EQ(std::memcmp(q[i].qs, q0[i].qs, 32), 0) << i << "; " << seed_note();
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[i * 32 + j]));
        int sum = 0;
        for (int j = 0; j < 32; ++j) sum += q[i].qs[j];
        ASSERT_EQ(q[i].s, fp32_to_fp16(static_cast<float>(sum) * (amax / 127))) << i << "; " << seed_note();
    }
}

TEST(QuantRef, Q8_KHandComputed) {
    // max = -127 (largest magnitude, negative) -> iscale = 1, d = 1.
    std::vector<float> x(256, 0.f);
    x[0] = -127.f;
    x[1] = 2.5f;   // nearest_int: ties to even -> 2
    x[2] = 3.5f;   // -> 4
    x[3] = -2.5f;  // -> -2
    x[4] = 126.6f; // -> 127
    x[17] = 100.f;
    x[255] = -0.5f;  // -> 0 (even)
    block_q8_K b;
    quantize_row_ref(DType::Q8_K, x.data(), &b, 256);
    EXPECT_EQ(b.d, 1.0f);
    EXPECT_EQ(b.qs[0], -127);
    EXPECT_EQ(b.qs[1], 2);
    EXPECT_EQ(b.qs[2], 4);
    EXPECT_EQ(b.qs[3], -2);
    EXPECT_EQ(b.qs[4], 127);
    EXPECT_EQ(b.qs[17], 100);
    EXPECT_EQ(b.qs[255], 0);
    EXPECT_EQ(b.bsums[0], -127 + 2 + 4 - 2 + 127);
    EXPECT_EQ(b.bsums[1], 100);
    for (int g = 2; g < 16; ++g) EXPECT_EQ(b.bsums[g], 0) << g;

    // max = +127 -> iscale = -1, d = -1: the codes are negated.
    x.assign(256, 0.f);
    x[5] = 127.f;
    x[6] = -127.f;  // same magnitude later in the block: the first one wins
    x[7] = 2.5f;
    quantize_row_ref(DType::Q8_K, x.data(), &b, 256);
    EXPECT_EQ(b.d, -1.0f);
    EXPECT_EQ(b.qs[5], -127);
    EXPECT_EQ(b.qs[6], 127);
    EXPECT_EQ(b.qs[7], -2);
    EXPECT_EQ(b.bsums[0], -2);

    // max = 2 -> iscale = -63.5, d = 1/-63.5 in fp32.
    x.assign(256, 0.f);
    x[40] = 2.f;
    x[41] = 1.f;   // -63.5 -> -64 (even)
    x[42] = -1.f;  // 63.5 -> 64
    quantize_row_ref(DType::Q8_K, x.data(), &b, 256);
    EXPECT_EQ(b.d, 1.f / -63.5f);
    EXPECT_EQ(b.qs[40], -127);
    EXPECT_EQ(b.qs[41], -64);
    EXPECT_EQ(b.qs[42], 64);
    EXPECT_EQ(b.bsums[2], -127);

    // All zero -> everything zero.
    x.assign(256, 0.f);
    std::memset(&b, 0x5A, sizeof b);
    quantize_row_ref(DType::Q8_K, x.data(), &b, 256);
    EXPECT_EQ(b.d, 0.f);
    for (int j = 0; j < 256; ++j) ASSERT_EQ(b.qs[j], 0);
    for (int g = 0; g < 16; ++g) ASSERT_EQ(b.bsums[g], 0);

    // Dequantize: d * q in fp32.
    for (int j = 0; j < 256; ++j) b.qs[j] = static_cast<int8_t>(j - 128);
    b.d = 0.1f;
    std::vector<float> y(256);
    dequantize_row_ref(DType::Q8_K, &b, y.data(), 256);
    for (int j = 0; j < 256; ++j) ASSERT_EQ(y[j], 0.1f * static_cast<float>(j - 128));
}

TEST(QuantRef, Q8_KMatchesDefinitionOnRandomData) {
    auto rng = rng_for(3);
    const int nb = 512;
    const auto x = random_floats(256 * nb, 256, rng);
    std::vector<block_q8_K> q(nb);
    quantize_row_ref(DType::Q8_K, x.data(), q.data(), 256 * nb);
    for (int i = 0; i < nb; ++i) {
        const float* v = x.data() + 256 * i;
        float amax = 0, max = 0;
        for (int j = 0; j < 256; ++j)
            if (std::fabs(v[j]) > amax) {
                amax = std::fabs(v[j]);
                max = v[j];
            }
        if (amax == 0) {
            ASSERT_EQ(q[i].d, 0.f);
            continue;
        }
        const float iscale = -127.f / max;
        ASSERT_EQ(q[i].d, 1 / iscale) << i << "; " << seed_note();
        for (int g = 0; g < 16; ++g) {
            int sum = 0;
            for (int l = 0; l < 16; ++l) {
                const int j = 16 * g + l;
                const int want = std::min(127, static_cast<int>(std::nearbyint(iscale * v[j])));  // ties to even
                ASSERT_EQ(q[i].qs[j], want) << "block " << i << " element " << j << "; " << seed_note();
                sum += want;
            }
            ASSERT_EQ(q[i].bsums[g], sum);
        }
    }
}

// ------------------------------------------------------------ 3. round-trip accuracy

struct Accuracy {
    DType type;
    double gaussian;      // bound on RMS(error) / RMS(x), Gaussian rows
    double outlier_rest;  // same, over the ordinary elements of rows with outliers
    double outlier_elem;  // bound on |error| / |x| of each outlier
};

// Bounds sit about 20-25% above the largest errors measured over 40 seeds
// (1.5x for the single worst outlier), run with QUERN_QUANT_VERBOSE=1 to print
// them; a broken scale packing or bit layout gives errors of order 1.
const std::vector<Accuracy> kAccuracy = {
    {DType::Q4_0, 0.11, 0.45, 0.001},     {DType::Q4_1, 0.10, 0.37, 0.001},
    {DType::Q5_0, 0.055, 0.30, 0.001},    {DType::Q5_1, 0.048, 0.18, 0.001},
    {DType::Q8_0, 0.007, 0.04, 0.001},    {DType::Q8_1, 0.007, 0.04, 0.001},
    {DType::Q2_K, 0.35, 0.68, 0.13},      {DType::Q3_K, 0.19, 0.40, 0.06},
    {DType::Q4_K, 0.09, 0.33, 0.045},     {DType::Q5_K, 0.045, 0.18, 0.04},
    {DType::Q6_K, 0.023, 0.12, 0.015},    {DType::Q8_K, 0.009, 0.11, 0.012},
    {DType::F16, 0.0003, 0.0003, 0.0005}, {DType::BF16, 0.0021, 0.0021, 0.004},
};

void PrintTo(const Accuracy& a, std::ostream* os) { *os << type_name(a.type); }

std::string accuracy_name(const testing::TestParamInfo<Accuracy>& info) { return type_name(info.param.type); }

bool verbose() { return std::getenv("QUERN_QUANT_VERBOSE") != nullptr; }

std::vector<float> round_trip(DType t, const std::vector<float>& x) {
    const auto k = static_cast<int64_t>(x.size());
    std::vector<uint8_t> q(row_size(t, k), 0xA5);
    quantize_row_ref(t, x.data(), q.data(), k);
    std::vector<float> y(x.size(), std::numeric_limits<float>::quiet_NaN());
    dequantize_row_ref(t, q.data(), y.data(), k);
    return y;
}

// RMS(y - x) / RMS(x) over the elements where `use` is true (all when empty).
double rel_rms(const std::vector<float>& x, const std::vector<float>& y, const std::vector<bool>& skip = {}) {
    double err = 0, sig = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        if (!skip.empty() && skip[i]) continue;
        const double d = static_cast<double>(y[i]) - x[i];
        err += d * d;
        sig += static_cast<double>(x[i]) * x[i];
    }
    return sig > 0 ? std::sqrt(err / sig) : std::sqrt(err);
}

class RoundTripAccuracy : public testing::TestWithParam<Accuracy> {};

TEST_P(RoundTripAccuracy, GaussianRows) {
    const Accuracy a = GetParam();
    auto rng = rng_for(10 + static_cast<uint64_t>(a.type));
    std::normal_distribution<float> g(0.f, 1.f);
    for (float scale : {1.0f, 0.02f, 300.0f}) {
        std::vector<float> x(256 * 64);
        for (auto& v : x) v = g(rng) * scale;
        const auto y = round_trip(a.type, x);
        for (float v : y) ASSERT_TRUE(std::isfinite(v)) << seed_note();
        const double e = rel_rms(x, y);
        if (verbose()) std::printf("%-5s gaussian scale %g: rel rms %.5f\n", type_name(a.type).c_str(), scale, e);
        EXPECT_LT(e, a.gaussian) << type_name(a.type) << " scale " << scale << "; " << seed_note();
    }
}

TEST_P(RoundTripAccuracy, RowsWithOutliers) {
    const Accuracy a = GetParam();
    auto rng = rng_for(40 + static_cast<uint64_t>(a.type));
    std::normal_distribution<float> g(0.f, 1.f);
    std::vector<float> x(256 * 64);
    for (auto& v : x) v = g(rng);
    std::vector<bool> is_outlier(x.size(), false);
    for (size_t i = rng() % 64; i < x.size(); i += 97 + rng() % 300) {
        x[i] = ((rng() & 1) ? 1.f : -1.f) * (20.f + 30.f * static_cast<float>(rng() % 100) / 100.f);
        is_outlier[i] = true;
    }
    const auto y = round_trip(a.type, x);
    for (float v : y) ASSERT_TRUE(std::isfinite(v)) << seed_note();
    const double rest = rel_rms(x, y, is_outlier);
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i)
        if (is_outlier[i]) worst = std::max(worst, std::fabs(static_cast<double>(y[i]) - x[i]) / std::fabs(x[i]));
    if (verbose())
        std::printf("%-5s outliers: rest rel rms %.5f, worst outlier rel err %.5f\n", type_name(a.type).c_str(), rest,
                    worst);
    EXPECT_LT(rest, a.outlier_rest) << type_name(a.type) << "; " << seed_note();
    EXPECT_LT(worst, a.outlier_elem) << type_name(a.type) << "; " << seed_note();
}

TEST_P(RoundTripAccuracy, ZeroAndConstantRows) {
    const Accuracy a = GetParam();
    std::vector<float> x(256 * 4, 0.f);
    auto y = round_trip(a.type, x);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], 0.f) << type_name(a.type) << " element " << i;
    for (float c : {0.75f, -0.75f, 3e-2f}) {
        x.assign(256 * 4, c);
        y = round_trip(a.type, x);
        for (float v : y) ASSERT_TRUE(std::isfinite(v));
        const double e = rel_rms(x, y);
        if (verbose()) std::printf("%-5s constant %g: rel rms %.5f\n", type_name(a.type).c_str(), c, e);
        EXPECT_LT(e, a.gaussian) << type_name(a.type) << " constant " << c;
    }
}

INSTANTIATE_TEST_SUITE_P(Types, RoundTripAccuracy, testing::ValuesIn(kAccuracy), accuracy_name);

// ------------------------------------------------------------ 4. malformed arguments

const std::vector<DType> kAllSupported = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0, DType::Q4_1,
                                          DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q8_1, DType::Q2_K,
                                          DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_K};

TEST(QuantRef, SupportedTypes) {
    for (DType t : kAllSupported) EXPECT_TRUE(quant_ref_supports(t)) << type_name(t);
    for (DType t : {DType::I8, DType::I16, DType::I32, DType::I64, DType::F64})
        EXPECT_FALSE(quant_ref_supports(t)) << type_name(t);
    EXPECT_FALSE(quant_ref_supports(static_cast<DType>(99)));
}

TEST(QuantRef, MalformedArgumentsThrow) {
    std::vector<float> f(1024, 1.f);
    std::vector<uint8_t> buf(8192, 0);
    for (DType t : kAllSupported) {
        const int bs = dtype_info(t).block_size;
        EXPECT_THROW(quantize_row_ref(t, f.data(), buf.data(), -static_cast<int64_t>(bs)), Error) << type_name(t);
        EXPECT_THROW(dequantize_row_ref(t, buf.data(), f.data(), -1), Error) << type_name(t);
        if (bs > 1) {
            for (int64_t k : {int64_t{1}, int64_t{bs} - 1, int64_t{bs} + 1, int64_t{bs} + 16}) {
                EXPECT_THROW(quantize_row_ref(t, f.data(), buf.data(), k), Error) << type_name(t) << " k=" << k;
                EXPECT_THROW(dequantize_row_ref(t, buf.data(), f.data(), k), Error) << type_name(t) << " k=" << k;
            }
        }
        // k = 0 is an empty row, not an error.
        EXPECT_NO_THROW(quantize_row_ref(t, f.data(), buf.data(), 0)) << type_name(t);
        EXPECT_NO_THROW(dequantize_row_ref(t, buf.data(), f.data(), 0)) << type_name(t);
    }
    for (DType t : {DType::I8, DType::I32, static_cast<DType>(99)}) {
        EXPECT_THROW(quantize_row_ref(t, f.data(), buf.data(), 32), Error);
        EXPECT_THROW(dequantize_row_ref(t, buf.data(), f.data(), 32), Error);
    }
    // The error names the type and the bad length.
    try {
        quantize_row_ref(DType::Q4_K, f.data(), buf.data(), 300);
        FAIL() << "no throw";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("Q4_K"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("300"), std::string::npos) << e.what();
    }
}

// ------------------------------------------------------------ 5. traits table

TEST(QuantTraits, TableMatchesDTypeInfo) {
    for (DType t : kAllSupported) {
        const QuantTraits& tr = quant_traits(t);
        EXPECT_EQ(tr.type, t);
        EXPECT_EQ(tr.block_size, dtype_info(t).block_size) << type_name(t);
        EXPECT_EQ(tr.type_size, dtype_info(t).type_size) << type_name(t);
        EXPECT_NE(tr.to_float, nullptr);
        EXPECT_NE(tr.from_float, nullptr);
        EXPECT_EQ(find_quant_traits(t), &tr);
    }
    EXPECT_EQ(find_quant_traits(DType::I8), nullptr);
    EXPECT_THROW(quant_traits(DType::I32), Error);
    EXPECT_THROW(quant_traits(static_cast<DType>(99)), Error);
}

TEST(QuantTraits, VecDotPartners) {
    const std::map<DType, DType> want = {
        {DType::F32, DType::F32},   {DType::F16, DType::F32},   {DType::BF16, DType::F32},
        {DType::Q4_0, DType::Q8_0}, {DType::Q5_0, DType::Q8_0}, {DType::Q8_0, DType::Q8_0},
        {DType::Q4_1, DType::Q8_1}, {DType::Q5_1, DType::Q8_1}, {DType::Q8_1, DType::Q8_1},
        {DType::Q2_K, DType::Q8_K}, {DType::Q3_K, DType::Q8_K}, {DType::Q4_K, DType::Q8_K},
        {DType::Q5_K, DType::Q8_K}, {DType::Q6_K, DType::Q8_K}, {DType::Q8_K, DType::Q8_K},
        {DType::MXFP4, DType::Q8_0}, {DType::F8_E4M3_B32, DType::F32}, {DType::NVFP4, DType::F32},
    };
    for (const auto& [w, a] : want) {
        EXPECT_EQ(quant_traits(w).vec_dot_type, a) << type_name(w);
        // The partner's block tiles the weight's block exactly.
        EXPECT_EQ(quant_traits(w).block_size % quant_traits(a).block_size, 0) << type_name(w);
    }
}

TEST(QuantTraits, FunctionPointersAreTheReferences) {
    auto rng = rng_for(5);
    for (DType t : kAllSupported) {
        const QuantTraits& tr = quant_traits(t);
        const int bs = tr.block_size == 1 ? 32 : tr.block_size;
        const auto x = random_floats(8 * bs, bs, rng);
        std::vector<uint8_t> a(row_size(t, 8 * bs)), b(a.size());
        tr.from_float(x.data(), a.data(), 8 * bs);
        quantize_row_ref(t, x.data(), b.data(), 8 * bs);
        ASSERT_EQ(a, b) << type_name(t);
        std::vector<float> ya(static_cast<size_t>(8 * bs)), yb(ya.size());
        tr.to_float(a.data(), ya.data(), 8 * bs);
        dequantize_row_ref(t, a.data(), yb.data(), 8 * bs);
        ASSERT_EQ(std::memcmp(ya.data(), yb.data(), ya.size() * 4), 0) << type_name(t);
        EXPECT_THROW(tr.from_float(x.data(), a.data(), tr.block_size == 1 ? -1 : tr.block_size + 1), Error) << type_name(t);
        EXPECT_THROW(tr.to_float(a.data(), ya.data(), tr.block_size == 1 ? -1 : tr.block_size + 1), Error) << type_name(t);
    }
}

TEST(QuantRef, UnalignedBuffers) {
    // Rows may start at any byte (e.g. inside an mmapped file).
    auto rng = rng_for(4);
    for (DType t : kAllSupported) {
        const int bs = dtype_info(t).block_size == 1 ? 32 : dtype_info(t).block_size;
        const int64_t k = 4 * bs;
        const auto x = random_floats(k, bs, rng);
        const size_t bytes = row_size(t, k);
        std::vector<uint8_t> aligned(bytes), shifted(bytes + 1);
        quantize_row_ref(t, x.data(), aligned.data(), k);
        quantize_row_ref(t, x.data(), shifted.data() + 1, k);
        ASSERT_EQ(std::memcmp(aligned.data(), shifted.data() + 1, bytes), 0) << type_name(t);
        std::vector<float> y1(static_cast<size_t>(k)), y2(static_cast<size_t>(k));
        dequantize_row_ref(t, aligned.data(), y1.data(), k);
        dequantize_row_ref(t, shifted.data() + 1, y2.data(), k);
        ASSERT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * 4), 0) << type_name(t);
    }
}

}  // namespace
