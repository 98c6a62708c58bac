// The GPU BatchRunner (cuda::make_executor with batches): several sequences' rows per
// pass over a paged KV cache in device memory, against the CPU runner on the
// same model and the same batches (prompt chunks of different sizes, decode
// rows next to prompt rows, a prompt cut across passes, a sequence decoding
// alone through the lone decode step), and the engine driven by it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/session.h"
#include "backend/block_plan.h"
#include "cuda_test_util.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "model/synth.h"
#include "runtime/batch_runner.h"
#include "runtime/engine.h"
#include "runtime/verify.h"
#include "tokenizer/tokenizer.h"

using namespace quern;

namespace {

std::vector<int32_t> ids_of(int64_t n, int64_t seed, int64_t vocab) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<int32_t>((i * 37 + seed * 101 + 3) % vocab);
    return v;
}

struct Runners {
    std::unique_ptr<BatchRunner> cpu, gpu;
    std::unique_ptr<PagedKvPool> kc, kg;
};

// The same batches on both runners; every sequence's logits compared.
// Returns the worst cosine.
double compare_batches(Model& model, ThreadPool& pool, const cuda::SessionOptions& so, const std::string& what,
                       int64_t& argmax_agree, int64_t& argmax_total, std::vector<double>* cosines = nullptr) {
    Runners r;
    r.cpu = make_cpu_batch_runner(model, pool);
    r.gpu = test::cuda_runner(model, so);
    r.kc = r.cpu->make_kv_pool(64, 16, "test");
    r.kg = r.gpu->make_kv_pool(64, 16, "test");
    const bool recurrent = model.config().has_recurrent_state();
    if (recurrent) {  // sequence s carries state slot s
        r.cpu->make_state_slots(4);
        r.gpu->make_state_slots(4);
    }
    const int64_t V = model.config().n_vocab;
    // Four sequences; the same block ids on both pools (allocated alike).
    std::vector<std::vector<int32_t>> toks = {ids_of(40, 1, V), ids_of(9, 2, V), ids_of(23, 3, V), ids_of(3, 4, V)};
    std::vector<std::vector<int32_t>> tables(4);
    for (auto& t : tables)
        for (int b = 0; b < 6; ++b) {
            const int32_t x = r.kc->allocate();
            EXPECT_EQ(x, r.kg->allocate());
            t.push_back(x);
        }
    double worst = 1.0;
    std::vector<std::vector<float>> lc(4, std::vector<float>(static_cast<size_t>(V))), lg = lc;
    std::vector<int32_t> greedy(4, -1);
    // Entries name their sequence's logits buffer by index (L(s)); the GPU
    // gets its own buffers and the device argmax too.
    const auto seq_of = [&](const float* p) -> int {
        for (size_t s = 0; s < lc.size(); ++s)
            if (p == lc[s].data()) return static_cast<int>(s);
        return -1;
    };
    const auto step = [&](std::vector<SeqBatch> b, const char* name) {
        if (recurrent)
            for (SeqBatch& q : b)
                for (size_t s = 0; s < tables.size(); ++s)
                    if (q.block_table == tables[s].data()) q.state_slot = static_cast<int32_t>(s);
        std::vector<SeqBatch> bg = b;
        for (size_t i = 0; i < b.size(); ++i)
            if (const int seq = seq_of(b[i].logits); seq >= 0) {
                bg[i].logits = lg[static_cast<size_t>(seq)].data();
                bg[i].next = &greedy[static_cast<size_t>(seq)];
            }
        r.cpu->forward_batch(b.data(), static_cast<int>(b.size()), *r.kc);
        r.gpu->forward_batch(bg.data(), static_cast<int>(bg.size()), *r.kg);
        for (size_t i = 0; i < b.size(); ++i) {
            const int si = seq_of(b[i].logits);
            if (si < 0) continue;
            const auto seq = static_cast<size_t>(si);
            const double c = cosine_similarity(lc[seq].data(), lg[seq].data(), V);
            const auto am_c = std::max_element(lc[seq].begin(), lc[seq].end()) - lc[seq].begin();
            const auto am_g = std::max_element(lg[seq].begin(), lg[seq].end()) - lg[seq].begin();
            EXPECT_EQ(greedy[seq], am_g) << what << " " << name << " sequence " << seq << ": device argmax";
            argmax_agree += am_c == am_g;
            if (am_c != am_g) {  // only a near-tie may part: the CPU's two logits within 4× the RMS difference
                double ss = 0;
                for (int64_t v = 0; v < V; ++v) {
                    const double e = static_cast<double>(lc[seq][static_cast<size_t>(v)]) - lg[seq][static_cast<size_t>(v)];
                    ss += e * e;
                }
                const double gap = lc[seq][static_cast<size_t>(am_c)] - lc[seq][static_cast<size_t>(am_g)];
                EXPECT_LE(gap, 4.0 * std::sqrt(ss / static_cast<double>(V)))
                    << what << " " << name << " sequence " << seq << ": argmax parted beyond a near-tie";
            }
            ++argmax_total;
            worst = std::min(worst, c);
            if (cosines) cosines->push_back(c);
            std::printf("%-24s %-12s seq %zu: cosine %.7f, argmax %s\n", what.c_str(), name, seq, c,
                        am_c == am_g ? "same" : "differs");
        }
    };
    const auto L = [&](size_t s) { return lc[s].data(); };
    // 1: sequence 0's prompt in two pieces (7 rows, then 33 with logits),
    // sequence 1's whole prompt, sequence 2's first 10 rows.
    step({{toks[0].data(), 7, tables[0].data(), 0, false, nullptr},
          {toks[1].data(), 9, tables[1].data(), 0, false, L(1)},
          {toks[2].data(), 10, tables[2].data(), 0, false, nullptr}},
         "prompts");
    step({{toks[0].data() + 7, 33, tables[0].data(), 7, false, L(0)},
          {toks[2].data() + 10, 13, tables[2].data(), 10, false, L(2)},
          {toks[3].data(), 3, tables[3].data(), 0, false, L(3)}},
         "prompt ends");
    // 2: decode rows of all four next to each other (the GPU runner replays
    // the second pass on as a CUDA graph of 4 rows), except in passes 3 and 4:
    // sequences 0..2 alone (3 rows padded to the same graph: the padding
    // row's keys go to the spare block, never to sequence 3's). Sequence 0
    // passes 64 keys at pass 24, which takes a second graph (key bucket
    // 128), replayed from pass 25 on.
    std::vector<int64_t> past(4);
    for (size_t s = 0; s < 4; ++s) past[s] = static_cast<int64_t>(toks[s].size());
    const int32_t nt[4] = {5, 77, 123, 200};
    for (int d = 0; d < 30; ++d) {
        std::vector<SeqBatch> b;
        for (size_t s = 0; s < 4; ++s) {
            if ((d == 3 || d == 4) && s == 3) continue;
            b.push_back({&nt[s], 1, tables[s].data(), past[s]++, true, L(s)});
        }
        step(b, d == 3 || d == 4 ? "decode of 3" : "decode");
    }
    // 3: a sequence alone, one decode row a pass: the lone decode step over
    // the sequence's block table (its graph replayed each pass; sequence 1
    // crosses from its third block into its fourth, 2 continues on its own
    // state slot).
    for (int d = 0; d < 12; ++d) {
        const size_t s = d < 10 ? 1 : 2;
        step({{&nt[s], 1, tables[s].data(), past[s]++, true, L(s)}}, "decode alone");
    }
    // 4: sequence 3 starts again on its blocks and state slot: a one-token
    // prompt alone at position 0 (the slot's old state dropped), three
    // decode rows alone, then a batch pass of all four sequences' decode rows
    // after the decode step's passes.
    past[3] = 0;
    step({{&nt[3], 1, tables[3].data(), past[3]++, false, L(3)}}, "restart alone");
    for (int d = 0; d < 3; ++d) step({{&nt[3], 1, tables[3].data(), past[3]++, true, L(3)}}, "decode alone");
    if (so.cuda_graph) {
        EXPECT_EQ(r.gpu->graph_replays(), 28 + 16) << what << ": passes replayed from graphs";
    }
    std::vector<SeqBatch> all;
    for (size_t s = 0; s < 4; ++s) all.push_back({&nt[s], 1, tables[s].data(), past[s]++, true, L(s)});
    step(all, "decode after");
    return worst;
}

