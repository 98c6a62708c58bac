// quern inspect MODEL: prints a GGUF file's or a safetensors checkpoint's
// metadata, tensor table and totals.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "formats/gguf_inspect.h"
#include "formats/safetensors.h"
#include "formats/safetensors_inspect.h"

namespace {

struct InspectOptions {
    std::string model;
    bool json = false;
    bool full = false;
    size_t items = 5;
};

void print(const std::string& s) { std::fwrite(s.data(), 1, s.size(), stdout); }

void run_inspect(const InspectOptions& o) {
    if (quern::looks_like_safetensors(o.model)) {
        const auto m = quern::SafetensorsModel::open(o.model);
        if (o.json)
            print(quern::safetensors_inspect_json(m).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) +
                  "\n");
        else
            print(quern::safetensors_inspect_text(m));
        return;
    }
    const quern::GgufFile f(o.model);
    const size_t items = o.full ? SIZE_MAX : o.items;
    if (o.json) {
        const std::string s = quern::gguf_inspect_json(f, items).dump(2, ' ', false,
                                                                      nlohmann::json::error_handler_t::replace);
        std::fwrite(s.data(), 1, s.size(), stdout);
        std::fputc('\n', stdout);
    } else {
        const std::string s = quern::gguf_inspect_text(f, items);
        std::fwrite(s.data(), 1, s.size(), stdout);
    }
}

}  // namespace

/// Registers `quern inspect`.
void add_inspect_command(CLI::App& app) {
    auto opts = std::make_shared<InspectOptions>();
    CLI::App* cmd =
        app.add_subcommand("inspect", "Show a GGUF file's or a safetensors checkpoint's metadata, tensors and totals");
    cmd->add_option("MODEL", opts->model,
                    "A .gguf file, a .safetensors file, a model.safetensors.index.json, or a Hugging Face model "
                    "folder (its index or model.safetensors)")
        ->required();
    cmd->add_flag("--json", opts->json, "Print the report as JSON");
    cmd->add_flag("--full", opts->full, "Do not abbreviate arrays (GGUF)");
    cmd->add_option("--items", opts->items, "Array items shown before abbreviating (GGUF)")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 30, "1 or more"));
    cmd->footer(
        "Examples:\n"
        "  quern inspect ~/.cache/quern/models/SmolLM2-135M-Instruct.Q4_1.gguf\n"
        "  quern inspect model.gguf --json --full | jq '.metadata[] | select(.key == \"tokenizer.ggml.model\")'\n"
        "  quern inspect ~/models/Qwen2.5-0.5B            # a folder: model.safetensors or its sharded index\n"
        "  quern inspect model.safetensors --json | jq '.totals'\n"
        "GGUF shapes are listed innermost first (as GGUF stores them); safetensors shapes as stored,\n"
        "outermost first (PyTorch's order; --json adds \"ne\", innermost first).");
    cmd->callback([opts] {
        try {
            run_inspect(*opts);
        } catch (const quern::Error& e) {
            std::fprintf(stderr, "quern inspect: %s\n", e.what());
            throw CLI::RuntimeError(1);
        }
    });
}
