#include "tokenizer/detokenizer.h"

#include "tokenizer/unicode.h"

namespace quern {

std::string Detokenizer::push(int32_t id) {
    tok_->append_piece(held_, id, state_, render_special_);
    const size_t keep = unicode::utf8_incomplete_tail(held_);
    std::string out;
    if (keep == 0) {
        out.swap(held_);
    } else {
        out.assign(held_, 0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
    }
    return out;
}

std::string Detokenizer::push(const std::vector<int32_t>& ids) {
    for (int32_t id : ids) tok_->append_piece(held_, id, state_, render_special_);
    const size_t keep = unicode::utf8_incomplete_tail(held_);
    std::string out(held_, 0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
}

std::string Detokenizer::flush() {
    std::string out;
    out.swap(held_);
    state_ = DecodeState{};
    state_.at_start = starts_text_;
    return out;
}

}  // namespace quern
