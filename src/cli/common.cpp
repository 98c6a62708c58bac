#include "cli/common.h"

#include "backend/block_plan.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include <CLI/CLI.hpp>

#include "core/error.h"
#include <fmt/format.h>
#include "core/thread_pool.h"
#include "model/hf_model.h"
#include "runtime/speculative.h"
#ifdef QUERN_HAVE_CUDA
#include "backend/cuda/session.h"
#include "backend/cuda/weights.h"
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
    m.path = resolve_model_path(path);
    if (is_hf_model_path(m.path) || std::filesystem::is_directory(m.path)) {
        const HfFolder hf = resolve_hf_folder(m.path);
        m.path = hf.dir;
        m.model = load_hf_model(hf.weights);
        m.tokenizer = Tokenizer::from_file(hf.dir);
        auto templates = std::make_shared<std::map<std::string, std::string>>(hf_chat_templates(hf.dir));
        m.chat_templates = [templates](const std::string& n) {
            auto it = templates->find(n);
            return it == templates->end() ? std::string() : it->second;
        };
        m.chat_templates_origin = hf.dir + "/tokenizer_config.json chat_template";
    } else {
        m.file = std::make_shared<GgufFile>(m.path);
        m.model = Model::from_gguf(m.file);
        m.tokenizer = Tokenizer::from_gguf(*m.file);
        std::shared_ptr<GgufFile> f = m.file;
        m.chat_templates = [f](const std::string& n) {
            return f->get_string(n.empty() ? std::string("tokenizer.chat_template") : "tokenizer.chat_template." + n, "");
        };
        m.chat_templates_origin = "tokenizer.chat_template";
    }
    m.model->set_options(opts);
    m.load_seconds = now_seconds() - t0;
    return m;
}

void print_chunk_progress(int64_t c, int64_t n_chunk, int64_t n_ctx, double ppl, double t0) {
    const double el = now_seconds() - t0;
    std::fprintf(stderr, "\r[%lld/%lld] PPL %.4f  (%.0f tok/s, %.0f s left)   ", static_cast<long long>(c + 1),
                 static_cast<long long>(n_chunk), ppl, static_cast<double>((c + 1) * n_ctx) / el,
                 el / static_cast<double>(c + 1) * static_cast<double>(n_chunk - c - 1));
}

void add_chunks_option(CLI::App* cmd, int64_t& chunks, const char* what) {
    cmd->add_option("--chunks", chunks, what)
        ->capture_default_str()
        ->check(CLI::Validator(
            [](std::string& v) -> std::string {
                long long n = 0;
                size_t used = 0;
                try {
                    n = std::stoll(v, &used);
                } catch (const std::exception&) {
                    used = 0;
                }
                if (used != v.size() || v.empty()) return "'" + v + "' is not an integer";
                return n == -1 || n >= 1 ? "" : "must be -1 (all chunks) or at least 1";
            },
            "-1|N>=1"));
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
        ->check(CLI::Range(0, 1 << 16, "0 or more"));
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
    cmd->add_flag("--cuda-profile", opts.cuda_profile,
                  "Time every GPU op kind with CUDA events (kernels launched one by one) and print the time per op "
                  "kind of decode steps, prompt chunks and batch passes at exit");
    cmd->add_flag("--cpu-profile", opts.cpu_profile,
                  "Time every op of the CPU's forward passes and print, at exit, the time per op (matrix products "
                  "by weight and type, with the GB/s they read) of decode steps and prompt passes");
    cmd->add_option("--gpu-weights", opts.gpu_weights,
                    "Weights on the GPU: native (as the file stores them) or fp8 (every layer matrix converted at "
                    "load to FP8 E4M3 with one scale per output channel; prefill in FP8 on the tensor cores)")
        ->capture_default_str()
        ->check(CLI::IsMember({"native", "fp8"}));
}

bool use_cuda(const DeviceOptions& opts) {
    if (opts.device == "cpu") return false;
#ifdef QUERN_HAVE_CUDA
    if (opts.device == "cuda") {
        if (cuda::device_count() == 0)
            fail("no CUDA GPU found; use --device cpu (or --device auto, which runs on the CPU when there is no GPU)");
        return true;
    }
    return cuda::device_count() > 0;
#else
    if (opts.device == "cuda") fail("this quern was built without the CUDA backend (configured with -DQUERN_CUDA=OFF or without a CUDA toolkit); use --device cpu, or rebuild with the toolkit installed");
    return false;
#endif
}

