#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <array>

#include "core/error.h"
#include "tokenizer/fast_regex.h"
#include "tokenizer/patterns.h"
#include "tokenizer/unicode.h"

namespace quern {

namespace {

using namespace patterns;

PreStep split_step(const char* p, SplitBehavior b = SplitBehavior::Isolated) { return PreStep::regex(p, b); }

struct Family {
    const char* name;
    std::vector<PreStep> steps;
};

// The `tokenizer.ggml.pre` names of each family (as in llama.cpp).
struct FamilyNames {
    std::string_view family;
    std::vector<std::string_view> names;
};
const std::vector<FamilyNames>& pre_names() {
    static const std::vector<FamilyNames> t = {
        {"gpt2", {"default", "gpt2", "gpt-2", "phi-2", "gpt-neox", "mpt", "olmo", "jais", "roberta-bpe", "gigachat",
                  "poro-chat", "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code", "jina-es", "jina-de"}},
        {"starcoder", {"starcoder", "refact", "smollm", "command-r", "codeshell", "exaone", "minerva-7b"}},
        {"llama3", {"llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"}},
        {"qwen2", {"qwen2", "stablelm2", "hunyuan", "megrez", "deepseek-r1-qwen"}},
        {"qwen35", {"qwen35"}},
        {"gpt-4o", {"gpt-4o", "llama4"}},
        {"deepseek-llm", {"deepseek-llm"}},
        {"deepseek-coder", {"deepseek-coder"}},
        {"deepseek-v3", {"deepseek-v3"}},
        {"falcon", {"falcon"}},
    };
    return t;
}

// The pipelines of the `tokenizer.ggml.pre` names (as in each family's
// tokenizer.json); an unknown name gets GPT-2's with known = false.
Family family_for(std::string_view pre, bool& known) {
    known = true;
    auto is = [&](std::string_view family) {
        for (const FamilyNames& f : pre_names())
            if (f.family == family)
                for (auto n : f.names)
                    if (pre == n) return true;
        return false;
    };
    const PreStep bl = PreStep::byte_level(false, true);
    const PreStep bl_noregex = PreStep::byte_level(false, false);
    if (is("gpt2"))
        return {"gpt2", {bl}};
    if (is("starcoder"))
        return {"starcoder", {split_step(kDigit), bl}};
    if (is("llama3"))
        return {"llama3", {split_step(kLlama3), bl_noregex}};
    if (is("qwen2"))
        return {"qwen2", {split_step(kQwen2), bl_noregex}};
    if (is("qwen35"))
        return {"qwen35", {split_step(kQwen35), bl_noregex}};
    if (is("gpt-4o"))
        return {"gpt-4o", {split_step(kGpt4o), bl_noregex}};
    if (is("deepseek-llm"))
        return {"deepseek-llm",
                {split_step(kCrLf), split_step(kDeepseekLlmLetters), split_step(kDeepseekLlmPunct),
                 split_step(kTrailingSpace), split_step(kDeepseekCjk), split_step(kDigit), bl_noregex}};
    if (is("deepseek-coder"))
        return {"deepseek-coder",
                {split_step(kCrLf), split_step(kSpaceLetters), split_step(kSpacePunct), split_step(kDeepseekCjk),
                 split_step(kDigit), bl_noregex}};
    if (is("deepseek-v3"))
        return {"deepseek-v3",
                {split_step(kDigits1to3), split_step(kDeepseek3Cjk), split_step(kDeepseek3Main), bl_noregex}};
    // Falcon: Punctuation(Contiguous) (Unicode P plus ASCII punctuation), then
    // ByteLevel; after the byte mapping, Digits(contiguous) and 3-digit groups.
    if (is("falcon"))
        return {"falcon", {split_step(kFalconPunct), bl, split_step(kDigitRun), split_step(kThreeAsciiDigits)}};
    known = false;
    return {"gpt2", {bl}};
}

std::string quote_regex(std::string_view s) {
    std::string out = "\\Q";
    out.append(s);
    out += "\\E";
    return out;
}

}  // namespace

// ---------------------------------------------------------------- Regex

Regex::Regex(std::string_view pattern, bool use_fast) : pattern_(pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
    if (!code) {
        std::array<PCRE2_UCHAR, 256> msg{};
        pcre2_get_error_message(err, msg.data(), msg.size());
        fail("tokenizer: cannot compile pre-tokenizer regex at offset {}: {} (pattern: {})", off,
             reinterpret_cast<const char*>(msg.data()), pattern_);
    }
    code_ = code;
    jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    if (use_fast) fast_ = fastre::find_matcher(pattern_);
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

Regex::Scratch::Scratch(const Regex& r) : re(r) {}

Regex::Scratch::~Scratch() {
    if (md) pcre2_match_data_free(static_cast<pcre2_match_data*>(md));
}

size_t Regex::step_len(std::string_view text, size_t pos) {
    return pos < text.size() ? unicode::utf8_decode(text, pos).len : 1;
}

bool Regex::next_match(Scratch& s, std::string_view text, size_t pos, size_t& begin, size_t& end) const {
    if (fast_) {
        switch (fast_->find(text, pos, begin, end)) {
            case fastre::Result::Match:
                return true;
            case fastre::Result::NoMatch:
                return false;
            case fastre::Result::Unknown:
                break;
        }
    }
    return pcre_match(s, text, pos, begin, end);
}

bool Regex::pcre_match(Scratch& s, std::string_view text, size_t pos, size_t& begin, size_t& end) const {
    auto* code = static_cast<pcre2_code*>(code_);
    if (!s.md) {
        s.md = pcre2_match_data_create_from_pattern(code, nullptr);
        if (!s.md) fail("tokenizer: out of memory creating regex match data");
    }
    auto* md = static_cast<pcre2_match_data*>(s.md);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    int rc = PCRE2_ERROR_NOMATCH;
    if (jit_) rc = pcre2_jit_match(code, subject, text.size(), pos, 0, md, nullptr);
    // The JIT stack is small; the interpreter keeps its backtracking on the heap.
    if (!jit_ || (rc < 0 && rc != PCRE2_ERROR_NOMATCH)) rc = pcre2_match(code, subject, text.size(), pos, 0, md, nullptr);
    if (rc < 0) return false;  // no match, or resource limits: leave the rest unsplit
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    begin = ov[0];
    end = ov[1];
    return end >= begin && end <= text.size();
}

// ---------------------------------------------------------------- PreStep

PreStep PreStep::regex(std::string pattern, SplitBehavior b, bool invert) {
    PreStep s;
    s.kind = Kind::Split;
    s.pattern = std::move(pattern);
    s.behavior = b;
    s.invert = invert;
    return s;
}

PreStep PreStep::byte_level(bool add_prefix_space, bool use_regex) {
    PreStep s;
    s.kind = Kind::ByteLevel;
    s.add_prefix_space = add_prefix_space;
    s.use_regex = use_regex;
    return s;
}

PreStep PreStep::metaspace(PrependScheme prepend, bool split) {
    PreStep s;
    s.kind = Kind::Metaspace;
    s.prepend = prepend;
    s.split = split;
    return s;
}

// ---------------------------------------------------------------- PreTokenizer

struct PreTokenizer::Compiled {
    PreStep step;
    std::unique_ptr<Regex> re;  // Split pattern; GPT-2 regex of ByteLevel; "▁" of Metaspace split
    bool mapped = false;        // a Split after ByteLevel: sees byte characters
};

PreTokenizer::PreTokenizer(std::string_view pre_name) {
    Family f = family_for(pre_name, known_);
    family_ = f.name;
    build(f.steps);
}

PreTokenizer::PreTokenizer(const std::vector<PreStep>& steps, std::string family) : family_(std::move(family)) {
    build(steps);
}

PreTokenizer::~PreTokenizer() = default;

std::vector<std::string> PreTokenizer::known_names() {
    std::vector<std::string> out;
    for (const FamilyNames& f : pre_names())
        for (auto n : f.names) out.emplace_back(n);
    return out;
}

std::vector<PreStep> PreTokenizer::family_steps(std::string_view pre_name, std::string* family) {
    bool known = false;
    Family f = family_for(pre_name, known);
    if (family) *family = f.name;
    return known ? f.steps : std::vector<PreStep>{};
}

void PreTokenizer::build(const std::vector<PreStep>& steps) {
    bool mapped = false;
    for (const PreStep& s : steps) {
        auto c = std::make_unique<Compiled>();
        c->step = s;
        switch (s.kind) {
            case PreStep::Kind::Split:
                c->re = std::make_unique<Regex>(s.pattern);
                c->mapped = mapped;
                break;
            case PreStep::Kind::ByteLevel:
                if (s.use_regex) c->re = std::make_unique<Regex>(kGpt2);
                mapped = true;
                byte_level_ = true;
                break;
            case PreStep::Kind::Metaspace:
                if (s.replacement.empty()) fail("tokenizer: Metaspace pre-tokenizer with an empty replacement");
                if (s.split) c->re = std::make_unique<Regex>(quote_regex(s.replacement));
                break;
        }
        steps_.push_back(std::move(c));
    }
}

namespace {

// Applies one split (matches of `re` in each piece, then `behavior`) to the
// spans of `text`, writing the new spans to `out`.
struct Splitter {
    struct Seg {
        size_t b, e;
        bool match;
    };
    std::vector<Seg> segs;

    template <class Emit>
    void fold(SplitBehavior behavior, bool invert, Emit&& emit) {
        if (invert)
            for (auto& s : segs) s.match = !s.match;
        std::vector<Seg> acc;
        switch (behavior) {
            case SplitBehavior::Isolated:
                for (const auto& s : segs) emit(s.b, s.e);
                return;
            case SplitBehavior::Removed:
                for (const auto& s : segs)
                    if (!s.match) emit(s.b, s.e);
                return;
            case SplitBehavior::MergedWithPrevious: {
                bool prev = false;
                for (const auto& s : segs) {
                    if (s.match && !prev && !acc.empty())
                        acc.back().e = s.e;
                    else
                        acc.push_back(s);
                    prev = s.match;
                }
                break;
            }
            case SplitBehavior::MergedWithNext: {
                bool prev = false;
                for (size_t i = segs.size(); i-- > 0;) {
                    const Seg& s = segs[i];
                    if (s.match && !prev && !acc.empty())
                        acc.back().b = s.b;
                    else
                        acc.push_back(s);
                    prev = s.match;
                }
                for (size_t i = acc.size(); i-- > 0;) emit(acc[i].b, acc[i].e);
                return;
            }
            case SplitBehavior::Contiguous: {
                bool prev = false;
                for (const auto& s : segs) {
                    if (s.match == prev && !acc.empty())
                        acc.back().e = s.e;
                    else
                        acc.push_back(s);
                    prev = s.match;
                }
                break;
            }
        }
        for (const auto& s : acc) emit(s.b, s.e);
    }
};

}  // namespace

void PreTokenizer::split(std::string_view text, bool at_input_start, PreTokenized& out) const {
    out.text_ = text;
    out.spans_.clear();
    if (!text.empty()) out.spans_.emplace_back(0, text.size());
    int buf_index = 0;
    const auto& bm = unicode::ByteMap::get();
    Splitter splitter;

    // Cuts every span at the matches of `re` (on byte characters when `mapped`).
    auto apply = [&](const Regex& re, SplitBehavior behavior, bool invert, bool mapped) {
        out.next_.clear();
        auto push = [&](size_t b, size_t e) {
            if (e > b) out.next_.emplace_back(b, e - b);
        };
        for (const auto& [off, len] : out.spans_) {
            const std::string_view piece = out.text_.substr(off, len);
            std::string_view subject = piece;
            // Byte characters are one character per raw byte: "!".."~" map to
            // themselves, every other byte to a 2-byte character.
            bool identity = true;
            if (mapped) {
                for (char ch : piece) identity &= ch >= '!' && ch <= '~';
                if (!identity) {
                    out.mapped_.resize(piece.size() * 2);
                    char* w = out.mapped_.data();
                    for (char ch : piece) {
                        const std::string_view u = bm.byte_to_utf8(static_cast<uint8_t>(ch));
                        w[0] = u[0];
                        if (u.size() > 1) w[1] = u[1];
                        w += u.size();
                    }
                    out.mapped_.resize(static_cast<size_t>(w - out.mapped_.data()));
                    subject = out.mapped_;
                }
            }
            // Mapped offset -> raw offset; asked for in increasing order.
            size_t walk_m = 0, walk_r = 0;
            auto raw = [&](size_t m) -> size_t {
                if (identity) return off + m;
                while (walk_m < m) {
                    walk_m += static_cast<uint8_t>(subject[walk_m]) < 0x80 ? 1 : 2;
                    ++walk_r;
                }
                return off + walk_r;
            };
            if (behavior == SplitBehavior::Isolated && !invert) {
                // (raw() walks forward: call it in order.)
                size_t last_raw = raw(0);
                re.for_each_match(subject, [&](size_t b, size_t e) {
                    const size_t rb = raw(b);
                    const size_t re_ = raw(e);
                    push(last_raw, rb);
                    push(rb, re_);
                    last_raw = re_;
                });
                push(last_raw, raw(subject.size()));
                continue;
            }
            splitter.segs.clear();
            size_t last = 0;
            size_t last_raw = raw(0);
            re.for_each_match(subject, [&](size_t b, size_t e) {
                const size_t rb = raw(b);
                const size_t re_ = raw(e);
                if (b > last) splitter.segs.push_back({last_raw, rb, false});
                splitter.segs.push_back({rb, re_, true});
                last = e;
                last_raw = re_;
            });
            if (last < subject.size()) {
                const size_t rend = raw(subject.size());
                splitter.segs.push_back({last_raw, rend, false});
            }
            splitter.fold(behavior, invert, push);
        }
        out.spans_.swap(out.next_);
    };

    // Rewrites every span through `fn(piece, index, dst)` into a fresh buffer.
    auto rewrite = [&](auto&& fn) {
        std::string& dst = out.buf_[buf_index];
        buf_index ^= 1;
        dst.clear();
        out.next_.clear();
        for (size_t k = 0; k < out.spans_.size(); ++k) {
            const auto [off, len] = out.spans_[k];
            const size_t start = dst.size();
            fn(out.text_.substr(off, len), off, dst);
            if (dst.size() > start) out.next_.emplace_back(start, dst.size() - start);
        }
        out.spans_.swap(out.next_);
        out.text_ = dst;
    };

    for (const auto& c : steps_) {
        const PreStep& s = c->step;
        switch (s.kind) {
            case PreStep::Kind::Split:
                apply(*c->re, s.behavior, s.invert, c->mapped);
                break;
            case PreStep::Kind::ByteLevel:
                if (s.add_prefix_space) {
                    rewrite([](std::string_view piece, size_t, std::string& dst) {
                        if (piece.empty() || piece[0] != ' ') dst += ' ';
                        dst.append(piece);
                    });
                }
                if (c->re) apply(*c->re, SplitBehavior::Isolated, false, false);
                break;
            case PreStep::Kind::Metaspace: {
                const std::string& rep = s.replacement;
                rewrite([&](std::string_view piece, size_t off, std::string& dst) {
                    const size_t start = dst.size();
                    for (char ch : piece) {
                        if (ch == ' ')
                            dst += rep;
                        else
                            dst += ch;
                    }
                    const bool starts = dst.compare(start, rep.size(), rep) == 0 && dst.size() - start >= rep.size();
                    const bool want = s.prepend == PrependScheme::Always ||
                                      (s.prepend == PrependScheme::First && at_input_start && off == 0);
                    if (want && !starts) dst.insert(start, rep);
                });
                if (c->re) apply(*c->re, SplitBehavior::MergedWithNext, false, false);
                break;
            }
        }
    }
}

std::vector<std::string> PreTokenizer::split(std::string_view text) const {
    PreTokenized p;
    split(text, true, p);
    std::vector<std::string> words;
    words.reserve(p.size());
    for (size_t i = 0; i < p.size(); ++i) words.emplace_back(p[i]);
    return words;
}

}  // namespace quern
