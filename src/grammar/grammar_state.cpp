// GrammarState: the pushdown recogniser of grammar.h. Its stacks live in two
// flat vectors and its working space is per thread, so advancing a state —
// what a token mask does hundreds of thousands of times — allocates nothing
// once the buffers have grown.
#include <algorithm>
#include <map>
#include <tuple>

#include "core/error.h"
#include "grammar/grammar.h"

namespace quern::grammar {

namespace {

/// Rule expansions one expand() may make before the grammar is refused as
/// blowing up (left recursion is refused when parsing; this bounds the rest).
constexpr int kExpandBudget = 200000;

}  // namespace

struct GrammarState::Scratch {
    std::vector<Pos> work, frames;
    std::vector<uint32_t> ends, order;
};

GrammarState::Scratch& GrammarState::scratch() {
    thread_local Scratch s;
    return s;
}

bool GrammarState::Pos::operator<(const Pos& o) const {
    return std::tie(rule, alt, elem, count) < std::tie(o.rule, o.alt, o.elem, o.count);
}

GrammarState::GrammarState(std::shared_ptr<const Grammar> g) : g_(std::move(g)) {
    Scratch& sc = scratch();
    sc.frames.clear();
    sc.ends.clear();
    const auto& root = g_->rules[static_cast<size_t>(g_->root)];
    int budget = kExpandBudget;
    for (int a = 0; a < static_cast<int>(root.alternatives.size()); ++a) {
        sc.work.assign(1, Pos{g_->root, a, 0});
        expand(sc.work, 0, sc.frames, sc.ends, budget);
    }
    adopt(sc.frames, sc.ends);
}

void GrammarState::past_call(Pos& f) const {
    const Element& e = g_->rules[static_cast<size_t>(f.rule)].alternatives[static_cast<size_t>(f.alt)][static_cast<size_t>(f.elem)];
    if (e.kind == Element::Kind::Repeat) {
        ++f.count;
    } else {
        ++f.elem;
        f.count = 0;
    }
}

void GrammarState::expand(std::vector<Pos>& work, size_t base, std::vector<Pos>& frames, std::vector<uint32_t>& ends,
                          int& budget) const {
    // Expands a copy of the stack, placed after it in `work` and dropped
    // again; `edit` changes the copy's top first.
    const auto branch = [&](auto&& edit) {
        const size_t len = work.size() - base, at = work.size();
        work.resize(at + len);
        std::copy_n(work.begin() + static_cast<long>(base), len, work.begin() + static_cast<long>(at));
        edit(work);
        expand(work, at, frames, ends, budget);
        work.resize(at);
    };
    for (;;) {
        if (work.size() == base) {  // the stack is empty: the text may end
            ends.push_back(static_cast<uint32_t>(frames.size()));
            return;
        }
        Pos& p = work.back();
        const auto& alt = g_->rules[static_cast<size_t>(p.rule)].alternatives[static_cast<size_t>(p.alt)];
        if (p.elem == static_cast<int>(alt.size())) {  // the alternative is done: back to its caller, past the call
            work.pop_back();
            if (work.size() > base) past_call(work.back());
            continue;
        }
        const Element& e = alt[static_cast<size_t>(p.elem)];
        if (e.kind == Element::Kind::Chars) {
            frames.insert(frames.end(), work.begin() + static_cast<long>(base), work.end());
            ends.push_back(static_cast<uint32_t>(frames.size()));
            return;
        }
        if (--budget < 0) fail("grammar: a rule expands into more than {} rules at one position", kExpandBudget);
        if (e.kind == Element::Kind::Repeat) {
            if (p.count >= e.max) {  // all repetitions done
                ++p.elem;
                p.count = 0;
                continue;
            }
            if (p.count >= e.min)  // enough: the text may also go on past it
                branch([](std::vector<Pos>& w) {
                    ++w.back().elem;
                    w.back().count = 0;
                });
            // (and one more repetition: a call that keeps its caller)
        } else if (p.elem + 1 == static_cast<int>(alt.size())) {
            work.pop_back();  // a call in tail position replaces its caller (right recursion stays shallow)
        }
        const int rule = e.rule;
        const int n_alts = static_cast<int>(g_->rules[static_cast<size_t>(rule)].alternatives.size());
        if (n_alts == 1) {
            work.push_back(Pos{rule, 0, 0});
            continue;
        }
        for (int a = 0; a < n_alts; ++a) branch([&](std::vector<Pos>& w) { w.push_back(Pos{rule, a, 0}); });
        return;
    }
}

void GrammarState::adopt(const std::vector<Pos>& frames, const std::vector<uint32_t>& ends) {
    Scratch& sc = scratch();
    const auto first = [&](uint32_t i) { return frames.begin() + (i == 0 ? 0 : ends[i - 1]); };
    const auto last = [&](uint32_t i) { return frames.begin() + ends[i]; };
    sc.order.resize(ends.size());
    for (uint32_t i = 0; i < ends.size(); ++i) sc.order[i] = i;
    std::sort(sc.order.begin(), sc.order.end(), [&](uint32_t x, uint32_t y) {
        return std::lexicographical_compare(first(x), last(x), first(y), last(y));
    });
    frames_.clear();
    ends_.clear();
    for (size_t k = 0; k < sc.order.size(); ++k) {
        const uint32_t i = sc.order[k];
        if (k > 0 && std::equal(first(i), last(i), first(sc.order[k - 1]), last(sc.order[k - 1]))) continue;
        frames_.insert(frames_.end(), first(i), last(i));
        ends_.push_back(static_cast<uint32_t>(frames_.size()));
    }
}

bool GrammarState::advance(uint32_t cp) {
    Scratch& sc = scratch();
    sc.frames.clear();
    sc.ends.clear();
    int budget = kExpandBudget;
    for (size_t i = 0; i < ends_.size(); ++i) {
        if (depth(i) == 0) continue;
        const Pos& p = top(i);
        const Element& e =
            g_->rules[static_cast<size_t>(p.rule)].alternatives[static_cast<size_t>(p.alt)][static_cast<size_t>(p.elem)];
        if (!e.chars.contains(cp)) continue;
        sc.work.assign(frames_.begin() + static_cast<long>(start(i)), frames_.begin() + static_cast<long>(ends_[i]));
        ++sc.work.back().elem;
        expand(sc.work, 0, sc.frames, sc.ends, budget);
    }
    if (sc.ends.empty()) return false;
    adopt(sc.frames, sc.ends);
    return true;
}

bool GrammarState::advance_bytes(std::string_view bytes) {
    if (partial_.empty() && bytes.size() == 1 && static_cast<uint8_t>(bytes[0]) < 0x80)
        return advance(static_cast<uint8_t>(bytes[0]));  // the common case: one ASCII character
    std::string buf = partial_;
    buf.append(bytes);
    // A state to go back to, kept only when more than one code point could
    // change it (advance itself changes nothing when it fails).
    std::vector<Pos> saved_frames;
    std::vector<uint32_t> saved_ends;
    const std::string saved_partial = partial_;
    bool saved = false;
    const auto refuse = [&] {
        if (saved) {
            frames_ = std::move(saved_frames);
            ends_ = std::move(saved_ends);
        }
        partial_ = saved_partial;
        return false;
    };
    size_t i = 0;
    while (i < buf.size()) {
        const auto b = static_cast<uint8_t>(buf[i]);
        const int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
        bool ok = n > 0;
        if (ok && i + static_cast<size_t>(n) > buf.size()) {
            // Incomplete: kept for the next call if some code point it may
            // begin is allowed here.
            const size_t have = buf.size() - i;
            uint32_t lo = n == 2 ? (b & 0x1Fu) : n == 3 ? (b & 0x0Fu) : (b & 0x07u);
            for (size_t k = 1; k < have && ok; ++k) {
                const auto c = static_cast<uint8_t>(buf[i + k]);
                ok = (c & 0xC0u) == 0x80u;
                lo = (lo << 6) | (c & 0x3Fu);
            }
            const int missing = n - static_cast<int>(have);
            lo <<= 6 * missing;
            const uint32_t hi = lo | ((1u << (6 * missing)) - 1);
            if (!ok || !allows_encoded(lo, hi, n)) return refuse();
            break;
        }
        uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1Fu) : n == 3 ? (b & 0x0Fu) : (b & 0x07u);
        for (int k = 1; ok && k < n; ++k) {
            const auto c = static_cast<uint8_t>(buf[i + static_cast<size_t>(k)]);
            ok = (c & 0xC0u) == 0x80u;
            cp = (cp << 6) | (c & 0x3Fu);
        }
        // No overlong forms, surrogates or code points past U+10FFFF (RFC 3629).
        ok = ok && (n == 1 || cp >= (n == 2 ? 0x80u : n == 3 ? 0x800u : 0x10000u)) && cp <= 0x10FFFF &&
             (cp < 0xD800 || cp > 0xDFFF);
        if (ok && !saved && i + static_cast<size_t>(n) < buf.size()) {
            saved_frames = frames_;
            saved_ends = ends_;
            saved = true;
        }
        if (!ok || !advance(cp)) return refuse();
        i += static_cast<size_t>(n);
    }
    partial_ = buf.substr(i);
    return true;
}