TEST(CudaBatch, RunnerMatchesTheCpuRunner) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    for (const char* preset :
         {"llama3-1b", "qwen2-7b", "qwen3-8b", "gemma2-2b", "qwen3-30b-a3b", "qwen3.5-27b", "qwen3.5-35b-a3b"})
        for (const char* scheme : {"Q8_0", "Q4_K_M"}) {
            SynthModel sm = make_synthetic(synth_tiny(synth_preset(preset)), scheme, 61);
            auto model = Model::from_weights(sm.cfg, std::move(sm.weights));
            cuda::SessionOptions so;
            so.verbose = false;
            int64_t agree = 0, total = 0;
            std::vector<double> cs;
            const double worst =
                compare_batches(*model, pool, so, std::string(preset) + " " + scheme, agree, total, &cs);
            // The passes multiply in BF16 where the CPU keeps ~15-bit
            // activations. Expert layers: a near-tie routed apart sends a
            // row to another expert, and its keys stay in the sequence's
            // cache (one sequence of qwen3-30b-a3b Q8_0 drifts to 0.9943 on
            // an H200). DeltaNet layers normalize q, k and each head's
            // output, which magnifies the rounding at some rows: the worst
            // row of the dense tiny Qwen3.5 falls to ~0.9993 on an H100, and
            // in the hybrid MoE a row routed apart deviates for that step
            // (0.80 for one decode row of the Q8_0 model, the rows after it
            // back above 0.999), so that model's worst row is not bounded
            // here: with every expert used its batches stay above 0.995
            // (ExpertModelsWithEveryExpertUsedMatchTightly), which bounds
            // what the state slots and the shared expert contribute. Every
            // model's median row stays above 0.9999.
            const std::string p = preset;
            if (p != "qwen3.5-35b-a3b") {
                EXPECT_GE(worst, p == "qwen3-30b-a3b" ? 0.99 : 0.999) << preset << " " << scheme;
            }
            std::nth_element(cs.begin(), cs.begin() + static_cast<std::ptrdiff_t>(cs.size() / 2), cs.end());
            EXPECT_GE(cs[cs.size() / 2], 0.9999) << preset << " " << scheme << ": median cosine";
            EXPECT_GE(agree, total * 9 / 10) << preset << " " << scheme;  // BF16 GEMMs: near-ties may flip a few
        }
    // Heads of 96 (Phi-3 mini's): the tiny phi3 shape with its real head size.
    for (const char* scheme : {"Q8_0", "Q4_K_M"}) {
        SynthPreset p = synth_tiny(synth_preset("phi3-mini"));
        p.cfg.head_dim = p.cfg.rope_dim = 96;
        p.cfg.n_embd = 384;
        SynthModel sm = make_synthetic(p, scheme, 63);
        auto model = Model::from_weights(sm.cfg, std::move(sm.weights));
        ASSERT_EQ(cuda_unsupported(model->program()), "");
        cuda::SessionOptions so;
        so.verbose = false;
        int64_t agree = 0, total = 0;
        const double worst = compare_batches(*model, pool, so, std::string("phi3-mini hd96 ") + scheme, agree, total);
        EXPECT_GE(worst, 0.999) << scheme;
        EXPECT_GE(agree, total * 9 / 10) << scheme;
    }
}

