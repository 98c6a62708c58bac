#include "chat/prompt.h"

namespace quern::chat {

namespace {

constexpr std::string_view kOpen = "\xEF\xB7\x90";   // U+FDD0
constexpr std::string_view kClose = "\xEF\xB7\x91";  // U+FDD1

/// `s` with the marks removed and every control-token text wrapped in them;
/// false when nothing was wrapped or removed (s then left as it was).
bool mark(std::string& s, const Tokenizer& tok) {
    const auto is_mark = [&](size_t i) {
        return s.compare(i, kOpen.size(), kOpen) == 0 || s.compare(i, kClose.size(), kClose) == 0;
    };
    bool marks = false;
    for (size_t i = s.find('\xEF'); i != std::string::npos && !marks; i = s.find('\xEF', i + 1)) marks = is_mark(i);
    if (marks) {  // typed marks go first, so they cannot pair with ours
        std::string clean;
        for (size_t i = 0; i < s.size();) {
            if (is_mark(i)) i += kOpen.size();
            else clean.push_back(s[i++]);
        }
        s = std::move(clean);
    }
    const Tokenizer::PlainRanges spans = tok.control_spans(s);
    if (spans.empty()) return marks;
    std::string out;
    out.reserve(s.size() + spans.size() * (kOpen.size() + kClose.size()));
    size_t at = 0;
    for (const auto& [b, e] : spans) {
        out.append(s, at, b - at).append(kOpen).append(s, b, e - b).append(kClose);
        at = e;
    }
    out.append(s, at, std::string::npos);
    s = std::move(out);
    return true;
}

bool mark_all(Json& j, const Tokenizer& tok) {
    bool any = false;
    if (j.is_string()) {
        std::string s = j.get<std::string>();
        if (mark(s, tok)) {
            j = std::move(s);
            any = true;
        }
    } else if (j.is_array() || j.is_object()) {
        for (auto& v : j) any |= mark_all(v, tok);
    }
    return any;
}

}  // namespace

RenderedPrompt render_prompt(const ChatTemplate& tmpl, const Json& messages, const ChatOptions& opts,
                             const Tokenizer& tok, bool parse_special_in_messages) {
    if (parse_special_in_messages) return {tmpl.apply(messages, opts), {}};
    Json m = messages;
    ChatOptions o = opts;
    const bool marked = mark_all(m, tok) | mark_all(o.tools, tok);
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
