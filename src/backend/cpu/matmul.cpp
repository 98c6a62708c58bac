// CPU matmul driver: y = x · Wᵀ. Validates shapes, picks the ISA level
// (cpu_features.h), quantizes activations, and splits the work over threads.
//
// Shapes: W is K x M (ne[0] = K contiguous, ne[1] = M rows, row stride
// nb[1] bytes); x is n rows of K floats; y is n rows of M floats, stride ldy.
//
// Kernel families (MatmulPath in matmul.h): GEMV, and GEMM computed by two
// kernels with the same arithmetic per output element (the tile and the
// decode kernel), so that a row's result never depends on the batch.
//
// Work mapping:
//   * decode and small batches (Auto and n < kGemmMinN, or Gemv: GEMV): the
//     caller quantizes the n activation rows once; each thread gets one
//     contiguous range of weight rows (one sequential memory stream, which the
//     prefetchers follow). The fused kernels (gemv_avx512.cpp, gemv_avx2.cpp)
//     read the packed blocks directly, several activation rows per pass. Bound
//     by memory bandwidth: each weight byte is read from memory once.
//   * GEMM family, n < kDecodeMaxN (decode kernel: qdecode_avx512.cpp,
//     qdecode_avx2.cpp): activations are quantized and packed into panels of
//     decode_ncp columns (in parallel over panels); each thread gets one
//     contiguous range of weight rows, as the GEMV does, and for each panel of
//     decode_nr (16 or 8) rows unpacks and interleaves them in L1 and runs
//     every activation row against them with the weight rows across the
//     vector lanes (up to 8 or 4 activation rows per pass), reading the next
//     panel ahead. Full vector width from one activation row up; bound by the
//     unpacking below ~8 rows, by arithmetic above.
//   * GEMM family otherwise (GEMM tile): activations are quantized and packed
//     into column panels of ncp rows, in parallel over panels; then blocks of
//     8 panels of nr weight rows are handed out dynamically; each thread
//     unpacks its block once (L1/L2) and runs the nr x ncp register-tile kernel
//     for every (activation panel, row panel) pair, row panels innermost so
//     output rows are written in whole cache lines. Compute-bound: each
//     unpacked weight is reused n times, each activation byte nr times from
//     registers.
//   * float weights (F32/F16/BF16, and the weight-only F8_E4M3_B32 / NVFP4,
//     decoded to f32 in registers as they are loaded: kernels.h): row chunks
//     per thread; the kernel tiles rows x activation rows in registers (Auto:
//     one row at a time below 4 activation rows).
// Scratch buffers are thread-local and only grow.
#include "backend/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernels.h"
#include "core/fp16.h"
#include "quant/blocks.h"
#include "core/error.h"

namespace quern::cpu {

namespace {

constexpr int64_t kGemmMinN = 12;     // Auto: n at or above which the GEMM family is used
constexpr int64_t kDecodeMaxN = 512;  // GEMM family: the decode kernel below, the tile from here

// A 64-byte aligned, grow-only byte buffer.
class Scratch {
public:
    uint8_t* get(size_t bytes) {
        if (bytes > cap_) {
            cap_ = std::max(bytes, cap_ * 2);
            mem_.reset(static_cast<uint8_t*>(::operator new[](cap_, std::align_val_t(64))));
        }
        return mem_.get();
    }

private:
    struct Del {
        void operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t(64)); }
    };
    std::unique_ptr<uint8_t, Del> mem_;
    size_t cap_ = 0;
};

thread_local Scratch tl_act;   // activations, owned by the calling thread
thread_local Scratch tl_work;  // per-thread unpacked weights and tile outputs

size_t align64(size_t n) { return (n + 63) & ~size_t(63); }

// Carves aligned sub-buffers out of one scratch allocation.
struct Carver {
    uint8_t* base;
    size_t off = 0;
    template <class T>
    T* take(size_t count) {
        T* p = reinterpret_cast<T*>(base + off);
        off += align64(count * sizeof(T));
        return p;
    }
};

