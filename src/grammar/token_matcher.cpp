#include "grammar/token_matcher.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "tokenizer/tokenizer.h"

namespace quern::grammar {

/// The masks a model's matchers share. Each map is cleared when full (a
/// simple bound; the entries are rebuilt on demand).
struct MaskCaches {
    static constexpr size_t kMaxStates = 1024;     ///< finished masks: n_vocab bits each
    static constexpr size_t kMaxChains = 512;      ///< chain masks: n_vocab bits plus the leaving tokens
    static constexpr size_t kMaxChainKeys = 16384;  ///< (grammar, chain frames) → chain mask
    std::mutex mu;
    std::unordered_map<std::string, std::shared_ptr<const TokenBits>> states;  ///< grammar id : state key
    std::unordered_map<std::string, std::shared_ptr<const ChainMask>> chains;  ///< chain signature
    std::unordered_map<std::string, std::shared_ptr<const ChainMask>> chain_keys;

    template <class Map, class V>
    void put(Map& m, size_t cap, std::string key, V value) {
        std::lock_guard<std::mutex> lk(mu);
        if (m.size() >= cap) m.clear();
        m.emplace(std::move(key), std::move(value));
    }
    template <class Map>
    auto get(Map& m, const std::string& key) -> typename Map::mapped_type {
        std::lock_guard<std::mutex> lk(mu);
        const auto it = m.find(key);
        return it == m.end() ? nullptr : it->second;
    }
};

namespace {

/// Chains start this many frames deep, and go deeper (when the stack is)
/// while more than kMaxLeaving tokens would leave them: deeper chains leave
/// less to check per step but are shared by fewer states.
constexpr int kChainFrames = 2;
constexpr size_t kMaxLeaving = 2048;

}  // namespace

std::shared_ptr<const TokenPieces> TokenPieces::of(const Tokenizer& tok) {
    auto p = std::make_shared<TokenPieces>();
    p->n_vocab = tok.n_vocab();
    std::vector<std::pair<std::string, int32_t>> pieces;
    for (int32_t id = 0; id < p->n_vocab; ++id) {
        if (tok.is_eog(id)) {
            p->eog.push_back(id);
            continue;
        }
        std::string s = tok.token_to_piece(id, false);
        if (!s.empty()) pieces.emplace_back(std::move(s), id);
    }
    p->tokens = SortedTokens::of(std::move(pieces), p->n_vocab);
    p->where.assign(static_cast<size_t>(p->n_vocab), -1);
    for (size_t k = 0; k < p->tokens.sorted.size(); ++k)
        p->where[static_cast<size_t>(p->tokens.sorted[k].second)] = static_cast<int32_t>(k);
    p->caches = std::make_shared<MaskCaches>();
    return p;
}

TokenMatcher::TokenMatcher(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenPieces> pieces)
    : pieces_(std::move(pieces)), grammar_id_(g->id), state_(std::move(g)) {}

TokenBits TokenMatcher::compute() const {
    const TokenPieces& p = *pieces_;
    MaskCaches& caches = *p.caches;
    if (state_.has_partial()) return walk_tokens(state_, p.tokens, false).accepted;  // mid-character: rare
    TokenBits m(static_cast<size_t>((p.n_vocab + 63) / 64), 0);
    const std::string gid = std::to_string(grammar_id_) + ":";
    for (size_t i = 0; i < state_.stack_count(); ++i) {
        const int depth = state_.depth(i);
        if (depth == 0) continue;  // the end of the text: end-of-generation below
        int k = std::min(kChainFrames, depth);
        std::shared_ptr<const ChainMask> cm;
        for (;;) {
            const GrammarState chain = state_.chain(i, k);
            const std::string ckey = gid + (k == depth ? "w" : "t") + chain.key();
            cm = caches.get(caches.chain_keys, ckey);
            if (!cm) {
                const std::string sig = (k == depth ? "w" : "t") + state_.chain_signature(i, k, p.tokens.max_len);
                cm = caches.get(caches.chains, sig);
                if (!cm) {
                    // A whole stack has no frames below: leaving it is the end.
                    cm = std::make_shared<const ChainMask>(walk_tokens(chain, p.tokens, k < depth));
                    caches.put(caches.chains, MaskCaches::kMaxChains, sig, cm);
                }
                caches.put(caches.chain_keys, MaskCaches::kMaxChainKeys, ckey, cm);
            }
            if (cm->leaving.size() <= kMaxLeaving || k == depth) break;
            k = std::min(depth, k + 1);
        }
        for (size_t w = 0; w < m.size(); ++w) m[w] |= cm->accepted[w];
        if (cm->leaving.empty()) continue;
        // Leaving tokens: their rest must fit the frames below the chain.
        const GrammarState below = state_.after_chain(i, k);
        int8_t ascii[128];  // first byte allowed below: -1 unknown
        std::fill(std::begin(ascii), std::end(ascii), int8_t{-1});
        std::unordered_map<std::string_view, bool> rest_ok;
        for (const ChainMask::Leaving& l : cm->leaving) {
            if (test_bit(m, l.id)) continue;
            const std::string_view rest =
                std::string_view(p.tokens.sorted[static_cast<size_t>(p.where[static_cast<size_t>(l.id)])].first).substr(l.at);
            const auto b = static_cast<uint8_t>(rest[0]);
            if (b < 128) {
                if (ascii[b] < 0) ascii[b] = below.allows(b, b) ? 1 : 0;
                if (!ascii[b]) continue;
            }
            auto [it, added] = rest_ok.emplace(rest, false);
            if (added) {
                GrammarState s = below;
                it->second = s.advance_bytes(rest);
            }
            if (it->second) set_bit(m, l.id);
        }
    }
    if (state_.accepting())
        for (int32_t id : p.eog) set_bit(m, id);
    return m;
}

int64_t TokenMatcher::mask(float* logits) const {
    MaskCaches& caches = *pieces_->caches;
    std::string key = std::to_string(grammar_id_) + ":" + state_.key();
    std::shared_ptr<const TokenBits> m = caches.get(caches.states, key);
    if (!m) {
        m = std::make_shared<const TokenBits>(compute());
        caches.put(caches.states, MaskCaches::kMaxStates, std::move(key), m);
    }
    // A word at a time, skipping words whose tokens are all allowed; the
    // others are blended eight floats at a time through a table of bit
    // patterns (branch-free, so the compiler vectorizes it).
    static const auto kKeep = [] {
        std::array<std::array<uint32_t, 8>, 256> t{};
        for (int b = 0; b < 256; ++b)
            for (int j = 0; j < 8; ++j) t[static_cast<size_t>(b)][static_cast<size_t>(j)] = (b >> j) & 1 ? ~0u : 0u;
        return t;
    }();
    const uint32_t ninf = std::bit_cast<uint32_t>(-std::numeric_limits<float>::infinity());
    const int64_t n_vocab = pieces_->n_vocab;
    int64_t n = 0;
    for (size_t w = 0; w < m->size(); ++w) {
        const uint64_t bits = (*m)[w];
        const int64_t base = static_cast<int64_t>(w) * 64;
        n += std::popcount(bits);
        if (bits == ~uint64_t{0}) continue;
        if (base + 64 > n_vocab) {  // the last, partial word
            for (int64_t i = base; i < n_vocab; ++i)
                if (!((bits >> (i - base)) & 1u)) logits[i] = std::bit_cast<float>(ninf);
            continue;
        }
        for (int c = 0; c < 8; ++c) {
            const auto& keep = kKeep[(bits >> (8 * c)) & 255u];
            float* p = logits + base + 8 * c;
            for (int j = 0; j < 8; ++j) {
                const uint32_t v = std::bit_cast<uint32_t>(p[j]);
                p[j] = std::bit_cast<float>((v & keep[static_cast<size_t>(j)]) | (ninf & ~keep[static_cast<size_t>(j)]));
            }
        }
    }
    return n;
}

bool TokenMatcher::accept(int32_t token) {
    if (std::find(pieces_->eog.begin(), pieces_->eog.end(), token) != pieces_->eog.end()) return state_.accepting();
    if (token < 0 || token >= pieces_->n_vocab || pieces_->where[static_cast<size_t>(token)] < 0) return false;
    return state_.advance_bytes(pieces_->tokens.sorted[static_cast<size_t>(pieces_->where[static_cast<size_t>(token)])].first);
}

}  // namespace quern::grammar
