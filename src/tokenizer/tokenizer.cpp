#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/bpe.h"
#include "tokenizer/piece_map.h"
#include "tokenizer/spm.h"
#include "tokenizer/unicode.h"

namespace quern {

namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 "▁"

// Control-token texts that end a generation when present in a vocabulary.
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "<|EOT|>", "<|eot|>",
    "<|end_of_text|>", "<｜end▁of▁sentence｜>", "<|END_OF_TURN_TOKEN|>", "<|return|>", "<|call|>",
};

bool is_text_type(TokenType t) {
    return t == TokenType::Normal || t == TokenType::Undefined || t == TokenType::UserDefined;
}

// "<0xNN>" -> NN, or -1.
int parse_byte_token(std::string_view s) {
    if (s.size() != 6 || s.substr(0, 3) != "<0x" || s[5] != '>') return -1;
    auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        return -1;
    };
    const int hi = hex(s[3]), lo = hex(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
    std::string out;
    out.reserve(s.size());
    size_t last = 0;
    for (size_t p; (p = s.find(from, last)) != std::string_view::npos; last = p + from.size()) {
        out.append(s.substr(last, p - last));
        out.append(to);
    }
    out.append(s.substr(last));
    return out;
}

// The white space character ending just before `end`, or 0 bytes.
size_t white_space_before(std::string_view s, size_t begin, size_t end) {
    if (end <= begin) return 0;
    size_t p = end - 1;
    while (p > begin && (static_cast<uint8_t>(s[p]) & 0xC0) == 0x80 && end - p < 4) --p;
    const auto c = unicode::utf8_decode(s, p);
    return c.valid && p + c.len == end && unicode::is_white_space(c.cp) ? end - p : 0;
}

size_t white_space_at(std::string_view s, size_t pos) {
    if (pos >= s.size()) return 0;
    const auto c = unicode::utf8_decode(s, pos);
    return c.valid && unicode::is_white_space(c.cp) ? c.len : 0;
}

// A character that makes a single_word added token part of a word.
bool is_word_char(std::string_view s, size_t pos, bool before) {
    if (before) {
        if (pos == 0) return false;
        size_t p = pos - 1;
        while (p > 0 && (static_cast<uint8_t>(s[p]) & 0xC0) == 0x80 && pos - p < 4) --p;
        pos = p;
    } else if (pos >= s.size()) {
        return false;
    }
    const auto c = unicode::utf8_decode(s, pos);
    if (!c.valid) return false;
    if (c.cp < 0x80) return std::isalnum(static_cast<int>(c.cp)) || c.cp == '_';
    return !unicode::is_white_space(c.cp);
}

}  // namespace

/// Per-call working memory of encode().
struct Tokenizer::Scratch {
    std::vector<Fragment> frags;
    std::string norm;
    PreTokenized pre;
    BpeScratch bpe;
    SpmScratch spm;
    std::string prefixed;
};

// ---------------------------------------------------------------- GGUF

