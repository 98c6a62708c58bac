#include "tokenizer/normalizer.h"

#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/unicode_nfc.h"

namespace quern {

NormStep NormStep::prepend(std::string text) {
    NormStep s;
    s.kind = Kind::Prepend;
    s.a = std::move(text);
    return s;
}

NormStep NormStep::replace(std::string from, std::string to) {
    NormStep s;
    s.kind = Kind::Replace;
    s.a = std::move(from);
    s.b = std::move(to);
    return s;
}

NormStep NormStep::replace_regex(std::string pattern, std::string to) {
    NormStep s;
    s.kind = Kind::ReplaceRegex;
    s.a = std::move(pattern);
    s.b = std::move(to);
    return s;
}

NormStep NormStep::strip(bool left, bool right) {
    NormStep s;
    s.kind = Kind::Strip;
    s.left = left;
    s.right = right;
    return s;
}

NormStep NormStep::nfc() {
    NormStep s;
    s.kind = Kind::Nfc;
    return s;
}

std::vector<NormStep> gguf_bpe_normalizer(std::string_view family, std::string_view arch) {
    std::vector<NormStep> steps;
    if (family == "qwen2" || family == "qwen35" || (family == "gpt2" && arch == "gptneox"))
        steps.push_back(NormStep::nfc());
    return steps;
}

Normalizer::Normalizer(std::vector<NormStep> steps) : steps_(std::move(steps)) {
    for (const NormStep& s : steps_)
        regexes_.push_back(s.kind == NormStep::Kind::ReplaceRegex ? std::make_unique<Regex>(s.a) : nullptr);
}

Normalizer::~Normalizer() = default;
Normalizer::Normalizer(Normalizer&&) noexcept = default;
Normalizer& Normalizer::operator=(Normalizer&&) noexcept = default;

std::string_view Normalizer::apply(std::string_view text, std::string& buf) const {
    std::string_view cur = text;
    // Each step builds its output in a fresh string before swapping it into
    // `buf`, so `cur` may point into `buf` while it is read.
    auto target = [&]() -> std::string& { return buf; };
    for (size_t k = 0; k < steps_.size(); ++k) {
        const NormStep& s = steps_[k];
        switch (s.kind) {
            case NormStep::Kind::Nfc: {
                std::string out;
                const std::string_view r = unicode::nfc(cur, out);
                if (r.data() == cur.data() && r.size() == cur.size()) break;  // already NFC
                std::string& t = target();
                t.swap(out);
                cur = t;
                break;
            }
            case NormStep::Kind::Prepend: {
                if (cur.empty()) break;  // HF: nothing is prepended to empty text
                std::string& t = target();
                std::string out;
                out.reserve(s.a.size() + cur.size());
                out.append(s.a);
                out.append(cur);
                t.swap(out);
                cur = t;
                break;
            }
            case NormStep::Kind::Replace: {
                if (s.a.empty() || cur.find(s.a) == std::string_view::npos) break;
                std::string out;
                out.reserve(cur.size() + cur.size() / 4);
                size_t last = 0;
                for (size_t p; (p = cur.find(s.a, last)) != std::string_view::npos; last = p + s.a.size()) {
                    out.append(cur.substr(last, p - last));
                    out.append(s.b);
                }
                out.append(cur.substr(last));
                std::string& t = target();
                t.swap(out);
                cur = t;
                break;
            }
            case NormStep::Kind::ReplaceRegex: {
                std::string out;
                size_t last = 0;
                bool any = false;
                regexes_[k]->for_each_match(cur, [&](size_t b, size_t e) {
                    out.append(cur.substr(last, b - last));
                    out.append(s.b);
                    last = e;
                    any = true;
                });
                if (!any) break;
                out.append(cur.substr(last));
                std::string& t = target();
                t.swap(out);
                cur = t;
                break;
            }
            case NormStep::Kind::Strip: {
                size_t b = 0, e = cur.size();
                if (s.left) {
                    while (b < e) {
                        const auto c = unicode::utf8_decode(cur, b);
                        if (!c.valid || !unicode::is_white_space(c.cp)) break;
                        b += c.len;
                    }
                }
                if (s.right) {
                    while (e > b) {
                        size_t p = e - 1;
                        while (p > b && (static_cast<uint8_t>(cur[p]) & 0xC0) == 0x80) --p;
                        const auto c = unicode::utf8_decode(cur, p);
                        if (!c.valid || p + c.len != e || !unicode::is_white_space(c.cp)) break;
                        e = p;
                    }
                }
                cur = cur.substr(b, e - b);
                break;
            }
        }
    }
    return cur;
}

}  // namespace quern
