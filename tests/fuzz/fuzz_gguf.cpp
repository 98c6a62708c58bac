// libFuzzer harness: a GGUF file as quern opens one (header, metadata,
// tensor table), then its model config and tokenizer read from it. Any
// malformed input must end in quern::Error, never a crash, a sanitizer
// report, a hang or an unbounded allocation.
#include "core/error.h"
#include "formats/gguf.h"
#include "fuzz_common.h"
#include "model/config.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace quern;
    const std::string path = fuzz::write_file("input.gguf", {reinterpret_cast<const char*>(data), size});
    try {
        const GgufFile f(path);
        try {
            (void)ModelConfig::from_gguf(f);
        } catch (const Error&) {
        }
        try {
            const auto tok = Tokenizer::from_gguf(f);
            (void)tok->decode(tok->encode("Hello, world! 123", true, true));
        } catch (const Error&) {
        }
    } catch (const Error&) {
    }
    return 0;
}
