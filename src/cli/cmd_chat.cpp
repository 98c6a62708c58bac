// quern chat: an interactive terminal chat with a model, laid out by the
// model's chat template (or a built-in one). Each user line becomes a user
// message; the reply streams to stdout and joins the conversation. The KV
// cache keeps the rendered conversation, so a new turn only computes the
// tokens that differ from what is cached (usually just the new message).
//
// Commands: /clear (forget the conversation), /exit or /quit. Works with
// piped stdin (then each input line is echoed after "> " so the output reads
// as a transcript).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <random>

#include "chat/chat.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/decoder.h"
#include "core/error.h"
#include "runtime/sampler.h"
#include "tokenizer/detokenizer.h"

namespace quern::cli {
namespace {

struct ChatCmdOptions {
    ModelOptions mopts;
    DeviceOptions dev;
    std::string model;
    std::string template_name;
    std::string template_file;
    std::string system;
    std::vector<std::string> vars;
    int n_predict = 512;
    int64_t n_ctx = 4096;
    int threads = 0;
    SamplingParams sp;
    SamplingGiven sp_given;  ///< sampling flags given on the command line
    int64_t seed = -1;
    SpecOptions spec;
    bool verbose = false;
};

std::string trim(const std::string& s) {
    size_t b = 0, e = s.size();
    while (b < e && (s[b] == ' ' || s[b] == '\t' || s[b] == '\r' || s[b] == '\n')) ++b;
    while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r' || s[e - 1] == '\n')) --e;
    return s.substr(b, e - b);
}

void out(const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
}

int run_chat(const ChatCmdOptions& o) {
    // Check the options before spending time on loading the model.
    Sampler(o.sp, 1);  // throws quern::Error for out-of-range sampling values
    use_cuda(o.dev);  // --device cuda without a GPU fails here, before the load
    LoadedModel m = load_model(o.model, o.mopts);
    const auto& cfg = m.model->config();
    const chat::ChatTemplate tmpl = chat::ChatTemplate::for_model(m.chat_templates, m.chat_templates_origin, *m.tokenizer, o.template_name,
                                                 o.template_file);
    const bool tty = ::isatty(STDIN_FILENO) != 0;
    std::fprintf(stderr, "quern: %s (%s, %.1fM params) loaded in %.2f s; chat template: %s\n", m.path.c_str(),
                 cfg.name.empty() ? cfg.arch.c_str() : cfg.name.c_str(), m.model->n_params() / 1e6, m.load_seconds,
                 tmpl.origin().c_str());
    SamplingParams base_sp = o.sp;
    apply_generation_defaults(m, base_sp, o.sp_given);
    if (tty) std::fprintf(stderr, "quern: type a message; /clear starts over, /exit quits\n");

    chat::ChatOptions copts;
    copts.add_generation_prompt = true;
    for (const std::string& kv : o.vars) {
        const size_t eq = kv.find('=');
        if (eq == std::string::npos || eq == 0) fail("--var wants KEY=JSON, got '{}'", kv);
        try {
            copts.extra[kv.substr(0, eq)] = chat::Json::parse(kv.substr(eq + 1));
        } catch (const chat::Json::parse_error&) {
            copts.extra[kv.substr(0, eq)] = kv.substr(eq + 1);
        }
    }
    chat::Json base = chat::Json::array();
    if (!o.system.empty()) base.push_back({{"role", "system"}, {"content", o.system}});
    chat::Json messages = base;

    ThreadPool pool(o.threads);
    std::unique_ptr<Session> session = make_session(*m.model, o.n_ctx, o.dev, pool, o.verbose);
    std::vector<int32_t> cached;  // the tokens whose keys/values are in the session's cache
    std::vector<float> logits(static_cast<size_t>(cfg.n_vocab));
    const uint64_t seed = o.seed >= 0 ? static_cast<uint64_t>(o.seed) : std::random_device{}();
    Decoder decoder(*session, *m.model, o.spec, pool, seed);
    if (o.seed < 0 && base_sp.temperature > 0 && o.verbose) std::fprintf(stderr, "quern: seed %llu\n", static_cast<unsigned long long>(seed));

    // A chat in which no message got a reply (the template failed on each,
    // say) ends with an error status, so a script sees that it failed.
    int asked = 0, replied = 0;
    std::string last_failure;
    std::string line;
    for (int turn = 0;; ++turn) {
        if (tty) out("> ");
        if (!std::getline(std::cin, line)) break;
        const std::string text = trim(line);
        if (!tty) out("> " + text + "\n");
        if (text.empty()) continue;
        if (text == "/exit" || text == "/quit") break;
        if (text == "/clear") {
            messages = base;
            decoder.truncate(0);
            cached.clear();
            out("(conversation cleared)\n");
            continue;
        }
        messages.push_back({{"role", "user"}, {"content", text}});
        ++asked;
        std::string prompt;
        try {
            prompt = tmpl.apply(messages, copts);
        } catch (const jinja::TemplateError& e) {
            last_failure = fmt::format("the chat template ({}) failed: {}", tmpl.origin(), e.what());
            std::fprintf(stderr, "quern: %s\n", last_failure.c_str());
            messages.erase(messages.end() - 1);
            continue;
        }
        const std::vector<int32_t> ids = chat::tokenize_prompt(*m.tokenizer, prompt);
        if (static_cast<int64_t>(ids.size()) >= session->n_ctx()) {
            last_failure = fmt::format("the conversation has {} tokens, more than the context ({})", ids.size(),
                                       session->n_ctx());
            std::fprintf(stderr, "quern: %s; /clear to start over or raise -c\n", last_failure.c_str());
            messages.erase(messages.end() - 1);
            continue;
        }
        ++replied;
        // reuse the cached prefix; at least one token must run to give logits
        size_t common = 0;
        while (common < cached.size() && common < ids.size() && cached[common] == ids[common]) ++common;
        if (common == ids.size()) --common;
        decoder.truncate(static_cast<int64_t>(common));
        cached.assign(ids.begin(), ids.end());
        const double t0 = now_seconds();
        decoder.eval(ids.data() + common, static_cast<int64_t>(ids.size() - common), logits.data());
        const double t1 = now_seconds();

        SamplingParams sp = base_sp;
        sp.seed = seed + static_cast<uint64_t>(turn);
        Sampler sampler(sp, cfg.n_vocab);
        for (int32_t t : ids) sampler.accept(t);
        Detokenizer detok(*m.tokenizer, false);
        std::vector<int32_t> reply;
        int32_t next = -1;  // picked by the decoder (on the device where it can)
        for (int i = 0; i < o.n_predict; ++i) {
            const int32_t tok = next >= 0 ? next : sampler.sample(logits.data());
            if (m.tokenizer->is_eog(tok)) break;
            sampler.accept(tok);
            reply.push_back(tok);
            out(detok.push(tok));
            if (decoder.context_full()) {
                std::fprintf(stderr, "\nquern: context full (%lld tokens); /clear to start over\n", static_cast<long long>(session->n_ctx()));
                break;
            }
            if (i + 1 < o.n_predict) {
                next = decoder.next(tok, sampler);
                cached.push_back(tok);
            }
        }
        out(detok.flush() + "\n");
        const double t2 = now_seconds();
        if (o.verbose)
            std::fprintf(stderr, "quern: prompt %zu tokens (%zu new) in %.2f s; reply %zu tokens in %.2f s\n", ids.size(),
                         ids.size() - common, t1 - t0, reply.size(), t2 - t1);
        if (o.verbose && !decoder.summary().empty())
            std::fprintf(stderr, "quern: speculative decoding %s\n", decoder.summary().c_str());
        messages.push_back({{"role", "assistant"}, {"content", trim(m.tokenizer->decode(reply, false))}});
    }
    if (tty) out("\n");
    if (asked > 0 && replied == 0) fail("no message got a reply; {}", last_failure);
    return 0;
}

}  // namespace
}  // namespace quern::cli

