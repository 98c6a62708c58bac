#include "runtime/embed.h"

#include <cmath>

#include "backend/cpu/executor.h"
#include "core/error.h"
#include "runtime/session.h"

namespace quern {

Pooling pooling_of(const ModelConfig& c) {
    switch (c.pooling_type) {
        case 1: return Pooling::Mean;
        case 2: return Pooling::Cls;
        default: return Pooling::Last;
    }
}

std::vector<float> embed(const Model& model, const std::vector<int32_t>& tokens, Pooling pooling, ThreadPool& pool) {
    if (tokens.empty()) fail("embeddings: the input has no tokens");
    const auto n = static_cast<int64_t>(tokens.size());
    const int64_t E = model.config().n_embd;
    // A session of just this text: its KV cache lives as long as the call.
    auto session = make_executor_session(model, cpu::make_executor(model.embedding_program(), model.options(), pool), n);
    std::vector<float> rows(static_cast<size_t>(n * E));
    session->eval_rows(tokens.data(), n, nullptr, false, rows.data());
    std::vector<float> v(static_cast<size_t>(E), 0.0f);
    if (pooling == Pooling::Mean) {
        for (int64_t t = 0; t < n; ++t)
            for (int64_t i = 0; i < E; ++i) v[static_cast<size_t>(i)] += rows[static_cast<size_t>(t * E + i)];
        for (float& x : v) x /= static_cast<float>(n);
    } else {
        const int64_t t = pooling == Pooling::Cls ? 0 : n - 1;
        std::copy_n(rows.begin() + t * E, E, v.begin());
    }
    double norm = 0;
    for (float x : v) norm += static_cast<double>(x) * x;
    const auto inv = static_cast<float>(norm > 0 ? 1.0 / std::sqrt(norm) : 0.0);
    for (float& x : v) x *= inv;
    return v;
}

}  // namespace quern
