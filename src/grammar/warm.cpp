// Sample documents through the JSON grammars (warm.h).
#include "grammar/warm.h"

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grammar/json_schema.h"
#include "tokenizer/tokenizer.h"

namespace quern::grammar {

namespace {

struct Sample {
    const char* schema;  // nullptr: the json_object grammar
    const char* doc;
};

// Between them: unbounded and bounded strings (with escapes and non-ASCII
// text), a pattern, a date-time, integers with and without a range, numbers
// with fractions and exponents, booleans, null, an enum, arrays of strings,
// numbers and objects, nested objects, and the free-form object grammar.
const Sample kSamples[] = {
    {R"({"type":"object","properties":{
        "name":{"type":"string"},"kind":{"enum":["tool","person","place"]},
        "code":{"type":"string","pattern":"^[A-Z]{3}-\\d{4}$"},"when":{"type":"string","format":"date-time"},
        "note":{"type":"string","maxLength":40},"tag":{"type":"string","minLength":2,"maxLength":12},
        "level":{"type":"integer","minimum":1,"maximum":5},"count":{"type":"integer"},"score":{"type":"number"},
        "ok":{"type":"boolean"},"none":{"type":"null"},
        "tags":{"type":"array","items":{"type":"string"}},"days":{"type":"array","items":{"type":"number"}},
        "items":{"type":"array","items":{"type":"object","properties":{"id":{"type":"integer"},"label":{"type":"string"}},
                 "required":["id","label"]}},
        "address":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"string"}},"required":["city"]}},
      "required":["name","kind","code","when","note","tag","level","count","score","ok","none","tags","days","items",
                  "address"]})",
     R"({"name": "Ada \"the Countess\" Lovelace, née Byron", "kind": "person", "code": "ABC-1234",
         "when": "2026-12-05T01:20:09Z", "note": "bounded strings cost a walk per state", "tag": "math",
         "level": 3, "count": -1024, "score": 3.25e-2, "ok": true, "none": null,
         "tags": ["logic", "computation", "história"], "days": [3.5, -1.25, 0, 12],
         "items": [{"id": 1, "label": "first"}, {"id": 22, "label": "second\nline"}],
         "address": {"city": "Reykjavík", "zip": "101"}})"},
    {nullptr,
     R"({"id": "chatcmpl-42", "choices": [{"index": 0, "message": {"role": "assistant",
         "content": "The answer is 42.\nIt always was. \u00e9\t\\"}}], "usage": {"prompt_tokens": 17,
         "completion_tokens": 9, "ratio": -0.5E+3}, "done": false, "extra": null, "list": [[], {}, [1, [2]]]})"},
};

}  // namespace

WarmStats warm_json_masks(const Tokenizer& tok, const std::shared_ptr<const TokenPieces>& pieces) {
    WarmStats st;
    std::vector<float> logits(static_cast<size_t>(pieces->n_vocab));
    for (const Sample& s : kSamples) {
        const auto g = s.schema ? json_schema_grammar(nlohmann::ordered_json::parse(s.schema)) : Grammar::json(true);
        // Compact, as a model writes under the grammar's whitespace rules.
        const std::vector<int32_t> ids = tok.encode(nlohmann::ordered_json::parse(s.doc).dump(), false, false);
        TokenMatcher m(g, pieces);
        ++st.documents;
        bool ok = true;
        for (int32_t id : ids) {
            m.mask(logits.data());
            ++st.steps;
            if (!m.accept(id)) {
                ok = false;
                break;
            }
        }
        if (ok) {
            m.mask(logits.data());  // the end state (end-of-generation allowed)
            ++st.steps;
        }
        st.accepted += ok && m.accepting();
    }
    return st;
}

}  // namespace quern::grammar
