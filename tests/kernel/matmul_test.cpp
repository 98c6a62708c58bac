// CPU matmul kernels vs the scalar reference, for every weight type at every
// ISA level the machine supports (forced with set_isa_override).
//
// Reference: W dequantized with dequantize_row_ref; x quantized with the
// weight type's activation partner (Q8_0 / Q8_1 / Q8_K) by quantize_row_ref
// and dequantized again, so the kernel and the reference see the same numbers
// and differ only in summation order; the dot products are summed in double.
// Tolerance: 1e-4 * sum |w_k x_k| per output, plus, for Q4_1/Q5_1, the
// rounding of Q8_1's fp16 s field (the scalar kernel uses it as ggml does).
// The weight-only F8_E4M3_B32 / NVFP4 take f32 activations, as F32 weights do;
// MXFP4 takes Q8_0, as Q4_0 does.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/matmul.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/fp16.h"
#include "quant/blocks.h"
#include "quant/fp8.h"
#include "quant/reference.h"

using namespace quern;
using quern::cpu::Isa;

namespace {

std::vector<Isa> available_isas() {
    std::vector<Isa> v{Isa::Scalar};
    if (cpu::max_isa() >= Isa::AVX2) v.push_back(Isa::AVX2);
    if (cpu::max_isa() >= Isa::AVX512) v.push_back(Isa::AVX512);
    return v;
}

struct IsaGuard {
    explicit IsaGuard(Isa isa) { cpu::set_isa_override(isa); }
    ~IsaGuard() { cpu::set_isa_override(std::nullopt); }
};

void put_f16(uint8_t* p, float v) {
    const uint16_t h = fp32_to_fp16(v);
    std::memcpy(p, &h, 2);
}

// Random but valid blocks: random bits everywhere, then sensible fp16 scales.
std::vector<uint8_t> random_blocks(DType t, int64_t M, int64_t K, std::mt19937& rng) {
    const size_t rb = row_size(t, K);
    std::vector<uint8_t> w(rb * static_cast<size_t>(M));
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
    std::uniform_real_distribution<float> d(0.002f, 0.02f);
    std::uniform_real_distribution<float> m(-0.1f, 0.1f);
    const auto& info = dtype_info(t);
    for (size_t i = 0; i < w.size() / static_cast<size_t>(info.type_size); ++i) {
        uint8_t* b = w.data() + i * static_cast<size_t>(info.type_size);
        switch (t) {
            case DType::Q4_0:
            case DType::Q5_0:
            case DType::Q8_0: put_f16(b, d(rng)); break;
            case DType::Q4_1:
            case DType::Q5_1:
                put_f16(b, d(rng));
                put_f16(b + 2, m(rng));
                break;
            case DType::Q2_K:
                put_f16(b + offsetof(block_q2_K, d), d(rng));
                put_f16(b + offsetof(block_q2_K, dmin), d(rng));
                break;
            case DType::Q3_K: put_f16(b + offsetof(block_q3_K, d), d(rng)); break;
            case DType::Q4_K:
            case DType::Q5_K:
                put_f16(b, d(rng) * 0.1f);
                put_f16(b + 2, d(rng) * 0.1f);
                break;
            case DType::Q6_K: put_f16(b + offsetof(block_q6_K, d), d(rng) * 0.1f); break;
            case DType::F8_E4M3_B32: {
                // random codes but no NaN (0x7F / 0xFF: refused at load), an f32 scale
                const float s = d(rng) * 0.01f;
                std::memcpy(b, &s, 4);
                for (int j = 0; j < QK_F8; ++j)
                    if ((b[4 + j] & 0x7F) == 0x7F) b[4 + j] ^= 1;
                break;
            }
            case DType::MXFP4: b[0] = static_cast<uint8_t>(118 + byte(rng) % 12); break;  // scales 2^-9 .. 2^2
            case DType::NVFP4: {
                const float s = d(rng) * 0.01f;
                std::memcpy(b, &s, 4);
                for (int j = 0; j < 4; ++j)
                    if ((b[4 + j] & 0x7F) == 0x7F) b[4 + j] ^= 1;
                break;
            }
            default: break;
        }
    }
    return w;
}

// Weights from Gaussian data through the reference quantizer (or exact for float types).
std::vector<uint8_t> gaussian_weights(DType t, int64_t M, int64_t K, std::mt19937& rng) {
    const size_t rb = row_size(t, K);
    std::vector<uint8_t> w(rb * static_cast<size_t>(M));
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t r = 0; r < M; ++r) {
        for (auto& v : row) v = g(rng);
        quantize_row_ref(t, row.data(), w.data() + static_cast<size_t>(r) * rb, K);
    }
    return w;
}

