// The runtime over the backend-neutral Executor (backend/executor.h) on the
// CPU: a Session's passes (one sequence over blocks 0, 1, 2, ...) compute
// bit for bit what Model::forward computes on a cache of its own — prompt,
// decode steps, truncation, traces — and the executor refuses what it cannot
// do before anything runs.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backend/cpu/executor.h"
#include "core/error.h"
#include "model/model.h"
#include "model/synth.h"
#include "runtime/session.h"

namespace quern {
namespace {

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
    return t;
}

std::unique_ptr<Model> tiny(const std::string& preset, const std::string& quant) {
    SynthModel sm = make_synthetic(synth_tiny(synth_preset(preset)), quant, 91);
    return Model::from_weights(sm.cfg, std::move(sm.weights));
}

TEST(Executor, CpuSessionMatchesModelForwardBitForBit) {
    for (const char* preset : {"llama3-8b", "gemma3-4b", "qwen3-30b-a3b", "phi3-mini", "qwen2-7b"}) {
        SCOPED_TRACE(preset);
        auto m = tiny(preset, "Q8_0");
        const auto V = static_cast<size_t>(m->config().n_vocab);
        ThreadPool pool(2);
        const std::vector<int32_t> toks = random_tokens(40, m->config().n_vocab, 5);
        auto s = make_cpu_session(*m, 50, pool);  // 50: not a whole number of blocks
        EXPECT_EQ(s->n_ctx(), 50);
        KvCache ref = m->make_cache(50);
        std::vector<float> a(V), b(V);
        // A prompt, a decode step, a truncation and a new continuation.
        s->eval(toks.data(), 21, a.data());
        m->forward(toks.data(), 21, ref, b.data(), false, pool);
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), V * sizeof(float)));
        const int32_t next = s->eval_greedy(toks[21]);
        m->forward(&toks[21], 1, ref, b.data(), false, pool);
        EXPECT_EQ(next, std::max_element(b.begin(), b.end()) - b.begin());
        s->truncate(10);
        ref.set_size(10);
        EXPECT_EQ(s->size(), 10);
        std::vector<std::string> names_a, names_b;
        s->eval_traced(toks.data() + 25, 15, a.data(),
                       [&](const std::string& n, const float*, int64_t) { names_a.push_back(n); });
        m->set_trace([&](const std::string& n, const float*, int64_t) { names_b.push_back(n); });
        m->forward(toks.data() + 25, 15, ref, b.data(), false, pool);
        m->set_trace(nullptr);
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), V * sizeof(float)));
        EXPECT_FALSE(names_a.empty());
        EXPECT_EQ(names_a, names_b);
        EXPECT_EQ(s->size(), 25);
        // The context holds 50: 25 more do not fit, and nothing runs.
        EXPECT_THROW(s->eval(toks.data(), 26, a.data()), Error);
        EXPECT_EQ(s->size(), 25);
    }
}

TEST(Executor, RefusesWhatItCannotDo) {
    auto m = tiny("llama3-8b", "Q8_0");
    ThreadPool pool(1);
    auto x = cpu::make_executor(m->program(), m->options(), pool);
    const int32_t tok = 1;
    int32_t next = -1;
    SeqBatch q;
    q.tokens = &tok;
    q.n = 1;
    ForwardBatch b;
    b.seqs = &q;
    b.n_seqs = 1;
    EXPECT_THROW(x->forward(b), Error);  // no storage yet
    EXPECT_EQ(x->make_kv_storage(4, 16, "test"), 4);
    const std::vector<int32_t> table{0, 1, 2, 3}, outside{0, 9};
    q.block_table = outside.data();
    q.n_past = 20;  // the second block (9) is outside the storage
    EXPECT_THROW(x->forward(b), Error);
    q.block_table = table.data();
    q.n_past = 0;
    SamplingSpec sp;
    q.next = &next;
    q.sampling = &sp;  // the CPU runs no sampling chain
    EXPECT_THROW(x->forward(b), Error);
    q.sampling = nullptr;
    const TraceFn t = [](const std::string&, const float*, int64_t) {};
    b.trace = &t;  // a trace needs a lone pass (invariant false)
    EXPECT_THROW(x->forward(b), Error);
    b.invariant = false;
    x->forward(b);
    EXPECT_GE(next, 0);
    EXPECT_LT(next, m->config().n_vocab);
    // A batch-invariant pass takes the same token the same next token.
    b.trace = nullptr;
    b.invariant = true;
    int32_t again = -1;
    q.next = &again;
    x->forward(b);
    EXPECT_EQ(again, next);
}

}  // namespace
}  // namespace quern
