#include "cli/common.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "core/thread_pool.h"

namespace quern::cli {

std::string quern_home() {
    if (const char* h = std::getenv("QUERN_HOME"); h && *h) return h;
    const char* home = std::getenv("HOME");
    return std::string(home && *home ? home : ".") + "/.cache/quern";
}

std::string default_model_path() { return quern_home() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf"; }

std::string resolve_model_path(const std::string& path) {
    if (path.empty()) {
        const std::string d = default_model_path();
        if (!std::filesystem::exists(d))
            fail("the default model is not at {}; fetch it with: bash tools/fetch-model.sh (or pass -m FILE.gguf)", d);
        return d;
    }
    if (!std::filesystem::exists(path)) fail("model file '{}' does not exist", path);
    return path;
}

LoadedModel load_model(const std::string& path, const ModelOptions& opts) {
    const double t0 = now_seconds();
    LoadedModel m;
    m.file = std::make_shared<GgufFile>(resolve_model_path(path));
    m.model = Model::from_gguf(m.file);
    m.model->set_options(opts);
    m.tokenizer = Tokenizer::from_gguf(*m.file);
    m.load_seconds = now_seconds() - t0;
    return m;
}

void add_threads_option(CLI::App* cmd, int& threads) {
    cmd->add_option_function<int>(
           "-t,--threads",
           [&threads](int t) {
               const int hw = ThreadPool::hardware_threads();
               if (t > hw) {
                   std::fprintf(stderr, "quern: %d threads requested, using the %d this machine has\n", t, hw);
                   t = hw;
               }
               threads = t;
           },
           "CPU threads (0 = all cores)")
        ->default_str("0")
        ->check(CLI::NonNegativeNumber);
}

void add_model_options(CLI::App* cmd, ModelOptions& opts) {
    cmd->add_flag("--fast-act", [&opts](int64_t) { opts.precise_activations = false; },
                  "Quantize activations once to 8 bits as llama.cpp does (faster prefill, less exact); "
                  "default: two-level 8-bit activations");
}

bool stderr_is_tty() { return ::isatty(STDERR_FILENO) != 0; }

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace quern::cli