std::string gpu_unsupported(const Model& m) {
    if (std::string why = cuda_unsupported(m.program()); !why.empty()) return why;
#ifdef QUERN_HAVE_CUDA
    // Every weight type the CPU runs has a CUDA kernel (FP8 / NVFP4
    // checkpoints' F8_E4M3_B32 and NVFP4 included); this names any that ever lacks one.
    for (const auto& [name, t] : m.weights().all())
        if (!cuda::cuda_weight_type_supported(t.type))
            return fmt::format("{} weights (e.g. '{}')", dtype_name(t.type), name);
#endif
    return "";
}

void warn_past_trained_context(const ModelConfig& c, int64_t n_ctx) {
    if (c.n_ctx_train > 0 && n_ctx > c.n_ctx_train)
        std::fprintf(stderr,
                     "quern: warning: a context of %lld tokens is longer than the %lld this model was trained on; "
                     "expect worse output past that point (-c %lld stays within it)\n",
                     static_cast<long long>(n_ctx), static_cast<long long>(c.n_ctx_train),
                     static_cast<long long>(c.n_ctx_train));
}

void warn_gpu_options_ignored(const DeviceOptions& opts) {
    static bool warned = false;  // once per process (bench makes several sessions)
    std::string given;
    if (opts.kv_tokens > 0) given += ", --kv-tokens";
    if (opts.gpu_mem > 0) given += ", --gpu-mem";
    if (opts.no_graph) given += ", --no-cuda-graph";
    if (opts.gpu_weights != "native") given += ", --gpu-weights";
    if (opts.cuda_profile) given += ", --cuda-profile";
    if (given.empty() || warned) return;
    warned = true;
    std::fprintf(stderr, "quern: warning: running on the CPU, which ignores the GPU-only option%s %s\n",
                 given.find(',', 1) == std::string::npos ? "" : "s", given.c_str() + 2);
}

#ifdef QUERN_HAVE_CUDA
namespace {

/// The CUDA executor's options from the command line's (no memory budget,
/// one sequence).
cuda::SessionOptions gpu_session_options(const Model& model, const DeviceOptions& opts, bool verbose) {
    cuda::SessionOptions so;
    so.cuda_graph = !opts.no_graph;
    so.fp8_weights = opts.gpu_weights == "fp8";
    so.precise_activations = model.options().precise_activations;
    so.profile = opts.cuda_profile;
    so.verbose = verbose;
    return so;
}

}  // namespace
#endif

std::unique_ptr<Session> make_session(Model& model, int64_t n_ctx, const DeviceOptions& opts, ThreadPool& pool,
                                      bool verbose) {
    warn_past_trained_context(model.config(), n_ctx);
    if (!use_cuda(opts)) {
        warn_gpu_options_ignored(opts);
        return make_cpu_session(model, n_ctx, pool, opts.cpu_profile);
    }
    if (const std::string why = gpu_unsupported(model); opts.device == "auto" && !why.empty()) {
        if (verbose) std::fprintf(stderr, "quern: the GPU backend does not compute %s yet; running on the CPU\n", why.c_str());
        warn_gpu_options_ignored(opts);
        return make_cpu_session(model, n_ctx, pool, opts.cpu_profile);
    }
    if (opts.cpu_profile)
        std::fprintf(stderr, "quern: warning: --cpu-profile times the CPU backend and this run is on the GPU "
                             "(--cuda-profile times it; --device cpu runs on the CPU)\n");
#ifdef QUERN_HAVE_CUDA
    cuda::SessionOptions so = gpu_session_options(model, opts, verbose);
    so.gpu_mem_fraction = opts.gpu_mem;
    return make_executor_session(model, cuda::make_executor(model.program(), so),
                                 opts.kv_tokens > 0 ? opts.kv_tokens : n_ctx);
#else
    return nullptr;  // unreachable: use_cuda() failed
#endif
}

