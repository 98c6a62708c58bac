// AVX2+FMA helpers of the non-matmul ops: attention inner products, softmax and
// SwiGLU with a vectorised exp (compiled with -mavx2 -mfma; called only when the
// CPU has them). Lengths are arbitrary; no alignment required.
#include <immintrin.h>

#include <cmath>
#include <cstdint>

namespace quern::cpu {

float dot_f32_avx2(const float* a, const float* b, int n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc0 = _mm256_add_ps(acc0, acc1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float r = _mm_cvtss_f32(s);
    for (; i < n; ++i) r += a[i] * b[i];
    return r;
}

void axpy_f32_avx2(float a, const float* x, float* y, int n) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; ++i) y[i] += a * x[i];
}

namespace {
// e^x for x <= 0 (softmax inputs after subtracting the maximum): 2^(x·log2 e)
// split into an integer power (exponent bits) and 2^f, f in [-0.5, 0.5],
// by a degree-6 polynomial (relative error < 2e-7). Inputs below -87 give 0.
inline __m256 exp_neg_ps(__m256 x) {
    const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 t = _mm256_mul_ps(x, log2e);
    const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_mul_ps(_mm256_sub_ps(t, n), _mm256_set1_ps(0.693147180559945309f));  // ln-units
    // e^f, |f| <= 0.347: Taylor to degree 6
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
inline float hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
}  // namespace

void swiglu_avx2(const float* gate, const float* up, float* out, int64_t n) {
    // silu(g) = g·σ(g); σ from e = e^-|g| (never overflows): g >= 0: 1/(1+e), else e/(1+e)
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = exp_neg_ps(_mm256_or_ps(g, sign));  // e^-|g|
        const __m256 inv = _mm256_div_ps(one, _mm256_add_ps(one, e));
        const __m256 neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
        const __m256 sig = _mm256_blendv_ps(inv, _mm256_mul_ps(e, inv), neg);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up + i)));
    }
    for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void softmax_scaled_avx2(float* x, int64_t n, float scale, float sink) {
    const __m256 vs = _mm256_set1_ps(scale);
    __m256 vm = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);
        _mm256_storeu_ps(x + i, v);
        vm = _mm256_max_ps(vm, v);
    }
    float mx = hmax(vm);
    for (; i < n; ++i) mx = std::fmax(mx, x[i] *= scale);
    const bool has_sink = sink > -INFINITY;
    if (has_sink) mx = std::fmax(mx, sink);
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 vsum = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 e = exp_neg_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmx));
        _mm256_storeu_ps(x + i, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    float sum = hsum(vsum);
    for (; i < n; ++i) sum += (x[i] = std::exp(x[i] - mx));
    if (has_sink) sum += std::exp(sink - mx);
    const __m256 inv = _mm256_set1_ps(1.0f / sum);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    for (; i < n; ++i) x[i] *= 1.0f / sum;
}

namespace {
// For the nh heads h of a group: o[h][d0 .. d0 + 8*NV) = sum over p < len of
// w[h][p] * row(p)[d0 ..], the sums kept in registers (rows as in
// attend_heads_avx2); each value row is loaded once for all heads.
template <int NV, int NH>
void weighted_rows(const float* const* w, const float* const* vb, int64_t bs, int64_t stride, int64_t len, int64_t d0,
                   float* const* o) {
    __m256 acc[NH][NV];
#pragma GCC unroll 8
    for (int h = 0; h < NH; ++h)
#pragma GCC unroll 8
        for (int j = 0; j < NV; ++j) acc[h][j] = _mm256_setzero_ps();
    for (int64_t b0 = 0; b0 < len; b0 += bs) {
        const float* base = vb[b0 / bs] + d0;
        const int64_t nb = len - b0 < bs ? len - b0 : bs;
        for (int64_t i = 0; i < nb; ++i) {
            const float* row = base + i * stride;
            __m256 r[NV];
#pragma GCC unroll 8
            for (int j = 0; j < NV; ++j) r[j] = _mm256_loadu_ps(row + 8 * j);
#pragma GCC unroll 8
            for (int h = 0; h < NH; ++h) {
                const __m256 s = _mm256_broadcast_ss(w[h] + b0 + i);
#pragma GCC unroll 8
                for (int j = 0; j < NV; ++j) acc[h][j] = _mm256_fmadd_ps(s, r[j], acc[h][j]);
            }
        }
    }
#pragma GCC unroll 8
    for (int h = 0; h < NH; ++h)
#pragma GCC unroll 8
        for (int j = 0; j < NV; ++j) _mm256_storeu_ps(o[h] + d0 + 8 * j, acc[h][j]);
}

// NH heads at a time, in chunks of 8 * NV dimensions (NH * NV accumulators).
template <int NH, int NV>
void weighted_heads(const float* const* w, const float* const* vb, int64_t bs, int64_t stride, int64_t len,
                    int head_dim, float* const* o) {
    int64_t d0 = 0;
    for (; d0 + 8 * NV <= head_dim; d0 += 8 * NV) weighted_rows<NV, NH>(w, vb, bs, stride, len, d0, o);
    for (; d0 < head_dim; d0 += 8) weighted_rows<1, NH>(w, vb, bs, stride, len, d0, o);
}
}  // namespace

