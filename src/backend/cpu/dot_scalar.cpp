// Scalar (portable C++) dot-product kernels: one packed weight row · one
// activation row, for every weight type. The readable definition of each
// block format's integer dot product; used at ISA level "scalar" and as the
// fallback on CPUs without AVX2.
//
// Layouts: weight rows are GGUF blocks (src/quant/blocks.h); activation rows
// are blocks of the partner type (Q8_0 / Q8_1 / Q8_K) for quantized weights,
// plain floats for F32 / F16 / BF16 weights and the weight-only F8_E4M3_B32 /
// NVFP4 (decoded weight by weight). K is a multiple of the block size.
// Per block: integer sum of products, then one float multiply-add with the
// block scales. Any alignment (blocks are copied with memcpy).
// Work mapping and threading live in matmul.cpp; these are compute-bound.
#include <cstddef>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "core/fp16.h"
#include "quant/blocks.h"
#include "quant/fp8.h"
#include "quant/reference.h"

namespace quern::cpu {

DType act_type_for(DType w) {
    switch (w) {
        case DType::Q4_0:
        case DType::Q5_0:
        case DType::Q8_0:
        case DType::MXFP4: return DType::Q8_0;
        case DType::Q4_1:
        case DType::Q5_1: return DType::Q8_1;
        case DType::Q2_K:
        case DType::Q3_K:
        case DType::Q4_K:
        case DType::Q5_K:
        case DType::Q6_K: return DType::Q8_K;
        default: return DType::F32;
    }
}

int subblock_for(DType w) {
    switch (w) {
        case DType::Q2_K:
        case DType::Q3_K:
        case DType::Q6_K: return 16;
        default: return 32;
    }
}

int umax_for(DType w) {
    switch (w) {
        case DType::Q2_K: return 3;
        case DType::Q3_K: return 7;
        case DType::Q4_0:
        case DType::Q4_1:
        case DType::Q4_K: return 15;
        case DType::Q5_0:
        case DType::Q5_1:
        case DType::Q5_K: return 31;
        case DType::Q6_K: return 63;
        case DType::MXFP4: return 24;
        default: return 255;
    }
}

namespace scalar {

namespace {

template <class B>
B load(const void* p, int64_t i) {
    B b;
    std::memcpy(&b, static_cast<const uint8_t*>(p) + i * static_cast<int64_t>(sizeof(B)), sizeof(B));
    return b;
}

inline float h2f(uint16_t h) { return fp16_to_fp32(h); }

// ---- 32-element blocks: values in natural element order, as small ints.
// Q4: element j < 16 is the low nibble of qs[j], element j + 16 the high one.
inline void nibbles32(const uint8_t* qs, int v[32]) {
    for (int j = 0; j < 16; ++j) {
        v[j] = qs[j] & 0x0F;
        v[j + 16] = qs[j] >> 4;
    }
}
// Q5: as Q4 plus bit e of qh (little-endian uint32) as bit 4 of element e.
inline void fives32(const uint8_t* qs, const uint8_t* qh_bytes, int v[32]) {
    uint32_t qh;
    std::memcpy(&qh, qh_bytes, 4);
    nibbles32(qs, v);
    for (int e = 0; e < 32; ++e) v[e] |= static_cast<int>((qh >> e) & 1u) << 4;
}
inline int idot32(const int v[32], const int8_t* a, int bias) {
    int s = 0;
    for (int j = 0; j < 32; ++j) s += (v[j] - bias) * a[j];
    return s;
}

float dot_q4_0(int64_t K, const void* w, const void* x) {
    float acc = 0.0f;
    int v[32];
    for (int64_t i = 0; i < K / QK4_0; ++i) {
        const auto b = load<block_q4_0>(w, i);
        const auto a = load<block_q8_0>(x, i);
        nibbles32(b.qs, v);
        acc += static_cast<float>(idot32(v, a.qs, 8)) * (h2f(b.d) * h2f(a.d));
    }
    return acc;
}

// MXFP4 against Q8_0: the doubled E2M1 values v = kMxfp4U[q] - 12 (integers
// up to ±12) summed with the activations exactly, then times 2^(e - 128) * da.
float dot_mxfp4(int64_t K, const void* w, const void* x) {
    float acc = 0.0f;
    int v[32];
    for (int64_t i = 0; i < K / QK_MXFP4; ++i) {
        const auto b = load<block_mxfp4>(w, i);
        const auto a = load<block_q8_0>(x, i);
        nibbles32(b.qs, v);
        for (int& q : v) q = kMxfp4U[q];
        acc += static_cast<float>(idot32(v, a.qs, 12)) * (mxfp4_half_scale(b.e) * h2f(a.d));
    }
    return acc;
}

float dot_q4_1(int64_t K, const void* w, const void* x) {
    float acc = 0.0f;
    int v[32];
    for (int64_t i = 0; i < K / QK4_1; ++i) {
        const auto b = load<block_q4_1>(w, i);
        const auto a = load<block_q8_1>(x, i);
        nibbles32(b.qs, v);
        // sum (q*d + m) * a*da = d*da*sum(q*a) + m * s,  s = da * sum(a)
        acc += static_cast<float>(idot32(v, a.qs, 0)) * (h2f(b.d) * h2f(a.d)) + h2f(b.m) * h2f(a.s);
    }
    return acc;
}

float dot_q5_0(int64_t K, const void* w, const void* x) {
    float acc = 0.0f;
    int v[32];
    for (int64_t i = 0; i < K / QK5_0; ++i) {
        const auto b = load<block_q5_0>(w, i);
        const auto a = load<block_q8_0>(x, i);
        fives32(b.qs, b.qh, v);
        acc += static_cast<float>(idot32(v, a.qs, 16)) * (h2f(b.d) * h2f(a.d));
    }
    return acc;
}

float dot_q5_1(int64_t K, const void* w, const void* x) {
    float acc = 0.0f;
    int v[32];
    for (int64_t i = 0; i < K / QK5_1; ++i) {
        const auto b = load<block_q5_1>(w, i);
        const auto a = load<block_q8_1>(x, i);
        fives32(b.qs, b.qh, v);
        acc += static_cast<float>(idot32(v, a.qs, 0)) * (h2f(b.d) * h2f(a.d)) + h2f(b.m) * h2f(a.s);
    }
    return acc;
}

float dot_q8_0(int64_t K, const void* w, const void* x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < K / QK8_0; ++i) {
        const auto b = load<block_q8_0>(w, i);
        const auto a = load<block_q8_0>(x, i);
        int s = 0;
        for (int j = 0; j < 32; ++j) s += b.qs[j] * a.qs[j];
        acc += static_cast<float>(s) * (h2f(b.d) * h2f(a.d));
    }
    return acc;
}

// ---- K-quants (256-element super-blocks) against Q8_K.

// Element e = 128h + 32j + l: bits 2j..2j+1 of qs[32h + l]; sub-block e/16.
float dot_q2_K(int64_t K, const void* w, const void* x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < K / QK_K; ++i) {
        const auto b = load<block_q2_K>(w, i);
        const auto a = load<block_q8_K>(x, i);
        int sumi = 0, summ = 0;
        for (int s = 0; s < 16; ++s) {
            int t = 0;
            for (int e = 16 * s; e < 16 * s + 16; ++e) {
                const int h = e / 128, j = (e % 128) / 32, l = e % 32;
                t += ((b.qs[32 * h + l] >> (2 * j)) & 3) * a.qs[e];
            }
            sumi += (b.scales[s] & 0xF) * t;
            summ += (b.scales[s] >> 4) * a.bsums[s];
        }
        acc += a.d * (h2f(b.d) * static_cast<float>(sumi) - h2f(b.dmin) * static_cast<float>(summ));
    }
    return acc;
}

// Q3_K's 16 six-bit scales from the 12-byte packing: low 4 bits from
// scales[s] (s < 8) or scales[s-8] >> 4, high 2 bits from scales[8 + s%4].
inline int q3k_scale(const uint8_t* sc, int s) {
    const int lo = s < 8 ? (sc[s] & 0xF) : (sc[s - 8] >> 4);
    const int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

// Element e = 128h + 32j + l: low 2 bits as Q2_K, high bit = bit 4h+j of
// hmask[l]; value = low | high << 2, minus 4.
float dot_q3_K(int64_t K, const void* w, const void* x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < K / QK_K; ++i) {
        const auto b = load<block_q3_K>(w, i);
        const auto a = load<block_q8_K>(x, i);
        int sumi = 0;
        for (int s = 0; s < 16; ++s) {
            int t = 0;
            for (int e = 16 * s; e < 16 * s + 16; ++e) {
                const int h = e / 128, j = (e % 128) / 32, l = e % 32;
                const int lo = (b.qs[32 * h + l] >> (2 * j)) & 3;
                const int hi = (b.hmask[l] >> (4 * h + j)) & 1;
                t += (lo + 4 * hi - 4) * a.qs[e];
            }
            sumi += q3k_scale(b.scales, s) * t;
        }
        acc += a.d * h2f(b.d) * static_cast<float>(sumi);
    }
    return acc;
}

inline void scale_min_k4(int j, const uint8_t* q, int& sc, int& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Element e = 64g + 32t + l: nibble t of qs[32g + l]; (Q5_K: plus bit e/32 of qh[l] as bit 4).
template <bool Five, class B>
float dot_q45_K(int64_t K, const void* w, const void* x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < K / QK_K; ++i) {
        const auto b = load<B>(w, i);
        const auto a = load<block_q8_K>(x, i);
        int sumi = 0, summ = 0;
        for (int s = 0; s < 8; ++s) {
            int sc, m;
            scale_min_k4(s, b.scales, sc, m);
            int t = 0;
            for (int e = 32 * s; e < 32 * s + 32; ++e) {
                const int g = e / 64, tt = (e % 64) / 32, l = e % 32;
                int q = (b.qs[32 * g + l] >> (4 * tt)) & 0xF;
                if constexpr (Five) q |= ((b.qh[l] >> (e / 32)) & 1) << 4;
                t += q * a.qs[e];
            }
            sumi += sc * t;
            summ += m * (a.bsums[2 * s] + a.bsums[2 * s + 1]);
        }
        acc += a.d * (h2f(b.d) * static_cast<float>(sumi) - h2f(b.dmin) * static_cast<float>(summ));
    }
    return acc;
}

// Element e = 128h + 32t + l: low nibble (t < 2) or high nibble (t >= 2) of
// ql[64h + 32(t&1) + l], high 2 bits = bits 2t..2t+1 of qh[32h + l]; minus 32.
float dot_q6_K(int64_t K, const void* w, const void* x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < K / QK_K; ++i) {
        const auto b = load<block_q6_K>(w, i);
        const auto a = load<block_q8_K>(x, i);
        int sumi = 0;
        for (int s = 0; s < 16; ++s) {
            int t = 0;
            for (int e = 16 * s; e < 16 * s + 16; ++e) {
                const int h = e / 128, tq = (e % 128) / 32, l = e % 32;
                const int lo = (b.ql[64 * h + 32 * (tq & 1) + l] >> (4 * (tq >> 1))) & 0xF;
                const int hi = (b.qh[32 * h + l] >> (2 * tq)) & 3;
                t += ((lo | (hi << 4)) - 32) * a.qs[e];
            }
            sumi += b.scales[s] * t;
        }
        acc += a.d * h2f(b.d) * static_cast<float>(sumi);
    }
    return acc;
}

