// FP8 (E4M3, E5M2) and FP4 (E2M1) encodings against brute-force nearest-value
// search over every code, and the scaling recipes: per-row FP8 on activations
// with massive outliers, NVFP4 round trips; quern's weight-only block layouts
// F8_E4M3_B32 and NVFP4 (exact decoding, reference quantizers).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "quant/blocks.h"
#include "quant/fp8.h"
#include "quant/reference.h"

using namespace quern;

namespace {

// The finite code nearest to x (ties: the even code), by search over all codes.
template <class Dec>
uint8_t nearest_code(float x, int n_codes, Dec dec) {
    int best = -1;
    double bd = 0.0;
    for (int c = 0; c < n_codes; ++c) {
        const float v = dec(static_cast<uint8_t>(c));
        if (!std::isfinite(v)) continue;
        if (v == 0.0f && std::signbit(v) != std::signbit(x)) continue;  // keep the sign of zero
        const double d = std::fabs(static_cast<double>(x) - v);
        if (best < 0 || d < bd || (d == bd && (c & 1) == 0 && (best & 1) == 1)) best = c, bd = d;
    }
    return static_cast<uint8_t>(best);
}

std::vector<float> probe_values(std::mt19937& rng, float range) {
    std::vector<float> xs;
    std::uniform_real_distribution<float> u(-range, range);
    std::uniform_real_distribution<float> lg(-12.0f, std::log2(range));
    for (int i = 0; i < 20000; ++i) xs.push_back(u(rng));
    for (int i = 0; i < 20000; ++i) xs.push_back((i & 1 ? -1.0f : 1.0f) * std::exp2(lg(rng)));
    return xs;
}

double cosine(const std::vector<double>& a, const std::vector<double>& b) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < a.size(); ++i) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
    return ab / std::sqrt(aa * bb);
}

}  // namespace

TEST(Fp8, E4M3KnownValuesAndRoundTrip) {
    EXPECT_EQ(fp8_e4m3_to_float(0x00), 0.0f);
    EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
    EXPECT_EQ(fp8_e4m3_to_float(0x07), 7 * std::ldexp(1.0f, -9));
    EXPECT_EQ(fp8_e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal
    EXPECT_EQ(fp8_e4m3_to_float(0x38), 1.0f);
    EXPECT_EQ(fp8_e4m3_to_float(0x7E), 448.0f);
    EXPECT_EQ(fp8_e4m3_to_float(0xFE), -448.0f);
    EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0x7F)));
    EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0xFF)));
    for (int c = 0; c < 256; ++c) {
        if ((c & 0x7F) == 0x7F) continue;
        EXPECT_EQ(float_to_fp8_e4m3(fp8_e4m3_to_float(static_cast<uint8_t>(c))), c) << "code " << c;
    }
    EXPECT_EQ(float_to_fp8_e4m3(1e9f), 0x7E);  // saturates, never NaN
    EXPECT_EQ(float_to_fp8_e4m3(-std::numeric_limits<float>::infinity()), 0xFE);
    EXPECT_EQ(float_to_fp8_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
    EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(1.0f, -10)), 0x00);                // half the smallest subnormal: tie to even (0)
    EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(1.0f, -10) * 1.01f), 0x01);        // just above: not flushed
}

TEST(Fp8, E4M3EncoderIsNearestEven) {
    std::mt19937 rng(1);
    auto xs = probe_values(rng, 440.0f);
    // Midpoints between neighbouring codes exercise the ties.
    for (int c = 0; c < 0x7E; ++c)
        xs.push_back(0.5f * (fp8_e4m3_to_float(static_cast<uint8_t>(c)) + fp8_e4m3_to_float(static_cast<uint8_t>(c + 1))));
    for (float x : xs) {
        const uint8_t want = nearest_code(x, 256, fp8_e4m3_to_float);
        ASSERT_EQ(float_to_fp8_e4m3(x), want) << "x = " << x;
    }
}