// Decode-style split: one contiguous range of rows per thread (multiples of
// `align` rows), so that each thread streams one long run of memory, which the
// prefetchers follow; interleaved small chunks defeat them. A thread works
// through its range front to back a chunk at a time and then takes chunks from
// the back of ranges left unfinished — a worker descheduled on a busy machine
// (or one that never joined: ThreadPool::share) no longer holds up the op.
// (Handing out small ranges from one counter also copes with that, but
// measured ~30% slower decode on an idle machine.)
struct alignas(64) RowRange {
    std::atomic<uint64_t> fb;  // front (low 32 bits) and back (high 32 bits), in units
};

/// Claims up to `chunk` units of r: from the front (its owner) or the back.
bool claim(RowRange& r, int64_t chunk, bool front, int64_t& u0, int64_t& u1) {
    uint64_t v = r.fb.load(std::memory_order_relaxed);
    for (;;) {
        const int64_t f = static_cast<int64_t>(v & 0xFFFFFFFFu), b = static_cast<int64_t>(v >> 32);
        if (f >= b) return false;
        u0 = front ? f : std::max(f, b - chunk);
        u1 = front ? std::min(b, f + chunk) : b;
        const uint64_t nv = front ? (v & ~uint64_t{0xFFFFFFFFu}) | static_cast<uint64_t>(u1)
                                  : (static_cast<uint64_t>(u0) << 32) | static_cast<uint64_t>(f);
        if (r.fb.compare_exchange_weak(v, nv, std::memory_order_relaxed)) return true;
    }
}

template <class F>
void split_rows(ThreadPool& pool, int64_t M, int64_t align, F&& fn) {
    const int nth = pool.size();
    if (nth == 1 || M <= align) {
        fn(int64_t(0), M);
        return;
    }
    const int64_t units = (M + align - 1) / align;
    thread_local std::unique_ptr<RowRange[]> ranges;
    thread_local int n_ranges = 0;
    if (n_ranges < nth) {
        ranges = std::make_unique<RowRange[]>(static_cast<size_t>(nth));
        n_ranges = nth;
    }
    for (int t = 0; t < nth; ++t) {
        const int64_t u0 = units * t / nth, u1 = units * (t + 1) / nth;
        ranges[t].fb.store((static_cast<uint64_t>(u1) << 32) | static_cast<uint64_t>(u0), std::memory_order_relaxed);
    }
    RowRange* rr = ranges.get();
    // Sixteen chunks to a range: a late thread's range is taken over in pieces.
    const int64_t chunk = std::max<int64_t>(1, units / nth / 16);
    pool.share([&](int ith, int n) {
        int64_t u0 = 0, u1 = 0;
        const auto rows = [&] { fn(std::min(M, u0 * align), std::min(M, u1 * align)); };
        while (claim(rr[ith], chunk, true, u0, u1)) rows();
        for (int k = 1; k < n; ++k)
            while (claim(rr[(ith + k) % n], chunk, false, u0, u1)) rows();
    });
}

const ActQuantizers& quantizers_for(Isa isa) {
    switch (isa) {
        case Isa::AVX512: return avx512::quantizers;
        case Isa::AVX2: return avx2::quantizers;
        default: return scalar::quantizers;
    }
}

QuantizeRowFn quantizer(const ActQuantizers& q, DType act) {
    return act == DType::Q8_0 ? q.q8_0 : act == DType::Q8_1 ? q.q8_1 : q.q8_K;
}

// ---------------------------------------------------------------- float weights
// `tiled`: the same arithmetic for every row whatever n (a forced MatmulPath).
void matmul_float(const Tensor& W, const float* x, int64_t n, float* y, int64_t ldy, ThreadPool& pool, Isa isa,
                  bool tiled) {
    const FKernels& fk = isa == Isa::AVX512 ? avx512::fkernels : isa == Isa::AVX2 ? avx2::fkernels : scalar::fkernels;
    FGemmFn fn = nullptr;
    switch (W.type) {
        case DType::F32: fn = tiled ? fk.f32_tiled : fk.f32; break;
        case DType::F16: fn = tiled ? fk.f16_tiled : fk.f16; break;
        case DType::BF16: fn = tiled ? fk.bf16_tiled : fk.bf16; break;
        case DType::F8_E4M3_B32: fn = tiled ? fk.f8_tiled : fk.f8; break;
        case DType::NVFP4: fn = tiled ? fk.nvfp4_tiled : fk.nvfp4; break;
        default: fail("matmul: no float kernel for {}", dtype_name(W.type));
    }
    const int64_t K = W.ne[0], M = W.ne[1];
    const size_t ldw = W.nb[1];
    const auto* w = static_cast<const uint8_t*>(W.data);
    auto body = [&](int64_t r0, int64_t r1) {
        fn(K, w + r0 * ldw, ldw, static_cast<int>(r1 - r0), x, static_cast<size_t>(K), static_cast<int>(n), y + r0,
           static_cast<size_t>(ldy));
    };
    if (n < kGemmMinN)
        split_rows(pool, M, 4, body);  // decode: one contiguous stream per thread
    else
        pool.parallel_for(M, 16, [&](int64_t r0, int64_t r1, int) { body(r0, r1); });
}

