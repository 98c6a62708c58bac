#include "server/embeddings.h"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "chat/chat.h"
#include "server/api.h"
#include "tokenizer/tokenizer.h"

namespace quern::server {

namespace {

using Json = nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& param, const std::string& msg) { throw ApiError(400, msg, param); }

constexpr size_t kMaxInputs = 2048;  // as OpenAI's limit per request

std::string base64_of(const std::vector<float>& v) {
    static const char* digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string bytes(v.size() * sizeof(float), '\0');
    std::memcpy(bytes.data(), v.data(), bytes.size());  // little-endian hosts: the float32 bytes as they are
    std::string out;
    for (size_t i = 0; i < bytes.size(); i += 3) {
        uint32_t w = static_cast<uint8_t>(bytes[i]) << 16;
        if (i + 1 < bytes.size()) w |= static_cast<uint8_t>(bytes[i + 1]) << 8;
        if (i + 2 < bytes.size()) w |= static_cast<uint8_t>(bytes[i + 2]);
        out += digits[(w >> 18) & 63];
        out += digits[(w >> 12) & 63];
        out += i + 1 < bytes.size() ? digits[(w >> 6) & 63] : '=';
        out += i + 2 < bytes.size() ? digits[w & 63] : '=';
    }
    return out;
}

}  // namespace

static EmbeddingRequest parse_embeddings_request_unguarded(const Json& body, const Tokenizer& tok, int64_t n_ctx, int64_t n_embd) {
    EmbeddingRequest r;
    if (body.contains("model") && body["model"].is_string()) r.model = body["model"].get<std::string>();
    if (!body.contains("input")) bad("input", "'input' is required: a string, a list of strings or of token ids");
    const Json& in = body["input"];
    const auto ids_of = [&](const Json& list, const std::string& where) {
        std::vector<int32_t> ids;
        for (const Json& t : list) {
            if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.n_vocab())
                bad("input", fmt::format("'{}' must hold token ids from 0 to {}", where, tok.n_vocab() - 1));
            ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
        }
        return ids;
    };
    if (in.is_string()) {
        r.inputs.push_back(tok.encode_prompt(in.get<std::string>(), true));
    } else if (in.is_array() && !in.empty() && in[0].is_number_integer()) {
        r.inputs.push_back(ids_of(in, "input"));
    } else if (in.is_array() && !in.empty()) {
        for (size_t i = 0; i < in.size(); ++i) {
            if (in[i].is_string()) r.inputs.push_back(tok.encode_prompt(in[i].get<std::string>(), true));
            else if (in[i].is_array()) r.inputs.push_back(ids_of(in[i], fmt::format("input[{}]", i)));
            else bad("input", "'input' must be a string, a list of strings, a list of token ids or a list of such lists");
        }
    } else {
        bad("input", "'input' must be a string, a non-empty list of strings, token ids or lists of token ids");
    }
    if (r.inputs.size() > kMaxInputs) bad("input", fmt::format("'input' holds {} inputs; at most {}", r.inputs.size(), kMaxInputs));
    for (size_t i = 0; i < r.inputs.size(); ++i) {
        if (r.inputs[i].empty()) bad("input", fmt::format("input {} is empty (it gives no tokens)", i));
        if (static_cast<int64_t>(r.inputs[i].size()) > n_ctx)
            bad("input", fmt::format("input {} has {} tokens; this server's context holds {} (restart quern serve "
                                     "with a larger -c, or shorten it)",
                                     i, r.inputs[i].size(), n_ctx));
    }
    if (body.contains("encoding_format") && !body["encoding_format"].is_null()) {
        const Json& f = body["encoding_format"];
        if (f != "float" && f != "base64") bad("encoding_format", "'encoding_format' may be float or base64");
        r.base64 = f == "base64";
    }
    if (body.contains("dimensions") && !body["dimensions"].is_null()) {
        const Json& d = body["dimensions"];
        if (!d.is_number_integer() || d.get<int64_t>() < 1 || d.get<int64_t>() > n_embd)
            bad("dimensions", fmt::format("'dimensions' must be an integer from 1 to {} (the model's width)", n_embd));
        r.dimensions = d.get<int64_t>();
    }
    return r;
}

EmbeddingRequest parse_embeddings_request(const Json& body, const Tokenizer& tok, int64_t n_ctx, int64_t n_embd) {
    return parse_or_400(body, [&] { return parse_embeddings_request_unguarded(body, tok, n_ctx, n_embd); });
}

Json embeddings_response_json(const EmbeddingRequest& req, const std::string& model_id, std::vector<std::vector<float>> vectors) {
    Json data = Json::array();
    int64_t tokens = 0;
    for (size_t i = 0; i < vectors.size(); ++i) {
        std::vector<float>& v = vectors[i];
        if (req.dimensions > 0 && static_cast<int64_t>(v.size()) > req.dimensions) {
            // Matryoshka-style: the leading dimensions, back to unit length.
            v.resize(static_cast<size_t>(req.dimensions));
            double n = 0;
            for (float x : v) n += static_cast<double>(x) * x;
            if (n > 0)
                for (float& x : v) x = static_cast<float>(x / std::sqrt(n));
        }
        data.push_back(Json{{"object", "embedding"}, {"index", i}, {"embedding", req.base64 ? Json(base64_of(v)) : Json(v)}});
        tokens += static_cast<int64_t>(req.inputs[i].size());
    }
    return Json{{"object", "list"},
                {"data", std::move(data)},
                {"model", model_id},
                {"usage", Json{{"prompt_tokens", tokens}, {"total_tokens", tokens}}}};
}

}  // namespace quern::server
