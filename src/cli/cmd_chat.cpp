// quern chat: an interactive terminal chat with a model, laid out by the
// model's chat template (or a built-in one). Each user message becomes a user
// turn; the reply streams to stdout and joins the conversation. The KV cache
// keeps the rendered conversation, so a new turn only computes the tokens
// that differ from what is cached (usually just the new message).
//
// Commands (kChatHelp): /help, /clear, /system, /save, /load, /exit. A line
// ending in a backslash goes on on the next line. With piped stdin, stdout
// holds the replies only; everything else goes to stderr.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>

#include "chat/chat.h"
#include "chat/prompt.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/decoder.h"
#include "cli/line_reader.h"
#include "core/error.h"
#include "runtime/sampler.h"
#include "server/chat_output.h"
#include "tokenizer/detokenizer.h"

namespace quern::cli {
namespace {

using server::ChatDelta;
using server::ChatOutputParser;
using server::OutputFormat;
using server::ToolFormat;

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

void note(const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); }

/// Prints a reply as it streams: a thinking model's reasoning dimmed on a
/// terminal (on stderr when stdout is piped, which keeps only answers), the
/// answer as it is; remembers the answer for the conversation.
class ReplyPrinter {
public:
    ReplyPrinter(const OutputFormat& f, bool opens_think)
        : think_(f.think && !f.harmony), tty_(::isatty(STDOUT_FILENO) != 0),
          parser_(OutputFormat{think_, ToolFormat::None, false}, opens_think, nlohmann::ordered_json::array(),
                  [] { return std::string(); }) {}
    void push(const std::string& text) { show(think_ ? parser_.push(text) : ChatDelta{{}, text, {}}); }
    void finish() {
        if (think_) show(parser_.finish());
        if (dim_) out("\033[0m");
        dim_ = false;
    }
    const std::string& answer() const { return answer_; }

private:
    void show(const ChatDelta& d) {
        if (!d.reasoning.empty()) {
            if (!tty_) {
                std::fwrite(d.reasoning.data(), 1, d.reasoning.size(), stderr);
            } else {
                if (!dim_) out("\033[2m");
                dim_ = true;
                out(d.reasoning);
            }
        }
        if (!d.content.empty()) {
            if (dim_) out("\033[0m\n");
            dim_ = false;
            out(d.content);
            answer_ += d.content;
        }
    }
    bool think_, tty_, dim_ = false;
    ChatOutputParser parser_;
    std::string answer_;
};

constexpr const char* kChatHelp =
    "commands:\n"
    "  /help           this list\n"
    "  /clear          forget the conversation (the system message stays)\n"
    "  /system TEXT    set the system message (empty: none); the conversation stays\n"
    "  /save FILE      write the conversation as JSON (a list of {role, content} messages)\n"
    "  /load FILE      read a conversation written by /save (or any such list)\n"
    "  /exit, /quit    leave (so does the end of input)\n"
    "  //TEXT          send TEXT starting with a single '/'\n"
    "A line ending in '\\' goes on on the next line.";

/// One message: lines ending in a backslash joined to the next.
LineReader::Result read_message(LineReader& reader, std::string& text) {
    text.clear();
    std::string line;
    for (bool first = true;; first = false) {
        const LineReader::Result r = reader.read(first ? "> " : ". ", line);
        if (r == LineReader::Result::Interrupted) return r;
        if (r == LineReader::Result::End) return text.empty() ? r : LineReader::Result::Line;
        if (!line.empty() && line.back() == '\\') {
            line.pop_back();
            text += line + "\n";
            continue;
        }
        text += line;
        reader.remember(text);
        return LineReader::Result::Line;
    }
}

/// A conversation read back (/load): a JSON list of {role, content}
/// messages with string contents. quern::Error naming what is wrong.
chat::Json load_conversation(const std::string& path) {
    std::ifstream f(path);
    if (!f) fail("cannot read '{}'", path);
    chat::Json j;
    try {
        j = chat::Json::parse(f);
    } catch (const chat::Json::parse_error& e) {
        fail("'{}' is not JSON: {}", path, e.what());
    }
    if (!j.is_array()) fail("'{}' must hold a list of messages", path);
    for (const auto& m : j)
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
            !m["content"].is_string())
            fail("'{}': every message needs a string 'role' and 'content'", path);
    return j;
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
    const OutputFormat fmt = server::detect_output_format(tmpl.source());  // <think> reasoning, shown apart
    std::fprintf(stderr, "quern: %s (%s, %.1fM params) loaded in %.2f s; chat template: %s\n", m.path.c_str(),
                 cfg.name.empty() ? cfg.arch.c_str() : cfg.name.c_str(), m.model->n_params() / 1e6, m.load_seconds,
                 tmpl.origin().c_str());
    SamplingParams base_sp = o.sp;
    apply_generation_defaults(m, base_sp, o.sp_given);
    if (tty) std::fprintf(stderr, "quern: type a message; /help lists the commands, /exit quits\n");

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
    std::string system = o.system;
    chat::Json messages = chat::Json::array();  // the conversation, without the system message
    const auto with_system = [&] {
        chat::Json all = chat::Json::array();
        if (!system.empty()) all.push_back({{"role", "system"}, {"content", system}});
        for (const auto& m : messages) all.push_back(m);
        return all;
    };

