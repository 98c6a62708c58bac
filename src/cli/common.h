// Helpers shared by the quern subcommands: model path resolution, loading
// with timing, terminal detection.
#pragma once
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "formats/gguf.h"
#include "model/model.h"
#include "runtime/generation_defaults.h"
#include "runtime/batch_runner.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "runtime/verify.h"
#include "tokenizer/tokenizer.h"

namespace quern::cli {

/// $QUERN_HOME (default ~/.cache/quern).
std::string quern_home();
/// Where tools/fetch-model.sh puts the default model.
std::string default_model_path();
/// `path` if given, else the default model; throws quern::Error with the fetch
/// command when the default model is missing, or naming a missing path.
std::string resolve_model_path(const std::string& path);

/// A model loaded from a GGUF file or a Hugging Face folder, with its tokenizer.
struct LoadedModel {
    std::string path;                   ///< the GGUF file or the folder
    std::shared_ptr<GgufFile> file;     ///< null for a Hugging Face folder
    std::unique_ptr<Model> model;
    std::unique_ptr<Tokenizer> tokenizer;
    /// The model's chat templates by name ("" for the default), "" when absent.
    std::function<std::string(const std::string&)> chat_templates;
    std::string chat_templates_origin;  ///< where they come from, for messages
    double load_seconds = 0;
};
/// Loads `path` (resolve_model_path): a GGUF file, or a Hugging Face folder
/// (or its config.json, model.safetensors or model.safetensors.index.json)
/// with tokenizer.json, tokenizer_config.json and generation_config.json.
LoadedModel load_model(const std::string& path, const ModelOptions& opts = {});

/// The bytes of the file `path`, or of stdin when `path` is "-". `what` names
/// the file in errors ("prompt file": "cannot open prompt file 'x': ...").
std::string read_input_file(const std::string& path, const char* what);

/// True when stderr is a terminal (progress output is shown only then).
bool stderr_is_tty();
/// Seconds on a monotonic clock.
double now_seconds();

}  // namespace quern::cli

