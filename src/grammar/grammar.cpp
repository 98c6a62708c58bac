#include "grammar/grammar.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <map>
#include <tuple>

#include "core/error.h"

namespace quern::grammar {

namespace {

/// A GBNF text read by recursive descent; groups and repetitions become
/// generated rules.
class Parser {
public:
    explicit Parser(std::string_view t) : t_(t) {}

    Grammar run() {
        skip();
        while (i_ < t_.size()) {
            const size_t line = line_of(i_);
            const std::string name = ident();
            if (name.empty()) error("a rule name");
            skip();
            if (t_.substr(i_, 3) != "::=") error("'::=' after the rule name '" + name + "'");
            i_ += 3;
            const int r = rule_index(name);
            if (defined_.count(r)) fail("grammar line {}: the rule '{}' is defined twice", line, name);
            defined_[r] = line;
            g_.rules[static_cast<size_t>(r)].alternatives = alternatives();
        }
        for (size_t r = 0; r < g_.rules.size(); ++r)
            if (!defined_.count(static_cast<int>(r)) && g_.rules[r].name.rfind("rule-", 0) != 0)
                fail("grammar: the rule '{}' is used but not defined", g_.rules[r].name);
        const auto root = names_.find("root");
        if (root == names_.end()) fail("grammar: there is no 'root' rule (the start rule)");
        g_.root = root->second;
        return std::move(g_);
    }

private:
    [[noreturn]] void error(const std::string& want) const {
        fail("grammar line {}: expected {} at '{}'", line_of(i_), want,
             std::string(t_.substr(i_, std::min<size_t>(20, t_.size() - i_))));
    }
    size_t line_of(size_t at) const { return 1 + static_cast<size_t>(std::count(t_.begin(), t_.begin() + static_cast<long>(at), '\n')); }
    void skip() {
        while (i_ < t_.size()) {
            if (t_[i_] == '#') {
                while (i_ < t_.size() && t_[i_] != '\n') ++i_;
            } else if (t_[i_] == ' ' || t_[i_] == '\t' || t_[i_] == '\n' || t_[i_] == '\r') {
                ++i_;
            } else {
                break;
            }
        }
    }
    static bool name_char(char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    }
    std::string ident() {
        const size_t b = i_;
        while (i_ < t_.size() && name_char(t_[i_])) ++i_;
        return std::string(t_.substr(b, i_ - b));
    }
    /// Whether a rule definition (name ::=) starts at the current position.
    bool at_definition() const {
        size_t j = i_;
        while (j < t_.size() && name_char(t_[j])) ++j;
        if (j == i_) return false;
        while (j < t_.size() && (t_[j] == ' ' || t_[j] == '\t' || t_[j] == '\n' || t_[j] == '\r')) ++j;
        return t_.substr(j, 3) == "::=";
    }
    int rule_index(const std::string& name) {
        const auto it = names_.find(name);
        if (it != names_.end()) return it->second;
        g_.rules.push_back(Rule{name, {}});
        const int r = static_cast<int>(g_.rules.size() - 1);
        names_[name] = r;
        return r;
    }
    int new_rule(std::vector<std::vector<Element>> alts) {
        g_.rules.push_back(Rule{"rule-" + std::to_string(g_.rules.size()), std::move(alts)});
        return static_cast<int>(g_.rules.size() - 1);
    }
    static Element ref(int r) {
        Element e;
        e.kind = Element::Kind::Rule;
        e.rule = r;
        return e;
    }
    uint32_t utf8() {
        const auto b = static_cast<uint8_t>(t_[i_]);
        const int n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
        if (i_ + static_cast<size_t>(n) > t_.size()) error("a complete UTF-8 character");
        uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1Fu) : n == 3 ? (b & 0x0Fu) : (b & 0x07u);
        for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(t_[i_ + static_cast<size_t>(k)]) & 0x3Fu);
        i_ += static_cast<size_t>(n);
        return cp;
    }
    uint32_t hex(int digits) {
        uint32_t v = 0;
        for (int k = 0; k < digits; ++k, ++i_) {
            if (i_ >= t_.size()) error("hex digits");
            const char c = t_[i_];
            const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0) error("a hex digit");
            v = v * 16 + static_cast<uint32_t>(d);
        }
        return v;
    }
    /// One character of a literal or class, escapes decoded.
    uint32_t character() {
        if (i_ >= t_.size()) error("a character");
        if (t_[i_] != '\\') return utf8();
        if (++i_ >= t_.size()) error("an escape");
        const char c = t_[i_++];
        switch (c) {
            case 'n': return '\n';
            case 't': return '\t';
            case 'r': return '\r';
            case 'x': return hex(2);
            case 'u': return hex(4);
            case 'U': return hex(8);
            case '\\': case '"': case '\'': case ']': case '[': case '-': case '^': return static_cast<uint32_t>(c);
            default: --i_; error("a known escape (\\n \\t \\r \\\\ \\\" \\] \\xHH \\uHHHH)");
        }
    }
    static constexpr int kMaxGroupDepth = 128;
    int group_depth_ = 0;

    std::vector<std::vector<Element>> alternatives() {
        std::vector<std::vector<Element>> alts{sequence()};
        while (i_ < t_.size() && t_[i_] == '|') {
            ++i_;
            alts.push_back(sequence());
        }
        return alts;
    }
    std::vector<Element> sequence() {
        std::vector<Element> seq;
        for (;;) {
            skip();
            if (i_ >= t_.size() || t_[i_] == '|' || t_[i_] == ')' || at_definition()) return seq;
            std::vector<Element> unit;
            const char c = t_[i_];
            if (c == '"') {
                ++i_;
                while (i_ < t_.size() && t_[i_] != '"') {
                    Element e;
                    const uint32_t cp = character();
                    e.chars.ranges.emplace_back(cp, cp);
                    unit.push_back(std::move(e));
                }
                if (i_ >= t_.size()) error("the closing '\"'");
                ++i_;
            } else if (c == '[') {
                ++i_;
                Element e;
                if (i_ < t_.size() && t_[i_] == '^') {
                    e.chars.negated = true;
                    ++i_;
                }
                while (i_ < t_.size() && t_[i_] != ']') {
                    const uint32_t lo = character();
                    uint32_t hi = lo;
                    if (i_ + 1 < t_.size() && t_[i_] == '-' && t_[i_ + 1] != ']') {
                        ++i_;
                        hi = character();
                    }
                    if (hi < lo) error("a range whose end is not below its start");
                    e.chars.ranges.emplace_back(lo, hi);
                }
                if (i_ >= t_.size()) error("the closing ']'");
                ++i_;
                unit.push_back(std::move(e));
            } else if (c == '(') {
                // Groups parse recursively: bound the nesting, or a request's
                // "((((..." would overflow the stack.
                if (++group_depth_ > kMaxGroupDepth)
                    fail("grammar: groups are nested more than {} deep", kMaxGroupDepth);
                ++i_;
                auto alts = alternatives();
                if (i_ >= t_.size() || t_[i_] != ')') error("')'");
                ++i_;
                --group_depth_;
                unit.push_back(ref(new_rule(std::move(alts))));
            } else if (name_char(c)) {
                unit.push_back(ref(rule_index(ident())));
            } else {
                error("a literal, a character class, a group or a rule name");
            }
            // Postfix operators apply to the whole unit.
            while (i_ < t_.size() && (t_[i_] == '*' || t_[i_] == '+' || t_[i_] == '?' || t_[i_] == '{')) {
                const char op = t_[i_++];
                const int x = unit.size() == 1 && unit[0].kind == Element::Kind::Rule ? unit[0].rule : new_rule({unit});
                if (op == '{') {
                    unit = repeat(x);
                    continue;
                }
                const int r = new_rule({});
                auto& alts = g_.rules[static_cast<size_t>(r)].alternatives;
                if (op == '*') alts = {{ref(x), ref(r)}, {}};          // x r | (empty)
                else if (op == '+') alts = {{ref(x), ref(r)}, {ref(x)}};  // x r | x
                else alts = {{ref(x)}, {}};                              // x | (empty)
                unit = {ref(r)};
            }
            seq.insert(seq.end(), unit.begin(), unit.end());
        }
    }

    size_t count() {
        const size_t b = i_;
        size_t v = 0;
        while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9' && v <= kMaxRepeat) v = v * 10 + static_cast<size_t>(t_[i_++] - '0');
        if (i_ == b) error("a count");
        if (v > kMaxRepeat) fail("grammar line {}: a repetition count above {}", line_of(b), kMaxRepeat);
        return v;
    }
    /// x{m}, x{m,}, x{m,n} (after the '{').
    std::vector<Element> repeat(int x) {
        skip();
        const size_t m = count();
        skip();
        size_t n = m;
        bool unbounded = false;
        if (i_ < t_.size() && t_[i_] == ',') {
            ++i_;
            skip();
            if (i_ < t_.size() && t_[i_] == '}') unbounded = true;
            else n = count();
            skip();
        }
        if (i_ >= t_.size() || t_[i_] != '}') error("'}' closing the repetition");
        ++i_;
        if (!unbounded && n < m) fail("grammar line {}: a repetition {{{},{}}} whose maximum is below its minimum", line_of(i_), m, n);
        // A bounded count is one Repeat element (its frame counts); x{m,}
        // is x{m} then x* (a right recursion: one state however long).
        std::vector<Element> seq;
        if (unbounded ? m > 0 : n > 0) {
            Element e;
            e.kind = Element::Kind::Repeat;
            e.rule = x;
            e.min = static_cast<int>(m);
            e.max = static_cast<int>(unbounded ? m : n);
            seq.push_back(e);
        }
        if (unbounded) {
            const int r = new_rule({});
            g_.rules[static_cast<size_t>(r)].alternatives = {{ref(x), ref(r)}, {}};
            seq.push_back(ref(r));
        }
        return seq;
    }
    static constexpr size_t kMaxRepeat = 10000;

    std::string_view t_;
    size_t i_ = 0;
    Grammar g_;
    std::map<std::string, int> names_;
    std::map<int, size_t> defined_;
};

