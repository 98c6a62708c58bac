#include "runtime/session.h"
#include "runtime/memory.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace quern {

void Session::check_tokens(const int32_t* tokens, int64_t n) const {
    if (n < 0) fail("negative token count {}", n);
    if (size() + n > n_ctx())
        fail("context is full: {} tokens in the cache + {} new > context size {} (raise -c)", size(), n, n_ctx());
    const int64_t n_vocab = config().n_vocab;
    for (int64_t i = 0; i < n; ++i)
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            fail("token id {} is outside the vocabulary [0, {})", tokens[i], n_vocab);
}

int32_t Session::eval_greedy(int32_t token) {
    greedy_logits_.resize(static_cast<size_t>(config().n_vocab));
    eval(&token, 1, greedy_logits_.data());
    return static_cast<int32_t>(std::max_element(greedy_logits_.begin(), greedy_logits_.end()) -
                                greedy_logits_.begin());
}

int32_t Session::eval_sample(int32_t token, Sampler& sampler) {
    greedy_logits_.resize(static_cast<size_t>(config().n_vocab));
    eval(&token, 1, greedy_logits_.data());
    return sampler.sample(greedy_logits_.data());
}

namespace {

class CpuSession final : public Session {
public:
    CpuSession(Model& m, int64_t n_ctx, ThreadPool& pool) : model_(m), cache_(m.make_cache(n_ctx)), pool_(pool) {}
    const ModelConfig& config() const override { return model_.config(); }
    std::string backend_name() const override { return "CPU"; }
    int64_t n_ctx() const override { return cache_.n_ctx(); }
    int64_t size() const override { return cache_.size(); }
    void truncate(int64_t n) override { cache_.set_size(std::clamp<int64_t>(n, 0, cache_.size())); }

    void eval(const int32_t* tokens, int64_t n, float* logits) override {
        check_tokens(tokens, n);
        if (n == 0) return;
        if (!logits) {
            scratch_.resize(static_cast<size_t>(config().n_vocab));
            logits = scratch_.data();
        }
        model_.forward(tokens, n, cache_, logits, false, pool_);
    }

    void eval_traced(const int32_t* tokens, int64_t n, float* logits, const TraceFn& trace) override {
        model_.set_trace(trace);
        try {
            eval(tokens, n, logits);
        } catch (...) {
            model_.set_trace(nullptr);
            throw;
        }
        model_.set_trace(nullptr);
    }

private:
    Model& model_;
    KvCache cache_;
    ThreadPool& pool_;
    std::vector<float> scratch_;
};

class ExecutorSession final : public Session {
public:
    ExecutorSession(const Model& m, std::unique_ptr<SequenceExecutor> x) : cfg_(m.config()), x_(std::move(x)) {}
    const ModelConfig& config() const override { return cfg_; }
    std::string backend_name() const override { return x_->device_name(); }
    int64_t n_ctx() const override { return x_->n_ctx(); }
    int64_t size() const override { return x_->size(); }
    void truncate(int64_t n) override { x_->truncate(n); }
    void eval(const int32_t* tokens, int64_t n, float* logits) override {
        check_tokens(tokens, n);
        x_->eval(tokens, n, logits);
    }
    int32_t eval_greedy(int32_t token) override {
        check_tokens(&token, 1);
        return x_->eval_greedy(token);
    }
    int32_t eval_sample(int32_t token, Sampler& sampler) override {
        const SamplingParams& p = sampler.params();
        SamplingSpec s{p.temperature,    p.top_k,          p.top_p,           p.min_p,
                       p.repeat_penalty, p.presence_penalty, p.frequency_penalty, p.repeat_last_n};
        if (!x_->samples_on_device(s)) return Session::eval_sample(token, sampler);
        check_tokens(&token, 1);
        if (p.temperature > 0.0f) s.u = sampler.draw();  // Sampler::sample draws only then
        return x_->eval_sample(token, s);
    }
    void eval_traced(const int32_t* tokens, int64_t n, float* logits, const TraceFn& trace) override {
        check_tokens(tokens, n);
        x_->eval_traced(tokens, n, logits, trace);
    }
    int64_t fp8_activation_rows() const override { return x_->fp8_activation_rows(); }

private:
    ModelConfig cfg_;
    std::unique_ptr<SequenceExecutor> x_;
};

}  // namespace

std::unique_ptr<Session> make_executor_session(const Model& model, std::unique_ptr<SequenceExecutor> executor) {
    return std::make_unique<ExecutorSession>(model, std::move(executor));
}

std::unique_ptr<Session> make_cpu_session(Model& model, int64_t n_ctx, ThreadPool& pool) {
    if (n_ctx < 1) fail("context size must be at least 1 (got {})", n_ctx);
    check_kv_cache_fits(n_ctx, model.config().n_layer, model.config().kv_dim(), sizeof(float), "-c");
    return std::make_unique<CpuSession>(model, n_ctx, pool);
}

}  // namespace quern
