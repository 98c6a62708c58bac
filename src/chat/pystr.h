// Python str semantics on UTF-8 text: code-point indexing, whitespace and
// case classes, and the str methods chat templates call (strip, split,
// replace, title, ...). Invalid UTF-8 never throws: each invalid byte is one
// code point in U+DC80..U+DCFF (Python's surrogateescape) and encodes back to
// the same byte, so text passes through unchanged.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace quern::jinja::pystr {

/// Decodes `s` into code points (invalid bytes as U+DC80 + byte).
std::u32string decode(std::string_view s);
/// Encodes code points back to UTF-8 (U+DC80..U+DCFF as the raw byte).
std::string encode(std::u32string_view s);
/// Appends one code point.
void append_cp(std::string& out, uint32_t cp);
/// Decodes one code point at `pos`, advancing `pos`.
uint32_t next_cp(std::string_view s, size_t& pos);
bool is_ascii(std::string_view s);
/// Number of code points (Python's len()).
size_t length(std::string_view s);
/// Byte offset of code point `index` (<= length), for ASCII fast paths too.
size_t byte_offset(std::string_view s, size_t index);

/// Python's str.isspace() for one code point (what str.split()/strip() and
/// the regex \s treat as whitespace).
bool is_space(uint32_t cp);
/// Python's str.isprintable() for one code point (repr() escapes the others).
bool is_printable(uint32_t cp);
bool is_alpha(uint32_t cp);
bool is_digit(uint32_t cp);
bool is_decimal(uint32_t cp);
bool is_numeric(uint32_t cp);
bool is_upper(uint32_t cp);
bool is_lower(uint32_t cp);
/// Simple case mappings (one code point to one).
uint32_t to_upper(uint32_t cp);
uint32_t to_lower(uint32_t cp);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title(std::string_view s);
std::string capitalize(std::string_view s);
std::string swapcase(std::string_view s);
/// isupper/islower/istitle/isalpha/isdigit/... over a whole string, as Python.
bool str_isupper(std::string_view s);
bool str_islower(std::string_view s);
bool str_istitle(std::string_view s);
bool str_all(std::string_view s, bool (*pred)(uint32_t));

/// strip/lstrip/rstrip: `chars` nullopt strips whitespace.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
/// split/rsplit: `sep` nullopt splits on runs of whitespace. maxsplit < 0: no limit.
/// Raises ValueError "empty separator" for an empty `sep`.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
/// splitlines: \n, \r, \r\n, \v, \f, \x1c-\x1e, \x85, U+2028, U+2029.
std::vector<std::string> splitlines(std::string_view s, bool keepends);
/// replace(old, new, count): count < 0 replaces all.
std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);
/// Code-point index of the first/last occurrence within [start, end) (code
/// point indices, already clamped), or -1.
int64_t find(std::string_view s, std::string_view sub, int64_t start, int64_t end, bool reverse);
/// Non-overlapping occurrences.
int64_t count(std::string_view s, std::string_view sub);
/// center/ljust/rjust with a one-character fill.
std::string pad(std::string_view s, int64_t width, uint32_t fill, char align);
std::string zfill(std::string_view s, int64_t width);

/// HTML-escapes & < > " ' as markupsafe does (&amp; &lt; &gt; &#34; &#39;).
std::string html_escape(std::string_view s);

}  // namespace quern::jinja::pystr