// ---------------------------------------------------------------- quantized, scalar level
void matmul_q_scalar(const Tensor& W, const float* x, int64_t n, float* y, int64_t ldy, ThreadPool& pool) {
    const DType act = act_type_for(W.type);
    const ScalarDotFn dot = scalar::dot_fn(W.type);
    const int64_t K = W.ne[0], M = W.ne[1];
    const size_t ldw = W.nb[1];
    const size_t ldq = row_size(act, K);
    uint8_t* xq = tl_act.get(ldq * static_cast<size_t>(n));
    const QuantizeRowFn q = quantizer(scalar::quantizers, act);
    for (int64_t c = 0; c < n; ++c) q(x + c * K, xq + c * ldq, K);
    const auto* w = static_cast<const uint8_t*>(W.data);
    pool.parallel_for(M, 16, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r)
            for (int64_t c = 0; c < n; ++c) y[c * ldy + r] = dot(K, w + r * ldw, xq + c * ldq);
    });
}

// ---------------------------------------------------------------- quantized, SIMD levels
void matmul_q_gemv(const Tensor& W, const float* x, int64_t n, float* y, int64_t ldy, ThreadPool& pool,
                   const QKernels& qk, const ActQuantizers& qz) {
    const DType act = act_type_for(W.type);
    const int64_t K = W.ne[0], M = W.ne[1];
    const size_t ldw = W.nb[1];
    const size_t ldq = row_size(act, K);
    const auto* w = static_cast<const uint8_t*>(W.data);
    const QuantizeRowFn q = quantizer(qz, act);

    const GemvFn fused = qk.gemv_for(W.type);
    if (!fused) fail("matmul: no GEMV kernel for {} at this ISA level", dtype_name(W.type));

    // Activations: Q8 blocks, then the fused kernels' layout, once per call.
    const size_t scr = align64(qk.gemv_scratch(W.type, K));
    Carver cv{tl_act.get(static_cast<size_t>(n) * (align64(ldq) + scr))};
    GemvAct acts[kGemmMinN];
    for (int64_t c = 0; c < n; ++c) {
        uint8_t* blocks = cv.take<uint8_t>(ldq);
        q(x + c * K, blocks, K);
        qk.gemv_prep(W.type, K, blocks, cv.take<uint8_t>(scr), &acts[c]);
    }
    split_rows(pool, M, 4, [&](int64_t r0, int64_t r1) {
        fused(K, w + r0 * ldw, ldw, static_cast<int>(r1 - r0), acts, static_cast<int>(n), y + r0,
              static_cast<size_t>(ldy));
    });
}

