// quern::Error — the one exception type the engine throws for bad input and
// failed operations. Messages say what failed, where (file, key, tensor, byte
// offset) and, where there is one, what to do next.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace quern {

class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// Throws quern::Error with a fmt-formatted message.
template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
    throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace quern