VocabData Tokenizer::vocab_from_gguf(const GgufFile& f) {
    VocabData d;
    const std::string model = f.get_string("tokenizer.ggml.model");
    if (model == "gpt2") {
        d.kind = VocabKind::Bpe;
    } else if (model == "llama") {
        d.kind = VocabKind::Spm;
    } else {
        fail("tokenizer: unsupported tokenizer model '{}' (key tokenizer.ggml.model in {}); supported: "
             "gpt2 (byte-level BPE), llama (SentencePiece)",
             model, f.path());
    }
    d.pre = f.get_string("tokenizer.ggml.pre", "default");
    d.tokens = f.get_string_array("tokenizer.ggml.tokens");
    if (f.find("tokenizer.ggml.scores")) d.scores = f.get_float_array("tokenizer.ggml.scores");
    if (f.find("tokenizer.ggml.token_type")) {
        for (int64_t t : f.get_int_array("tokenizer.ggml.token_type"))
            d.types.push_back(t >= 0 && t <= 6 ? static_cast<TokenType>(t) : TokenType::Undefined);
    }
    if (d.kind == VocabKind::Bpe) {
        if (!f.find("tokenizer.ggml.merges"))
            fail("tokenizer: {} has a gpt2 tokenizer without tokenizer.ggml.merges", f.path());
        d.merges = f.get_string_array("tokenizer.ggml.merges");
    }
    const auto n = static_cast<int64_t>(d.tokens.size());
    auto id = [&](std::string_view key) -> int32_t {
        const int64_t v = f.get_int(key, -1);
        return v >= 0 && v < n ? static_cast<int32_t>(v) : -1;
    };
    d.bos = id("tokenizer.ggml.bos_token_id");
    d.eos = id("tokenizer.ggml.eos_token_id");
    d.unk = id("tokenizer.ggml.unknown_token_id");
    d.pad = id("tokenizer.ggml.padding_token_id");
    d.eot = id("tokenizer.ggml.eot_token_id");
    d.eom = id("tokenizer.ggml.eom_token_id");
    const bool spm = d.kind == VocabKind::Spm;
    d.add_bos = f.get_bool("tokenizer.ggml.add_bos_token", spm);
    d.add_eos = f.get_bool("tokenizer.ggml.add_eos_token", false);
    d.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix", spm);

    // GGUF does not keep the added tokens' lstrip/rstrip flags. Phi-3's
    // tokenizer strips the whitespace after its chat tokens and </s> (but not
    // after <unk>, <s>, <|endoftext|>), so "<|user|>\nHi" is [<|user|>, ▁Hi].
    const std::string arch = f.get_string("general.architecture", "");
    d.arch = arch;
    if (spm && (arch == "phi3" || arch == "phi-3") && d.types.size() == d.tokens.size()) {
        for (size_t i = 0; i < d.tokens.size(); ++i) {
            const std::string& t = d.tokens[i];
            const bool chat = d.types[i] == TokenType::Control && t.size() > 4 && t.rfind("<|", 0) == 0 &&
                              t.compare(t.size() - 2, 2, "|>") == 0 && t != "<|endoftext|>";
            if (chat || t == "</s>") d.added_flags[static_cast<int32_t>(i)].rstrip = true;
        }
    }
    return d;
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& f) {
    return std::make_unique<Tokenizer>(vocab_from_gguf(f));
}

// ---------------------------------------------------------------- construction

Tokenizer::Tokenizer(VocabData data) : d_(std::move(data)) {
    const size_t n = d_.tokens.size();
    if (n == 0) fail("tokenizer: the vocabulary is empty");
    if (n > static_cast<size_t>(INT32_MAX)) fail("tokenizer: the vocabulary has too many tokens ({})", n);
    if (!d_.scores.empty() && d_.scores.size() != n)
        fail("tokenizer: {} scores for {} tokens (tokenizer.ggml.scores)", d_.scores.size(), n);
    if (d_.types.empty()) d_.types.assign(n, TokenType::Normal);
    if (d_.types.size() != n)
        fail("tokenizer: {} token types for {} tokens (tokenizer.ggml.token_type)", d_.types.size(), n);
    for (int32_t* id : {&d_.bos, &d_.eos, &d_.unk, &d_.pad, &d_.eot, &d_.eom})
        if (*id < 0 || static_cast<size_t>(*id) >= n) *id = -1;

    text_to_id_.reserve(n);
    for (size_t i = 0; i < n; ++i) text_to_id_.try_emplace(d_.tokens[i], static_cast<int32_t>(i));

    // Special tokens, longest first, indexed by first byte.
    for (size_t i = 0; i < n; ++i) {
        const TokenType t = d_.types[i];
        if ((t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown) &&
            !d_.tokens[i].empty())
            specials_.push_back(static_cast<int32_t>(i));
    }
    std::stable_sort(specials_.begin(), specials_.end(),
                     [&](int32_t a, int32_t b) { return d_.tokens[a].size() > d_.tokens[b].size(); });
    specials_by_byte_.resize(256);
    special_pair_.assign(256 * 256, 0);
    for (int32_t id : specials_) {
        const std::string& t = d_.tokens[id];
        const auto b0 = static_cast<uint8_t>(t[0]);
        specials_by_byte_[b0].push_back(id);
        if (t.size() == 1)
            special_single_[b0] = 1;
        else
            special_pair_[b0 * 256u + static_cast<uint8_t>(t[1])] = 1;
    }

    // End-of-generation tokens.
    for (int32_t id : {d_.eos, d_.eot, d_.eom})
        if (id >= 0) eog_.push_back(id);
    for (int32_t id : d_.extra_eog)
        if (id >= 0 && static_cast<size_t>(id) < n) eog_.push_back(id);
    for (std::string_view s : kEogTexts) {
        auto it = text_to_id_.find(s);
        if (it == text_to_id_.end()) continue;
        const TokenType t = d_.types[it->second];
        if (t == TokenType::Control || t == TokenType::UserDefined) eog_.push_back(it->second);
    }
    std::sort(eog_.begin(), eog_.end());
    eog_.erase(std::unique(eog_.begin(), eog_.end()), eog_.end());

    // What each token decodes to.
    const auto& bm = unicode::ByteMap::get();
    pieces_.resize(n);
    for (size_t i = 0; i < n; ++i) {
        const std::string& text = d_.tokens[i];
        switch (d_.types[i]) {
            case TokenType::Control:
            case TokenType::Unknown:
                pieces_[i] = text;
                continue;
            case TokenType::Byte:
                if (const int b = parse_byte_token(text); b >= 0) {
                    pieces_[i] = std::string(1, static_cast<char>(b));
                    continue;
                }
                break;
            case TokenType::UserDefined:
                if (d_.kind == VocabKind::Bpe) {  // added tokens are stored as plain text
                    pieces_[i] = text;
                    continue;
                }
                break;
            default:
                break;
        }
        pieces_[i] = d_.kind == VocabKind::Bpe ? bm.decode(text) : replace_all(text, kSpmSpace, " ");
    }

    build_models();
}

