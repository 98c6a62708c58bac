// quern bench: prefill (pp) and decode (tg) throughput, as llama.cpp's
// llama-bench measures them: pp<N> evaluates N random tokens in one batch from
// an empty cache; tg<N> generates N tokens one at a time from an empty cache.
// On a GPU, pp<N> is one Session::eval of the N tokens: the batched prefill
// (GEMMs; backend/cuda/rows_pass.cpp) where the model allows it, else N decode steps.
// Each test runs once to warm up, then -r times; mean ± stdev is reported with
// the achieved weight bandwidth (tg) and arithmetic rate (pp) at the mean, and
// --json adds the median and every sample.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "model/hf_model.h"
#include "model/synth.h"
#include "runtime/engine.h"
#include "tokenizer/tokenizer.h"

#include <condition_variable>
#include <mutex>

namespace quern::cli {
namespace {

struct BenchOptions {
    std::vector<int> batch;  // --batch: concurrent sequences through the serving engine
    ModelOptions mopts;
    DeviceOptions dev;
    // -p, -n, -d: lists, as llama-bench takes them (every pp and tg test at
    // every depth).
    std::vector<int> n_depth{0};
    std::string model;
    std::string synthetic;
    std::string quant = "Q4_K_M";
    std::vector<int> n_prompt{512};
    std::vector<int> n_gen{128};
    int reps = 5;
    int threads = 0;
    bool json = false;
};

struct Stats {
    double mean = 0, stdev = 0, median = 0;
    std::vector<double> samples;
};

Stats stats(const std::vector<double>& v) {
    Stats s;
    s.samples = v;
    for (double x : v) s.mean += x;
    s.mean /= static_cast<double>(v.size());
    for (double x : v) s.stdev += (x - s.mean) * (x - s.mean);
    s.stdev = v.size() > 1 ? std::sqrt(s.stdev / static_cast<double>(v.size() - 1)) : 0.0;
    std::vector<double> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    s.median = n == 0 ? 0.0 : n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    return s;
}

// --batch N,...: N requests of n_prompt random tokens, each generating n_gen
// tokens (greedy, EOS ignored), submitted at once to the serving engine
// (continuous batching, paged KV cache) in-process; aggregate tok/s. On a GPU
// the engine runs on cuda::make_executor with batches (loaded once for all N), with a
// token budget of 2048 rows per step.
void bench_batched(const BenchOptions& o) {
    const bool gpu = use_cuda(o.dev);
    if (!gpu) warn_gpu_options_ignored(o.dev);
    if (gpu && (o.dev.kv_tokens > 0 || o.dev.gpu_mem > 0))
        std::fprintf(stderr, "quern: note: --batch sizes the engine's paged KV cache itself (-p + -n per sequence); "
                             "--kv-tokens and --gpu-mem do not apply\n");
    if (!o.synthetic.empty())
        fail("--batch cannot use --synthetic (the serving engine needs the file's tokenizer); write the model first: "
             "quern synth {} --quant {} -o model.gguf && quern bench -m model.gguf --batch ...", o.synthetic, o.quant);
    if (o.n_prompt.size() != 1 || o.n_gen.size() != 1 || o.n_depth.size() != 1 || o.n_depth[0] != 0)
        fail("--batch takes one -p and one -n value and no -d");
    const int n_prompt = o.n_prompt[0], n_gen = o.n_gen[0];
    if (n_gen <= 0 || n_prompt <= 0) fail("--batch needs -p and -n greater than 0");
    if (o.dev.cpu_profile)
        fail("--cpu-profile times one sequence's passes; run it without --batch (quern bench -p N -n N --cpu-profile)");
    const std::string path = resolve_model_path(o.model);
    if (is_hf_model_path(path) || std::filesystem::is_directory(path))
        fail("--batch needs a GGUF file (its tokenizer feeds the serving engine); '{}' is a Hugging Face folder", path);
    auto file = std::make_shared<GgufFile>(path);
    auto model = Model::from_gguf(file);
    model->set_options(o.mopts);
    auto tok = Tokenizer::from_gguf(*file);
    std::unique_ptr<BatchRunner> runner = gpu ? make_gpu_batch_runner(*model, o.dev, !o.json) : nullptr;
    const std::string device = runner ? runner->backend_name() : "CPU";  // the GPU's name on CUDA
    const char* backend = runner ? "CUDA" : "CPU";
    const std::string label = file->path().substr(file->path().find_last_of('/') + 1);
    const bool tty = stderr_is_tty() && !o.json;
    std::mt19937 rng(42);
    std::uniform_int_distribution<int32_t> tokdist(0, static_cast<int32_t>(model->config().n_vocab - 1));
    nlohmann::json out = nlohmann::json::array();
    if (!o.json) {
        // What the columns mean, on stderr: stdout keeps only the table.
        std::fprintf(stderr,
                     "quern: generated and all tok/s: from submitting all N requests to the last token (prefill "
                     "included);\nquern: decode tok/s: tokens generated once every request has its first one, over that "
                     "time.\n");
        std::printf("| %-40s | %7s | %8s | %6s | %6s | %18s | %16s | %16s | %8s |\n", "model", "backend", "parallel",
                    "prompt", "gen", "generated tok/s", "decode tok/s", "all tok/s", "wall s");
        std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", std::string(40, '-').c_str(),
                    std::string(7, '-').c_str(), std::string(8, '-').c_str(), std::string(6, '-').c_str(),
                    std::string(6, '-').c_str(), std::string(18, '-').c_str(), std::string(16, '-').c_str(),
                    std::string(16, '-').c_str(), std::string(8, '-').c_str());
    }
    for (int n : o.batch) {
        EngineOptions eo;
        eo.n_ctx = n_prompt + n_gen + 1;
        eo.n_parallel = n;
        eo.max_queue = n;
        eo.n_threads = o.threads;
        eo.prefix_cache = false;
        if (runner) eo.token_budget = 2048;
        std::vector<double> gen_tps, tot_tps, walls, dec_tps;
        for (int r = -1; r < o.reps; ++r) {  // r = -1: warm-up
            auto eng = runner ? make_engine([&](ThreadPool&) { return borrow_runner(*runner); }, *tok, eo)
                              : make_engine(*model, *tok, eo);
            std::mutex mu;
            std::condition_variable cv;
            int done = 0, started = 0;
            int64_t generated = 0, gen_at_start = 0;
            double t_started = 0;
            std::vector<char> has_first(static_cast<size_t>(n), 0);
            const double t0 = now_seconds();
            for (int i = 0; i < n; ++i) {
                GenerationRequest req;
                req.prompt.resize(static_cast<size_t>(n_prompt));
                for (auto& t : req.prompt) t = tokdist(rng);
                req.max_tokens = n_gen;
                req.ignore_eos = true;
                req.sampling.temperature = 0;
                eng->submit(std::move(req), [&, i](const TokenEvent& e) {
                    std::lock_guard<std::mutex> lk(mu);
                    if (e.token >= 0) ++generated;
                    if (e.token >= 0 && !has_first[static_cast<size_t>(i)]) {
                        has_first[static_cast<size_t>(i)] = 1;
                        if (++started == n) t_started = now_seconds(), gen_at_start = generated;
                    }
                    if (e.last) {
                        ++done;
                        cv.notify_all();
                    }
                    return true;
                });
            }
            std::unique_lock<std::mutex> lk(mu);
            cv.wait(lk, [&] { return done == n; });
            const double dt = now_seconds() - t0;
            if (r < 0) continue;
            gen_tps.push_back(static_cast<double>(generated) / dt);
            const double t_end = t0 + dt;
            dec_tps.push_back(t_end > t_started && started == n
                                  ? static_cast<double>(generated - gen_at_start) / (t_end - t_started)
                                  : 0.0);
            tot_tps.push_back(static_cast<double>(generated + int64_t{n} * n_prompt) / dt);
            walls.push_back(dt);
            if (tty)
                std::fprintf(stderr, "\rquern: parallel %d run %d/%d: %.1f tok/s   ", n, r + 1, o.reps, gen_tps.back());
        }
        if (tty) std::fprintf(stderr, "\r%60s\r", "");
        const Stats g = stats(gen_tps), t = stats(tot_tps), w = stats(walls), dd = stats(dec_tps);
        if (o.json) {
            out.push_back({{"model", label}, {"backend", backend}, {"device", device}, {"parallel", n}, {"n_prompt", n_prompt},
                           {"n_gen", n_gen}, {"precise_activations", o.mopts.precise_activations},
                           {"gen_tps", g.mean}, {"gen_tps_stddev", g.stdev}, {"gen_tps_median", g.median},
                           {"decode_tps", dd.mean}, {"decode_tps_stddev", dd.stdev}, {"decode_tps_median", dd.median},
                           {"samples_decode_tps", dd.samples}, {"total_tps", t.mean}, {"total_tps_stddev", t.stdev},
                           {"total_tps_median", t.median}, {"samples_gen_tps", g.samples}, {"wall_s", w.mean},
                           {"threads", o.threads}});
        } else {
            std::printf("| %-40s | %7s | %8d | %6d | %6d | %9.1f ± %6.1f | %7.1f ± %6.1f | %7.1f ± %6.1f | %8.3f |\n",
                        label.c_str(), backend, n, n_prompt, n_gen, g.mean, g.stdev, dd.mean, dd.stdev,
                        t.mean, t.stdev, w.mean);
        }
    }
    if (o.json) std::printf("%s\n", out.dump(1).c_str());
}

void bench(const BenchOptions& o) {
    if (!o.batch.empty()) return bench_batched(o);
    const auto vmax = [](const std::vector<int>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); };
    if (vmax(o.n_prompt) == 0 && vmax(o.n_gen) == 0) fail("nothing to measure: -p and -n are both 0");
    use_cuda(o.dev);  // --device cuda without a GPU fails here, before the (synthetic) model is built
    std::unique_ptr<Model> model;
    std::shared_ptr<GgufFile> file;
    std::string label;
    const bool tty = stderr_is_tty() && !o.json;
    if (!o.synthetic.empty()) {
        const SynthPreset& p = synth_preset(o.synthetic);
        const std::string quant = synth_scheme(o.quant, false);
        auto progress = [&](int64_t d, int64_t t) {
            if (tty) std::fprintf(stderr, "\rquern: building %s %s weights %lld/%lld", p.name.c_str(), quant.c_str(),
                                  static_cast<long long>(d), static_cast<long long>(t));
        };
        SynthModel sm = make_synthetic(p, quant, 1234, progress);
        if (tty) std::fputc('\n', stderr);
        model = Model::from_weights(sm.cfg, std::move(sm.weights));
        label = p.name + " " + quant + " (synthetic)";
    } else {
        const std::string path = resolve_model_path(o.model);
        if (is_hf_model_path(path) || std::filesystem::is_directory(path)) {
            // A Hugging Face folder: the weights only (the tokens are random, so no tokenizer).
            const HfFolder hf = resolve_hf_folder(path);
            model = load_hf_model(hf.weights);
            label = std::filesystem::path(hf.dir).filename().string();
        } else {
            file = std::make_shared<GgufFile>(path);
            model = Model::from_gguf(file);
            label = file->path().substr(file->path().find_last_of('/') + 1);
        }
    }
    model->set_options(o.mopts);
    const auto& cfg = model->config();
    ThreadPool pool(o.threads);
    const int64_t n_ctx = int64_t{vmax(o.n_depth)} + std::max(vmax(o.n_prompt), vmax(o.n_gen)) + 16;
    std::unique_ptr<Session> session = make_session(*model, n_ctx, o.dev, pool, !o.json);
    const std::string backend = session->backend_name();
    const bool gpu = backend != "CPU";
    if (session->n_ctx() < n_ctx) fail("the KV cache holds {} tokens, the test needs {}", session->n_ctx(), n_ctx);
    std::vector<float> logits(static_cast<size_t>(cfg.n_vocab));
    std::mt19937 rng(42);
    std::uniform_int_distribution<int32_t> tokdist(0, static_cast<int32_t>(cfg.n_vocab - 1));

