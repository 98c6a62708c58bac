// Non-matmul CPU ops. These are a small share of the forward pass (the weight
// products dominate); they are written for clarity with loops the compiler
// vectorizes, except attention's inner products which use AVX2 when present.
#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/matmul.h"
#include "core/error.h"
#include "quant/reference.h"

namespace quern::cpu {

namespace {
float dot_f32(const float* a, const float* b, int n);
void axpy_f32(float a, const float* x, float* y, int n);
}  // namespace

// Defined in ops_avx2.cpp.
float dot_f32_avx2(const float* a, const float* b, int n);
void axpy_f32_avx2(float a, const float* x, float* y, int n);
void softmax_scaled_avx2(float* x, int64_t n, float scale, float sink);
void attend_heads_avx2(int nh, const float* const* qh, const float* const* kb, const float* const* vb, int64_t bs,
                       int64_t stride, int64_t len, int64_t skip, int head_dim, float scale, float softcap,
                       const float* sinks, float* const* scores, float* const* o);
void swiglu_avx2(const float* gate, const float* up, float* out, int64_t n);

namespace {
const bool kHaveAvx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");

float dot_f32(const float* a, const float* b, int n) {
    if (kHaveAvx2) return dot_f32_avx2(a, b, n);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
    float s = 0;
    for (; i < n; ++i) s += a[i] * b[i];
    for (float x : acc) s += x;
    return s;
}

void axpy_f32(float a, const float* x, float* y, int n) {
    if (kHaveAvx2) return axpy_f32_avx2(a, x, y, n);
    for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

// x = softmax(x * scale), in place. A finite `sink` is one more logit in
// the denominator that takes no weight of its own (an attention sink).
void softmax_scaled(float* x, int64_t n, float scale, float sink = -INFINITY) {
    if (kHaveAvx2) return softmax_scaled_avx2(x, n, scale, sink);
    float mx = -INFINITY;
    for (int64_t p = 0; p < n; ++p) mx = std::max(mx, x[p] *= scale);
    const bool has_sink = sink > -INFINITY;
    if (has_sink) mx = std::max(mx, sink);
    float sum = 0.0f;
    for (int64_t p = 0; p < n; ++p) sum += (x[p] = std::exp(x[p] - mx));
    if (has_sink) sum += std::exp(sink - mx);
    const float inv = 1.0f / sum;
    for (int64_t p = 0; p < n; ++p) x[p] *= inv;
}

// Attention weights of one query row from its raw scores x[0..len): x[p] =
// softmax over p in [skip, len) of cap(x[p] * scale), cap(s) = softcap *
// tanh(s / softcap) when softcap > 0, with the head's sink logit (finite:
// gpt-oss) in the denominator; x[0..skip) = 0 (positions outside a sliding
// window). The plain causal case (skip 0, no cap, no sink) is softmax_scaled.
void attn_softmax(float* x, int64_t len, int64_t skip, float scale, float softcap, float sink) {
    if (softcap > 0.0f) {
        for (int64_t p = skip; p < len; ++p) x[p] = softcap * std::tanh(x[p] * scale / softcap);
        softmax_scaled(x + skip, len - skip, 1.0f, sink);
    } else {
        softmax_scaled(x + skip, len - skip, scale, sink);
    }
    std::fill(x, x + skip, 0.0f);
}
}  // namespace

void rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t dim, float eps) {
    for (int64_t r = 0; r < n; ++r) {
        const float* xr = x + r * dim;
        float* yr = y + r * dim;
        double ss = 0.0;
        for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
        const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
        for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * scale * w[i];
    }
}

void rope_inv_freq(int rope_dim, float base, const float* freq_factors, float* inv_freq) {
    for (int i = 0; i < rope_dim / 2; ++i) {
        double f = std::pow(static_cast<double>(base), -2.0 * i / rope_dim);
        if (freq_factors) f /= freq_factors[i];
        inv_freq[i] = static_cast<float>(f);
    }
}

void rope(float* x, const int32_t* pos, int64_t n, int n_heads, int head_dim, int rope_dim,
          float base, bool neox, const float* freq_factors) {
    const int half = rope_dim / 2;
    // Called twice per layer per step: reuse the buffers (no per-token allocation).
    thread_local std::vector<float> inv_freq, cs, sn;
    inv_freq.resize(static_cast<size_t>(half));
    cs.resize(static_cast<size_t>(half));
    sn.resize(static_cast<size_t>(half));
    rope_inv_freq(rope_dim, base, freq_factors, inv_freq.data());
    for (int64_t t = 0; t < n; ++t) {
        for (int i = 0; i < half; ++i) {
            const double a = static_cast<double>(pos[t]) * inv_freq[static_cast<size_t>(i)];
            cs[static_cast<size_t>(i)] = static_cast<float>(std::cos(a));
            sn[static_cast<size_t>(i)] = static_cast<float>(std::sin(a));
        }
        for (int h = 0; h < n_heads; ++h) {
            float* v = x + (t * n_heads + h) * head_dim;
            for (int i = 0; i < half; ++i) {
                const int i0 = neox ? i : 2 * i;
                const int i1 = neox ? i + half : 2 * i + 1;
                const float a = v[i0], b = v[i1];
                const float c = cs[static_cast<size_t>(i)], s = sn[static_cast<size_t>(i)];
                v[i0] = a * c - b * s;
                v[i1] = a * s + b * c;
            }
        }
    }
}

void swiglu(const float* gate, const float* up, float* out, int64_t count) {
    if (kHaveAvx2) return swiglu_avx2(gate, up, out, count);
    for (int64_t i = 0; i < count; ++i) {
        const float g = gate[i];
        out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
}

void swiglu_oai(const float* gate, const float* up, float* out, int64_t count, float alpha, float limit) {
    for (int64_t i = 0; i < count; ++i) {
        const float g = std::min(gate[i], limit);
        const float u = std::clamp(up[i], -limit, limit);
        out[i] = g / (1.0f + std::exp(-alpha * g)) * (u + 1.0f);
    }
}

void geglu_tanh(const float* gate, const float* up, float* out, int64_t count) {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    for (int64_t i = 0; i < count; ++i) {
        const float x = gate[i];
        out[i] = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x))) * up[i];
    }
}

