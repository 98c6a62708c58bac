// The serving engine (src/runtime/engine.h) on the default model: isolation
// (a request gives the same tokens alone or among others), seeded sampling,
// cancellation, limits, queueing and bad requests; and the batched forward
// pass against the single-sequence one.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "formats/gguf.h"
#include "model/model.h"
#include "backend/cpu/program_runner.h"
#include "runtime/batch_runner.h"
#include "runtime/engine.h"
#include "runtime/paged_kv.h"
#include "runtime/verify.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace quern;

namespace {

struct Loaded {
    std::shared_ptr<GgufFile> file;
    std::unique_ptr<Model> model;
    std::unique_ptr<Tokenizer> tok;
};

Loaded& loaded() {
    static Loaded L = [] {
        Loaded l;
        l.file = std::make_shared<GgufFile>(test::default_model_path());
        l.model = Model::from_gguf(l.file);
        l.tok = Tokenizer::from_gguf(*l.file);
        return l;
    }();
    return L;
}

/// Collects one request's events; wait() blocks until the last one.
struct Collector {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<int32_t> tokens;
    FinishReason finish = FinishReason::None;
    std::string error;
    bool done = false;
    int cancel_after = -1;  // return false after this many tokens
    TokenCallback cb() {
        return [this](const TokenEvent& e) {
            std::lock_guard<std::mutex> lk(mu);
            if (e.token >= 0) tokens.push_back(e.token);
            if (e.last) {
                finish = e.finish;
                error = e.error;
                done = true;
                cv.notify_all();
            }
            return cancel_after < 0 || static_cast<int>(tokens.size()) < cancel_after;
        };
    }
    void wait() {
        std::unique_lock<std::mutex> lk(mu);
        ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(120), [&] { return done; })) << "request never finished";
    }
};

GenerationRequest greedy(const std::string& text, int max_tokens) {
    GenerationRequest r;
    r.prompt = loaded().tok->encode(text, true, true);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.sampling.top_k = 0;
    r.sampling.top_p = 1;
    r.sampling.min_p = 0;
    return r;
}

const std::vector<std::string>& prompts() {
    static const std::vector<std::string> p = {
        "The capital of France is",
        "Once upon a time, in a small village by the sea, there lived an old fisherman who",
        "def fibonacci(n):",
        "The three primary colors are",
        "<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n",
        "In 1969, Neil Armstrong became the first person to walk on the Moon. The mission, Apollo 11, launched from "
        "Florida and the crew of three spent eight days in space before they returned safely to Earth, where",
        "Photosynthesis is the process by which",
        "1, 2, 3, 4, 5,",
    };
    return p;
}

}  // namespace

TEST(Engine, BatchedForwardMatchesSingleSequence) {
    if (!test::have_default_model()) GTEST_SKIP() << "default model not fetched";
    Model& m = *loaded().model;
    const auto& c = m.config();
    ThreadPool pool(0);
    const auto nv = static_cast<size_t>(c.n_vocab);
    const std::vector<int32_t> a = loaded().tok->encode(prompts()[5], true, true);
    const std::vector<int32_t> b = loaded().tok->encode(prompts()[0], true, true);
    auto runner = make_cpu_batch_runner(m, pool);
    auto pkv = runner->make_kv_pool(32, 16, "test");
    PagedKvPool& kv = *pkv;
    // Block tables in scrambled order, to exercise the indirection.
    std::vector<int32_t> ta, tb;
    for (int i = 0; i < 4; ++i) tb.push_back(kv.allocate());
    for (int i = 0; i < 6; ++i) ta.push_back(kv.allocate());
    std::swap(ta[0], ta[3]);
    KvCache ref = m.make_cache(128);
    std::vector<float> la(nv), lb(nv), lr(nv);
    m.forward(a.data(), static_cast<int64_t>(a.size()), ref, lr.data(), false, pool);
    // a's prompt in two chunks of different sizes, batched with b's prompt.
    const int64_t h = 7;
    SeqBatch first[2] = {{b.data(), static_cast<int64_t>(b.size()), tb.data(), 0, false, lb.data()},
                         {a.data(), h, ta.data(), 0, false, nullptr}};
    runner->forward_batch(first, 2, kv);
    SeqBatch second[1] = {{a.data() + h, static_cast<int64_t>(a.size()) - h, ta.data(), h, false, la.data()}};
    runner->forward_batch(second, 1, kv);
    EXPECT_GE(cosine_similarity(la.data(), lr.data(), static_cast<int64_t>(nv)), 0.99999);
    // A decode step of both.
    const int32_t xa = 11, xb = 12;
    SeqBatch dec[2] = {{&xa, 1, ta.data(), static_cast<int64_t>(a.size()), true, la.data()},
                       {&xb, 1, tb.data(), static_cast<int64_t>(b.size()), true, lb.data()}};
    runner->forward_batch(dec, 2, kv);
    m.forward(&xa, 1, ref, lr.data(), false, pool);
    EXPECT_GE(cosine_similarity(la.data(), lr.data(), static_cast<int64_t>(nv)), 0.99999);
    // Bad ids are refused before anything runs.
    const int32_t oob = static_cast<int32_t>(nv);
    SeqBatch bad2[1] = {{&oob, 1, ta.data(), 0, true, nullptr}};
    EXPECT_THROW(runner->forward_batch(bad2, 1, kv), Error);
}