    // Bytes a decode step reads: every weight once except the embedding table,
    // of which one row is read (unless it is also the output projection).
    const Tensor* emb = model->weights().find("token_embd.weight");
    const bool tied = model->weights().find("output.weight") == nullptr;
    double step_bytes = static_cast<double>(model->n_bytes()) - (emb && !tied ? emb->nbytes() : 0);
    double matmul_params =
        static_cast<double>(model->n_params()) - (emb && !tied ? static_cast<double>(emb->nelements()) : 0.0);
    if (cfg.moe()) {
        // Of each expert bank (blk.N.ffn_*_exps, or per-expert blk.N.ffn_*.E)
        // a token reads and multiplies its n_expert_used chosen experts only.
        double bank_bytes = 0, bank_params = 0;
        for (const auto& [name, t] : model->weights().all()) {
            const bool per_expert = name.find(".ffn_") != std::string::npos &&
                                    std::count(name.begin(), name.end(), '.') == 4;  // blk.N.ffn_up.E.weight
            if (name.find("_exps.") == std::string::npos && !per_expert) continue;
            bank_bytes += static_cast<double>(t.nbytes());
            bank_params += static_cast<double>(t.nelements());
        }
        const double unused = 1.0 - static_cast<double>(cfg.n_expert_used) / static_cast<double>(cfg.n_expert);
        step_bytes -= unused * bank_bytes;
        matmul_params -= unused * bank_params;
    }
    // KV-cache bytes a decode step reads per position of context (K and V of
    // every layer; fp16 on the GPU, fp32 on the CPU).
    const double kv_bytes_per_pos = 2.0 * static_cast<double>(cfg.n_layer * cfg.kv_dim()) * (gpu ? 2.0 : 4.0);

