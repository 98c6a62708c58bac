// Fuzz test of the Jinja parser and evaluator: random token soup, mutated
// real chat templates (byte flips, token insertions, deletions, splices) and
// hand-written hostile templates (deep nesting, runaway recursion, loops and
// string growth) must each end in a rendered string or a TemplateError -- no
// crash, no other exception, no hang, and bounded memory.
//
// Runs for QUERN_JINJA_FUZZ_SECONDS (default 20) with seed QUERN_JINJA_FUZZ_SEED
// (default: fixed). Build with -fsanitize=address,undefined to also catch
// memory errors.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "chat/template.h"

namespace fs = std::filesystem;
using quern::jinja::TemplateError;

namespace {

std::vector<std::string> seed_templates() {
    std::vector<std::string> out;
    const fs::path dir = fs::path(QUERN_TESTDATA_DIR) / "chat-templates";
    if (fs::exists(dir)) {
        for (const auto& e : fs::directory_iterator(dir)) {
            std::ifstream f(e.path(), std::ios::binary);
            std::stringstream ss;
            ss << f.rdbuf();
            out.push_back(ss.str());
        }
    }
    std::sort(out.begin(), out.end());
    out.push_back("{% for m in messages %}{{ m.role }}: {{ m.content | trim }}\n{% endfor %}");
    out.push_back("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ n }}{% endif %}{% endmacro %}{{ f(5) }}");
    out.push_back("{% set ns = namespace(x=[]) %}{% for i in range(10) %}{% set ns.x = ns.x + [i] %}{% endfor %}{{ ns.x|tojson }}");
    return out;
}

// Templates that try to exhaust time, memory or the stack.
std::vector<std::string> hostile_templates() {
    std::vector<std::string> h = {
        "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
        "{% macro f(x) %}{{ f(x ~ x) }}{% endmacro %}{{ f('a') }}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
        "{% set ns = namespace(s='a') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
        "{{ 'a' * 1000000000 }}",
        "{{ [1] * 1000000000 }}",
        "{{ range(1000000000) }}",
        "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}",
        "{% set ns = namespace(a=none) %}{% set ns.a = ns %}{{ ns }}",
        "{% for x in range(99999) recursive %}{{ loop([x]) }}{% endfor %}",
        "{{ 9999999999 ** 99999999 }}",
        "{{ '%999999999d' % 1 }}",
        "{{ '{:>999999999}'.format(1) }}",
        "{{ 'x'|center(999999999) }}",
        "{{ 'x'|indent(999999999) }}",
        "{{ 'abc'.zfill(999999999) }}",
        "{{ 'a'.ljust(999999999) }}",
        "{% set ns = namespace(d=0) %}{% for i in range(100000) %}{% for j in range(100000) %}{% set ns.d = ns.d + 1 %}{% endfor %}{% endfor %}",
    };
    std::string deep;
    for (int i = 0; i < 100000; ++i) deep += "(";
    h.push_back("{{ " + deep + " }}");
    std::string chain = "{{ x";
    for (int i = 0; i < 50000; ++i) chain += "|trim";
    h.push_back(chain + " }}");
    std::string plus = "{{ 1";
    for (int i = 0; i < 50000; ++i) plus += " + 1";
    h.push_back(plus + " }}");
    std::string dots = "{{ x";
    for (int i = 0; i < 50000; ++i) dots += ".a";
    h.push_back(dots + " }}");
    std::string ifs;
    for (int i = 0; i < 20000; ++i) ifs += "{% if true %}";
    h.push_back(ifs);
    std::string lists = "{{ ";
    for (int i = 0; i < 20000; ++i) lists += "[";
    h.push_back(lists);
    std::string nots = "{{ ";
    for (int i = 0; i < 50000; ++i) nots += "not ";
    h.push_back(nots + "x }}");
    std::string negs = "{{ ";
    for (int i = 0; i < 50000; ++i) negs += "-";
    h.push_back(negs + "1 }}");
    return h;
}

const std::vector<std::string> kTokens = {
    "{{", "}}", "{%", "%}", "{#", "#}", "{%-", "-%}", "{{-", "-}}", "{%+", "+%}", "(", ")", "[", "]", "{", "}", "|",
    ",", ".", ":", "=", "==", "!=", "~", "+", "-", "*", "**", "/", "//", "%", "<", ">", "'", "\"", "\\", "\n", " ",
    "if", "elif", "else", "endif", "for", "in", "endfor", "recursive", "set", "endset", "macro", "endmacro", "call",
    "endcall", "caller()", "filter", "endfilter", "with", "endwith", "raw", "endraw", "break", "continue",
    "generation", "endgeneration", "block", "endblock", "not", "and", "or", "is", "defined", "none", "true",
    "loop", "loop.index", "loop.cycle(1,2)", "namespace(a=1)", "ns.a", "messages", "message", "tools",
    "range(3)", "raise_exception('x')", "strftime_now('%Y')", "x", "y", "0", "1", "-1", "1.5", "'a'", "\"b\"",
    "|tojson", "|trim", "|length", "|join(',')", "|map('upper')", "|selectattr('role')", "|default(1)",
    "|items", "|list", "|first", "|last", "|indent(2)", "|dictsort", "|sort", "|unique", "|batch(2)",
    ".split(',')", ".strip()", ".get('a')", ".items()", ".format(1)", ".append(1)", "[0]", "[1:]", "[::-1]",
    "varargs", "kwargs", "dict(a=1)", "%s", "{}", "\xff", "\xc3\xa9", "\xf0\x9f\x99\x82", "\x00"};

std::string random_soup(std::mt19937_64& rng) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 60);
    for (int i = 0; i < n; ++i) s += kTokens[rng() % kTokens.size()];
    return s;
}