// A generated token (decode entry) and the same token given in a prompt get
// bit-identical keys, values and logits, whatever else is in the batch and in
// whichever order the entries come.
TEST(Engine, DecodeRowsEqualPromptRows) {
    if (!test::have_default_model()) GTEST_SKIP() << "default model not fetched";
    Model& m = *loaded().model;
    const auto& c = m.config();
    ThreadPool pool(0);
    const auto nv = static_cast<size_t>(c.n_vocab);
    std::vector<int32_t> p = loaded().tok->encode(prompts()[1], true, true);
    const std::vector<int32_t> other = loaded().tok->encode(prompts()[5], true, true);
    const int64_t L = static_cast<int64_t>(p.size());
    PagedKvPool kv(c.n_layer, c.kv_dim(), 64, 16);
    auto blocks = [&](int n) {
        std::vector<int32_t> t;
        for (int i = 0; i < n; ++i) t.push_back(kv.allocate());
        return t;
    };
    // The program's batched pass itself, over a pool whose storage the test reads.
    cpu::ProgramRunner prog(m.program());
    prog.set_options(m.options());
    struct {
        cpu::ProgramRunner& p;
        ThreadPool& pool;
        void forward_batch(const SeqBatch* s, int n, PagedKvPool& kv) { p.forward_batch(s, n, kv.store(), pool); }
    } run{prog, pool}, *runner = &run;
    const std::vector<int32_t> t1 = blocks(4), t2 = blocks(4), t3 = blocks(6), t4 = blocks(6);
    std::vector<float> l1(nv), l2(nv), lo(nv);
    // 1: the prompt alone, then token x as a decode entry placed after a prompt entry of another sequence.
    SeqBatch s1[1] = {{p.data(), L, t1.data(), 0, false, nullptr}};
    runner->forward_batch(s1, 1, kv);
    const int32_t x = 42;
    SeqBatch s2[2] = {{other.data(), static_cast<int64_t>(other.size()), t3.data(), 0, false, lo.data()},
                      {&x, 1, t1.data(), L, true, l1.data()}};
    runner->forward_batch(s2, 2, kv);
    // 2: prompt + x as one prompt, in two chunks, next to another sequence's prompt.
    p.push_back(x);
    SeqBatch s3[2] = {{p.data(), 5, t2.data(), 0, false, nullptr},
                      {other.data(), 9, t4.data(), 0, false, nullptr}};
    runner->forward_batch(s3, 2, kv);
    SeqBatch s4[1] = {{p.data() + 5, L + 1 - 5, t2.data(), 5, false, l2.data()}};
    runner->forward_batch(s4, 1, kv);
    EXPECT_EQ(0, std::memcmp(l1.data(), l2.data(), nv * sizeof(float)));
    const PagedKvStore st = kv.store();
    const auto row = [&](float* base, const std::vector<int32_t>& t, int64_t pos) {
        return base + st.row(t.data(), pos) * c.kv_dim();
    };
    for (int64_t il = 0; il < c.n_layer; il += 7)
        for (int64_t pos : {int64_t(0), L - 1, L}) {
            EXPECT_EQ(0, std::memcmp(row(st.k_layer(il), t1, pos), row(st.k_layer(il), t2, pos),
                                     static_cast<size_t>(c.kv_dim()) * sizeof(float)))
                << "layer " << il << " position " << pos;
            EXPECT_EQ(0, std::memcmp(row(st.v_layer(il), t1, pos), row(st.v_layer(il), t2, pos),
                                     static_cast<size_t>(c.kv_dim()) * sizeof(float)))
                << "layer " << il << " position " << pos;
        }
}