TEST(Fp8, E5M2EncoderIsNearestEven) {
    EXPECT_EQ(fp8_e5m2_to_float(0x3C), 1.0f);
    EXPECT_EQ(fp8_e5m2_to_float(0x7B), 57344.0f);
    EXPECT_EQ(fp8_e5m2_to_float(0x01), std::ldexp(1.0f, -16));
    EXPECT_TRUE(std::isinf(fp8_e5m2_to_float(0x7C)));
    EXPECT_TRUE(std::isnan(fp8_e5m2_to_float(0x7D)));
    EXPECT_EQ(float_to_fp8_e5m2(61440.0f), 0x7C);  // the tie above the largest finite rounds to inf
    EXPECT_EQ(float_to_fp8_e5m2(61439.0f), 0x7B);
    for (int c = 0; c < 256; ++c) {
        const float v = fp8_e5m2_to_float(static_cast<uint8_t>(c));
        if (std::isnan(v)) continue;
        EXPECT_EQ(float_to_fp8_e5m2(v), c) << "code " << c;
    }
    std::mt19937 rng(2);
    auto xs = probe_values(rng, 50000.0f);
    for (int c = 0; c < 0x7B; ++c)
        xs.push_back(0.5f * (fp8_e5m2_to_float(static_cast<uint8_t>(c)) + fp8_e5m2_to_float(static_cast<uint8_t>(c + 1))));
    for (float x : xs) ASSERT_EQ(float_to_fp8_e5m2(x), nearest_code(x, 256, fp8_e5m2_to_float)) << "x = " << x;
}

TEST(Fp8, E2M1AllCodesAndNearest) {
    const float mags[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (int c = 0; c < 16; ++c) {
        const float v = fp4_e2m1_to_float(static_cast<uint8_t>(c));
        EXPECT_EQ(std::fabs(v), mags[c & 7]) << c;
        EXPECT_EQ(std::signbit(v), (c & 8) != 0) << c;
        EXPECT_EQ(float_to_fp4_e2m1(v), c) << c;
    }
    EXPECT_EQ(float_to_fp4_e2m1(100.0f), 0x7);  // saturates
    EXPECT_EQ(float_to_fp4_e2m1(2.5f), 0x4);    // tie between 2 (even) and 3
    EXPECT_EQ(float_to_fp4_e2m1(5.0f), 0x6);    // tie between 4 (even) and 6
    EXPECT_EQ(float_to_fp4_e2m1(0.25f), 0x0);   // tie between 0 (even) and 0.5
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-6.0f, 6.0f);
    for (int i = 0; i < 20000; ++i) {
        const float x = u(rng);
        ASSERT_EQ(float_to_fp4_e2m1(x), nearest_code(x, 16, fp4_e2m1_to_float)) << "x = " << x;
    }
}

// y = X · Wᵀ with FP8 X (per row or per tensor) and FP8 W (per output channel),
// scales applied after the code products, against the float product; the
// cosine of each output row.
std::vector<double> fp8_gemm_row_cosines(const std::vector<float>& X, const std::vector<float>& W, int M, int N, int K,
                                         bool per_row) {
    std::vector<uint8_t> qx(X.size()), qw(W.size());
    std::vector<float> sx(M), sw(N);
    quantize_fp8_rows(W.data(), N, K, qw.data(), sw.data());
    if (per_row) {
        quantize_fp8_rows(X.data(), M, K, qx.data(), sx.data());
    } else {
        float s;
        quantize_fp8_tensor(X.data(), static_cast<int64_t>(X.size()), qx.data(), &s);
        for (auto& v : sx) v = s;
    }
    std::vector<double> cos(M);
    for (int i = 0; i < M; ++i) {
        std::vector<double> ref(N), got(N);
        for (int j = 0; j < N; ++j) {
            double r = 0, g = 0;
            for (int k = 0; k < K; ++k) {
                r += static_cast<double>(X[i * K + k]) * W[j * K + k];
                g += static_cast<double>(fp8_e4m3_to_float(qx[i * K + k])) * fp8_e4m3_to_float(qw[j * K + k]);
            }
            ref[j] = r;
            got[j] = g * sx[i] * sw[j];
        }
        cos[i] = cosine(ref, got);
    }
    return cos;
}

// The FP8 recipe's outlier test: one activation row (token) whose absmax is
// 1,000× the median row's: one scale per row (and per weight channel) keeps
// every output row at cosine >= 0.999 against the float product (E4M3's 3
// mantissa bits on both operands cost ~0.9994 on average; worst row here
// 0.99909). One scale for the whole tensor survives 1,000× in E4M3 — its
// normal range reaches 1/28672 of the scale — but at 100,000× it pushes the
// ordinary rows into the subnormals and loses them (cosine ~0.9), while the
// per-row recipe does not change.
TEST(Fp8, PerRowScalesSurviveMassiveOutliers) {
    const int M = 16, N = 256, K = 1024;
    for (float ratio : {1000.0f, 100000.0f}) {
        std::mt19937 rng(7);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> X(M * K), W(N * K);
        for (auto& v : X) v = nd(rng);
        for (auto& v : W) v = 0.02f * nd(rng);
        for (int k = 0; k < K; ++k) X[5 * K + k] *= ratio;  // the outlier token
        const auto per_row = fp8_gemm_row_cosines(X, W, M, N, K, true);
        const auto per_tensor = fp8_gemm_row_cosines(X, W, M, N, K, false);
        double worst_row = 1.0, worst_tensor = 1.0;
        for (int i = 0; i < M; ++i) worst_row = std::min(worst_row, per_row[i]), worst_tensor = std::min(worst_tensor, per_tensor[i]);
        EXPECT_GE(worst_row, 0.999) << "ratio " << ratio;
        if (ratio >= 100000.0f) EXPECT_LT(worst_tensor, 0.99) << "per-tensor scaling should lose the small rows";
        std::printf("outlier x%.0f: worst row cosine per-row %.6f, per-tensor %.6f\n", ratio, worst_row, worst_tensor);
    }
}