void Tokenizer::build_models() {
    const size_t n = d_.tokens.size();
    const auto& bm = unicode::ByteMap::get();
    std::array<int32_t, 256> byte_ids;
    byte_ids.fill(-1);
    for (size_t i = 0; i < n; ++i) {
        if (d_.types[i] != TokenType::Byte) continue;
        const int b = parse_byte_token(d_.tokens[i]);
        if (b >= 0 && byte_ids[b] < 0) byte_ids[b] = static_cast<int32_t>(i);
    }
    // Merges as (left, right) text pairs.
    std::vector<std::pair<std::string, std::string>> merges = d_.merge_pairs;
    if (merges.empty()) {
        merges.reserve(d_.merges.size());
        for (const std::string& m : d_.merges) {
            const size_t sp = m.find(' ', 1);
            if (sp == std::string::npos) continue;
            merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
        }
    }

    if (d_.kind == VocabKind::Bpe) {
        if (d_.explicit_pipeline) {
            pre_ = std::make_unique<PreTokenizer>(d_.pre_steps, "custom");
            normalizer_ = Normalizer(d_.normalizer);
        } else {
            pre_ = std::make_unique<PreTokenizer>(d_.pre);
            normalizer_ = Normalizer(gguf_bpe_normalizer(pre_->family(), d_.arch));
        }
        // Merging works on raw bytes. Merges and byte characters resolve to
        // ordinary tokens only: some vocabularies re-add byte characters as
        // USER_DEFINED tokens whose text is plain text (DeepSeek-Coder's "ÿ"),
        // matched before BPE.
        PieceMap vocab;
        for (size_t i = 0; i < n; ++i) {
            const TokenType t = d_.types[i];
            if (t == TokenType::Normal || t == TokenType::Undefined)
                vocab.insert(bm.decode(d_.tokens[i]), static_cast<int32_t>(i));
        }
        for (auto& [l, r] : merges) {
            l = bm.decode(l);
            r = bm.decode(r);
        }
        BpeOptions o;
        o.byte_level = true;
        o.ignore_merges = d_.explicit_pipeline ? d_.ignore_merges : pre_->family() == "llama3";
        o.fuse_unk = d_.fuse_unk;
        // Only a real <unk> stands in for a missing byte: several GGUFs name
        // <|endoftext|> as the unknown token, which would end generation.
        o.unk = d_.unk >= 0 && (d_.explicit_pipeline || d_.types[d_.unk] == TokenType::Unknown) ? d_.unk : -1;
        bpe_ = std::make_unique<BpeModel>(std::move(vocab), merges, byte_ids, o);
        return;
    }

    // SentencePiece-like: "▁" text from the normalizer (GGUF: dummy prefix
    // per run of text, spaces to "▁"), or a tokenizer.json pipeline.
    if (d_.explicit_pipeline) {
        normalizer_ = Normalizer(d_.normalizer);
        if (!d_.pre_steps.empty()) pre_ = std::make_unique<PreTokenizer>(d_.pre_steps, "custom");
    } else {
        std::vector<NormStep> steps;
        if (d_.add_space_prefix) steps.push_back(NormStep::prepend(std::string(kSpmSpace)));
        steps.push_back(NormStep::replace(" ", std::string(kSpmSpace)));
        normalizer_ = Normalizer(std::move(steps));
    }
    PieceMap pieces;
    for (size_t i = 0; i < n; ++i)
        if (is_text_type(d_.types[i]) && !d_.tokens[i].empty()) pieces.insert(d_.tokens[i], static_cast<int32_t>(i));

    // Cutting the text before each "▁" that follows another character gives
    // the same result as merging it whole when no piece spans such a place
    // (no piece has "▁" after a character other than "▁"); it lets short
    // words be cached.
    bool safe = pieces.find(kSpmSpace) >= 0 && !(d_.kind == VocabKind::SpmBpe && d_.ignore_merges);
    pieces.for_each([&](std::string_view t, int32_t) {
        for (size_t k = t.find(kSpmSpace, 1); safe && k != std::string_view::npos; k = t.find(kSpmSpace, k + 1))
            if (k < 3 || t.substr(k - 3, 3) != kSpmSpace) safe = false;
    });
    split_at_marker_ = safe;

    if (d_.kind == VocabKind::Spm) {
        spm_ = std::make_unique<SpmModel>(std::move(pieces), d_.scores, byte_ids, d_.unk);
    } else {
        BpeOptions o;
        o.byte_level = false;
        o.ignore_merges = d_.ignore_merges;
        o.byte_fallback = d_.explicit_pipeline ? d_.byte_fallback : true;
        o.fuse_unk = d_.fuse_unk;
        o.unk = d_.unk;
        bpe_ = std::make_unique<BpeModel>(std::move(pieces), merges, byte_ids, o);
    }
}

