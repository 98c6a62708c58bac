// The engine: a worker thread running continuous batching over a fixed
// number of sequence slots and one paged KV cache (see engine.h), its
// forward passes on a BatchRunner (the CPU, or a GPU).
//
// Each step:
//   1. admits waiting requests into free slots (FIFO), taking the blocks of
//      the longest cached prefix of their prompt, and drops cancelled ones;
//   2. builds one batch: the next token of every generating sequence (decode
//      rows first), then prompt chunks (and recomputation of preempted
//      sequences) in admission order while the token budget lasts (at least
//      one chunk per step, so a long prompt always progresses), allocating
//      blocks as it goes; when none is left, the newest sequence loses its
//      blocks (preemption) and is recomputed once blocks are free again;
//   3. runs the runner's forward_batch, publishes the blocks it completed to the
//      prefix cache, samples every sequence that produced logits and reports
//      the events.
// The CPU's batched pass (cpu::ProgramRunner::forward_batch) is batch-invariant (a row's result depends only on its
// sequence's tokens, and a generated token is computed exactly as the same
// token in a prompt), so a request produces the same tokens alone or in a
// crowd, with or without a prefix-cache hit, preempted or not, for a given
// seed. Blocks of generated text are published too: a later prompt that
// repeats a conversation (prompt + reply) reuses them, and a preempted
// sequence finds its own blocks again if they have not been evicted.
#include "runtime/engine.h"
#include "core/memory.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <future>
#include <list>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "backend/cpu/executor.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "grammar/token_matcher.h"
#include "grammar/warm.h"
#include "runtime/batch_runner.h"
#include "runtime/paged_kv.h"
#include "runtime/spec_heads.h"
#include "runtime/speculative.h"
#include "tokenizer/tokenizer.h"

namespace quern {

namespace {

struct Pending {
    uint64_t id;
    GenerationRequest req;
    TokenCallback cb;
};

struct Slot {
    bool active = false;
    uint64_t id = 0;
    GenerationRequest req;
    TokenCallback cb;
    std::vector<int32_t> tokens;   // prompt + generated tokens
    std::vector<int32_t> blocks;   // block table of the paged cache
    std::vector<uint64_t> hashes;  // chain hash of each full block of tokens known so far
    int64_t computed = 0;          // positions whose keys/values are in the cache
    int64_t n_prompt = 0;
    int64_t n_cached = 0;          // prompt tokens taken from the prefix cache at admission
    int64_t generated = 0;
    uint64_t order = 0;            // admission order (older = higher priority)
    bool cancel = false;
    bool fresh = true;             // no prefix lookup done since the blocks were (re)set
    uint64_t epoch = 0;            // bumped whenever the blocks are dropped
    std::unique_ptr<Sampler> sampler;
    std::unique_ptr<grammar::TokenMatcher> matcher;  // constrained decoding (GenerationRequest::grammar)
    std::vector<float> logits;
    int32_t greedy_tok = -1;  // the runner's argmax, for plain greedy requests
    // Speculative rounds (EngineOptions::spec_draft).
    bool spec = false;
    std::mt19937_64 draft_rng;              // the drafts' own draws
    std::vector<int32_t> drafts, vtoks;     // a round's drafts; the last token and the drafts, verified
    std::vector<float> q_rows, vlogits, hidden;  // the drafts' distributions; the round's logits; hidden rows
};

/// Greedy decoding with nothing that needs the logits on the host (no bias,
/// penalties or log-probabilities): the runner hands over the argmax only
/// (SeqBatch::next), the Sampler's choice (its first maximum).
bool plain_greedy(const GenerationRequest& r) {
    const SamplingParams& p = r.sampling;
    return p.temperature <= 0.0f && r.logit_bias.empty() && r.top_logprobs < 0 && p.repeat_penalty == 1.0f &&
           p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f && !r.grammar;
}

class BatchEngine final : public Engine {
public:
    // The options are checked before the runner is made (a GPU runner loads
    // the model onto the device).
    /// make_draft: the executor of the model's NextN draft program for
    /// speculative rounds, on the runner's backend (empty: the model has none).
    BatchEngine(const RunnerFactory& make_runner, const Tokenizer& tok, const EngineOptions& o,
                const DraftFactory& make_draft)
        : tok_(tok), opts_(checked(o)), pool_(o.n_threads), runner_(make_runner(pool_)), cfg_(runner_->config()) {
        if (o.spec_draft > 0 && !make_draft)
            fail("speculative decoding: this model has no multi-token-prediction head (a Qwen3.5 checkpoint with its "
                 "mtp.* tensors, or a GGUF converted without --no-mtp); drop --spec");
        slots_.resize(static_cast<size_t>(o.n_parallel));
        // Linear-attention layers (before the KV pool, which may take the
        // memory that is left): one recurrent-state slot per engine slot
        // (SeqBatch::state_slot is the slot's index), and as many more for
        // snapshots of a cached prefix's state (see snapshot()).
        // Speculative rounds of a recurrent model keep a copy of each slot's
        // state from before the verification (after the snapshots).
        if (cfg_.has_recurrent_state()) {
            n_snaps_ = !opts_.prefix_cache ? 0 : o.state_snapshots < 0 ? o.n_parallel : o.state_snapshots;
            runner_->make_state_slots(o.n_parallel + n_snaps_ + (o.spec_draft > 0 ? o.n_parallel : 0));
            for (int64_t i = n_snaps_; i-- > 0;) free_snaps_.push_back(static_cast<int32_t>(o.n_parallel + i));
        }
        const int64_t bs = 16;
        const int64_t kv_tokens = o.kv_tokens > 0 ? o.kv_tokens : o.n_ctx * o.n_parallel;
        const char* flag = o.kv_tokens > 0 ? "--kv-tokens" : "-c or --parallel";
        kv_ = runner_->make_kv_pool((kv_tokens + bs - 1) / bs, bs, flag);
        if (kv_->n_blocks() * bs < o.n_ctx)  // a memory budget (--gpu-mem) made fewer blocks
            fail("the KV cache that fits ({} tokens) holds less than one full context ({}); lower -c or raise --gpu-mem",
                 kv_->n_blocks() * bs, o.n_ctx);
        stats_.kv_tokens_total = kv_->n_blocks() * bs;
        if (o.spec_draft > 0)
            heads_ = std::make_unique<SpecHeads>(make_draft(pool_), cfg_.n_embd, cfg_.n_vocab, kv_->n_blocks(), bs,
                                                 o.n_parallel);
        if (o.warm_grammar)  // waited for by the first constrained request, or by the destructor
            warm_ = std::async(std::launch::async, [this] {
                auto p = grammar::TokenPieces::of(tok_);
                try {
                    grammar::warm_json_masks(tok_, p);
                } catch (const std::exception&) {  // a tokenizer that cannot encode the samples: cold caches
                }
                return p;
            });
        worker_ = std::thread([this] { loop(); });
    }
    ~BatchEngine() override { shutdown(); }

