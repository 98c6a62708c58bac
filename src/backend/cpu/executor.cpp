#include "backend/cpu/executor.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "backend/cpu/program_runner.h"
#include "core/error.h"
#include "core/kv_cache.h"
#include "core/memory.h"

namespace quern::cpu {

namespace {

/// Whether a table names blocks 0, 1, 2, ... for its first n_blocks entries.
bool starts_at_zero(const int32_t* table, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; ++b)
        if (table[b] != b) return false;
    return true;
}

class CpuExecutor final : public Executor {
public:
    CpuExecutor(const Program& p, const ModelOptions& o, ThreadPool& pool, bool profile)
        : p_(p), pool_(pool), runner_(p) {
        runner_.set_options(o);
        if (profile) {
            profile_ = std::make_unique<OpProfile>();
            runner_.set_profile(profile_.get());
        }
    }
    ~CpuExecutor() override {
        if (profile_) profile_->print();
    }
    std::string device_name() const override { return "CPU"; }

    int64_t make_kv_storage(int64_t n_blocks, int64_t block_size, const char* flag) override {
        if (n_blocks < 1 || block_size < 1) fail("KV cache: bad sizes ({} blocks of {})", n_blocks, block_size);
        check_kv_cache_fits(n_blocks * block_size, p_.n_kv_layers, p_.kv_dim, sizeof(float), flag);
        const auto floats = static_cast<size_t>(p_.n_kv_layers * n_blocks * block_size * p_.kv_dim);
        k_.assign(floats, 0.0f);
        v_.assign(floats, 0.0f);
        state_.assign(static_cast<size_t>(p_.state_floats()), 0.0f);  // the lone sequence's (Program::state_floats)
        store_ = PagedKvStore{k_.data(), v_.data(), n_blocks * block_size * p_.kv_dim, block_size, p_.kv_dim,
                              p_.n_kv_layers};
        link_state_slots();
        n_blocks_ = n_blocks;
        return n_blocks;
    }

    void make_state_slots(int64_t n) override {
        slots_.assign(static_cast<size_t>(n * p_.state_floats()), 0.0f);
        n_slots_ = n;
        link_state_slots();
    }

    void copy_state_slot(int32_t from, int32_t to) override {
        const int64_t f = p_.state_floats();
        if (from < 0 || to < 0 || from >= n_slots_ || to >= n_slots_)
            fail("recurrent-state slot {} -> {} outside the {} slots", from, to, n_slots_);
        if (from != to) std::copy_n(slots_.data() + from * f, f, slots_.data() + to * f);
    }

    void save_lone_state() override { saved_state_ = state_; }
    void restore_lone_state() override {
        if (saved_state_.size() != state_.size()) fail("no saved recurrent state to restore");
        state_ = saved_state_;
    }

    void forward(const ForwardBatch& fb) override {
        if (!store_.k) fail("forward: no KV storage (make_kv_storage first)");
        const int64_t bs = store_.block_size;
        for (int i = 0; i < fb.n_seqs; ++i) {
            const SeqBatch& q = fb.seqs[i];
            if (q.sampling) fail("forward: the CPU runs no sampling chain (sample the logits on the host)");
            if (!q.block_table || q.n_past < 0 || q.n < 0) fail("forward: entry {} is empty", i);
            for (int64_t b = 0; b < (q.n_past + q.n + bs - 1) / bs; ++b)
                if (q.block_table[b] < 0 || q.block_table[b] >= n_blocks_)
                    fail("forward: sequence {} names block {} of {}", i, q.block_table[b], n_blocks_);
        }
        if (fb.trace && fb.n_seqs != 1) fail("forward: a trace follows one sequence (got {})", fb.n_seqs);
        const bool lone = fb.n_seqs == 1 && !fb.invariant &&
                          starts_at_zero(fb.seqs[0].block_table, (fb.seqs[0].n_past + fb.seqs[0].n + bs - 1) / bs);
        if (fb.trace && !lone) fail("forward: a trace needs a lone sequence over blocks 0, 1, 2, ...");
        if (lone) return forward_lone(fb.seqs[0], fb.trace);
        // The next token is the argmax of logits the program writes (into
        // buffers kept between passes).
        std::vector<SeqBatch>& b = batch_;
        b.assign(fb.seqs, fb.seqs + fb.n_seqs);
        size_t used = 0;
        for (SeqBatch& q : b)
            if (q.next && !q.logits) q.logits = scratch(used++);
        runner_.forward_batch(b.data(), fb.n_seqs, store_, pool_);
        for (const SeqBatch& q : b)
            if (q.next) *q.next = argmax(q.logits + (q.all_logits ? (q.n - 1) * p_.n_vocab : 0));
    }

private:
    void link_state_slots() {
        store_.state = slots_.data();
        store_.state_floats = p_.state_floats();
        store_.n_state_slots = n_slots_;
    }
    /// One sequence over the storage's first rows, as Model::forward runs it.
    void forward_lone(const SeqBatch& q, const TraceFn* trace) {
        if (q.n == 0) return;
        KvCache view(store_.k, store_.v, store_.layer_stride, n_blocks_ * store_.block_size, p_.kv_dim,
                     state_.data(), p_.state_floats());
        view.set_size(q.n_past);
        if (q.all_logits && !q.logits) fail("forward: every row's logits asked for without a buffer");
        float* logits = q.logits ? q.logits : scratch(0);
        runner_.set_trace(trace ? *trace : TraceFn{});
        try {
            runner_.forward(q.tokens, q.n, view, logits, q.all_logits, pool_, q.hidden_in, q.hidden);
        } catch (...) {
            runner_.set_trace(nullptr);
            throw;
        }
        runner_.set_trace(nullptr);
        if (q.next) *q.next = argmax(logits + (q.all_logits ? (q.n - 1) * p_.n_vocab : 0));
    }
    float* scratch(size_t i) {
        while (tmp_.size() <= i) tmp_.emplace_back(static_cast<size_t>(p_.n_vocab));
        return tmp_[i].data();
    }
    int32_t argmax(const float* l) const {
        return static_cast<int32_t>(std::max_element(l, l + p_.n_vocab) - l);
    }

    const Program& p_;
    ThreadPool& pool_;
    ProgramRunner runner_;
    std::unique_ptr<OpProfile> profile_;  // --cpu-profile: printed when the executor goes
    std::vector<float> k_, v_, state_, saved_state_;
    std::vector<float> slots_;  // batched passes' recurrent state (make_state_slots)
    int64_t n_slots_ = 0;
    PagedKvStore store_;
    int64_t n_blocks_ = 0;
    std::vector<std::vector<float>> tmp_;  // logits of rows that asked for the next token only
    std::vector<SeqBatch> batch_;          // the pass with those buffers (kept between passes)
};

}  // namespace

std::unique_ptr<Executor> make_executor(const Program& program, const ModelOptions& opts, ThreadPool& pool,
                                        bool profile) {
    return std::make_unique<CpuExecutor>(program, opts, pool, profile);
}

}  // namespace quern::cpu