Tokenizer::~Tokenizer() = default;

// ---------------------------------------------------------------- encoding

void Tokenizer::split_special(std::string_view text, bool parse_special, const PlainRanges* plain,
                              std::vector<Fragment>& frags) const {
    frags.clear();
    size_t start = 0, i = 0;
    size_t r = 0;  // the first plain range that ends after i
    const auto in_plain = [&](size_t b, size_t e) {
        if (!plain) return false;
        while (r < plain->size() && (*plain)[r].second <= b) ++r;
        return r < plain->size() && (*plain)[r].first < e;
    };
    while (i < text.size()) {
        if (!may_start_special(text, i)) {
            ++i;
            continue;
        }
        const auto b0 = static_cast<uint8_t>(text[i]);
        int32_t found = -1;
        const AddedTokenFlags* flags = nullptr;
        for (int32_t id : specials_by_byte_[b0]) {
            if (!parse_special && d_.types[id] != TokenType::UserDefined) continue;
            const std::string& s = d_.tokens[id];
            if (text.size() - i < s.size() || text.compare(i, s.size(), s) != 0) continue;
            if (d_.types[id] != TokenType::UserDefined && in_plain(i, i + s.size())) continue;
            auto fl = d_.added_flags.find(id);
            flags = fl == d_.added_flags.end() ? nullptr : &fl->second;
            if (flags && flags->single_word &&
                (is_word_char(text, i, true) || is_word_char(text, i + s.size(), false)))
                continue;
            found = id;
            break;  // longest first
        }
        if (found < 0) {
            ++i;
            continue;
        }
        size_t b = i, e = i + d_.tokens[found].size();
        if (flags && flags->lstrip)
            for (size_t w; (w = white_space_before(text, start, b)) > 0;) b -= w;
        if (flags && flags->rstrip)
            for (size_t w; (w = white_space_at(text, e)) > 0;) e += w;
        if (b > start) frags.push_back({text.substr(start, b - start), -1, start});
        frags.push_back({{}, found, b});
        i = start = e;
    }
    if (start < text.size()) frags.push_back({text.substr(start), -1, start});
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out, Scratch& sc) const {
    auto run = [&](std::string_view w) {
        if (bpe_)
            bpe_->encode_word(w, out, sc.bpe);
        else
            spm_->encode(w, out, sc.spm);
    };
    if (!split_at_marker_) {
        run(piece);
        return;
    }
    size_t start = 0;
    for (size_t k = piece.find(kSpmSpace, 1); k != std::string_view::npos; k = piece.find(kSpmSpace, k + 1)) {
        if (k >= 3 && piece.substr(k - 3, 3) == kSpmSpace) continue;  // inside a run of "▁"
        run(piece.substr(start, k - start));
        start = k;
    }
    run(piece.substr(start));
}

