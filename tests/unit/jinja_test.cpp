// Unit tests of the Jinja engine (src/chat): whitespace control, scoping,
// values and filters, errors with line and column, resource limits, and the
// chat layer (built-in templates, model templates, BOS handling). Expected
// strings were checked against Python jinja2 3.1 with Hugging Face's settings;
// the broad comparisons live in chat_templates_test and jinja_diff_test.
#include <gtest/gtest.h>
#include <thread>
#include <sstream>
#include <fstream>
#include <atomic>

#include <chrono>

#include <filesystem>

#include "chat/chat.h"
#include "chat/template.h"
#include "formats/gguf.h"
#include "../model/test_util.h"
#include "tokenizer/tokenizer.h"

using quern::jinja::Template;
using quern::jinja::TemplateError;
using quern::jinja::Value;
using Json = nlohmann::ordered_json;

namespace {

std::string render(const std::string& src, const Json& ctx = Json::object(), quern::jinja::RenderOptions ro = {}) {
    return Template(src).render(quern::jinja::from_json(ctx), ro);
}

// The error a template raises (type: message), or "" when it renders.
std::string error_of(const std::string& src, const Json& ctx = Json::object(), quern::jinja::RenderOptions ro = {}) {
    try {
        render(src, ctx, ro);
    } catch (const TemplateError& e) {
        return e.type() + ": " + e.message();
    }
    return "";
}

}  // namespace

TEST(Jinja, WhitespaceControlMatchesHuggingFaceSettings) {
    // trim_blocks: the newline after a block tag goes; lstrip_blocks: indentation before it goes
    EXPECT_EQ(render("{% if true %}\n  a\n{% endif %}\nb"), "  a\nb");
    EXPECT_EQ(render("  {% if true %}x{% endif %}"), "x");
    EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");
    EXPECT_EQ(render("{% if true +%}\nx{% endif %}"), "\nx");
    EXPECT_EQ(render("a  {{- 1 -}}  \n b"), "a1b");
    EXPECT_EQ(render("  {{ 1 }}\n"), "  1");  // output tags are not lstripped; one trailing newline dropped
    EXPECT_EQ(render("{# c #}\nx"), "x");
    EXPECT_EQ(render("a\r\nb\rc"), "a\nb\nc");
    EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
    EXPECT_EQ(render("x {%- if true -%} \n\t y {%- endif %}"), "xy");
}

TEST(Jinja, ExpressionsFollowPython) {
    EXPECT_EQ(render("{{ [1, 'a', none, true, 1.5] }}"), "[1, 'a', None, True, 1.5]");
    EXPECT_EQ(render("{{ {'a': 1, 'b': [2]} }}|{{ (1,) }}|{{ 1e20 }}|{{ 1/3 }}|{{ 7 // -2 }}|{{ -7 % 3 }}"),
              "{'a': 1, 'b': [2]}|(1,)|1e+20|0.3333333333333333|-4|2");
    EXPECT_EQ(render("{{ 'a' ~ 1 ~ none }}|{{ 'ab' * 2 }}|{{ 'x' if false }}|{{ 1 < 2 < 3 }}"), "a1None|abab||True");
    EXPECT_EQ(render("{{ 'héllo'[1] }}{{ 'héllo'[1:3] }}{{ 'héllo'|length }}{{ 'abc'[::-1] }}"), "éél5cba");
    EXPECT_EQ(render("{{ \"it's\" }}|{{ [\"it's\"] }}|{{ ['a\\nb'] }}"), "it's|[\"it's\"]|['a\\nb']");
    EXPECT_EQ(render("{{ '%s-%03d' % ('a', 7) }}|{{ '{}:{:>4}'.format('k', 5) }}"), "a-007|k:   5");
    EXPECT_EQ(render("{{ x.y is defined }}{{ none is none }}{{ 3 is odd }}{{ 'ab' is string }}", {{"x", Json::object()}}),
              "FalseTrueTrueTrue");
}

