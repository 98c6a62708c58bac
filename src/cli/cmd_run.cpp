// quern run: generate text from a prompt, streaming it to stdout.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/decoder.h"
#include "model/fp8_weights.h"
#include "core/error.h"
#include "runtime/sampler.h"
#include "tokenizer/detokenizer.h"

namespace quern::cli {
namespace {

struct RunOptions {
    ModelOptions mopts;
    DeviceOptions dev;
    bool verify = false;
    std::string model;
    std::string prompt;
    std::string prompt_file;
    int n_predict = 128;
    int64_t n_ctx = 4096;
    int threads = 0;
    bool no_special = false;
    bool ignore_eos = false;
    SamplingParams sp;
    SamplingGiven sp_given;  ///< sampling flags given on the command line
    int64_t seed = -1;
    SpecOptions spec;
};

int run(const RunOptions& o) {
    const std::string prompt = o.prompt_file.empty() ? o.prompt : read_input_file(o.prompt_file, "prompt file");
    // Check the options before spending time on loading the model.
    Sampler(o.sp, 1);  // throws quern::Error for out-of-range sampling values
    const bool gpu = use_cuda(o.dev);  // --device cuda without a GPU fails here, before the load
    if (o.verify && !gpu)
        fail("--verify compares the GPU with the CPU, and no GPU is in use here (--device {}); run it with --device cuda on "
             "a machine with an NVIDIA GPU, or drop --verify", o.dev.device);
    LoadedModel m = load_model(o.model, o.mopts);
    const auto& cfg = m.model->config();
    std::fprintf(stderr, "quern: loaded %s (%s, %.1fM params, %.1f MiB) in %.2f s\n", m.path.c_str(),
                 cfg.name.empty() ? cfg.arch.c_str() : cfg.name.c_str(), m.model->n_params() / 1e6,
                 m.model->n_bytes() / 1048576.0, m.load_seconds);

    bool bos_in_text = false;
    std::vector<int32_t> ids = m.tokenizer->encode_prompt(prompt, !o.no_special, &bos_in_text);
    if (ids.empty()) fail("the prompt is empty; pass text with -p");
    if (bos_in_text)
        std::fprintf(stderr, "quern: the prompt begins with the BOS token '%s', which the model adds itself; it is "
                             "not added a second time\n",
                     m.tokenizer->token_to_piece(m.tokenizer->bos()).c_str());

    SamplingParams sp = o.sp;
    apply_generation_defaults(m, sp, o.sp_given);
    sp.seed = o.seed >= 0 ? static_cast<uint64_t>(o.seed) : std::random_device{}();
    Sampler sampler(sp, cfg.n_vocab);
    for (int32_t t : ids) sampler.accept(t);
    if (o.seed < 0 && sp.temperature > 0)
        std::fprintf(stderr, "quern: seed %llu\n", static_cast<unsigned long long>(sp.seed));

    ThreadPool pool(o.threads);
    std::unique_ptr<Session> session = make_session(*m.model, o.n_ctx, o.dev, pool);
    if (static_cast<int64_t>(ids.size()) >= session->n_ctx())
        fail("the prompt has {} token{} and the context holds {}, which leaves no room for a reply (raise -c)",
             ids.size(), ids.size() == 1 ? "" : "s", session->n_ctx());
    if (o.verify) {
        if (session->backend_name() == "CPU")
            fail("--verify compares the GPU with the CPU, and this model runs on the CPU here; run it with --device cuda "
                 "(the error then says what the GPU lacks), or drop --verify");
        // With --gpu-weights fp8 the CPU runs the same FP8 weights.
        std::unique_ptr<Model> fp8_model;
        if (o.dev.gpu_weights == "fp8") {
            fp8_model = Model::from_weights(cfg, fp8_per_channel_weights(m.model->weights(), pool));
            ModelOptions mo = m.model->options();
            mo.fp8_activation_rows = session->fp8_activation_rows();  // what the GPU's prefill rounds
            fp8_model->set_options(mo);
        }
        std::unique_ptr<Session> cpu = make_cpu_session(fp8_model ? *fp8_model : *m.model, o.n_ctx, pool);
        const VerifyResult v = verify_sessions(*cpu, *session, ids);
        print_verify(v, session->backend_name());
        if (!v.ok) return 1;
        session->clear();
    }
    std::vector<float> logits(static_cast<size_t>(cfg.n_vocab));
    Decoder decoder(*session, *m.model, o.spec, o.dev, pool, sp.seed);

    const double t0 = now_seconds();
    decoder.eval(ids.data(), static_cast<int64_t>(ids.size()), logits.data());
    const double t1 = now_seconds();

    Detokenizer detok(*m.tokenizer, false);
    const int64_t limit = o.n_predict < 0 ? INT64_MAX : o.n_predict;
    int64_t generated = 0;
    int32_t next = -1;  // the token the decoder picked
    for (; generated < limit; ++generated) {
        const int32_t tok = next >= 0 ? next : sampler.sample(logits.data());
        if (!o.ignore_eos && m.tokenizer->is_eog(tok)) break;
        sampler.accept(tok);
        const std::string text = detok.push(tok);
        if (!text.empty()) {
            std::fwrite(text.data(), 1, text.size(), stdout);
            std::fflush(stdout);
        }
        if (decoder.context_full()) {
            std::fprintf(stderr, "quern: context full (%lld tokens)\n", static_cast<long long>(session->n_ctx()));
            ++generated;
            break;
        }
        if (generated + 1 < limit) next = decoder.next(tok, sampler);
    }
    const std::string rest = detok.flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    const double t2 = now_seconds();

    const double pp = static_cast<double>(ids.size()) / (t1 - t0);
    // Decode time counts the forward passes after the first sampled token.
    const int64_t decode_steps = generated > 1 ? generated - 1 : 0;
    std::fprintf(stderr, "quern: %s: prompt %zu tokens in %.3f s (%.1f tok/s); generated %lld tokens in %.3f s (%.1f tok/s)\n",
                 session->backend_name().c_str(), ids.size(), t1 - t0, pp, static_cast<long long>(generated), t2 - t1,
                 decode_steps > 0 ? decode_steps / (t2 - t1) : 0.0);
    if (const std::string s = decoder.summary(); !s.empty()) std::fprintf(stderr, "quern: speculative decoding %s\n", s.c_str());
    return 0;
}

}  // namespace

void add_sampling_options(CLI::App* cmd, SamplingParams& sp, int64_t& seed) {
    cmd->add_option("--temp", sp.temperature, "Sampling temperature; 0 = greedy")->capture_default_str();
    cmd->add_option("--top-k", sp.top_k, "Keep the k most likely tokens (0 = off)")->capture_default_str()->check(CLI::Range(0, 1 << 30, "0 or more"));
    cmd->add_option("--top-p", sp.top_p, "Nucleus sampling threshold (1 = off)")->capture_default_str();
    cmd->add_option("--min-p", sp.min_p, "Drop tokens below min-p × the top probability (0 = off)")->capture_default_str();
    cmd->add_option("--repeat-penalty", sp.repeat_penalty, "Penalty for repeated tokens (1 = off)")->capture_default_str();
    cmd->add_option("--repeat-last-n", sp.repeat_last_n, "Tokens the penalties look back over (-1 = all)")
        ->capture_default_str()
        ->check(CLI::Range(-1, 1 << 30));
    cmd->add_option("--presence-penalty", sp.presence_penalty, "Subtracted once from seen tokens")->capture_default_str();
    cmd->add_option("--frequency-penalty", sp.frequency_penalty, "Subtracted per occurrence")->capture_default_str();
    cmd->add_option("--seed", seed, "Random seed (-1 = random); same seed, same output")
        ->capture_default_str()
        ->check(CLI::Range(int64_t{-1}, INT64_MAX));
}

}  // namespace quern::cli