    static const EngineOptions& checked(const EngineOptions& o) {
        if (o.n_parallel < 1 || o.n_parallel > 1024) fail("--parallel must be between 1 and 1024 (got {})", o.n_parallel);
        if (o.n_ctx < 2) fail("the context size must be at least 2 (got {})", o.n_ctx);
        if (o.max_queue < 0) fail("--max-queue must not be negative");
        if (o.token_budget < 1) fail("the token budget must be positive");
        if (o.spec_draft < 0 || o.spec_draft > 16) fail("--spec-draft must be between 1 and 16 (got {})", o.spec_draft);
        if (o.state_snapshots < -1 || o.state_snapshots > 65536)
            fail("--state-snapshots must be between 0 and 65536 (got {})", o.state_snapshots);
        const int64_t kv_tokens = o.kv_tokens > 0 ? o.kv_tokens : o.n_ctx * o.n_parallel;
        if (kv_tokens < o.n_ctx) fail("the KV cache ({} tokens) must hold at least one full context ({})", kv_tokens, o.n_ctx);
        return o;
    }

    uint64_t submit(GenerationRequest req, TokenCallback cb) override {
        validate(req);
        std::lock_guard<std::mutex> lk(mu_);
        if (stopping_) throw QueueFullError("the server is shutting down");
        if (static_cast<int>(waiting_.size()) >= opts_.max_queue + free_slots_locked())
            throw QueueFullError(fmt::format("the queue is full ({} requests waiting); retry later", waiting_.size()));
        const uint64_t id = ++next_id_;
        waiting_.push_back(Pending{id, std::move(req), std::move(cb)});
        cv_.notify_all();
        return id;
    }

    void cancel(uint64_t id) override {
        std::lock_guard<std::mutex> lk(mu_);
        cancelled_.push_back(id);
        cv_.notify_all();
    }

    EngineStats stats() const override {
        std::lock_guard<std::mutex> lk(mu_);
        EngineStats s = stats_;
        s.waiting = static_cast<int>(waiting_.size());
        return s;
    }

    const EngineOptions& options() const override { return opts_; }

