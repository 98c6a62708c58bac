// Loading a tokenizer from Hugging Face files: tokenizer.json (model,
// added_tokens, normalizer, pre_tokenizer, post_processor, decoder), plus
// tokenizer_config.json (add_bos_token / add_eos_token, bos/eos/unk/pad
// token names) and generation_config.json (eos_token_id) when present.
#include <algorithm>
#include <climits>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/patterns.h"
#include "tokenizer/tokenizer.h"

namespace quern {

namespace {

using json = nlohmann::json;
constexpr std::string_view kSpmSpace = "\xE2\x96\x81";
constexpr int64_t kMaxVocab = 1 << 24;

std::string quote_regex(std::string_view s) {
    std::string out = "\\Q";
    out.append(s);
    out += "\\E";
    return out;
}

// A Split/Replace "pattern": {"Regex": "..."} or {"String": "..."} as a PCRE2 regex.
std::string pattern_regex(const json& p, const std::string& where) {
    if (p.is_object()) {
        if (p.contains("Regex") && p["Regex"].is_string()) return p["Regex"].get<std::string>();
        if (p.contains("String") && p["String"].is_string()) return quote_regex(p["String"].get<std::string>());
    }
    fail("tokenizer: {}: a pattern must be {{\"Regex\": ...}} or {{\"String\": ...}}, got {}", where, p.dump());
}

SplitBehavior parse_behavior(const json& j, const std::string& where) {
    const std::string b = j.is_string() ? j.get<std::string>() : "Isolated";
    if (b == "Isolated") return SplitBehavior::Isolated;
    if (b == "Removed") return SplitBehavior::Removed;
    if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
    if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
    if (b == "Contiguous") return SplitBehavior::Contiguous;
    fail("tokenizer: {}: unknown split behavior '{}'", where, b);
}

bool get_bool(const json& j, const char* key, bool def) {
    auto it = j.find(key);
    return it != j.end() && it->is_boolean() ? it->get<bool>() : def;
}

std::string get_string(const json& j, const char* key, const std::string& def = "") {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : def;
}

void parse_pre(const json& p, std::vector<PreStep>& steps, const std::string& where) {
    if (p.is_null()) return;
    if (!p.is_object()) fail("tokenizer: {}: pre_tokenizer must be an object", where);
    const std::string type = get_string(p, "type");
    if (type == "Sequence") {
        for (const json& q : p.value("pretokenizers", json::array())) parse_pre(q, steps, where);
    } else if (type == "ByteLevel") {
        steps.push_back(PreStep::byte_level(get_bool(p, "add_prefix_space", true), get_bool(p, "use_regex", true)));
    } else if (type == "Split") {
        steps.push_back(PreStep::regex(pattern_regex(p.value("pattern", json()), where),
                                       parse_behavior(p.value("behavior", json()), where),
                                       get_bool(p, "invert", false)));
    } else if (type == "Digits") {
        steps.push_back(PreStep::regex(get_bool(p, "individual_digits", false) ? patterns::kDigit : patterns::kDigitRun));
    } else if (type == "Punctuation") {
        const SplitBehavior b = parse_behavior(p.value("behavior", json()), where);
        if (b == SplitBehavior::Contiguous)
            steps.push_back(PreStep::regex(patterns::kFalconPunct));  // the same class, runs isolated
        else
            steps.push_back(PreStep::regex(patterns::kPunctOne, b));
    } else if (type == "Metaspace") {
        PrependScheme scheme = PrependScheme::Always;
        const std::string s = get_string(p, "prepend_scheme");
        if (s == "first")
            scheme = PrependScheme::First;
        else if (s == "never")
            scheme = PrependScheme::Never;
        else if (s.empty() && !get_bool(p, "add_prefix_space", true))
            scheme = PrependScheme::Never;
        PreStep m = PreStep::metaspace(scheme, get_bool(p, "split", true));
        m.replacement = get_string(p, "replacement", std::string(kSpmSpace));
        steps.push_back(m);
    } else if (type == "WhitespaceSplit") {
        steps.push_back(PreStep::regex(R"(\s+)", SplitBehavior::Removed));
    } else {
        fail("tokenizer: {}: pre-tokenizer type '{}' is not supported (supported: Sequence, ByteLevel, Split, "
             "Digits, Punctuation, Metaspace, WhitespaceSplit)",
             where, type);
    }
}

void parse_normalizer(const json& n, std::vector<NormStep>& steps, const std::string& where) {
    if (n.is_null()) return;
    if (!n.is_object()) fail("tokenizer: {}: normalizer must be an object", where);
    const std::string type = get_string(n, "type");
    if (type == "Sequence") {
        for (const json& q : n.value("normalizers", json::array())) parse_normalizer(q, steps, where);
    } else if (type == "Prepend") {
        steps.push_back(NormStep::prepend(get_string(n, "prepend")));
    } else if (type == "Replace") {
        const json& p = n.value("pattern", json());
        const std::string content = get_string(n, "content");
        if (p.is_object() && p.contains("String") && p["String"].is_string())
            steps.push_back(NormStep::replace(p["String"].get<std::string>(), content));
        else
            steps.push_back(NormStep::replace_regex(pattern_regex(p, where), content));
    } else if (type == "Strip") {
        steps.push_back(NormStep::strip(get_bool(n, "strip_left", false), get_bool(n, "strip_right", false)));
    } else if (type == "NFC") {
        steps.push_back(NormStep::nfc());
    } else {
        fail("tokenizer: {}: normalizer type '{}' is not supported (supported: Sequence, Prepend, Replace, Strip, "
             "NFC)",
             where, type);
    }
}

// Decoders: whether the first decoded piece loses its leading space.
void parse_decoder(const json& d, bool& strip_first_space, const std::string& where) {
    if (d.is_null()) return;
    const std::string type = get_string(d, "type");
    if (type == "Sequence") {
        for (const json& q : d.value("decoders", json::array())) parse_decoder(q, strip_first_space, where);
    } else if (type == "Strip") {
        if (get_string(d, "content", " ") == " " && d.value("start", 0) >= 1) strip_first_space = true;
    } else if (type == "Metaspace") {
        const std::string s = get_string(d, "prepend_scheme");
        if (s == "always" || s == "first" || (s.empty() && get_bool(d, "add_prefix_space", true)))
            strip_first_space = true;
    } else if (type == "Replace") {
        const json& p = d.value("pattern", json());
        const bool spm = p.is_object() && p.value("String", std::string()) == kSpmSpace && get_string(d, "content") == " ";
        if (!spm) fail("tokenizer: {}: only the \"▁\" -> \" \" Replace decoder is supported", where);
    } else if (type != "ByteLevel" && type != "ByteFallback" && type != "Fuse") {
        fail("tokenizer: {}: decoder type '{}' is not supported", where, type);
    }
}

// Special tokens named by a post-processor (TemplateProcessing, Roberta, Bert).
void parse_post(const json& p, const std::function<int32_t(const std::string&)>& id_of, VocabData& d) {
    if (p.is_null() || !p.is_object()) return;
    const std::string type = get_string(p, "type");
    if (type == "Sequence") {
        for (const json& q : p.value("processors", json::array())) parse_post(q, id_of, d);
    } else if (type == "TemplateProcessing") {
        bool seen_a = false;
        for (const json& piece : p.value("single", json::array())) {
            if (piece.contains("Sequence")) {
                seen_a = true;
            } else if (piece.contains("SpecialToken")) {
                const std::string name = piece["SpecialToken"].value("id", std::string());
                int32_t id = id_of(name);
                auto st = p.value("special_tokens", json::object());
                if (st.contains(name) && st[name].contains("ids") && !st[name]["ids"].empty() &&
                    st[name]["ids"][0].is_number_integer())
                    id = st[name]["ids"][0].get<int32_t>();
                if (!seen_a) {
                    d.add_bos = true;
                    d.bos = id;
                } else {
                    d.add_eos = true;
                    d.eos = id;
                }
            }
        }
    } else if (type == "RobertaProcessing" || type == "BertProcessing") {
        auto tok = [&](const char* key) -> int32_t {
            const json& v = p.value(key, json::array());
            return v.is_array() && v.size() == 2 && v[1].is_number_integer() ? v[1].get<int32_t>() : -1;
        };
        d.add_bos = d.add_eos = true;
        d.bos = tok("cls");
        d.eos = tok("sep");
    }
}

std::string token_name(const json& v) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object()) return v.value("content", std::string());
    return {};
}

