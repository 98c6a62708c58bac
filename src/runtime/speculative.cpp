#include "runtime/speculative.h"

#include <algorithm>

#include "backend/cpu/executor.h"
#include "core/error.h"

namespace quern {

namespace {

constexpr int64_t kPromptChunk = 512;  // prompt rows per pass: bounds the hidden rows handed to the drafter

/// The NextN head: at position p it reads the model's hidden row h_p and
/// the token x_{p+1}. Rows whose next token is not known yet wait (pending).
class MtpDrafter final : public Drafter {
public:
    explicit MtpDrafter(std::unique_ptr<Session> s)
        : s_(std::move(s)), n_vocab_(s_->config().n_vocab), n_embd_(s_->config().n_embd) {
        if (s_->size() != 0) fail("speculative decoding starts from an empty draft session");
    }

    void observe(const int32_t* tokens, const float* hidden, int64_t n) override {
        pend_tok_.insert(pend_tok_.end(), tokens, tokens + n);
        pend_h_.insert(pend_h_.end(), hidden, hidden + n * n_embd_);
        feed(nullptr, nullptr);
    }

    void truncate(int64_t n) override {
        const int64_t have = pend_pos_ + static_cast<int64_t>(pend_tok_.size());
        if (n >= have) return;
        if (n < pend_pos_) {
            // The head keeps its first n positions; the model's rows from n
            // on come again with the tokens that follow (position n - 1 read
            // the token that was at n: a draft-quality detail only).
            s_->truncate(n);
            pend_pos_ = n;
            pend_tok_.clear();
            pend_h_.clear();
        } else {
            pend_tok_.resize(static_cast<size_t>(n - pend_pos_));
            pend_h_.resize(static_cast<size_t>((n - pend_pos_) * n_embd_));
        }
    }

    bool begin(int32_t tok, float* logits) override {
        if (pend_tok_.empty()) return false;
        feed(&tok, logits);
        return true;
    }

    void next(int32_t d, float* logits) override {
        h2_.resize(static_cast<size_t>(n_embd_));
        s_->eval_rows(&d, 1, logits, false, h2_.data(), chain_.data());
        chain_.swap(h2_);
    }

    void end() override { s_->truncate(pend_pos_); }

private:
    /// Runs the head over the pending rows whose next token is known (with
    /// `next`: all of them, the last one's next token *next), writing the
    /// last one's logits to `logits` and keeping its hidden row for the chain.
    void feed(const int32_t* next, float* logits) {
        if (s_->size() != pend_pos_) fail("speculative decoding: the draft head lost its place");
        const auto rows = static_cast<int64_t>(pend_tok_.size());
        const int64_t m = next ? rows : rows - 1;
        if (m <= 0) return;
        std::vector<int32_t> toks(pend_tok_.begin() + 1, pend_tok_.end());
        if (next) toks.push_back(*next);
        std::vector<float> h(static_cast<size_t>(m * n_embd_));
        lbuf_.resize(static_cast<size_t>(n_vocab_));
        s_->eval_rows(toks.data(), m, logits ? logits : lbuf_.data(), false, h.data(), pend_h_.data());
        chain_.assign(h.end() - n_embd_, h.end());
        pend_tok_.erase(pend_tok_.begin(), pend_tok_.begin() + m);
        pend_h_.erase(pend_h_.begin(), pend_h_.begin() + m * n_embd_);
        pend_pos_ += m;
    }

