// POST /v1/embeddings in OpenAI's shape: the request's inputs as token ids,
// and the answer (vectors as floats or, as the official Python client asks
// by default, base64 of little-endian float32).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace quern {
class Tokenizer;
}

namespace quern::server {

struct EmbeddingRequest {
    std::string model;
    std::vector<std::vector<int32_t>> inputs;  ///< token ids of each input, in order
    bool base64 = false;                       ///< encoding_format "base64"
    int64_t dimensions = 0;                    ///< > 0: vectors cut to this many and renormalized
};

/// `input` (a string, a list of strings, a list of token ids or a list of
/// lists of ids; at most 2048, each 1 .. n_ctx tokens), `encoding_format`,
/// `dimensions` (1 .. n_embd), `model`, `user`. ApiError 400 naming the
/// field otherwise.
EmbeddingRequest parse_embeddings_request(const nlohmann::ordered_json& body, const Tokenizer& tok, int64_t n_ctx,
                                          int64_t n_embd);

/// The answer: a list of {"object": "embedding", "index", "embedding"}, the
/// model, and usage (prompt_tokens = total_tokens). `vectors` unit length;
/// cut to req.dimensions here.
nlohmann::ordered_json embeddings_response_json(const EmbeddingRequest& req, const std::string& model_id,
                                                std::vector<std::vector<float>> vectors);

}  // namespace quern::server