    void shutdown() override {
        {
            std::lock_guard<std::mutex> lk(mu_);
            if (stopping_ && !worker_.joinable()) return;
            stopping_ = true;
            cv_.notify_all();
        }
        if (worker_.joinable()) worker_.join();
    }

private:
    void validate(const GenerationRequest& r) const {
        const auto& c = cfg_;
        if (r.prompt.empty()) fail("the prompt is empty");
        if (static_cast<int64_t>(r.prompt.size()) + 1 > opts_.n_ctx)
            fail("the prompt has {} tokens; this server's context holds {} (prompt + at least one generated token)",
                 r.prompt.size(), opts_.n_ctx);
        for (int32_t t : r.prompt)
            if (t < 0 || t >= c.n_vocab) fail("token id {} is outside the vocabulary [0, {})", t, c.n_vocab);
        for (const auto& [t, b] : r.logit_bias) {
            if (t < 0 || t >= c.n_vocab) fail("logit_bias token id {} is outside the vocabulary [0, {})", t, c.n_vocab);
            if (!std::isfinite(b)) fail("logit_bias values must be finite numbers");
        }
        const SamplingParams& p = r.sampling;
        Sampler(p, c.n_vocab);  // its own checks (temperature, top_p, min_p, penalty), here rather than on the worker
        if (!std::isfinite(p.presence_penalty) || !std::isfinite(p.frequency_penalty))
            fail("presence_penalty and frequency_penalty must be finite numbers");
        if (r.top_logprobs > 20) fail("top_logprobs must be at most 20");
        if (r.max_tokens == 0 || r.max_tokens < -1) fail("max_tokens must be a positive integer");
    }

    int free_slots_locked() const {
        int n = 0;
        for (const Slot& s : slots_) n += !s.active;
        return n;
    }

    /// Ends a slot's request with a final event (no token). The slot is
    /// freed before the callback runs, so a client reacting to the end can
    /// submit again at once.
    void finish(Slot& s, FinishReason why, const std::string& err = {}) {
        TokenEvent e;
        e.last = true;
        e.finish = why;
        e.error = err;
        e.n_prompt = static_cast<int64_t>(s.req.prompt.size());
        e.n_generated = s.generated;
        e.n_cached = std::max<int64_t>(s.n_cached, 0);
        TokenCallback cb = std::move(s.cb);
        release(s);
        if (cb) cb(e);
    }

    void drop_blocks(Slot& s) {
        for (int32_t b : s.blocks) kv_->unref(b);
        s.blocks.clear();
        s.computed = 0;
        s.fresh = true;
        ++s.epoch;
    }

    void release(Slot& s) {
        drop_blocks(s);
        s.active = false;
        s.cb = nullptr;
        s.sampler.reset();
        s.matcher.reset();
        s.req = GenerationRequest{};
        int running = 0;
        for (const Slot& o : slots_) running += o.active;
        std::lock_guard<std::mutex> lk(mu_);
        ++stats_.requests_finished;
        stats_.running = running;  // kept current for /metrics while the worker sleeps
        stats_.kv_tokens_used = kv_->used_blocks() * kv_->block_size();
    }

    /// The warm-up's token texts (EngineOptions::warm_grammar), taken outside
    /// mu_ once it is done or a constrained request waits for it, so that
    /// submit() and /metrics never wait on the warm-up behind the lock.
    void take_warm_pieces() {
        if (pieces_ || !warm_.valid()) return;
        bool wanted = false;
        {
            std::lock_guard<std::mutex> lk(mu_);
            for (const Pending& p : waiting_) wanted = wanted || p.req.grammar != nullptr;
        }
        if (wanted || warm_.wait_for(std::chrono::seconds(0)) == std::future_status::ready) pieces_ = warm_.get();
    }

    void admit() {
        take_warm_pieces();
        std::unique_lock<std::mutex> lk(mu_);
        for (uint64_t id : cancelled_) {
            for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
                if (it->id == id) {
                    Pending p = std::move(*it);
                    waiting_.erase(it);
                    lk.unlock();
                    TokenEvent e;
                    e.last = true;
                    e.finish = FinishReason::Cancelled;
                    e.n_prompt = static_cast<int64_t>(p.req.prompt.size());
                    if (p.cb) p.cb(e);
                    lk.lock();
                    break;
                }
            for (Slot& s : slots_)
                if (s.active && s.id == id) s.cancel = true;
        }
        cancelled_.clear();
        for (Slot& s : slots_) {
            if (s.active || waiting_.empty()) continue;
            Pending p = std::move(waiting_.front());
            waiting_.pop_front();
            s.active = true;
            s.cancel = false;
            s.id = p.id;
            s.req = std::move(p.req);
            s.cb = std::move(p.cb);
            s.tokens = s.req.prompt;
            s.n_prompt = static_cast<int64_t>(s.tokens.size());
            s.blocks.clear();
            s.computed = 0;
            s.n_cached = -1;  // set by the first prefix lookup
            s.fresh = true;
            s.generated = 0;
            s.order = ++admitted_;
            s.sampler = std::make_unique<Sampler>(s.req.sampling, cfg_.n_vocab);  // checked at submit
            s.spec = heads_ && s.req.logit_bias.empty() && s.req.top_logprobs < 0 && !s.req.grammar;
            s.matcher.reset();
            if (s.req.grammar) {
                if (!pieces_) pieces_ = warm_.valid() ? warm_.get() : grammar::TokenPieces::of(tok_);  // once per engine
                s.matcher = std::make_unique<grammar::TokenMatcher>(s.req.grammar, pieces_);
            }
            s.draft_rng.seed(s.req.sampling.seed ^ 0x9E3779B97F4A7C15ull);
            for (int32_t t : s.req.prompt) s.sampler->accept(t);
            s.hashes.clear();
            uint64_t h = 0;
            const int64_t bs = kv_->block_size();
            for (int64_t b = 0; (b + 1) * bs <= s.n_prompt; ++b) {
                h = PagedKvPool::chain_hash(h, s.tokens.data() + b * bs, bs);
                s.hashes.push_back(h);
            }
            stats_.prompt_tokens += static_cast<int64_t>(s.req.prompt.size());
        }
        int running = 0;
        for (const Slot& s : slots_) running += s.active;
        stats_.running = running;
        stats_.kv_tokens_used = kv_->used_blocks() * kv_->block_size();
        stats_.kv_tokens_total = kv_->n_blocks() * kv_->block_size();
    }