void softcap(float* x, int64_t count, float cap) {
    const float inv = 1.0f / cap;
    for (int64_t i = 0; i < count; ++i) x[i] = cap * std::tanh(x[i] * inv);
}

void scale(float* x, int64_t count, float s) {
    for (int64_t i = 0; i < count; ++i) x[i] *= s;
}

void add_inplace(float* y, const float* x, int64_t count) {
    for (int64_t i = 0; i < count; ++i) y[i] += x[i];
}

void get_rows(const Tensor& table, const int32_t* ids, int64_t n, float* out) {
    const int64_t dim = table.ne[0];
    for (int64_t i = 0; i < n; ++i) {
        if (ids[i] < 0 || ids[i] >= table.ne[1])
            fail("token id {} is outside the vocabulary [0, {})", ids[i], table.ne[1]);
        dequantize_row_ref(table.type, table.row(ids[i]), out + i * dim, dim);
    }
}

void softmax(float* x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - mx);
        sum += x[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

namespace {

// Prefill attention as float GEMMs through the tiled matmul kernels. Work
// items are (query head, block of kQBlock queries); each computes
// S = Q_blk·Kᵀ over the positions its last query can see (causal: later
// blocks see more), a masked softmax per row, and O_blk = P·V with V
// transposed once per KV head so that the product reads contiguous rows.
// Items run in parallel, each single-threaded, so the pool synchronises once
// per layer instead of per product.
constexpr int64_t kQBlock = 64;

void attention_gemm(const float* q, const float* k, const float* v, int64_t kv_stride, const int32_t* pos, int64_t n,
                    int n_head, int n_head_kv, int head_dim, float scale, float* out, ThreadPool& pool,
                    int64_t window, float softcap, const float* sinks) {
    const int group = n_head / n_head_kv;
    int64_t L = 0;
    for (int64_t t = 0; t < n; ++t) L = std::max<int64_t>(L, pos[t] + 1);
    thread_local std::vector<float> vt_buf;
    vt_buf.resize(static_cast<size_t>(n_head_kv) * head_dim * L);
    float* vt = vt_buf.data();
    pool.parallel_for(static_cast<int64_t>(n_head_kv) * head_dim, 8, [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; ++r) {  // r = kvh * head_dim + i
            float* dst = vt + r * L;
            for (int64_t p = 0; p < L; ++p) dst[p] = v[p * kv_stride + r];
        }
    });
    const int64_t n_blocks = (n + kQBlock - 1) / kQBlock;
    pool.parallel_for(n_head * n_blocks, 1, [&](int64_t b, int64_t e, int) {
        thread_local ThreadPool inline_pool(1);
        thread_local std::vector<float> qh, s;
        for (int64_t w = b; w < e; ++w) {
            const int h = static_cast<int>(w / n_blocks);
            const int kvh = h / group;
            const int64_t t0 = (w % n_blocks) * kQBlock, nt = std::min(kQBlock, n - t0);
            int64_t lb = 0;
            for (int64_t t = t0; t < t0 + nt; ++t) lb = std::max<int64_t>(lb, pos[t] + 1);
            qh.resize(static_cast<size_t>(nt * head_dim));
            s.resize(static_cast<size_t>(nt * lb));
            for (int64_t t = 0; t < nt; ++t)
                std::copy_n(q + ((t0 + t) * n_head + h) * head_dim, head_dim, qh.data() + t * head_dim);
            Tensor kt = Tensor::contiguous(DType::F32, {head_dim, lb, 1, 1}, const_cast<float*>(k + kvh * head_dim));
            kt.nb[1] = static_cast<size_t>(kv_stride) * sizeof(float);
            matmul(kt, qh.data(), nt, s.data(), lb, inline_pool);
            for (int64_t t = 0; t < nt; ++t) {
                float* row = s.data() + t * lb;
                const int64_t len = pos[t0 + t] + 1;
                attn_softmax(row, len, window > 0 ? std::max<int64_t>(0, len - window) : 0, scale, softcap,
                             sinks ? sinks[h] : -INFINITY);
                std::fill(row + len, row + lb, 0.0f);
            }
            Tensor vtt = Tensor::contiguous(DType::F32, {lb, head_dim, 1, 1}, vt + static_cast<int64_t>(kvh) * head_dim * L);
            vtt.nb[1] = static_cast<size_t>(L) * sizeof(float);
            matmul(vtt, s.data(), nt, out + (t0 * n_head + h) * head_dim, static_cast<int64_t>(n_head) * head_dim,
                   inline_pool);
        }
    });
}

}  // namespace