struct Case {
    int64_t K, M, n;
};

class MatmulTest : public ::testing::TestWithParam<std::tuple<DType, Isa>> {};

const char* path_name(cpu::MatmulPath p) {
    switch (p) {
        case cpu::MatmulPath::Gemv: return "gemv";
        case cpu::MatmulPath::Gemm: return "gemm";
        case cpu::MatmulPath::Decode: return "decode";
        case cpu::MatmulPath::Tile: return "tile";
        default: return "auto";
    }
}

void run_case(DType t, Isa isa, const Case& cs, bool gaussian, int threads, uint32_t seed, size_t row_pad = 0,
              cpu::MatmulPath path = cpu::MatmulPath::Auto) {
    SCOPED_TRACE(::testing::Message() << dtype_name(t) << " " << cpu::isa_name(isa) << " K=" << cs.K << " M=" << cs.M
                                      << " n=" << cs.n << (gaussian ? " gaussian" : " random-bits")
                                      << " threads=" << threads << " row_pad=" << row_pad << " path "
                                      << path_name(path));
    std::mt19937 rng(seed);
    const int64_t K = cs.K, M = cs.M, n = cs.n;
    std::vector<uint8_t> w = gaussian ? gaussian_weights(t, M, K, rng) : random_blocks(t, M, K, rng);
    if (!gaussian && !dtype_is_quantized(t)) w = gaussian_weights(t, M, K, rng);

    // activations: Gaussian with a per-32 scale spread, a few exact zeros
    std::vector<float> x(static_cast<size_t>(n * K));
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::uniform_real_distribution<float> sc(0.1f, 3.0f);
    for (int64_t i = 0; i < n * K; i += 32) {
        const float s = sc(rng);
        for (int64_t j = i; j < std::min(i + 32, n * K); ++j) x[static_cast<size_t>(j)] = s * g(rng);
    }
    x[0] = 0.0f;

    // reference operands
    const DType act = cpu::act_type_for(t);
    std::vector<float> wd(static_cast<size_t>(M * K)), xd(static_cast<size_t>(n * K));
    const size_t rb = row_size(t, K);
    for (int64_t r = 0; r < M; ++r) dequantize_row_ref(t, w.data() + r * rb, wd.data() + r * K, K);
    std::vector<uint8_t> xq;
    if (dtype_is_quantized(t) && act != DType::F32) {  // weight-only types take f32 activations
        const size_t qb = row_size(act, K);
        xq.resize(qb * static_cast<size_t>(n));
        for (int64_t c = 0; c < n; ++c) {
            quantize_row_ref(act, x.data() + c * K, xq.data() + c * qb, K);
            dequantize_row_ref(act, xq.data() + c * qb, xd.data() + c * K, K);
        }
    } else {
        xd = x;
    }

    const int64_t ldy = M + 3;
    const float kPad = 12345.0f;
    std::vector<float> y(static_cast<size_t>(n * ldy), kPad);
    for (int64_t c = 0; c < n; ++c)
        for (int64_t r = 0; r < M; ++r) y[static_cast<size_t>(c * ldy + r)] = std::nanf("");

    Tensor W = Tensor::contiguous(t, {K, M, 1, 1}, w.data(), "w");
    std::vector<uint8_t> strided;
    if (row_pad) {  // the same rows with row_pad bytes of junk after each (a view into a wider matrix)
        strided.assign((rb + row_pad) * static_cast<size_t>(M), 0xA5);
        for (int64_t r = 0; r < M; ++r) std::memcpy(strided.data() + r * (rb + row_pad), w.data() + r * rb, rb);
        W.data = strided.data();
        W.nb[1] = rb + row_pad;
        W.nb[2] = W.nb[3] = W.nb[1] * static_cast<size_t>(M);
    }
    ThreadPool pool(threads);
    {
        IsaGuard guard(isa);
        cpu::matmul(W, x.data(), n, y.data(), ldy, pool, path);
    }

    int bad = 0;
    for (int64_t c = 0; c < n && bad < 5; ++c) {
        for (int64_t r = 0; r < M && bad < 5; ++r) {
            double ref = 0.0, mag = 0.0;
            for (int64_t k = 0; k < K; ++k) {
                const double p = static_cast<double>(wd[static_cast<size_t>(r * K + k)]) * xd[static_cast<size_t>(c * K + k)];
                ref += p;
                mag += std::fabs(p);
            }
            double tol = 1e-4 * mag + 1e-30;
            if (t == DType::Q4_1 || t == DType::Q5_1) {
                // |m_w| * |s_stored - da * sum(a)| per block
                const uint8_t* row = w.data() + r * rb;
                const size_t bs = t == DType::Q4_1 ? sizeof(block_q4_1) : sizeof(block_q5_1);
                const uint8_t* xr = xq.data() + c * row_size(act, K);
                for (int64_t b = 0; b < K / 32; ++b) {
                    uint16_t mh, sh;
                    std::memcpy(&mh, row + b * bs + 2, 2);
                    std::memcpy(&sh, xr + b * sizeof(block_q8_1) + 2, 2);
                    double exact = 0.0;
                    for (int j = 0; j < 32; ++j) exact += xd[static_cast<size_t>(c * K + b * 32 + j)];
                    tol += std::fabs(fp16_to_fp32(mh)) * std::fabs(fp16_to_fp32(sh) - exact) * 1.001;
                }
            }
            const float got = y[static_cast<size_t>(c * ldy + r)];
            if (!(std::fabs(got - ref) <= tol)) {
                ADD_FAILURE() << "y[" << c << "][" << r << "] = " << got << ", reference " << ref << " (tol " << tol
                              << ", sum|p| " << mag << ")";
                ++bad;
            }
        }
        for (int64_t r = M; r < ldy; ++r)
            if (y[static_cast<size_t>(c * ldy + r)] != kPad) {
                ADD_FAILURE() << "padding y[" << c << "][" << r << "] overwritten";
                ++bad;
            }
    }
}