TEST(Jinja, FiltersAndMethods) {
    const Json ctx = {{"m", {{"role", "user"}, {"content", "  hi  "}}},
                      {"xs", Json::array({3, 1, 2})},
                      {"ms", Json::array({Json{{"role", "a"}}, Json{{"role", "b"}}, Json{{"x", 1}}})}};
    EXPECT_EQ(render("{{ m.content|trim }}|{{ m.content.strip() }}|{{ m.get('nope', 'd') }}|{{ m|length }}", ctx),
              "hi|hi|d|2");
    EXPECT_EQ(render("{{ xs|sort|join(',') }}|{{ xs|map('string')|list }}|{{ xs|max }}|{{ xs|sum }}", ctx),
              "1,2,3|['3', '1', '2']|3|6");
    EXPECT_EQ(render("{{ ms|selectattr('role')|map(attribute='role')|join }}|{{ ms|rejectattr('role')|list|length }}", ctx),
              "ab|1");
    EXPECT_EQ(render("{{ m|tojson }}|{{ m|tojson(indent=2) }}", ctx),
              "{\"role\": \"user\", \"content\": \"  hi  \"}|{\n  \"role\": \"user\",\n  \"content\": \"  hi  \"\n}");
    EXPECT_EQ(render("{{ {'b': 1, 'a': 'é'}|tojson(sort_keys=true, ensure_ascii=true, separators=(',', ':')) }}"),
              "{\"a\":\"\\u00e9\",\"b\":1}");
    EXPECT_EQ(render("{{ 'a,b'.split(',') }}|{{ 'ab'.upper() }}|{{ 'x'.startswith(('a', 'x')) }}|{{ 'a\\nb'|indent(2) }}"),
              "['a', 'b']|AB|True|a\n  b");
    EXPECT_EQ(render("{{ undefined_thing|default('d') }}|{{ ''|default('e', true) }}|{{ '3.7'|int }}|{{ 'x'|int(9) }}"),
              "d|e|3|9");
    EXPECT_EQ(render("{{ m|items|list }}|{{ m.items() }}", ctx),
              "[('role', 'user'), ('content', '  hi  ')]|dict_items([('role', 'user'), ('content', '  hi  ')])");
}

TEST(Jinja, ScopingFollowsJinja2) {
    // loop bodies do not leak assignments; namespace() carries state out
    EXPECT_EQ(render("{% set x = 0 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}|{{ x }}"), "12|0");
    EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in [1, 2] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"),
              "3");
    EXPECT_EQ(render("{% if true %}{% set y = 5 %}{% endif %}{{ y }}"), "5");
    // a name assigned in a frame belongs to that frame even before the assignment
    EXPECT_EQ(render("{% for x in [1] %}{% macro m() %}{{ i }}{% endmacro %}{{ m() }}{% set i = 5 %}{% endfor %}",
                     {{"i", 42}}),
              "");
    EXPECT_EQ(render("{% for x in [1] %}{{ i }}{% set i = 5 %}{{ i }}{% endfor %}", {{"i", 42}}), "425");
    EXPECT_EQ(render("{% macro m(a, b=2) %}{{ a }}{{ b }}{{ kwargs }}{% endmacro %}{{ m(1) }}|{{ m(1, c=3) }}"),
              "12{}|12{'c': 3}");
    EXPECT_EQ(render("{% macro w() %}[{{ caller('x') }}]{% endmacro %}{% call(v) w() %}{{ v }}!{% endcall %}"), "[x!]");
    EXPECT_EQ(render("{% for x in [1, 2, 3] if x > 1 %}{{ loop.index }}/{{ loop.length }}{{ loop.last }} {% endfor %}"),
              "1/2False 2/2True ");
    EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
    EXPECT_EQ(render("{% for x in [1, 2, 3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}"), "13");
    EXPECT_EQ(render("{% generation %}{{ 'g' }}{% endgeneration %}"), "g");
}

TEST(Jinja, ErrorsAreJinja2sWithLineAndColumn) {
    EXPECT_EQ(error_of("{{ raise_exception('System role not supported') }}"), "TemplateError: System role not supported");
    EXPECT_EQ(error_of("{{ x.y.z }}", {{"x", Json::object()}}), "UndefinedError: 'dict object' has no attribute 'y'");
    EXPECT_EQ(error_of("{{ 'a' + 1 }}"), "TypeError: can only concatenate str (not \"int\") to str");
    EXPECT_EQ(error_of("{{ [].append(1) }}"), "SecurityError: access to attribute 'append' of 'list' object is unsafe.");
    EXPECT_EQ(error_of("{{ 1 // 0 }}"), "ZeroDivisionError: integer division or modulo by zero");
    EXPECT_EQ(error_of("{{ x|nofilter }}"), "TemplateAssertionError: No filter named 'nofilter'.");
    EXPECT_EQ(error_of("{% if x %}{{ x|nofilter }}{% endif %}", {{"x", 1}}), "TemplateRuntimeError: No filter named 'nofilter' found.");
    EXPECT_EQ(error_of("{% for x in y %}"), "TemplateSyntaxError: Unexpected end of template. Jinja was looking for the "
                                            "following tags: 'endfor' or 'else'. The innermost block that needs to be "
                                            "closed is 'for'.");
    EXPECT_EQ(error_of("{% do x %}"), "TemplateSyntaxError: Encountered unknown tag 'do'.");
    try {
        Template t("line one\n{% if true %}\n  {{ 'a' ~ }}\n{% endif %}");
        FAIL() << "no error";
    } catch (const TemplateError& e) {
        EXPECT_EQ(e.type(), "TemplateSyntaxError");
        EXPECT_EQ(e.line(), 3);
        EXPECT_EQ(e.col(), 12);  // the "}}" where an operand was expected
    }
    try {
        render("a\nb {{ missing.attr }}");
        FAIL() << "no error";
    } catch (const TemplateError& e) {
        EXPECT_EQ(e.line(), 2);
        EXPECT_EQ(e.col(), 13);  // the attribute access on the undefined name
        EXPECT_NE(std::string(e.what()).find("line 2, column 13"), std::string::npos) << e.what();
    }
    EXPECT_NE(error_of("{% include 'x.jinja' %}").find("cannot load other templates"), std::string::npos);
}

