// UTF-8 helpers and the GPT-2 byte <-> unicode table used by byte-level BPE.
//
// Byte-level BPE vocabularies store every token as a string of "byte
// characters": each of the 256 byte values is mapped to one printable Unicode
// code point (printable Latin-1 bytes map to themselves, the others to
// U+0100 + n in byte order), so a token's text is always valid UTF-8 whatever
// bytes it stands for.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace quern::unicode {

/// One decoded UTF-8 sequence: the code point (or the byte value when the
/// sequence is invalid), its length in bytes (>= 1), and whether it was valid.
struct Utf8Char {
    uint32_t cp = 0;
    uint32_t len = 1;
    bool valid = false;
};

/// Decodes the sequence starting at `pos` (< s.size()) strictly: overlong
/// forms, surrogates, code points above U+10FFFF and truncated sequences are
/// invalid, and an invalid sequence consumes exactly one byte.
Utf8Char utf8_decode(std::string_view s, size_t pos);

/// Appends the UTF-8 encoding of `cp` (must be <= U+10FFFF) to `out`.
void utf8_append(std::string& out, uint32_t cp);

/// Expected length of a sequence from its lead byte: 1..4, or 0 for a
/// continuation byte or a byte that never starts a valid sequence.
int utf8_lead_len(uint8_t b);

/// True when all of `s` is valid UTF-8.
bool utf8_valid(std::string_view s);

/// Number of trailing bytes of `s` that form a valid but incomplete UTF-8
/// sequence (0..3): the bytes a streaming writer must hold back.
size_t utf8_incomplete_tail(std::string_view s);

/// The Unicode White_Space property (what Rust's char::is_whitespace and
/// hence Hugging Face's lstrip/rstrip/Strip treat as whitespace).
bool is_white_space(uint32_t cp);

/// The GPT-2 byte <-> unicode mapping.
class ByteMap {
public:
    static const ByteMap& get();

    /// The code point that byte `b` maps to.
    uint32_t byte_to_cp(uint8_t b) const { return byte_to_cp_[b]; }
    /// UTF-8 text of the code point that byte `b` maps to.
    std::string_view byte_to_utf8(uint8_t b) const { return {utf8_[b].data(), utf8_len_[b]}; }
    /// The byte a code point stands for, or -1 when it is not in the table.
    int cp_to_byte(uint32_t cp) const { return cp < cp_to_byte_.size() ? cp_to_byte_[cp] : -1; }

    /// Maps raw bytes to their byte-character text.
    std::string encode(std::string_view bytes) const;
    /// Maps byte-character text back to bytes; code points outside the table
    /// are copied through as their UTF-8 (added tokens stored as plain text).
    std::string decode(std::string_view text) const;

private:
    ByteMap();
    std::array<uint32_t, 256> byte_to_cp_{};
    std::array<std::array<char, 4>, 256> utf8_{};
    std::array<uint8_t, 256> utf8_len_{};
    std::array<int16_t, 512> cp_to_byte_{};
};

}  // namespace quern::unicode
