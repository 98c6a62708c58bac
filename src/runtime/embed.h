// Embeddings: a text's vector from the model's rows after the output norm
// (Model::embedding_program), pooled as the model declares
// ({arch}.pooling_type) and L2-normalized, as OpenAI's /v1/embeddings returns
// them and as llama.cpp's llama-embedding computes them.
#pragma once
#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "model/model.h"

namespace quern {

/// How a text's rows become one vector.
enum class Pooling { Mean, Cls, Last };

/// The model's pooling (ModelConfig::pooling_type: mean, cls or last);
/// none, rank or unset: last — a decoder's last row is the one that has seen
/// the whole text (as Qwen3-Embedding and e5-mistral pool).
Pooling pooling_of(const ModelConfig& c);

/// The embedding of `tokens` (n_embd floats, unit length): the rows of one
/// CPU pass pooled. quern::Error for an empty input or an id outside the
/// vocabulary.
std::vector<float> embed(const Model& model, const std::vector<int32_t>& tokens, Pooling pooling, ThreadPool& pool);

}  // namespace quern
