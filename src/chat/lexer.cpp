// Jinja lexer (see lexer.h).
#include "chat/lexer.h"

#include <algorithm>
#include <cstdio>

#include "chat/pystr.h"
#include "chat/value.h"

namespace quern::jinja {

namespace {

class Lexer {
public:
    Lexer(std::string_view in, const LexOptions& o) : o_(o) {
        src_.reserve(in.size());
        for (size_t i = 0; i < in.size(); ++i) {
            if (in[i] == '\r') {
                src_.push_back('\n');
                if (i + 1 < in.size() && in[i + 1] == '\n') ++i;
            } else {
                src_.push_back(in[i]);
            }
        }
        if (!o_.keep_trailing_newline && !src_.empty() && src_.back() == '\n') src_.pop_back();
        line_starts_.push_back(0);
        for (size_t i = 0; i < src_.size(); ++i)
            if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }

    std::vector<Token> run() {
        size_t pos = 0;
        bool line_starting = true;
        const size_t n = src_.size();
        while (pos < n) {
            const size_t t = find_tag(pos);
            if (t == std::string::npos) {
                emit(Tok::Data, src_.substr(pos), pos);
                break;
            }
            const char kind = src_[t + 1];
            char sign = 0;
            if (t + 2 < n && (src_[t + 2] == '-' || src_[t + 2] == '+')) sign = src_[t + 2];
            size_t raw_end = 0;
            const bool raw = kind == '%' && match_raw_begin(t, raw_end);
            std::string text = src_.substr(pos, t - pos);
            strip_text(text, sign, kind != '{', line_starting);
            if (!text.empty()) emit(Tok::Data, std::move(text), pos);
            if (raw) {
                pos = lex_raw(raw_end, line_starting);
                continue;
            }
            size_t p = t + 2 + (sign ? 1 : 0);
            if (kind == '#') {
                pos = lex_comment(p, t, line_starting);
            } else {
                emit(kind == '{' ? Tok::VarBegin : Tok::BlockBegin, src_.substr(t, p - t), t);
                pos = lex_tag(p, kind == '%', line_starting);
            }
        }
        Token eof{Tok::Eof, "", 0, 0};
        locate(eof, src_.size());
        toks_.push_back(std::move(eof));
        return std::move(toks_);
    }

private:
    [[noreturn]] void fail(const std::string& msg, size_t at) {
        Token t{Tok::Eof, "", 0, 0};
        locate(t, at);
        throw TemplateError("TemplateSyntaxError", msg, t.line, t.col);
    }

    void locate(Token& t, size_t at) const {
        const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), at);
        const size_t line = static_cast<size_t>(it - line_starts_.begin());
        t.line = static_cast<int>(line);
        t.col = static_cast<int>(at - line_starts_[line - 1] + 1);
    }

    void emit(Tok k, std::string v, size_t at) {
        Token t{k, std::move(v), 0, 0};
        locate(t, at);
        toks_.push_back(std::move(t));
    }

    size_t find_tag(size_t pos) const {
        while (true) {
            pos = src_.find('{', pos);
            if (pos == std::string::npos || pos + 1 >= src_.size()) return std::string::npos;
            const char c = src_[pos + 1];
            if (c == '{' || c == '%' || c == '#') return pos;
            ++pos;
        }
    }

    // Length of the Python-whitespace code point at `p` (0 if none).
    size_t space_at(size_t p) const {
        if (p >= src_.size()) return 0;
        size_t q = p;
        return pystr::is_space(pystr::next_cp(src_, q)) ? q - p : 0;
    }
    size_t skip_space(size_t p) const {
        for (size_t k; (k = space_at(p)) > 0;) p += k;
        return p;
    }
    bool starts(size_t p, std::string_view s) const { return src_.compare(p, s.size(), s) == 0; }

    // {%[-+]?\s*raw\s*(-%}\s*|%})
    bool match_raw_begin(size_t t, size_t& end) const {
        size_t p = t + 2;
        if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
        p = skip_space(p);
        if (!starts(p, "raw")) return false;
        p = skip_space(p + 3);
        if (starts(p, "-%}")) {
            end = skip_space(p + 3);
            return true;
        }
        if (starts(p, "%}")) {
            end = p + 2;
            return true;
        }
        return false;
    }

