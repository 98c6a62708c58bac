// Token sampling: a chain of logit transforms and a seeded draw.
//   penalties (repetition / presence / frequency over the last repeat_last_n
//   tokens) → top-k → top-p (nucleus, Holtzman et al. 2019) → min-p → temperature → draw.
// top-k / top-p / min-p are computed on the untempered distribution, as
// llama.cpp's default sampler chain does. temperature <= 0 selects greedy argmax
// (after penalties).
#pragma once
#include <cstdint>
#include <deque>
#include <random>
#include <unordered_map>
#include <vector>

namespace quern {

struct SamplingParams {
    float temperature = 0.8f;
    int top_k = 40;            // <= 0: off
    float top_p = 0.95f;       // >= 1: off
    float min_p = 0.05f;       // <= 0: off
    float repeat_penalty = 1.0f;  // 1: off (CTRL-style: divide positive logits, multiply negative ones)
    int repeat_last_n = 64;    // window for all penalties; -1: whole history
    float presence_penalty = 0.0f;
    float frequency_penalty = 0.0f;
    uint64_t seed = 0;         // same seed + same logits → same tokens
};

class Sampler {
public:
    Sampler(const SamplingParams& p, int64_t n_vocab);

    /// Picks the next token from n_vocab logits (not modified).
    int32_t sample(const float* logits);
    /// The distribution sample() draws from for these logits: n_vocab
    /// probabilities after the chain (zero outside the kept candidates;
    /// greedy: one-hot on its pick). Draws nothing. Speculative decoding's
    /// rejection sampling compares the target's and the draft's.
    void distribution(const float* logits, std::vector<float>& probs);
    /// The uniform draw in [0, 1) the next sample() would make, consumed now:
    /// for a backend that runs the same chain itself (cuda::sample_token).
    double draw();
    /// The penalties' window as accepted so far (oldest first).
    const std::deque<int32_t>& history() const { return history_; }
    /// Records a token of the sequence (prompt or generated) for the penalties.
    void accept(int32_t token);
    void reset();
    const SamplingParams& params() const { return p_; }
    int64_t n_vocab() const { return n_vocab_; }

private:
    struct Cand {
        int32_t id;
        float logit;
    };
    /// Penalties and truncations: 0 and the pick when greedy, else the
    /// number of candidates kept in cand_[0, n) (sorted on demand: sort_to).
    int64_t candidates(const float* logits, int32_t& pick);
    /// Sorts cand_ up to k (of the n_cand_ kept) by logit, ties by id.
    void sort_to(size_t k);
    SamplingParams p_;
    size_t n_cand_ = 0, sorted_ = 0;
    int64_t n_vocab_;
    std::mt19937_64 rng_;
    std::deque<int32_t> history_;
    std::vector<Cand> cand_;
    std::vector<float> work_;
    std::unordered_map<int32_t, int> counts_;
};

}  // namespace quern