std::vector<Case> cases_for(DType t) {
    const int bs = dtype_info(t).block_size;
    if (bs == 256)
        return {{256, 37, 1}, {768, 67, 3}, {1280, 19, 17}, {512, 45, 64}, {2304, 9, 2}, {256, 130, 5}, {512, 21, 11}};
    if (bs == 32)
        return {{96, 37, 1}, {576, 67, 3}, {1056, 19, 17}, {160, 45, 64}, {32, 9, 2}, {1536, 130, 5}, {224, 21, 11}};
    if (bs == 64)
        return {{64, 37, 1}, {576, 67, 3}, {1088, 19, 17}, {192, 45, 64}, {64, 9, 2}, {1536, 130, 5}, {320, 21, 11}};
    return {{100, 37, 1}, {576, 67, 3}, {577, 19, 17}, {33, 45, 64}, {1, 9, 2}, {1040, 130, 5}, {300, 21, 11}};
}

TEST_P(MatmulTest, MatchesReference) {
    const auto [t, isa] = GetParam();
    uint32_t seed = 1000 * static_cast<uint32_t>(t) + static_cast<uint32_t>(isa);
    for (const Case& cs : cases_for(t)) {
        run_case(t, isa, cs, /*gaussian=*/false, 2, seed++);
        run_case(t, isa, cs, /*gaussian=*/true, cs.n == 3 ? 3 : 2, seed++);
    }
}

TEST_P(MatmulTest, SingleThreadLargeBatch) {
    const auto [t, isa] = GetParam();
    const int bs = dtype_info(t).block_size;
    const int64_t K = bs == 256 ? 1024 : bs == 64 ? 640 : bs == 32 ? 608 : 300;
    run_case(t, isa, {K, 70, 33}, false, 1, 77);
}

TEST_P(MatmulTest, StridedRowsAndTinyShapes) {
    const auto [t, isa] = GetParam();
    const int bs = dtype_info(t).block_size;
    const int64_t K = bs == 256 ? 512 : bs == 64 ? 128 : bs == 32 ? 96 : 40;
    run_case(t, isa, {K, 13, 1}, false, 2, 91, 52);   // rows not contiguous, decode
    run_case(t, isa, {K, 13, 20}, false, 2, 92, 18);  // rows not contiguous, prefill
    run_case(t, isa, {K, 1, 1}, false, 3, 93);        // more threads than rows
    run_case(t, isa, {K, 2, 40}, false, 3, 94);
}