// Expert models with every expert used (8 of 8): no routing choice to part
// from the CPU's, so what remains is the BF16 rounding — the plain MoE held
// to the dense models' 0.999, the hybrid MoE (DeltaNet state slots, shared
// expert) to 0.995.
TEST(CudaBatch, ExpertModelsWithEveryExpertUsedMatchTightly) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    for (const char* preset : {"qwen3-30b-a3b", "qwen3.5-35b-a3b"})
        for (const char* scheme : {"Q8_0", "Q4_K_M"}) {
            SynthPreset p = synth_tiny(synth_preset(preset));
            p.cfg.n_expert_used = p.cfg.n_expert;
            SynthModel sm = make_synthetic(p, scheme, 61);
            auto model = Model::from_weights(sm.cfg, std::move(sm.weights));
            cuda::SessionOptions so;
            so.verbose = false;
            int64_t agree = 0, total = 0;
            const std::string what = std::string(preset) + " all " + scheme;
            const double worst = compare_batches(*model, pool, so, what, agree, total);
            // (The hybrid's DeltaNet normalizations magnify BF16 rounding at
            // some rows, see RunnerMatchesTheCpuRunner: its worst row on an
            // H100 0.9966, and 14 of 122 argmax picks parted over near-ties
            // of the tiny model's flat logits.)
            const bool hybrid = std::string(preset) == "qwen3.5-35b-a3b";
            EXPECT_GE(worst, hybrid ? 0.995 : 0.999) << what;
            EXPECT_GE(agree, total * (hybrid ? 8 : 9) / 10) << what;
        }
}

