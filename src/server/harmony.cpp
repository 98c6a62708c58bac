#include "server/harmony.h"

#include <iterator>

namespace quern::server {

namespace {

constexpr std::string_view kMessage = "<|message|>", kChannel = "<|channel|>";
// What ends a body: the message's end, a call, the final answer's return, or
// (a model that skips the end) the next message's start.
constexpr std::string_view kEnds[] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>"};

/// The word after `key` in `header` (up to a space or a marker), or "".
std::string word_after(std::string_view header, std::string_view key) {
    const size_t at = header.find(key);
    if (at == std::string_view::npos) return "";
    std::string_view rest = header.substr(at + key.size());
    size_t end = 0;
    while (end < rest.size() && rest[end] != ' ' && rest[end] != '<' && rest[end] != '\n') ++end;
    return std::string(rest.substr(0, end));
}

}  // namespace

HarmonyParser::HarmonyParser(bool calls, std::function<std::string()> new_id)
    : calls_(calls), new_id_(std::move(new_id)) {}

void HarmonyParser::open(ChatDelta& d, std::string_view header) {
    const std::string channel = word_after(header, kChannel);
    const std::string to = word_after(header, "to=");
    dest_ = channel == "analysis" ? Dest::Reasoning : Dest::Content;
    if (calls_ && to.rfind("functions.", 0) == 0 && to.size() > 10) {
        dest_ = Dest::Call;
        ToolCallPiece p;
        p.index = n_calls_;
        p.id = new_id_ ? new_id_() : "call_" + std::to_string(n_calls_);
        p.name = to.substr(10);
        p.first = true;
        d.calls.push_back(std::move(p));
    }
    in_body_ = true;
    seen_header_ = true;
}

void HarmonyParser::body(ChatDelta& d, std::string_view text) {
    if (text.empty()) return;
    if (dest_ == Dest::Reasoning) {
        d.reasoning.append(text);
    } else if (dest_ == Dest::Content) {
        d.content.append(text);
    } else {
        open_piece(d, n_calls_).arguments.append(text);
    }
}

void HarmonyParser::close(ChatDelta& d) {
    if (dest_ == Dest::Call) {
        open_piece(d, n_calls_).last = true;
        ++n_calls_;
    }
    in_body_ = false;
    dest_ = Dest::Content;
}

ChatDelta HarmonyParser::push(std::string_view text) {
    ChatDelta d;
    std::string buf = held_;
    buf.append(text);
    held_.clear();
    std::string_view rest = buf;
    while (!rest.empty()) {
        if (!in_body_) {
            // A header runs to <|message|>; until it comes it is held.
            const size_t m = rest.find(kMessage);
            if (m == std::string_view::npos) {
                held_ = std::string(rest);
                break;
            }
            open(d, rest.substr(0, m));
            rest.remove_prefix(m + kMessage.size());
            continue;
        }
        size_t at = std::string_view::npos, len = 0;
        for (std::string_view e : kEnds) {
            const size_t p = rest.find(e);
            if (p < at) {
                at = p;
                len = e == "<|start|>" ? 0 : e.size();  // a start begins the next header
            }
        }
        if (at == std::string_view::npos) {
            const size_t hold = partial_marker(rest, {std::begin(kEnds), std::end(kEnds)});
            body(d, rest.substr(0, rest.size() - hold));
            held_ = std::string(rest.substr(rest.size() - hold));
            break;
        }
        body(d, rest.substr(0, at));
        close(d);
        rest.remove_prefix(at + len);
    }
    return d;
}

ChatDelta HarmonyParser::finish() {
    ChatDelta d;
    if (in_body_) {
        body(d, held_);
        close(d);
    } else if (!held_.empty() && !seen_header_) {
        d.content = held_;  // no harmony at all: the text is the answer
    }
    held_.clear();
    return d;
}

}  // namespace quern::server