bool GrammarState::allows_encoded(uint32_t lo, uint32_t hi, int n) const {
    // The code points an n-byte UTF-8 sequence may encode (RFC 3629).
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    lo = std::max(lo, kMin[n]);
    hi = std::min<uint32_t>(hi, 0x10FFFF);
    if (lo > hi) return false;
    if (n != 3) return allows(lo, hi);
    // Around the surrogates U+D800..U+DFFF, which UTF-8 does not encode.
    return (lo < 0xD800 && allows(lo, std::min<uint32_t>(hi, 0xD7FF))) ||
           (hi > 0xDFFF && allows(std::max<uint32_t>(lo, 0xE000), hi));
}

bool GrammarState::allows(uint32_t lo, uint32_t hi) const {
    for (size_t i = 0; i < ends_.size(); ++i) {
        if (depth(i) == 0) continue;
        const Pos& p = top(i);
        const Element& e =
            g_->rules[static_cast<size_t>(p.rule)].alternatives[static_cast<size_t>(p.alt)][static_cast<size_t>(p.elem)];
        if (e.chars.intersects(lo, hi)) return true;
    }
    return false;
}

std::string GrammarState::key() const {
    std::string k;
    k.reserve(frames_.size() * sizeof(Pos) + ends_.size() + partial_.size() + 1);
    for (size_t i = 0; i < ends_.size(); ++i) {
        for (size_t f = start(i); f < ends_[i]; ++f) {
            const int32_t v[4] = {frames_[f].rule, frames_[f].alt, frames_[f].elem, frames_[f].count};
            k.append(reinterpret_cast<const char*>(v), sizeof v);
        }
        k.push_back('|');
    }
    k.push_back('#');
    k += partial_;
    return k;
}