namespace {

// One query row, the nh query heads that share a KV head: qh[i] (head_dim
// floats each) against cache positions 0..len-1, given in blocks of bs rows:
// position p is row p % bs (stride floats apart) from kb[p / bs] (keys) and
// vb[p / bs] (values), pointers already at the KV head's columns. Head i's
// output goes to o[i]. scores[i]: room for len floats. The first `skip`
// positions are masked out (a sliding window starting inside the first
// block); softcap as in attn_softmax; sinks: head i's sink logit sinks[i],
// or null.
void attend_heads(int nh, const float* const* qh, const float* const* kb, const float* const* vb, int64_t bs,
                  int64_t stride, int64_t len, int64_t skip, int head_dim, float scale, float softcap,
                  const float* sinks, float* const* scores, float* const* o) {
    if (kHaveAvx2 && head_dim % 8 == 0)
        return attend_heads_avx2(nh, qh, kb, vb, bs, stride, len, skip, head_dim, scale, softcap, sinks, scores, o);
    for (int i = 0; i < nh; ++i) {
        float* sc = scores[i];
        for (int64_t p = skip; p < len; ++p) sc[p] = dot_f32(qh[i], kb[p / bs] + (p % bs) * stride, head_dim);
        attn_softmax(sc, len, skip, scale, softcap, sinks ? sinks[i] : -INFINITY);
        std::fill(o[i], o[i] + head_dim, 0.0f);
        for (int64_t p = skip; p < len; ++p) axpy_f32(sc[p], vb[p / bs] + (p % bs) * stride, o[i], head_dim);
    }
}

// Per-thread scratch: scores of each head of a group and the block pointers
// of both caches.
struct RowScratch {
    std::vector<float> scores;
    std::vector<const float*> kb, vb;
};
RowScratch& row_scratch(int64_t scores, int64_t n_blocks) {
    thread_local RowScratch r;
    if (static_cast<int64_t>(r.scores.size()) < scores) r.scores.resize(static_cast<size_t>(scores));
    if (static_cast<int64_t>(r.kb.size()) < n_blocks) {
        r.kb.resize(static_cast<size_t>(n_blocks));
        r.vb.resize(static_cast<size_t>(n_blocks));
    }
    return r;
}

// Query row t, KV head g (query heads g*group .. g*group + group - 1) of a
// paged sequence (block table) or of a contiguous cache (block_table ==
// nullptr: one block). With a sliding window the rows before the window are
// not read: a contiguous cache starts at the window's first row, a paged one
// at the block holding it (the rows of that block before it are masked).
void attend_one(const float* q, const float* k, const float* v, const int32_t* block_table, int64_t block_size,
                int64_t kv_stride, const int32_t* pos, int64_t t, int g, int n_head, int group, int head_dim,
                float scale, int64_t window, float softcap, const float* sinks, float* out) {
    const int64_t end = static_cast<int64_t>(pos[t]) + 1;
    const int64_t lo = window > 0 ? std::max<int64_t>(0, end - window) : 0;  // first visible position
    const int64_t first_blk = block_table ? lo / block_size : 0;
    const int64_t start = block_table ? first_blk * block_size : lo;  // position of the first row read
    const int64_t len = end - start, skip = lo - start;
    const int64_t bs = block_table ? block_size : len;
    const int64_t nblk = (len + bs - 1) / bs;
    RowScratch& rs = row_scratch(len * group, nblk);
    const int64_t col = static_cast<int64_t>(g) * head_dim;
    for (int64_t b = 0; b < nblk; ++b) {
        const int64_t row0 = block_table ? static_cast<int64_t>(block_table[first_blk + b]) * block_size : start;
        rs.kb[static_cast<size_t>(b)] = k + row0 * kv_stride + col;
        rs.vb[static_cast<size_t>(b)] = v + row0 * kv_stride + col;
    }
    constexpr int kMaxGroup = 16;
    const float* qh[kMaxGroup];
    float* sc[kMaxGroup];
    float* o[kMaxGroup];
    for (int h0 = 0; h0 < group; h0 += kMaxGroup) {
        const int nh = std::min(kMaxGroup, group - h0);
        for (int i = 0; i < nh; ++i) {
            const int64_t h = static_cast<int64_t>(g) * group + h0 + i;
            qh[i] = q + (t * n_head + h) * head_dim;
            sc[i] = rs.scores.data() + (h0 + i) * len;
            o[i] = out + (t * n_head + h) * head_dim;
        }
        const float* sk = sinks ? sinks + static_cast<int64_t>(g) * group + h0 : nullptr;
        attend_heads(nh, qh, rs.kb.data(), rs.vb.data(), bs, kv_stride, len, skip, head_dim, scale, softcap, sk, sc, o);
    }
}

// One query row at a time (work items: (row, KV head) pairs).
void attention_rows(const float* q, const float* k, const float* v, const int32_t* block_table, int64_t block_size,
                    int64_t kv_stride, const int32_t* pos, int64_t n, int n_head, int n_head_kv, int head_dim,
                    float scale, int64_t window, float softcap, const float* sinks, float* out, ThreadPool& pool) {
    const int group = n_head / n_head_kv;
    pool.parallel_for(n * n_head_kv, 1, [&](int64_t b, int64_t e, int) {
        for (int64_t w = b; w < e; ++w)
            attend_one(q, k, v, block_table, block_size, kv_stride, pos, w / n_head_kv,
                       static_cast<int>(w % n_head_kv), n_head, group, head_dim, scale, window, softcap, sinks, out);
    });
}

}  // namespace