void Tokenizer::encode_text(std::string_view text, bool at_input_start, std::vector<int32_t>& out,
                            Scratch& sc) const {
    std::string_view s = normalizer_.apply(text, sc.norm);
    if (d_.kind == VocabKind::Bpe && !d_.explicit_pipeline && d_.add_space_prefix && at_input_start) {
        sc.prefixed.assign(1, ' ');
        sc.prefixed.append(s);
        s = sc.prefixed;
    }
    if (!pre_) {
        encode_piece(s, out, sc);
        return;
    }
    pre_->split(s, at_input_start, sc.pre);
    for (size_t i = 0; i < sc.pre.size(); ++i) encode_piece(sc.pre[i], out, sc);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special,
                                       const PlainRanges* plain) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    if (add_special && d_.add_bos && d_.bos >= 0) out.push_back(d_.bos);
    Scratch sc;
    split_special(text, parse_special, plain, sc.frags);
    for (const Fragment& f : sc.frags) {
        if (f.id >= 0)
            out.push_back(f.id);
        else
            encode_text(f.text, f.offset == 0, out, sc);
    }
    if (add_special && d_.add_eos && d_.eos >= 0) out.push_back(d_.eos);
    return out;
}

bool Tokenizer::may_start_special(std::string_view text, size_t i) const {
    // Most positions cannot start any special token: two table lookups.
    const auto b0 = static_cast<uint8_t>(text[i]);
    return special_single_[b0] ||
           (i + 1 < text.size() && special_pair_[b0 * 256u + static_cast<uint8_t>(text[i + 1])]);
}

Tokenizer::PlainRanges Tokenizer::control_spans(std::string_view text) const {
    PlainRanges out;
    for (size_t i = 0; i < text.size();) {
        size_t len = 0;
        if (may_start_special(text, i))
            for (int32_t id : specials_by_byte_[static_cast<uint8_t>(text[i])]) {  // longest first
                const std::string& s = d_.tokens[id];
                if (d_.types[id] == TokenType::UserDefined || text.compare(i, s.size(), s) != 0) continue;
                len = s.size();
                break;
            }
        if (len == 0) {
            ++i;
            continue;
        }
        out.emplace_back(i, i + len);
        i += len;
    }
    return out;
}

std::vector<int32_t> Tokenizer::encode_prompt(std::string_view text, bool parse_special, bool* bos_in_text,
                                              const PlainRanges* plain) const {
    std::vector<int32_t> ids = encode(text, false, parse_special, plain);
    const bool wants = d_.add_bos && d_.bos >= 0;
    const bool has = wants && !ids.empty() && ids.front() == d_.bos;
    if (bos_in_text) *bos_in_text = has;
    if (wants && !has) ids.insert(ids.begin(), d_.bos);
    return ids;
}

// ---------------------------------------------------------------- decoding

std::string Tokenizer::token_to_piece(int32_t id, bool render_special) const {
    if (id < 0 || id >= n_vocab()) return {};
    const TokenType t = d_.types[id];
    if (!render_special && (t == TokenType::Control || t == TokenType::Unknown)) return {};
    return pieces_[id];
}

void Tokenizer::append_piece(std::string& out, int32_t id, DecodeState& st, bool render_special) const {
    if (id < 0 || id >= n_vocab()) return;
    const TokenType t = d_.types[id];
    const bool control = t == TokenType::Control || t == TokenType::Unknown;
    if (control && !render_special) return;
    const std::string& piece = pieces_[id];
    if (st.at_start && !control) {
        st.at_start = false;
        if (spm_like() && d_.add_space_prefix && !piece.empty() && piece[0] == ' ') {
            out.append(piece, 1, std::string::npos);
            return;
        }
    }
    out += piece;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool render_special) const {
    std::string out;
    DecodeState st;
    for (int32_t id : ids) append_piece(out, id, st, render_special);
    return out;
}

// ---------------------------------------------------------------- lookups

std::string Tokenizer::pre_family() const { return pre_ ? pre_->family() : std::string(); }

bool Tokenizer::is_eog(int32_t id) const { return std::binary_search(eog_.begin(), eog_.end(), id); }

bool Tokenizer::is_special(int32_t id) const {
    if (id < 0 || id >= n_vocab()) return false;
    const TokenType t = d_.types[id];
    return t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view piece) const {
    auto it = text_to_id_.find(piece);
    if (it == text_to_id_.end()) return std::nullopt;
    return it->second;
}

const std::string& Tokenizer::token_text(int32_t id) const {
    return id >= 0 && id < n_vocab() ? d_.tokens[id] : empty_;
}

TokenType Tokenizer::token_type(int32_t id) const {
    return id >= 0 && id < n_vocab() ? d_.types[id] : TokenType::Undefined;
}

void Tokenizer::clear_caches() const {
    if (bpe_) bpe_->clear_cache();
    if (spm_) spm_->clear_cache();
}

}  // namespace quern