void add_chat_command(CLI::App& app) {
    using namespace quern::cli;
    auto o = std::make_shared<ChatCmdOptions>();
    o->sp.temperature = 0.3f;
    o->sp.repeat_penalty = 1.1f;
    CLI::App* cmd = app.add_subcommand("chat", "Chat with a model in the terminal (uses the model's chat template)");
    cmd->add_option("-m,--model", o->model,
                    "GGUF model file, or a Hugging Face folder (safetensors; llama, qwen2, qwen3, qwen3_moe, mixtral, phi3, gemma2, gemma3_text; "
                    "bf16/fp16/fp32, or FP8 / NVFP4 checkpoints, run weight-only) "
                    "(default: SmolLM2-135M-Instruct in $QUERN_HOME)");
    auto* tn = cmd->add_option("--chat-template", o->template_name,
                               "Built-in template (chatml, llama2, llama3, mistral, gemma, phi3) or the GGUF's "
                               "tokenizer.chat_template.NAME; default: the model's own");
    cmd->add_option("--chat-template-file", o->template_file, "Jinja chat template file")->excludes(tn);
    cmd->add_option("-s,--system", o->system, "System message");
    cmd->add_option("--var", o->vars, "Extra template variable KEY=JSON (e.g. enable_thinking=false); repeatable");
    cmd->add_option("-n,--n-predict", o->n_predict, "Most tokens per reply")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 30));
    cmd->add_option("-c,--ctx-size", o->n_ctx, "Context size in tokens")->capture_default_str()->check(CLI::Range(16, 1 << 20));
    add_model_options(cmd, o->mopts);
    add_device_options(cmd, o->dev);
    add_threads_option(cmd, o->threads);
    cmd->add_flag("-v,--verbose", o->verbose, "Print timings of each turn to stderr");
    add_sampling_options(cmd, o->sp, o->seed);
    add_spec_options(cmd, o->spec);
    cmd->footer(
        "Examples:\n"
        "  quern chat\n"
        "  printf 'Hi!\\nWhat is the capital of France?\\n' | quern chat --temp 0\n"
        "  quern chat -m model.gguf --chat-template llama3 -s 'Answer briefly.'\n"
        "In the conversation: /clear starts over, /exit or /quit (or end of input) leaves.\n"
        "A message the template cannot render is skipped with an error; when no message got a reply the exit status is 1.\n"
        "A Hugging Face folder's generation_config.json (temperature, top_p, top_k, min_p, repetition_penalty;\n"
        "do_sample false: greedy) replaces the defaults shown here; a flag given on the command line wins over it.");
    cmd->callback([o, cmd] {
        o->sp_given = sampling_given(*cmd);
        run_chat(*o);
    });
}
