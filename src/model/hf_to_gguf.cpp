#include "model/hf_to_gguf.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "formats/gguf.h"
#include "model/arch/arch.h"
#include "model/hf_model.h"
#include "model/model.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace quern {

namespace {

namespace fs = std::filesystem;

std::string read_optional(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    if (!f) return {};
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

bool same_steps(const std::vector<PreStep>& a, const std::vector<PreStep>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
        const PreStep &x = a[i], &y = b[i];
        if (x.kind != y.kind || x.pattern != y.pattern || x.behavior != y.behavior || x.invert != y.invert ||
            x.add_prefix_space != y.add_prefix_space || x.use_regex != y.use_regex)
            return false;
    }
    return true;
}

/// The tokenizer.ggml.pre name (as llama.cpp spells it) whose pipeline is
/// the tokenizer.json's; "" when none is.
std::string gguf_pre_name(const VocabData& d) {
    for (const char* name : {"gpt-2", "llama-bpe", "qwen2", "qwen35", "starcoder", "deepseek-llm", "deepseek-coder",
                             "deepseek-v3", "falcon"})
        if (same_steps(d.pre_steps, PreTokenizer::family_steps(name))) return name;
    return {};
}

/// SentencePiece scores for a BPE-with-byte-fallback vocabulary (Llama 2,
/// Mistral, Gemma as tokenizer.json stores them): GGUF's "llama" tokenizer
/// merges the adjacent pair whose result scores highest, so the piece a merge
/// of rank r makes scores −r (its earliest merge); pieces no merge makes score
/// below every merge.
std::vector<float> spm_scores(const VocabData& d) {
    std::unordered_map<std::string, size_t> id;
    for (size_t i = 0; i < d.tokens.size(); ++i) id.emplace(d.tokens[i], i);
    std::vector<float> scores(d.tokens.size(), std::nanf(""));
    const auto made = [&](const std::string& piece, size_t rank) {
        const auto it = id.find(piece);
        if (it != id.end() && std::isnan(scores[it->second])) scores[it->second] = -static_cast<float>(rank);
    };
    for (size_t r = 0; r < d.merge_pairs.size(); ++r) made(d.merge_pairs[r].first + d.merge_pairs[r].second, r);
    for (size_t r = 0; r < d.merges.size(); ++r) {
        const size_t sp = d.merges[r].find(' ');
        if (sp != std::string::npos) made(d.merges[r].substr(0, sp) + d.merges[r].substr(sp + 1), r);
    }
    const float floor = -static_cast<float>(d.merge_pairs.size() + d.merges.size()) - 1.0f;
    for (float& s : scores)
        if (std::isnan(s)) s = floor;
    return scores;
}

/// The folder's tokenizer as GGUF describes one (byte-level BPE with its
/// pre-tokenizer's name, or SentencePiece with scores), checked to encode
/// probe texts as the tokenizer.json does.
VocabData gguf_vocab(const std::string& dir, const ModelConfig& c) {
    const fs::path tj = fs::path(dir) / "tokenizer.json";
    const std::string json = read_optional(tj);
    if (json.empty())
        fail("{} has no tokenizer.json: a GGUF file carries its tokenizer, so quern quantize needs the folder's", dir);
    VocabData hf = Tokenizer::vocab_from_hf_json(json, read_optional(fs::path(dir) / "tokenizer_config.json"),
                                                 read_optional(fs::path(dir) / "generation_config.json"), tj.string());
    VocabData g;
    g.arch = c.arch;
    g.tokens = hf.tokens;
    g.types = hf.types;
    g.bos = hf.bos, g.eos = hf.eos, g.unk = hf.unk, g.pad = hf.pad;
    g.add_bos = hf.add_bos;
    g.add_eos = hf.add_eos;
    if (hf.kind == VocabKind::Bpe) {
        g.kind = VocabKind::Bpe;
        g.pre = gguf_pre_name(hf);
        if (g.pre.empty())
            fail("{}: its pre-tokenizer is none that llama.cpp names (GPT-2, Llama 3, Qwen2, Qwen3.5, StarCoder, "
                 "DeepSeek, Falcon), so a GGUF file cannot describe it",
                 tj.string());
        g.merges = hf.merges;
        for (const auto& [l, r] : hf.merge_pairs) g.merges.push_back(l + " " + r);
    } else {
        if (!hf.byte_fallback)
            fail("{}: a SentencePiece-style vocabulary without byte fallback has no GGUF form quern writes", tj.string());
        g.kind = VocabKind::Spm;
        g.pre = "default";
        g.scores = spm_scores(hf);
        g.add_space_prefix = hf.add_space_prefix;
        if (g.unk >= 0) g.types[static_cast<size_t>(g.unk)] = TokenType::Unknown;
    }
    // The GGUF form must encode text as the tokenizer.json does.
    const Tokenizer a(std::move(hf)), b{VocabData(g)};
    for (const char* probe : {"Hello world! It's 2026: 3.14159 and 1234567 tokens.",
                              "  leading spaces,\ttabs\nand\r\nnewlines  ", "Grüße, naïve café — 東京 ŝ ﬁ 😀 ١٢٣",
                              "def f(x):\n    return x**2  # comment\n"}) {
        if (a.encode(probe, false, false) != b.encode(probe, false, false))
            fail("{}: as a GGUF {} tokenizer it would encode \"{}\" differently (a normalizer or split llama.cpp "
                 "does not apply), so a GGUF file cannot carry it",
                 tj.string(), g.kind == VocabKind::Bpe ? "'" + g.pre + "'" : std::string("SentencePiece"), probe);
    }
    if (static_cast<int64_t>(g.tokens.size()) > c.n_vocab)
        fail("{} has {} tokens but the embedding only {} rows", tj.string(), g.tokens.size(), c.n_vocab);
    // Rows beyond the vocabulary (embeddings padded to a round size) get
    // unused placeholder tokens, as llama.cpp's converter writes them.
    if (g.types.empty()) g.types.assign(g.tokens.size(), TokenType::Normal);
    for (int64_t i = static_cast<int64_t>(g.tokens.size()); i < c.n_vocab; ++i) {
        g.tokens.push_back(fmt::format("[PAD{}]", i));
        g.types.push_back(TokenType::Unused);
        if (!g.scores.empty()) g.scores.push_back(g.scores.back());
    }
    return g;
}

void write_vocab(const VocabData& v, const std::map<std::string, std::string>& templates, GgufWriter& w) {
    const bool spm = v.kind == VocabKind::Spm;
    w.set_string("tokenizer.ggml.model", spm ? "llama" : "gpt2");
    w.set_string("tokenizer.ggml.pre", v.pre);
    w.set_string_array("tokenizer.ggml.tokens", v.tokens);
    if (spm) w.set_f32_array("tokenizer.ggml.scores", v.scores);
    std::vector<int32_t> types;
    for (TokenType t : v.types) types.push_back(static_cast<int32_t>(t));
    w.set_i32_array("tokenizer.ggml.token_type", types);
    if (!spm) w.set_string_array("tokenizer.ggml.merges", v.merges);
    const auto id = [&](const char* key, int32_t v_id) {
        if (v_id >= 0) w.set_u32(key, static_cast<uint32_t>(v_id));
    };
    id("tokenizer.ggml.bos_token_id", v.bos);
    id("tokenizer.ggml.eos_token_id", v.eos);
    id("tokenizer.ggml.unknown_token_id", v.unk);
    id("tokenizer.ggml.padding_token_id", v.pad);
    w.set_bool("tokenizer.ggml.add_bos_token", v.add_bos);
    w.set_bool("tokenizer.ggml.add_eos_token", v.add_eos);
    if (spm) w.set_bool("tokenizer.ggml.add_space_prefix", v.add_space_prefix);
    for (const auto& [name, text] : templates)
        w.set_string(name.empty() ? "tokenizer.chat_template" : "tokenizer.chat_template." + name, text);
}

/// GGUF row r of a q or k matrix of `heads` heads of head_dim rows: within a
/// head, GGUF pairs rows (2i, 2i+1) where the checkpoint has (i, i + d/2).
int64_t permuted_row(int64_t r, int64_t head_dim) {
    const int64_t h = r / head_dim, k = r % head_dim, half = head_dim / 2;
    return h * head_dim + (k % 2) * half + k / 2;
}

}  // namespace