void attention_paged(const float* q, const PagedKv& kv, const int32_t* pos, int64_t n, int n_head, int n_head_kv,
                     int head_dim, float scale, float* out, ThreadPool& pool, int64_t window, float softcap,
                     const float* sinks) {
    if (n_head % n_head_kv != 0) fail("attention: n_head {} is not a multiple of n_head_kv {}", n_head, n_head_kv);
    if (kv.block_size <= 0) fail("attention_paged: block size must be positive");
    attention_rows(q, kv.k, kv.v, kv.block_table, kv.block_size, kv.kv_stride, pos, n, n_head, n_head_kv, head_dim,
                   scale, window, softcap, sinks, out, pool);
}

void attention_paged_batch(const PagedAttnSeq* seqs, int n_seqs, int n_head, int n_head_kv, int head_dim, float scale,
                           ThreadPool& pool, int64_t window, float softcap, const float* sinks) {
    if (n_head % n_head_kv != 0) fail("attention: n_head {} is not a multiple of n_head_kv {}", n_head, n_head_kv);
    thread_local std::vector<int64_t> first;  // first (row, KV head) work item of each sequence
    first.resize(static_cast<size_t>(n_seqs) + 1);
    first[0] = 0;
    for (int s = 0; s < n_seqs; ++s) {
        if (seqs[s].kv.block_size <= 0) fail("attention_paged: block size must be positive");
        first[static_cast<size_t>(s) + 1] = first[static_cast<size_t>(s)] + seqs[s].n * n_head_kv;
    }
    const int group = n_head / n_head_kv;
    const int64_t* fst = first.data();
    pool.parallel_for(fst[n_seqs], 1, [&](int64_t b, int64_t e, int) {
        int s = static_cast<int>(std::upper_bound(fst, fst + n_seqs + 1, b) - fst) - 1;
        for (int64_t w = b; w < e; ++w) {
            while (w >= fst[s + 1]) ++s;
            const PagedAttnSeq& sq = seqs[s];
            attend_one(sq.q, sq.kv.k, sq.kv.v, sq.kv.block_table, sq.kv.block_size, sq.kv.kv_stride, sq.pos,
                       (w - fst[s]) / n_head_kv, static_cast<int>((w - fst[s]) % n_head_kv), n_head, group, head_dim,
                       scale, window, softcap, sinks, sq.out);
        }
    });
}

void attention(const float* q, const float* k, const float* v, int64_t kv_stride, const int32_t* pos,
               int64_t n, int n_head, int n_head_kv, int head_dim, float scale, float* out,
               ThreadPool& pool, int64_t window, float softcap, const float* sinks) {
    if (n_head % n_head_kv != 0) fail("attention: n_head {} is not a multiple of n_head_kv {}", n_head, n_head_kv);
    if (n >= 16)
        return attention_gemm(q, k, v, kv_stride, pos, n, n_head, n_head_kv, head_dim, scale, out, pool, window,
                              softcap, sinks);
    return attention_rows(q, k, v, nullptr, 0, kv_stride, pos, n, n_head, n_head_kv, head_dim, scale, window, softcap,
                          sinks, out, pool);
}

}  // namespace quern::cpu