/// Marks the rules that may match the empty text (Grammar::nullable) and
/// refuses left recursion: a rule that can reach itself without consuming a
/// character.
void check_left_recursion(Grammar& g) {
    const size_t n = g.rules.size();
    std::vector<uint8_t>& nullable = g.nullable;
    nullable.assign(n, 0);
    const auto empty_ok = [&](const Element& e) {
        if (e.kind == Element::Kind::Chars) return false;
        return (e.kind == Element::Kind::Repeat && e.min == 0) || nullable[static_cast<size_t>(e.rule)] != 0;
    };
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t r = 0; r < n; ++r) {
            if (nullable[r]) continue;
            for (const auto& alt : g.rules[r].alternatives) {
                bool all = true;
                for (const Element& e : alt) all = all && empty_ok(e);
                if (all) {
                    nullable[r] = 1;
                    changed = true;
                    break;
                }
            }
        }
    }
    std::vector<std::vector<int>> first(n);  // rules reachable at the left edge
    for (size_t r = 0; r < n; ++r)
        for (const auto& alt : g.rules[r].alternatives)
            for (const Element& e : alt) {
                if (e.kind == Element::Kind::Chars) break;
                first[r].push_back(e.rule);
                if (!empty_ok(e)) break;
            }
    std::vector<int> color(n, 0);  // 0 new, 1 on the path, 2 done
    const auto visit = [&](auto&& self, int r) -> void {
        color[static_cast<size_t>(r)] = 1;
        for (int s : first[static_cast<size_t>(r)]) {
            if (color[static_cast<size_t>(s)] == 1)
                fail("grammar: the rule '{}' is left-recursive (it reaches itself before any character); rewrite it "
                     "with a repetition",
                     g.rules[static_cast<size_t>(s)].name);
            if (color[static_cast<size_t>(s)] == 0) self(self, s);
        }
        color[static_cast<size_t>(r)] = 2;
    };
    for (size_t r = 0; r < n; ++r)
        if (color[r] == 0) visit(visit, static_cast<int>(r));
}

}  // namespace