void matmul_q_gemm(const Tensor& W, const float* x, int64_t n, float* y, int64_t ldy, ThreadPool& pool,
                   const QKernels& qk, const ActQuantizers& qz) {
    const DType act = act_type_for(W.type);
    const int G = subblock_for(W.type);
    const UForm form{G, W.type == DType::Q8_0 && qk.q8_0_signed, umax_for(W.type)};
    const UnpackFn unpack = qk.unpack(W.type);
    const int64_t K = W.ne[0], M = W.ne[1];
    const int64_t nsub = K / G;
    const size_t ldw = W.nb[1];
    const size_t ldq = row_size(act, K);
    const int NR = qk.nr, NCP = qk.ncp;
    const int64_t npanels = (n + NCP - 1) / NCP;

    // Activation panels: quantize each row to Q8 blocks, then pack.
    const size_t panel_a = align64(static_cast<size_t>(K) * NCP);
    const size_t panel_s = align64(static_cast<size_t>(nsub) * NCP * 4);
    const size_t panel_bytes = panel_a + 2 * panel_s;
    const size_t qbytes = align64(ldq * NCP);
    uint8_t* base = tl_act.get(static_cast<size_t>(npanels) * (panel_bytes + qbytes));
    const QuantizeRowFn q = quantizer(qz, act);
    pool.parallel_for(npanels, 1, [&](int64_t p0, int64_t p1, int) {
        for (int64_t p = p0; p < p1; ++p) {
            uint8_t* pb = base + p * static_cast<int64_t>(panel_bytes + qbytes);
            uint8_t* qb = pb + panel_bytes;
            const int nrows = static_cast<int>(std::min<int64_t>(NCP, n - p * NCP));
            const void* rowp[64];
            for (int c = 0; c < nrows; ++c) {
                q(x + (p * NCP + c) * K, qb + c * ldq, K);
                rowp[c] = qb + c * ldq;
            }
            qk.pack_panel(act, G, K, NCP, rowp, nrows, reinterpret_cast<int8_t*>(pb),
                          reinterpret_cast<float*>(pb + panel_a), reinterpret_cast<float*>(pb + panel_a + panel_s));
        }
    });

    const auto* w = static_cast<const uint8_t*>(W.data);
    const size_t ldu = align64(static_cast<size_t>(K));
    const size_t lds = static_cast<size_t>((nsub + 15) & ~int64_t(15));
    // Work item: a block of kRowBlock row panels (kRowBlock * NR weight rows),
    // unpacked once; for each activation panel the block's row panels run back
    // to back, so each output row receives kRowBlock * NR contiguous floats
    // (whole cache lines) at once instead of NR-float pieces spread over n rows.
    constexpr int64_t kRowBlock = 8;
    const int64_t rows_per_item = kRowBlock * NR;
    const int64_t nitems = (M + rows_per_item - 1) / rows_per_item;
    pool.parallel_for(nitems, 1, [&](int64_t i0, int64_t i1, int) {
        Carver wc{tl_work.get(static_cast<size_t>(rows_per_item) * (ldu + 2 * lds * 4) + 192)};
        uint8_t* u = wc.take<uint8_t>(static_cast<size_t>(rows_per_item) * ldu);
        float* D = wc.take<float>(static_cast<size_t>(rows_per_item) * lds);
        float* Mn = wc.take<float>(static_cast<size_t>(rows_per_item) * lds);
        for (int64_t item = i0; item < i1; ++item) {
            const int64_t rb0 = item * rows_per_item;
            const int64_t rbn = std::min<int64_t>(rows_per_item, M - rb0);
            unpack(w + rb0 * ldw, ldw, static_cast<int>(rbn), K, u, ldu, D, Mn, lds);
            for (int64_t p = 0; p < npanels; ++p) {
                const uint8_t* pb = base + p * static_cast<int64_t>(panel_bytes + qbytes);
                const ActPanel ap{reinterpret_cast<const int8_t*>(pb), reinterpret_cast<const float*>(pb + panel_a),
                                  reinterpret_cast<const float*>(pb + panel_a + panel_s)};
                const int nc = static_cast<int>(std::min<int64_t>(NCP, n - p * NCP));
                for (int64_t r = 0; r < rbn; r += NR) {
                    const int nr = static_cast<int>(std::min<int64_t>(NR, rbn - r));
                    qk.tile(K, form, nr, nc, u + r * ldu, ldu, D + r * lds, Mn + r * lds, lds, ap,
                            y + p * NCP * ldy + rb0 + r, static_cast<size_t>(ldy));
                }
            }
        }
    });
}

