// The command-line tools' decode loop step: the next token after the one
// just emitted, from plain decode steps (Session::eval_greedy /
// eval_sample) or from speculative rounds (--spec mtp: the model's NextN
// head drafts, Speculator verifies), which hand back several tokens at once.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "cli/common.h"
#include "runtime/speculative.h"

namespace CLI {
class App;
}

namespace quern::cli {

/// --spec and --spec-draft.
struct SpecOptions {
    std::string method;  ///< "" (off) or "mtp"
    int n_draft = 2;     ///< tokens drafted per round
};
void add_spec_options(CLI::App* cmd, SpecOptions& o);

class Decoder {
public:
    /// The draft head (with `o`) runs on the session's backend (the GPU with
    /// the options `dev` gives). quern::Error when the model has no NextN head.
    Decoder(Session& session, Model& model, const SpecOptions& o, const DeviceOptions& dev, ThreadPool& pool,
            uint64_t seed);

    /// Prompt tokens at session.size() (the last one's logits into `logits`).
    void eval(const int32_t* tokens, int64_t n, float* logits);
    /// Keeps the first n positions (and forgets queued tokens).
    void truncate(int64_t n);
    /// The token after `tok` (just emitted and accepted by `sampler`).
    int32_t next(int32_t tok, Sampler& sampler);
    /// Whether the context has no room for next() to evaluate another token.
    bool context_full() const { return queue_.empty() && s_.size() >= s_.n_ctx(); }
    /// "mtp: 40 of 78 drafts kept (51%), 1.51 tokens per pass" or "" (plain).
    std::string summary() const;

private:
    Session& s_;
    std::unique_ptr<Speculator> spec_;
    std::deque<int32_t> queue_;  // a round's tokens not handed out yet (in the cache but the last)
    std::vector<int32_t> got_;
};

}  // namespace quern::cli