void add_run_command(CLI::App& app) {
    using namespace quern::cli;
    auto o = std::make_shared<RunOptions>();
    CLI::App* cmd = app.add_subcommand("run", "Generate text from a prompt (text to stdout, timings to stderr)");
    cmd->add_option("-m,--model", o->model,
                    "GGUF model file, or a Hugging Face folder (safetensors; llama, qwen2, qwen3, qwen3_moe, mixtral, phi3, gemma2, gemma3_text; "
                    "bf16/fp16/fp32, or FP8 / NVFP4 checkpoints, run weight-only) "
                    "(default: SmolLM2-135M-Instruct in $QUERN_HOME)");
    auto* p = cmd->add_option("-p,--prompt", o->prompt, "Prompt text");
    cmd->add_option("-f,--file", o->prompt_file, "Read the prompt from a file ('-' = stdin)")->excludes(p);
    cmd->add_option("-n,--n-predict", o->n_predict, "Tokens to generate (-1 = until end of generation or a full context)")
        ->capture_default_str()
        ->check(CLI::Range(-1, 1 << 30));
    cmd->add_option("-c,--ctx-size", o->n_ctx, "Context size in tokens")->capture_default_str()->check(CLI::Range(1, 1 << 20));
    add_model_options(cmd, o->mopts);
    add_device_options(cmd, o->dev);
    cmd->add_flag("--verify", o->verify,
                  "Also run the prompt on the CPU and fail unless the GPU's last logits match (cosine >= 0.999); "
                  "names the first diverging layer");
    add_threads_option(cmd, o->threads);
    cmd->add_flag("--no-special", o->no_special, "Treat special-token text in the prompt as plain text");
    cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-generation tokens");
    add_sampling_options(cmd, o->sp, o->seed);
    add_spec_options(cmd, o->spec);
    cmd->footer(
        "Examples:\n"
        "  quern run -p \"The capital of France is\" -n 32 --temp 0\n"
        "  quern run -m model.gguf -p \"Once upon a time\" --temp 0.7 --top-p 0.9 --seed 42\n"
        "  quern run -f prompt.txt -n 256 -c 8192 -t 4\n"
        "  echo 'Once upon a time' | quern run -f - -n 32\n"
        "  quern run -m ~/models/Qwen2.5-0.5B-Instruct -p \"Hello\" -n 32   # a Hugging Face folder\n"
        "  quern run -m ~/models/Qwen3-8B-FP8 -p \"Hello\" -n 32      # FP8 / NVFP4 checkpoints (weight-only)\n"
        "  quern run --device cuda --verify -p \"Hello\" -n 16 --temp 0\n"
        "  quern run -m ~/models/Qwen3.5-2B -p \"Hello\" --spec mtp --spec-draft 3   # drafts by its MTP head\n"
        "A Hugging Face folder's generation_config.json (temperature, top_p, top_k, min_p, repetition_penalty;\n"
        "do_sample false: greedy) replaces the defaults shown here; a flag given on the command line wins over it.");
    cmd->callback([o, cmd] {
        if (o->prompt.empty() && o->prompt_file.empty()) throw CLI::ValidationError("-p", "give a prompt with -p TEXT or -f FILE");
        o->sp_given = sampling_given(*cmd);
        if (run(*o) != 0) throw CLI::RuntimeError(1);  // --verify failed (its report is on stderr)
    });
}
