// quern serve: an OpenAI-compatible HTTP server (src/server) over the
// batching engine (src/runtime/engine.h). Binds to loopback unless told
// otherwise; logs one line per request to stderr; SIGINT/SIGTERM stop it
// gracefully (new requests get 503, running ones get a few seconds to end).
#include <pthread.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "chat/chat.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/decoder.h"
#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/embed.h"
#include "server/server.h"

namespace quern::cli {
namespace {

/// After the shutdown grace: how long cut-off answers and open connections
/// may hold the exit (the process exits by grace + kStopSeconds).
constexpr double kStopSeconds = 3;

struct ServeOptions {
    ModelOptions mopts;
    std::string model;
    std::string alias;
    std::string template_name;
    std::string template_file;
    server::ServerOptions server;
    EngineOptions engine;
    DeviceOptions dev;  // --device, --gpu-weights and --gpu-mem only (the engine's own --kv-tokens sizes the cache)
    SpecOptions spec;
    std::string tool_format = "auto";
    std::string reasoning_format = "auto";
    bool quiet = false;
    /// After SIGTERM: how long running requests may go on before they are
    /// cut off (finish_reason "abort").
    double grace_seconds = 10;
};

/// Waits up to `seconds` for SIGINT/SIGTERM (blocked in every thread); true when one came.
bool wait_signal(const sigset_t& set, double seconds) {
    timespec ts;
    ts.tv_sec = static_cast<time_t>(seconds);
    ts.tv_nsec = static_cast<long>((seconds - static_cast<double>(ts.tv_sec)) * 1e9);
    return sigtimedwait(&set, nullptr, &ts) > 0;
}

int serve(ServeOptions& o) {
    // Signals go to one thread that runs the shutdown; block them before
    // any other thread (engine, HTTP pool) exists so all inherit the mask.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
    signal(SIGPIPE, SIG_IGN);  // a vanished client must not end the process

    use_cuda(o.dev);  // --device cuda without a GPU fails here, before the load
    LoadedModel m = load_model(o.model, o.mopts);
    const auto& cfg = m.model->config();
    const std::string model_id =
        !o.alias.empty() ? o.alias
        : m.file        ? std::filesystem::path(m.path).stem().string()
                        : std::filesystem::path(m.path).filename().string();
    std::optional<chat::ChatTemplate> tmpl;
    tmpl.emplace(chat::ChatTemplate::for_model(m.chat_templates, m.chat_templates_origin, *m.tokenizer, o.template_name,
                                                 o.template_file));
    std::fprintf(stderr, "quern: %s (%s, %.1fM params) loaded in %.2f s; chat template: %s\n", m.path.c_str(),
                 cfg.name.empty() ? cfg.arch.c_str() : cfg.name.c_str(), m.model->n_params() / 1e6, m.load_seconds,
                 tmpl->origin().c_str());

    warn_past_trained_context(cfg, o.engine.n_ctx);
    if (const int64_t sf = m.model->program().state_floats(); sf > 0)  // what each running sequence holds beside its KV
        std::fprintf(stderr,
                     "quern: recurrent state %.1f MiB per sequence and per prefix-cache snapshot (%d of them, "
                     "--state-snapshots); KV cache %.1f KiB per token (%d attention layers)\n",
                     static_cast<double>(sf) * 4 / (1 << 20),
                     !o.engine.prefix_cache ? 0 : o.engine.state_snapshots < 0 ? o.engine.n_parallel : o.engine.state_snapshots,
                     2.0 * static_cast<double>(m.model->program().n_kv_layers * m.model->program().kv_dim) * 4 / 1024,
                     m.model->program().n_kv_layers);
    // The GPU when there is one (--device auto) and it runs the model; else the CPU.
    std::unique_ptr<Engine> engine;
    std::string backend = "CPU";
    // The GPU pool takes the memory budget unless sized (--kv-tokens); not
    // with --spec, whose draft head keeps a KV cache as long as the pool
    // after it.
    o.dev.kv_fill = o.engine.kv_tokens == 0 && o.engine.spec_draft == 0;
    o.engine.warm_grammar = true;  // the first request with a JSON schema finds the shared masks made
    if (use_cuda(o.dev)) {
        try {
            engine = make_engine(
                [&](ThreadPool&) {
                    auto r = make_gpu_batch_runner(*m.model, o.dev, true);
                    backend = r->backend_name();
                    return r;
                },
                *m.tokenizer, o.engine, gpu_draft_factory(*m.model, o.dev));
        } catch (const Error& e) {
            if (o.dev.device == "cuda") throw;
            std::fprintf(stderr, "quern: not serving on the GPU (%s); serving on the CPU\n", e.what());
            backend = "CPU";
        }
    }
    if (!engine) {
        warn_gpu_options_ignored(o.dev);  // --gpu-weights
        engine = make_engine(*m.model, *m.tokenizer, o.engine);
    }
    o.server.sampling_defaults = server::api_default_sampling();
    apply_generation_defaults(m, o.server.sampling_defaults, {});  // requests' own fields win over these
    o.server.model_id = model_id;
    o.server.log_requests = !o.quiet;
    o.server.parse_reasoning = o.reasoning_format == "auto";
    if (o.tool_format != "auto") {
        using server::ToolFormat;
        static const std::pair<const char*, ToolFormat> kFormats[] = {
            {"none", ToolFormat::None},       {"hermes", ToolFormat::Hermes},   {"xml", ToolFormat::Xml},
            {"llama3", ToolFormat::Llama3},   {"mistral", ToolFormat::Mistral}, {"deepseek", ToolFormat::DeepSeek},
            {"dsml", ToolFormat::Dsml},       {"harmony", ToolFormat::Harmony}};
        for (const auto& [name, f] : kFormats)
            if (o.tool_format == name) o.server.tool_format = f;
    }
    // Embeddings: a CPU pass of the model's own weights (on any device),
    // on a pool of their own made at the first request.
    o.server.n_embd = m.model->config().n_embd;
    o.server.embed = [&m, threads = o.engine.n_threads, pool = std::shared_ptr<ThreadPool>()](
                         const std::vector<int32_t>& ids) mutable {
        if (!pool) pool = std::make_shared<ThreadPool>(threads);
        return embed(*m.model, ids, pooling_of(m.model->config()), *pool);
    };
    server::HttpServer http(*engine, *m.tokenizer, &*tmpl, o.server);
    const int port = http.bind();
    const std::string host = o.server.host.find(':') != std::string::npos ? "[" + o.server.host + "]" : o.server.host;
    std::fprintf(stderr,
                 "quern: serving '%s' at http://%s:%d/v1 on %s (context %lld, %d in parallel, KV cache %lld tokens, "
                 "queue %d%s); Ctrl-C stops\n",
                 model_id.c_str(), host.c_str(), port, backend.c_str(), static_cast<long long>(o.engine.n_ctx),
                 o.engine.n_parallel, static_cast<long long>(engine->stats().kv_tokens_total), o.engine.max_queue,
                 o.server.api_key.empty() ? "" : ", API key required");
    if (o.server.webui) std::fprintf(stderr, "quern: web chat at http://%s:%d/\n", host.c_str(), port);
    if (o.engine.spec_draft > 0)
        std::fprintf(stderr, "quern: speculative decoding: the model's MTP head drafts %d per round (see /metrics)\n",
                     o.engine.spec_draft);
    const bool loopback = o.server.host == "127.0.0.1" || o.server.host == "::1" || o.server.host == "localhost";
    if (!loopback && o.server.api_key.empty())
        std::fprintf(stderr, "quern: note: listening on %s without --api-key: anyone who can reach this port can use it\n",
                     o.server.host.c_str());
    std::fflush(stderr);

    std::atomic<bool> done{false};
    std::thread stopper([&] {
        while (!done.load())
            if (wait_signal(sigs, 0.2)) break;
        if (done.load()) return;
        http.begin_shutdown();
        std::fprintf(stderr, "quern: shutting down: finishing %d request(s) (up to %.0f s; Ctrl-C again stops now)\n",
                     http.in_flight(), o.grace_seconds);
        const double end = now_seconds() + o.grace_seconds;
        while (http.in_flight() > 0 && now_seconds() < end)
            if (wait_signal(sigs, 0.1)) {
                // a second signal: stop now, cutting the running requests off
                const int cut = http.in_flight();
                engine->shutdown();
                std::fprintf(stderr, "quern: stopped at once; %d request(s) cut off\n", cut);
                std::fflush(stderr);
                std::_Exit(130);
            }
        engine->shutdown();  // cuts off what is left: those answers end with finish_reason "abort"
        // One hard deadline for the rest: the cut-off answers get their last
        // chunk out, then open connections (a client that reads nothing, a
        // worker stuck in a chat-template render) are dropped at exit.
        const double hard = now_seconds() + kStopSeconds, flush = now_seconds() + 1;
        while (http.in_flight() > 0 && now_seconds() < flush)
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        http.stop();
        while (!done.load()) {
            const bool signalled = wait_signal(sigs, 0.1);
            if (!signalled && now_seconds() < hard) continue;
            if (done.load()) return;
            std::fprintf(stderr, "quern: stopped; %s\n",
                         signalled ? "connections still open were dropped (second signal)"
                                   : "connections still open at the stop deadline were dropped");
            std::fflush(stderr);
            std::_Exit(signalled ? 130 : 0);
        }
    });
    http.run();
    done.store(true);
    stopper.join();
    engine->shutdown();
    std::fprintf(stderr, "quern: stopped\n");
    return 0;
}

}  // namespace
}  // namespace quern::cli

