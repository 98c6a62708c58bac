#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>

#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
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

void replace_all(std::string& s, std::string_view from, std::string_view to) {
    std::string out;
    out.reserve(s.size() + s.size() / 2);
    size_t last = 0;
    for (size_t p; (p = s.find(from, last)) != std::string::npos; last = p + from.size()) {
        out.append(s, last, p - last);
        out.append(to);
    }
    out.append(s, last);
    s.swap(out);
}

}  // namespace

// ---------------------------------------------------------------- construction

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
    return d;
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& f) {
    return std::make_unique<Tokenizer>(vocab_from_gguf(f));
}

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
    for (int32_t id : specials_) specials_by_byte_[static_cast<uint8_t>(d_.tokens[id][0])].push_back(id);

    // End-of-generation tokens.
    for (int32_t id : {d_.eos, d_.eot, d_.eom})
        if (id >= 0) eog_.push_back(id);
    for (std::string_view s : kEogTexts) {
        auto it = text_to_id_.find(s);
        if (it == text_to_id_.end()) continue;
        const TokenType t = d_.types[it->second];
        if (t == TokenType::Control || t == TokenType::UserDefined) eog_.push_back(it->second);
    }
    std::sort(eog_.begin(), eog_.end());
    eog_.erase(std::unique(eog_.begin(), eog_.end()), eog_.end());

    if (d_.kind == VocabKind::Bpe) {
        pre_ = std::make_unique<PreTokenizer>(d_.pre);
        const bool ignore_merges = pre_->family() == "llama3";
        bpe_ = std::make_unique<BpeModel>(
            // Merges and byte characters resolve to ordinary tokens only: some
            // vocabularies re-add byte characters as USER_DEFINED tokens whose
            // text is plain text (DeepSeek-Coder's "ÿ"), matched before BPE.
            [this](std::string_view s) -> int32_t {
                auto it = text_to_id_.find(s);
                if (it == text_to_id_.end()) return -1;
                const TokenType t = d_.types[it->second];
                return t == TokenType::Normal || t == TokenType::Undefined ? it->second : -1;
            },
            // Only a real <unk> stands in for a missing byte: several GGUFs name
            // <|endoftext|> as the unknown token, which would end generation.
            d_.merges, d_.unk >= 0 && d_.types[d_.unk] == TokenType::Unknown ? d_.unk : -1, ignore_merges);
    } else {
        std::array<int32_t, 256> byte_ids;
        byte_ids.fill(-1);
        for (size_t i = 0; i < n; ++i) {
            if (d_.types[i] != TokenType::Byte) continue;
            const int b = parse_byte_token(d_.tokens[i]);
            if (b >= 0 && byte_ids[b] < 0) byte_ids[b] = static_cast<int32_t>(i);
        }
        spm_ = std::make_unique<SpmModel>(
            [this](std::string_view s) -> int32_t {
                auto it = text_to_id_.find(s);
                return it == text_to_id_.end() || !is_text_type(d_.types[it->second]) ? -1 : it->second;
            },
            d_.scores, byte_ids, d_.unk);
    }
}

Tokenizer::~Tokenizer() = default;

// ---------------------------------------------------------------- encoding

std::vector<Tokenizer::Fragment> Tokenizer::split_special(std::string_view text, bool parse_special) const {
    std::vector<Fragment> frags;
    size_t start = 0, i = 0;
    while (i < text.size()) {
        int32_t found = -1;
        for (int32_t id : specials_by_byte_[static_cast<uint8_t>(text[i])]) {
            if (!parse_special && d_.types[id] != TokenType::UserDefined) continue;
            const std::string& s = d_.tokens[id];
            if (text.size() - i >= s.size() && text.compare(i, s.size(), s) == 0) {
                found = id;
                break;  // longest first
            }
        }
        if (found < 0) {
            ++i;
            continue;
        }
        if (i > start) frags.push_back({text.substr(start, i - start), -1});
        frags.push_back({{}, found});
        i += d_.tokens[found].size();
        start = i;
    }
    if (start < text.size()) frags.push_back({text.substr(start), -1});
    return frags;
}

void Tokenizer::encode_text(std::string_view text, bool prefix_space, std::vector<int32_t>& out) const {
    if (d_.kind == VocabKind::Bpe) {
        if (prefix_space && d_.add_space_prefix) {
            std::string t = " ";
            t.append(text);
            for (const auto& w : pre_->split(t)) bpe_->encode_word(w, out);
        } else {
            for (const auto& w : pre_->split(text)) bpe_->encode_word(w, out);
        }
        return;
    }
    std::string t;
    t.reserve(text.size() + 8);
    if (prefix_space && d_.add_space_prefix) t += ' ';
    t.append(text);
    replace_all(t, " ", kSpmSpace);
    spm_->encode(t, out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    if (add_special && d_.add_bos && d_.bos >= 0) out.push_back(d_.bos);
    // SPM adds the dummy prefix at the start and after each special token;
    // BPE (when add_space_prefix is set at all) only at the start.
    bool prefix = true;
    for (const Fragment& f : split_special(text, parse_special)) {
        if (f.id >= 0) {
            out.push_back(f.id);
            prefix = d_.kind == VocabKind::Spm;
        } else {
            encode_text(f.text, prefix, out);
            prefix = false;
        }
    }
    if (add_special && d_.add_eos && d_.eos >= 0) out.push_back(d_.eos);
    return out;
}

// ---------------------------------------------------------------- decoding

std::string Tokenizer::token_to_piece(int32_t id, bool render_special) const {
    if (id < 0 || id >= n_vocab()) return {};
    const std::string& text = d_.tokens[id];
    switch (d_.types[id]) {
        case TokenType::Control:
        case TokenType::Unknown:
            return render_special ? text : std::string();
        case TokenType::Byte: {
            const int b = parse_byte_token(text);
            if (b >= 0) return std::string(1, static_cast<char>(b));
            return text;
        }
        case TokenType::UserDefined:
            if (d_.kind == VocabKind::Bpe) return text;  // added tokens are stored as plain text
            [[fallthrough]];
        default:
            break;
    }
    if (d_.kind == VocabKind::Bpe) return unicode::ByteMap::get().decode(text);
    std::string s = text;
    replace_all(s, kSpmSpace, " ");
    return s;
}

void Tokenizer::append_piece(std::string& out, int32_t id, DecodeState& st, bool render_special) const {
    std::string piece = token_to_piece(id, render_special);
    if (st.at_start && id >= 0 && id < n_vocab()) {
        const TokenType t = d_.types[id];
        if (t != TokenType::Control && t != TokenType::Unknown) {
            st.at_start = false;
            if (d_.kind == VocabKind::Spm && d_.add_space_prefix && !piece.empty() && piece[0] == ' ')
                piece.erase(0, 1);
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

}  // namespace quern