// The decode kernel (and, for float weights, the tiled kernels every forced
// path uses) against the reference, on the same shapes.
TEST_P(MatmulTest, DecodePathMatchesReference) {
    const auto [t, isa] = GetParam();
    uint32_t seed = 5000 + 1000 * static_cast<uint32_t>(t) + static_cast<uint32_t>(isa);
    for (const Case& cs : cases_for(t)) {
        run_case(t, isa, cs, /*gaussian=*/false, 2, seed++, 0, cpu::MatmulPath::Decode);
        run_case(t, isa, cs, /*gaussian=*/true, cs.n == 3 ? 3 : 2, seed++, 0, cpu::MatmulPath::Decode);
    }
    const int bs = dtype_info(t).block_size;
    const int64_t K = bs == 256 ? 512 : bs == 64 ? 128 : bs == 32 ? 96 : 40;
    run_case(t, isa, {K, 13, 2}, false, 2, seed++, 52, cpu::MatmulPath::Decode);  // rows not contiguous
    run_case(t, isa, {K, 1, 1}, false, 3, seed++, 0, cpu::MatmulPath::Decode);    // more threads than rows
}

const DType kTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0,        DType::Q4_1, DType::Q5_0,
                        DType::Q5_1, DType::Q8_0, DType::Q2_K, DType::Q3_K,        DType::Q4_K, DType::Q5_K,
                        DType::Q6_K, DType::F8_E4M3_B32,       DType::NVFP4, DType::MXFP4};