// ---- float weights · float activations (four partial sums).
template <class Cvt>
float dot_float(int64_t K, const void* w, const void* x, Cvt cvt) {
    const float* xf = static_cast<const float*>(x);
    float s[4] = {0, 0, 0, 0};
    int64_t k = 0;
    for (; k + 4 <= K; k += 4)
        for (int j = 0; j < 4; ++j) s[j] += cvt(w, k + j) * xf[k + j];
    for (; k < K; ++k) s[0] += cvt(w, k) * xf[k];
    return (s[0] + s[1]) + (s[2] + s[3]);
}
float dot_f32(int64_t K, const void* w, const void* x) {
    return dot_float(K, w, x, [](const void* p, int64_t i) {
        float f;
        std::memcpy(&f, static_cast<const uint8_t*>(p) + 4 * i, 4);
        return f;
    });
}
float dot_f16(int64_t K, const void* w, const void* x) {
    return dot_float(K, w, x, [](const void* p, int64_t i) {
        uint16_t h;
        std::memcpy(&h, static_cast<const uint8_t*>(p) + 2 * i, 2);
        return fp16_to_fp32(h);
    });
}
float dot_bf16(int64_t K, const void* w, const void* x) {
    return dot_float(K, w, x, [](const void* p, int64_t i) {
        uint16_t h;
        std::memcpy(&h, static_cast<const uint8_t*>(p) + 2 * i, 2);
        return bf16_to_fp32(h);
    });
}

