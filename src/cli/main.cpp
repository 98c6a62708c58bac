// quern: command-line entry point. Each subcommand lives in its own cmd_*.cpp.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
    CLI::App app{"quern — a large-language-model inference engine (GGUF models on the CPU or an NVIDIA GPU; an OpenAI-compatible server)"};
    app.set_version_flag("--version", QUERN_VERSION);
    app.require_subcommand(1);
    app.footer(
        "Examples:\n"
        "  quern run -p \"The capital of France is\" -n 32 --temp 0\n"
        "  quern bench -p 512 -n 128 -r 5\n"
        "  quern perplexity -f tests/data/genesis-kjv.txt -c 512\n"
        "  quern inspect ~/.cache/quern/models/SmolLM2-135M-Instruct.Q4_1.gguf\n"
        "  quern quantize model-f16.gguf model-q4_k_m.gguf Q4_K_M\n"
        "  quern serve --port 8080             # then open http://127.0.0.1:8080/ for the web chat\n"
        "Run 'quern COMMAND --help' for the options of a command.");
    add_run_command(app);
    add_inspect_command(app);
    add_perplexity_command(app);
    add_bench_command(app);
    add_synth_command(app);
    add_imatrix_command(app);
    add_quantize_command(app);
    add_tokenize_command(app);
    add_detokenize_command(app);
    add_template_command(app);
    add_chat_command(app);
    add_serve_command(app);
    try {
        try {
            app.parse(argc, argv);
        } catch (const CLI::RequiredError& e) {
            // "quern frobnicate": say which command is unknown rather than that one is required.
            // (A known command missing one of its own arguments gets CLI11's message.)
            bool known = false;
            if (argc > 1)
                for (const CLI::App* sc : app.get_subcommands([](CLI::App*) { return true; }))
                    known = known || sc->get_name() == argv[1];
            if (argc > 1 && argv[1][0] != '-' && !known) {
                std::fprintf(stderr, "quern: error: unknown command '%s' (see quern --help)\n", argv[1]);
                return 2;
            }
            return app.exit(e);
        } catch (const CLI::ParseError& e) {
            return app.exit(e);
        }
    } catch (const quern::Error& e) {
        std::fprintf(stderr, "quern: error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "quern: error: out of memory\n");
        return 1;
    }
    return 0;
}
