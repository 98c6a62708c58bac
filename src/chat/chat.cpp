// Chat formatting through a model's template (see chat.h).
#include "chat/chat.h"

#include <ctime>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

namespace quern::chat {

namespace {
/// Parses a template; a syntax error names `origin` (its file, ...) unless
/// that is the constructor's placeholder.
jinja::Template parse_template(const std::string& source, const std::string& origin) {
    try {
        return jinja::Template(source);
    } catch (const jinja::TemplateError& e) {
        if (origin.empty() || origin == "template") throw;
        throw e.in(origin);
    }
}
}  // namespace

ChatTemplate::ChatTemplate(std::string source, std::string bos_token, std::string eos_token, std::string origin)
    : source_(std::move(source)), bos_(std::move(bos_token)), eos_(std::move(eos_token)), origin_(std::move(origin)),
      tmpl_(parse_template(source_, origin_)) {}

std::string bos_text(const Tokenizer& tok) { return tok.bos() >= 0 ? tok.token_to_piece(tok.bos(), true) : ""; }
std::string eos_text(const Tokenizer& tok) { return tok.eos() >= 0 ? tok.token_to_piece(tok.eos(), true) : ""; }

ChatTemplate ChatTemplate::for_model(const GgufFile& f, const Tokenizer& tok, const std::string& name,
                                     const std::string& file_path) {
    const TemplateLookup lookup = [&f](const std::string& n) {
        return f.get_string(n.empty() ? std::string("tokenizer.chat_template") : "tokenizer.chat_template." + n, "");
    };
    return for_model(lookup, "tokenizer.chat_template", tok, name, file_path);
}

ChatTemplate ChatTemplate::for_model(const TemplateLookup& lookup, const std::string& where, const Tokenizer& tok,
                                     const std::string& name, const std::string& file_path) {
    ChatTemplate t = for_model_source(lookup, where, tok, name, file_path);
    Json specials = Json::object();
    if (tok.unk() >= 0) specials["unk_token"] = tok.token_to_piece(tok.unk(), true);
    if (tok.pad() >= 0) specials["pad_token"] = tok.token_to_piece(tok.pad(), true);
    t.set_special_tokens(std::move(specials));
    return t;
}

ChatTemplate ChatTemplate::for_model_source(const TemplateLookup& lookup, const std::string& where,
                                            const Tokenizer& tok, const std::string& name,
                                            const std::string& file_path) {
    const std::string bos = bos_text(tok), eos = eos_text(tok);
    if (!file_path.empty()) {
        std::ifstream in(file_path, std::ios::binary);
        if (!in) fail("cannot open chat template file '{}'", file_path);
        std::stringstream ss;
        ss << in.rdbuf();
        return ChatTemplate(ss.str(), bos, eos, file_path);
    }
    if (!name.empty()) {
        const std::string named = lookup(name);
        if (!named.empty()) return ChatTemplate(named, bos, eos, where + "." + name);
        const auto b = builtin_template(name);
        if (!b) {
            std::string names;
            for (const auto& n : builtin_template_names()) names += (names.empty() ? "" : ", ") + n;
            fail("unknown chat template '{}' (built-in: {}; or pass --chat-template-file FILE)", name, names);
        }
        return ChatTemplate(*b, bos, eos, "built-in " + name);
    }
    const std::string src = lookup("");
    if (!src.empty()) return ChatTemplate(src, bos, eos, where);
    const std::string guess = guess_builtin_template(tok);
    return ChatTemplate(*builtin_template(guess), bos, eos, "built-in " + guess + " (the model has no template)");
}

std::string ChatTemplate::apply(const Json& messages, const ChatOptions& opts) const {
    Json ctx = Json::object();
    ctx["messages"] = messages.is_null() ? Json::array() : messages;
    ctx["tools"] = opts.tools.is_array() ? opts.tools : Json(nullptr);
    ctx["documents"] = nullptr;
    ctx["add_generation_prompt"] = opts.add_generation_prompt;
    ctx["bos_token"] = bos_;
    ctx["eos_token"] = eos_;
    for (const auto& [k, v] : specials_.items()) ctx[k] = v;
    if (opts.extra.is_object())
        for (const auto& [k, v] : opts.extra.items()) ctx[k] = v;
    jinja::RenderOptions ro;
    ro.now = opts.now;
    return tmpl_.render(jinja::from_json(ctx), ro);
}

std::optional<std::tm> parse_time(std::string_view iso) {
    std::tm tm{};
    std::istringstream ss{std::string(iso)};
    if (iso.size() > 10) ss >> std::get_time(&tm, "%Y-%m-%dT%H:%M:%S");
    else ss >> std::get_time(&tm, "%Y-%m-%d");
    if (ss.fail()) return std::nullopt;
    std::tm copy = tm;
    if (timegm(&copy) == static_cast<std::time_t>(-1)) return std::nullopt;
    tm.tm_wday = copy.tm_wday;
    tm.tm_yday = copy.tm_yday;
    tm.tm_isdst = 0;
    return tm;
}

}  // namespace quern::chat
