// quern tokenize: text to token ids with a model's tokenizer (only the GGUF
// metadata, or a Hugging Face tokenizer.json, is read; no weights are loaded).
// --bench FILE measures encoding throughput on one core.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace {

struct TokenizeOptions {
    std::string model;
    std::string prompt;
    std::string pre;
    std::string bench_file;
    int bench_runs = 7;
    double bench_mb = 4.0;
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

// Text of one --jsonl input line: a JSON string, or {"text": ...}, or
// {"hex": "..."} for bytes that are not valid UTF-8 (JSON cannot carry them).
std::string jsonl_text(const nlohmann::json& in, size_t n) {
    if (in.is_string()) return in.get<std::string>();
    if (in.is_object() && in.contains("text") && in["text"].is_string()) return in["text"].get<std::string>();
    if (in.is_object() && in.contains("hex") && in["hex"].is_string()) {
        const std::string& h = in["hex"].get_ref<const std::string&>();
        if (h.size() % 2) quern::fail("stdin line {}: \"hex\" has an odd number of digits", n);
        auto digit = [&](char c) -> int {
            if (c >= '0' && c <= '9') return c - '0';
            if (c >= 'a' && c <= 'f') return c - 'a' + 10;
            if (c >= 'A' && c <= 'F') return c - 'A' + 10;
            quern::fail("stdin line {}: \"hex\" has a non-hex character", n);
        };
        std::string out;
        out.reserve(h.size() / 2);
        for (size_t i = 0; i < h.size(); i += 2) out += static_cast<char>(digit(h[i]) * 16 + digit(h[i + 1]));
        return out;
    }
    quern::fail("stdin line {}: expected a JSON string, {{\"text\": ...}} or {{\"hex\": ...}}, got {}", n,
                in.type_name());
}

std::unique_ptr<quern::Tokenizer> load_tokenizer(const TokenizeOptions& o) {
    if (!o.pre.empty() && quern::PreTokenizer::family_steps(o.pre).empty()) {
        std::string names;
        for (const std::string& n : quern::PreTokenizer::known_names()) names += (names.empty() ? "" : ", ") + n;
        quern::fail("unknown pre-tokenizer '{}' for --pre; known: {}", o.pre, names);
    }
    const std::string path = quern::cli::resolve_model_path(o.model);
    if (o.pre.empty()) return quern::Tokenizer::from_file(path);
    if (std::filesystem::is_directory(path) || std::filesystem::path(path).extension() == ".json")
        quern::fail("--pre applies to GGUF vocabularies only (a tokenizer.json names its own pre-tokenizer)");
    quern::VocabData d = quern::Tokenizer::vocab_from_gguf(quern::GgufFile(path));
    d.pre = o.pre;
    return std::make_unique<quern::Tokenizer>(std::move(d));
}

void run_bench(const quern::Tokenizer& tok, const TokenizeOptions& o) {
    std::ifstream f(o.bench_file, std::ios::binary);
    if (!f) quern::fail("cannot read {}", o.bench_file);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string one = ss.str();
    if (one.empty()) quern::fail("{} is empty", o.bench_file);
    const auto copies = static_cast<size_t>(std::max(1.0, o.bench_mb * 1e6 / static_cast<double>(one.size())));
    std::string text;
    text.reserve(one.size() * copies);
    for (size_t i = 0; i < copies; ++i) text += one;
    const bool add_special = !o.no_bos;

    // Cold: fresh caches, one copy of the file.
    tok.clear_caches();
    double t0 = quern::cli::now_seconds();
    const size_t cold_tokens = tok.encode(one, add_special, o.parse_special).size();
    const double cold_s = quern::cli::now_seconds() - t0;

    std::vector<double> mbs;
    size_t n_tokens = 0;
    for (int r = 0; r < std::max(1, o.bench_runs); ++r) {
        t0 = quern::cli::now_seconds();
        n_tokens = tok.encode(text, add_special, o.parse_special).size();
        const double s = quern::cli::now_seconds() - t0;
        mbs.push_back(static_cast<double>(text.size()) / s / 1e6);
    }
    std::vector<double> sorted = mbs;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    std::printf("tokenizer: %s, %s, %d tokens in the vocabulary\n",
                tok.kind() == quern::VocabKind::Bpe      ? "byte-level BPE"
                : tok.kind() == quern::VocabKind::Spm    ? "SentencePiece (scores)"
                                                         : "SentencePiece-style BPE (ranks)",
                tok.pre_family().empty() ? "no pre-tokenizer" : ("pre-tokenizer " + tok.pre_family()).c_str(),
                tok.n_vocab());
    std::printf("text: %s, %zu bytes x %zu = %.2f MB, %zu tokens (%.2f bytes/token)\n", o.bench_file.c_str(),
                one.size(), copies, static_cast<double>(text.size()) / 1e6, n_tokens,
                static_cast<double>(text.size()) / static_cast<double>(std::max<size_t>(n_tokens, 1)));
    std::printf("runs (MB/s):");
    for (double m : mbs) std::printf(" %.1f", m);
    std::printf("\nmedian: %.1f MB/s, %.2f M tokens/s (one thread)\n", median,
                median * 1e6 / (static_cast<double>(text.size()) / static_cast<double>(std::max<size_t>(n_tokens, 1))) /
                    1e6);
    std::printf("cold (empty word cache, one copy): %.1f MB/s, %zu tokens\n",
                static_cast<double>(one.size()) / cold_s / 1e6, cold_tokens);
}

void run_tokenize(const TokenizeOptions& o, bool have_prompt) {
    const auto tok = load_tokenizer(o);
    if (!o.bench_file.empty()) {
        run_bench(*tok, o);
        return;
    }
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
            const auto ids = tok->encode(jsonl_text(in, n), add_special, o.parse_special);
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
    cmd->add_option("-m,--model", opts->model,
                    "A .gguf file, a Hugging Face tokenizer.json, or a folder holding one (default: "
                    "$QUERN_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf)");
    auto* p = cmd->add_option("-p,--prompt", opts->prompt, "Text to tokenize (default: all of stdin)");
    auto* j = cmd->add_flag("--jsonl", opts->jsonl,
                            "Read one JSON string (or {\"hex\": BYTES}) per stdin line, write one JSON array of ids "
                            "per line");
    p->excludes(j);
    cmd->add_flag("--no-bos", opts->no_bos, "Do not add BOS/EOS even when the model's tokenizer asks for them");
    cmd->add_flag("--parse-special", opts->parse_special,
                  "Turn control-token text such as <|im_start|> into those tokens");
    cmd->add_option("--pre", opts->pre,
                    "Use this tokenizer.ggml.pre pre-tokenizer instead of the GGUF's own (testing a family's "
                    "regexes with another vocabulary); an unknown name is refused with the list of known ones");
    auto* b = cmd->add_option("--bench", opts->bench_file,
                              "Measure encoding throughput on this text file (one thread) instead of printing ids");
    b->excludes(p);
    b->excludes(j);
    cmd->add_option("--bench-runs", opts->bench_runs, "Timed runs for --bench (median reported)")->capture_default_str();
    cmd->add_option("--bench-mb", opts->bench_mb, "Repeat the --bench text to about this many MB")
        ->capture_default_str();
    cmd->footer(
        "Examples:\n"
        "  quern tokenize -p 'Hello, world!'\n"
        "  quern tokenize -m model.gguf --parse-special -p '<|im_start|>user\\nHi<|im_end|>'\n"
        "  quern tokenize -m path/to/hf-model/ -p 'Hello'           # tokenizer.json + tokenizer_config.json\n"
        "  printf '\"first text\"\\n{\"hex\": \"e282ac41\"}\\n' | quern tokenize --jsonl\n"
        "  quern tokenize --no-bos < document.txt | wc -w      # count tokens\n"
        "  quern tokenize -m model.gguf --bench tests/data/genesis-kjv.txt");
    cmd->callback([opts, p] {
        try {
            run_tokenize(*opts, p->count() > 0);
        } catch (const quern::Error& e) {
            std::fprintf(stderr, "quern tokenize: %s\n", e.what());
            throw CLI::RuntimeError(1);
        }
    });
}
