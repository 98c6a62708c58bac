// Qwen3.5's multi-token-prediction (NextN) head on the GPU: its draft
// program through the CUDA rows path (the prologue eh_proj · [RMSNorm(embed)
// | RMSNorm(given row)], one attention block, the shared LM head) against
// transformers' reference (tools/make_hf_golden.py --gpu-shapes) and against
// the CPU's program for the MoE preset; the model's per-row logits and
// hidden rows on the GPU; speculative decoding with both on the GPU (a
// session, as `quern run --spec mtp`, and the serving engine).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/session.h"
#include "core/thread_pool.h"
#include "cuda_test_util.h"
#include "model/hf_model.h"
#include "model/model.h"
#include "model/synth.h"
#include "runtime/engine.h"
#include "runtime/speculative.h"
#include "tokenizer/tokenizer.h"
#include "../model/hf_test_util.h"

using namespace quern;
using quern::hf_test::argmax;
namespace fs = std::filesystem;

namespace {

const std::string kRoot = std::string(QUERN_SOURCE_DIR) + "/tests/data/hf_gpu/qwen3_5/";

cuda::SessionOptions quiet() {
    cuda::SessionOptions o;
    o.verbose = false;
    return o;
}

std::unique_ptr<Session> gpu_draft(const Model& m, int64_t n_ctx) {
    cuda::SessionOptions o = quiet();
    o.precise_activations = m.options().precise_activations;
    return make_draft_session(m, cuda::make_executor(draft_program_of(m), o), n_ctx);
}

std::vector<int32_t> golden_tokens() {
    std::ifstream in(kRoot + "golden.json");
    return nlohmann::json::parse(in)["tokens"].get<std::vector<int32_t>>();
}

double row_cosine(const std::vector<float>& a, const std::vector<float>& b, int64_t row, int64_t width) {
    return cosine_similarity(a.data() + row * width, b.data() + row * width, width);
}

// The model's hidden rows and every row's logits from one GPU pass match
// the CPU's (BF16 GEMM inputs on the rows path: 1 - 5e-4 on an H100); the
// head given those rows matches transformers' reference at every position
// of the 64-token prompt (1 - 1.5e-5), all rows in one pass and one row per
// pass alike.
TEST(CudaMtp, DraftLogitsMatchTheReferenceAtEveryPosition) {
    REQUIRE_GPU();
    const auto tokens = golden_tokens();
    const std::vector<float> ref = hf_test::read_logits(kRoot + "fp32.mtp.logits");
    auto model = load_hf_model(kRoot + "fp32");
    ASSERT_NE(model->draft_program(), nullptr);
    const int64_t n = static_cast<int64_t>(tokens.size()), V = model->config().n_vocab, E = model->config().n_embd;
    ASSERT_EQ(static_cast<int64_t>(ref.size()), (n - 1) * V);
    ThreadPool pool(2);
    auto cpu = make_cpu_session(*model, 128, pool);
    auto gpu = test::cuda_session(*model, quiet(), 128);
    std::vector<float> ch(static_cast<size_t>(n * E)), gh(ch.size()), cl(static_cast<size_t>(n * V)), gl(cl.size());
    cpu->eval_rows(tokens.data(), n, cl.data(), true, ch.data());
    gpu->eval_rows(tokens.data(), n, gl.data(), true, gh.data());
    double worst_h = 1, worst_l = 1;
    for (int64_t p = 0; p < n; ++p) {
        worst_h = std::min(worst_h, row_cosine(ch, gh, p, E));
        worst_l = std::min(worst_l, row_cosine(cl, gl, p, V));
    }
    EXPECT_GE(worst_h, 0.999) << "hidden rows";
    EXPECT_GE(worst_l, 0.999) << "every row's logits";

    auto head = gpu_draft(*model, 128);
    std::vector<float> out(static_cast<size_t>((n - 1) * V));
    head->eval_rows(tokens.data() + 1, n - 1, out.data(), true, nullptr, gh.data());
    auto steps = gpu_draft(*model, 128);
    std::vector<float> one(static_cast<size_t>(V)), hrow(static_cast<size_t>(E));
    double worst = 1, worst_steps = 1;
    int argmax_same = 0, argmax_clear = 0;
    for (int64_t p = 0; p < n - 1; ++p) {
        const float* r = ref.data() + p * V;
        const double cs = cosine_similarity(out.data() + p * V, r, V);
        worst = std::min(worst, cs);
        EXPECT_GE(cs, 0.9999) << "position " << p;
        std::vector<float> sorted(r, r + V);
        std::nth_element(sorted.begin(), sorted.begin() + 1, sorted.end(), std::greater<float>());
        if (sorted[0] - sorted[1] > 0.05f) {  // not a near-tie of the reference
            ++argmax_clear;
            argmax_same += argmax(out.data() + p * V, V) == argmax(r, V);
        }
        steps->eval_rows(tokens.data() + 1 + p, 1, one.data(), false, hrow.data(), gh.data() + p * E);
        worst_steps = std::min(worst_steps, cosine_similarity(one.data(), out.data() + p * V, V));
    }
    EXPECT_EQ(argmax_same, argmax_clear);
    EXPECT_GE(worst_steps, 0.9999) << "one row per pass against all at once";
    std::printf("GPU MTP head: %lld positions, worst cosine to transformers 1 - %.2e (one row per pass to all at once "
                "1 - %.2e), argmax %d of %d clear positions; the model's hidden rows 1 - %.2e, row logits 1 - %.2e "
                "to the CPU\n",
                static_cast<long long>(n - 1), 1.0 - worst, 1.0 - worst_steps, argmax_same, argmax_clear,
                1.0 - worst_h, 1.0 - worst_l);
}

// The synthetic tiny presets' heads (the 35B-A3B's with its routed and
// shared experts) on the GPU against the CPU's program, given the same
// hidden rows; weights in Q8_0 and Q4_K_M.
TEST(CudaMtp, PresetHeadsMatchTheCpu) {
    REQUIRE_GPU();
    ThreadPool pool(2);
    const std::vector<int32_t> ids = {1, 15, 300, 400, 77, 123, 9, 60, 128, 5, 33, 210, 17, 44, 99, 250};
    const int64_t n = static_cast<int64_t>(ids.size());
    for (const char* preset : {"qwen3.5-27b", "qwen3.5-35b-a3b"})
        for (const char* scheme : {"Q8_0", "Q4_K_M"}) {
            SynthModel sm = make_synthetic(synth_tiny(synth_preset(preset)), scheme, 31);
            auto model = Model::from_weights(sm.cfg, std::move(sm.weights));
            ASSERT_NE(model->draft_program(), nullptr) << preset;
            const int64_t V = model->config().n_vocab, E = model->config().n_embd;
            auto trunk = make_cpu_session(*model, 64, pool);
            std::vector<float> h(static_cast<size_t>(n * E));
            trunk->eval_rows(ids.data(), n, nullptr, false, h.data());
            auto cpu = make_cpu_draft_session(*model, 64, pool);
            auto gpu = gpu_draft(*model, 64);
            std::vector<float> cl(static_cast<size_t>((n - 1) * V)), gl(cl.size());
            cpu->eval_rows(ids.data() + 1, n - 1, cl.data(), true, nullptr, h.data());
            gpu->eval_rows(ids.data() + 1, n - 1, gl.data(), true, nullptr, h.data());
            double worst = 1;
            for (int64_t p = 0; p < n - 1; ++p) worst = std::min(worst, row_cosine(cl, gl, p, V));
            std::printf("%-16s %-7s GPU MTP head to the CPU: worst cosine 1 - %.2e over %lld rows\n", preset, scheme,
                        1.0 - worst, static_cast<long long>(n - 1));
            EXPECT_GE(worst, 0.999) << preset << " " << scheme;
        }
}

// A verification pass that keeps its rows' recurrent states, cut back to m
// of its 4 rows (Session::keep_rows), continues as a session that evaluated
// only those m: the Qwen3.5 fixture (dense) and the tiny 35B-A3B preset.
TEST(CudaMtp, KeptRowsContinueAsIfOnlyThoseRan) {
    REQUIRE_GPU();
    auto fixture = load_hf_model(kRoot + "fp32");
    SynthModel sm = make_synthetic(synth_tiny(synth_preset("qwen3.5-35b-a3b")), "Q8_0", 37);
    auto moe = Model::from_weights(sm.cfg, std::move(sm.weights));
    const std::vector<int32_t> prompt{3, 141, 59, 26, 5, 35, 89, 79, 32, 38, 46, 26};
    const std::vector<int32_t> round{7, 200, 13, 99}, next{42, 17};
    for (const Model* m : {fixture.get(), moe.get()}) {
        const int64_t V = m->config().n_vocab;
        for (int64_t keep = 1; keep <= 4; ++keep) {
            auto a = test::cuda_session(*m, quiet(), 64), b = test::cuda_session(*m, quiet(), 64);
            ASSERT_TRUE(a->keeps_row_states());
            std::vector<float> rows(static_cast<size_t>(4 * V)), la(static_cast<size_t>(2 * V)), lb(la.size());
            a->eval_rows(prompt.data(), 12, nullptr, false, nullptr);
            b->eval_rows(prompt.data(), 12, nullptr, false, nullptr);
            a->eval_rows(round.data(), 4, rows.data(), true, nullptr, nullptr, true);
            a->keep_rows(keep);
            EXPECT_EQ(a->size(), 12 + keep);
            b->eval_rows(round.data(), keep, rows.data(), true, nullptr);
            a->eval_rows(next.data(), 2, la.data(), true, nullptr);
            b->eval_rows(next.data(), 2, lb.data(), true, nullptr);
            for (int64_t r = 0; r < 2; ++r)
                EXPECT_GE(row_cosine(la, lb, r, V), 0.99999) << m->config().n_layer << " layers, kept " << keep << ", row " << r;
        }
    }
}

/// A greedy continuation of `prompt` by n tokens on the GPU through plain
/// decode steps, with each step's margin between its two best logits.
std::vector<int32_t> plain_greedy(const Model& m, const std::vector<int32_t>& prompt, int n, std::vector<float>& gap) {
    auto s = test::cuda_session(m, quiet(), 128);
    const auto V = static_cast<int64_t>(m.config().n_vocab);
    std::vector<float> l(static_cast<size_t>(V));
    std::vector<int32_t> out;
    s->eval(prompt.data(), static_cast<int64_t>(prompt.size()), l.data());
    for (;;) {
        std::vector<float> top(l);
        std::nth_element(top.begin(), top.begin() + 1, top.end(), std::greater<float>());
        gap.push_back(top[0] - top[1]);
        out.push_back(static_cast<int32_t>(argmax(l.data(), V)));
        if (static_cast<int>(out.size()) == n) return out;
        s->eval(&out.back(), 1, l.data());
    }
}

/// Where a greedy run parts from the plain one: every token equal, or the
/// first difference at a near-tie of the plain run (its two best logits
/// within `tie`: the verification rows are multiplied in BF16 on the
/// tensor cores, the decode steps with 8-bit activations).
void expect_same_but_near_ties(const std::vector<int32_t>& got, const std::vector<int32_t>& want,
                               const std::vector<float>& gap, const std::string& what, float tie = 0.05f) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i) {
        if (got[i] == want[i]) continue;
        EXPECT_LT(gap[i], tie) << what << ": token " << i << " differs where the plain run's best two logits are "
                               << gap[i] << " apart";
        std::printf("%s: parts from the plain run at token %zu, a near-tie (%.4f)\n", what.c_str(), i, gap[i]);
        return;
    }
}

