// Timings of the non-GEMV CUDA decode kernels (src/backend/cuda/ops.h) on
// Llama-3-8B shapes (dim 4096, 32 query / 8 KV heads of 128, FFN 14336,
// vocab 128256), of the Gated DeltaNet kernels (delta_rule.h) on a
// Qwen3.5-27B layer, and of the MoE routing and gated RMSNorm of Qwen3.5.
//
//   bench_ops_cuda [--reps N]
//
// Method (as bench_gemv_cuda): L back-to-back launches captured in a CUDA
// graph, 3 warm-up replays, median of --reps replays timed with CUDA events,
// divided by L. Attention rotates over enough KV-cache copies (>= 256 MiB in
// all) that each launch reads DRAM rather than the L2. Bytes = what the
// kernel must read + write (attention: K and V rows 0..pos of one layer).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/delta_rule.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/ops.h"

using namespace quern;
using namespace quern::cuda;

namespace {

int g_reps = 20;

/// Median µs per launch of `body(i)` for i in [0, L), captured in one graph.
double time_graph(CudaContext& ctx, int L, const std::function<void(int)>& body) {
    cudaStream_t s = ctx.stream();
    cudaGraph_t g;
    cudaGraphExec_t ge;
    QUERN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < L; ++i) body(i);
    QUERN_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    QUERN_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 3; ++i) QUERN_CUDA_CHECK(cudaGraphLaunch(ge, s));
    cudaEvent_t a, b;
    QUERN_CUDA_CHECK(cudaEventCreate(&a));
    QUERN_CUDA_CHECK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int r = 0; r < g_reps; ++r) {
        QUERN_CUDA_CHECK(cudaEventRecord(a, s));
        QUERN_CUDA_CHECK(cudaGraphLaunch(ge, s));
        QUERN_CUDA_CHECK(cudaEventRecord(b, s));
        QUERN_CUDA_CHECK(cudaEventSynchronize(b));
        float e = 0;
        QUERN_CUDA_CHECK(cudaEventElapsedTime(&e, a, b));
        ms.push_back(e);
    }
    std::sort(ms.begin(), ms.end());
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return 1000.0 * ms[ms.size() / 2] / L;
}

void report(const std::string& name, double us, double bytes) {
    std::printf("%-44s %9.2f us  %8.1f GB/s\n", name.c_str(), us, bytes / (us * 1e3));
    std::fflush(stdout);
}

DeviceBuffer random_buffer(size_t n_floats, cudaStream_t s, std::mt19937& rng) {
    std::vector<float> h(n_floats);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    for (auto& x : h) x = d(rng);
    DeviceBuffer b(n_floats * 4);
    b.upload(h.data(), n_floats * 4, s);
    return b;
}