// Weight-only FP8 / NVFP4: each weight decoded to the reference's f32 value
// (quant/reference_fp.cpp), then summed as the float types are.
float dot_f8_b32(int64_t K, const void* w, const void* x) {
    return dot_float(K, w, x, [](const void* p, int64_t i) {
        const uint8_t* b = static_cast<const uint8_t*>(p) + (i / QK_F8) * sizeof(block_f8_b32);
        float d;
        std::memcpy(&d, b, 4);
        return kFp8E4M3Values[b[offsetof(block_f8_b32, qs) + i % QK_F8]] * d;
    });
}
float dot_nvfp4(int64_t K, const void* w, const void* x) {
    return dot_float(K, w, x, [](const void* p, int64_t i) {
        const uint8_t* b = static_cast<const uint8_t*>(p) + (i / QK_NVFP4) * sizeof(block_nvfp4);
        const int64_t j = i % QK_NVFP4;
        float d;
        std::memcpy(&d, b, 4);
        const float s = kFp8E4M3Values[b[offsetof(block_nvfp4, sc) + j / NVFP4_GROUP]] * d;
        const uint8_t q = b[offsetof(block_nvfp4, qs) + j / 2];
        return fp4_e2m1_to_float(j % 2 ? q >> 4 : q & 0xF) * s;
    });
}

