// libFuzzer harness: a Hugging Face folder as quern loads one. The input is
// up to five files split by fuzz::kSplit: model.safetensors, config.json,
// tokenizer.json, tokenizer_config.json and generation_config.json (missing
// ones are left out). The safetensors reader, the config and tokenizer
// readers, the chat-template lookup and the whole model load each run; any
// malformed input must end in quern::Error.
#include <cstdio>

#include "core/error.h"
#include "formats/safetensors.h"
#include "fuzz_common.h"
#include "model/config.h"
#include "model/hf_model.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace quern;
    static const char* kNames[] = {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
                                   "generation_config.json"};
    const auto parts = fuzz::split(data, size, 5);
    for (size_t i = 0; i < 5; ++i) {
        const std::string path = fuzz::scratch_dir() + "/" + kNames[i];
        if (i < parts.size()) fuzz::write_file(kNames[i], parts[i]);
        else std::remove(path.c_str());
    }
    const std::string dir = fuzz::scratch_dir();
    try {
        const SafetensorsFile f(dir + "/model.safetensors");
        for (const auto& t : f.tensors()) (void)t.name;
    } catch (const Error&) {
    }
    if (parts.size() > 1) {
        try {
            (void)ModelConfig::from_hf_config(parts[1], "config.json");
        } catch (const Error&) {
        }
    }
    if (parts.size() > 2) {
        try {
            const auto tok = Tokenizer::from_file(dir);
            (void)tok->decode(tok->encode("Hello, world! 123", true, true));
        } catch (const Error&) {
        }
    }
    try {
        (void)hf_chat_templates(dir);
    } catch (const Error&) {
    }
    try {
        (void)load_hf_model(dir);
    } catch (const Error&) {
    }
    return 0;
}