TEST(PagedKv, RefcountsPrefixCacheAndEviction) {
    PagedKvPool kv(2, 8, 4, 16);
    const int32_t a = kv.allocate(), b = kv.allocate();
    EXPECT_EQ(kv.used_blocks(), 2);
    const std::vector<int32_t> toks(16, 7);
    const uint64_t h = PagedKvPool::chain_hash(0, toks.data(), 16);
    EXPECT_NE(h, PagedKvPool::chain_hash(h, toks.data(), 16));
    kv.publish(a, h);
    EXPECT_EQ(kv.lookup(h), a);
    EXPECT_EQ(kv.refcount(a), 2);
    kv.unref(a);
    kv.unref(a);  // no references: stays cached
    EXPECT_EQ(kv.cached_blocks(), 1);
    EXPECT_EQ(kv.lookup(h), a);  // revived
    kv.unref(a);
    kv.unref(b);  // plain free
    // Four allocations: the free blocks first, the cached one evicted last.
    std::vector<int32_t> got;
    for (int i = 0; i < 4; ++i) got.push_back(kv.allocate());
    EXPECT_EQ(got.back(), a);
    EXPECT_EQ(kv.allocate(), -1);
    EXPECT_EQ(kv.lookup(h), -1);
    EXPECT_THROW({ for (int i = 0; i < 2; ++i) kv.unref(b); }, Error);
}

// The same greedy request gives the same tokens alone and among 7 others,
// with prompts longer than the token budget (chunked prefill).
TEST(Engine, RequestsAreIsolated) {
    if (!test::have_default_model()) GTEST_SKIP() << "default model not fetched";
    EngineOptions o;
    o.n_ctx = 256;
    o.n_parallel = 8;
    o.token_budget = 16;  // forces several prompt chunks and mixed steps
    auto eng = make_engine(*loaded().model, *loaded().tok, o);
    const int n = static_cast<int>(prompts().size());
    std::vector<std::vector<int32_t>> alone(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
        Collector c;
        eng->submit(greedy(prompts()[static_cast<size_t>(i)], 12 + i), c.cb());
        c.wait();
        alone[static_cast<size_t>(i)] = c.tokens;
        EXPECT_FALSE(c.tokens.empty());
    }
    // Now all at once: the prefix cache holds every prompt's full blocks, so
    // this also checks that reused blocks give the same results.
    std::vector<std::unique_ptr<Collector>> cs;
    for (int i = 0; i < n; ++i) {
        cs.push_back(std::make_unique<Collector>());
        eng->submit(greedy(prompts()[static_cast<size_t>(i)], 12 + i), cs.back()->cb());
    }
    for (int i = 0; i < n; ++i) {
        cs[static_cast<size_t>(i)]->wait();
        EXPECT_EQ(cs[static_cast<size_t>(i)]->tokens, alone[static_cast<size_t>(i)]) << "prompt " << i;
    }
    EXPECT_GT(eng->stats().prompt_tokens_cached, 0);
    // And on an engine without prefix caching, with a different token budget.
    o.prefix_cache = false;
    o.token_budget = 7;
    auto cold = make_engine(*loaded().model, *loaded().tok, o);
    std::vector<std::unique_ptr<Collector>> ds;
    for (int i = 0; i < n; ++i) {
        ds.push_back(std::make_unique<Collector>());
        cold->submit(greedy(prompts()[static_cast<size_t>(i)], 12 + i), ds.back()->cb());
    }
    for (int i = 0; i < n; ++i) {
        ds[static_cast<size_t>(i)]->wait();
        EXPECT_EQ(ds[static_cast<size_t>(i)]->tokens, alone[static_cast<size_t>(i)]) << "prompt " << i;
    }
}

