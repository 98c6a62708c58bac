#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace quern::server {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double x) {
    const size_t b = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), x) - bounds_.begin());
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_[b];
    sum_ += x;
    ++count_;
}

uint64_t Histogram::count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
    std::lock_guard<std::mutex> lock(mu_);
    out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    uint64_t cum = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
        cum += counts_[i];
        out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
    }
    cum += counts_.back();
    out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, sum_, name, count_);
}

Metrics::Metrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5}),
      e2e_({0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320}) {}

void Metrics::count_request(const std::string& endpoint, int status) {
    std::lock_guard<std::mutex> lock(mu_);
    ++requests_[{endpoint, status}];
}

void Metrics::count_finish(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    ++finishes_[reason];
}

std::string Metrics::render(const EngineStats& s, const EngineOptions& o, int in_flight) const {
    std::string out;
    auto counter = [&](const char* name, const char* help, int64_t v) {
        out += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
    };
    auto gauge = [&](const char* name, const char* help, double v) {
        out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
    };
    {
        std::lock_guard<std::mutex> lock(mu_);
        out += "# HELP quern_requests_total Completion requests answered, by endpoint and HTTP status (499: the client went away)\n"
               "# TYPE quern_requests_total counter\n";
        for (const auto& [k, v] : requests_)
            out += fmt::format("quern_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", k.first, k.second, v);
        out += "# HELP quern_finish_total Generated choices by finish reason\n# TYPE quern_finish_total counter\n";
        for (const auto& [k, v] : finishes_) out += fmt::format("quern_finish_total{{reason=\"{}\"}} {}\n", k, v);
    }
    counter("quern_prompt_tokens_total", "Prompt tokens of finished engine requests", s.prompt_tokens);
    counter("quern_prompt_tokens_cached_total", "Prompt tokens whose keys/values came from the prefix cache",
            s.prompt_tokens_cached);
    counter("quern_generation_tokens_total", "Generated tokens", s.generated_tokens);
    counter("quern_engine_requests_finished_total", "Engine requests (choices) finished", s.requests_finished);
    counter("quern_engine_steps_total", "Batched forward steps", s.steps);
    counter("quern_engine_preemptions_total", "Sequences whose KV blocks were taken for older ones (recomputed later)",
            s.preemptions);
    counter("quern_spec_draft_tokens_total", "Tokens the draft head proposed (speculative decoding, --spec)",
            s.spec_drafted);
    counter("quern_spec_accepted_tokens_total", "Of those, the tokens the model kept", s.spec_accepted);
    gauge("quern_requests_running", "Sequences running in the engine now", s.running);
    gauge("quern_requests_waiting", "Sequences waiting in the engine queue now", s.waiting);
    gauge("quern_http_requests_in_flight", "Generation requests being answered now", in_flight);
    gauge("quern_kv_cache_tokens_used", "KV-cache positions in use", static_cast<double>(s.kv_tokens_used));
    gauge("quern_kv_cache_tokens_total", "KV-cache positions in all", static_cast<double>(s.kv_tokens_total));
    gauge("quern_kv_cache_usage_ratio", "Fraction of the KV cache in use",
          s.kv_tokens_total > 0 ? static_cast<double>(s.kv_tokens_used) / static_cast<double>(s.kv_tokens_total) : 0.0);
    gauge("quern_context_size", "Context size per sequence (tokens)", static_cast<double>(o.n_ctx));
    gauge("quern_parallel", "Sequences that run at once at most", o.n_parallel);
    gauge("quern_max_queue", "Waiting requests beyond which the server answers 429", o.max_queue);
    ttft_.render(out, "quern_time_to_first_token_seconds", "Time from a request's arrival to its first token");
    itl_.render(out, "quern_inter_token_latency_seconds", "Time between consecutive tokens of a sequence");
    e2e_.render(out, "quern_request_duration_seconds", "Time from a request's arrival to its last byte");
    return out;
}

}  // namespace quern::server