// LongRoPE (Phi-3 128k's scaling) with an original context of 20: in the
// same passes sequences 0 and 2 (40 and 23 tokens) turn by the long factors,
// 1 and 3 (9 and 3) by the short ones (PagedRows::rope_long), as the CPU
// runner picks them per sequence.
TEST(CudaBatch, LongRopeRowsPickTheirFactors) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    SynthModel sm = make_synthetic(synth_tiny(synth_preset("llama3-1b")), "Q8_0", 62);
    const size_t half = static_cast<size_t>(sm.cfg.rope_dim / 2);
    sm.cfg.rope_factors_short.assign(half, 1.0f);
    sm.cfg.rope_factors_long.resize(half);
    for (size_t i = 0; i < half; ++i) {
        sm.cfg.rope_factors_short[i] = 1.0f + 0.2f * static_cast<float>(i);
        sm.cfg.rope_factors_long[i] = 1.0f + 3.0f * static_cast<float>(i);
    }
    sm.cfg.rope_orig_ctx = 20;
    sm.cfg.rope_attn_factor = 1.1f;
    auto model = Model::from_weights(sm.cfg, std::move(sm.weights));
    cuda::SessionOptions so;
    so.verbose = false;
    int64_t agree = 0, total = 0;
    const double worst = compare_batches(*model, pool, so, "llama3-1b LongRoPE", agree, total);
    EXPECT_GE(worst, 0.999);
    EXPECT_GE(agree, total * 9 / 10);
}