namespace {
constexpr int64_t kAhead = 4;  // cache rows fetched ahead
// Prefetches n rows of `bytes` bytes, `stride` floats apart, after a load of
// the first one (a software prefetch that misses the TLB is dropped).
inline void fetch_rows(const float* p, int64_t stride, int64_t n, int64_t bytes) {
    if (n <= 0) return;
    static_cast<void>(*reinterpret_cast<const volatile float*>(p));
    for (int64_t r = 0; r < n; ++r)
        for (int64_t b = 0; b < bytes; b += 64)
            _mm_prefetch(reinterpret_cast<const char*>(p + r * stride) + b, _MM_HINT_T0);
}
}  // namespace

void attend_heads_avx2(int nh, const float* const* qh, const float* const* kb, const float* const* vb, int64_t bs,
                       int64_t stride, int64_t len, int64_t skip, int head_dim, float scale, float softcap,
                       const float* sinks, float* const* scores, float* const* o) {
    // Scores: each key row loaded once for the nh heads; per head the same
    // two-accumulator sum as a single-head dot product. The cache rows are
    // fetched a few rows ahead (blocks are scattered in memory, so the
    // hardware prefetchers lose the stream at every block boundary).
    const int64_t row_bytes = static_cast<int64_t>(head_dim) * 4;
    for (int64_t b0 = 0; b0 < len; b0 += bs) {
        const float* base = kb[b0 / bs];
        const int64_t nb = len - b0 < bs ? len - b0 : bs;
        if (b0 + bs < len) {
            const int64_t nn = len - b0 - bs < kAhead ? len - b0 - bs : kAhead;
            fetch_rows(kb[b0 / bs + 1], stride, nn, row_bytes);
            fetch_rows(vb[b0 / bs + 1], stride, nn, row_bytes);
        }
        if (b0 == 0) {
            fetch_rows(base, stride, nb < kAhead ? nb : kAhead, row_bytes);
            fetch_rows(vb[0], stride, nb < kAhead ? nb : kAhead, row_bytes);
        }
        for (int64_t i = 0; i < nb; ++i) {
            const float* k = base + i * stride;
            if (i + kAhead < nb) {
                fetch_rows(k + kAhead * stride, stride, 1, row_bytes);
                fetch_rows(vb[b0 / bs] + (i + kAhead) * stride, stride, 1, row_bytes);
            }
            for (int h = 0; h < nh; ++h) {
                const float* q = qh[h];
                __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
                int d = 0;
                for (; d + 16 <= head_dim; d += 16) {
                    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a0);
                    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k + d + 8), a1);
                }
                if (d < head_dim) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a0);
                scores[h][b0 + i] = hsum(_mm256_add_ps(a0, a1));
            }
        }
    }
    // Weights: softmax over the window [skip, len) and the head's sink,
    // soft-capped scores when softcap > 0; the masked rows before the window
    // weigh 0.
    for (int h = 0; h < nh; ++h) {
        float* s = scores[h];
        const float sink = sinks ? sinks[h] : -INFINITY;
        if (softcap > 0.0f) {
            for (int64_t p = skip; p < len; ++p) s[p] = softcap * std::tanh(s[p] * scale / softcap);
            softmax_scaled_avx2(s + skip, len - skip, 1.0f, sink);
        } else {
            softmax_scaled_avx2(s + skip, len - skip, scale, sink);
        }
        for (int64_t p = 0; p < skip; ++p) s[p] = 0.0f;
    }
    // Values: up to 4 heads per pass over the rows (at most 13 registers live).
    for (int h0 = 0; h0 < nh; h0 += 4) {
        const float* const* w = scores + h0;
        float* const* oh = o + h0;
        switch (nh - h0 < 4 ? nh - h0 : 4) {
            case 4: weighted_heads<4, 2>(w, vb, bs, stride, len, head_dim, oh); break;
            case 3: weighted_heads<3, 2>(w, vb, bs, stride, len, head_dim, oh); break;
            case 2: weighted_heads<2, 4>(w, vb, bs, stride, len, head_dim, oh); break;
            default: weighted_heads<1, 4>(w, vb, bs, stride, len, head_dim, oh); break;
        }
    }
}

}  // namespace quern::cpu
