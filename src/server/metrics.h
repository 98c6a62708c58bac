// Counters and histograms for GET /metrics, rendered in the Prometheus text
// format together with the engine's own counters (EngineStats).
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/engine.h"

namespace quern::server {

/// A cumulative histogram (Prometheus semantics: le buckets, sum, count).
class Histogram {
public:
    explicit Histogram(std::vector<double> bounds);
    void observe(double x);
    /// Appends "# HELP", "# TYPE" and the series of `name`.
    void render(std::string& out, const std::string& name, const std::string& help) const;
    uint64_t count() const;

private:
    mutable std::mutex mu_;
    std::vector<double> bounds_;
    std::vector<uint64_t> counts_;  ///< per bucket (not cumulative); last: +Inf
    double sum_ = 0;
    uint64_t count_ = 0;
};

class Metrics {
public:
    Metrics();
    /// A finished HTTP request to a generation endpoint.
    void count_request(const std::string& endpoint, int status);
    /// A finished choice: stop, length, cancelled, error.
    void count_finish(const std::string& reason);
    void observe_ttft(double seconds) { ttft_.observe(seconds); }
    void observe_itl(double seconds) { itl_.observe(seconds); }
    void observe_e2e(double seconds) { e2e_.observe(seconds); }
    /// The whole page; `in_flight`: HTTP requests being answered now.
    std::string render(const EngineStats& s, const EngineOptions& o, int in_flight) const;

private:
    mutable std::mutex mu_;
    std::map<std::pair<std::string, int>, int64_t> requests_;
    std::map<std::string, int64_t> finishes_;
    Histogram ttft_, itl_, e2e_;
};

}  // namespace quern::server
