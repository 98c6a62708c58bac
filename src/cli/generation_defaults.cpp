// The sampling defaults of a Hugging Face folder's generation_config.json,
// under the command line's flags (quern run, chat, serve).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <cstdio>

#include "cli/common.h"
#include "model/hf_model.h"

namespace quern::cli {

SamplingGiven sampling_given(const CLI::App& cmd) {
    auto given = [&](const char* name) {
        const CLI::Option* o = cmd.get_option_no_throw(name);
        return o != nullptr && o->count() > 0;
    };
    SamplingGiven g;
    g.temperature = given("--temp");
    g.top_k = given("--top-k");
    g.top_p = given("--top-p");
    g.min_p = given("--min-p");
    g.repeat_penalty = given("--repeat-penalty");
    return g;
}

GenerationDefaults apply_generation_defaults(const LoadedModel& m, SamplingParams& sp, const SamplingGiven& given) {
    if (m.file || !is_hf_model_path(m.path)) return {};
    GenerationDefaults g = load_generation_defaults(resolve_hf_folder(m.path).dir);
    if (g.empty()) return g;
    const std::vector<std::string> used = g.apply(sp, given);
    if (used.empty())
        std::fprintf(stderr, "quern: sampling: the command line overrides every default of %s\n", g.origin.c_str());
    else
        std::fprintf(stderr, "quern: sampling defaults from %s: %s\n", g.origin.c_str(),
                     fmt::format("{}", fmt::join(used, ", ")).c_str());
    return g;
}

}  // namespace quern::cli