    void loop() {
        for (;;) {
            {
                std::unique_lock<std::mutex> lk(mu_);
                cv_.wait(lk, [&] {
                    if (stopping_) return true;
                    if (!waiting_.empty() || !cancelled_.empty()) return true;
                    for (const Slot& s : slots_)
                        if (s.active) return true;
                    return false;
                });
                if (stopping_) break;
            }
            admit();
            for (Slot& s : slots_)
                if (s.active && s.cancel) finish(s, FinishReason::Cancelled);
            try {
                step();
            } catch (const std::exception& e) {
                // A failing step fails its requests, not the server.
                for (Slot& s : slots_)
                    if (s.active) finish(s, FinishReason::Error, e.what());
            }
        }
        // Shutdown: everything still in flight is cancelled.
        for (Slot& s : slots_)
            if (s.active) finish(s, FinishReason::Cancelled);
        std::deque<Pending> rest;
        {
            std::lock_guard<std::mutex> lk(mu_);
            rest.swap(waiting_);
        }
        for (Pending& p : rest) {
            TokenEvent e;
            e.last = true;
            e.finish = FinishReason::Cancelled;
            if (p.cb) p.cb(e);
        }
    }

    /// Takes the blocks of the longest cached prefix of the sequence's tokens
    /// (keeping at least the last token to compute: it gives the logits of a
    /// new prompt, and it is the next decode input of a preempted sequence).
    void prefix_lookup(Slot& s) {
        s.fresh = false;
        int64_t hit = 0;
        if (opts_.prefix_cache && cfg_.has_recurrent_state()) {
            hit = recurrent_lookup(s);
        } else if (opts_.prefix_cache) {
            const int64_t bs = kv_->block_size();
            const int64_t L = static_cast<int64_t>(s.tokens.size());
            for (size_t b = 0; b < s.hashes.size(); ++b) {
                if (static_cast<int64_t>(b + 1) * bs > L - 1) break;
                const int32_t blk = kv_->lookup(s.hashes[b]);
                if (blk < 0) break;
                s.blocks.push_back(blk);
                hit += bs;
            }
        }
        s.computed = hit;
        if (heads_) heads_->reset(state_slot(s), hit);
        if (s.n_cached < 0) {
            s.n_cached = hit;
            std::lock_guard<std::mutex> lk(mu_);
            stats_.prompt_tokens_cached += hit;
        }
    }

    /// A recurrent model resumes from a cached prefix only where the state
    /// after it was kept (a snapshot at that block boundary): the longest
    /// such prefix (keeping the last token to compute), its blocks taken and
    /// its state copied into the slot's. Returns the positions taken.
    int64_t recurrent_lookup(Slot& s) {
        const int64_t bs = kv_->block_size(), L = static_cast<int64_t>(s.tokens.size());
        int64_t best = 0;
        for (size_t b = 0; b < s.hashes.size(); ++b) {
            if (static_cast<int64_t>(b + 1) * bs > L - 1 || !kv_->cached(s.hashes[b])) break;
            if (snap_of_.count(s.hashes[b])) best = static_cast<int64_t>(b) + 1;
        }
        if (best == 0) return 0;
        for (int64_t b = 0; b < best; ++b) s.blocks.push_back(kv_->lookup(s.hashes[static_cast<size_t>(b)]));
        const uint64_t h = s.hashes[static_cast<size_t>(best - 1)];
        runner_->copy_state_slot(snap_of_.at(h), state_slot(s));
        snap_lru_.splice(snap_lru_.end(), snap_lru_, snap_pos_.at(h));
        return best * bs;
    }

