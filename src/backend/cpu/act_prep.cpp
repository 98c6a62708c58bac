// Activation preparation for the SIMD quantized kernels (portable C++; the
// work is O(n*K), small next to the O(n*M*K) product).
//
// From rows of Q8 blocks (Q8_0 / Q8_1: 32 elements, fp16 scale; Q8_K: 256
// elements, fp32 scale, 16-element sums) it builds, per weight sub-block of G
// elements (16 or 32): da = activation scale, dsa = da * sum(a) (exact
// integer sum, not Q8_1's rounded fp16 s field), and the int8 values either
// in natural order (ActRow, GEMV) or as a column panel a[K/4][ncp][4] (GEMM).
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

void prep_row_generic(DType act, int G, int64_t K, const void* blocks, int8_t* a, float* da, float* dsa) {
    for_each_subblock(act, G, K, blocks, [&](int64_t s, const int8_t* qs, float d, int sum) {
        std::memcpy(a + s * G, qs, static_cast<size_t>(G));
        da[s] = d;
        dsa[s] = d * static_cast<float>(sum);
    });
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