    struct Row {
        std::string test;
        int depth;
        Stats tps;
        double rate;  // GB/s for tg, GFLOP/s for pp
    };
    std::vector<Row> rows;
    auto run_test = [&](bool prefill, int n, int n_depth) {
        std::vector<double> tps;
        std::vector<int32_t> depth(static_cast<size_t>(n_depth));
        for (auto& t : depth) t = tokdist(rng);
        for (int r = -1; r < o.reps; ++r) {  // r = -1: warm-up
            session->clear();
            if (n_depth > 0) {
                if (tty) std::fprintf(stderr, "\rquern: filling %d tokens of context...        ", n_depth);
                session->eval(depth.data(), n_depth, nullptr);
            }
            std::vector<int32_t> toks(static_cast<size_t>(prefill ? n : 1));
            for (auto& t : toks) t = tokdist(rng);
            const double t0 = now_seconds();
            if (prefill) {
                session->eval(toks.data(), n, logits.data());
            } else {
                // Greedy decoding, each token fed back (on a GPU, sampled on
                // the device: one token id crosses to the host per step).
                int32_t t = toks[0];
                for (int i = 0; i < n; ++i) t = session->eval_greedy(t);
            }
            const double dt = now_seconds() - t0;
            if (r >= 0) tps.push_back(n / dt);
            if (tty)
                std::fprintf(stderr, "\rquern: %s%d run %d/%d: %.1f tok/s     ", prefill ? "pp" : "tg", n, r + 1, o.reps,
                             n / dt);
        }
        if (tty) std::fprintf(stderr, "\r%60s\r", "");
        Stats s = stats(tps);
        const double mean_ctx = n_depth + (n + 1) / 2.0;  // positions attention reads, on average
        const double rate = prefill ? 2.0 * matmul_params * s.mean / 1e9
                                    : (step_bytes + kv_bytes_per_pos * mean_ctx) * s.mean / 1e9;
        std::string test = fmt::format("{}{}", prefill ? "pp" : "tg", n);
        if (n_depth > 0) test += fmt::format(" @ d{}", n_depth);
        rows.push_back({test, n_depth, s, rate});
    };
    for (int d : o.n_depth) {
        for (int p : o.n_prompt)
            if (p > 0) run_test(true, p, d);
        for (int g : o.n_gen)
            if (g > 0) run_test(false, g, d);
    }