    int32_t state_slot(const Slot& s) const { return static_cast<int32_t>(&s - slots_.data()); }

    /// Keeps a copy of s's recurrent state, which now describes exactly the
    /// full blocks of its tokens, under the last block's prefix hash
    /// (evicting the least recently used copy when all are taken).
    void snapshot(const Slot& s) {
        const int64_t bs = kv_->block_size();
        if (n_snaps_ == 0 || s.computed == 0 || s.computed % bs != 0) return;
        const uint64_t h = s.hashes[static_cast<size_t>(s.computed / bs - 1)];
        if (snap_of_.count(h)) return;
        if (free_snaps_.empty()) {
            const uint64_t old = snap_lru_.front();
            snap_lru_.pop_front();
            free_snaps_.push_back(snap_of_.at(old));
            snap_of_.erase(old);
            snap_pos_.erase(old);
        }
        const int32_t slot = free_snaps_.back();
        free_snaps_.pop_back();
        runner_->copy_state_slot(state_slot(s), slot);
        snap_of_[h] = slot;
        snap_pos_[h] = snap_lru_.insert(snap_lru_.end(), h);
    }

    /// Gives s blocks for positions [0, upto); frees newer sequences' blocks
    /// when the pool is empty. False when that is not enough.
    bool reserve(Slot& s, int64_t upto) {
        const int64_t bs = kv_->block_size();
        while (static_cast<int64_t>(s.blocks.size()) * bs < upto) {
            int32_t b = kv_->allocate();
            if (b < 0) {
                Slot* victim = nullptr;  // the newest other sequence holding blocks
                for (Slot& o : slots_)
                    if (o.active && &o != &s && !o.blocks.empty() && o.order > s.order &&
                        (!victim || o.order > victim->order))
                        victim = &o;
                if (!victim) return false;
                drop_blocks(*victim);
                std::lock_guard<std::mutex> lk(mu_);
                ++stats_.preemptions;
                continue;
            }
            s.blocks.push_back(b);
        }
        return true;
    }

    /// One sequence's rows of a step.
    struct Entry {
        Slot* slot;
        int64_t n;
        bool decode;
        bool logits;
        uint64_t epoch;   // the slot's epoch when chosen (a preemption since voids the entry)
        int64_t k = -1;   // a speculative round's drafts (>= 0: a round, verified with every row's logits)
    };