std::unique_ptr<Session> make_draft_session(Model& model, const Session& target, const DeviceOptions& opts,
                                            ThreadPool& pool) {
    if (target.backend_name() == "CPU") return make_cpu_draft_session(model, target.n_ctx(), pool);
#ifdef QUERN_HAVE_CUDA
    // Its weights (one decoder layer, eh_proj, and its own copies of the
    // embedding table and the LM head) and a one-layer KV cache beside the
    // model's; every pass of it goes through the batched rows path.
    return make_draft_session(model, cuda::make_executor(draft_program_of(model), gpu_session_options(model, opts, false)),
                              target.n_ctx());
#else
    (void)opts;
    fail("this build has no CUDA backend; use --device cpu");
#endif
}

std::unique_ptr<BatchRunner> make_gpu_batch_runner(Model& model, const DeviceOptions& opts, bool verbose) {
    if (const std::string why = gpu_unsupported(model); !why.empty())
        fail("the GPU backend does not compute {} yet; use --device cpu", why);
#ifdef QUERN_HAVE_CUDA
    cuda::SessionOptions so = gpu_session_options(model, opts, verbose);
    so.batches = true;
    so.gpu_mem_fraction = opts.gpu_mem;
    so.kv_fill = opts.kv_fill;
    return make_executor_runner(model, cuda::make_executor(model.program(), so));
#else
    (void)opts;
    (void)verbose;
    fail("this build has no CUDA backend; use --device cpu");
#endif
}

DraftFactory gpu_draft_factory(Model& model, const DeviceOptions& opts) {
    if (!model.draft_program()) return {};
#ifdef QUERN_HAVE_CUDA
    return [&model, opts](ThreadPool&) {
        cuda::SessionOptions so = gpu_session_options(model, opts, false);
        so.batches = true;
        return cuda::make_executor(*model.draft_program(), so);
    };
#else
    (void)opts;
    return {};
#endif
}

void print_verify(const VerifyResult& v, const std::string& backend) {
    double worst = 1.0;
    std::string worst_name;
    for (const auto& [name, c] : v.cosines)
        if (c < worst) worst = c, worst_name = name;
    // Different top tokens: how close a call it was on the reference's logits.
    const std::string gap = v.argmax_ref == v.argmax_test
                                ? ""
                                : fmt::format(" (CPU scores {} {:.4g} below {})", v.argmax_test, v.argmax_gap,
                                              v.argmax_ref);
    if (v.ok) {
        std::fprintf(stderr, "quern: verify passed: CPU vs %s logits cosine %.7f (>= %.3f), argmax %d / %d%s%s\n",
                     backend.c_str(), v.logits_cosine, v.threshold, v.argmax_ref, v.argmax_test, gap.c_str(),
                     worst_name.empty() ? "" : fmt::format(", lowest layer cosine {:.7f} ({})", worst, worst_name).c_str());
        return;
    }
    std::fprintf(stderr, "quern: VERIFY FAILED: CPU vs %s logits cosine %.7f < %.3f (argmax %d vs %d)\n",
                 backend.c_str(), v.logits_cosine, v.threshold, v.argmax_ref, v.argmax_test);
    for (const auto& [name, c] : v.cosines) std::fprintf(stderr, "  %-10s cosine %.7f\n", name.c_str(), c);
    if (!v.first_diverging.empty())
        std::fprintf(stderr, "quern: first diverging tensor: %s\n", v.first_diverging.c_str());
}

std::string read_input_file(const std::string& path, const char* what) {
    std::string text;
    std::FILE* f = stdin;
    if (path != "-") {
        if (std::filesystem::is_directory(path)) fail("{} '{}' is a directory", what, path);
        f = std::fopen(path.c_str(), "rb");
        if (!f) fail("cannot open {} '{}': {}", what, path, std::strerror(errno));
    }
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    const bool bad = std::ferror(f) != 0;
    if (f != stdin) std::fclose(f);
    if (bad) fail("cannot read {} '{}'", what, path == "-" ? std::string("(stdin)") : path);
    return text;
}

bool stderr_is_tty() { return ::isatty(STDERR_FILENO) != 0; }

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace quern::cli
