// quern imatrix -f TEXT: the importance matrix of a model over a calibration
// text (formats/imatrix.h), computed as llama.cpp's llama-imatrix does: the
// text is cut into chunks of n_ctx tokens as `quern perplexity` cuts it, and
// every matrix product of the layers sums the squares of its input rows per
// column (the output head's too with --process-output). quern quantize
// --imatrix reads the file, as llama-quantize does.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "formats/imatrix.h"
#include "runtime/perplexity.h"

namespace quern::cli {
namespace {

struct ImatrixOptions {
    ModelOptions mopts;
    std::string model, file, out = "imatrix.gguf";
    int64_t n_ctx = 512;
    int64_t max_chunks = -1;
    int threads = 0;
    bool process_output = false, force = false, json = false;
};

void imatrix(const ImatrixOptions& o) {
    if (std::filesystem::exists(o.out) && !o.force) fail("'{}' exists; pass --force to overwrite it", o.out);
    const std::string text = read_input_file(o.file, "text file");
    LoadedModel m = load_model(o.model, o.mopts);
    const Tokenizer& tok = *m.tokenizer;
    const int64_t n_ctx = o.n_ctx;
    const std::vector<int32_t> ids = tok.encode(text, true, false);
    int64_t n_chunk = static_cast<int64_t>(ids.size()) / n_ctx;
    if (n_chunk == 0)
        fail("'{}' has {} tokens, fewer than one chunk of {} (use a longer text or a smaller -c)", o.file, ids.size(), n_ctx);
    if (o.max_chunks > 0) n_chunk = std::min(n_chunk, o.max_chunks);

    Imatrix im;
    im.datasets = {o.file};
    im.chunk_size = n_ctx;
    // Only the layers' matrices (and the head on request), as llama-imatrix
    // collects: those are the ones a mix quantizes with weights.
    m.model->set_activation_observer([&](const Tensor& w, int64_t expert, const float* x, int64_t rows) {
        if (w.name.rfind("blk.", 0) != 0 && !(o.process_output && w.name == "output.weight")) return;
        const int64_t n_mat = expert < 0 ? 1 : w.ne[2];
        im.accumulate(w.name, n_mat, expert < 0 ? 0 : expert, x, rows, w.ne[0]);
    });
    std::fprintf(stderr, "quern: %s: %zu tokens, %lld chunks of %lld\n", o.file.c_str(), ids.size(),
                 static_cast<long long>(n_chunk), static_cast<long long>(n_ctx));
    ThreadPool pool(o.threads);
    PerplexitySum ppl;
    const bool tty = stderr_is_tty() && !o.json;
    const double t0 = now_seconds();
    score_chunks(*m.model, tok, ids, n_ctx, n_chunk, pool, ppl, [&](int64_t c) {
        im.chunk_count = c + 1;
        if (tty) print_chunk_progress(c, n_chunk, n_ctx, ppl.ppl(), t0);
    });
    if (tty) std::fputc('\n', stderr);
    m.model->set_activation_observer(nullptr);
    if (im.entries.empty())
        fail("no layer matrix had a GGUF tensor name (blk.N...): importance matrices are made from GGUF models");
    write_imatrix(o.out, im);
    const double secs = now_seconds() - t0;
    if (o.json) {
        const nlohmann::json j{{"output", o.out},    {"file", o.file},         {"n_tokens", ids.size()},
                               {"n_ctx", n_ctx},     {"n_chunks", n_chunk},     {"entries", im.entries.size()},
                               {"ppl", ppl.ppl()},   {"ppl_err", ppl.err()},    {"seconds", secs}};
        std::printf("%s\n", j.dump(1).c_str());
        return;
    }
    std::fprintf(stderr, "quern: wrote %s: %zu matrices over %lld chunks of %lld tokens (PPL %.4f +/- %.5f) in %.1f s\n",
                 o.out.c_str(), im.entries.size(), static_cast<long long>(n_chunk), static_cast<long long>(n_ctx),
                 ppl.ppl(), ppl.err(), secs);
}

}  // namespace
}  // namespace quern::cli

void add_imatrix_command(CLI::App& app) {
    using namespace quern::cli;
    auto o = std::make_shared<ImatrixOptions>();
    CLI::App* cmd = app.add_subcommand("imatrix", "Importance matrix of a model over a text, for quern quantize --imatrix");
    cmd->add_option("-m,--model", o->model, "GGUF model file, F16/BF16/F32 or quantized (default: SmolLM2-135M-Instruct in $QUERN_HOME)");
    cmd->add_option("-f,--file", o->file, "Calibration text ('-' = stdin)")->required();
    cmd->add_option("-o,--output", o->out, "File to write (GGUF, as llama-imatrix writes)")->capture_default_str();
    cmd->add_option("-c,--ctx-size", o->n_ctx, "Tokens per chunk")->capture_default_str()->check(CLI::Range(4, 1 << 20));
    add_chunks_option(cmd, o->max_chunks, "Use at most this many chunks (-1 = all)");
    cmd->add_flag("--process-output", o->process_output, "Collect the output head's activations too");
    cmd->add_flag("--force", o->force, "Overwrite the output file if it exists");
    add_model_options(cmd, o->mopts);
    add_threads_option(cmd, o->threads);
    cmd->add_flag("--json", o->json, "Print a summary as JSON on stdout");
    cmd->footer(
        "The file holds, per layer matrix, the sum of squared activations per input column and the token count\n"
        "(per expert for expert banks); llama-quantize --imatrix reads it too, and quern reads llama-imatrix's\n"
        "GGUF and older .dat files. Use text like what the model will see (a few hundred kB is plenty).\n"
        "Examples:\n"
        "  quern imatrix -m model-f16.gguf -f calibration.txt -o model.imatrix.gguf\n"
        "  quern quantize model-f16.gguf model-q4_k_m.gguf Q4_K_M --imatrix model.imatrix.gguf\n"
        "  quern imatrix -m model-f16.gguf -f wiki.train.raw --chunks 100 --json");
    cmd->callback([o] { imatrix(*o); });
}