// Decode kernel (kernels.h QDecodeFn): the GEMM's arithmetic with weight rows
// across the vector lanes. Activations are quantized and packed into panels of
// decode_ncp columns (the GEMM's panel format and packer); each thread takes one
// contiguous range of weight rows, as the GEMV does, and runs the kernel on
// panels of decode_nr rows against every column.
void matmul_q_decode(const Tensor& W, const float* x, int64_t n, float* y, int64_t ldy, ThreadPool& pool,
                     const QKernels& qk, const ActQuantizers& qz) {
    const DType act = act_type_for(W.type);
    const int G = subblock_for(W.type);
    const UForm form{G, W.type == DType::Q8_0 && qk.q8_0_signed, umax_for(W.type)};
    const int64_t K = W.ne[0], M = W.ne[1];
    const int64_t nsub = K / G;
    const size_t ldw = W.nb[1];
    const size_t ldq = row_size(act, K);
    const int NCP = qk.decode_ncp, NR = qk.decode_nr;
    const int64_t npanels = (n + NCP - 1) / NCP;

    const size_t panel_a = align64(static_cast<size_t>(K) * NCP);
    const size_t panel_s = align64(static_cast<size_t>(nsub) * NCP * 4);
    const size_t panel_bytes = panel_a + 2 * panel_s + align64(ldq * NCP);
    Carver cv{tl_act.get(static_cast<size_t>(npanels) * (panel_bytes + sizeof(ActPanel)) + 64)};
    auto* panels = cv.take<ActPanel>(static_cast<size_t>(npanels));
    uint8_t* base = cv.take<uint8_t>(static_cast<size_t>(npanels) * panel_bytes);
    const QuantizeRowFn q = quantizer(qz, act);
    pool.parallel_for(npanels, 1, [&](int64_t p0, int64_t p1, int) {
        for (int64_t p = p0; p < p1; ++p) {
            uint8_t* pb = base + p * static_cast<int64_t>(panel_bytes);
            uint8_t* qb = pb + panel_a + 2 * panel_s;
            const int nrows = static_cast<int>(std::min<int64_t>(NCP, n - p * NCP));
            const void* rowp[64];
            for (int c = 0; c < nrows; ++c) {
                q(x + (p * NCP + c) * K, qb + c * ldq, K);
                rowp[c] = qb + c * ldq;
            }
            auto* a = reinterpret_cast<int8_t*>(pb);
            auto* da = reinterpret_cast<float*>(pb + panel_a);
            auto* dsa = reinterpret_cast<float*>(pb + panel_a + panel_s);
            qk.pack_panel(act, G, K, NCP, rowp, nrows, a, da, dsa);
            panels[p] = ActPanel{a, da, dsa};
        }
    });

    const auto* w = static_cast<const uint8_t*>(W.data);
    const size_t work = qk.decode_work(K, G);
    split_rows(pool, M, NR, [&](int64_t r0, int64_t r1) {
        uint8_t* wb = tl_work.get(work);
        for (int64_t r = r0; r < r1; r += NR) {
            const int nr = static_cast<int>(std::min<int64_t>(NR, r1 - r));
            // The panel after this one in memory: this thread's next, also
            // across the chunks split_rows hands out (rows past r1 exist below M).
            const int next = static_cast<int>(std::clamp<int64_t>(M - r - NR, 0, NR));
            qk.decode(K, W.type, form, w + r * ldw, ldw, nr, next, panels, static_cast<int>(n), y + r,
                      static_cast<size_t>(ldy), wb);
        }
    });
}

bool has_cpu_kernel(DType t) {
    switch (t) {
        case DType::F32:
        case DType::F16:
        case DType::BF16:
        case DType::F8_E4M3_B32:
        case DType::NVFP4:
        case DType::MXFP4:
        case DType::Q4_0:
        case DType::Q4_1:
        case DType::Q5_0:
        case DType::Q5_1:
        case DType::Q8_0:
        case DType::Q2_K:
        case DType::Q3_K:
        case DType::Q4_K:
        case DType::Q5_K:
        case DType::Q6_K: return true;
        default: return false;
    }
}

}  // namespace

void matmul(const Tensor& W, const float* x, int64_t n, float* y, int64_t ldy, ThreadPool& pool) {
    matmul(W, x, n, y, ldy, pool, MatmulPath::Auto);
}