void add_serve_command(CLI::App& app) {
    using namespace quern::cli;
    auto o = std::make_shared<ServeOptions>();
    CLI::App* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
    cmd->add_option("-m,--model", o->model,
                    "GGUF model file, or a Hugging Face folder (safetensors; llama, qwen2, qwen3, qwen3_moe, mixtral, phi3, gemma2, gemma3_text; "
                    "bf16/fp16/fp32, or FP8 / NVFP4 checkpoints, run weight-only) "
                    "(default: SmolLM2-135M-Instruct in $QUERN_HOME)");
    cmd->add_option("--host", o->server.host, "Address to listen on (0.0.0.0: every interface)")->capture_default_str();
    cmd->add_option("--port", o->server.port, "Port to listen on (0: any free port, printed at start)")
        ->capture_default_str()
        ->check(CLI::Range(0, 65535));
    cmd->add_option("-c,--ctx-size", o->engine.n_ctx, "Context size per sequence in tokens (prompt + reply)")
        ->capture_default_str()
        ->check(CLI::Range(int64_t{16}, int64_t{1} << 20));
    cmd->add_option("--parallel", o->engine.n_parallel, "Sequences generated at once")
        ->capture_default_str()
        ->check(CLI::Range(1, 1024));
    cmd->add_option("--max-queue", o->engine.max_queue, "Waiting requests beyond which new ones get 429")
        ->capture_default_str()
        ->check(CLI::Range(0, 1 << 20));
    cmd->add_option("--token-budget", o->engine.token_budget,
                    "Tokens per batched step (decodes plus prompt chunks)")
        ->capture_default_str()
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
    cmd->add_option("--kv-tokens", o->engine.kv_tokens,
                    "KV-cache positions shared by all sequences (default on the GPU: as many as the memory left "
                    "after the load holds, less 1.5 GiB, or --gpu-mem's share; on the CPU or with --spec: context x "
                    "parallel); when they run out, the newest sequences wait and are recomputed")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
    cmd->add_option("--state-snapshots", o->engine.state_snapshots,
                    "Models with recurrent state (Qwen3.5): prefix states kept for the prefix cache (-1: as many as "
                    "--parallel; each costs one sequence's state)")
        ->capture_default_str()
        ->check(CLI::Range(-1, 65536));
    cmd->add_flag("--no-prefix-cache", [o](int64_t) { o->engine.prefix_cache = false; },
                  "Do not reuse the cached keys/values of earlier prompts that start the same way");
    cmd->add_option("--api-key", o->server.api_key,
                    "Require 'Authorization: Bearer KEY' on /v1 routes (or set QUERN_API_KEY)")
        ->envname("QUERN_API_KEY");
    cmd->add_option("--alias", o->alias, "Model id that /v1/models lists and requests name (default: the file name)");
    auto* tn = cmd->add_option("--chat-template", o->template_name,
                               "Built-in template (chatml, llama2, llama3, mistral, gemma, phi3) or the GGUF's "
                               "tokenizer.chat_template.NAME; default: the model's own");
    cmd->add_option("--chat-template-file", o->template_file, "Jinja chat template file")->excludes(tn);
    cmd->add_option("--tool-call-format", o->tool_format,
                    "How the model writes tool calls, to parse and to force: auto (read from the chat template), none "
                    "(calls stay text), hermes (<tool_call>{json}</tool_call>), xml (Qwen3-Coder / Qwen3.5), llama3, "
                    "mistral, deepseek (V3 / R1 / V3.1), dsml (DeepSeek V4), harmony (gpt-oss)")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "none", "hermes", "xml", "llama3", "mistral", "deepseek", "dsml", "harmony"}));
    cmd->add_option("--reasoning-format", o->reasoning_format,
                    "auto: <think> reasoning apart in reasoning_content; none: left in the content (a request's "
                    "reasoning_format overrides it)")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "none"}));
    cmd->add_option("--device", o->dev.device,
                    "Where to run: auto (the GPU when there is one and it runs the model), cpu or cuda")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    cmd->add_option("--gpu-weights", o->dev.gpu_weights,
                    "Weights on the GPU: native, or fp8 (layer matrices converted to FP8 E4M3 with one scale per "
                    "output channel)")
        ->capture_default_str()
        ->check(CLI::IsMember({"native", "fp8"}));
    cmd->add_option("--gpu-mem", o->dev.gpu_mem,
                    "Fraction of the GPU's memory quern may hold (weights, scratch and KV cache): the KV cache gets "
                    "what the rest leaves (with --kv-tokens: at most that many positions)")
        ->check(CLI::Range(0.01, 1.0));
    add_model_options(cmd, o->mopts);
    add_threads_option(cmd, o->engine.n_threads);
    add_spec_options(cmd, o->spec);
    cmd->add_flag("-q,--quiet", o->quiet, "Do not log one line per request");
    cmd->add_option("--shutdown-grace", o->grace_seconds,
                    "Seconds running requests may go on after SIGTERM / Ctrl-C; then they end with finish_reason "
                    "\"abort\" and the server exits (a second signal exits at once)")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 3600.0));
    cmd->add_flag("--no-webui", [o](int64_t) { o->server.webui = false; },
                  "Do not serve the web chat page at /");
    cmd->add_flag("--parse-special-in-messages", o->server.parse_special_in_messages,
                  "Let special-token text inside messages (\"<|im_end|>\" typed by a user, in a tool result or "
                  "schema) become control tokens; by default it is tokenized as plain text");
    cmd->footer(
        "Open http://127.0.0.1:8080/ in a browser for the web chat (conversations stay in the browser).\n"
        "Routes: POST /v1/chat/completions, POST /v1/completions, POST /v1/responses (OpenAI Responses),\n"
        "POST /v1/messages and /v1/messages/count_tokens (Anthropic Messages), POST /v1/embeddings, POST /v1/tokenize,\n"
        "/v1/detokenize, GET /v1/models, GET /health, GET /metrics, GET / (web chat). Tool calls and <think> reasoning are parsed\n"
        "from the output of models whose chat template writes them; response_format json_object / json_schema,\n"
        "a GBNF 'grammar' and vLLM's guided_* fields constrain decoding.\n"
        "Bodies over 8 MiB get 413. SIGINT/SIGTERM: new requests get 503, running ones get 10 s to finish\n"
        "(--shutdown-grace), then end with finish_reason \"abort\"; the process exits 3 s later at most, even with a\n"
        "worker still busy; a second signal stops at once.\n"
        "Sampling fields a request leaves out take OpenAI's defaults (temperature 1, top_p 1, no top_k / min_p),\n"
        "or those of a Hugging Face folder's generation_config.json (do_sample false: temperature 0).\n"
        "Examples:\n"
        "  quern serve\n"
        "  quern serve -m model.gguf --port 8000 -c 8192 --parallel 8 --api-key secret\n"
        "  quern serve -m llama3-8b.gguf --device cuda --parallel 64 --token-budget 2048\n"
        "  quern serve -m Qwen3.5-2B --spec mtp --spec-draft 2   # drafts by the model's MTP head\n"
        "  curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\\n"
        "       -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hi!\"}], \"max_tokens\": 32}'\n"
        "  curl http://127.0.0.1:8080/v1/completions -H 'Content-Type: application/json' \\\n"
        "       -d '{\"prompt\": \"The capital of France is\", \"max_tokens\": 16, \"temperature\": 0}'");
    cmd->callback([o] {
        o->engine.spec_draft = o->spec.method.empty() ? 0 : o->spec.n_draft;
        serve(*o);
    });
}
