// libFuzzer harness: the input as text through three tokenizers (GPT-2's
// byte-level BPE, LLaMA's SentencePiece, Phi-3's) with and without special
// tokens parsed, and back through decode. Nothing may crash or trip a
// sanitizer, whatever the bytes (invalid UTF-8 included).
#include "core/error.h"
#include "tokenizer/tokenizer.h"

#ifndef QUERN_TESTDATA_DIR
#error "QUERN_TESTDATA_DIR must name ../shared/testdata"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace quern;
    static const auto toks = [] {
        std::vector<std::unique_ptr<Tokenizer>> t;
        for (const char* name : {"gpt-2", "llama-spm", "phi-3"})
            t.push_back(Tokenizer::from_file(std::string(QUERN_TESTDATA_DIR) + "/vocab/ggml-vocab-" + name + ".gguf"));
        return t;
    }();
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    for (const auto& tok : toks) {
        for (const bool special : {false, true}) {
            const std::vector<int32_t> ids = tok->encode(text, special, special);
            (void)tok->decode(ids, special);
        }
        (void)tok->encode_prompt(text, true);
    }
    return 0;
}