/// One Gated DeltaNet layer of the Qwen3.5-27B shape (16 key / 48 value
/// heads of 128, conv of 4 taps over 10240 channels): the decode step's conv
/// + recurrence for 1, 32 and 128 sequences (bytes: each sequence's conv
/// and delta-rule state read and written, its q|k|v row read, the conv's
/// output written and read, y written; enough state copies that the L2
/// holds none), and a 2048-row prompt of one sequence by the token
/// recurrence and by the chunked form with 1, 2 and 4 blocks a head, with
/// 48 value heads and with the 35B-A3B's 32 (tok/s of the layer's conv +
/// recurrence).
void bench_delta_rule(CudaContext& ctx, std::mt19937& rng) {
    const cudaStream_t s = ctx.stream();
    const int nk = 16, nv = 48, d = 128, K = 4;
    const int64_t C = 2 * int64_t{nk} * d + int64_t{nv} * d, state = (K - 1) * C + int64_t{nv} * d * d;
    std::vector<float> conv(static_cast<size_t>(C * K)), a(nv), dt(nv);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& v : conv) v = 0.5f * nd(rng);
    for (int h = 0; h < nv; ++h) a[static_cast<size_t>(h)] = -std::exp(0.5f * nd(rng)), dt[static_cast<size_t>(h)] = nd(rng);
    DeviceBuffer dconv(conv.size() * 4), da(a.size() * 4), ddt(dt.size() * 4);
    dconv.upload(conv.data(), conv.size() * 4, s);
    da.upload(a.data(), a.size() * 4, s);
    ddt.upload(dt.data(), dt.size() * 4, s);
    DeltaLayer L{nk, nv, d, d, K, false, dconv.as<float>(), da.as<float>(), ddt.as<float>()};
    const int64_t max_rows = 2048;
    auto x = random_buffer(static_cast<size_t>(max_rows * C), s, rng);
    auto ba = random_buffer(static_cast<size_t>(max_rows * 2 * nv), s, rng);
    DeviceBuffer xc(static_cast<size_t>(max_rows * C) * 4), y(static_cast<size_t>(max_rows * nv * d) * 4);
    // Sequence arrays: `copies` sets of n state slots, one DeltaSeqs each.
    const auto seq_sets = [&](int n, int rows, int copies, std::vector<DeviceBuffer>& keep) {
        std::vector<DeltaSeqs> sets;
        for (int c = 0; c < copies; ++c) {
            keep.emplace_back(static_cast<size_t>(n * state) * 4);
            keep.back().fill_bytes(0, s);
            std::vector<int32_t> r0(static_cast<size_t>(n)), nr(static_cast<size_t>(n), rows);
            std::vector<float*> ptr(static_cast<size_t>(n));
            for (int i = 0; i < n; ++i) {
                r0[static_cast<size_t>(i)] = i * rows;
                ptr[static_cast<size_t>(i)] = keep.back().as<float>() + i * state;
            }
            keep.emplace_back(static_cast<size_t>(n) * (8 + sizeof(float*)));
            auto* base = keep.back().as<uint8_t>();
            keep.back().upload(r0.data(), r0.size() * 4, s);
            QUERN_CUDA_CHECK(cudaMemcpyAsync(base + 4 * n, nr.data(), nr.size() * 4, cudaMemcpyHostToDevice, s));
            QUERN_CUDA_CHECK(cudaMemcpyAsync(base + 8 * n, ptr.data(), ptr.size() * sizeof(float*), cudaMemcpyHostToDevice, s));
            ctx.synchronize();
            sets.push_back(DeltaSeqs{reinterpret_cast<int32_t*>(base), reinterpret_cast<int32_t*>(base + 4 * n),
                                     reinterpret_cast<float* const*>(base + 8 * n), n});
        }
        return sets;
    };
    for (int n : {1, 32, 128}) {
        std::vector<DeviceBuffer> keep;
        const double per_set = static_cast<double>(n) * static_cast<double>(state) * 4;
        const int copies = static_cast<int>(std::min(64.0, std::max(1.0, (256 << 20) / per_set + 1)));
        const auto sets = seq_sets(n, 1, copies, keep);
        const double us = time_graph(ctx, std::max(16, copies), [&](int i) {
            const DeltaSeqs& q = sets[static_cast<size_t>(i % copies)];
            delta_conv(x.as<float>(), xc.as<float>(), n, q, L, s);
            delta_rule(xc.as<float>(), ba.as<float>(), y.as<float>(), n, q, L, s);
        });
        const double bytes = static_cast<double>(n) * (2.0 * state * 4 + 3.0 * C * 4 + nv * d * 4 + 2 * nv * 4);
        report(std::string("DeltaNet decode 27B layer, ") + std::to_string(n) +
                   " seq (" + std::to_string(copies) + " copies)",
               us, bytes);
        // The same step in one launch (delta_step: no xc round trip).
        DeviceBuffer counts(static_cast<size_t>(n * nk) * sizeof(int));
        counts.fill_bytes(0, s);
        const double us1 = time_graph(ctx, std::max(16, copies), [&](int i) {
            delta_step(x.as<float>(), ba.as<float>(), y.as<float>(), sets[static_cast<size_t>(i % copies)], L,
                       counts.as<int>(), s);
        });
        report(std::string("DeltaNet decode 27B layer, ") + std::to_string(n) + " seq, one launch", us1,
               static_cast<double>(n) * (2.0 * state * 4 + C * 4 + nv * d * 4 + 2 * nv * 4));
    }
    for (int heads : {48, 32}) {  // the 27B's value heads, the 35B-A3B's
        DeltaLayer Lh = L;
        Lh.n_v_heads = heads;
        for (int groups : {0, 1, 2, 4}) {  // 0: token by token; else chunked, value columns over that many blocks
            std::vector<DeviceBuffer> keep;
            const auto sets = seq_sets(1, static_cast<int>(max_rows), 1, keep);
            const double us = time_graph(ctx, 4, [&](int) {
                delta_conv(x.as<float>(), xc.as<float>(), max_rows, sets[0], Lh, s);
                if (groups) delta_rule_chunked(xc.as<float>(), ba.as<float>(), y.as<float>(), sets[0], Lh, 1, s, groups);
                else delta_rule_tokens(xc.as<float>(), ba.as<float>(), y.as<float>(), sets[0], Lh, INT32_MAX, s);
            });
            const std::string name = groups ? "chunked, " + std::to_string(groups) + " block(s) a head" : "token by token";
            std::printf("%-56s %9.1f us  %8.0f tok/s\n",
                        ("DeltaNet prompt 2048 rows, " + std::to_string(heads) + " heads, " + name).c_str(), us,
                        max_rows / (us * 1e-6));
        }
    }
}

}  // namespace