bool CharSet::intersects(uint32_t lo, uint32_t hi) const {
    if (!negated) {
        for (const auto& [a, b] : ranges)
            if (a <= hi && b >= lo) return true;
        return false;
    }
    // Negated: some code point of [lo, hi] lies outside every range.
    for (uint32_t cp = lo;;) {
        bool covered = false;
        for (const auto& [a, b] : ranges)
            if (cp >= a && cp <= b) {
                covered = true;
                cp = b;  // jump past this range
                break;
            }
        if (!covered) return true;
        if (cp >= hi) return false;
        ++cp;
    }
}

bool CharSet::contains(uint32_t cp) const {
    bool in = false;
    for (const auto& [lo, hi] : ranges) in = in || (cp >= lo && cp <= hi);
    return in != negated;
}

std::shared_ptr<const Grammar> Grammar::parse(std::string_view text) {
    // The same text gives the same grammar while it is in use (requests with
    // one schema share their masks: the caches are keyed by grammar id).
    static std::mutex mu;
    static std::unordered_map<std::string, std::weak_ptr<const Grammar>> parsed;
    static uint64_t next_id = 1;
    {
        std::lock_guard<std::mutex> lk(mu);
        const auto it = parsed.find(std::string(text));
        if (it != parsed.end())
            if (auto g = it->second.lock()) return g;
    }
    auto g = std::make_shared<Grammar>(Parser(text).run());
    check_left_recursion(*g);
    std::lock_guard<std::mutex> lk(mu);
    g->id = next_id++;
    if (parsed.size() >= 256) std::erase_if(parsed, [](const auto& e) { return e.second.expired(); });
    parsed[std::string(text)] = g;
    return g;
}

