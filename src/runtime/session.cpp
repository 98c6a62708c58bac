#include "runtime/session.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/executor.h"
#include "core/error.h"

namespace quern {

namespace {
constexpr int64_t kSessionBlock = 16;  // positions per block of a session's storage
}

Session::Session(const ModelConfig& cfg, std::unique_ptr<Executor> executor, int64_t n_ctx, const char* flag)
    : cfg_(cfg), x_(std::move(executor)) {
    if (n_ctx < 1) fail("context size must be at least 1 (got {})", n_ctx);
    const int64_t blocks = (n_ctx + kSessionBlock - 1) / kSessionBlock;
    const int64_t made = x_->make_kv_storage(blocks, kSessionBlock, flag);
    n_ctx_ = std::min(n_ctx, made * kSessionBlock);
    table_.resize(static_cast<size_t>(made));
    for (int64_t b = 0; b < made; ++b) table_[static_cast<size_t>(b)] = static_cast<int32_t>(b);
}

void Session::truncate(int64_t n) {
    saved_n_past_ = -1;
    rows_pos_ = -1;
    n = std::clamp<int64_t>(n, 0, n_past_);
    if (n == n_past_) return;
    if (!cfg_.has_recurrent_state()) {
        n_past_ = n;
        return;
    }
    n_past_ = 0;
    const std::vector<int32_t> keep(history_.begin(), history_.begin() + n);
    history_.clear();
    if (n > 0) run(keep.data(), n, nullptr, nullptr, nullptr, nullptr);
}

void Session::check_tokens(const int32_t* tokens, int64_t n) const {
    if (n < 0) fail("negative token count {}", n);
    if (size() + n > n_ctx())
        fail("context is full: {} tokens in the cache + {} new > context size {} (raise -c)", size(), n, n_ctx());
    const int64_t n_vocab = config().n_vocab;
    for (int64_t i = 0; i < n; ++i)
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            fail("token id {} is outside the vocabulary [0, {})", tokens[i], n_vocab);
}

void Session::run(const int32_t* tokens, int64_t n, float* logits, int32_t* next, const SamplingSpec* sampling,
                  const TraceFn* trace, SeqBatch rows) {
    check_tokens(tokens, n);
    if (n == 0) return;
    SeqBatch q = rows;
    q.tokens = tokens;
    q.n = n;
    q.block_table = table_.data();
    q.n_past = n_past_;
    q.decode = n == 1;
    q.logits = logits;
    q.next = next;
    q.sampling = sampling;
    ForwardBatch b;
    b.seqs = &q;
    b.n_seqs = 1;
    b.invariant = false;
    b.trace = trace;
    x_->forward(b);
    if (cfg_.has_recurrent_state()) {
        history_.resize(static_cast<size_t>(n_past_));
        history_.insert(history_.end(), tokens, tokens + n);
    }
    n_past_ += n;
}

void Session::eval(const int32_t* tokens, int64_t n, float* logits) { run(tokens, n, logits, nullptr, nullptr, nullptr); }

void Session::eval_rows(const int32_t* tokens, int64_t n, float* logits, bool all_logits, float* hidden,
                        const float* hidden_in, bool row_states) {
    SeqBatch rows;
    rows.all_logits = all_logits && logits;
    rows.hidden = hidden;
    rows.hidden_in = hidden_in;
    rows_pos_ = -1;
    if (row_states && keeps_row_states()) {
        if (n > kMaxRowStateRows) fail("a pass keeping its rows' states takes at most {} tokens (got {})", kMaxRowStateRows, n);
        rows.row_states = true;
    }
    const int64_t at = n_past_;
    run(tokens, n, logits, nullptr, nullptr, nullptr, rows);
    if (rows.row_states) rows_pos_ = at, rows_n_ = n;
}

void Session::keep_rows(int64_t m) {
    if (rows_pos_ < 0 || n_past_ != rows_pos_ + rows_n_ || m < 1 || m > rows_n_)
        fail("keep_rows: {} tokens of a pass that kept no per-token state", m);
    x_->keep_lone_rows(m);
    n_past_ = rows_pos_ + m;
    history_.resize(static_cast<size_t>(n_past_));
    rows_pos_ = -1;
}

void Session::save_point() {
    saved_n_past_ = n_past_;
    if (cfg_.has_recurrent_state()) x_->save_lone_state();
}

void Session::back_to_save_point() {
    if (saved_n_past_ < 0 || saved_n_past_ > n_past_) fail("no save point to go back to");
    if (cfg_.has_recurrent_state()) {
        x_->restore_lone_state();
        history_.resize(static_cast<size_t>(saved_n_past_));
    }
    n_past_ = saved_n_past_;
}

int32_t Session::eval_greedy(int32_t token) {
    int32_t next = -1;
    run(&token, 1, nullptr, &next, nullptr, nullptr);
    return next;
}

int32_t Session::eval_sample(int32_t token, Sampler& sampler) {
    const SamplingParams& p = sampler.params();
    SamplingSpec s{p.temperature,    p.top_k,          p.top_p,           p.min_p,
                   p.repeat_penalty, p.presence_penalty, p.frequency_penalty, p.repeat_last_n};
    if (!x_->samples_on_device(s)) {
        logits_.resize(static_cast<size_t>(config().n_vocab));
        eval(&token, 1, logits_.data());
        return sampler.sample(logits_.data());
    }
    check_tokens(&token, 1);  // before the draw: a refused token consumes none
    if (p.temperature > 0.0f) s.u = sampler.draw();  // Sampler::sample draws only then
    int32_t next = -1;
    run(&token, 1, nullptr, &next, &s, nullptr);
    return next;
}

void Session::eval_traced(const int32_t* tokens, int64_t n, float* logits, const TraceFn& trace) {
    run(tokens, n, logits, nullptr, nullptr, &trace);
}

std::unique_ptr<Session> make_executor_session(const Model& model, std::unique_ptr<Executor> executor, int64_t n_ctx) {
    return std::make_unique<Session>(model.config(), std::move(executor), n_ctx);
}

std::unique_ptr<Session> make_cpu_session(Model& model, int64_t n_ctx, ThreadPool& pool, bool profile) {
    if (n_ctx < 1) fail("context size must be at least 1 (got {})", n_ctx);
    return make_executor_session(model, cpu::make_executor(model.program(), model.options(), pool, profile), n_ctx);
}

}  // namespace quern