// A pass longer than the runner's rows (2048) is cut into passes; a prompt
// chunk spanning two passes gives the logits of the whole prompt at once.
TEST(CudaBatch, LongBatchesAreCutIntoPasses) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    SynthModel sm = make_synthetic(synth_tiny(synth_preset("llama3-1b")), "Q8_0", 62);
    auto model = Model::from_weights(sm.cfg, std::move(sm.weights));
    cuda::SessionOptions so;
    so.verbose = false;
    auto gpu = test::cuda_runner(*model, so);
    auto cpu = make_cpu_batch_runner(*model, pool);
    auto kg = gpu->make_kv_pool(400, 16, "test");
    auto kc = cpu->make_kv_pool(400, 16, "test");
    const int64_t V = model->config().n_vocab;
    std::vector<int32_t> a = ids_of(1500, 7, V), b = ids_of(1000, 8, V);
    std::vector<int32_t> ta, tb;
    for (int i = 0; i < 94; ++i) ta.push_back(kg->allocate()), kc->allocate();
    for (int i = 0; i < 63; ++i) tb.push_back(kg->allocate()), kc->allocate();
    std::vector<float> ga(static_cast<size_t>(V)), gb(ga.size()), ca(ga.size()), cb(ga.size());
    SeqBatch bg[2] = {{a.data(), 1500, ta.data(), 0, false, ga.data()}, {b.data(), 1000, tb.data(), 0, false, gb.data()}};
    SeqBatch bc[2] = {{a.data(), 1500, ta.data(), 0, false, ca.data()}, {b.data(), 1000, tb.data(), 0, false, cb.data()}};
    gpu->forward_batch(bg, 2, *kg);
    cpu->forward_batch(bc, 2, *kc);
    const double c1 = cosine_similarity(ga.data(), ca.data(), V), c2 = cosine_similarity(gb.data(), cb.data(), V);
    std::printf("2500 rows in passes of 2048: cosine %.7f / %.7f\n", c1, c2);
    EXPECT_GE(c1, 0.999);
    EXPECT_GE(c2, 0.999);
    // Block ids outside the pool and token ids outside the vocabulary are refused.
    const int32_t bad_tab[1] = {400}, tok = 1, bad_tok = static_cast<int32_t>(V);
    SeqBatch x1[1] = {{&tok, 1, bad_tab, 0, false, nullptr}};
    EXPECT_THROW(gpu->forward_batch(x1, 1, *kg), Error);
    SeqBatch x2[1] = {{&bad_tok, 1, ta.data(), 0, false, nullptr}};
    EXPECT_THROW(gpu->forward_batch(x2, 1, *kg), Error);
}

// The engine on the GPU runner: concurrent greedy requests all finish with
// the tokens they asked for, and the first token of each equals the CPU
// engine's (the prompt's logits agree to BF16 precision).
TEST(CudaBatch, EngineRunsOnTheGpu) {
    REQUIRE_GPU();
    SynthModel sm = make_synthetic(synth_tiny(synth_preset("llama3-1b")), "Q4_K_M", 63);
    const std::string path = (std::filesystem::temp_directory_path() / "quern-batch-engine-test.gguf").string();
    write_synthetic_gguf(sm, path);  // for its tokenizer (the engine asks it which ids end a generation)
    const std::unique_ptr<Tokenizer> tok = Tokenizer::from_file(path);
    std::filesystem::remove(path);
    auto model = Model::from_weights(sm.cfg, std::move(sm.weights));
    const int64_t V = model->config().n_vocab;
    EngineOptions eo;
    eo.n_ctx = 256;
    eo.n_parallel = 8;
    eo.n_threads = 2;
    cuda::SessionOptions so;
    so.verbose = false;
    auto run = [&](bool gpu) {
        std::unique_ptr<Engine> e =
            gpu ? make_engine([&](ThreadPool&) { return test::cuda_runner(*model, so); },
                              *tok, eo)
                : make_engine(*model, *tok, eo);
        std::vector<std::vector<int32_t>> out(12);
        std::vector<int> done(12, 0);
        std::mutex mu;
        std::condition_variable cv;
        for (int i = 0; i < 12; ++i) {
            GenerationRequest r;
            r.prompt = ids_of(10 + 7 * i, 20 + i, V);
            r.max_tokens = 16;
            r.ignore_eos = true;
            r.sampling.temperature = 0;
            e->submit(std::move(r), [&, i](const TokenEvent& ev) {
                std::lock_guard<std::mutex> lk(mu);
                if (ev.token >= 0) out[static_cast<size_t>(i)].push_back(ev.token);
                if (ev.last) done[static_cast<size_t>(i)] = 1, cv.notify_all();
                return true;
            });
        }
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return std::count(done.begin(), done.end(), 1) == 12; });
        return out;
    };
    const auto g = run(true), c = run(false);
    int same_first = 0;
    for (int i = 0; i < 12; ++i) {
        EXPECT_EQ(g[static_cast<size_t>(i)].size(), 16u) << "request " << i;
        same_first += !g[static_cast<size_t>(i)].empty() && g[static_cast<size_t>(i)][0] == c[static_cast<size_t>(i)][0];
    }
    std::printf("engine on the GPU: %d of 12 first tokens as on the CPU\n", same_first);
    EXPECT_GE(same_first, 11);
}

}  // namespace