std::string param_name(const ::testing::TestParamInfo<std::tuple<DType, Isa>>& info) {
    return std::string(dtype_name(std::get<0>(info.param))) + "_" + std::string(cpu::isa_name(std::get<1>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulTest,
                         ::testing::Combine(::testing::ValuesIn(kTypes), ::testing::ValuesIn(available_isas())),
                         param_name);

// ---------------------------------------------------------------- activation quantizers

std::vector<float> quantizer_input(int64_t k, std::mt19937& rng) {
    std::vector<float> x(static_cast<size_t>(k));
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::uniform_int_distribution<int> pick(0, 5);
    for (int64_t i = 0; i < k; i += 256) {
        const int kind = pick(rng);
        for (int64_t j = i; j < i + 256 && j < k; ++j) {
            float v = g(rng);
            if (kind == 1) v = 0.0f;                                        // zero block
            if (kind == 2) v = static_cast<float>(static_cast<int>(v * 60)) + 0.5f;  // ties after scaling by 1
            if (kind == 3) v *= 1e-30f;                                     // tiny (subnormal fp16 d)
            if (kind == 4) v *= 1e5f;                                       // huge (fp16 overflow)
            x[static_cast<size_t>(j)] = v;
        }
        if (kind == 2) {
            // make the max magnitude exactly 127 (Q8_0/Q8_1: d = 1) in each 32-block,
            // and -127 first in the 256-block (Q8_K: iscale = 1)
            for (int64_t b = i; b < i + 256 && b < k; b += 32) x[static_cast<size_t>(b + 5)] = 127.0f;
            x[static_cast<size_t>(i)] = -127.0f;
        }
        if (kind == 5) {  // equal magnitudes with both signs: the first one decides
            x[static_cast<size_t>(i + 3)] = 9.0f;
            x[static_cast<size_t>(i + 200)] = -9.0f;
        }
    }
    return x;
}

TEST(ActQuantizers, MatchReferenceBytes) {
    std::mt19937 rng(5);
    for (Isa isa : available_isas()) {
        const cpu::ActQuantizers* qz = isa == Isa::AVX512 ? &cpu::avx512::quantizers
                                       : isa == Isa::AVX2 ? &cpu::avx2::quantizers
                                                          : &cpu::scalar::quantizers;
        for (DType act : {DType::Q8_0, DType::Q8_1, DType::Q8_K}) {
            for (int64_t k : {256, 1536, 4096}) {
                for (int rep = 0; rep < 20; ++rep) {
                    const std::vector<float> x = quantizer_input(k, rng);
                    const size_t rb = row_size(act, k);
                    std::vector<uint8_t> want(rb, 0xAA), got(rb, 0x55);
                    quantize_row_ref(act, x.data(), want.data(), k);
                    const cpu::QuantizeRowFn f = act == DType::Q8_0 ? qz->q8_0 : act == DType::Q8_1 ? qz->q8_1 : qz->q8_K;
                    f(x.data(), got.data(), k);
                    size_t first = rb;
                    for (size_t i = 0; i < rb; ++i)
                        if (want[i] != got[i]) {
                            first = i;
                            break;
                        }
                    ASSERT_EQ(first, rb) << cpu::isa_name(isa) << " " << dtype_name(act) << " k=" << k
                                         << ": first differing byte " << first << " (block "
                                         << first / static_cast<size_t>(dtype_info(act).type_size) << ")";
                }
            }
        }
    }
}

// ---------------------------------------------------------------- errors and edge cases

TEST(Matmul, RejectsBadInput) {
    ThreadPool pool(1);
    std::vector<uint8_t> buf(4096);
    std::vector<float> x(256), y(256);
    Tensor w8k = Tensor::contiguous(DType::Q8_K, {256, 1, 1, 1}, buf.data(), "w8k");
    EXPECT_THROW(cpu::matmul(w8k, x.data(), 1, y.data(), 1, pool), Error);
    Tensor wf = Tensor::contiguous(DType::F32, {16, 4, 1, 1}, buf.data(), "wf");
    EXPECT_THROW(cpu::matmul(wf, x.data(), 1, y.data(), 3, pool), Error);  // ldy < M
    Tensor wq = Tensor::contiguous(DType::Q4_0, {64, 2, 1, 1}, buf.data(), "wq");
    wq.ne[0] = 48;  // not whole blocks
    EXPECT_THROW(cpu::matmul(wq, x.data(), 1, y.data(), 2, pool), Error);
    Tensor w3 = Tensor::contiguous(DType::F32, {4, 2, 2, 1}, buf.data(), "w3");
    EXPECT_THROW(cpu::matmul(w3, x.data(), 1, y.data(), 4, pool), Error);
}

TEST(Matmul, EmptyBatchWritesNothing) {
    ThreadPool pool(2);
    std::vector<float> w(64, 1.0f), x(16, 1.0f), y(4, 7.0f);
    Tensor W = Tensor::contiguous(DType::F32, {16, 4, 1, 1}, w.data(), "w");
    cpu::matmul(W, x.data(), 0, y.data(), 4, pool);
    for (float v : y) EXPECT_EQ(v, 7.0f);
}

TEST(CpuFeatures, OverrideClampsAndParses) {
    EXPECT_EQ(cpu::isa_from_name("AVX2"), Isa::AVX2);
    EXPECT_EQ(cpu::isa_from_name("scalar"), Isa::Scalar);
    EXPECT_FALSE(cpu::isa_from_name("sse9").has_value());
    cpu::set_isa_override(Isa::AVX512);
    EXPECT_EQ(cpu::active_isa(), cpu::max_isa());
    cpu::set_isa_override(Isa::Scalar);
    EXPECT_EQ(cpu::active_isa(), Isa::Scalar);
    cpu::set_isa_override(std::nullopt);
}

}  // namespace

namespace {

// Random tests below draw a fresh seed per run; QUERN_TEST_SEED replays one.
uint64_t test_seed() {
    static const uint64_t seed = [] {
        if (const char* s = std::getenv("QUERN_TEST_SEED")) return static_cast<uint64_t>(std::strtoull(s, nullptr, 10));
        std::random_device rd;
        return (static_cast<uint64_t>(rd()) << 32) ^ rd();
    }();
    return seed;
}

std::string seed_note() { return "seed " + std::to_string(test_seed()) + " (replay with QUERN_TEST_SEED=...)"; }

}  // namespace

// The decode kernel computes what the GEMM tile computes, bit for bit: for
// every weight type, ISA level, shape (odd row counts, several K), number of
// activation rows and thread count, MatmulPath::Decode and MatmulPath::Tile
// give identical floats (NaN-poisoned outputs, so every element is written),
// and so does MatmulPath::Gemm, which picks one of them by the row count. The
// serving engine relies on it: a batch of 2 rows and a batch of 600 take
// different kernels but must give a row the same result.
class DecodeEqualsGemm : public ::testing::TestWithParam<std::tuple<DType, Isa>> {};

TEST_P(DecodeEqualsGemm, Bitwise) {
    const auto [t, isa] = GetParam();
    SCOPED_TRACE(seed_note());
    std::mt19937 rng(static_cast<uint32_t>(test_seed() ^ (static_cast<uint64_t>(t) * 7919 + static_cast<uint64_t>(isa))));
    const int bs = dtype_info(t).block_size;
    const std::vector<int64_t> Ks = bs == 256 ? std::vector<int64_t>{256, 768, 1536}
                                    : bs == 64 ? std::vector<int64_t>{64, 192, 576}
                                    : bs == 32 ? std::vector<int64_t>{32, 96, 576, 1536}
                                               : std::vector<int64_t>{16, 100, 576};
    IsaGuard guard(isa);
    for (int64_t K : Ks) {
        for (int64_t M : {5, 16, 37, 67}) {
            const bool gaussian = (K + M) % 2 == 0;
            std::vector<uint8_t> w = gaussian || !dtype_is_quantized(t) ? gaussian_weights(t, M, K, rng)
                                                                         : random_blocks(t, M, K, rng);
            const Tensor W = Tensor::contiguous(t, {K, M, 1, 1}, w.data(), "w");
            const int64_t nmax = 33;
            std::vector<float> x(static_cast<size_t>(nmax * K));
            std::normal_distribution<float> g(0.0f, 1.0f);
            std::uniform_real_distribution<float> sc(0.05f, 4.0f);
            for (size_t i = 0; i < x.size(); i += 32) {
                const float s = sc(rng);
                for (size_t j = i; j < std::min(i + 32, x.size()); ++j) x[j] = s * g(rng);
            }
            for (int64_t n : {1, 2, 3, 7, 16, 33}) {
                for (int threads : {1, 2, 3}) {
                    if (threads == 3 && n != 7) continue;
                    ThreadPool pool(threads);
                    const int64_t ldy = M + 5;
                    std::vector<float> yg(static_cast<size_t>(n * ldy), std::nanf("")), yd = yg, yf = yg;
                    cpu::matmul(W, x.data(), n, yg.data(), ldy, pool, cpu::MatmulPath::Tile);
                    cpu::matmul(W, x.data(), n, yd.data(), ldy, pool, cpu::MatmulPath::Decode);
                    cpu::matmul(W, x.data(), n, yf.data(), ldy, pool, cpu::MatmulPath::Gemm);
                    int written = 0;
                    for (int64_t c = 0; c < n; ++c)
                        for (int64_t r = 0; r < M; ++r) written += !std::isnan(yd[static_cast<size_t>(c * ldy + r)]);
                    EXPECT_EQ(written, n * M) << dtype_name(t) << " K=" << K << " M=" << M << " n=" << n;
                    for (int64_t c = 0; c < n; ++c)
                        for (int64_t r = M; r < ldy; ++r)
                            ASSERT_TRUE(std::isnan(yd[static_cast<size_t>(c * ldy + r)])) << "padding overwritten";
                    ASSERT_EQ(0, std::memcmp(yg.data(), yd.data(), yg.size() * sizeof(float)))
                        << dtype_name(t) << " " << cpu::isa_name(isa) << " K=" << K << " M=" << M << " n=" << n
                        << " threads=" << threads;
                    ASSERT_EQ(0, std::memcmp(yg.data(), yf.data(), yg.size() * sizeof(float)))
                        << "path gemm: " << dtype_name(t) << " K=" << K << " M=" << M << " n=" << n;
                }
            }
        }
    }
}

// Weights that end right before an unreadable page: no kernel (the decode
// kernel's read-ahead included) reads past the last row's data, for
// contiguous rows and for a strided view whose gap after the last row is not
// part of the allocation.
TEST(MatmulBounds, NothingReadPastTheLastRow) {
    const long page = sysconf(_SC_PAGESIZE);
    std::mt19937 rng(7);
    for (DType t :
         {DType::Q4_1, DType::Q8_0, DType::Q4_K, DType::F16, DType::F8_E4M3_B32, DType::NVFP4, DType::MXFP4}) {
        const int64_t K = 768, M = 45;
        const size_t rb = row_size(t, K);
        const std::vector<uint8_t> w = dtype_is_quantized(t) ? random_blocks(t, M, K, rng) : gaussian_weights(t, M, K, rng);
        for (size_t pad : {size_t(0), size_t(96)}) {
            const size_t ldw = rb + pad;
            const size_t bytes = (M - 1) * ldw + rb;
            const size_t span = (bytes + static_cast<size_t>(page) - 1) / static_cast<size_t>(page) * static_cast<size_t>(page);
            void* mem = mmap(nullptr, span + static_cast<size_t>(page), PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            ASSERT_NE(mem, MAP_FAILED);
            auto* base = static_cast<uint8_t*>(mem);
            ASSERT_EQ(0, mprotect(base + span, static_cast<size_t>(page), PROT_NONE));
            uint8_t* data = base + span - bytes;  // the last row's data ends at the guard page
            for (int64_t r = 0; r < M; ++r) std::memcpy(data + r * ldw, w.data() + r * rb, rb);
            Tensor W = Tensor::contiguous(t, {K, M, 1, 1}, data, "w");
            W.nb[1] = ldw;
            W.nb[2] = W.nb[3] = ldw * static_cast<size_t>(M);
            std::vector<float> x(static_cast<size_t>(40 * K));
            std::normal_distribution<float> g;
            for (auto& v : x) v = g(rng);
            std::vector<float> y(static_cast<size_t>(40 * M));
            for (int threads : {1, 2, 3})
                for (auto path : {cpu::MatmulPath::Gemv, cpu::MatmulPath::Gemm, cpu::MatmulPath::Decode,
                                  cpu::MatmulPath::Tile, cpu::MatmulPath::Auto})
                    for (int64_t n : {1, 2, 9, 40}) {
                        ThreadPool pool(threads);
                        cpu::matmul(W, x.data(), n, y.data(), M, pool, path);
                    }
            munmap(mem, span + static_cast<size_t>(page));
        }
    }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, DecodeEqualsGemm,
                         ::testing::Combine(::testing::ValuesIn(kTypes), ::testing::ValuesIn(available_isas())),
                         param_name);

// The serving engine's batch invariance rests on this: with a forced kernel
// family, every output row is bit-identical whatever else is in the batch
// (row r computed alone, among n rows, or at another offset).
TEST(MatmulBatchInvariance, EachFamilyComputesRowsIndependently) {
    std::mt19937 rng(424242);
    std::normal_distribution<float> nd;
    const int64_t K = 512, M = 96, nmax = 40;
    std::vector<float> x(static_cast<size_t>(K * (nmax + 3)));
    for (auto& v : x) v = nd(rng);
    ThreadPool pool(2);
    for (DType t : kTypes) {
        std::vector<float> wf(static_cast<size_t>(K * M));
        for (auto& v : wf) v = nd(rng);
        std::vector<uint8_t> wq(row_size(t, K) * M);
        for (int64_t r = 0; r < M; ++r) quantize_row_ref(t, wf.data() + r * K, wq.data() + r * row_size(t, K), K);
        const Tensor W = Tensor::contiguous(t, {K, M, 1, 1}, wq.data(), "w");
        for (auto path : {cpu::MatmulPath::Gemv, cpu::MatmulPath::Gemm, cpu::MatmulPath::Decode,
                          cpu::MatmulPath::Tile}) {
            const char* name = path_name(path);
            std::vector<float> alone(static_cast<size_t>(M * (nmax + 3)));
            for (int64_t c = 0; c < nmax + 3; ++c)
                cpu::matmul(W, x.data() + c * K, 1, alone.data() + c * M, M, pool, path);
            for (int64_t n : {2, 5, 9, 12, 17, 33, 40}) {
                for (int64_t off : {0, 3}) {
                    std::vector<float> y(static_cast<size_t>(M * n), NAN);
                    cpu::matmul(W, x.data() + off * K, n, y.data(), M, pool, path);
                    EXPECT_EQ(0, std::memcmp(y.data(), alone.data() + off * M, y.size() * sizeof(float)))
                        << dtype_name(t) << " " << name << " n=" << n << " offset " << off;
                }
            }
        }
    }
}

// The weight-only types' loaders decode every weight to exactly the scalar
// reference's value: against one-hot activation rows each output is a single
// weight (w * 1 plus exact zeros), in the row-at-a-time decode kernel (Auto,
// one row) and in the tiles (Gemm, all rows at once), at every ISA level.
TEST(MatmulWeightOnly, KernelsDecodeEveryWeightExactly) {
    std::mt19937 rng(static_cast<uint32_t>(test_seed()));
    SCOPED_TRACE(seed_note());
    for (DType t : {DType::F8_E4M3_B32, DType::NVFP4}) {
        const int64_t K = 192, M = 19;
        const std::vector<uint8_t> w = random_blocks(t, M, K, rng);
        const Tensor W = Tensor::contiguous(t, {K, M, 1, 1}, const_cast<uint8_t*>(w.data()), "w");
        std::vector<float> ref(static_cast<size_t>(M * K));
        for (int64_t r = 0; r < M; ++r) dequantize_row_ref(t, w.data() + r * row_size(t, K), ref.data() + r * K, K);
        std::vector<float> x(static_cast<size_t>(K * K), 0.0f);
        for (int64_t c = 0; c < K; ++c) x[static_cast<size_t>(c * K + c)] = 1.0f;
        ThreadPool pool(2);
        for (Isa isa : available_isas()) {
            IsaGuard guard(isa);
            std::vector<float> yg(static_cast<size_t>(K * M), std::nanf("")), ya = yg;
            cpu::matmul(W, x.data(), K, yg.data(), M, pool, cpu::MatmulPath::Gemm);
            for (int64_t c = 0; c < K; ++c) cpu::matmul(W, x.data() + c * K, 1, ya.data() + c * M, M, pool);
            for (int64_t c = 0; c < K; ++c)
                for (int64_t r = 0; r < M; ++r) {
                    const float want = ref[static_cast<size_t>(r * K + c)];
                    ASSERT_EQ(yg[static_cast<size_t>(c * M + r)], want)
                        << dtype_name(t) << " " << cpu::isa_name(isa) << " gemm w[" << r << "][" << c << "]";
                    ASSERT_EQ(ya[static_cast<size_t>(c * M + r)], want)
                        << dtype_name(t) << " " << cpu::isa_name(isa) << " decode w[" << r << "][" << c << "]";
                }
        }
    }
}

// MXFP4's unpacked form (kernels.h) is exact: at each SIMD level the
// unpacker's D * u + Mn is the reference's value of every weight, for every
// code and exponent (0 and 1 give subnormal scales; 251.. would overflow
// 12 * 2^(e - 128)), and u stays within umax_for. The decode kernels read the
// same values (DecodeEqualsGemm), the scalar dot product the same integers.
TEST(MatmulMxfp4, UnpackedFormIsExact) {
    for (int e = 0; e < 256; ++e)
        ASSERT_EQ(std::bit_cast<uint32_t>(cpu::mxfp4_half_scale(static_cast<uint8_t>(e))),
                  std::bit_cast<uint32_t>(e8m0_to_float(static_cast<uint8_t>(e)) * 0.5f))
            << "e " << e;
    std::mt19937 rng(static_cast<uint32_t>(test_seed()));
    SCOPED_TRACE(seed_note());
    const int64_t K = 256 * 32, M = 3;  // one block per exponent 0..250, then random ones
    std::vector<uint8_t> w = random_blocks(DType::MXFP4, M, K, rng);
    for (int64_t b = 0; b < M * K / 32; ++b) w[static_cast<size_t>(b * 17)] = static_cast<uint8_t>(b < 251 ? b : rng() % 251);
    std::vector<float> ref(static_cast<size_t>(M * K));
    const size_t rb = row_size(DType::MXFP4, K);
    for (int64_t r = 0; r < M; ++r) dequantize_row_ref(DType::MXFP4, w.data() + r * rb, ref.data() + r * K, K);
    int levels = 0;
    for (Isa isa : available_isas()) {
        if (isa == Isa::Scalar) continue;
        const cpu::QKernels& qk = isa == Isa::AVX512 ? cpu::avx512::qkernels : cpu::avx2::qkernels;
        const cpu::UnpackFn unpack = qk.unpack(DType::MXFP4);
        ASSERT_NE(unpack, nullptr) << cpu::isa_name(isa);
        const size_t ldu = K + 64, lds = K / 32 + 16;
        std::vector<uint8_t> u(ldu * M, 0xEE);
        std::vector<float> D(lds * M), Mn(lds * M);
        unpack(w.data(), rb, M, K, u.data(), ldu, D.data(), Mn.data(), lds);
        for (int64_t r = 0; r < M; ++r)
            for (int64_t k = 0; k < K; ++k) {
                const uint8_t uk = u[static_cast<size_t>(r * ldu + k)];
                ASSERT_LE(uk, cpu::umax_for(DType::MXFP4)) << cpu::isa_name(isa) << " w[" << r << "][" << k << "]";
                const float d = D[static_cast<size_t>(r * lds + k / 32)], m = Mn[static_cast<size_t>(r * lds + k / 32)];
                ASSERT_EQ(d * static_cast<float>(uk) + m, ref[static_cast<size_t>(r * K + k)])
                    << cpu::isa_name(isa) << " w[" << r << "][" << k << "] u " << int(uk) << " D " << d;
            }
        ++levels;
    }
    if (levels == 0) GTEST_SKIP() << "no SIMD level on this machine";
}