    void strip_text(std::string& text, char sign, bool is_block, bool line_starting) const {
        if (sign == '-') {
            text = pystr::strip(text, std::nullopt, false, true);
        } else if (sign != '+' && o_.lstrip_blocks && is_block) {
            const size_t nl = text.rfind('\n');
            const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
            if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
                const std::string_view tail = std::string_view(text).substr(l_pos);
                bool all_space = true;
                for (size_t i = 0; i < tail.size() && all_space;) all_space = pystr::is_space(pystr::next_cp(tail, i));
                if (all_space) text.resize(l_pos);
            }
        }
    }

    size_t lex_raw(size_t p, bool& line_starting) {
        line_starting = p > 0 && src_[p - 1] == '\n';
        for (size_t q = p;; ++q) {
            q = src_.find("{%", q);
            if (q == std::string::npos) fail("Missing end of raw directive", p);
            size_t r = q + 2;
            char sign = 0;
            if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) sign = src_[r++];
            r = skip_space(r);
            if (!starts(r, "endraw")) continue;
            r = skip_space(r + 6);
            size_t end;
            if (starts(r, "+%}")) end = r + 3;
            else if (starts(r, "-%}")) end = skip_space(r + 3);
            else if (starts(r, "%}")) end = r + 2 + ((o_.trim_blocks && starts(r + 2, "\n")) ? 1 : 0);
            else continue;
            std::string text = src_.substr(p, q - p);
            strip_text(text, sign, true, line_starting);
            if (!text.empty()) emit(Tok::Data, std::move(text), p);
            line_starting = end > 0 && src_[end - 1] == '\n';
            return end;
        }
    }

    size_t lex_comment(size_t p, size_t start, bool& line_starting) {
        for (size_t q = p; q < src_.size(); ++q) {
            size_t end = 0;
            if (starts(q, "+#}")) end = q + 3;
            else if (starts(q, "-#}")) end = skip_space(q + 3);
            else if (starts(q, "#}")) end = q + 2 + ((o_.trim_blocks && starts(q + 2, "\n")) ? 1 : 0);
            else continue;
            line_starting = src_[end - 1] == '\n';
            return end;
        }
        fail("Missing end of comment tag", start);
    }

    size_t lex_tag(size_t p, bool block, bool& line_starting) {
        std::vector<char> balance;
        const size_t n = src_.size();
        while (true) {
            if (balance.empty()) {
                size_t end = 0;
                if (block) {
                    if (starts(p, "+%}")) end = p + 3;
                    else if (starts(p, "-%}")) end = skip_space(p + 3);
                    else if (starts(p, "%}")) end = p + 2 + ((o_.trim_blocks && starts(p + 2, "\n")) ? 1 : 0);
                } else {
                    if (starts(p, "-}}")) end = skip_space(p + 3);
                    else if (starts(p, "}}")) end = p + 2;
                }
                if (end) {
                    emit(block ? Tok::BlockEnd : Tok::VarEnd, "", p);
                    line_starting = src_[end - 1] == '\n';
                    return end;
                }
            }
            if (const size_t k = space_at(p)) {
                p = skip_space(p + k);
                continue;
            }
            if (p >= n) return n;  // unterminated tag: the parser reports it
            const size_t start = p;
            const char c = src_[p];
            if (c >= '0' && c <= '9') {
                p = lex_number(p);
            } else if (c == '\'' || c == '"') {
                p = lex_string(p);
            } else if (is_name_start(p)) {
                while (p < n && is_name_char(p)) p += cp_len(p);
                emit(Tok::Name, src_.substr(start, p - start), start);
            } else {
                static const char* ops2[] = {"//", "**", "==", "!=", ">=", "<="};
                std::string op;
                for (const char* o2 : ops2)
                    if (starts(p, o2)) op = o2;
                if (op.empty() && std::string_view("+-/*%~[](){}><=.:|,;").find(c) != std::string_view::npos)
                    op = std::string(1, c);
                if (op.empty()) {
                    size_t q = p;
                    const uint32_t cp = pystr::next_cp(src_, q);
                    std::string shown;
                    pystr::append_cp(shown, cp);
                    fail("unexpected char " + str_repr(shown) + " at " + std::to_string(p), p);
                }
                if (op == "{" || op == "(" || op == "[") {
                    if (balance.size() > 1000) fail("too deeply nested brackets", p);
                    balance.push_back(op == "{" ? '}' : op == "(" ? ')' : ']');
                } else if (op == "}" || op == ")" || op == "]") {
                    if (balance.empty()) fail("unexpected '" + op + "'", p);
                    const char want = balance.back();
                    balance.pop_back();
                    if (want != op[0]) fail("unexpected '" + op + "', expected '" + std::string(1, want) + "'", p);
                }
                p += op.size();
                emit(Tok::Op, std::move(op), start);
            }
        }
    }

    size_t cp_len(size_t p) const {
        size_t q = p;
        pystr::next_cp(src_, q);
        return q - p;
    }
    bool is_name_start(size_t p) const {
        const auto c = static_cast<unsigned char>(src_[p]);
        if (c < 0x80) return c == '_' || ((c | 32) >= 'a' && (c | 32) <= 'z');
        size_t q = p;
        return pystr::is_alpha(pystr::next_cp(src_, q));
    }
    bool is_name_char(size_t p) const {
        const auto c = static_cast<unsigned char>(src_[p]);
        if (c < 0x80) return c == '_' || (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z');
        size_t q = p;
        const uint32_t cp = pystr::next_cp(src_, q);
        return pystr::is_alpha(cp) || pystr::is_decimal(cp);
    }

    // (\d+_)*\d+ at p: end or npos
    size_t digits_us(size_t p) const {
        auto dig = [&](size_t q) { return q < src_.size() && src_[q] >= '0' && src_[q] <= '9'; };
        if (!dig(p)) return std::string::npos;
        while (dig(p)) ++p;
        while (p + 1 < src_.size() && src_[p] == '_' && dig(p + 1)) {
            ++p;
            while (dig(p)) ++p;
        }
        return p;
    }

    size_t lex_number(size_t p) {
        // float: (\d+_)*\d+ ( (\.(\d+_)*\d+)? e[+-]?(\d+_)*\d+ | \.(\d+_)*\d+ ), not after '.'
        const bool after_dot = p > 0 && src_[p - 1] == '.';
        if (!after_dot) {
            const size_t a = digits_us(p);
            size_t fend = std::string::npos;
            size_t q = a;
            if (q < src_.size() && src_[q] == '.') {
                const size_t f = digits_us(q + 1);
                if (f != std::string::npos) q = f, fend = f;
            }
            if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
                size_t r = q + 1;
                if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
                const size_t e = digits_us(r);
                if (e != std::string::npos) fend = e;
            }
            if (fend != std::string::npos) {
                std::string v;
                for (size_t i = p; i < fend; ++i)
                    if (src_[i] != '_') v.push_back(src_[i]);
                emit(Tok::Float, std::move(v), p);
                return fend;
            }
        }
        // integer
        size_t q = p;
        int base = 10;
        std::string digits;
        auto is_base_digit = [&](char c, int b) {
            if (b == 2) return c == '0' || c == '1';
            if (b == 8) return c >= '0' && c <= '7';
            return (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'f');
        };
        if (src_[p] == '0' && p + 1 < src_.size() && std::string_view("bBoOxX").find(src_[p + 1]) != std::string_view::npos) {
            const char b = static_cast<char>(src_[p + 1] | 32);
            const int bb = b == 'b' ? 2 : b == 'o' ? 8 : 16;
            size_t r = p + 2;
            std::string d;
            while (true) {
                size_t s = r;
                if (s < src_.size() && src_[s] == '_') ++s;
                if (s < src_.size() && is_base_digit(src_[s], bb)) {
                    d.push_back(src_[s]);
                    r = s + 1;
                } else {
                    break;
                }
            }
            if (!d.empty()) base = bb, digits = d, q = r;
        }
        if (digits.empty()) {
            if (src_[p] == '0') {
                q = p + 1;
                digits = "0";
                while (true) {
                    size_t s = q;
                    if (s < src_.size() && src_[s] == '_') ++s;
                    if (s < src_.size() && src_[s] == '0') q = s + 1;
                    else break;
                }
            } else {
                q = p;
                while (true) {
                    if (q < src_.size() && src_[q] >= '0' && src_[q] <= '9') {
                        digits.push_back(src_[q++]);
                    } else if (q + 1 < src_.size() && src_[q] == '_' && src_[q + 1] >= '0' && src_[q + 1] <= '9' &&
                               q > p) {
                        ++q;
                    } else {
                        break;
                    }
                }
            }
        }
        unsigned __int128 v = 0;
        for (char c : digits) {
            const int d = (c >= '0' && c <= '9') ? c - '0' : (c | 32) - 'a' + 10;
            v = v * static_cast<unsigned>(base) + static_cast<unsigned>(d);
            if (v > static_cast<unsigned __int128>(INT64_MAX)) fail("integer literal too large", p);
        }
        emit(Tok::Int, std::to_string(static_cast<int64_t>(v)), p);
        return q;
    }

    size_t lex_string(size_t p) {
        const char q = src_[p];
        size_t i = p + 1;
        std::string v;
        char buf[16];
        while (true) {
            if (i >= src_.size()) fail("unexpected char " + str_repr(std::string(1, q)) + " at " + std::to_string(p), p);
            const char c = src_[i];
            if (c == q) {
                ++i;
                break;
            }
            if (c != '\\') {
                v.push_back(c);
                ++i;
                continue;
            }
            if (i + 1 >= src_.size()) fail("unexpected char " + str_repr(std::string(1, q)) + " at " + std::to_string(p), p);
            const char e = src_[i + 1];
            i += 2;
            auto hex = [&](int nd) -> uint32_t {
                uint32_t cp = 0;
                for (int k = 0; k < nd; ++k) {
                    const char h = i + k < src_.size() ? src_[i + k] : 0;
                    int d = -1;
                    if (h >= '0' && h <= '9') d = h - '0';
                    else if ((h | 32) >= 'a' && (h | 32) <= 'f') d = (h | 32) - 'a' + 10;
                    if (d < 0) {
                        const char* what = nd == 2 ? "truncated \\xXX escape"
                                           : nd == 4 ? "truncated \\uXXXX escape"
                                                     : "truncated \\UXXXXXXXX escape";
                        fail(what, p);
                    }
                    cp = cp * 16 + static_cast<uint32_t>(d);
                }
                i += static_cast<size_t>(nd);
                return cp;
            };
            switch (e) {
                case '\n': break;
                case '\\': v.push_back('\\'); break;
                case '\'': v.push_back('\''); break;
                case '"': v.push_back('"'); break;
                case 'a': v.push_back('\a'); break;
                case 'b': v.push_back('\b'); break;
                case 'f': v.push_back('\f'); break;
                case 'n': v.push_back('\n'); break;
                case 'r': v.push_back('\r'); break;
                case 't': v.push_back('\t'); break;
                case 'v': v.push_back('\v'); break;
                case 'x': pystr::append_cp(v, hex(2)); break;
                case 'u': {
                    const uint32_t cp = hex(4);
                    pystr::append_cp(v, (cp >= 0xD800 && cp <= 0xDFFF) ? 0xFFFD : cp);
                    break;
                }
                case 'U': {
                    const uint32_t cp = hex(8);
                    if (cp > 0x10FFFF) fail("illegal Unicode character", p);
                    pystr::append_cp(v, (cp >= 0xD800 && cp <= 0xDFFF) ? 0xFFFD : cp);
                    break;
                }
                default:
                    if (e >= '0' && e <= '7') {
                        uint32_t cp = static_cast<uint32_t>(e - '0');
                        for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k)
                            cp = cp * 8 + static_cast<uint32_t>(src_[i++] - '0');
                        pystr::append_cp(v, cp);
                    } else if (static_cast<unsigned char>(e) >= 0x80) {
                        // jinja2 backslash-escapes non-ASCII before decoding: "\é" -> "\xe9" literally
                        size_t j = i - 1;
                        const uint32_t cp = pystr::next_cp(src_, j);
                        i = j;
                        if (cp <= 0xFF) std::snprintf(buf, sizeof buf, "\\x%02x", cp);
                        else if (cp <= 0xFFFF) std::snprintf(buf, sizeof buf, "\\u%04x", cp);
                        else std::snprintf(buf, sizeof buf, "\\U%08x", cp);
                        v += buf;
                    } else {
                        v.push_back('\\');
                        v.push_back(e);
                    }
            }
        }
        emit(Tok::String, std::move(v), p);
        return i;
    }

    const LexOptions o_;
    std::string src_;
    std::vector<size_t> line_starts_;
    std::vector<Token> toks_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexOptions& opts) { return Lexer(source, opts).run(); }

}  // namespace quern::jinja