TEST(Jinja, UntrustedTemplatesAreBounded) {
    quern::jinja::RenderOptions ro;
    ro.limits.max_steps = 100000;
    EXPECT_NE(error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", {}, ro)
                  .find("steps"),
              std::string::npos);
    EXPECT_EQ(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").rfind("RecursionError", 0), 0u);
    EXPECT_EQ(error_of("{{ range(1000000) }}").rfind("OverflowError: Range too big", 0), 0u);
    EXPECT_EQ(error_of("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
                  .rfind("MemoryError", 0),
              0u);
    std::string deep = "{{ ";
    for (int i = 0; i < 10000; ++i) deep += "x|trim|";
    EXPECT_EQ(error_of(deep + "trim }}").rfind("TemplateSyntaxError", 0), 0u);
    // Empty sequences repeated 2^63 - 1 times: empty at once, as in Python
    // (the count once looped with nothing to charge against the budget).
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(render("[{{ '' * 9223372036854775807 }}|{{ ([] * 9223372036854775807) | length }}|"
                     "{{ (() * 9223372036854775807) | length }}|{{ 9223372036854775807 * '' }}]"),
              "[|0|0|]");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
    // %-format widths: digits that would overflow an int, and '*' widths of
    // any size, are refused as too large (never wrapped into a small or
    // negative width).
    for (const char* f : {"{{ '%9999999999d' % 1 }}", "{{ '%99999999999s' % 'x' }}", "{{ '%.99999999999f' % 1.5 }}",
                          "{{ '%*d' % (-9223372036854775807 - 1, 1) }}", "{{ '%*s' % (9223372036854775807, 'x') }}"})
        EXPECT_EQ(error_of(f).rfind("MemoryError", 0), 0u) << f << ": " << error_of(f);
    EXPECT_EQ(render("{{ '%5d|%-4s|%.2f' % (42, 'ab', 3.14159) }}"), "   42|ab  |3.14");
}

// A render has a wall-clock budget too: steps that each take long (a filter
// over a long string) cannot hold a thread past it.
TEST(Jinja, RenderTimeIsBounded) {
    quern::jinja::RenderOptions ro;
    ro.limits.max_seconds = 0.3;
    const auto t0 = std::chrono::steady_clock::now();
    const std::string e = error_of(
        "{% set s = 'ab ' * 200000 %}{% for i in range(1000) %}{% for j in range(1000) %}{% set t = s | upper %}"
        "{% endfor %}{% endfor %}", {}, ro);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(e.find("longer than"), std::string::npos) << e;
    EXPECT_LT(took, quern::test::kSanitizerBuild ? 6.0 : 2.0);  // unbounded, it would run for minutes
}

// A parsed template is immutable: renders from many threads at once give
// what one render alone gives (quern serve renders without a lock).
TEST(Chat, ConcurrentRendersAgree) {
    std::ifstream f(std::string(QUERN_TESTDATA_DIR) + "/chat-templates/Qwen3-Coder.jinja");
    std::stringstream ss;
    ss << f.rdbuf();
    const quern::chat::ChatTemplate t(ss.str(), "", "<|im_end|>", "Qwen3-Coder");
    const Json msgs = Json::parse(R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "w",
         "arguments": {"city": "Paris", "days": [1, 2]}}}]}, {"role": "tool", "content": "sunny"}])");
    quern::chat::ChatOptions o;
    o.tools = Json::parse(R"([{"type": "function", "function": {"name": "w", "description": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
    const std::string alone = t.apply(msgs, o);
    std::atomic<int> same{0};
    std::vector<std::thread> ts;
    for (int k = 0; k < 8; ++k)
        ts.emplace_back([&] {
            for (int i = 0; i < 40; ++i) same += t.apply(msgs, o) == alone;
        });
    for (auto& th : ts) th.join();
    EXPECT_EQ(same.load(), 8 * 40);
}

TEST(Jinja, StrftimeNowUsesTheGivenTime) {
    quern::jinja::RenderOptions ro;
    ro.now = quern::chat::parse_time("2025-03-14T09:26:53");
    ASSERT_TRUE(ro.now);
    EXPECT_EQ(render("{{ strftime_now('%Y-%m-%d %H:%M %A %d %b') }}", {}, ro), "2025-03-14 09:26 Friday 14 Mar");
}

