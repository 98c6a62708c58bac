// Stop strings on streamed text: finds the earliest occurrence of any stop
// string in text that arrives in arbitrary pieces (a stop string may span
// tokens), and holds back text that might be the beginning of one, so that
// nothing is sent to a client and later taken back.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace quern::server {

class StopMatcher {
public:
    /// Empty strings in `stops` are ignored; no stops: text passes through.
    explicit StopMatcher(std::vector<std::string> stops = {});

    /// Adds text; returns the text that is now safe to emit. Once a stop
    /// string is found, stopped() is true and the returned text ends right
    /// before it; everything after is dropped and later pushes return "".
    std::string push(std::string_view text);
    /// The end of the text: returns what was held back (no stop follows).
    std::string flush();

    bool stopped() const { return stopped_; }
    /// The stop string that matched ("" until then).
    const std::string& matched() const { return matched_; }
    /// Bytes currently held back.
    size_t held() const { return pending_.size(); }

private:
    std::vector<std::string> stops_;
    std::string pending_;
    std::string matched_;
    size_t max_len_ = 0;
    bool stopped_ = false;
};

}  // namespace quern::server