void matmul(const Tensor& W, const float* x, int64_t n, float* y, int64_t ldy, ThreadPool& pool, MatmulPath path) {
    if (W.device != Device::CPU) fail("matmul: weight '{}' is not in CPU memory", W.name);
    if (!has_cpu_kernel(W.type)) fail("matmul: weight '{}' has type {} with no CPU kernel", W.name, dtype_name(W.type));
    if (W.ne[2] != 1 || W.ne[3] != 1)
        fail("matmul: weight '{}' must be 2-D, has shape [{}, {}, {}, {}]", W.name, W.ne[0], W.ne[1], W.ne[2], W.ne[3]);
    const int64_t K = W.ne[0], M = W.ne[1];
    if (K < 0 || M < 0 || n < 0) fail("matmul: negative size (K={}, M={}, n={})", K, M, n);
    const size_t rb = row_size(W.type, K);  // throws unless K is whole blocks
    if (ldy < M) fail("matmul: output stride {} is smaller than the {} rows of '{}'", ldy, M, W.name);
    if (n == 0 || M == 0) return;
    if (W.nb[1] < rb) fail("matmul: row stride {} of '{}' is smaller than a row ({} bytes)", W.nb[1], W.name, rb);
    if (K == 0) {
        for (int64_t c = 0; c < n; ++c) std::fill(y + c * ldy, y + c * ldy + M, 0.0f);
        return;
    }
    if (!W.data || !x || !y) fail("matmul: null data pointer (weight '{}')", W.name);

    const Isa isa = active_isa();
    if (!dtype_is_quantized(W.type) || is_weight_only_type(W.type))
        return matmul_float(W, x, n, y, ldy, pool, isa, path != MatmulPath::Auto);
    if (isa == Isa::Scalar) return matmul_q_scalar(W, x, n, y, ldy, pool);
    const QKernels& qk = isa == Isa::AVX512 ? avx512::qkernels : avx2::qkernels;
    const ActQuantizers& qz = quantizers_for(isa);
    if (path == MatmulPath::Gemv || (path == MatmulPath::Auto && n < kGemmMinN)) {
        for (int64_t c0 = 0; c0 < n; c0 += kGemmMinN - 1)
            matmul_q_gemv(W, x + c0 * K, std::min(kGemmMinN - 1, n - c0), y + c0 * ldy, ldy, pool, qk, qz);
        return;
    }
    // The GEMM family: the decode kernel and the tile give the same floats.
    const bool decode = path == MatmulPath::Decode || (path != MatmulPath::Tile && n < kDecodeMaxN);
    if (decode && qk.decode) return matmul_q_decode(W, x, n, y, ldy, pool, qk, qz);
    return matmul_q_gemm(W, x, n, y, ldy, pool, qk, qz);
}

void quantize_act_with_residual(DType act, const float* x, int64_t k, void* q, float* residual) {
    if (act != DType::Q8_0 && act != DType::Q8_1 && act != DType::Q8_K)
        fail("activation type {} is not an 8-bit block type", dtype_name(act));
    quantizer(quantizers_for(active_isa()), act)(x, q, k);
    if (act == DType::Q8_K) {
        const auto* b = static_cast<const block_q8_K*>(q);
        for (int64_t i = 0; i < k / QK_K; ++i)
            for (int j = 0; j < QK_K; ++j) residual[i * QK_K + j] = x[i * QK_K + j] - b[i].d * b[i].qs[j];
    } else {
        // Q8_0 and Q8_1 share the leading fp16 scale and 32 int8 values.
        const size_t bs = act == DType::Q8_0 ? sizeof(block_q8_0) : sizeof(block_q8_1);
        const size_t qoff = act == DType::Q8_0 ? offsetof(block_q8_0, qs) : offsetof(block_q8_1, qs);
        const auto* base = static_cast<const uint8_t*>(q);
        for (int64_t i = 0; i < k / 32; ++i) {
            uint16_t dh;
            std::memcpy(&dh, base + i * bs, 2);
            const float d = fp16_to_fp32(dh);
            const auto* qs = reinterpret_cast<const int8_t*>(base + i * bs + qoff);
            for (int j = 0; j < 32; ++j) residual[i * 32 + j] = x[i * 32 + j] - d * qs[j];
        }
    }
}

}  // namespace quern::cpu
