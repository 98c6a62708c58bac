#include "chat/prompt.h"

namespace quern::chat {

namespace {

constexpr std::string_view kOpen = "\xEF\xB7\x90";   // U+FDD0
constexpr std::string_view kClose = "\xEF\xB7\x91";  // U+FDD1

/// `s` with the marks removed and every control-token text wrapped in them;
/// false when nothing was wrapped (s then left as it was, marks and all).
bool mark(std::string& s, const std::vector<std::string_view>& texts) {
    bool any = false;
    std::string out;
    for (size_t i = 0; i < s.size();) {
        if (s.compare(i, kOpen.size(), kOpen) == 0 || s.compare(i, kClose.size(), kClose) == 0) {
            i += kOpen.size();
            any = true;  // rewritten without it either way
            continue;
        }
        bool hit = false;
        for (std::string_view t : texts) {  // longest first
            if (s.compare(i, t.size(), t) != 0) continue;
            out.append(kOpen).append(t).append(kClose);
            i += t.size();
            hit = any = true;
            break;
        }
        if (!hit) out.push_back(s[i++]);
    }
    if (any) s = std::move(out);
    return any;
}

bool mark_all(Json& j, const std::vector<std::string_view>& texts) {
    bool any = false;
    if (j.is_string()) {
        std::string s = j.get<std::string>();
        if (mark(s, texts)) {
            j = std::move(s);
            any = true;
        }
    } else if (j.is_array() || j.is_object()) {
        for (auto& v : j) any |= mark_all(v, texts);
    }
    return any;
}

}  // namespace

RenderedPrompt render_prompt(const ChatTemplate& tmpl, const Json& messages, const ChatOptions& opts,
                             const Tokenizer& tok, bool parse_special_in_messages) {
    if (parse_special_in_messages) return {tmpl.apply(messages, opts), {}};
    const std::vector<std::string_view> texts = tok.control_texts();
    Json m = messages;
    ChatOptions o = opts;
    const bool marked = mark_all(m, texts) | mark_all(o.tools, texts);
    if (!marked) return {tmpl.apply(messages, opts), {}};
    const std::string rendered = tmpl.apply(m, o);
    RenderedPrompt p;
    p.text.reserve(rendered.size());
    size_t open = std::string::npos;
    for (size_t i = 0; i < rendered.size();) {
        if (rendered.compare(i, kOpen.size(), kOpen) == 0) {
            open = p.text.size();
            i += kOpen.size();
        } else if (rendered.compare(i, kClose.size(), kClose) == 0) {
            if (open != std::string::npos && p.text.size() > open) p.plain.emplace_back(open, p.text.size());
            open = std::string::npos;
            i += kClose.size();
        } else {
            p.text.push_back(rendered[i++]);
        }
    }
    return p;
}

}  // namespace quern::chat