// A prompt sharing a prefix with an earlier one reuses its blocks.
TEST(Engine, PrefixCacheReusesBlocks) {
    if (!test::have_default_model()) GTEST_SKIP() << "default model not fetched";
    EngineOptions o;
    o.n_ctx = 512;
    o.n_parallel = 2;
    auto eng = make_engine(*loaded().model, *loaded().tok, o);
    std::string shared;
    for (int i = 0; i < 12; ++i) shared += "The quick brown fox jumps over the lazy dog. ";
    GenerationRequest a = greedy(shared + "What does the fox do?", 8);
    GenerationRequest b = greedy(shared + "Which animal is lazy?", 8);
    std::atomic<int64_t> cached_a{-1}, cached_b{-1};
    Collector ca, cb;
    auto wrap = [](Collector& c, std::atomic<int64_t>& cached) {
        TokenCallback inner = c.cb();
        return [inner, &cached](const TokenEvent& e) {
            cached = e.n_cached;
            return inner(e);
        };
    };
    eng->submit(a, wrap(ca, cached_a));
    ca.wait();
    eng->submit(b, wrap(cb, cached_b));
    cb.wait();
    EXPECT_EQ(cached_a.load(), 0);
    // The shared text is ~120 tokens: at least 6 full blocks of 16 reused.
    EXPECT_GE(cached_b.load(), 96);
    EXPECT_EQ(cached_b.load() % 16, 0);
    // Same text as without the cache.
    o.prefix_cache = false;
    auto cold = make_engine(*loaded().model, *loaded().tok, o);
    Collector cc;
    cold->submit(b, cc.cb());
    cc.wait();
    EXPECT_EQ(cc.tokens, cb.tokens);
}

// Blocks of generated text are published: a prompt that repeats an earlier
// prompt and its reply reuses blocks beyond the earlier prompt's, and gives
// the same tokens as without the cache.
TEST(Engine, GeneratedBlocksAreReused) {
    if (!test::have_default_model()) GTEST_SKIP() << "default model not fetched";
    EngineOptions o;
    o.n_ctx = 256;
    o.n_parallel = 2;
    auto eng = make_engine(*loaded().model, *loaded().tok, o);
    GenerationRequest a = greedy(prompts()[5], 40);
    a.ignore_eos = true;
    Collector ca;
    eng->submit(a, ca.cb());
    ca.wait();
    ASSERT_EQ(ca.tokens.size(), 40u);
    GenerationRequest b = a;
    b.prompt.insert(b.prompt.end(), ca.tokens.begin(), ca.tokens.end());
    b.max_tokens = 12;
    std::atomic<int64_t> cached{-1};
    Collector cb;
    TokenCallback inner = cb.cb();
    eng->submit(b, [&](const TokenEvent& e) {
        cached = e.n_cached;
        return inner(e);
    });
    cb.wait();
    // a computed its prompt and 39 generated tokens (the last one was never an input).
    const int64_t computed_a = static_cast<int64_t>(a.prompt.size()) + 39;
    EXPECT_EQ(cached.load(), computed_a / 16 * 16);
    EXPECT_GT(cached.load(), static_cast<int64_t>(a.prompt.size()) / 16 * 16);
    o.prefix_cache = false;
    auto cold = make_engine(*loaded().model, *loaded().tok, o);
    Collector cc;
    cold->submit(b, cc.cb());
    cc.wait();
    EXPECT_EQ(cc.tokens, cb.tokens);
}

// A KV cache of one context for four requests: sequences are preempted and
// recomputed, and every request still completes, with the tokens it gives
// alone (a recomputed generated token is computed exactly as before).
TEST(Engine, PreemptionWhenBlocksRunOut) {
    if (!test::have_default_model()) GTEST_SKIP() << "default model not fetched";
    EngineOptions o;
    o.n_ctx = 96;
    o.n_parallel = 4;
    o.kv_tokens = 96;
    o.token_budget = 32;
    auto eng = make_engine(*loaded().model, *loaded().tok, o);
    std::vector<std::unique_ptr<Collector>> cs;
    for (int i = 0; i < 4; ++i) {
        cs.push_back(std::make_unique<Collector>());
        GenerationRequest r = greedy(prompts()[static_cast<size_t>(i + 1)], 40);
        r.ignore_eos = true;
        eng->submit(r, cs.back()->cb());
    }
    for (auto& c : cs) {
        c->wait();
        EXPECT_EQ(c->finish, FinishReason::Length);
        EXPECT_EQ(c->tokens.size(), 40u);
    }
    EXPECT_GT(eng->stats().preemptions, 0);
    o.kv_tokens = 0;  // room for every context
    o.prefix_cache = false;
    auto roomy = make_engine(*loaded().model, *loaded().tok, o);
    for (int i = 0; i < 4; ++i) {
        Collector c;
        GenerationRequest r = greedy(prompts()[static_cast<size_t>(i + 1)], 40);
        r.ignore_eos = true;
        roomy->submit(r, c.cb());
        c.wait();
        EXPECT_EQ(c.tokens, cs[static_cast<size_t>(i)]->tokens) << "request " << i;
    }
    EXPECT_EQ(roomy->stats().preemptions, 0);
}

