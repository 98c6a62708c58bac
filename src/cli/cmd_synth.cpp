// quern synth: write a synthetic model (named shape, random weights in exact
// block layouts, a byte-level tokenizer) as a GGUF file other engines load too.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "model/synth.h"

namespace quern::cli {
namespace {

struct SynthOptions {
    std::string preset;
    std::string quant = "Q4_K_M";
    std::string out;
    uint64_t seed = 1234;
    bool list = false;
    bool tiny = false;
};

void synth(const SynthOptions& o) {
    if (o.list || o.preset.empty()) {
        for (const auto& p : synth_presets())
            std::printf("%-14s %-10s %s\n", p.name.c_str(), p.cfg.arch.c_str(), p.description.c_str());
        return;
    }
    if (o.out.empty()) fail("give the output file with -o FILE.gguf");
    const std::string quant = synth_scheme(o.quant, true);  // before any work: GGUF cannot hold quern's own types
    const SynthPreset p = o.tiny ? synth_tiny(synth_preset(o.preset)) : synth_preset(o.preset);
    const bool tty = stderr_is_tty();
    SynthModel m = make_synthetic(p, quant, o.seed, [&](int64_t d, int64_t t) {
        if (tty) std::fprintf(stderr, "\rquern: building weights %lld/%lld", static_cast<long long>(d), static_cast<long long>(t));
    });
    if (tty) std::fputc('\n', stderr);
    write_synthetic_gguf(m, o.out, [&](uint64_t d, uint64_t t) {
        if (tty) std::fprintf(stderr, "\rquern: writing %s %.0f%%", o.out.c_str(), 100.0 * static_cast<double>(d) / static_cast<double>(t));
    });
    if (tty) std::fputc('\n', stderr);
    uint64_t bytes = 0;
    int64_t params = 0;
    for (const auto& [n, t] : m.weights.all()) {
        bytes += t.nbytes();
        params += t.nelements();
    }
    std::fprintf(stderr, "quern: wrote %s: %s %s, %.2f M params, %.2f MiB of weights\n", o.out.c_str(), p.name.c_str(),
                 quant.c_str(), params / 1e6, bytes / 1048576.0);
}

}  // namespace
}  // namespace quern::cli

void add_synth_command(CLI::App& app) {
    using namespace quern::cli;
    auto o = std::make_shared<SynthOptions>();
    CLI::App* cmd = app.add_subcommand("synth", "Write a synthetic model (random weights, real shape) as GGUF");
    std::string names;  // from the table, so the help never falls behind it
    for (const quern::SynthPreset& p : quern::synth_presets()) names += (names.empty() ? "" : ", ") + p.name;
    cmd->add_option("preset", o->preset, "Shape: " + names + " (none: list them)");
    cmd->add_option("--quant", o->quant,
                    "Weight type, in any case: a block type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K ... Q6_K, F16, BF16, F32) "
                    "or a mix, Q4_K_M / Q5_K_M")
        ->capture_default_str();
    cmd->add_option("-o,--output", o->out, "Output GGUF file");
    cmd->add_option("--seed", o->seed, "Random seed for the weights")->capture_default_str();
    cmd->add_flag("--list", o->list, "List the presets (name, GGUF architecture, shape)");
    cmd->add_flag("--tiny", o->tiny,
                  "Test-sized copy of the preset: same architecture and tensor layout, vocabulary 512, width 256, "
                  "at most 6 layers");
    cmd->footer(
        "Examples:\n"
        "  quern synth --list\n"
        "  quern synth smollm2-135m --quant Q4_K_M -o smollm2-q4km.gguf\n"
        "  quern synth gemma3-270m --tiny --quant Q8_0 -o g3-tiny.gguf && quern run -m g3-tiny.gguf --device cpu -p hi\n"
        "On CUDA every preset but phi3-mini (heads of 96) runs; phi3-mini runs on the CPU.\n"
        "  quern synth llama3-8b --quant Q8_0 -o llama3-8b-q8_0.gguf && quern bench -m llama3-8b-q8_0.gguf");
    cmd->callback([o] { synth(*o); });
}