TEST(Fp8, Nvfp4RoundTripAndLayout) {
    const int rows = 8, cols = 64;
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 0.05f);
    std::vector<float> w(rows * cols);
    for (auto& v : w) v = nd(rng);
    w[3] = 0.9f;  // a large value: sets the global scale
    std::vector<uint8_t> packed(rows * cols / 2), bs(rows * cols / 16);
    float g = 0;
    quantize_nvfp4(w.data(), rows, cols, packed.data(), bs.data(), &g);
    EXPECT_FLOAT_EQ(g, 0.9f / (6.0f * 448.0f));
    std::vector<float> back(w.size());
    dequantize_nvfp4(packed.data(), bs.data(), g, rows, cols, back.data());
    // Every element within half an E2M1 step of its block: |err| <= 1 (the
    // largest step, between 4 and 6) × the block's scale / 2 — plus the
    // block scale's own E4M3 rounding (<= 1/16 relative).
    for (int r = 0; r < rows; ++r)
        for (int b = 0; b < cols / 16; ++b) {
            const float d = fp8_e4m3_to_float(bs[r * cols / 16 + b]) * g;
            for (int i = 0; i < 16; ++i) {
                const int k = r * cols + 16 * b + i;
                EXPECT_LE(std::fabs(back[k] - w[k]), d * 1.0f + 1e-12f) << "element " << k;
            }
        }
    // Representable values come back exactly; element 2i is the low nibble.
    std::vector<float> exact(16 * 2);
    for (int i = 0; i < 32; ++i) exact[i] = fp4_e2m1_to_float(static_cast<uint8_t>(i % 16)) * (i < 16 ? 1.0f : 0.5f);
    std::vector<uint8_t> p2(16), b2(2);
    float g2;
    quantize_nvfp4(exact.data(), 1, 32, p2.data(), b2.data(), &g2);
    std::vector<float> e2(32);
    dequantize_nvfp4(p2.data(), b2.data(), g2, 1, 32, e2.data());
    for (int i = 0; i < 32; ++i) EXPECT_FLOAT_EQ(e2[i], exact[i]) << i;
    EXPECT_EQ(p2[0] & 0xF, float_to_fp4_e2m1(exact[0] / (fp8_e4m3_to_float(b2[0]) * g2)));
    EXPECT_THROW(quantize_nvfp4(w.data(), 1, 24, packed.data(), bs.data(), &g), std::exception);
}

// ---------------------------------------------------------------- quern's weight-only layouts

// The decode table the kernels and the loader use is fp8_e4m3_to_float.
TEST(Fp8, E4M3TableMatchesTheDecoder) {
    for (int v = 0; v < 256; ++v) {
        const float a = kFp8E4M3Values[static_cast<size_t>(v)], b = fp8_e4m3_to_float(static_cast<uint8_t>(v));
        if (std::isnan(b)) {
            EXPECT_TRUE(std::isnan(a)) << v;
        } else {
            EXPECT_EQ(std::memcmp(&a, &b, 4), 0) << v << ": " << a << " vs " << b;  // -0 included
        }
    }
}