template <ScalarDotFn Dot>
void fgemm(int64_t K, const void* w, size_t ldw, int nr, const float* x, size_t ldx, int nc, float* y, size_t ldy) {
    for (int r = 0; r < nr; ++r)
        for (int c = 0; c < nc; ++c)
            y[c * ldy + r] = Dot(K, static_cast<const uint8_t*>(w) + r * ldw, x + c * ldx);
}

void q8_0(const float* x, void* y, int64_t k) { quantize_row_ref(DType::Q8_0, x, y, k); }
void q8_1(const float* x, void* y, int64_t k) { quantize_row_ref(DType::Q8_1, x, y, k); }
void q8_K(const float* x, void* y, int64_t k) { quantize_row_ref(DType::Q8_K, x, y, k); }

}  // namespace

const ActQuantizers quantizers{q8_0, q8_1, q8_K};

const FKernels fkernels{4,
                        1,
                        fgemm<dot_f32>,
                        fgemm<dot_f16>,
                        fgemm<dot_bf16>,
                        fgemm<dot_f32>,
                        fgemm<dot_f16>,
                        fgemm<dot_bf16>,
                        fgemm<dot_f8_b32>,
                        fgemm<dot_nvfp4>,
                        fgemm<dot_f8_b32>,
                        fgemm<dot_nvfp4>};

ScalarDotFn dot_fn(DType t) {
    switch (t) {
        case DType::F32: return dot_f32;
        case DType::F16: return dot_f16;
        case DType::BF16: return dot_bf16;
        case DType::F8_E4M3_B32: return dot_f8_b32;
        case DType::NVFP4: return dot_nvfp4;
        case DType::MXFP4: return dot_mxfp4;
        case DType::Q4_0: return dot_q4_0;
        case DType::Q4_1: return dot_q4_1;
        case DType::Q5_0: return dot_q5_0;
        case DType::Q5_1: return dot_q5_1;
        case DType::Q8_0: return dot_q8_0;
        case DType::Q2_K: return dot_q2_K;
        case DType::Q3_K: return dot_q3_K;
        case DType::Q4_K: return dot_q45_K<false, block_q4_K>;
        case DType::Q5_K: return dot_q45_K<true, block_q5_K>;
        case DType::Q6_K: return dot_q6_K;
        default: return nullptr;
    }
}

}  // namespace scalar
}  // namespace quern::cpu
