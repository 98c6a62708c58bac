// The layer program's CPU interpreter against the forward pass it replaces
// (legacy_llama.inc): the same token scripts through both give the same
// logits, traces and KV-cache contents, bit for bit — for the default model,
// every synthetic preset in several weight types and every Hugging Face
// test checkpoint.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "backend/cpu/program_runner.h"
#include "formats/gguf.h"
#include "legacy_llama.inc"
#include "model/hf_model.h"
#include "model/synth.h"
#include "runtime/paged_kv.h"
#include "test_util.h"

namespace quern {
namespace {

struct Script {
    int64_t ctx = 64;
    int64_t prompt = 20;      // first call
    int64_t all_logits = 12;  // a call that wants every row's logits
};

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
    return t;
}

void expect_bits(const float* a, const float* b, size_t n, const std::string& what) {
    size_t first = n;
    for (size_t i = 0; i < n && first == n; ++i)
        if (std::memcmp(a + i, b + i, 4) != 0) first = i;
    EXPECT_EQ(first, n) << what << ": first differing float " << first << " of " << n << " (" << a[first] << " vs "
                        << (first < n ? b[first] : 0.0f) << ")";
}

using Traces = std::vector<std::pair<std::string, std::vector<float>>>;

void check(Model& m, const std::string& label, const ModelOptions& opts, const Script& sc) {
    SCOPED_TRACE(label);
    const ModelConfig& c = m.config();
    const auto V = static_cast<size_t>(c.n_vocab);
    ThreadPool pool(2);
    Traces ta, tb;
    const auto tracer = [](Traces& t) {
        return [&t](const std::string& n, const float* d, int64_t k) { t.emplace_back(n, std::vector<float>(d, d + k)); };
    };
    legacy::LlamaModel old(c, m.weights(), opts, tracer(ta));
    m.set_options(opts);
    m.set_trace(tracer(tb));

    // One sequence: a prompt, then decode steps of the greedy token.
    KvCache ca = m.make_cache(sc.ctx), cb = m.make_cache(sc.ctx);
    std::vector<float> la(V), lb(V);
    std::vector<int32_t> toks = random_tokens(sc.prompt, c.n_vocab, 11);
    old.forward(toks.data(), sc.prompt, ca, la.data(), false, pool);
    m.forward(toks.data(), sc.prompt, cb, lb.data(), false, pool);
    expect_bits(la.data(), lb.data(), V, "prompt logits");
    for (int step = 0; step < 4; ++step) {
        const auto t = static_cast<int32_t>(std::max_element(la.begin(), la.end()) - la.begin());
        old.forward(&t, 1, ca, la.data(), false, pool);
        m.forward(&t, 1, cb, lb.data(), false, pool);
        expect_bits(la.data(), lb.data(), V, "decode step " + std::to_string(step));
    }
    for (int64_t il = 0; il < c.n_layer; ++il) {
        expect_bits(ca.k(il), cb.k(il), static_cast<size_t>(ca.size() * c.kv_dim()), "K cache");
        expect_bits(ca.v(il), cb.v(il), static_cast<size_t>(ca.size() * c.kv_dim()), "V cache");
    }
    ASSERT_EQ(ta.size(), tb.size());
    for (size_t i = 0; i < ta.size(); ++i) {
        EXPECT_EQ(ta[i].first, tb[i].first);
        ASSERT_EQ(ta[i].second.size(), tb[i].second.size());
        expect_bits(ta[i].second.data(), tb[i].second.data(), ta[i].second.size(), "trace " + ta[i].first);
    }
    m.set_trace(nullptr);

    // Every row's logits.
    {
        KvCache a = m.make_cache(sc.ctx), b = m.make_cache(sc.ctx);
        std::vector<int32_t> t = random_tokens(sc.all_logits, c.n_vocab, 12);
        std::vector<float> xa(V * t.size()), xb(V * t.size());
        legacy::LlamaModel o2(c, m.weights(), opts);
        o2.forward(t.data(), sc.all_logits, a, xa.data(), true, pool);
        m.forward(t.data(), sc.all_logits, b, xb.data(), true, pool);
        expect_bits(xa.data(), xb.data(), xa.size(), "all logits");
    }

    // Batches over a paged cache: three sequences, prompts then mixed steps.
    const int64_t bs = 16, blocks = (sc.ctx + bs - 1) / bs;
    PagedKvPool pa(c.n_layer, c.kv_dim(), 3 * blocks, bs), pb(c.n_layer, c.kv_dim(), 3 * blocks, bs);
    std::vector<int32_t> tables(static_cast<size_t>(3 * blocks));
    for (size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int32_t>(tables.size() - 1 - i);
    const int64_t lens[2][3] = {{sc.prompt, sc.prompt / 2 + 3, 5}, {1, 1, 3}};
    int64_t past[3] = {0, 0, 0};
    std::vector<float> ba(3 * V), bb(3 * V);
    for (int round = 0; round < 2; ++round) {
        std::vector<std::vector<int32_t>> t(3);
        SeqBatch sa[3], sb[3];
        for (int s = 0; s < 3; ++s) {
            t[static_cast<size_t>(s)] = random_tokens(lens[round][s], c.n_vocab, static_cast<uint32_t>(20 + 3 * round + s));
            const bool want = round == 1 || s != 1;
            sa[s] = SeqBatch{t[static_cast<size_t>(s)].data(), lens[round][s], tables.data() + s * blocks, past[s], round == 1,
                             want ? ba.data() + s * V : nullptr};
            sb[s] = sa[s];
            sb[s].logits = want ? bb.data() + s * V : nullptr;
        }
        old.forward_batch(sa, 3, pa.store(), pool);
        cpu::ProgramRunner runner(m.program());
        runner.set_options(opts);
        runner.forward_batch(sb, 3, pb.store(), pool);
        for (int s = 0; s < 3; ++s) past[s] += lens[round][s];
        expect_bits(ba.data(), bb.data(), ba.size(), "batch logits, round " + std::to_string(round));
    }
    const PagedKvStore a = pa.store(), b = pb.store();
    expect_bits(a.k, b.k, static_cast<size_t>(a.layer_stride * a.n_layer), "paged K");
    expect_bits(a.v, b.v, static_cast<size_t>(a.layer_stride * a.n_layer), "paged V");
}

TEST(ProgramEquivalence, DefaultModel) {
    if (!test::have_default_model()) GTEST_SKIP() << "default model not found";
    auto m = Model::from_gguf(std::make_shared<GgufFile>(test::default_model_path()));
    for (bool precise : {true, false}) {
        ModelOptions o;
        o.precise_activations = precise;
        // 600 positions: the first call crosses forward()'s 512-row passes.
        check(*m, precise ? "precise" : "fast-act", o, Script{1024, 600, 40});
    }
}

TEST(ProgramEquivalence, SynthPresets) {
    for (const SynthPreset& full : synth_presets()) {
        if (full.cfg.arch == "granite") continue;  // added with the program: the old pass never ran it
        const SynthPreset p = synth_tiny(full);
        for (const char* scheme : {"F32", "Q8_0", "Q4_K_M", "F8_E4M3_B32", "NVFP4"}) {
            SynthModel sm = make_synthetic(p, scheme, 3);
            auto m = Model::from_weights(sm.cfg, std::move(sm.weights));
            ModelOptions o;
            o.fp8_activation_rows = std::string(scheme) == "F8_E4M3_B32" ? 8 : 0;
            check(*m, p.name + " " + scheme, o, Script{});
        }
    }
}

TEST(ProgramEquivalence, HfCheckpoints) {
    namespace fs = std::filesystem;
    const fs::path root = fs::path(QUERN_SOURCE_DIR) / "tests/data/hf";
    int n = 0;
    for (const auto& arch : fs::directory_iterator(root)) {
        if (arch.path().filename() == "granite") continue;  // added with the program: the old pass never ran it
        for (const auto& v : fs::directory_iterator(arch.path())) {
            if (!v.is_directory()) continue;
            auto m = load_hf_model(v.path().string());
            // LongRoPE checkpoints switch factors at 16 positions: cross it.
            check(*m, arch.path().filename().string() + "/" + v.path().filename().string(), ModelOptions{},
                  Script{64, 20, 24});
            ++n;
        }
    }
    EXPECT_GE(n, 20);
}

}  // namespace
}  // namespace quern