    void step() {
        std::vector<Slot*> act;
        for (Slot& s : slots_)
            if (s.active) act.push_back(&s);
        if (act.empty()) return;
        std::sort(act.begin(), act.end(), [](const Slot* a, const Slot* b) { return a->order < b->order; });
        const auto nv = static_cast<size_t>(cfg_.n_vocab);
        std::vector<Entry> dec, pre;
        // Decode rows: sequences whose only missing position is their last token.
        for (Slot* s : act) {
            if (s->fresh) continue;
            const int64_t L = static_cast<int64_t>(s->tokens.size());
            if (s->generated > 0 && s->computed == L - 1 && reserve(*s, L)) dec.push_back({s, 1, true, true, s->epoch});
        }
        int64_t budget = opts_.token_budget - static_cast<int64_t>(dec.size());
        bool any_chunk = false;
        for (Slot* s : act) {
            if (s->fresh) prefix_lookup(*s);
            const int64_t L = static_cast<int64_t>(s->tokens.size());
            if (s->generated > 0 && s->computed == L - 1) continue;  // decoding (or waiting for a block)
            if (s->blocks.empty() && s->computed > 0) continue;      // preempted this step
            // Prompt rows up to the prompt's end (with logits there on the
            // first pass), or recomputation of generated tokens but the last.
            const int64_t end = s->computed < s->n_prompt ? s->n_prompt : L - 1;
            int64_t n = end - s->computed;
            if (n <= 0) continue;
            if (any_chunk) n = std::min(n, budget);
            // A recurrent model's chunk that crosses a block boundary stops at
            // the last one it reaches, where its state is kept (snapshot());
            // the rest of the block follows in the next step.
            if (n_snaps_ > 0) {
                const int64_t bs = kv_->block_size(), cut = (s->computed + n) / bs * bs - s->computed;
                if (cut > 0 && cut < n) n = cut;
            }
            if (n <= 0) continue;
            if (!reserve(*s, s->computed + n)) {
                // Use what blocks it has; if none beyond computed, wait.
                const int64_t cap = static_cast<int64_t>(s->blocks.size()) * kv_->block_size() - s->computed;
                n = std::min(n, cap);
                if (n <= 0) continue;
            }
            any_chunk = true;
            budget -= n;
            const bool lg = s->computed + n == s->n_prompt && s->generated == 0;
            pre.push_back({s, n, false, lg, s->epoch});
        }
        if (heads_) draft_phase(dec);
        // A preemption during this loop may have taken blocks from an entry
        // already chosen: drop such entries.
        std::vector<SeqBatch> batch;
        std::vector<Entry> used;
        for (const auto* list : {&dec, &pre})
            for (const Entry& e : *list) {
                Slot& s = *e.slot;
                if (s.epoch != e.epoch) continue;
                if (e.k >= 0) {
                    batch.push_back(round_batch(s, e.k));
                    used.push_back(e);
                    continue;
                }
                const bool greedy = e.logits && plain_greedy(s.req);
                if (e.logits && !greedy) s.logits.resize(nv);
                batch.push_back(SeqBatch{s.tokens.data() + s.computed, e.n, s.blocks.data(), s.computed, e.decode,
                                         e.logits && !greedy ? s.logits.data() : nullptr,
                                         greedy ? &s.greedy_tok : nullptr, nullptr,
                                         state_slot(s)});
                if (s.spec) {  // the draft head reads the rows the model computes
                    s.hidden.resize(static_cast<size_t>(e.n * cfg_.n_embd));
                    batch.back().hidden = s.hidden.data();
                }
                used.push_back(e);
            }
        if (batch.empty()) return;
        runner_->forward_batch(batch.data(), static_cast<int>(batch.size()), *kv_);
        const int64_t bs = kv_->block_size();
        for (const Entry& e : used) {
            Slot& s = *e.slot;
            if (e.k >= 0) continue;  // speculative rounds: finish_rounds()
            if (s.spec) heads_->observe(state_slot(s), s.hidden.data(), e.n);
            s.computed += e.n;
            publish(s);
            snapshot(s);
        }
        {
            std::lock_guard<std::mutex> lk(mu_);
            ++stats_.steps;
            stats_.kv_tokens_used = kv_->used_blocks() * bs;
        }
        // Draw every sequence's token in parallel (each slot has its own
        // sampler and random stream), then report them in order.
        std::vector<Slot*> draw_slots;
        for (const Entry& e : used)
            if (e.logits && e.k < 0) draw_slots.push_back(e.slot);
        std::vector<TokenEvent> events(draw_slots.size());
        std::vector<std::exception_ptr> errors(draw_slots.size());
        pool_.parallel_for(static_cast<int64_t>(draw_slots.size()), 1, [&](int64_t b, int64_t e, int) {
            for (int64_t i = b; i < e; ++i) {
                try {
                    events[static_cast<size_t>(i)] = draw(*draw_slots[static_cast<size_t>(i)]);
                } catch (...) {
                    errors[static_cast<size_t>(i)] = std::current_exception();
                }
            }
        });
        for (const auto& err : errors)
            if (err) std::rethrow_exception(err);
        for (size_t i = 0; i < draw_slots.size(); ++i) report(*draw_slots[i], events[i]);
        if (heads_) finish_rounds(used);
    }

    /// Publishes the blocks of s that are full of computed tokens (prompt or
    /// generated text) under their prefix hashes.
    void publish(Slot& s) {
        const int64_t bs = kv_->block_size();
        while (static_cast<int64_t>(s.hashes.size() + 1) * bs <= s.computed) {
            const uint64_t parent = s.hashes.empty() ? 0 : s.hashes.back();
            s.hashes.push_back(PagedKvPool::chain_hash(parent, s.tokens.data() + s.hashes.size() * bs, bs));
        }
        for (int64_t b = 0; b < static_cast<int64_t>(s.hashes.size()) && (b + 1) * bs <= s.computed; ++b)
            kv_->publish(s.blocks[static_cast<size_t>(b)], s.hashes[static_cast<size_t>(b)]);
    }

    /// The recurrent-state slot where a speculative round keeps s's state
    /// from before its verification.
    int32_t backup_slot(const Slot& s) const {
        return static_cast<int32_t>(opts_.n_parallel + n_snaps_) + state_slot(s);
    }

    /// Speculative rounds' drafts: each decoding sequence that takes them
    /// gets up to spec_draft more positions reserved and its head's drafts
    /// (e.k: how many it got; 0 still makes a round of the last token alone,
    /// whose hidden row the head reads next); every head reads the rows it can.
    void draft_phase(std::vector<Entry>& dec) {
        for (Entry& e : dec) {
            Slot& s = *e.slot;
            if (!s.spec || s.epoch != e.epoch) continue;
            const int64_t L = static_cast<int64_t>(s.tokens.size());
            int64_t k = std::min<int64_t>(opts_.spec_draft, opts_.n_ctx - L);
            if (k > 0 && !reserve(s, L + k)) k = 0;
            e.k = std::max<int64_t>(k, 0);
        }
        std::vector<SpecHeads::Ask> asks;
        for (Slot& s : slots_) {
            if (!s.active || !s.spec || s.fresh || s.blocks.empty()) continue;
            SpecHeads::Ask a;
            a.slot = state_slot(s);
            a.tokens = &s.tokens;
            a.blocks = s.blocks.data();
            for (const Entry& e : dec)
                if (e.slot == &s && e.epoch == s.epoch && e.k > 0) a.k = e.k;
            a.sampler = s.sampler.get();
            a.rng = &s.draft_rng;
            a.drafts = &s.drafts;
            a.q_rows = &s.q_rows;
            asks.push_back(a);
        }
        heads_->draft(asks);
        for (const SpecHeads::Ask& a : asks)
            for (Entry& e : dec)
                if (e.slot == &slots_[static_cast<size_t>(a.slot)] && e.k > 0) e.k = a.k;  // the head may draft none
    }