json parse_json(std::string_view text, const std::string& where) {
    try {
        return json::parse(text);
    } catch (const json::exception& e) {
        fail("tokenizer: {}: not valid JSON ({})", where, e.what());
    }
}

/// A file beside tokenizer.json (tokenizer_config.json, generation_config.json):
/// errors name the file alone, as other parts of quern read it too.
json parse_side_json(std::string_view text, const std::string& where) {
    try {
        return json::parse(text);
    } catch (const json::exception& e) {
        fail("{}: not valid JSON ({})", where, e.what());
    }
}

/// generation_config.json's eos_token_id: an id or a list of ids.
void parse_eos_ids(const json& e, const std::string& where, std::vector<int32_t>& out) {
    auto id = [&](const json& x) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
            fail("{}: key 'eos_token_id' must be a token id or a list of token ids, got {}", where, e.dump());
        out.push_back(static_cast<int32_t>(x.get<int64_t>()));
    };
    if (e.is_null()) return;
    if (!e.is_array()) return id(e);
    for (const json& x : e) id(x);
}

std::string read_text(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    if (!f) fail("tokenizer: cannot read {}", p.string());
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

}  // namespace

VocabData Tokenizer::vocab_from_hf_json(std::string_view tokenizer_json, std::string_view tokenizer_config_json,
                                        std::string_view generation_config_json, const std::string& where,
                                        const std::string& config_where, const std::string& generation_where) {
    const json j = parse_json(tokenizer_json, where);
    if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
        fail("tokenizer: {}: no \"model\" object (is this a tokenizer.json?)", where);
    const json& m = j["model"];
    const std::string type = get_string(m, "type", "BPE");
    if (type != "BPE")
        fail("tokenizer: {}: model type '{}' is not supported (quern reads BPE tokenizer.json models)", where, type);
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
        if (m.contains(key) && m[key].is_string() && !m[key].get<std::string>().empty())
            fail("tokenizer: {}: BPE {} is not supported", where, key);
    if (m.contains("dropout") && m["dropout"].is_number() && m["dropout"].get<double>() > 0)
        fail("tokenizer: {}: BPE dropout is not supported", where);
    if (!m.contains("vocab") || !m["vocab"].is_object()) fail("tokenizer: {}: model.vocab must be an object", where);

    VocabData d;
    d.explicit_pipeline = true;
    parse_pre(j.value("pre_tokenizer", json()), d.pre_steps, where + " pre_tokenizer");
    parse_normalizer(j.value("normalizer", json()), d.normalizer, where + " normalizer");
    bool strip_first_space = false;
    parse_decoder(j.value("decoder", json()), strip_first_space, where + " decoder");
    bool byte_level = false;
    for (const PreStep& s : d.pre_steps) byte_level |= s.kind == PreStep::Kind::ByteLevel;
    d.kind = byte_level ? VocabKind::Bpe : VocabKind::SpmBpe;
    d.pre = byte_level ? "custom" : "";
    d.add_space_prefix = !byte_level && strip_first_space;
    d.byte_fallback = get_bool(m, "byte_fallback", false);
    d.fuse_unk = get_bool(m, "fuse_unk", false);
    d.ignore_merges = get_bool(m, "ignore_merges", false);

    // Vocabulary and added tokens.
    int64_t n = 0;
    for (const auto& [text, id] : m["vocab"].items()) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxVocab)
            fail("tokenizer: {}: model.vocab[\"{}\"] is not a valid id", where, text);
        n = std::max(n, id.get<int64_t>() + 1);
    }
    const json added = j.value("added_tokens", json::array());
    for (const json& a : added) {
        const int64_t id = a.value("id", int64_t{-1});
        if (id < 0 || id >= kMaxVocab) fail("tokenizer: {}: added token with an invalid id", where);
        n = std::max(n, id + 1);
    }
    d.tokens.assign(static_cast<size_t>(n), std::string());
    d.types.assign(static_cast<size_t>(n), TokenType::Unused);
    for (const auto& [text, id] : m["vocab"].items()) {
        const auto i = static_cast<size_t>(id.get<int64_t>());
        d.tokens[i] = text;
        const bool byte_tok = !byte_level && text.size() == 6 && text.rfind("<0x", 0) == 0 && text[5] == '>';
        d.types[i] = byte_tok ? TokenType::Byte : TokenType::Normal;
    }
    for (const json& a : added) {
        const auto i = static_cast<int32_t>(a.value("id", int64_t{0}));
        d.tokens[i] = a.value("content", std::string());
        d.types[i] = a.value("special", false) ? TokenType::Control : TokenType::UserDefined;
        AddedTokenFlags fl{a.value("lstrip", false), a.value("rstrip", false), a.value("single_word", false)};
        if (fl.lstrip || fl.rstrip || fl.single_word) d.added_flags[i] = fl;
    }
    auto id_of = [&](const std::string& name) -> int32_t {
        if (name.empty()) return -1;
        for (const json& a : added)
            if (a.value("content", std::string()) == name) return static_cast<int32_t>(a.value("id", int64_t{-1}));
        auto it = m["vocab"].find(name);
        return it != m["vocab"].end() ? it->get<int32_t>() : -1;
    };
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
        d.unk = id_of(m["unk_token"].get<std::string>());
        if (d.unk >= 0 && d.types[d.unk] == TokenType::Normal) d.types[d.unk] = TokenType::Unknown;
    }

    // Merges: "left right" strings or [left, right] pairs.
    const json merges = m.value("merges", json::array());
    d.merge_pairs.reserve(merges.size());
    for (const json& mg : merges) {
        if (mg.is_string()) {
            const std::string s = mg.get<std::string>();
            const size_t sp = s.find(' ', 1);
            if (sp == std::string::npos) fail("tokenizer: {}: merge \"{}\" has no space", where, s);
            d.merge_pairs.emplace_back(s.substr(0, sp), s.substr(sp + 1));
        } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
            d.merge_pairs.emplace_back(mg[0].get<std::string>(), mg[1].get<std::string>());
        } else {
            fail("tokenizer: {}: a merge must be \"a b\" or [\"a\", \"b\"], got {}", where, mg.dump());
        }
    }

    // BOS/EOS: the post-processor template, then tokenizer_config.json.
    parse_post(j.value("post_processor", json()), id_of, d);
    if (!tokenizer_config_json.empty()) {
        const json c = parse_side_json(tokenizer_config_json, config_where);
        if (c.is_object()) {
            if (c.contains("add_bos_token") && c["add_bos_token"].is_boolean()) d.add_bos = c["add_bos_token"].get<bool>();
            if (c.contains("add_eos_token") && c["add_eos_token"].is_boolean()) d.add_eos = c["add_eos_token"].get<bool>();
            if (int32_t id = id_of(token_name(c.value("bos_token", json()))); id >= 0) d.bos = id;
            if (int32_t id = id_of(token_name(c.value("eos_token", json()))); id >= 0) d.eos = id;
            if (int32_t id = id_of(token_name(c.value("pad_token", json()))); id >= 0) d.pad = id;
        }
    }
    if (!generation_config_json.empty()) {
        const json g = parse_side_json(generation_config_json, generation_where);
        if (!g.is_object()) fail("{}: the top level must be a JSON object", generation_where);
        parse_eos_ids(g.value("eos_token_id", json()), generation_where, d.extra_eog);
    }
    return d;
}