    if (o.json) {
        nlohmann::json j = nlohmann::json::array();
        for (const auto& r : rows)
            j.push_back({{"model", label},
                         {"size_bytes", model->n_bytes()},
                         {"n_params", model->n_params()},
                         {"backend", gpu ? "CUDA" : "CPU"},
                         {"device", backend},
                         {"threads", pool.size()},
                         {"n_depth", r.depth},
                         {"test", r.test},
                         {"precise_activations", o.mopts.precise_activations},
                         {"avg_ts", r.tps.mean},
                         {"stddev_ts", r.tps.stdev},
                         {"median_ts", r.tps.median},
                         {"samples_ts", r.tps.samples},
                         {r.test.rfind("pp", 0) == 0 ? "gflops" : "gbps", r.rate}});
        std::printf("%s\n", j.dump(1).c_str());
        return;
    }
    std::printf("| %-40s | %12s | %10s | %7s | %7s | %13s | %16s | %14s |\n", "model", "size", "params", "backend",
                "threads", "test", "t/s", "rate");
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s |\n", std::string(40, '-').c_str(), std::string(12, '-').c_str(),
                std::string(10, '-').c_str(), std::string(7, '-').c_str(), std::string(7, '-').c_str(),
                std::string(13, '-').c_str(), std::string(16, '-').c_str(), std::string(14, '-').c_str());
    for (const auto& r : rows) {
        const std::string rate = r.test.rfind("pp", 0) == 0 ? fmt::format("{:.1f} GFLOP/s", r.rate)
                                                            : fmt::format("{:.2f} GB/s", r.rate);
        std::printf("| %-40s | %8.2f MiB | %8.2f M | %7s | %7d | %13s | %7.2f ± %6.2f | %14s |\n", label.c_str(),
                    model->n_bytes() / 1048576.0, model->n_params() / 1e6, gpu ? "CUDA" : "CPU", gpu ? 0 : pool.size(), r.test.c_str(),
                    r.tps.mean, r.tps.stdev, rate.c_str());
    }
    if (!o.mopts.precise_activations) std::printf("(--fast-act: one-level 8-bit activations)\n");
    if (gpu) std::printf("(GPU: %s; tg rate = weights + KV cache bytes read per step)\n", backend.c_str());
}

}  // namespace
}  // namespace quern::cli

