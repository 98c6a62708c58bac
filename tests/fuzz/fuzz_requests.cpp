// libFuzzer harness: the input as a request body through every API parser
// quern serve has (chat completions, completions, Anthropic Messages and
// count_tokens, Responses, embeddings). A body that is not JSON, or not a
// valid request, must end in an ApiError (a 4xx), never anything else.
#include "core/error.h"
#include "server/anthropic.h"
#include "server/api.h"
#include "server/embeddings.h"
#include "server/responses.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace quern;
    using namespace quern::server;
    static const auto tok =
        Tokenizer::from_file(std::string(QUERN_TESTDATA_DIR) + "/vocab/ggml-vocab-gpt-2.gguf");
    static const SamplingParams defaults = api_default_sampling();
    const Json body = Json::parse(std::string_view(reinterpret_cast<const char*>(data), size), nullptr, false);
    if (body.is_discarded()) return 0;
    const int32_t n_vocab = tok->n_vocab();
    const auto attempt = [](auto&& parse) {
        try {
            parse();
        } catch (const ApiError&) {
        }
    };
    attempt([&] { (void)parse_chat_request(body, n_vocab, defaults); });
    attempt([&] { (void)parse_completion_request(body, n_vocab, defaults); });
    attempt([&] { (void)parse_messages_request(body, n_vocab, defaults); });
    attempt([&] { (void)parse_messages_request(body, n_vocab, defaults, true); });
    attempt([&] { (void)parse_responses_request(body, n_vocab, defaults, nullptr); });
    attempt([&] { (void)parse_embeddings_request(body, *tok, 4096, 64); });
    return 0;
}
