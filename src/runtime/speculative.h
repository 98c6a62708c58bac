// Self-speculative decoding with a model's multi-token-prediction (NextN)
// head: each round the head drafts k tokens one after another (cheap: one
// decoder layer and the LM head per token), the model checks the emitted
// token and all k drafts in one forward pass, and keeps the longest prefix
// of drafts it agrees with plus one token of its own — 1 to k + 1 tokens per
// pass of the model. Rejection sampling (Leviathan et al. 2023, "Fast
// Inference from Transformers via Speculative Decoding"; Chen et al. 2023)
// keeps the output distributed exactly as the model's sampler alone would
// draw it; greedy decoding gives the same tokens.
//
// Positions: the head at position p reads the model's hidden row h_p and the
// token x_{p+1}, and predicts x_{p+2} (ArchDef::build_draft). Chained draft
// steps feed the head's own hidden row back in place of the model's. The
// head's KV cache keeps only positions whose rows came from the model; the
// model's own passes are rolled back past rejected drafts (attention:
// positions forgotten; recurrent state: Session::save_point).
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "runtime/sampler.h"
#include "runtime/session.h"

namespace quern {

struct SpecStats {
    int64_t rounds = 0;    ///< verification passes of the model
    int64_t drafted = 0;   ///< draft tokens proposed
    int64_t accepted = 0;  ///< of those, kept
    int64_t emitted = 0;   ///< tokens the rounds produced (accepted + one per round)
    double acceptance() const { return drafted > 0 ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0.0; }
};

/// What proposes the draft tokens: it follows the model's sequence (the
/// tokens and hidden rows of each position the model evaluates) and, each
/// round, gives the logits of a first draft after the emitted token and of
/// each next one after the previous draft.
class Drafter {
public:
    virtual ~Drafter() = default;
    /// Whether observe() reads the model's hidden rows (else it gets null).
    virtual bool reads_hidden() const { return true; }
    /// The model evaluated the next n positions: their tokens and hidden
    /// rows (Program::hidden, n_embd floats each).
    virtual void observe(const int32_t* tokens, const float* hidden, int64_t n) = 0;
    /// The model's sequence was cut back to n positions.
    virtual void truncate(int64_t n) = 0;
    /// A round after `tok` (the emitted token, the next position's): the
    /// first draft's logits (n_vocab floats). false: nothing to draft from.
    virtual bool begin(int32_t tok, float* logits) = 0;
    /// The logits of the draft after draft `d`.
    virtual void next(int32_t d, float* logits) = 0;
    /// The round is over (the drafter forgets what it drafted).
    virtual void end() = 0;
};

/// A round's drafting side: draft i (0-based) drawn with `u` (in [0, 1);
/// ignored when greedy) from the chain's distribution q of the draft logits,
/// at the history `sampler` has plus drafts[0 .. i); q (n_vocab floats) is
/// kept in q_out for judge_drafts (left alone for greedy decoding without
/// penalties: the argmax decides, judge_drafts reads no q).
int32_t draw_draft(const Sampler& sampler, const int32_t* drafts, int64_t i, const float* logits, double u,
                   float* q_out);

/// A round's verdict by rejection sampling: the model's logits after the
/// emitted token and each of the k drafts ((k + 1) × n_vocab), the drafts'
/// q rows (k × n_vocab). Keeps drafts while a draw from `sampler` stays
/// under p/q; returns how many were kept (j) and sets `own` to the model's
/// token after them — drawn from max(0, p − q) after a rejection, from p
/// after all k. Greedy: the model's argmax decides, nothing is drawn. The
/// sampler's history is not changed.
int64_t judge_drafts(Sampler& sampler, const int32_t* drafts, int64_t k, const float* target_logits,
                     const float* q_rows, int32_t& own);

/// The model's NextN head as a Drafter: a session over its draft program
/// (make_cpu_draft_session).
std::unique_ptr<Drafter> make_mtp_drafter(std::unique_ptr<Session> draft);

class Speculator {
public:
    /// target: the model's session, empty; drafter: following it from
    /// position 0; n_draft (>= 1) tokens drafted per round; seed: the
    /// drafts' own draws (the acceptance tests draw from the caller's sampler).
    Speculator(Session& target, std::unique_ptr<Drafter> drafter, int n_draft, uint64_t seed);

    /// Evaluates n prompt tokens at target.size() (as Session::eval: the last
    /// token's logits into `logits` when not null), showing the drafter the rows.
    void eval(const int32_t* tokens, int64_t n, float* logits);

    /// One round after `tok`, the token just emitted (accepted by `sampler`,
    /// not yet evaluated): drafts, verifies and appends to `out` the tokens
    /// that follow tok — the drafts kept and one token of the model's own
    /// (1 to n_draft + 1). The caller accepts them into `sampler` as it
    /// emits them. Near the end of the context fewer are drafted (none: a
    /// plain decode step). quern::Error when the context is full.
    void step(int32_t tok, Sampler& sampler, std::vector<int32_t>& out);

    /// Keeps the first n positions of the sequence (as Session::truncate).
    void truncate(int64_t n);
    void clear() { truncate(0); }

    const SpecStats& stats() const { return stats_; }
    int n_draft() const { return n_draft_; }

private:
    Session& target_;
    std::unique_ptr<Drafter> drafter_;
    int n_draft_;
    std::mt19937_64 rng_;
    int64_t n_vocab_, n_embd_;
    std::vector<float> dlogits_, tlogits_, thidden_, qrows_;
    std::vector<int32_t> verify_;
    SpecStats stats_;
};

/// model.draft_program(), or quern::Error saying the model has no NextN head.
const Program& draft_program_of(const Model& model);
/// A session of n_ctx positions over the model's draft program on
/// `executor` (made over draft_program_of(model) on any backend).
std::unique_ptr<Session> make_draft_session(const Model& model, std::unique_ptr<Executor> executor, int64_t n_ctx);
/// make_draft_session on the CPU (quern::Error when the model has no NextN
/// head); `model` and `pool` must outlive it.
std::unique_ptr<Session> make_cpu_draft_session(const Model& model, int64_t n_ctx, ThreadPool& pool);

}  // namespace quern
