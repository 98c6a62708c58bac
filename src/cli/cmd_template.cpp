// quern template: renders a chat template over a conversation and prints the
// prompt exactly (no newline added). The template comes from a model's GGUF
// metadata (-m; only the metadata and tokenizer are read), a Jinja file
// (--template) or a built-in (--chat-template NAME).
//
// --jsonl renders many templates in one process (used by the differential
// tests against Python jinja2): each stdin line is
//   {"template": SOURCE, "context": {variables...}, "now": "2025-03-14T09:26:53"}
// and each stdout line is {"output": TEXT} or {"error": MESSAGE, "type": CLASS}.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "chat/chat.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

using quern::chat::Json;

struct TemplateCmdOptions {
    std::string model;
    std::string template_file;
    std::string builtin;
    std::string messages_file;
    std::string tools_file;
    std::vector<std::string> vars;
    std::string now;
    std::string bos, eos;
    bool bos_set = false, eos_set = false;
    bool add_generation_prompt = false;
    bool jsonl = false;
};

std::string read_all(const std::string& path) {
    if (path == "-") {
        std::stringstream ss;
        ss << std::cin.rdbuf();
        return ss.str();
    }
    std::ifstream f(path, std::ios::binary);
    if (!f) quern::fail("cannot open '{}'", path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

Json read_json(const std::string& path) {
    try {
        return Json::parse(read_all(path));
    } catch (const Json::parse_error& e) {
        quern::fail("'{}' is not valid JSON: {}", path, e.what());
    }
}

std::string template_error(const quern::jinja::TemplateError& e) { return e.what(); }

int run_jsonl() {
    std::string line;
    size_t n = 0;
    while (std::getline(std::cin, line)) {
        ++n;
        if (line.empty()) continue;
        nlohmann::json out;
        try {
            const Json in = Json::parse(line);
            quern::jinja::RenderOptions ro;
            if (in.contains("now") && in["now"].is_string()) ro.now = quern::chat::parse_time(in["now"].get<std::string>());
            const quern::jinja::Template t(in.at("template").get<std::string>());
            out["output"] = t.render(quern::jinja::from_json(in.value("context", Json::object())), ro);
        } catch (const quern::jinja::TemplateError& e) {
            out["error"] = e.message();
            out["type"] = e.type();
            out["line"] = e.line();
        } catch (const Json::exception& e) {
            quern::fail("stdin line {}: {}", n, e.what());
        }
        const std::string s = out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
        std::fwrite(s.data(), 1, s.size(), stdout);
        std::fflush(stdout);
    }
    return 0;
}

int run_template(const TemplateCmdOptions& o) {
    if (o.jsonl) return run_jsonl();
    std::unique_ptr<quern::chat::ChatTemplate> tmpl;
    std::string bos = o.bos, eos = o.eos;
    if (!o.template_file.empty() || (!o.builtin.empty() && o.model.empty())) {
        std::string src;
        if (!o.template_file.empty()) src = read_all(o.template_file);
        else if (auto b = quern::chat::builtin_template(o.builtin)) src = *b;
        else quern::fail("unknown built-in chat template '{}'", o.builtin);
        if (!o.model.empty()) {  // the model's special tokens, as its own template would see them
            quern::GgufFile f(quern::cli::resolve_model_path(o.model));
            auto tok = quern::Tokenizer::from_gguf(f);
            if (!o.bos_set) bos = quern::chat::bos_text(*tok);
            if (!o.eos_set) eos = quern::chat::eos_text(*tok);
        }
        tmpl = std::make_unique<quern::chat::ChatTemplate>(src, bos, eos, o.template_file);
    } else {
        quern::GgufFile f(quern::cli::resolve_model_path(o.model));
        auto tok = quern::Tokenizer::from_gguf(f);
        auto t = quern::chat::ChatTemplate::for_model(f, *tok, o.builtin);
        if (!o.bos_set) bos = t.bos_token();
        if (!o.eos_set) eos = t.eos_token();
        tmpl = std::make_unique<quern::chat::ChatTemplate>(t.source(), bos, eos, t.origin());
        tmpl->set_special_tokens(t.special_tokens());
    }
    Json doc = read_json(o.messages_file);
    Json messages;
    quern::chat::ChatOptions co;
    co.add_generation_prompt = o.add_generation_prompt;
    if (doc.is_array()) {
        messages = doc;
    } else if (doc.is_object() && doc.contains("messages")) {
        messages = doc["messages"];
        for (const auto& [k, v] : doc.items()) {
            if (k == "messages") continue;
            if (k == "tools") co.tools = v;
            else if (k == "add_generation_prompt") co.add_generation_prompt = v.is_boolean() ? v.get<bool>() : co.add_generation_prompt;
            else co.extra[k] = v;
        }
    } else {
        quern::fail("'{}' must hold a JSON array of messages or an object with \"messages\"", o.messages_file);
    }
    if (o.add_generation_prompt) co.add_generation_prompt = true;
    if (!o.tools_file.empty()) co.tools = read_json(o.tools_file);
    for (const std::string& kv : o.vars) {
        const size_t eq = kv.find('=');
        if (eq == std::string::npos || eq == 0) quern::fail("--var wants KEY=JSON, got '{}'", kv);
        const std::string val = kv.substr(eq + 1);
        try {
            co.extra[kv.substr(0, eq)] = Json::parse(val);
        } catch (const Json::parse_error&) {
            co.extra[kv.substr(0, eq)] = val;  // a bare word is a string
        }
    }
    if (!o.now.empty()) {
        co.now = quern::chat::parse_time(o.now);
        if (!co.now) quern::fail("--now wants YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS, got '{}'", o.now);
    }
    try {
        const std::string out = tmpl->apply(messages, co);
        std::fwrite(out.data(), 1, out.size(), stdout);
        std::fflush(stdout);
    } catch (const quern::jinja::TemplateError& e) {
        quern::fail("{}", template_error(e));
    }
    return 0;
}

}  // namespace

void add_template_command(CLI::App& app) {
    auto o = std::make_shared<TemplateCmdOptions>();
    CLI::App* cmd = app.add_subcommand("template", "Render a chat template over a conversation (the prompt, exactly, to stdout)");
    cmd->add_option("-m,--model", o->model, "GGUF model whose tokenizer.chat_template to use (default: SmolLM2-135M-Instruct)");
    auto* tf = cmd->add_option("--template,--chat-template-file", o->template_file, "Jinja template file instead of a model's");
    cmd->add_option("--chat-template", o->builtin,
                    "Built-in template (chatml, llama2, llama3, mistral, gemma, phi3) or a GGUF's named template")
        ->excludes(tf);
    cmd->add_option("--messages", o->messages_file,
                    "JSON file ('-' = stdin): an array of messages, or an object with \"messages\" and more variables");
    cmd->add_option("--tools", o->tools_file, "JSON file with an array of tool schemas");
    cmd->add_flag("--add-generation-prompt", o->add_generation_prompt, "End with the assistant turn's header");
    cmd->add_option_function<std::string>("--bos-token", [o](const std::string& s) { o->bos = s, o->bos_set = true; },
                                          "bos_token text (default: the model's)");
    cmd->add_option_function<std::string>("--eos-token", [o](const std::string& s) { o->eos = s, o->eos_set = true; },
                                          "eos_token text (default: the model's)");
    cmd->add_option("--var", o->vars, "Extra template variable KEY=JSON (e.g. enable_thinking=false); repeatable");
    cmd->add_option("--now", o->now, "Time strftime_now() sees (YYYY-MM-DD[THH:MM:SS]; default: now)");
    cmd->add_flag("--jsonl", o->jsonl, "Batch mode: JSON lines {template, context, now} on stdin, results on stdout");
    cmd->footer(
        "Examples:\n"
        "  quern template --messages chat.json --add-generation-prompt\n"
        "  quern template --template t.jinja --messages chat.json --tools tools.json --bos-token '<s>'\n"
        "  quern template --chat-template llama3 --messages chat.json --var enable_thinking=false");
    cmd->callback([o] {
        if (!o->jsonl && o->messages_file.empty()) throw CLI::ValidationError("--messages", "give the conversation with --messages FILE.json");
        run_template(*o);
    });
}
