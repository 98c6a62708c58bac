// quern tokenize: text to token ids with a model's tokenizer (only the GGUF
// metadata is read; no weights are loaded).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

struct TokenizeOptions {
    std::string model;
    std::string prompt;
    bool no_bos = false;
    bool parse_special = false;
    bool jsonl = false;
};

void write_ids(const std::vector<int32_t>& ids) {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i) line += ' ';
        line += std::to_string(ids[i]);
    }
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), stdout);
}

void run_tokenize(const TokenizeOptions& o, bool have_prompt) {
    const quern::GgufFile f(quern::cli::resolve_model_path(o.model));
    const auto tok = quern::Tokenizer::from_gguf(f);
    const bool add_special = !o.no_bos;

    if (o.jsonl) {
        std::string line;
        for (size_t n = 1; std::getline(std::cin, line); ++n) {
            if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
            nlohmann::json in;
            try {
                in = nlohmann::json::parse(line);
            } catch (const nlohmann::json::exception& e) {
                quern::fail("stdin line {}: not valid JSON ({})", n, e.what());
            }
            if (!in.is_string()) quern::fail("stdin line {}: expected a JSON string, got {}", n, in.type_name());
            const auto ids = tok->encode(in.get_ref<const std::string&>(), add_special, o.parse_special);
            const std::string out = nlohmann::json(ids).dump() + "\n";
            std::fwrite(out.data(), 1, out.size(), stdout);
        }
        return;
    }
    if (have_prompt) {
        write_ids(tok->encode(o.prompt, add_special, o.parse_special));
        return;
    }
    // No -p: the whole of stdin is one text.
    const std::string text{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
    write_ids(tok->encode(text, add_special, o.parse_special));
}

}  // namespace

/// Registers `quern tokenize`.
void add_tokenize_command(CLI::App& app) {
    auto opts = std::make_shared<TokenizeOptions>();
    CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids of a text");
    cmd->add_option("-m,--model", opts->model, "Path to a .gguf file (default: $QUERN_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf)");
    auto* p = cmd->add_option("-p,--prompt", opts->prompt, "Text to tokenize (default: all of stdin)");
    auto* j = cmd->add_flag("--jsonl", opts->jsonl,
                            "Read one JSON string per stdin line, write one JSON array of ids per line");
    p->excludes(j);
    cmd->add_flag("--no-bos", opts->no_bos, "Do not add BOS/EOS even when the model's tokenizer asks for them");
    cmd->add_flag("--parse-special", opts->parse_special,
                  "Turn control-token text such as <|im_start|> into those tokens");
    cmd->footer(
        "Examples:\n"
        "  quern tokenize -p 'Hello, world!'\n"
        "  quern tokenize -m model.gguf --parse-special -p '<|im_start|>user\\nHi<|im_end|>'\n"
        "  printf '\"first text\"\\n\"second\"\\n' | quern tokenize --jsonl\n"
        "  quern tokenize --no-bos < document.txt | wc -w      # count tokens");
    cmd->callback([opts, p] {
        try {
            run_tokenize(*opts, p->count() > 0);
        } catch (const quern::Error& e) {
            std::fprintf(stderr, "quern tokenize: %s\n", e.what());
            throw CLI::RuntimeError(1);
        }
    });
}
