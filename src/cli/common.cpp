#include "cli/common.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include <CLI/CLI.hpp>

#include "core/error.h"
#include <fmt/format.h>
#include "core/thread_pool.h"
#ifdef QUERN_HAVE_CUDA
#include "backend/cuda/session.h"
#endif

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

void add_device_options(CLI::App* cmd, DeviceOptions& opts) {
    cmd->add_option("--device", opts.device, "Where to run: auto (the GPU when there is one), cpu or cuda")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    cmd->add_option("--kv-tokens", opts.kv_tokens, "GPU KV-cache size in tokens (default: the context size)")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
    cmd->add_option("--gpu-mem", opts.gpu_mem, "Cap the GPU KV cache to what fits in this fraction of GPU memory")
        ->check(CLI::Range(0.01, 1.0));
    cmd->add_flag("--no-cuda-graph", opts.no_graph, "Launch the GPU kernels one by one (for debugging and timing)");
}

bool use_cuda(const DeviceOptions& opts) {
    if (opts.device == "cpu") return false;
#ifdef QUERN_HAVE_CUDA
    if (opts.device == "cuda") return true;
    return cuda::device_count() > 0;
#else
    if (opts.device == "cuda") fail("this quern was built without the CUDA backend (nvcc was not found); use --device cpu");
    return false;
#endif
}

std::unique_ptr<Session> make_session(Model& model, int64_t n_ctx, const DeviceOptions& opts, ThreadPool& pool,
                                      bool verbose) {
    if (!use_cuda(opts)) return make_cpu_session(model, n_ctx, pool);
#ifdef QUERN_HAVE_CUDA
    cuda::SessionOptions so;
    so.n_ctx = opts.kv_tokens > 0 ? opts.kv_tokens : n_ctx;
    so.gpu_mem_fraction = opts.gpu_mem;
    so.cuda_graph = !opts.no_graph;
    so.verbose = verbose;
    return cuda::make_session(model, so);
#else
    return nullptr;  // unreachable: use_cuda() failed
#endif
}

void print_verify(const VerifyResult& v, const std::string& backend) {
    double worst = 1.0;
    std::string worst_name;
    for (const auto& [name, c] : v.cosines)
        if (c < worst) worst = c, worst_name = name;
    if (v.ok) {
        std::fprintf(stderr, "quern: verify passed: CPU vs %s logits cosine %.7f (>= %.3f), argmax %d / %d%s\n",
                     backend.c_str(), v.logits_cosine, v.threshold, v.argmax_ref, v.argmax_test,
                     worst_name.empty() ? "" : fmt::format(", lowest layer cosine {:.7f} ({})", worst, worst_name).c_str());
        return;
    }
    std::fprintf(stderr, "quern: VERIFY FAILED: CPU vs %s logits cosine %.7f < %.3f (argmax %d vs %d)\n",
                 backend.c_str(), v.logits_cosine, v.threshold, v.argmax_ref, v.argmax_test);
    for (const auto& [name, c] : v.cosines) std::fprintf(stderr, "  %-10s cosine %.7f\n", name.c_str(), c);
    if (!v.first_diverging.empty())
        std::fprintf(stderr, "quern: first diverging tensor: %s\n", v.first_diverging.c_str());
}

bool stderr_is_tty() { return ::isatty(STDERR_FILENO) != 0; }

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace quern::cli