std::string mutate(std::string s, std::mt19937_64& rng, const std::vector<std::string>& pool) {
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) {
        const size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
        switch (rng() % 6) {
            case 0:  // flip a byte
                if (!s.empty()) s[rng() % s.size()] = static_cast<char>(rng() & 0xFF);
                break;
            case 1:  // insert a token
                s.insert(pos, kTokens[rng() % kTokens.size()]);
                break;
            case 2: {  // delete a range
                if (s.empty()) break;
                const size_t len = std::min<size_t>(1 + rng() % 64, s.size() - std::min(pos, s.size()));
                s.erase(std::min(pos, s.size()), len);
                break;
            }
            case 3: {  // duplicate a range
                if (s.empty()) break;
                const size_t a = rng() % s.size();
                const size_t len = std::min<size_t>(1 + rng() % 200, s.size() - a);
                s.insert(pos, s.substr(a, len));
                break;
            }
            case 4: {  // splice in part of another template
                const std::string& o = pool[rng() % pool.size()];
                if (o.empty()) break;
                const size_t a = rng() % o.size();
                s.insert(pos, o.substr(a, std::min<size_t>(1 + rng() % 300, o.size() - a)));
                break;
            }
            default:  // truncate
                s.resize(pos);
        }
    }
    return s;
}

quern::jinja::Value context() {
    static const nlohmann::ordered_json j = nlohmann::ordered_json::parse(R"({
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a1b2c3d4e", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
            {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": "42"},
            {"role": "user", "content": [{"type": "text", "text": "part"}]}],
        "tools": [{"type": "function", "function": {"name": "f", "description": "d",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer", "description": "x"}}, "required": ["x"]}}}],
        "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "x": " x ", "y": [1, 2]})");
    static const quern::jinja::Value v = quern::jinja::from_json(j);
    return v;
}

struct Outcome {
    bool ok = true;
    std::string what;
    int stage = 0;  // 0 rendered, 1 parse error, 2 render error
};

// Parses and renders; anything but success or TemplateError is a failure.
Outcome run_one(const std::string& src, double& seconds) {
    quern::jinja::RenderOptions ro;
    ro.limits.max_steps = 300'000;
    ro.limits.max_bytes = 32ull << 20;
    ro.limits.max_output = 4ull << 20;
    ro.now = std::tm{};
    const auto t0 = std::chrono::steady_clock::now();
    Outcome o;
    bool parsed = false;
    try {
        const quern::jinja::Template t(src);
        parsed = true;
        (void)t.render(context(), ro);
    } catch (const TemplateError&) {
        o.stage = parsed ? 2 : 1;
    } catch (const std::exception& e) {
        o = {false, std::string("unexpected exception: ") + e.what()};
    } catch (...) {
        o = {false, "unexpected non-std exception"};
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return o;
}

long max_rss_mb() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024;
}

}  // namespace

TEST(JinjaFuzz, HostileTemplatesEndInErrors) {
    for (const std::string& src : hostile_templates()) {
        double s = 0;
        const Outcome o = run_one(src, s);
        EXPECT_TRUE(o.ok) << o.what << "\n  template: " << src.substr(0, 200);
        EXPECT_LT(s, 3.0) << "took " << s << " s: " << src.substr(0, 200);
    }
    EXPECT_LT(max_rss_mb(), 2048);
}

TEST(JinjaFuzz, RandomAndMutatedTemplates) {
    const char* env_s = std::getenv("QUERN_JINJA_FUZZ_SECONDS");
    const double budget = env_s ? std::atof(env_s) : 20.0;
    const char* env_seed = std::getenv("QUERN_JINJA_FUZZ_SEED");
    const uint64_t seed = env_seed ? std::strtoull(env_seed, nullptr, 10) : 20250314;
    std::mt19937_64 rng(seed);
    const std::vector<std::string> pool = seed_templates();
    const auto start = std::chrono::steady_clock::now();
    size_t n = 0, failures = 0, stages[3] = {0, 0, 0};
    double slowest = 0;
    std::string slowest_src;
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < budget) {
        std::string src;
        switch (rng() % 4) {
            case 0: src = random_soup(rng); break;
            case 1: src = mutate(random_soup(rng), rng, pool); break;
            default: src = mutate(pool[rng() % pool.size()], rng, pool);
        }
        double s = 0;
        const Outcome o = run_one(src, s);
        ++n;
        ++stages[o.stage];
        if (s > slowest) slowest = s, slowest_src = src;
        if (!o.ok && ++failures <= 5) ADD_FAILURE() << o.what << "\n  template: " << nlohmann::json(src.substr(0, 400)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
    std::printf("jinja fuzz: %zu templates in %.0f s (seed %llu): %zu rendered, %zu syntax errors, %zu render errors; "
                "slowest %.3f s, max RSS %ld MiB\n",
                n, budget, static_cast<unsigned long long>(seed), stages[0], stages[1], stages[2], slowest, max_rss_mb());
    EXPECT_EQ(failures, 0u);
    EXPECT_LT(slowest, 3.0) << "slowest template: " << slowest_src.substr(0, 300);
    EXPECT_LT(max_rss_mb(), 2048);
}
