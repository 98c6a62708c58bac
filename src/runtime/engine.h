// Engine: many generation requests in flight on one model.
//
// A worker thread runs a continuous-batching loop: every step evaluates the
// next token of every running sequence together with chunks of waiting
// prompts (chunked prefill) up to a token budget, in one batched forward pass
// (one read of the weights serves the whole batch), then samples each
// sequence with its own sampler and reports the token through the request's
// callback. Requests wait in a bounded FIFO queue when all slots are busy.
// Keys and values live in a paged cache shared by all sequences
// (runtime/paged_kv.h); a prompt that starts like an earlier one reuses its
// blocks (prefix caching), and when blocks run out the newest sequences are
// preempted and recomputed later.
//
// The engine works in token ids; text (templates, tokenization, stop strings,
// detokenization) is the caller's business: the HTTP server cancels a
// request (callback returns false) when its stop string appears.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/model.h"
#include "runtime/sampler.h"

namespace quern {

class Tokenizer;

/// Why a sequence ended.
enum class FinishReason {
    None,       ///< still running (not the last event)
    Stop,       ///< an end-of-generation token (not reported as a token)
    Length,     ///< max_tokens reached or the context is full
    Cancelled,  ///< the callback returned false or cancel() was called
    Error,      ///< see TokenEvent::error
};

namespace grammar {
struct Grammar;
}

struct GenerationRequest {
    std::vector<int32_t> prompt;  ///< token ids, non-empty, shorter than the context
    int64_t max_tokens = -1;      ///< tokens to generate at most; -1: until the context is full
    SamplingParams sampling;      ///< includes the seed
    /// Added to the logits before sampling (OpenAI's logit_bias), token id → bias.
    std::vector<std::pair<int32_t, float>> logit_bias;
    /// -1: no log-probabilities; 0..20: the sampled token's log-probability
    /// and that many most likely alternatives (after logit_bias, before the
    /// sampler's transforms), as OpenAI reports them.
    int top_logprobs = -1;
    bool ignore_eos = false;
    /// Constrained decoding: every token is one the grammar allows next
    /// (grammar/token_matcher.h), end-of-generation only once the text is
    /// whole. Null: unconstrained.
    std::shared_ptr<const grammar::Grammar> grammar;
};

/// One event of a request: a generated token, or the end (last == true; the
/// end may carry a token too).
struct TokenEvent {
    int32_t token = -1;  ///< -1 when the event carries no token
    float logprob = 0;   ///< of `token`, when requested
    std::vector<std::pair<int32_t, float>> top_logprobs;  ///< when requested
    bool last = false;
    FinishReason finish = FinishReason::None;
    std::string error;          ///< FinishReason::Error only
    int64_t n_prompt = 0;       ///< prompt tokens (every event)
    int64_t n_cached = 0;       ///< prompt tokens whose KV came from the prefix cache
    int64_t n_generated = 0;    ///< tokens generated so far, this one included
};

/// Called on the engine thread for every event, in order; must not block for
/// long (it stalls every request). Return false to cancel the request (its
/// resources are freed before the next step; a final event with
/// FinishReason::Cancelled follows).
using TokenCallback = std::function<bool(const TokenEvent&)>;

struct EngineOptions {
    int64_t n_ctx = 4096;     ///< context size per sequence (prompt + generated)
    int n_parallel = 4;       ///< sequences running at once
    int max_queue = 64;       ///< waiting requests beyond which submit() refuses
    int64_t token_budget = 512;  ///< tokens per batched step (decodes + prefill chunks)
    int n_threads = 0;        ///< CPU threads (0: all cores)
    /// Positions of the paged KV cache shared by all sequences (0: n_ctx ×
    /// n_parallel). When it runs out, the newest sequences are preempted
    /// (their cache is dropped and recomputed later). At least n_ctx. A
    /// runner with a memory budget may make fewer (--gpu-mem) or, told to
    /// fill it, more (`quern serve` on a GPU).
    int64_t kv_tokens = 0;
    bool prefix_cache = true;  ///< reuse the cached blocks of earlier prompts with the same start
    /// Speculative decoding: tokens the model's NextN head drafts per round
    /// for each decoding sequence, verified in the step's batched pass
    /// (runtime/speculative.h). 0: off. CPU engines of models with a head;
    /// requests with logit_bias or logprobs decode one token per step.
    int spec_draft = 0;
    /// Models with recurrent state: copies of a prefix's state kept for the
    /// prefix cache (each one sequence's state; least recently used out).
    /// -1: as many as n_parallel. 0: prompts with a cached start recompute it.
    int state_snapshots = -1;
    /// At start, build the vocabulary's token texts for constrained requests
    /// and fill their mask caches from sample JSON documents on a thread of
    /// their own (grammar/warm.h), so that the first request with a schema
    /// finds them (`quern serve`). Off: on the first constrained request.
    bool warm_grammar = false;
};

/// Counters for /metrics (monotonic unless noted).
struct EngineStats {
    int64_t requests_finished = 0;
    int64_t prompt_tokens = 0;
    int64_t prompt_tokens_cached = 0;
    int64_t generated_tokens = 0;
    int64_t steps = 0;
    int64_t preemptions = 0;  ///< sequences whose KV blocks were taken for older ones
    int64_t spec_drafted = 0;   ///< draft tokens proposed (speculative rounds)
    int64_t spec_accepted = 0;  ///< of those, kept
    int running = 0;       ///< now
    int waiting = 0;       ///< now
    int64_t kv_tokens_used = 0;   ///< now
    int64_t kv_tokens_total = 0;  ///< capacity
};

class Engine {
public:
    virtual ~Engine() = default;
    /// Queues a request. Throws quern::Error with a message fit for a client
    /// when the request is invalid (empty prompt, prompt + 1 > n_ctx, token id
    /// out of range, bad sampling values) and QueueFullError when max_queue
    /// requests are already waiting. Returns the request id.
    virtual uint64_t submit(GenerationRequest req, TokenCallback cb) = 0;
    /// Cancels a request (no-op if finished); thread-safe.
    virtual void cancel(uint64_t id) = 0;
    virtual EngineStats stats() const = 0;
    virtual const EngineOptions& options() const = 0;
    /// Stops the worker after cancelling everything (also done by the destructor).
    virtual void shutdown() = 0;
};

/// submit() when the queue is full (the server answers 429).
struct QueueFullError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// An engine for `model` on the CPU; `model` must outlive it.
std::unique_ptr<Engine> make_engine(Model& model, const Tokenizer& tokenizer, const EngineOptions& opts);

class BatchRunner;
class ThreadPool;
/// Makes the engine's runner, given the engine's thread pool (which the
/// runner may use; it outlives the runner).
using RunnerFactory = std::function<std::unique_ptr<BatchRunner>(ThreadPool&)>;
class Executor;
/// Makes the executor of the model's NextN draft program (speculative
/// rounds, EngineOptions::spec_draft) on the runner's backend.
using DraftFactory = std::function<std::unique_ptr<Executor>(ThreadPool&)>;
/// An engine whose forward passes run on the runner `make_runner` returns
/// (make_cpu_batch_runner, make_executor_runner over cuda::make_executor),
/// its draft head (when spec_draft > 0) on the executor `make_draft`
/// returns (empty: the model has none; then spec_draft > 0 is refused).
/// quern::Error from the factories propagates.
std::unique_ptr<Engine> make_engine(const RunnerFactory& make_runner, const Tokenizer& tokenizer,
                                    const EngineOptions& opts, const DraftFactory& make_draft = {});

}  // namespace quern