void add_bench_command(CLI::App& app) {
    using namespace quern::cli;
    auto o = std::make_shared<BenchOptions>();
    CLI::App* cmd = app.add_subcommand("bench", "Measure prefill (pp) and decode (tg) tokens/s, like llama-bench");
    cmd->add_option("-m,--model", o->model,
                    "GGUF model file, or a Hugging Face folder (safetensors; not with --batch) "
                    "(default: SmolLM2-135M-Instruct in $QUERN_HOME)");
    cmd->add_option("--synthetic", o->synthetic,
                    "Benchmark a synthetic model of a named shape instead (smollm2-135m, llama3-1b, llama3-8b, qwen2-7b, qwen3-8b, qwen3-30b-a3b, mixtral-8x7b, gemma2-2b, gemma3-270m, gemma3-4b, phi3-mini; quern synth --list)");
    cmd->add_option("--quant", o->quant, "Weight type of the synthetic model, in any case (a block type such as Q4_K or Q8_0, F16, BF16, F32, the weight-only "
                    "F8_E4M3_B32 / NVFP4 of FP8 and NVFP4 checkpoints, or Q4_K_M / Q5_K_M)")
        ->capture_default_str();
    cmd->add_option("-p,--n-prompt", o->n_prompt, "Prompt tokens for the pp tests, one or a list (0 = skip)")
        ->capture_default_str()
        ->delimiter(',')
        ->check(CLI::Range(0, 1 << 20));
    cmd->add_option("-n,--n-gen", o->n_gen, "Generated tokens for the tg tests, one or a list (0 = skip)")
        ->capture_default_str()
        ->delimiter(',')
        ->check(CLI::Range(0, 1 << 20));
    cmd->add_option("-r,--repetitions", o->reps, "Timed repetitions of each test")->capture_default_str()->check(CLI::Range(1, 1000));
    cmd->add_option("--batch", o->batch,
                    "Batched decode through the serving engine (CPU or GPU): for each N, N requests of -p prompt "
                    "and -n generated tokens at once (e.g. --batch 1,4,16,64)")
        ->delimiter(',')
        ->check(CLI::Range(1, 1024));
    cmd->add_option("-d,--n-depth", o->n_depth,
                    "Tokens already in the context before each test (not timed), one or a list")
        ->capture_default_str()
        ->delimiter(',')
        ->check(CLI::Range(0, 1 << 20));
    add_model_options(cmd, o->mopts);
    add_device_options(cmd, o->dev);
    add_threads_option(cmd, o->threads);
    cmd->add_flag("--json", o->json, "Print results as JSON");
    cmd->footer(
        "Examples:\n"
        "  quern bench                                   # default model, pp512 and tg128, 5 repetitions\n"
        "  quern bench -m model.gguf -p 512 -n 128 -r 10 --json\n"
        "  quern bench --synthetic llama3-8b --quant Q4_K_M -p 0 -n 32\n"
        "  quern bench --device cuda --synthetic llama3-8b --quant Q8_0 -p 0 -n 128 -d 4096\n"
        "  quern bench --device cuda --synthetic llama3-8b -p 512,2048 -n 0   # lists, as llama-bench\n"
        "  quern bench --device cpu --batch 1,4,16,64 -p 128 -n 128 -r 3   # continuous batching\n"
        "  quern synth llama3-8b -o l8.gguf && quern bench --device cuda -m l8.gguf --batch 1,8,32,64,128 -p 128 -n 128");
    cmd->callback([o] { bench(*o); });
}