TEST(Chat, BuiltinTemplatesRender) {
    const Json msgs = Json::parse(R"([{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
        {"role": "assistant", "content": "A1"}, {"role": "user", "content": [{"type": "text", "text": "U2"}]}])");
    auto apply = [&](const std::string& name, const std::string& bos, const std::string& eos) {
        return quern::chat::ChatTemplate(*quern::chat::builtin_template(name), bos, eos).apply(msgs);
    };
    EXPECT_EQ(apply("chatml", "", ""),
              "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
              "<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n");
    EXPECT_EQ(apply("llama3", "<|begin_of_text|>", ""),
              "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user"
              "<|end_header_id|>\n\nU1<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nA1<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nU2<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    EXPECT_EQ(apply("llama2", "<s>", "</s>"), "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1 </s><s>[INST] U2 [/INST]");
    EXPECT_EQ(apply("mistral", "<s>", "</s>"), "<s>[INST] S\n\nU1 [/INST]A1</s>[INST] U2 [/INST]");
    EXPECT_EQ(apply("gemma", "<bos>", ""),
              "<bos><start_of_turn>user\nS\n\nU1<end_of_turn>\n<start_of_turn>model\nA1<end_of_turn>\n"
              "<start_of_turn>user\nU2<end_of_turn>\n<start_of_turn>model\n");
    EXPECT_EQ(apply("phi3", "", "<|endoftext|>"),
              "<|system|>\nS<|end|>\n<|user|>\nU1<|end|>\n<|assistant|>\nA1<|end|>\n<|user|>\nU2<|end|>\n<|assistant|>\n");
    for (const std::string& n : quern::chat::builtin_template_names()) EXPECT_TRUE(quern::chat::builtin_template(n)) << n;
    EXPECT_FALSE(quern::chat::builtin_template("nope"));
}

TEST(Chat, OptionsReachTheTemplate) {
    const quern::chat::ChatTemplate t(
        "{{ bos_token }}{% if tools %}T{{ tools|length }}{% endif %}{% if tools is none %}N{% endif %}"
        "{{ messages|length }}{% if add_generation_prompt %}G{% endif %}{{ enable_thinking }}",
        "<s>", "</s>");
    quern::chat::ChatOptions o;
    o.add_generation_prompt = false;
    EXPECT_EQ(t.apply(Json::array({Json{{"role", "user"}, {"content", "x"}}}), o), "<s>N1");
    o.tools = Json::array({Json{{"type", "function"}}});
    o.extra["enable_thinking"] = false;
    o.add_generation_prompt = true;
    EXPECT_EQ(t.apply(Json::array(), o), "<s>T10GFalse");
}

TEST(Chat, NoDoubleBos) {
    const std::string path = std::string(QUERN_TESTDATA_DIR) + "/vocab/ggml-vocab-llama-spm.gguf";
    if (!std::filesystem::exists(path)) GTEST_SKIP() << path;
    quern::GgufFile f(path);
    auto tok = quern::Tokenizer::from_gguf(f);
    ASSERT_TRUE(tok->add_bos());
    const auto t = quern::chat::ChatTemplate::for_model(f, *tok, "llama2");
    EXPECT_EQ(t.bos_token(), "<s>");
    const std::string prompt = t.apply(Json::array({Json{{"role", "user"}, {"content", "Hi"}}}));
    ASSERT_EQ(prompt.rfind("<s>[INST]", 0), 0u) << prompt;
    const std::vector<int32_t> ids = tok->encode_prompt(prompt, true);
    ASSERT_GE(ids.size(), 2u);
    EXPECT_EQ(ids[0], tok->bos());
    EXPECT_NE(ids[1], tok->bos());
    // a template that does not write BOS gets one from the tokenizer
    const std::vector<int32_t> plain = tok->encode_prompt("[INST] Hi [/INST]", true);
    EXPECT_EQ(plain[0], tok->bos());
    EXPECT_NE(plain[1], tok->bos());
}

TEST(Chat, DefaultModelUsesItsGgufTemplate) {
    const char* home = std::getenv("HOME");
    const std::string path = std::string(home ? home : ".") + "/.cache/quern/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "default model not fetched (bash tools/fetch-model.sh)";
    quern::GgufFile f(path);
    auto tok = quern::Tokenizer::from_gguf(f);
    const auto t = quern::chat::ChatTemplate::for_model(f, *tok);
    EXPECT_EQ(t.origin(), "tokenizer.chat_template");
    const std::string p = t.apply(Json::array({Json{{"role", "user"}, {"content", "Hi"}}}));
    EXPECT_NE(p.find("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"), std::string::npos) << p;
    EXPECT_EQ(quern::chat::guess_builtin_template(*tok), "chatml");
}
