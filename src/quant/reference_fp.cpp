// Scalar reference rows of quern's FP8 and NVFP4 weight layouts
// (F8_E4M3_B32, NVFP4; quant/blocks.h) and of GGML's MXFP4. Decoding is exact: each element is
// the f32 product the SIMD kernels compute (e4m3(q) * d; e2m1(q) * s with
// s = f32(e4m3(sc) * d)), and the kernels are tested against these.
//
// The quantizers make weights for tests and synthetic models; checkpoints
// keep their own codes (the loader repacks them, src/model/hf_quant.cpp):
//   F8_E4M3_B32: d = absmax(block) / 448 (1 for an all-zero block),
//                q = E4M3(x / d), saturating.
//   NVFP4:       d = absmax(row) / (6 * 448) (1 for an all-zero row), the
//                row standing in for the tensor; per 16 elements
//                sc = E4M3(absmax(group) / (6 * d)), an all-zero group
//                taking sc = E4M3(1) as NVIDIA's model optimizer does;
//                q = E2M1(x / f32(e4m3(sc) * d)) (0 where that scale is 0).
//   MXFP4:       GGML's layout of the OCP MX FP4 format; the scale is the
//                spec's shared exponent floor(log2(absmax(block))) − 2 (the
//                largest E2M1 exponent), e = 0 for an all-zero block, and
//                q = E2M1(x / 2^(e − 127)), saturating at ±6.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/blocks.h"
#include "quant/fp8.h"
#include "quant/ref_rows.h"

namespace quern::ref {

namespace {

float absmax(const float* x, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
    return m;
}

}  // namespace

void to_float_f8_b32(const void* x, float* y, int64_t k) {
    check_row_length("F8_E4M3_B32", QK_F8, k);
    const auto* in = static_cast<const uint8_t*>(x);
    for (int64_t b = 0; b < k / QK_F8; ++b) {
        block_f8_b32 blk;
        std::memcpy(&blk, in + b * sizeof(blk), sizeof(blk));
        for (int j = 0; j < QK_F8; ++j) y[b * QK_F8 + j] = fp8_e4m3_to_float(blk.qs[j]) * blk.d;
    }
}

void from_float_f8_b32(const float* x, void* y, int64_t k) {
    check_row_length("F8_E4M3_B32", QK_F8, k);
    auto* out = static_cast<uint8_t*>(y);
    for (int64_t b = 0; b < k / QK_F8; ++b) {
        const float* xb = x + b * QK_F8;
        const float m = absmax(xb, QK_F8);
        block_f8_b32 blk;
        blk.d = m > 0.0f ? m / 448.0f : 1.0f;
        for (int j = 0; j < QK_F8; ++j) blk.qs[j] = float_to_fp8_e4m3(xb[j] / blk.d);
        std::memcpy(out + b * sizeof(blk), &blk, sizeof(blk));
    }
}

void to_float_nvfp4(const void* x, float* y, int64_t k) {
    check_row_length("NVFP4", QK_NVFP4, k);
    const auto* in = static_cast<const uint8_t*>(x);
    for (int64_t b = 0; b < k / QK_NVFP4; ++b) {
        block_nvfp4 blk;
        std::memcpy(&blk, in + b * sizeof(blk), sizeof(blk));
        float* yb = y + b * QK_NVFP4;
        for (int g = 0; g < QK_NVFP4 / NVFP4_GROUP; ++g) {
            const float s = fp8_e4m3_to_float(blk.sc[g]) * blk.d;
            for (int i = 0; i < NVFP4_GROUP / 2; ++i) {
                const uint8_t q = blk.qs[g * NVFP4_GROUP / 2 + i];
                yb[g * NVFP4_GROUP + 2 * i] = fp4_e2m1_to_float(q & 0xF) * s;
                yb[g * NVFP4_GROUP + 2 * i + 1] = fp4_e2m1_to_float(q >> 4) * s;
            }
        }
    }
}

void from_float_nvfp4(const float* x, void* y, int64_t k) {
    check_row_length("NVFP4", QK_NVFP4, k);
    auto* out = static_cast<uint8_t*>(y);
    const float amax = absmax(x, k);
    const float d = amax > 0.0f ? amax / (6.0f * 448.0f) : 1.0f;
    for (int64_t b = 0; b < k / QK_NVFP4; ++b) {
        block_nvfp4 blk;
        blk.d = d;
        for (int g = 0; g < QK_NVFP4 / NVFP4_GROUP; ++g) {
            const float* xg = x + b * QK_NVFP4 + g * NVFP4_GROUP;
            const float gm = absmax(xg, NVFP4_GROUP);
            blk.sc[g] = float_to_fp8_e4m3(gm > 0.0f ? gm / (6.0f * d) : 1.0f);
            const float s = fp8_e4m3_to_float(blk.sc[g]) * d;
            for (int i = 0; i < NVFP4_GROUP / 2; ++i) {
                const uint8_t lo = s > 0.0f ? float_to_fp4_e2m1(xg[2 * i] / s) : 0;
                const uint8_t hi = s > 0.0f ? float_to_fp4_e2m1(xg[2 * i + 1] / s) : 0;
                blk.qs[g * NVFP4_GROUP / 2 + i] = static_cast<uint8_t>(lo | (hi << 4));
            }
        }
        std::memcpy(out + b * sizeof(blk), &blk, sizeof(blk));
    }
}

void to_float_mxfp4(const void* x, float* y, int64_t k) {
    check_row_length("MXFP4", QK_MXFP4, k);
    const auto* in = static_cast<const uint8_t*>(x);
    for (int64_t b = 0; b < k / QK_MXFP4; ++b) {
        block_mxfp4 blk;
        std::memcpy(&blk, in + b * sizeof(blk), sizeof(blk));
        const float s = e8m0_to_float(blk.e);
        float* yb = y + b * QK_MXFP4;
        for (int j = 0; j < QK_MXFP4 / 2; ++j) {
            yb[j] = fp4_e2m1_to_float(blk.qs[j] & 0xF) * s;
            yb[j + QK_MXFP4 / 2] = fp4_e2m1_to_float(blk.qs[j] >> 4) * s;
        }
    }
}

void from_float_mxfp4(const float* x, void* y, int64_t k) {
    check_row_length("MXFP4", QK_MXFP4, k);
    auto* out = static_cast<uint8_t*>(y);
    for (int64_t b = 0; b < k / QK_MXFP4; ++b) {
        const float* xb = x + b * QK_MXFP4;
        const float m = absmax(xb, QK_MXFP4);
        block_mxfp4 blk;
        int ex = 0;
        if (m > 0.0f && std::isfinite(m)) std::frexp(m, &ex);  // m = f · 2^ex, f in [0.5, 1): floor(log2 m) = ex − 1
        blk.e = m > 0.0f ? static_cast<uint8_t>(std::clamp(ex - 1 - 2 + 127, 0, 254)) : 0;
        const float s = e8m0_to_float(blk.e);
        for (int j = 0; j < QK_MXFP4 / 2; ++j) {
            const uint8_t lo = float_to_fp4_e2m1(xb[j] / s);
            const uint8_t hi = float_to_fp4_e2m1(xb[j + QK_MXFP4 / 2] / s);
            blk.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
        }
        std::memcpy(out + b * sizeof(blk), &blk, sizeof(blk));
    }
}

}  // namespace quern::ref