    /// A round's rows: the sequence's last token and its k drafts, every
    /// row's logits and hidden rows (a recurrent model's state kept first).
    SeqBatch round_batch(Slot& s, int64_t k) {
        s.vtoks.assign(1, s.tokens.back());
        s.vtoks.insert(s.vtoks.end(), s.drafts.begin(), s.drafts.begin() + k);
        s.vlogits.resize(static_cast<size_t>((k + 1) * cfg_.n_vocab));
        s.hidden.resize(static_cast<size_t>((k + 1) * cfg_.n_embd));
        if (cfg_.has_recurrent_state()) runner_->copy_state_slot(state_slot(s), backup_slot(s));
        SeqBatch q;
        q.tokens = s.vtoks.data();
        q.n = k + 1;
        q.block_table = s.blocks.data();
        q.n_past = s.computed;
        q.decode = true;
        q.logits = s.vlogits.data();
        q.all_logits = true;
        q.hidden = s.hidden.data();
        q.state_slot = state_slot(s);
        return q;
    }

    /// Judges the step's speculative rounds (rejection sampling: the kept
    /// drafts and one token of the model's own), rolls a recurrent model's
    /// state back past rejected drafts (its kept rows computed again, in one
    /// pass for all such sequences), and reports the tokens in order.
    void finish_rounds(const std::vector<Entry>& used) {
        struct Verdict {
            Slot* s;
            uint64_t epoch;
            int64_t kept;
            int32_t own;
        };
        std::vector<Verdict> vs;
        std::vector<SeqBatch> replay;
        for (const Entry& e : used) {
            Slot& s = *e.slot;
            if (e.k < 0 || !s.active || s.epoch != e.epoch) continue;
            int32_t own = -1;
            const int64_t j = judge_drafts(*s.sampler, s.vtoks.data() + 1, e.k, s.vlogits.data(), s.q_rows.data(), own);
            vs.push_back({&s, s.epoch, j, own});
            if (cfg_.has_recurrent_state() && j < e.k) {
                runner_->copy_state_slot(backup_slot(s), state_slot(s));
                replay.push_back(SeqBatch{s.vtoks.data(), j + 1, s.blocks.data(), s.computed, true, nullptr, nullptr,
                                          nullptr, state_slot(s)});
            }
            std::lock_guard<std::mutex> lk(mu_);
            stats_.spec_drafted += e.k;
            stats_.spec_accepted += j;
        }
        if (!replay.empty()) runner_->forward_batch(replay.data(), static_cast<int>(replay.size()), *kv_);
        for (const Verdict& v : vs) {
            Slot& s = *v.s;
            s.computed += 1 + v.kept;  // the last token and the kept drafts are in the cache
            heads_->observe(state_slot(s), s.hidden.data(), 1 + v.kept);
            std::vector<int32_t> toks(s.vtoks.begin() + 1, s.vtoks.begin() + 1 + v.kept);
            toks.push_back(v.own);
            for (int32_t t : toks) {
                if (!s.active || s.epoch != v.epoch) break;
                TokenEvent ev;
                ev.token = t;
                ev.n_prompt = static_cast<int64_t>(s.req.prompt.size());
                report(s, ev);
            }
            if (s.active && s.epoch == v.epoch) {
                publish(s);
                snapshot(s);
            }
        }
    }