QuantizeSource hf_quantize_source(const std::string& folder) {
    const HfFolder hf = resolve_hf_folder(folder);
    std::shared_ptr<const Model> model = load_hf_model(hf.weights);
    const ModelConfig& c = model->config();
    const ArchDef* def = find_arch(c.arch);
    if (!def) fail("no GGUF architecture for '{}'", c.arch);
    auto vocab = std::make_shared<VocabData>(gguf_vocab(hf.dir, c));
    auto templates = hf_chat_templates(hf.dir);
    if (!c.rope_freq_factors.empty() && c.arch != "llama" && c.arch != "granite")
        fail("{}: RoPE scaling with frequency factors in a {} model has no GGUF form quern writes yet", hf.config, c.arch);
    auto rope_freqs = std::make_shared<std::vector<float>>(c.rope_freq_factors);

    QuantizeSource src;
    const WeightStore& ws = model->weights();
    TensorTable table;
    def->tensors(c, table);
    const auto rows_of = [](const Tensor* t) {
        const uint8_t* base = static_cast<const uint8_t*>(t->data);
        const size_t rs = t->row_bytes();
        return [base, rs](int64_t r) { return base + rs * static_cast<size_t>(r); };
    };
    for (const TensorEntry& e : table.entries()) {
        if (e.kind == TensorKind::Experts) {
            // One 3-D tensor {K, N, n_expert}: expert x's rows after expert x−1's.
            std::vector<const Tensor*> parts;
            for (int64_t x = 0; x < e.n_expert; ++x) {
                const std::string name = fmt::format(fmt::runtime(e.gguf_expert), x);
                const Tensor* t = ws.find(name);
                if (!t) fail("expert tensor '{}' is missing from the loaded checkpoint", name);
                parts.push_back(t);
            }
            const Tensor& p0 = *parts[0];
            const int64_t n_rows = p0.ne[1];
            src.tensors.push_back({e.gguf, p0.type, {p0.ne[0], p0.ne[1], e.n_expert, 1}, 3,
                                   [parts, n_rows](int64_t r) {
                                       const Tensor* t = parts[static_cast<size_t>(r / n_rows)];
                                       return static_cast<const uint8_t*>(t->data) + t->row_bytes() * static_cast<size_t>(r % n_rows);
                                   },
                                   nullptr});
            continue;
        }
        const Tensor* t = ws.find(e.gguf);
        if (!t) continue;  // optional and absent (a tied output, rope_freqs)
        const int n_dims = t->ne[2] > 1 ? 3 : t->ne[1] > 1 ? 2 : 1;
        const bool q = e.gguf.ends_with(".attn_q.weight"), k = e.gguf.ends_with(".attn_k.weight");
        if (def->gguf_permutes_qk && (q || k)) {
            const auto base = rows_of(t);
            const int64_t hd = c.head_dim;
            src.tensors.push_back({e.gguf, t->type, t->ne, n_dims,
                                   [base, hd](int64_t r) { return base(permuted_row(r, hd)); }, nullptr});
            continue;
        }
        src.tensors.push_back({e.gguf, t->type, t->ne, n_dims, rows_of(t), static_cast<const uint8_t*>(t->data)});
    }
    if (!rope_freqs->empty()) {
        const auto* data = reinterpret_cast<const uint8_t*>(rope_freqs->data());
        src.tensors.push_back({"rope_freqs.weight", DType::F32, {static_cast<int64_t>(rope_freqs->size()), 1, 1, 1}, 1,
                               [data](int64_t) { return data; }, data});
    }

    MixModel& m = src.mix;
    m.arch = c.arch;
    m.n_layer = c.n_layer;
    m.n_expert = c.n_expert;
    m.n_gqa = c.n_head / c.n_head_kv;
    m.tied_embeddings = !ws.find("output.weight");
    for (const auto& t : src.tensors) m.n_attention_v += MixPlanner::attention_v(t.name);
    m.is_70b = c.arch == "llama" && c.n_layer == 80;

    src.write_metadata = [model, vocab, templates](GgufWriter& w) {
        model->config().write_gguf(w);
        write_vocab(*vocab, templates, w);
    };
    src.owner = std::make_shared<std::pair<std::shared_ptr<const Model>, std::shared_ptr<std::vector<float>>>>(model, rope_freqs);
    return src;
}

}  // namespace quern