std::string gbnf_literal(std::string_view text) {
    std::string out = "\"";
    for (char c : text) {
        if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else if (c == '"' || c == '\\') (out += '\\') += c;
        else out += c;
    }
    return out + "\"";
}

const std::string& json_value_rules() {
    static const std::string rules = [] {
        // Whitespace between tokens is bounded (a newline and up to 20 spaces
        // or tabs, or one space), and so are numbers (20 digits before the
        // point and 24 after it, 3 of exponent: any int64 or shortest double
        // fits): a model may not pad or count without end. Nested optionals
        // keep one parse per prefix (16 flat `[ \t]?` would multiply the
        // matcher's stacks).
        std::string indent = "";
        for (int k = 0; k < 20; ++k) indent = "( [ \\t] " + indent + " )?";
        return std::string(R"(
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( ws "," ws member )* )? ws "}"
member ::= string ws ":" ws value
array  ::= "[" ws ( value ( ws "," ws value )* )? ws "]"
string ::= "\"" char* "\""
char   ::= [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" hex hex hex hex )
hex    ::= [0-9a-fA-F]
number ::= integer ( "." [0-9]{1,24} )? ( [eE] [-+]? [0-9]{1,3} )?
integer ::= "-"? ( "0" | [1-9] [0-9]{0,19} )
boolean ::= "true" | "false"
null   ::= "null"
ws     ::= ( " " | "\n" indent )?
indent ::= )") + indent + "\n";
    }();
    return rules;
}

std::shared_ptr<const Grammar> Grammar::json(bool object_only) {
    return parse(std::string("root ::= ") + (object_only ? "object" : "value") + "\n" + json_value_rules());
}

}  // namespace quern::grammar