    /// Samples a slot's next token from its logits (logit bias, sampler chain,
    /// log-probabilities); touches only the slot's logits and sampler.
    TokenEvent draw(Slot& s) {
        if (plain_greedy(s.req)) {
            TokenEvent e;
            e.token = s.greedy_tok;
            e.n_prompt = static_cast<int64_t>(s.req.prompt.size());
            return e;
        }
        float* lg = s.logits.data();
        const int64_t nv = cfg_.n_vocab;
        for (const auto& [t, b] : s.req.logit_bias) lg[t] += b;
        if (s.matcher) s.matcher->mask(lg);
        const int32_t tok = s.sampler->sample(lg);
        if (s.matcher) s.matcher->accept(tok);
        TokenEvent e;
        e.token = tok;
        e.n_prompt = static_cast<int64_t>(s.req.prompt.size());
        if (s.req.top_logprobs >= 0) {
            double mx = -INFINITY;
            for (int64_t i = 0; i < nv; ++i) mx = std::max(mx, static_cast<double>(lg[i]));
            double z = 0;
            for (int64_t i = 0; i < nv; ++i) z += std::exp(static_cast<double>(lg[i]) - mx);
            const double lz = mx + std::log(z);
            e.logprob = static_cast<float>(lg[tok] - lz);
            if (s.req.top_logprobs > 0) {
                std::vector<int32_t> idx(static_cast<size_t>(nv));
                for (int64_t i = 0; i < nv; ++i) idx[static_cast<size_t>(i)] = static_cast<int32_t>(i);
                const int k = std::min<int>(s.req.top_logprobs, static_cast<int>(nv));
                std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                                  [&](int32_t a, int32_t b) { return lg[a] > lg[b] || (lg[a] == lg[b] && a < b); });
                for (int j = 0; j < k; ++j)
                    e.top_logprobs.emplace_back(idx[static_cast<size_t>(j)],
                                                static_cast<float>(lg[idx[static_cast<size_t>(j)]] - lz));
            }
        }
        return e;
    }

    /// Delivers a drawn token: ends the request at an end-of-generation token
    /// or the length limit, else appends it and calls the callback.
    void report(Slot& s, TokenEvent e) {
        const int32_t tok = e.token;
        e.token = -1;
        if (!s.req.ignore_eos && tok_.is_eog(tok)) {
            finish(s, FinishReason::Stop);
            return;
        }
        s.sampler->accept(tok);
        s.tokens.push_back(tok);
        ++s.generated;
        {
            std::lock_guard<std::mutex> lk(mu_);
            ++stats_.generated_tokens;
        }
        e.token = tok;
        e.n_generated = s.generated;
        e.n_cached = std::max<int64_t>(s.n_cached, 0);
        const bool length = (s.req.max_tokens > 0 && s.generated >= s.req.max_tokens) ||
                            static_cast<int64_t>(s.tokens.size()) > opts_.n_ctx;
        if (length) {
            e.last = true;
            e.finish = FinishReason::Length;
        }
        if (length) {
            TokenCallback cb = std::move(s.cb);
            release(s);
            if (cb) cb(e);
            return;
        }
        const bool keep = s.cb ? s.cb(e) : true;
        if (!keep || s.cancel) {
            finish(s, FinishReason::Cancelled);
            return;
        }
    }

    const Tokenizer& tok_;
    EngineOptions opts_;
    ThreadPool pool_;  // sampling (and the CPU runner's matmuls)
    std::unique_ptr<BatchRunner> runner_;
    const ModelConfig& cfg_;
    std::unique_ptr<PagedKvPool> kv_;
    std::vector<Slot> slots_;
    // Recurrent models: state slots n_parallel .. n_parallel + n_snaps_ - 1
    // hold snapshots of a prefix's state by its last block's hash, least
    // recently used first out.
    int64_t n_snaps_ = 0;
    std::vector<int32_t> free_snaps_;
    std::unordered_map<uint64_t, int32_t> snap_of_;
    std::list<uint64_t> snap_lru_;
    std::unordered_map<uint64_t, std::list<uint64_t>::iterator> snap_pos_;
    std::unique_ptr<SpecHeads> heads_;  // speculative rounds' draft heads (null: off)
    std::shared_ptr<const grammar::TokenPieces> pieces_;  // the vocabulary's texts, for constrained requests
    std::future<std::shared_ptr<const grammar::TokenPieces>> warm_;  // EngineOptions::warm_grammar's, until taken

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Pending> waiting_;
    std::vector<uint64_t> cancelled_;
    bool stopping_ = false;
    uint64_t next_id_ = 0;
    uint64_t admitted_ = 0;
    EngineStats stats_;
    std::thread worker_;
};

}  // namespace

std::unique_ptr<Engine> make_engine(Model& model, const Tokenizer& tokenizer, const EngineOptions& opts) {
    DraftFactory draft;
    if (const Program* p = model.draft_program())
        draft = [p, &model](ThreadPool& pool) { return cpu::make_executor(*p, model.options(), pool); };
    return std::make_unique<BatchEngine>([&model](ThreadPool& pool) { return make_cpu_batch_runner(model, pool); },
                                         tokenizer, opts, draft);
}

std::unique_ptr<Engine> make_engine(const RunnerFactory& make_runner, const Tokenizer& tokenizer,
                                    const EngineOptions& opts, const DraftFactory& make_draft) {
    return std::make_unique<BatchEngine>(make_runner, tokenizer, opts, make_draft);
}

}  // namespace quern
