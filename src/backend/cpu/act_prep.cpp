// Activation preparation for the SIMD quantized kernels (portable C++; the
// work is O(n*K), small next to the O(n*M*K) product).
//
// From rows of Q8 blocks (Q8_0 / Q8_1: 32 elements, fp16 scale; Q8_K: 256
// elements, fp32 scale, 16-element sums) it builds
//  * for the GEMM tile, per weight sub-block of G elements (16 or 32):
//    da = activation scale, dsa = da * sum(a) (exact integer sum, not Q8_1's
//    rounded fp16 s field), and the int8 values as a column panel
//    a[K/4][ncp][4] (pack_panel_generic; AVX-512 has a SIMD version);
//  * for the fused GEMV kernels, the GemvAct layouts described below.
#include <cstring>

#include "backend/cpu/kernels.h"
#include "core/fp16.h"
#include "quant/blocks.h"

namespace quern::cpu {

UnpackFn QKernels::unpack(DType t) const {
    switch (t) {
        case DType::Q4_0: return q4_0;
        case DType::Q4_1: return q4_1;
        case DType::Q5_0: return q5_0;
        case DType::Q5_1: return q5_1;
        case DType::Q8_0: return q8_0;
        case DType::Q2_K: return q2_K;
        case DType::Q3_K: return q3_K;
        case DType::Q4_K: return q4_K;
        case DType::Q5_K: return q5_K;
        case DType::Q6_K: return q6_K;
        case DType::MXFP4: return mxfp4;
        default: return nullptr;
    }
}

namespace {

// Calls f(s, qs, da, sum) for each sub-block s of G elements of a Q8 row.
template <class F>
void for_each_subblock(DType act, int G, int64_t K, const void* blocks, F&& f) {
    const auto* p = static_cast<const uint8_t*>(blocks);
    if (act == DType::Q8_K) {
        for (int64_t i = 0; i < K / QK_K; ++i) {
            const uint8_t* b = p + i * static_cast<int64_t>(sizeof(block_q8_K));
            float d;
            std::memcpy(&d, b + offsetof(block_q8_K, d), 4);
            const auto* qs = reinterpret_cast<const int8_t*>(b + offsetof(block_q8_K, qs));
            int16_t bs[QK_K / 16];
            std::memcpy(bs, b + offsetof(block_q8_K, bsums), sizeof bs);
            for (int s = 0; s < QK_K / G; ++s) {
                int sum = bs[s * G / 16];
                if (G == 32) sum += bs[2 * s + 1];
                f(i * (QK_K / G) + s, qs + s * G, d, sum);
            }
        }
    } else {
        // Q8_0 and Q8_1 share the layout of d followed by qs (Q8_1 also has s).
        const size_t bsz = act == DType::Q8_0 ? sizeof(block_q8_0) : sizeof(block_q8_1);
        const size_t qoff = act == DType::Q8_0 ? offsetof(block_q8_0, qs) : offsetof(block_q8_1, qs);
        for (int64_t i = 0; i < K / 32; ++i) {
            const uint8_t* b = p + i * static_cast<int64_t>(bsz);
            uint16_t dh;
            std::memcpy(&dh, b, 2);
            const float d = fp16_to_fp32(dh);
            const auto* qs = reinterpret_cast<const int8_t*>(b + qoff);
            for (int s = 0; s < 32 / G; ++s) {
                int sum = 0;
                for (int j = 0; j < G; ++j) sum += qs[s * G + j];
                f(i * (32 / G) + s, qs + s * G, d, sum);
            }
        }
    }
}

}  // namespace

// ---------------------------------------------------------------- fused GEMV activations
// Layouts (GemvAct), shared by the AVX-512 and AVX2 fused kernels:
//  * Q4_0/Q4_1/Q5_0/Q5_1/MXFP4: groups of 4 blocks (128 elements): a = [a_b[0:16] for
//    b = 0..3][a_b[16:32] for b = 0..3]; 16 lanes per group, lane 4b + q covers
//    elements 4q..4q+3 and 16+4q..16+4q+3 of block b: lf = da_b, lx = int32
//    -B * (sum of those 8 a) for offset types (B = 8, 16; MXFP4: 12), float da * sum for
//    types with a min (Q4_1, Q5_1).
//  * Q8_0: natural order, groups of 4 blocks; 32 lanes per group, lane l covers
//    elements 4l..4l+3: lf = da, lx = int32 -128 * (sum of the 4 a).
//  * K-quants: a in natural order (Q4_K/Q5_K: 32-element sub-blocks in the
//    order 0 2 1 3 4 6 5 7, matching nibble extraction of 64 bytes), kd = Q8_K
//    d per super-block, kb = its 16 bsums (Q4_K/Q5_K: 8 sums of 32).
// Padding up to whole groups is zero.
namespace {

size_t a64(size_t n) { return (n + 63) & ~size_t(63); }

enum class Fam { L4, Q8, K };
Fam family(DType t) {
    switch (t) {
        case DType::Q8_0: return Fam::Q8;
        case DType::Q2_K:
        case DType::Q3_K:
        case DType::Q4_K:
        case DType::Q5_K:
        case DType::Q6_K: return Fam::K;
        default: return Fam::L4;
    }
}

}  // namespace

size_t gemv_scratch_generic(DType w, int64_t K) {
    const int64_t ng = (K / 32 + 3) / 4;
    switch (family(w)) {
        case Fam::L4: return a64(ng * 128) + 2 * a64(ng * 16 * 4);
        case Fam::Q8: return a64(ng * 128) + 2 * a64(ng * 32 * 4);
        case Fam::K: return a64(K) + a64(K / QK_K * 4) + a64(K / QK_K * 32);
    }
    return 0;
}

void gemv_prep_generic(DType w, int64_t K, const void* q8row, uint8_t* buf, GemvAct* out) {
    const auto* src = static_cast<const uint8_t*>(q8row);
    const int64_t nb32 = K / 32;
    const int64_t ng = (nb32 + 3) / 4;
    const Fam fam = family(w);
    if (fam == Fam::K) {
        auto* a = reinterpret_cast<int8_t*>(buf);
        auto* kd = reinterpret_cast<float*>(buf + a64(K));
        auto* kb = reinterpret_cast<int16_t*>(buf + a64(K) + a64(K / QK_K * 4));
        const bool q45 = w == DType::Q4_K || w == DType::Q5_K;
        static constexpr int kOrder[8] = {0, 2, 1, 3, 4, 6, 5, 7};  // Q4_K/Q5_K sub-block order
        for (int64_t i = 0; i < K / QK_K; ++i) {
            const uint8_t* b = src + i * static_cast<int64_t>(sizeof(block_q8_K));
            std::memcpy(&kd[i], b + offsetof(block_q8_K, d), 4);
            int16_t bs[16];
            std::memcpy(bs, b + offsetof(block_q8_K, bsums), 32);
            const uint8_t* qs = b + offsetof(block_q8_K, qs);
            if (q45) {
                for (int s = 0; s < 8; ++s) std::memcpy(a + 256 * i + 32 * s, qs + 32 * kOrder[s], 32);
                for (int s = 0; s < 8; ++s) kb[16 * i + s] = static_cast<int16_t>(bs[2 * s] + bs[2 * s + 1]);
                for (int s = 8; s < 16; ++s) kb[16 * i + s] = 0;
            } else {
                std::memcpy(a + 256 * i, qs, 256);
                std::memcpy(kb + 16 * i, bs, 32);
            }
        }
        *out = GemvAct{a, nullptr, nullptr, kd, kb};
        return;
    }
    const bool q81 = w == DType::Q4_1 || w == DType::Q5_1;
    const size_t bsz = q81 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const size_t qoff = q81 ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
    auto* a = reinterpret_cast<int8_t*>(buf);
    auto* lf = reinterpret_cast<float*>(buf + a64(ng * 128));
    const int lanes = fam == Fam::Q8 ? 32 : 16;
    void* lx = buf + a64(ng * 128) + a64(ng * lanes * 4);
    std::memset(buf, 0, gemv_scratch_generic(w, K));
    const int bias = w == DType::Q4_0    ? 8
                     : w == DType::Q5_0  ? 16
                     : w == DType::MXFP4 ? 12
                     : w == DType::Q8_0  ? 128
                                         : 0;
    for (int64_t i = 0; i < nb32; ++i) {
        const uint8_t* b = src + i * static_cast<int64_t>(bsz);
        uint16_t dh;
        std::memcpy(&dh, b, 2);
        const float da = fp16_to_fp32(dh);
        const auto* qs = reinterpret_cast<const int8_t*>(b + qoff);
        const int64_t g = i / 4, bi = i % 4;
        if (fam == Fam::Q8) {
            std::memcpy(a + 128 * g + 32 * bi, qs, 32);
            for (int l = 0; l < 8; ++l) {
                const int s = qs[4 * l] + qs[4 * l + 1] + qs[4 * l + 2] + qs[4 * l + 3];
                lf[32 * g + 8 * bi + l] = da;
                static_cast<int32_t*>(lx)[32 * g + 8 * bi + l] = -bias * s;
            }
        } else {
            std::memcpy(a + 128 * g + 16 * bi, qs, 16);
            std::memcpy(a + 128 * g + 64 + 16 * bi, qs + 16, 16);
            for (int l = 0; l < 4; ++l) {
                int s = 0;
                #pragma GCC unroll 16
                for (int j = 0; j < 4; ++j) s += qs[4 * l + j] + qs[16 + 4 * l + j];
                lf[16 * g + 4 * bi + l] = da;
                if (q81)
                    static_cast<float*>(lx)[16 * g + 4 * bi + l] = da * static_cast<float>(s);
                else
                    static_cast<int32_t*>(lx)[16 * g + 4 * bi + l] = -bias * s;
            }
        }
    }
    *out = GemvAct{a, lf, lx, nullptr, nullptr};
}


void pack_panel_generic(DType act, int G, int64_t K, int ncp, const void* const* rows, int nrows, int8_t* a,
                        float* da, float* dsa) {
    const int64_t nsub = K / G;
    for (int c = 0; c < ncp; ++c) {
        if (c >= nrows) {
            for (int64_t k4 = 0; k4 < K / 4; ++k4) std::memset(a + (k4 * ncp + c) * 4, 0, 4);
            for (int64_t s = 0; s < nsub; ++s) da[s * ncp + c] = dsa[s * ncp + c] = 0.0f;
            continue;
        }
        for_each_subblock(act, G, K, rows[c], [&](int64_t s, const int8_t* qs, float d, int sum) {
            for (int j = 0; j < G; j += 4) std::memcpy(a + ((s * G + j) / 4 * ncp + c) * 4, qs + j, 4);
            da[s * ncp + c] = d;
            dsa[s * ncp + c] = d * static_cast<float>(sum);
        });
    }
}

}  // namespace quern::cpu