bool GrammarState::accepting() const { return partial_.empty() && has_empty_stack(); }

bool GrammarState::has_empty_stack() const {
    for (size_t i = 0; i < ends_.size(); ++i)
        if (depth(i) == 0) return true;
    return false;
}

bool GrammarState::can_continue() const {
    for (size_t i = 0; i < ends_.size(); ++i)
        if (depth(i) > 0) return true;
    return false;
}

GrammarState GrammarState::chain(size_t i, int k) const {
    GrammarState c(*this, Bare{});
    c.frames_.assign(frames_.begin() + static_cast<long>(ends_[i]) - k, frames_.begin() + static_cast<long>(ends_[i]));
    c.ends_.push_back(static_cast<uint32_t>(k));
    return c;
}

GrammarState GrammarState::after_chain(size_t i, int k) const {
    GrammarState c(*this, Bare{});
    Scratch& sc = scratch();
    sc.work.assign(frames_.begin() + static_cast<long>(start(i)), frames_.begin() + static_cast<long>(ends_[i]) - k);
    if (!sc.work.empty()) past_call(sc.work.back());
    sc.frames.clear();
    sc.ends.clear();
    int budget = kExpandBudget;
    expand(sc.work, 0, sc.frames, sc.ends, budget);
    c.adopt(sc.frames, sc.ends);
    return c;
}

std::string GrammarState::chain_signature(size_t i, int k, int max_chars) const {
    std::map<int, int> local;  // grammar rule → number by first reach
    std::vector<int> order;
    const auto number = [&](int r) {
        const auto [it, added] = local.emplace(r, static_cast<int>(order.size()));
        if (added) order.push_back(r);
        return it->second;
    };
    std::string sig;
    const auto put = [&](int32_t v) { sig.append(reinterpret_cast<const char*>(&v), sizeof v); };
    // A count beyond what one token can use (max_chars repetitions of a unit
    // that takes a character each) is as good as any larger one.
    const auto clamp = [&](const Element& e, int n) {
        return g_->nullable[static_cast<size_t>(e.rule)] ? n : std::min(n, max_chars + 1);
    };
    for (size_t f = ends_[i] - static_cast<size_t>(k); f < ends_[i]; ++f) {
        const Pos& p = frames_[f];
        put(number(p.rule));
        put(p.alt);
        put(p.elem);
        const auto& alt = g_->rules[static_cast<size_t>(p.rule)].alternatives[static_cast<size_t>(p.alt)];
        if (p.elem < static_cast<int>(alt.size()) && alt[static_cast<size_t>(p.elem)].kind == Element::Kind::Repeat) {
            const Element& e = alt[static_cast<size_t>(p.elem)];  // what remains of it: at most, at least
            put(clamp(e, e.max - p.count));
            put(clamp(e, std::max(0, e.min - p.count)));
        }
    }
    sig.push_back('/');
    for (size_t n = 0; n < order.size(); ++n) {  // order grows as rules are reached
        const Rule& rule = g_->rules[static_cast<size_t>(order[n])];
        put(static_cast<int32_t>(rule.alternatives.size()));
        for (const auto& alt : rule.alternatives) {
            put(static_cast<int32_t>(alt.size()));
            for (const Element& e : alt) {
                if (e.kind == Element::Kind::Rule) {
                    put(-1 - number(e.rule));
                    continue;
                }
                if (e.kind == Element::Kind::Repeat) {
                    put(-1000000 - number(e.rule));
                    put(clamp(e, e.min));
                    put(clamp(e, e.max));
                    continue;
                }
                put(static_cast<int32_t>(e.chars.ranges.size()) * 2 + (e.chars.negated ? 1 : 0));
                for (const auto& [lo, hi] : e.chars.ranges) {
                    put(static_cast<int32_t>(lo));
                    put(static_cast<int32_t>(hi));
                }
            }
        }
    }
    return sig;
}

}  // namespace quern::grammar