TEST(Engine, SeededSamplingRepeats) {
    if (!test::have_default_model()) GTEST_SKIP() << "default model not fetched";
    EngineOptions o;
    o.n_ctx = 128;
    o.n_parallel = 2;
    auto eng = make_engine(*loaded().model, *loaded().tok, o);
    GenerationRequest r = greedy(prompts()[0], 20);
    r.sampling.temperature = 0.9f;
    r.sampling.top_k = 40;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = 1234;
    r.ignore_eos = true;
    Collector a, b, c;
    eng->submit(r, a.cb());
    eng->submit(r, b.cb());
    r.sampling.seed = 99;
    eng->submit(r, c.cb());
    a.wait();
    b.wait();
    c.wait();
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.tokens.size(), 20u);
    EXPECT_EQ(a.finish, FinishReason::Length);
    EXPECT_NE(a.tokens, c.tokens);
}

TEST(Engine, CancelLimitsQueueAndBadRequests) {
    if (!test::have_default_model()) GTEST_SKIP() << "default model not fetched";
    EngineOptions o;
    o.n_ctx = 64;
    o.n_parallel = 1;
    o.max_queue = 1;
    auto eng = make_engine(*loaded().model, *loaded().tok, o);
    // Cancellation by the callback.
    Collector c;
    c.cancel_after = 3;
    GenerationRequest r = greedy(prompts()[1], 40);
    r.ignore_eos = true;
    eng->submit(r, c.cb());
    c.wait();
    EXPECT_EQ(c.finish, FinishReason::Cancelled);
    EXPECT_EQ(c.tokens.size(), 3u);
    // The context fills: Length.
    Collector d;
    GenerationRequest full = greedy(prompts()[1], -1);
    full.ignore_eos = true;
    eng->submit(full, d.cb());
    d.wait();
    EXPECT_EQ(d.finish, FinishReason::Length);
    // The last token is reported when the cache is full: prompt + generated = n_ctx + 1.
    EXPECT_EQ(static_cast<int64_t>(full.prompt.size() + d.tokens.size()), o.n_ctx + 1);
    // Bad requests.
    GenerationRequest empty;
    EXPECT_THROW(eng->submit(empty, nullptr), Error);
    GenerationRequest big = greedy(prompts()[0], 4);
    big.prompt.assign(64, 5);
    EXPECT_THROW(eng->submit(big, nullptr), Error);
    GenerationRequest nan = greedy(prompts()[0], 4);
    nan.sampling.temperature = NAN;
    EXPECT_THROW(eng->submit(nan, nullptr), Error);
    GenerationRequest zero_p = greedy(prompts()[0], 4);
    zero_p.sampling.top_p = 0;  // the sampler needs (0, 1]: refused at submit, never on the engine thread
    EXPECT_THROW(eng->submit(zero_p, nullptr), Error);
    GenerationRequest oob = greedy(prompts()[0], 4);
    oob.prompt[0] = -1;
    EXPECT_THROW(eng->submit(oob, nullptr), Error);
    // Queue: one running + one waiting, the third is refused.
    Collector q1, q2;
    GenerationRequest slow = greedy(prompts()[1], 30);
    slow.ignore_eos = true;
    eng->submit(slow, q1.cb());
    eng->submit(slow, q2.cb());
    bool refused = false;
    try {
        Collector q3;
        eng->submit(slow, q3.cb());
        q3.wait();
    } catch (const QueueFullError&) {
        refused = true;
    }
    q1.wait();
    q2.wait();
    EXPECT_TRUE(refused);
    EXPECT_EQ(q1.tokens, q2.tokens);
    const EngineStats st = eng->stats();
    EXPECT_EQ(st.running, 0);  // current after the last request, not only at the next admission
    EXPECT_EQ(st.kv_tokens_used, 0);
    EXPECT_GE(st.requests_finished, 4);
    EXPECT_GT(st.generated_tokens, 0);
}
