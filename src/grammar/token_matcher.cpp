#include "grammar/token_matcher.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tokenizer/tokenizer.h"

namespace quern::grammar {

std::shared_ptr<const TokenPieces> TokenPieces::of(const Tokenizer& tok) {
    auto p = std::make_shared<TokenPieces>();
    p->n_vocab = tok.n_vocab();
    for (int32_t id = 0; id < p->n_vocab; ++id) {
        if (tok.is_eog(id)) {
            p->eog.push_back(id);
            continue;
        }
        std::string s = tok.token_to_piece(id, false);
        if (!s.empty()) p->sorted.emplace_back(std::move(s), id);
    }
    std::sort(p->sorted.begin(), p->sorted.end());
    p->where.assign(static_cast<size_t>(p->n_vocab), -1);
    for (size_t k = 0; k < p->sorted.size(); ++k) p->where[static_cast<size_t>(p->sorted[k].second)] = static_cast<int32_t>(k);
    return p;
}

TokenMatcher::TokenMatcher(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenPieces> pieces)
    : pieces_(std::move(pieces)), grammar_id_(g->id), state_(std::move(g)) {}

int64_t TokenMatcher::mask(float* logits) const {
    const float ninf = -std::numeric_limits<float>::infinity();
    std::string key = std::to_string(grammar_id_) + ":" + state_.key();
    std::shared_ptr<const std::vector<uint64_t>> hit;
    {
        std::lock_guard<std::mutex> lk(pieces_->cache->mu);
        const auto it = pieces_->cache->masks.find(key);
        if (it != pieces_->cache->masks.end()) hit = it->second;
    }
    const auto bit = [](const std::vector<uint64_t>& m, int64_t i) { return (m[static_cast<size_t>(i >> 6)] >> (i & 63)) & 1u; };
    if (hit) {
        int64_t n = 0;
        for (int64_t i = 0; i < pieces_->n_vocab; ++i) {
            if (bit(*hit, i)) ++n;
            else logits[i] = ninf;
        }
        return n;
    }
    auto made = std::make_shared<std::vector<uint64_t>>(static_cast<size_t>((pieces_->n_vocab + 63) / 64), 0);
    const auto allow = [&](int32_t id) { (*made)[static_cast<size_t>(id >> 6)] |= uint64_t{1} << (id & 63); };
    int64_t n = 0;
    // Depth-first over the sorted texts: states[k] is the state after the
    // first lens[k] bytes of the current text (states[0]: now).
    std::vector<GrammarState> states{state_};
    std::vector<size_t> lens{0};
    std::string_view prev;
    for (const auto& [text, id] : pieces_->sorted) {
        size_t common = 0;  // bytes shared with the previous text
        while (common < prev.size() && common < text.size() && prev[common] == text[common]) ++common;
        while (lens.back() > common) {
            states.pop_back();
            lens.pop_back();
        }
        // Advance from the deepest kept prefix over the rest, one byte at a
        // time (a dead prefix ends the walk of this text).
        bool alive = true;
        for (size_t i = lens.back(); i < text.size() && alive; ++i) {
            GrammarState next = states.back();
            if (!next.advance_bytes(std::string_view(text).substr(i, 1))) {
                alive = false;
                break;
            }
            states.push_back(std::move(next));
            lens.push_back(i + 1);
        }
        if (alive && lens.back() == text.size()) {
            allow(id);
            ++n;
        }
        prev = text;
    }
    if (state_.accepting())
        for (int32_t id : pieces_->eog) {
            allow(id);
            ++n;
        }
    for (int64_t i = 0; i < pieces_->n_vocab; ++i)
        if (!bit(*made, i)) logits[i] = ninf;
    std::lock_guard<std::mutex> lk(pieces_->cache->mu);
    if (pieces_->cache->masks.size() >= TokenPieces::kMaxCachedMasks) pieces_->cache->masks.clear();
    pieces_->cache->masks.emplace(std::move(key), std::move(made));
    return n;
}

bool TokenMatcher::accept(int32_t token) {
    if (std::find(pieces_->eog.begin(), pieces_->eog.end(), token) != pieces_->eog.end()) return state_.accepting();
    if (token < 0 || token >= pieces_->n_vocab || pieces_->where[static_cast<size_t>(token)] < 0) return false;
    return state_.advance_bytes(pieces_->sorted[static_cast<size_t>(pieces_->where[static_cast<size_t>(token)])].first);
}

}  // namespace quern::grammar
