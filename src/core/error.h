// quern::Error — the one exception type the engine throws for bad input and
// failed operations. Messages say what failed, where (file, key, tensor, byte
// offset) and, where there is one, what to do next.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>
#include <string_view>

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

/// A name read from a file, made safe to quote in an error message: control
/// bytes, DEL, backslashes and single quotes written as \xHH; after `max`
/// bytes the rest is replaced by "...(N bytes)" with the full length.
inline std::string printable(std::string_view s, size_t max = 96) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (i == max) {
            out += fmt::format("...({} bytes)", s.size());
            break;
        }
        const auto c = static_cast<unsigned char>(s[i]);
        if (c < 0x20 || c == 0x7f || c == '\\' || c == '\'')
            out += fmt::format("\\x{:02x}", c);
        else
            out += static_cast<char>(c);
    }
    return out;
}

}  // namespace quern
