// bench_grammar: the per-token cost of constrained decoding's token masks
// (grammar/token_matcher.h). For each sample JSON schema (and the plain
// json_object grammar) it tokenizes a document the schema accepts with the
// given vocabulary and runs what the engine runs at every decode step: the
// mask over the whole vocabulary, then the chosen token's accept. Three
// passes over the samples:
//   1. cold: empty caches (the first constrained request a server sees);
//   2. new schemas on a warm server: the samples with every property
//      renamed (the shared JSON rules' chain masks are cached, the schema's
//      own states are new);
//   3. seen schemas: the first samples again (every state's mask cached);
//   4. after the warm-up: the samples on fresh caches that
//      grammar::warm_json_masks filled first (its own documents; what
//      `quern serve` does at start), i.e. a server's first requests.
// Reports the mean, median, p99 and worst time per step of each pass.
//
// Usage: bench_grammar --vocab FILE.gguf [--reps 1] [--json]
// A 150k vocabulary: Qwen2.5's (tools/fetch-tool-model.sh fetches one).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/json_schema.h"
#include "grammar/token_matcher.h"
#include "grammar/warm.h"
#include "tokenizer/tokenizer.h"

using namespace quern;
using Clock = std::chrono::steady_clock;

namespace {

struct Sample {
    const char* schema;  // nullptr: the json_object grammar
    const char* doc;
};

const Sample kSamples[] = {
    {R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"email":{"type":"string"}},"required":["name","age"]})",
     R"({"name": "Ada Lovelace", "age": 36, "email": "ada@analytical.engine"})"},
    {R"({"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"array","items":{"type":"number"}}},"required":["city","unit","days"]})",
     R"({"city": "Reykjavik, Iceland", "unit": "celsius", "days": [3.5, -1.25, 0, 12]})"},
    {R"({"type":"object","properties":{"title":{"type":"string"},"tags":{"type":"array","items":{"type":"string"}},"author":{"type":"object","properties":{"first":{"type":"string"},"last":{"type":"string"},"born":{"type":"integer"}},"required":["first","last"]},"draft":{"type":"boolean"}},"required":["title","tags","author","draft"]})",
     R"({"title": "On Computable Numbers, with an Application to the Entscheidungsproblem", "tags": ["logic", "computation", "history of science"], "author": {"first": "Alan", "last": "Turing", "born": 1912}, "draft": false})"},
    // bounded strings, a pattern, a format and an integer range: counted
    // repetitions, where every position is a state of its own
    {R"({"type":"object","properties":{"code":{"type":"string","pattern":"^[A-Z]{3}-\\d{4}$"},"when":{"type":"string","format":"date-time"},"note":{"type":"string","maxLength":40},"level":{"type":"integer","minimum":1,"maximum":5}},"required":["code","when","note","level"]})",
     R"({"code": "ABC-1234", "when": "2026-12-05T01:20:09Z", "note": "bounded strings cost a walk per state", "level": 3})"},
    {nullptr,
     R"({"id": "chatcmpl-42", "choices": [{"index": 0, "message": {"role": "assistant", "content": "The answer is 42.\nIt always was."}}], "usage": {"prompt_tokens": 17, "completion_tokens": 9}})"},
};

struct Stats {
    double mean_us = 0, p50_us = 0, p99_us = 0, max_us = 0;
    size_t steps = 0;
};

/// `j` with every object key (and, in a schema, every `required` name)
/// suffixed: the same shape under new names.
nlohmann::ordered_json renamed(const nlohmann::ordered_json& j, bool schema) {
    if (j.is_array()) {
        nlohmann::ordered_json out = nlohmann::ordered_json::array();
        for (const auto& v : j) out.push_back(renamed(v, schema));
        return out;
    }
    if (!j.is_object()) return j;
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    for (const auto& [k, v] : j.items()) {
        if (schema && k == "properties") {
            nlohmann::ordered_json props = nlohmann::ordered_json::object();
            for (const auto& [name, sub] : v.items()) props[name + "_v2"] = renamed(sub, true);
            out[k] = props;
        } else if (schema && k == "required") {
            nlohmann::ordered_json req = nlohmann::ordered_json::array();
            for (const auto& name : v) req.push_back(name.get<std::string>() + "_v2");
            out[k] = req;
        } else {
            out[schema ? k : k + "_v2"] = renamed(v, schema);
        }
    }
    return out;
}

Stats summarize(std::vector<double> us) {
    Stats s;
    if (us.empty()) return s;
    std::sort(us.begin(), us.end());
    double sum = 0;
    for (double u : us) sum += u;
    s.steps = us.size();
    s.mean_us = sum / static_cast<double>(us.size());
    s.p50_us = us[us.size() / 2];
    s.p99_us = us[std::min(us.size() - 1, us.size() * 99 / 100)];
    s.max_us = us.back();
    return s;
}

}  // namespace