// Greedy speculative decoding with the model and its head on the GPU gives
// the plain decode steps' tokens (up to a near-tie), and the distilled head
// has drafts kept.
TEST(CudaMtp, GreedySpeculativeDecodingGivesTheSameTokens) {
    REQUIRE_GPU();
    auto model = load_hf_model(kRoot + "fp32");
    const std::vector<int32_t> prompt{3, 141, 59, 26, 5, 35, 89, 79, 32, 38, 46, 26};
    constexpr int kTokens = 40;
    std::vector<float> gap;
    const auto want = plain_greedy(*model, prompt, kTokens, gap);
    for (int k : {1, 2, 4}) {
        auto s = test::cuda_session(*model, quiet(), 128);
        Speculator sp(*s, make_mtp_drafter(gpu_draft(*model, 128)), k, 1);
        SamplingParams p;
        p.temperature = 0;
        Sampler sampler(p, model->config().n_vocab);
        std::vector<float> l(static_cast<size_t>(model->config().n_vocab));
        sp.eval(prompt.data(), static_cast<int64_t>(prompt.size()), l.data());
        std::vector<int32_t> out{sampler.sample(l.data())};
        sampler.accept(out.back());
        while (static_cast<int>(out.size()) < kTokens) {
            std::vector<int32_t> got;
            sp.step(out.back(), sampler, got);
            for (int32_t t : got) sampler.accept(t), out.push_back(t);
        }
        out.resize(kTokens);
        expect_same_but_near_ties(out, want, gap, "k = " + std::to_string(k));
        const SpecStats& st = sp.stats();
        EXPECT_GT(st.accepted, 0) << "k = " << k << ": the fixture's head is distilled from the trunk";
        std::printf("GPU k=%d: %lld of %lld drafts kept (%.0f%%), %.2f tokens per pass\n", k,
                    static_cast<long long>(st.accepted), static_cast<long long>(st.drafted), 100 * st.acceptance(),
                    static_cast<double>(st.emitted) / static_cast<double>(st.rounds));
    }
}