std::unique_ptr<Tokenizer> Tokenizer::from_file(const std::string& path) {
    namespace fs = std::filesystem;
    const fs::path p(path);
    std::error_code ec;
    fs::path json_path;
    bool siblings = false;
    if (fs::is_directory(p, ec)) {
        json_path = p / "tokenizer.json";
        if (!fs::exists(json_path, ec))
            fail("tokenizer: folder {} has no tokenizer.json (copy the checkpoint's tokenizer.json there; quern bench "
                 "-m FOLDER measures the weights without one)",
                 path);
        siblings = true;
    } else if (p.extension() == ".json") {
        json_path = p;
        siblings = p.filename() == "tokenizer.json";
    } else {
        return from_gguf(GgufFile(path));
    }
    const fs::path dir = json_path.parent_path();
    auto optional = [&](const char* name) -> std::string {
        const fs::path q = dir / name;
        return siblings && fs::exists(q, ec) ? read_text(q) : std::string();
    };
    return std::make_unique<Tokenizer>(vocab_from_hf_json(read_text(json_path), optional("tokenizer_config.json"),
                                                          optional("generation_config.json"), json_path.string(),
                                                          (dir / "tokenizer_config.json").string(),
                                                          (dir / "generation_config.json").string()));
}

}  // namespace quern
