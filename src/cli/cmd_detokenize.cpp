// quern detokenize: token ids back to text with a model's tokenizer (only the
// GGUF metadata, or a Hugging Face tokenizer.json, is read).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

struct DetokenizeOptions {
    std::string model;
    std::string ids;
    bool skip_special = false;
    bool jsonl = false;
};

void check_id(const quern::Tokenizer& tok, long long id, size_t line) {
    if (id < 0 || id >= tok.n_vocab())
        quern::fail("{}token id {} is out of range (the vocabulary has {} tokens)",
                    line ? fmt::format("stdin line {}: ", line) : std::string(), id, tok.n_vocab());
}

// Streams ids separated by white space (commas and brackets are ignored too)
// through the UTF-8-safe detokenizer, writing text as it becomes complete.
void stream_ids(const quern::Tokenizer& tok, std::istream& in, bool render_special) {
    quern::Detokenizer detok(tok, render_special, /*starts_text=*/true);
    std::string number;
    auto emit = [&] {
        if (number.empty()) return;
        long long id = 0;
        try {
            size_t used = 0;
            id = std::stoll(number, &used);
            if (used != number.size()) throw std::invalid_argument(number);
        } catch (const std::exception&) {
            quern::fail("'{}' is not a token id", number);
        }
        number.clear();
        check_id(tok, id, 0);
        const std::string out = detok.push(static_cast<int32_t>(id));
        std::fwrite(out.data(), 1, out.size(), stdout);
    };
    for (char c; in.get(c);) {
        if (c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == ',' || c == '[' || c == ']') {
            emit();
        } else {
            number += c;
        }
    }
    emit();
    const std::string rest = detok.flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
}

std::string to_hex(const std::string& s) {
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (char c : s) {
        out += digits[static_cast<uint8_t>(c) >> 4];
        out += digits[static_cast<uint8_t>(c) & 15];
    }
    return out;
}

void run_detokenize(const DetokenizeOptions& o, bool have_ids) {
    const auto tok = quern::Tokenizer::from_file(quern::cli::resolve_model_path(o.model));
    const bool render = !o.skip_special;
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
            if (!in.is_array()) quern::fail("stdin line {}: expected a JSON array of ids, got {}", n, in.type_name());
            std::vector<int32_t> ids;
            for (const auto& v : in) {
                if (!v.is_number_integer()) quern::fail("stdin line {}: ids must be integers", n);
                check_id(*tok, v.get<long long>(), n);
                ids.push_back(v.get<int32_t>());
            }
            const std::string text = tok->decode(ids, render);
            // Text that is not valid UTF-8 (a split character) cannot be a JSON string.
            const nlohmann::json out =
                quern::unicode::utf8_valid(text) ? nlohmann::json(text) : nlohmann::json{{"hex", to_hex(text)}};
            const std::string s = out.dump() + "\n";
            std::fwrite(s.data(), 1, s.size(), stdout);
        }
        return;
    }
    if (have_ids) {
        std::istringstream in(o.ids);
        stream_ids(*tok, in, render);
        return;
    }
    stream_ids(*tok, std::cin, render);
}

}  // namespace

/// Registers `quern detokenize`.
void add_detokenize_command(CLI::App& app) {
    auto opts = std::make_shared<DetokenizeOptions>();
    CLI::App* cmd = app.add_subcommand("detokenize", "Print the text of token ids");
    cmd->add_option("-m,--model", opts->model,
                    "A .gguf file, a Hugging Face tokenizer.json, or a folder holding one (default: "
                    "$QUERN_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf)");
    auto* p = cmd->add_option("-p,--ids", opts->ids, "Ids to decode, e.g. '19556 28 905' (default: read stdin)");
    auto* j = cmd->add_flag("--jsonl", opts->jsonl,
                            "Read one JSON array of ids per stdin line, write one JSON string per line "
                            "({\"hex\": BYTES} when the text is not valid UTF-8)");
    p->excludes(j);
    cmd->add_flag("--skip-special", opts->skip_special, "Leave out control tokens such as <s> and <|im_end|>");
    cmd->footer(
        "Ids are separated by white space (commas and brackets are ignored), so the output of\n"
        "`quern tokenize` can be piped in. Text is written as soon as each character is complete.\n"
        "Examples:\n"
        "  quern detokenize -p '19556 28 905 17'\n"
        "  quern tokenize --no-bos -p 'Hello, world!' | quern detokenize\n"
        "  printf '[19556, 28]\\n[905]\\n' | quern detokenize --jsonl");
    cmd->callback([opts, p] {
        try {
            run_detokenize(*opts, p->count() > 0);
        } catch (const quern::Error& e) {
            std::fflush(stdout);
            std::fprintf(stderr, "quern detokenize: %s\n", e.what());
            throw CLI::RuntimeError(1);
        }
    });
}
