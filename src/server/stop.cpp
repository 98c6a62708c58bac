#include "server/stop.h"

#include <algorithm>

namespace quern::server {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
    for (std::string& s : stops)
        if (!s.empty()) {
            max_len_ = std::max(max_len_, s.size());
            stops_.push_back(std::move(s));
        }
}

std::string StopMatcher::push(std::string_view text) {
    if (stopped_) return {};
    if (stops_.empty()) return std::string(text);
    pending_.append(text);
    // Every occurrence that began in text already emitted would have been
    // held back (its start was a stop-string prefix at the end of the text),
    // so searching the held-back text alone finds every match.
    size_t best = std::string::npos;
    const std::string* which = nullptr;
    for (const std::string& s : stops_) {
        const size_t at = pending_.find(s);
        if (at < best) {
            best = at;
            which = &s;
        }
    }
    if (which) {
        stopped_ = true;
        matched_ = *which;
        std::string out = pending_.substr(0, best);
        pending_.clear();
        return out;
    }
    // Hold back the longest tail that is a proper prefix of some stop string.
    size_t hold = 0;
    const size_t limit = std::min(pending_.size(), max_len_ - 1);
    for (size_t k = limit; k > 0 && hold == 0; --k) {
        const std::string_view tail(pending_.data() + pending_.size() - k, k);
        for (const std::string& s : stops_)
            if (s.size() > k && std::string_view(s).substr(0, k) == tail) {
                hold = k;
                break;
            }
    }
    std::string out = pending_.substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
    return out;
}

std::string StopMatcher::flush() {
    std::string out;
    if (!stopped_) out.swap(pending_);
    pending_.clear();
    return out;
}

}  // namespace quern::server
