#include "cli/decoder.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "core/error.h"

namespace quern::cli {

void add_spec_options(CLI::App* cmd, SpecOptions& o) {
    cmd->add_option("--spec", o.method,
                    "Speculative decoding: 'mtp' drafts with the model's own multi-token-prediction head (Qwen3.5) "
                    "and keeps what the model agrees with — same output distribution, fewer passes")
        ->check(CLI::IsMember({"mtp"}));
    cmd->add_option("--spec-draft", o.n_draft, "Tokens drafted per speculative round")
        ->capture_default_str()
        ->check(CLI::Range(1, 16));
}

Decoder::Decoder(Session& session, Model& model, const SpecOptions& o, const DeviceOptions& dev, ThreadPool& pool,
                 uint64_t seed)
    : s_(session) {
    if (o.method.empty()) return;
    if (!model.draft_program())
        fail("--spec mtp: this model has no multi-token-prediction head (a Qwen3.5 checkpoint with its mtp.* tensors, "
             "or a GGUF converted without --no-mtp); drop --spec");
    spec_ = std::make_unique<Speculator>(session, make_mtp_drafter(make_draft_session(model, session, dev, pool)),
                                         o.n_draft, seed);
}

void Decoder::eval(const int32_t* tokens, int64_t n, float* logits) {
    queue_.clear();
    if (spec_) spec_->eval(tokens, n, logits);
    else s_.eval(tokens, n, logits);
}

void Decoder::truncate(int64_t n) {
    queue_.clear();
    if (spec_) spec_->truncate(n);
    else s_.truncate(n);
}

int32_t Decoder::next(int32_t tok, Sampler& sampler) {
    if (!spec_) {
        const SamplingParams& p = sampler.params();
        const bool greedy = p.temperature <= 0 && p.repeat_penalty == 1.0f && p.presence_penalty == 0.0f &&
                            p.frequency_penalty == 0.0f;
        // Both pick on the GPU when there is one: only the id comes back.
        return greedy ? s_.eval_greedy(tok) : s_.eval_sample(tok, sampler);
    }
    if (queue_.empty()) {
        got_.clear();
        spec_->step(tok, sampler, got_);
        queue_.assign(got_.begin(), got_.end());
    }
    const int32_t t = queue_.front();
    queue_.pop_front();
    return t;
}

std::string Decoder::summary() const {
    if (!spec_) return "";
    const SpecStats& st = spec_->stats();
    return fmt::format("mtp ({} per round): {} of {} drafts kept ({:.0f}%), {:.2f} tokens per pass of the model",
                       spec_->n_draft(), st.accepted, st.drafted, 100.0 * st.acceptance(),
                       st.rounds > 0 ? static_cast<double>(st.emitted) / static_cast<double>(st.rounds) : 0.0);
}

}  // namespace quern::cli