/// The small kernels around a Qwen3.5 layer's GEMVs: the MoE routing of
/// the 35B-A3B (256 experts, top 8, with and without the shared expert's
/// gate over 2048 floats) and the DeltaNet output's gated RMSNorm (value
/// width 6144 in heads of 128: the 27B) in one launch against the two it
/// replaces. Launch-bound: the figure that matters is µs per launch.
void bench_qwen35_small(CudaContext& ctx, std::mt19937& rng) {
    const cudaStream_t s = ctx.stream();
    const int L = 40, E = 256, k = 8, dim = 2048;
    auto logits = random_buffer(E, s, rng), x = random_buffer(dim, s, rng), gw = random_buffer(dim, s, rng);
    DeviceBuffer ids((k + 1) * 4), w((k + 1) * 4);
    report("moe_route 256 experts, top 8", time_graph(ctx, L, [&](int) {
               moe_route(logits.as<float>(), E, k, true, ids.as<int32_t>(), w.as<float>(), s);
           }),
           E * 4.0);
    report("moe_route 256 experts, top 8, shared gate", time_graph(ctx, L, [&](int) {
               moe_route(logits.as<float>(), E, k, true, ids.as<int32_t>(), w.as<float>(), s,
                         SharedExpertGate{x.as<float>(), gw.as<float>(), dim});
           }),
           E * 4.0 + 2.0 * dim * 4);
    // The F32 router's GEMV then moe_route, as a decode step runs them (each
    // layer its own 2 MB router).
    std::vector<DeviceBuffer> routers;
    for (int l = 0; l < L; ++l) routers.push_back(random_buffer(int64_t{E} * dim, s, rng));
    DeviceWeight rw;
    rw.type = DType::F32, rw.K = dim, rw.N = E;
    report("router GEMV (F32 256 x 2048) + moe_route, shared gate", time_graph(ctx, L, [&](int l) {
               rw.q = routers[size_t(l)].as<float>();
               gemv(ctx, rw, x.as<float>(), logits.as<float>());
               moe_route(logits.as<float>(), E, k, true, ids.as<int32_t>(), w.as<float>(), s,
                         SharedExpertGate{x.as<float>(), gw.as<float>(), dim});
           }),
           E * dim * 4.0);
    const int VD = 6144, hv = 128;
    auto y = random_buffer(VD, s, rng), z = random_buffer(VD, s, rng), nw = random_buffer(hv, s, rng);
    auto yn = random_buffer(VD, s, rng), h = random_buffer(VD, s, rng);
    QuantizedActivation xa(VD, 2);
    report("gated_rms_norm_q8_1 6144 / 128", time_graph(ctx, L, [&](int) {
               gated_rms_norm_q8_1(y.as<float>(), nw.as<float>(), z.as<float>(), h.as<float>(), xa.q(), xa.info(),
                                   xa.q2(), xa.info2(), VD, hv, 1e-6f, s);
           }),
           VD * 4.0 * 3 + VD * 2.25);
    report("rms_norm_groups + swiglu_q8_1 6144 / 128", time_graph(ctx, L, [&](int) {
               rms_norm_groups(y.as<float>(), nw.as<float>(), yn.as<float>(), VD, 1, VD, hv, 1e-6f, s);
               swiglu_q8_1(z.as<float>(), yn.as<float>(), h.as<float>(), xa.q(), xa.info(), VD, s, xa.q2(),
                           xa.info2(), kGateSiLU);
           }),
           VD * 4.0 * 5 + VD * 2.25);
}