namespace CLI {
class App;
}
namespace quern {
struct SamplingParams;
struct ModelOptions;
}
namespace quern::cli {
/// Adds -t/--threads (0 = all cores; more than the machine's hardware threads
/// is clamped to them with a note, since spinning workers would only wait on
/// each other).
void add_threads_option(CLI::App* cmd, int& threads);
/// Adds --chunks N (-1: every chunk of the text; else at least 1) for the
/// commands that cut a text into chunks (perplexity, imatrix).
void add_chunks_option(CLI::App* cmd, int64_t& chunks, const char* what);
/// "\r[c+1/n] PPL x (tok/s, s left)" on stderr after chunk c of a text
/// started at t0 (now_seconds()).
void print_chunk_progress(int64_t c, int64_t n_chunk, int64_t n_ctx, double ppl, double t0);
/// Adds --fast-act (one-level 8-bit activations) to a command.
void add_model_options(CLI::App* cmd, ModelOptions& opts);
/// Where a command runs the model (--device and the GPU's options).
struct DeviceOptions {
    std::string device = "auto";  ///< auto | cpu | cuda
    int64_t kv_tokens = 0;        ///< GPU KV-cache positions (0: the context size)
    double gpu_mem = 0;           ///< cap the GPU KV cache to this fraction of GPU memory (0: off)
    /// The GPU KV pool takes the whole memory budget (gpu_mem's share, else
    /// the free memory less a margin): `quern serve` without --kv-tokens.
    bool kv_fill = false;
    bool no_graph = false;        ///< launch kernels one by one instead of a CUDA graph
    std::string gpu_weights = "native";  ///< native | fp8 (--gpu-weights)
    bool cuda_profile = false;    ///< GPU time per op kind, printed at exit (--cuda-profile)
    bool cpu_profile = false;     ///< CPU wall time per op, printed at exit (--cpu-profile)
};
/// Adds --device, --kv-tokens, --gpu-mem, --no-cuda-graph, --gpu-weights, --cuda-profile and --cpu-profile to a
/// command.
void add_device_options(CLI::App* cmd, DeviceOptions& opts);
/// Whether `opts` selects the GPU (auto: when this build has CUDA and a GPU is
/// present). quern::Error for --device cuda without a GPU or without the CUDA
/// backend, so commands call it before loading a model.
bool use_cuda(const DeviceOptions& opts);
/// Prints one warning on stderr (once per process) naming the GPU-only
/// options of `opts` that were given (--kv-tokens, --gpu-mem,
/// --no-cuda-graph), for a run that ends up on the CPU.
void warn_gpu_options_ignored(const DeviceOptions& opts);
/// Prints a warning on stderr when n_ctx exceeds the model's trained context
/// (ModelConfig::n_ctx_train, when known).
void warn_past_trained_context(const ModelConfig& c, int64_t n_ctx);
/// What in a loaded model the CUDA backend does not compute ("" when it runs
/// it): its program (cuda_unsupported, backend/block_plan.h), then (in CUDA
/// builds) any weight type without a CUDA kernel (none of the types the CPU
/// runs, F8_E4M3_B32 and NVFP4 of FP8 / NVFP4 checkpoints included).
std::string gpu_unsupported(const Model& m);
/// A session for `model` with n_ctx positions on the device `opts` selects
/// (CPU sessions use `pool`; --device auto runs on the CPU, with a note, a
/// model that gpu_unsupported() names a feature of; a CPU session warns of
/// GPU-only options given, warn_gpu_options_ignored). Throws quern::Error when the GPU is asked for
/// and this build has no CUDA backend or the machine no GPU, and (from the
/// CUDA session, saying to use --device cpu) when --device cuda is asked for
/// a model whose features the GPU does not compute.
std::unique_ptr<Session> make_session(Model& model, int64_t n_ctx, const DeviceOptions& opts, ThreadPool& pool,
                                      bool verbose = true);

/// The serving engine's runner on the GPU (cuda::make_executor with batches) for
/// `model`; quern::Error when the build has no CUDA backend or the model is
/// not supported there (saying to use --device cpu).
std::unique_ptr<BatchRunner> make_gpu_batch_runner(Model& model, const DeviceOptions& opts, bool verbose);
/// The executor of the model's NextN draft head beside make_gpu_batch_runner's
/// (batches on), for make_engine; empty when the model has none or the build
/// has no CUDA backend.
DraftFactory gpu_draft_factory(Model& model, const DeviceOptions& opts);
/// A session of the model's NextN draft head beside `target`, on its
/// backend (the CPU, or the GPU with the options `opts` gives), of
/// target.n_ctx() positions. quern::Error when the model has no head.
std::unique_ptr<Session> make_draft_session(Model& model, const Session& target, const DeviceOptions& opts,
                                            ThreadPool& pool);
/// Prints a verify result to stderr: one line when it passes; the per-layer
/// cosines and the first diverging layer when it fails.
void print_verify(const VerifyResult& v, const std::string& backend);
/// Adds --temp/--top-k/--top-p/--min-p/penalties/--seed options to a command.
void add_sampling_options(CLI::App* cmd, SamplingParams& sp, int64_t& seed);
/// Which of add_sampling_options' --temp, --top-k, --top-p, --min-p and
/// --repeat-penalty were given on `cmd`'s command line.
SamplingGiven sampling_given(const CLI::App& cmd);
/// Applies the sampling defaults of a Hugging Face folder's
/// generation_config.json (load_generation_defaults; none for GGUF files) to
/// `sp` for the fields not in `given`, and says on stderr which values came
/// from the file. Returns them. Throws quern::Error naming the file and key
/// for a malformed file.
GenerationDefaults apply_generation_defaults(const LoadedModel& m, SamplingParams& sp, const SamplingGiven& given);
}  // namespace quern::cli