// F8_E4M3_B32: 36-byte blocks (f32 d, 32 codes); each element decodes to
// exactly e4m3(q) * d; the reference quantizer takes d = absmax / 448 per block.
TEST(Fp8, F8E4M3B32BlocksDecodeExactly) {
    ASSERT_EQ(dtype_info(DType::F8_E4M3_B32).block_size, 32);
    ASSERT_EQ(dtype_info(DType::F8_E4M3_B32).type_size, 36);
    ASSERT_EQ(row_size(DType::F8_E4M3_B32, 96), 3u * 36u);
    std::mt19937 rng(17);
    std::normal_distribution<float> g(0.0f, 1.0f);
    const int64_t k = 96;
    std::vector<float> x(k), y(k);
    for (auto& v : x) v = g(rng);
    for (int64_t i = 32; i < 64; ++i) x[static_cast<size_t>(i)] = 0.0f;  // an all-zero block: d = 1
    std::vector<uint8_t> q(row_size(DType::F8_E4M3_B32, k));
    quantize_row_ref(DType::F8_E4M3_B32, x.data(), q.data(), k);
    dequantize_row_ref(DType::F8_E4M3_B32, q.data(), y.data(), k);
    for (int64_t b = 0; b < k / 32; ++b) {
        block_f8_b32 blk;
        std::memcpy(&blk, q.data() + b * 36, 36);
        float am = 0.0f;
        for (int j = 0; j < 32; ++j) am = std::max(am, std::fabs(x[static_cast<size_t>(b * 32 + j)]));
        EXPECT_EQ(blk.d, am > 0 ? am / 448.0f : 1.0f);
        for (int j = 0; j < 32; ++j) {
            const size_t i = static_cast<size_t>(b * 32 + j);
            EXPECT_EQ(blk.qs[j], float_to_fp8_e4m3(x[i] / blk.d));
            EXPECT_EQ(y[i], fp8_e4m3_to_float(blk.qs[j]) * blk.d);
            EXPECT_LE(std::fabs(y[i] - x[i]), std::fabs(x[i]) / 16 + 1e-6f);  // 3 mantissa bits
        }
    }
    EXPECT_THROW(dequantize_row_ref(DType::F8_E4M3_B32, q.data(), y.data(), 40), Error);
}

// NVFP4 (quern's): 40-byte blocks of 64 elements (f32 global d, 4 E4M3 group
// scales, 32 bytes of E2M1 pairs, even element in the low nibble); element j
// decodes to e2m1(q) * f32(e4m3(sc[j / 16]) * d), the same values as the
// checkpoint layout's dequantize_nvfp4 with the same codes and scales.
TEST(Fp8, Nvfp4BlocksDecodeAsTheCheckpointLayout) {
    ASSERT_EQ(dtype_info(DType::NVFP4).block_size, 64);
    ASSERT_EQ(dtype_info(DType::NVFP4).type_size, 40);
    std::mt19937 rng(23);
    std::normal_distribution<float> g(0.0f, 1.0f);
    const int64_t k = 128;
    std::vector<float> x(k), y(k), ref(k);
    for (auto& v : x) v = g(rng);
    for (int i = 16; i < 32; ++i) x[static_cast<size_t>(i)] = 0.0f;  // an all-zero group
    std::vector<uint8_t> q(row_size(DType::NVFP4, k));
    quantize_row_ref(DType::NVFP4, x.data(), q.data(), k);
    dequantize_row_ref(DType::NVFP4, q.data(), y.data(), k);
    // The same codes in the checkpoint layout: [k/2] packed, [k/16] scales, one global.
    std::vector<uint8_t> packed(k / 2), scales(k / 16);
    float global = 0.0f;
    for (int64_t b = 0; b < k / 64; ++b) {
        block_nvfp4 blk;
        std::memcpy(&blk, q.data() + b * 40, 40);
        if (b == 0) global = blk.d;
        EXPECT_EQ(blk.d, global);
        std::memcpy(scales.data() + b * 4, blk.sc, 4);
        std::memcpy(packed.data() + b * 32, blk.qs, 32);
    }
    float am = 0.0f;
    for (float v : x) am = std::max(am, std::fabs(v));
    EXPECT_EQ(global, am / (6.0f * 448.0f));
    EXPECT_EQ(scales[1], float_to_fp8_e4m3(1.0f));  // the zero group: scale 1, as ModelOpt writes it
    dequantize_nvfp4(packed.data(), scales.data(), global, 1, k, ref.data());
    for (int64_t i = 0; i < k; ++i) {
        EXPECT_EQ(y[static_cast<size_t>(i)], ref[static_cast<size_t>(i)]) << i;
        EXPECT_EQ(y[static_cast<size_t>(i)], fp4_e2m1_to_float(i % 2 ? packed[i / 2] >> 4 : packed[i / 2] & 0xF) *
                                                 (fp8_e4m3_to_float(scales[i / 16]) * global))
            << i;
    }
    EXPECT_THROW(quantize_row_ref(DType::NVFP4, x.data(), q.data(), 96), Error);
}