    ThreadPool pool(o.threads);
    std::unique_ptr<Session> session = make_session(*m.model, o.n_ctx, o.dev, pool, o.verbose);
    std::vector<int32_t> cached;  // the tokens whose keys/values are in the session's cache
    std::vector<float> logits(static_cast<size_t>(cfg.n_vocab));
    const uint64_t seed = o.seed >= 0 ? static_cast<uint64_t>(o.seed) : std::random_device{}();
    Decoder decoder(*session, *m.model, o.spec, o.dev, pool, seed);
    if (o.seed < 0 && base_sp.temperature > 0 && o.verbose) std::fprintf(stderr, "quern: seed %llu\n", static_cast<unsigned long long>(seed));

    // A chat in which no message got a reply (the template failed on each,
    // say) ends with an error status, so a script sees that it failed.
    int asked = 0, replied = 0;
    std::string last_failure;
    // On a terminal: line editing and history, and Ctrl-C stops a reply (or,
    // twice at the prompt, the chat) instead of killing the process.
    LineReader reader(tty);
    std::optional<ChatInterrupt> interrupt;
    if (tty) interrupt.emplace();
    bool interrupted_at_prompt = false;
    std::string line;
    for (int turn = 0;; ++turn) {
        const LineReader::Result got = read_message(reader, line);
        if (got == LineReader::Result::End) break;
        if (got == LineReader::Result::Interrupted) {
            if (interrupted_at_prompt) break;
            interrupted_at_prompt = true;
            note("\n(Ctrl-C again to leave, or /exit)");
            continue;
        }
        interrupted_at_prompt = false;
        std::string text = trim(line);
        if (text.empty()) continue;
        if (text[0] == '/' && text.rfind("//", 0) != 0) {
            const size_t sp = text.find(' ');
            const std::string cmd = text.substr(0, sp), arg = sp == std::string::npos ? "" : trim(text.substr(sp + 1));
            if (cmd == "/exit" || cmd == "/quit") break;
            if (cmd == "/help") {
                note(kChatHelp);
            } else if (cmd == "/clear") {
                messages = chat::Json::array();
                note("(conversation cleared)");
            } else if (cmd == "/system") {
                system = arg;
                note(arg.empty() ? "(no system message)" : "(system message set)");
            } else if (cmd == "/save" || cmd == "/load") {
                if (arg.empty()) {
                    note("quern: " + cmd + " needs a file name");
                    continue;
                }
                try {
                    if (cmd == "/save") {
                        std::ofstream f(arg);
                        // A reply cut mid-character is not UTF-8: such bytes are written as U+FFFD.
                        f << with_system().dump(2, ' ', false, chat::Json::error_handler_t::replace) << "\n";
                        if (!f) fail("cannot write '{}'", arg);
                        note(fmt::format("(conversation saved to {}: {} messages)", arg, with_system().size()));
                    } else {
                        chat::Json loaded = load_conversation(arg);
                        system.clear();
                        messages = chat::Json::array();
                        for (auto& m : loaded) {
                            if (m["role"] == "system") system = m["content"].get<std::string>();
                            else messages.push_back(m);
                        }
                        note(fmt::format("(conversation loaded from {}: {} messages)", arg, loaded.size()));
                    }
                } catch (const Error& e) {
                    note(std::string("quern: ") + e.what());
                }
            } else {
                note("quern: unknown command " + cmd + " (/help lists them; start a message with // to send a '/')");
            }
            continue;
        }
        if (text.rfind("//", 0) == 0) text.erase(0, 1);
        messages.push_back({{"role", "user"}, {"content", text}});
        ++asked;
        chat::RenderedPrompt prompt;
        try {
            prompt = chat::render_prompt(tmpl, with_system(), copts, *m.tokenizer);
        } catch (const jinja::TemplateError& e) {
            last_failure = fmt::format("the chat template ({}) failed: {}", tmpl.origin(), e.what());
            std::fprintf(stderr, "quern: %s\n", last_failure.c_str());
            messages.erase(messages.end() - 1);
            continue;
        }
        // Special-token text typed in a message stays text (chat/prompt.h).
        const std::vector<int32_t> ids = m.tokenizer->encode_prompt(prompt.text, true, nullptr, &prompt.plain);
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
        ReplyPrinter printer(fmt, server::prompt_opens_think(prompt.text));
        std::vector<int32_t> reply;
        int32_t next = -1;  // picked by the decoder (on the device where it can)
        bool ended = false;  // the model ended its reply (not the -n limit or the context)
        for (int i = 0; i < o.n_predict; ++i) {
            if (interrupt && ChatInterrupt::take()) {  // Ctrl-C: the reply stops here and stays
                printer.push(detok.flush());
                printer.finish();
                note("\n(stopped)");
                ended = true;
                break;
            }
            const int32_t tok = next >= 0 ? next : sampler.sample(logits.data());
            if (m.tokenizer->is_eog(tok)) {
                ended = true;
                break;
            }
            sampler.accept(tok);
            reply.push_back(tok);
            printer.push(detok.push(tok));
            if (decoder.context_full()) {
                std::fprintf(stderr, "\nquern: context full (%lld tokens); /clear to start over\n", static_cast<long long>(session->n_ctx()));
                break;
            }
            if (i + 1 < o.n_predict) {
                next = decoder.next(tok, sampler);
                cached.push_back(tok);
            }
        }
        printer.push(detok.flush());
        printer.finish();
        out("\n");
        if (!ended && static_cast<int>(reply.size()) >= o.n_predict)
            note(fmt::format("quern: the reply stopped at the limit of {} tokens (-n {}); raise -n for longer replies",
                             o.n_predict, o.n_predict));
        const double t2 = now_seconds();
        if (o.verbose)
            std::fprintf(stderr, "quern: prompt %zu tokens (%zu new) in %.2f s; reply %zu tokens in %.2f s\n", ids.size(),
                         ids.size() - common, t1 - t0, reply.size(), t2 - t1);
        if (o.verbose && !decoder.summary().empty())
            std::fprintf(stderr, "quern: speculative decoding %s\n", decoder.summary().c_str());
        messages.push_back({{"role", "assistant"}, {"content", trim(printer.answer())}});
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
        "In the conversation: /help lists the commands (/clear, /system TEXT, /save FILE, /load FILE, /exit);\n"
        "a line ending in '\\' goes on on the next line. On a terminal: line editing and history (libedit; the\n"
        "up arrow recalls a line, ~/.editrc applies), Ctrl-C stops a reply and keeps the conversation, Ctrl-C\n"
        "twice at the prompt leaves. Piped, stdout holds the replies only.\n"
        "A reply that stops at -n says so on stderr.\n"
        "A message the template cannot render is skipped with an error; when no message got a reply the exit status is 1.\n"
        "A Hugging Face folder's generation_config.json (temperature, top_p, top_k, min_p, repetition_penalty;\n"
        "do_sample false: greedy) replaces the defaults shown here; a flag given on the command line wins over it.");
    cmd->callback([o, cmd] {
        o->sp_given = sampling_given(*cmd);
        run_chat(*o);
    });
}
