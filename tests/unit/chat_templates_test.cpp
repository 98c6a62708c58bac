// Renders every chat template of ../shared/testdata/chat-templates over the
// conversations of tests/data/chat/conversations.json and compares the bytes
// (or the error jinja2 raised: its message and exception class) with the
// outputs Python jinja2 produced, stored in tests/data/chat/expected/ by
// tools/make_chat_fixtures.py (Hugging Face's environment; strftime_now at a
// fixed time). Prints a per-template pass count.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "chat/template.h"

namespace fs = std::filesystem;
using quern::jinja::Template;
using quern::jinja::TemplateError;
using quern::jinja::Value;
using ojson = nlohmann::ordered_json;

namespace {

std::string read_file(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::tm fixed_now(const std::string& iso) {
    std::tm tm{};
    std::istringstream ss(iso);
    ss >> std::get_time(&tm, "%Y-%m-%dT%H:%M:%S");
    tm.tm_isdst = -1;
    std::tm copy = tm;
    std::mktime(&copy);  // fills tm_wday / tm_yday
    tm.tm_wday = copy.tm_wday;
    tm.tm_yday = copy.tm_yday;
    return tm;
}

Value make_context(const ojson& conv, const ojson& c, const ojson& extra) {
    ojson ctx = ojson::object();
    ctx["messages"] = c["messages"];
    ctx["tools"] = c["tools"];
    ctx["documents"] = nullptr;
    ctx["add_generation_prompt"] = c["add_generation_prompt"];
    ctx["bos_token"] = conv["bos_token"];
    ctx["eos_token"] = conv["eos_token"];
    for (const auto& [k, v] : extra.items()) ctx[k] = v;
    for (const auto& [k, v] : c["kwargs"].items()) ctx[k] = v;
    return quern::jinja::from_json(ctx);
}

std::string first_diff(const std::string& a, const std::string& b) {
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    const size_t from = i > 60 ? i - 60 : 0;
    return "first difference at byte " + std::to_string(i) + "\n  got:      " +
           nlohmann::json(a.substr(from, 160)).dump() + "\n  expected: " + nlohmann::json(b.substr(from, 160)).dump();
}

}  // namespace

TEST(ChatTemplates, MatchJinja2OnEveryTemplate) {
    const fs::path data = fs::path(QUERN_SOURCE_DIR) / "tests/data/chat";
    const fs::path tdir = fs::path(QUERN_TESTDATA_DIR) / "chat-templates";
    if (!fs::exists(tdir)) GTEST_SKIP() << tdir << " not found";
    const ojson conv = ojson::parse(read_file(data / "conversations.json"));
    quern::jinja::RenderOptions ropts;
    ropts.now = fixed_now(conv["now"].get<std::string>());

    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(data / "expected")) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    ASSERT_GE(files.size(), 49u);
    int total = 0, passed = 0, templates_ok = 0;
    for (const fs::path& f : files) {
        const ojson exp = ojson::parse(read_file(f));
        const std::string tname = exp["template"].get<std::string>();
        const std::string source = read_file(tdir / tname);
        int ok = 0, n = 0;
        std::unique_ptr<Template> tmpl;
        std::string parse_error, parse_type;
        try {
            tmpl = std::make_unique<Template>(source);
        } catch (const TemplateError& e) {
            parse_error = e.message();
            parse_type = e.type();
        }
        for (const auto& c : conv["cases"]) {
            const std::string cname = c["name"].get<std::string>();
            const ojson& want = exp["results"][cname];
            ++n;
            std::string got, err, err_type;
            bool failed = false;
            if (!tmpl) {
                failed = true;
                err = parse_error;
                err_type = parse_type;
            } else {
                try {
                    got = tmpl->render(make_context(conv, c, exp["kwargs"]), ropts);
                } catch (const TemplateError& e) {
                    failed = true;
                    err = e.message();
                    err_type = e.type();
                }
            }
            if (want.contains("output")) {
                const std::string w = want["output"].get<std::string>();
                if (failed) {
                    ADD_FAILURE() << tname << " / " << cname << ": error " << err_type << ": " << err;
                } else if (got != w) {
                    ADD_FAILURE() << tname << " / " << cname << ": output differs; " << first_diff(got, w);
                } else {
                    ++ok;
                }
            } else {
                const std::string w = want["error"].get<std::string>();
                const std::string wk = want["kind"].get<std::string>();
                const bool kind_ok = wk == "syntax" ? (err_type == "TemplateSyntaxError" || err_type == "TemplateAssertionError")
                                                    : wk == err_type;
                if (!failed) {
                    ADD_FAILURE() << tname << " / " << cname << ": rendered, but jinja2 raised " << wk << ": " << w;
                } else if (err != w || !kind_ok) {
                    ADD_FAILURE() << tname << " / " << cname << ": error " << err_type << ": " << err
                                  << "\n  jinja2: " << wk << ": " << w;
                } else {
                    ++ok;
                }
            }
        }
        total += n;
        passed += ok;
        templates_ok += ok == n;
        std::printf("  %-55s %2d/%2d\n", tname.c_str(), ok, n);
    }
    std::printf("chat templates: %d/%zu templates fully match, %d/%d renders\n", templates_ok, files.size(), passed,
                total);
}