// MXFP4 (GGML's block_mxfp4, OCP MX v1.0 FP4): 17-byte blocks of 32, an E8M0
// scale byte then 16 code bytes, element j < 16 in the low nibble of byte j
// and element j + 16 in its high nibble. Every code in both nibbles, at
// several scales, decodes to the spec's value: E2M1 (sign, 2 exponent bits of
// bias 1, 1 mantissa bit) times 2^(e - 127); GGML's equivalent form, its
// doubled integer table {0, 1, 2, 3, 4, 6, 8, 12} times 2^(e - 128), agrees.
TEST(Fp8, Mxfp4BlocksDecodeAsTheSpecSays) {
    ASSERT_EQ(static_cast<uint32_t>(DType::MXFP4), 39u);  // GGML_TYPE_MXFP4
    ASSERT_EQ(dtype_info(DType::MXFP4).block_size, 32);
    ASSERT_EQ(dtype_info(DType::MXFP4).type_size, 17);
    ASSERT_EQ(row_size(DType::MXFP4, 64), 34u);
    const auto spec = [](int code) {  // E2M1 from its fields
        const int s = code >> 3, ex = (code >> 1) & 3, m = code & 1;
        const double mag = ex == 0 ? m * 0.5 : (1.0 + m * 0.5) * std::ldexp(1.0, ex - 1);
        return s ? -mag : mag;
    };
    const int kDoubled[8] = {0, 1, 2, 3, 4, 6, 8, 12};
    for (int e : {0, 1, 100, 126, 127, 128, 140, 250}) {  // 254 · 6 would overflow f32
        uint8_t blk[17];
        blk[0] = static_cast<uint8_t>(e);
        for (int j = 0; j < 16; ++j) blk[1 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
        float y[32];
        dequantize_row_ref(DType::MXFP4, blk, y, 32);
        for (int j = 0; j < 32; ++j) {
            const int code = j < 16 ? j : 15 - (j - 16);
            const double want = spec(code) * std::ldexp(1.0, e - 127);
            EXPECT_EQ(static_cast<double>(y[j]), want) << "e " << e << " element " << j;
            const double ggml = (code & 8 ? -1 : 1) * kDoubled[code & 7] * std::ldexp(1.0, e - 128);
            EXPECT_EQ(static_cast<double>(y[j]), ggml) << "e " << e << " element " << j;
        }
        EXPECT_EQ(e8m0_to_float(static_cast<uint8_t>(e)), std::ldexp(1.0f, e - 127));
    }
    EXPECT_TRUE(std::isnan(e8m0_to_float(0xFF)));
}

// The MXFP4 quantizer: the spec's shared exponent floor(log2(amax)) - 2, each
// element the nearest E2M1 value of x / scale (ties to even, saturating at
// 6); an all-zero block gets e = 0 and zero codes.
TEST(Fp8, Mxfp4QuantizerTakesTheSharedExponent) {
    std::mt19937 rng(31);
    std::normal_distribution<float> g(0.0f, 1.0f);
    const int64_t k = 128;
    std::vector<float> x(k), y(k);
    for (auto& v : x) v = g(rng) * 3.0f;
    for (int i = 32; i < 64; ++i) x[static_cast<size_t>(i)] = 0.0f;
    x[70] = 1e-30f;  // a block of one tiny element: e = 25
    for (int i = 64; i < 96; ++i)
        if (i != 70) x[static_cast<size_t>(i)] = 0.0f;
    std::vector<uint8_t> q(row_size(DType::MXFP4, k));
    quantize_row_ref(DType::MXFP4, x.data(), q.data(), k);
    dequantize_row_ref(DType::MXFP4, q.data(), y.data(), k);
    for (int64_t b = 0; b < k / 32; ++b) {
        block_mxfp4 blk;
        std::memcpy(&blk, q.data() + b * 17, 17);
        float am = 0.0f;
        for (int j = 0; j < 32; ++j) am = std::max(am, std::fabs(x[static_cast<size_t>(b * 32 + j)]));
        const int want_e = am > 0.0f ? static_cast<int>(std::floor(std::log2(am))) - 2 + 127 : 0;
        EXPECT_EQ(blk.e, want_e) << "block " << b;
        const float s = std::ldexp(1.0f, blk.e - 127);
        for (int j = 0; j < 32; ++j) {
            const size_t i = static_cast<size_t>(b * 32 + j);
            const uint8_t code = j < 16 ? blk.qs[j] & 0xF : blk.qs[j - 16] >> 4;
            EXPECT_EQ(code, float_to_fp4_e2m1(x[i] / s)) << i;
            EXPECT_EQ(y[i], fp4_e2m1_to_float(code) * s) << i;
            // within half a step of the largest binade, or saturated at 6 · s
            EXPECT_LE(std::fabs(y[i] - x[i]), std::max(s, std::fabs(x[i]) - 6.0f * s) + 1e-38f) << i;
        }
    }
    EXPECT_THROW(quantize_row_ref(DType::MXFP4, x.data(), q.data(), 48), Error);
}