int main(int argc, char** argv) {
    std::string vocab;
    int reps = 1;
    bool json = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--vocab" && i + 1 < argc) vocab = argv[++i];
        else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
        else if (a == "--json") json = true;
        else {
            std::fprintf(stderr, "usage: bench_grammar --vocab FILE.gguf [--reps N] [--json]\n");
            return 2;
        }
    }
    if (vocab.empty()) {
        std::fprintf(stderr, "bench_grammar: --vocab FILE.gguf is required (a model or vocabulary GGUF)\n");
        return 2;
    }
    const auto tok = Tokenizer::from_file(vocab);
    // [0]: the samples; [1]: renamed.
    std::vector<std::shared_ptr<const grammar::Grammar>> grammars[2];
    std::vector<std::vector<int32_t>> docs[2];
    for (const Sample& s : kSamples) {
        const auto doc = nlohmann::ordered_json::parse(s.doc);
        for (int v = 0; v < 2; ++v) {
            if (s.schema) {
                const auto schema = nlohmann::ordered_json::parse(s.schema);
                grammars[v].push_back(grammar::json_schema_grammar(v ? renamed(schema, true) : schema));
            } else {
                grammars[v].push_back(grammar::Grammar::json(true));
            }
            docs[v].push_back(tok->encode(v ? renamed(doc, false).dump() : std::string(s.doc), false, false));
        }
    }
    static const char* kPass[] = {"", "cold", "new schemas, warm", "seen schemas", "after the warm-up"};
    std::vector<float> logits(static_cast<size_t>(tok->n_vocab()));
    for (int rep = 0; rep < reps; ++rep) {
        auto pieces = grammar::TokenPieces::of(*tok);  // empty caches
        for (int pass = 1; pass <= 4; ++pass) {
            const int v = pass == 2 ? 1 : 0;
            double warm_ms = 0;
            if (pass == 4) {
                pieces = grammar::TokenPieces::of(*tok);
                const auto t0 = Clock::now();
                const grammar::WarmStats w = grammar::warm_json_masks(*tok, pieces);
                warm_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
                if (w.accepted != w.documents) {
                    std::fprintf(stderr, "bench_grammar: the warm-up's documents were not all accepted (a bug)\n");
                    return 1;
                }
            }
            std::vector<double> us;
            double accept_us = 0;  // of which advancing over the chosen tokens
            for (size_t d = 0; d < docs[v].size(); ++d) {
                grammar::TokenMatcher m(grammars[v][d], pieces);
                const auto& ids = docs[v][d];
                for (size_t i = 0; i <= ids.size(); ++i) {
                    std::fill(logits.begin(), logits.end(), 0.0f);
                    const auto t0 = Clock::now();
                    m.mask(logits.data());
                    const auto t1 = Clock::now();
                    const bool ok = i == ids.size() || m.accept(ids[i]);
                    const auto t2 = Clock::now();
                    us.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count());
                    accept_us += std::chrono::duration<double, std::micro>(t2 - t1).count();
                    if (!ok) {
                        std::fprintf(stderr, "bench_grammar: sample %zu: token %zu refused (a bug)\n", d, i);
                        return 1;
                    }
                }
                if (!m.accepting()) {
                    std::fprintf(stderr, "bench_grammar: sample %zu not accepted at its end (a bug)\n", d);
                    return 1;
                }
            }
            const Stats s = summarize(us);
            const double acc = accept_us / static_cast<double>(s.steps);
            if (json)
                std::printf("{\"bench\":\"grammar_mask\",\"vocab\":%d,\"pass\":\"%s\",\"steps\":%zu,\"mean_us\":%.1f,"
                            "\"p50_us\":%.1f,\"p99_us\":%.1f,\"max_us\":%.1f,\"accept_mean_us\":%.1f,\"warm_ms\":%.1f}\n",
                            tok->n_vocab(), kPass[pass], s.steps, s.mean_us, s.p50_us, s.p99_us, s.max_us, acc,
                            warm_ms);
            else
                std::printf("%d-token vocabulary, %-18s %zu steps: mean %7.1f us, median %6.1f us, p99 %7.1f us, "
                            "worst %7.1f us per step (accept: %.1f us of it)\n",
                            tok->n_vocab(), (std::string(kPass[pass]) + ":").c_str(), s.steps, s.mean_us, s.p50_us,
                            s.p99_us, s.max_us, acc);
            if (!json && pass == 4) std::printf("  (the warm-up itself: %.0f ms)\n", warm_ms);
        }
    }
    return 0;
}
