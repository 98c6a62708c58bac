#include "grammar/chain_mask.h"

#include <algorithm>
#include <cstdint>
#include <unordered_map>

namespace quern::grammar {

SortedTokens SortedTokens::of(std::vector<std::pair<std::string, int32_t>> pieces, int64_t n_vocab) {
    SortedTokens t;
    t.n_vocab = n_vocab;
    // Texts longer than a node's depth can count are never allowed (no
    // tokenizer has them; a hostile file might).
    std::erase_if(pieces, [](const auto& p) { return p.first.size() > UINT16_MAX; });
    std::sort(pieces.begin(), pieces.end());
    t.sorted = std::move(pieces);
    std::vector<uint32_t> path;  // the nodes of the previous text's prefixes
    std::string_view prev;
    for (size_t k = 0; k < t.sorted.size(); ++k) {
        const std::string& text = t.sorted[k].first;
        t.max_len = std::max(t.max_len, static_cast<int>(text.size()));
        size_t common = 0;
        while (common < prev.size() && common < text.size() && prev[common] == text[common]) ++common;
        for (; path.size() > common; path.pop_back()) t.end[path.back()] = static_cast<uint32_t>(t.byte.size());
        for (size_t d = common; d < text.size(); ++d) {
            path.push_back(static_cast<uint32_t>(t.byte.size()));
            t.byte.push_back(static_cast<uint8_t>(text[d]));
            t.depth.push_back(static_cast<uint16_t>(d + 1));
            t.end.push_back(0);
            t.first.push_back(static_cast<uint32_t>(k));
        }
        prev = text;
    }
    for (; !path.empty(); path.pop_back()) t.end[path.back()] = static_cast<uint32_t>(t.byte.size());
    t.first.push_back(static_cast<uint32_t>(t.sorted.size()));
    return t;
}

namespace {

/// The states a walk meets, each once, with their transitions by byte
/// (computed when first taken). Bounded: when full it starts over, keeping
/// only the states of the current path.
class StateTable {
public:
    static constexpr int kDead = -1, kUnknown = -2;
    explicit StateTable(size_t max_states) : max_states_(max_states) {}

    int add(const GrammarState& s) {
        std::string key = s.key();
        const auto it = ids_.find(key);
        if (it != ids_.end()) return it->second;
        const int id = static_cast<int>(states_.size());
        states_.push_back(s);
        ends_.push_back(s.has_empty_stack() && !s.has_partial());
        next_.resize(next_.size() + 256, kUnknown);
        ids_.emplace(std::move(key), id);
        return id;
    }
    int step(int from, uint8_t b) {
        int& to = next_[static_cast<size_t>(from) * 256 + b];
        if (to != kUnknown) return to;
        GrammarState s = states_[static_cast<size_t>(from)];
        const char c = static_cast<char>(b);
        const int r = s.advance_bytes(std::string_view(&c, 1)) ? add(s) : kDead;
        next_[static_cast<size_t>(from) * 256 + b] = r;  // `to` may have moved
        return r;
    }
    bool ends(int id) const { return ends_[static_cast<size_t>(id)]; }
    bool full() const { return states_.size() >= max_states_; }
    /// Forgets every state but `keep` (renumbered in place).
    void restart(std::vector<int>& keep) {
        std::vector<GrammarState> kept;
        for (int id : keep) kept.push_back(states_[static_cast<size_t>(id)]);
        states_.clear();
        ends_.clear();
        next_.clear();
        ids_.clear();
        for (size_t i = 0; i < keep.size(); ++i) keep[i] = add(kept[i]);
    }

private:
    size_t max_states_;
    std::vector<GrammarState> states_;
    std::vector<uint8_t> ends_;
    std::vector<int> next_;
    std::unordered_map<std::string, int> ids_;
};

}  // namespace

ChainMask walk_tokens(const GrammarState& start, const SortedTokens& tokens, bool leaving, size_t max_states) {
    ChainMask out;
    out.accepted.assign(static_cast<size_t>((tokens.n_vocab + 63) / 64), 0);
    StateTable table(std::max<size_t>(max_states, 2));
    // path[d]: the state after the current node's first d bytes; exits: the
    // depths on the path where a chain may have finished.
    std::vector<int> path{table.add(start)};
    std::vector<uint16_t> exits;
    const size_t n_nodes = tokens.byte.size();
    for (size_t n = 0; n < n_nodes;) {
        const size_t d = tokens.depth[n];
        path.resize(d);
        while (!exits.empty() && exits.back() >= d) exits.pop_back();
        if (table.full()) table.restart(path);
        const int s = table.step(path[d - 1], tokens.byte[n]);
        if (s == StateTable::kDead) {
            // Every text under this node is refused here; with an exit on
            // the way, it may go on below the chain.
            if (leaving && !exits.empty())
                for (uint32_t k = tokens.first[n]; k < tokens.first[tokens.end[n]]; ++k)
                    for (uint16_t at : exits) out.leaving.push_back({tokens.sorted[k].second, at});
            n = tokens.end[n];
            continue;
        }
        path.push_back(s);
        for (uint32_t k = tokens.first[n]; k < tokens.first[n + 1]; ++k)  // the texts that end here
            set_bit(out.accepted, tokens.sorted[k].second);
        if (leaving && table.ends(s)) exits.push_back(static_cast<uint16_t>(d));
        ++n;
    }
    return out;
}

}  // namespace quern::grammar