// The serving engine on the GPU with speculative rounds (its head's passes
// batched over the sequences on the GPU too): 12 greedy requests, 6 at a
// time with preemption, give the tokens they give without drafts (11 of 12
// at least: the passes' row counts differ between the runs, so a near-tie
// may part one), and drafts are kept.
TEST(CudaMtp, ServingWithDraftsGivesTheSameTokens) {
    REQUIRE_GPU();
    const auto tokens = golden_tokens();
    auto model = load_hf_model(kRoot + "fp32");
    const fs::path tj = fs::temp_directory_path() / "quern_mtp_cuda_tok.json";
    std::ofstream(tj) << hf_test::byte_tokenizer_json();
    auto tok = Tokenizer::from_file(tj.string());
    fs::remove(tj);
    constexpr int kRequests = 12;
    const auto run = [&](int spec_draft, EngineStats* stats) {
        EngineOptions o;
        o.n_ctx = 96;
        o.n_parallel = 6;
        o.n_threads = 2;
        o.token_budget = 9;
        o.kv_tokens = 192;
        o.spec_draft = spec_draft;
        DraftFactory draft = [&](ThreadPool&) {
            cuda::SessionOptions so = quiet();
            so.batches = true;
            return cuda::make_executor(draft_program_of(*model), so);
        };
        auto e = make_engine([&](ThreadPool&) { return test::cuda_runner(*model, quiet()); }, *tok, o, draft);
        auto out = hf_test::run_mixed_requests(*e, tokens, kRequests);
        if (stats) *stats = e->stats();
        return out;
    };
    const auto plain = run(0, nullptr);
    for (int k : {1, 3}) {
        EngineStats st;
        const auto spec = run(k, &st);
        int same = 0;
        for (int i = 0; i < kRequests; ++i) same += spec[static_cast<size_t>(i)] == plain[static_cast<size_t>(i)];
        std::printf("GPU serving k=%d: %d of %d requests as without drafts; %lld of %lld drafts kept, %lld preemptions\n",
                    k, same, kRequests, static_cast<long long>(st.spec_accepted), static_cast<long long>(st.spec_drafted),
                    static_cast<long long>(st.preemptions));
        EXPECT_GE(same, kRequests - 1) << "k = " << k;
        EXPECT_GT(st.spec_accepted, 0) << "k = " << k;
    }
}

}  // namespace