int main(int argc, char** argv) {
    for (int i = 1; i < argc; ++i)
        if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) g_reps = std::atoi(argv[++i]);
    if (CudaContext::device_count() == 0) {
        std::fprintf(stderr, "no CUDA device\n");
        return 1;
    }
    CudaContext ctx(0);
    cudaStream_t s = ctx.stream();
    std::printf("device: %s, %d SMs\n", ctx.name().c_str(), ctx.sm_count());
    std::mt19937 rng(7);
    const int dim = 4096, ffn = 14336, n_head = 32, n_kv = 8, hd = 128, vocab = 128256;
    const int L = 64;
    bench_qwen35_small(ctx, rng);

    auto x = random_buffer(dim, s, rng), res = random_buffer(dim, s, rng), w = random_buffer(dim, s, rng);
    auto y = random_buffer(dim, s, rng);
    QuantizedActivation xa(dim), ha(ffn);
    report("rms_norm_q8_1 4096 (+residual, y + q8_1)", time_graph(ctx, L, [&](int) {
               rms_norm_q8_1(x.as<float>(), res.as<float>(), w.as<float>(), y.as<float>(), xa.q(), xa.info(), 1, dim,
                             1e-5f, s);
           }),
           4.0 * dim * 4 + 1.5 * dim);
    report("rms_norm_q8_1 4096 (q8_1 only)", time_graph(ctx, L, [&](int) {
               rms_norm_q8_1(x.as<float>(), nullptr, w.as<float>(), nullptr, xa.q(), xa.info(), 1, dim, 1e-5f, s);
           }),
           2.0 * dim * 4 + 1.5 * dim);
    auto gate = random_buffer(ffn, s, rng), upb = random_buffer(ffn, s, rng);
    report("swiglu_q8_1 14336 (q8_1 only)", time_graph(ctx, L, [&](int) {
               swiglu_q8_1(gate.as<float>(), upb.as<float>(), nullptr, ha.q(), ha.info(), ffn, s);
           }),
           2.0 * ffn * 4 + 1.5 * ffn);
    report("add_inplace 4096", time_graph(ctx, L, [&](int) { add_inplace(y.as<float>(), x.as<float>(), dim, s); }),
           3.0 * dim * 4);

    // RoPE + KV store, f16 cache of 32k positions.
    const int n_ctx_rope = 32768;
    auto q = random_buffer(n_head * hd, s, rng), k = random_buffer(n_kv * hd, s, rng), v = random_buffer(n_kv * hd, s, rng);
    DeviceBuffer kc(static_cast<size_t>(n_ctx_rope) * n_kv * hd * 2), vc(kc.size());
    DeviceBuffer pos(4);
    const int32_t p0 = 20000;
    pos.upload(&p0, 4, s);
    report("rope_kv_store 32x128 q, 8x128 k/v, f16", time_graph(ctx, L, [&](int) {
               rope_kv_store(q.as<float>(), k.as<float>(), v.as<float>(), kc.data(), vc.data(), KvType::F16,
                             pos.as<int32_t>(), n_ctx_rope, n_head, n_kv, hd, hd, 500000.0f, false, nullptr, s);
           }),
           (n_head * hd * 8.0 + n_kv * hd * 8.0 + n_kv * hd * 4.0));

    // Attention, one layer, at several context lengths.
    auto out = random_buffer(n_head * hd, s, rng);
    for (KvType kt : {KvType::F16, KvType::F32}) {
        const size_t esz = kt == KvType::F16 ? 2 : 4;
        for (int ctxlen : {512, 2048, 8192, 32768}) {
            const size_t cache_bytes = static_cast<size_t>(ctxlen) * n_kv * hd * esz;
            const int copies = static_cast<int>(std::min<size_t>(64, std::max<size_t>(1, (256u << 20) / (2 * cache_bytes) + 1)));
            std::vector<DeviceBuffer> ks, vs;
            for (int c = 0; c < copies; ++c) {
                ks.emplace_back(cache_bytes);
                vs.emplace_back(cache_bytes);
                ks.back().fill_bytes(0x11, s);  // finite fp16/fp32 values
                vs.back().fill_bytes(0x11, s);
            }
            DeviceBuffer scratch(decode_attention_scratch_bytes(ctxlen, n_head, hd));
            DeviceBuffer ppos(4);
            const int32_t pl = ctxlen - 1;
            ppos.upload(&pl, 4, s);
            const double us = time_graph(ctx, L, [&](int i) {
                decode_attention(q.as<float>(), ks[i % copies].data(), vs[i % copies].data(), kt, ppos.as<int32_t>(),
                                 ctxlen, n_head, n_kv, hd, 0.088f, scratch.data(), out.as<float>(), s);
            });
            report("decode_attention " + std::string(kt == KvType::F16 ? "f16" : "f32") + " ctx " +
                       std::to_string(ctxlen) + " (" + std::to_string(copies) + " caches)",
                   us, 2.0 * cache_bytes + n_head * hd * 8.0);
        }
    }

    // Short context as in tg128: RoPE + KV write + attention, separate launches vs fused.
    {
        const int n_ctx_s = 4096;
        DeviceBuffer kcs(static_cast<size_t>(n_ctx_s) * n_kv * hd * 2), vcs(kcs.size());
        kcs.fill_bytes(0x11, s);
        vcs.fill_bytes(0x11, s);
        DeviceBuffer scratch(decode_attention_scratch_bytes(n_ctx_s, n_head, hd));
        std::vector<float> inv(static_cast<size_t>(hd / 2));
        for (int i = 0; i < hd / 2; ++i) inv[static_cast<size_t>(i)] = std::pow(500000.0f, -2.0f * i / hd);
        DeviceBuffer dinv(inv.size() * 4);
        dinv.upload(inv.data(), inv.size() * 4, s);
        QuantizedActivation qa(n_head * hd, 2);
        for (int p : {40, 100, 1000}) {
            DeviceBuffer pp(4);
            pp.upload(&p, 4, s);
            const double sep = time_graph(ctx, L, [&](int) {
                rope_kv_store(q.as<float>(), k.as<float>(), v.as<float>(), kcs.data(), vcs.data(), KvType::F16,
                              pp.as<int32_t>(), n_ctx_s, n_head, n_kv, hd, hd, 500000.0f, false, nullptr, s);
                decode_attention(q.as<float>(), kcs.data(), vcs.data(), KvType::F16, pp.as<int32_t>(), n_ctx_s, n_head,
                                 n_kv, hd, 0.088f, scratch.data(), out.as<float>(), s, qa.q(), qa.info(), qa.q2(),
                                 qa.info2());
            });
            const double fused = time_graph(ctx, L, [&](int) {
                decode_attention_rope(q.as<float>(), k.as<float>(), v.as<float>(), kcs.data(), vcs.data(), KvType::F16,
                                      pp.as<int32_t>(), n_ctx_s, n_head, n_kv, hd, dinv.as<float>(), hd, false, 0.088f,
                                      scratch.data(), out.as<float>(), s, qa.q(), qa.info(), qa.q2(), qa.info2());
            });
            const double bytes = 2.0 * (p + 1) * n_kv * hd * 2;
            report("rope_kv_store + decode_attention f16, pos " + std::to_string(p), sep, bytes);
            report("decode_attention_rope (fused) f16, pos " + std::to_string(p), fused, bytes);
        }
    }

    bench_delta_rule(ctx, rng);

    // Embedding row (Q6_K-sized table slice is enough: one row is read) and argmax.
    DeviceBuffer table(static_cast<size_t>(1024) * 4096 * 2);
    table.fill_bytes(0x22, s);
    DeviceBuffer id(4);
    const int32_t id0 = 77;
    id.upload(&id0, 4, s);
    report("get_row F16 4096", time_graph(ctx, L, [&](int) {
               get_row(DType::F16, table.data(), 1024, dim, id.as<int32_t>(), y.as<float>(), s);
           }),
           dim * 6.0);
    report("get_row Q6_K 4096", time_graph(ctx, L, [&](int) {
               get_row(DType::Q6_K, table.data(), 1024, dim, id.as<int32_t>(), y.as<float>(), s);
           }),
           dim * (210.0 / 256 + 4));
    auto logits = random_buffer(vocab, s, rng);
    DeviceBuffer am(argmax_scratch_bytes(vocab)), amo(4);
    report("argmax 128256", time_graph(ctx, L, [&](int) {
               argmax(logits.as<float>(), vocab, am.data(), amo.as<int32_t>(), s);
           }),
           vocab * 4.0);
    return 0;
}
