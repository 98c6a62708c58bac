// quern perplexity: perplexity of a text file, computed as llama.cpp's
// llama-perplexity does. The whole text is tokenized once (BOS only if the
// model adds one), cut into consecutive non-overlapping chunks of n_ctx tokens;
// each chunk is evaluated from an empty cache (its first token replaced by BOS
// when the model adds BOS) and only the predictions of the second half of each
// chunk are scored, so every scored token has at least n_ctx/2 tokens of context.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "runtime/perplexity.h"

namespace quern::cli {
namespace {

struct PplOptions {
    ModelOptions mopts;
    std::string model;
    std::string file;
    int64_t n_ctx = 512;
    int64_t max_chunks = -1;
    int threads = 0;
    bool json = false;
};

void perplexity(const PplOptions& o) {
    const std::string text = read_input_file(o.file, "text file");
    const std::string name = o.file == "-" ? "stdin" : o.file;  // for messages

    LoadedModel m = load_model(o.model, o.mopts);
    const Tokenizer& tok = *m.tokenizer;
    const double t_tok = now_seconds();
    std::vector<int32_t> ids = tok.encode(text, true, false);
    const double tok_s = now_seconds() - t_tok;
    const int64_t n_ctx = o.n_ctx;
    if (n_ctx < 4) fail("context size must be at least 4, got {}", n_ctx);
    int64_t n_chunk = static_cast<int64_t>(ids.size()) / n_ctx;
    if (n_chunk == 0)
        fail("'{}' has {} tokens, fewer than one chunk of {} (use a longer text or a smaller -c)", name, ids.size(), n_ctx);
    if (o.max_chunks > 0) n_chunk = std::min(n_chunk, o.max_chunks);
    std::fprintf(stderr, "quern: %s: %zu tokens (tokenized in %.2f s), %lld chunks of %lld\n", name.c_str(),
                 ids.size(), tok_s, static_cast<long long>(n_chunk), static_cast<long long>(n_ctx));

    ThreadPool pool(o.threads);
    PerplexitySum sum;
    const bool tty = stderr_is_tty();
    const double t0 = now_seconds();
    score_chunks(*m.model, tok, ids, n_ctx, n_chunk, pool, sum, [&](int64_t c) {
        if (tty) print_chunk_progress(c, n_chunk, n_ctx, sum.ppl(), t0);
    });
    if (tty) std::fputc('\n', stderr);
    const double ppl = sum.ppl(), err = sum.err();
    const int64_t count = sum.count;
    const double secs = now_seconds() - t0;
    if (o.json) {
        nlohmann::json j{{"file", o.file},       {"n_tokens", ids.size()}, {"n_ctx", n_ctx}, {"n_chunks", n_chunk},
                         {"n_scored", count},    {"ppl", ppl},            {"ppl_err", err},  {"seconds", secs},
                         {"add_bos", tok.add_bos()}};
        std::printf("%s\n", j.dump(1).c_str());
    } else {
        std::printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, err);
    }
    std::fprintf(stderr, "quern: %lld tokens scored in %.1f s (%.0f tok/s evaluated)\n", static_cast<long long>(count),
                 secs, n_chunk * n_ctx / secs);
}

}  // namespace
}  // namespace quern::cli

void add_perplexity_command(CLI::App& app) {
    using namespace quern::cli;
    auto o = std::make_shared<PplOptions>();
    CLI::App* cmd = app.add_subcommand("perplexity", "Perplexity of a text file (llama.cpp's method)");
    cmd->add_option("-m,--model", o->model,
                    "GGUF model file, or a Hugging Face folder (safetensors; llama, qwen2, qwen3, qwen3_moe, mixtral, phi3, gemma2, gemma3_text; "
                    "bf16/fp16/fp32, or FP8 / NVFP4 checkpoints, run weight-only) "
                    "(default: SmolLM2-135M-Instruct in $QUERN_HOME)");
    cmd->add_option("-f,--file", o->file, "Text file to score ('-' = stdin)")->required();
    cmd->add_option("-c,--ctx-size", o->n_ctx, "Tokens per chunk")->capture_default_str()->check(CLI::Range(4, 1 << 20));
    add_chunks_option(cmd, o->max_chunks, "Score at most this many chunks (-1 = all)");
    add_model_options(cmd, o->mopts);
    add_threads_option(cmd, o->threads);
    cmd->add_flag("--json", o->json, "Print the result as JSON");
    cmd->footer(
        "Examples:\n"
        "  quern perplexity -f tests/data/genesis-kjv.txt\n"
        "  quern perplexity -m model.gguf -f wiki.test.raw -c 2048 --chunks 20 --json\n"
        "  cat book.txt | quern perplexity -f - -c 256");
    cmd->callback([o] { perplexity(*o); });
}