    std::unique_ptr<Session> s_;
    int64_t n_vocab_, n_embd_;
    int64_t pend_pos_ = 0;  // the first position the head has not read
    std::vector<int32_t> pend_tok_;
    std::vector<float> pend_h_, chain_, h2_, lbuf_;
};

/// The chain's window of accepted tokens replayed into `s`, then `extra`.
void sync_history(Sampler& s, const Sampler& from, const int32_t* extra, int64_t n_extra) {
    s.reset();
    for (int32_t t : from.history()) s.accept(t);
    for (int64_t i = 0; i < n_extra; ++i) s.accept(extra[i]);
}

/// An id drawn from `probs` (n_vocab weights) with u in [0, 1).
int32_t draw_from(const std::vector<float>& probs, double u) {
    double total = 0.0;
    for (float p : probs) total += p;
    const double r = u * total;
    double acc = 0.0;
    int32_t last = -1;  // the last id with a non-zero weight (rounding at the end)
    for (size_t i = 0; i < probs.size(); ++i) {
        if (probs[i] <= 0.0f) continue;
        acc += probs[i];
        last = static_cast<int32_t>(i);
        if (r < acc) return last;
    }
    if (last < 0) fail("speculative decoding: an empty distribution");
    return last;
}

}  // namespace

std::unique_ptr<Drafter> make_mtp_drafter(std::unique_ptr<Session> draft) {
    return std::make_unique<MtpDrafter>(std::move(draft));
}

/// Greedy without penalties: every distribution is one-hot on the argmax,
/// which decides without building them.
bool argmax_only(const SamplingParams& p) {
    return p.temperature <= 0.0f && p.repeat_penalty == 1.0f && p.presence_penalty == 0.0f &&
           p.frequency_penalty == 0.0f;
}

int32_t argmax_of(const float* x, int64_t n) { return static_cast<int32_t>(std::max_element(x, x + n) - x); }

int32_t draw_draft(const Sampler& sampler, const int32_t* drafts, int64_t i, const float* logits, double u,
                   float* q_out) {
    const int64_t V = static_cast<int64_t>(sampler.n_vocab());
    if (argmax_only(sampler.params())) return argmax_of(logits, V);  // q one-hot: judge_drafts needs none
    Sampler ds(sampler.params(), V);
    sync_history(ds, sampler, drafts, i);
    std::vector<float> q;
    ds.distribution(logits, q);
    std::copy(q.begin(), q.end(), q_out);
    return draw_from(q, sampler.params().temperature <= 0.0f ? 0.0 : u);
}

int64_t judge_drafts(Sampler& sampler, const int32_t* drafts, int64_t k, const float* target_logits,
                     const float* q_rows, int32_t& own) {
    const int64_t V = static_cast<int64_t>(sampler.n_vocab());
    if (argmax_only(sampler.params())) {
        for (int64_t j = 0; j <= k; ++j) {
            own = argmax_of(target_logits + j * V, V);
            if (j == k || drafts[j] != own) return j;
        }
    }
    const bool greedy = sampler.params().temperature <= 0.0f;
    Sampler ts(sampler.params(), V);  // the chain's distributions at each draft's history
    std::vector<float> p, r;
    for (int64_t j = 0; j <= k; ++j) {
        sync_history(ts, sampler, drafts, j);
        ts.distribution(target_logits + j * V, p);
        if (j == k) {
            own = draw_from(p, greedy ? 0.0 : sampler.draw());
            return k;
        }
        const int32_t d = drafts[j];
        const float pd = p[static_cast<size_t>(d)], qd = q_rows[j * V + d];
        const double u = greedy ? 0.0 : sampler.draw();
        if (u * qd < pd) continue;  // kept (greedy: p is one-hot on d)
        r.resize(static_cast<size_t>(V));
        double sum = 0.0;
        for (int64_t t = 0; t < V; ++t) {
            r[static_cast<size_t>(t)] = std::max(0.0f, p[static_cast<size_t>(t)] - q_rows[j * V + t]);
            sum += r[static_cast<size_t>(t)];
        }
        own = draw_from(sum > 0.0 ? r : p, greedy ? 0.0 : sampler.draw());
        return j;
    }
    return k;  // not reached
}

Speculator::Speculator(Session& target, std::unique_ptr<Drafter> drafter, int n_draft, uint64_t seed)
    : target_(target),
      drafter_(std::move(drafter)),
      n_draft_(n_draft),
      rng_(seed ^ 0x9E3779B97F4A7C15ull),
      n_vocab_(target.config().n_vocab),
      n_embd_(target.config().n_embd) {
    if (n_draft < 1) fail("speculative decoding drafts at least 1 token per round (got {})", n_draft);
    if (!drafter_) fail("speculative decoding needs a drafter");
    if (target_.size() != 0) fail("speculative decoding starts from an empty session");
}

void Speculator::eval(const int32_t* tokens, int64_t n, float* logits) {
    std::vector<float> h;
    for (int64_t b0 = 0; b0 < n; b0 += kPromptChunk) {
        const int64_t nb = std::min(kPromptChunk, n - b0);
        h.resize(drafter_->reads_hidden() ? static_cast<size_t>(nb * n_embd_) : 0);
        float* hp = h.empty() ? nullptr : h.data();
        target_.eval_rows(tokens + b0, nb, b0 + nb == n ? logits : nullptr, false, hp);
        drafter_->observe(tokens + b0, hp, nb);
    }
}

void Speculator::truncate(int64_t n) {
    target_.truncate(n);
    drafter_->truncate(target_.size());
}

void Speculator::step(int32_t tok, Sampler& sampler, std::vector<int32_t>& out) {
    const int64_t N = target_.size(), V = n_vocab_, E = n_embd_;
    if (N + 1 > target_.n_ctx())
        fail("context is full: {} tokens in the cache + 1 new > context size {} (raise -c)", N, target_.n_ctx());
    int64_t k = std::min<int64_t>(n_draft_, target_.n_ctx() - N - 1);
    std::uniform_real_distribution<double> uni(0.0, 1.0);

    // Draft k tokens, each from the chain's distribution q of its logits.
    std::vector<int32_t>& v = verify_;
    v.assign(1, tok);
    dlogits_.resize(static_cast<size_t>(V));
    if (k > 0 && !drafter_->begin(tok, dlogits_.data())) k = 0;
    qrows_.resize(static_cast<size_t>(k * V));
    for (int64_t i = 0; i < k; ++i) {
        const int32_t d = draw_draft(sampler, v.data() + 1, i, dlogits_.data(), uni(rng_), qrows_.data() + i * V);
        v.push_back(d);
        if (i + 1 < k) drafter_->next(d, dlogits_.data());
    }
    drafter_->end();

    // Verify tok and the drafts in one pass of the model. A recurrent
    // state is kept after every row where the backend can (Session::
    // keep_rows), else saved before the pass and the kept rows run again.
    const bool recurrent = target_.config().has_recurrent_state();
    const bool row_states = target_.keeps_row_states() && k + 1 <= kMaxRowStateRows;
    if (recurrent && !row_states) target_.save_point();
    tlogits_.resize(static_cast<size_t>((k + 1) * V));
    thidden_.resize(drafter_->reads_hidden() ? static_cast<size_t>((k + 1) * E) : 0);
    float* th = thidden_.empty() ? nullptr : thidden_.data();
    target_.eval_rows(v.data(), k + 1, tlogits_.data(), true, th, nullptr, row_states);
    int32_t own = -1;
    const int64_t j = judge_drafts(sampler, v.data() + 1, k, tlogits_.data(), qrows_.data(), own);
    out.insert(out.end(), v.begin() + 1, v.begin() + 1 + j);
    out.push_back(own);

    // The model keeps tok and the j drafts it agreed with.
    if (j < k) {
        if (row_states) {
            target_.keep_rows(j + 1);
        } else if (recurrent) {
            target_.back_to_save_point();
            target_.eval_rows(v.data(), j + 1, nullptr, false, nullptr);
        } else {
            target_.truncate(N + j + 1);
        }
    }
    drafter_->observe(v.data(), th, j + 1);
    stats_.rounds += 1;
    stats_.drafted += k;
    stats_.accepted += j;
    stats_.emitted += j + 1;
}

const Program& draft_program_of(const Model& model) {
    const Program* p = model.draft_program();
    if (!p)
        fail("this model has no multi-token-prediction head to draft with (a Qwen3.5 checkpoint with its mtp.* "
             "tensors, or a GGUF converted without --no-mtp)");
    return *p;
}

std::unique_ptr<Session> make_draft_session(const Model& model, std::unique_ptr<Executor> executor, int64_t n_ctx) {
    ModelConfig c = model.config();
    c.recurrent_layers.clear();  // the head is one attention layer: no recurrent state
    return std::make_unique<Session>(c, std::move(executor), n_ctx);
}

std::unique_ptr<Session> make_cpu_draft_session(const Model& model, int64_t n_ctx, ThreadPool& pool) {
    return make_draft_session(model, cpu::make_executor(draft_program_of(model), model.options(), pool), n_ctx);
}

}  // namespace quern
