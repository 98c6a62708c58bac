// Sampling defaults a model ships with: the sampling fields of a Hugging Face
// generation_config.json (transformers' GenerationConfig: temperature, top_p,
// top_k, min_p, repetition_penalty, do_sample). Commands use them where the
// user sets nothing: an explicit flag or request field wins over the file,
// the file over quern's built-in defaults.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/sampler.h"

namespace quern {

/// Which sampling fields the user set explicitly (a CLI flag, a request field).
struct SamplingGiven {
    bool temperature = false;
    bool top_k = false;
    bool top_p = false;
    bool min_p = false;
    bool repeat_penalty = false;
};

/// The sampling defaults of one generation_config.json; a field is set only
/// when the file gives it (a JSON null counts as absent).
struct GenerationDefaults {
    std::string origin;                      ///< the file they come from ("" when none)
    std::optional<float> temperature;        ///< >= 0 (0: greedy)
    std::optional<int> top_k;                ///< >= 0 (0: off)
    std::optional<float> top_p;              ///< in (0, 1] (1: off)
    std::optional<float> min_p;              ///< in [0, 1] (0: off)
    std::optional<float> repetition_penalty; ///< > 0 (1: off); quern's repeat_penalty
    /// do_sample: false, given explicitly: greedy decoding (temperature 0,
    /// whatever the file's temperature says, as transformers does). An absent
    /// do_sample leaves the file's values in force, as vLLM does.
    bool greedy = false;

    bool empty() const {
        return !temperature && !top_k && !top_p && !min_p && !repetition_penalty && !greedy;
    }
    /// Writes into `sp` every default whose field is not in `given`; fields
    /// the file does not set keep sp's values. Returns what it applied, one
    /// "name value" string each (e.g. "temperature 0.6", "temperature 0
    /// (do_sample false)"), for the message saying where defaults came from.
    std::vector<std::string> apply(SamplingParams& sp, const SamplingGiven& given) const;
};

/// Parses the text of a generation_config.json (`where` names the file in
/// errors). Keys other than the sampling ones above are ignored. Throws
/// quern::Error naming the file and the key for malformed JSON, a top level
/// that is not an object, a value of the wrong type (numbers; top_k an
/// integer; do_sample a boolean) or out of range (temperature < 0, top_p not
/// in (0, 1], min_p not in [0, 1], top_k < 0, repetition_penalty <= 0,
/// anything not finite): a default silently dropped would change every
/// reply without a word, so the file is fixed (or removed) rather than
/// half-used.
GenerationDefaults parse_generation_defaults(std::string_view json_text, const std::string& where);

/// Reads dir/generation_config.json; no defaults (empty, origin "") when the
/// folder has none. Errors as parse_generation_defaults, and for a file that
/// exists but cannot be read.
GenerationDefaults load_generation_defaults(const std::string& dir);

}  // namespace quern
