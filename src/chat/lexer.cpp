// Jinja's lexer, restricted to what chat templates use, with the environment
// transformers builds: trim_blocks=True (a block or comment tag eats one newline
// after it), lstrip_blocks=True (spaces/tabs before a block or comment tag at the
// start of a line are dropped), `-` / `+` whitespace control on every tag.
#include <cctype>
#include <cstring>

#include <cerrno>
#include <cstdlib>

#include "chat/ast.h"

namespace kestrel::chat::detail {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python's `\s` also matches Unicode spaces; ASCII covers chat templates' own layout.
std::string rstrip_ws(const std::string& s) {
  size_t e = s.size();
  while (e > 0 && is_ws(s[e - 1])) --e;
  return s.substr(0, e);
}

size_t skip_ws(const std::string& s, size_t p) {
  while (p < s.size() && is_ws(s[p])) ++p;
  return p;
}

// Python's unicode-escape decoding of a string literal's body (jinja applies it to every literal).
std::string unescape(const std::string& body, size_t pos) {
  std::string out;
  for (size_t k = 0; k < body.size(); ++k) {
    const char c = body[k];
    if (c != '\\' || k + 1 >= body.size()) {
      out += c;
      continue;
    }
    const char e = body[++k];
    auto hex = [&](int n) -> uint32_t {
      uint32_t v = 0;
      for (int m = 1; m <= n; ++m) {
        if (k + m >= body.size() || !std::isxdigit(static_cast<unsigned char>(body[k + m])))
          throw SourceError{pos, "truncated \\x/\\u escape in string literal"};
        const char h = body[k + m];
        v = v * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
      }
      k += n;
      return v;
    };
    switch (e) {
      case '\n': break;  // line continuation
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x': utf8_append(out, hex(2)); break;
      case 'u': utf8_append(out, hex(4)); break;
      case 'U': utf8_append(out, hex(8)); break;
      case 'N': throw SourceError{pos, "not supported yet: \\N{...} escape in string literal"};
      default:
        if (e >= '0' && e <= '7') {
          uint32_t v = uint32_t(e - '0');
          for (int m = 0; m < 2 && k + 1 < body.size() && body[k + 1] >= '0' && body[k + 1] <= '7'; ++m)
            v = v * 8 + uint32_t(body[++k] - '0');
          utf8_append(out, v);
        } else {
          out += '\\';  // unknown escapes stay as written, as in Python
          out += e;
        }
    }
  }
  return out;
}

const char* kOps2[] = {"//", "**", "==", "!=", ">=", "<="};
const char kOps1[] = "+-/*%~[](){}><=.:|,;";

// Lexes the inside of a `{{ }}` or `{% %}` tag starting at p; returns the offset after the end tag.
size_t lex_tag(const std::string& src, size_t p, bool block, size_t tag_pos, std::vector<Token>& out) {
  int depth = 0;  // jinja only recognises the end tag while brackets are balanced
  const char* end = block ? "%}" : "}}";
  while (true) {
    if (p >= src.size())
      throw SourceError{tag_pos, std::string("unexpected end of template, expected '") + end + "'"};
    if (depth == 0) {
      if (src.compare(p, 3, std::string("-") + end) == 0) {
        out.push_back({block ? Tok::BlockEnd : Tok::VarEnd, "", p});
        return skip_ws(src, p + 3);
      }
      if (block && src.compare(p, 3, "+%}") == 0) {
        out.push_back({Tok::BlockEnd, "", p});
        return p + 3;
      }
      if (src.compare(p, 2, end) == 0) {
        out.push_back({block ? Tok::BlockEnd : Tok::VarEnd, "", p});
        p += 2;
        if (block && p < src.size() && src[p] == '\n') ++p;  // trim_blocks
        return p;
      }
    }
    const char c = src[p];
    if (is_ws(c)) {
      ++p;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t q = p;
      while (q < src.size() && (std::isdigit(static_cast<unsigned char>(src[q])) || src[q] == '_')) ++q;
      bool is_float = false;
      if (q + 1 < src.size() && src[q] == '.' && std::isdigit(static_cast<unsigned char>(src[q + 1]))) {
        is_float = true;
        ++q;
        while (q < src.size() && (std::isdigit(static_cast<unsigned char>(src[q])) || src[q] == '_')) ++q;
      }
      if (q < src.size() && (src[q] == 'e' || src[q] == 'E')) {
        size_t r = q + 1;
        if (r < src.size() && (src[r] == '+' || src[r] == '-')) ++r;
        if (r < src.size() && std::isdigit(static_cast<unsigned char>(src[r]))) {
          is_float = true;
          q = r;
          while (q < src.size() && (std::isdigit(static_cast<unsigned char>(src[q])) || src[q] == '_')) ++q;
        }
      }
      std::string digits;
      for (size_t k = p; k < q; ++k)
        if (src[k] != '_') digits += src[k];
      Token t{is_float ? Tok::Float : Tok::Int, digits, p};
      // std::stoll/stod throw out_of_range (found by fuzz/fuzz_chat_template):
      // Python's ints are unbounded, ours 64-bit; a float beyond range is inf, as in Python.
      if (is_float) {
        t.fval = std::strtod(digits.c_str(), nullptr);
      } else {
        errno = 0;
        t.ival = std::strtoll(digits.c_str(), nullptr, 10);
        if (errno == ERANGE)
          throw SourceError{p, "integer literal " + digits.substr(0, 40) + (digits.size() > 40 ? "..." : "") +
                                   " does not fit 64 bits (chat template integers are 64-bit)"};
      }
      out.push_back(t);
      p = q;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t q = p;
      while (q < src.size() && (std::isalnum(static_cast<unsigned char>(src[q])) || src[q] == '_')) ++q;
      out.push_back({Tok::Name, src.substr(p, q - p), p});
      p = q;
      continue;
    }
    if (c == '\'' || c == '"') {
      size_t q = p + 1;
      while (q < src.size() && src[q] != c) q += (src[q] == '\\') ? 2 : 1;
      if (q >= src.size()) throw SourceError{p, "unterminated string literal"};
      out.push_back({Tok::String, unescape(src.substr(p + 1, q - p - 1), p), p});
      p = q + 1;
      continue;
    }
    bool matched = false;
    for (const char* op : kOps2) {
      if (src.compare(p, 2, op) == 0) {
        out.push_back({Tok::Op, op, p});
        p += 2;
        matched = true;
        break;
      }
    }
    if (matched) continue;
    if (std::strchr(kOps1, c) != nullptr) {
      if (c == '(' || c == '[' || c == '{') ++depth;
      if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
      out.push_back({Tok::Op, std::string(1, c), p});
      ++p;
      continue;
    }
    throw SourceError{p, std::string("unexpected character '") + c + "' inside a tag"};
  }
}

}  // namespace

std::vector<Token> lex(const std::string& src) {
  std::vector<Token> out;
  size_t pos = 0;
  while (pos < src.size()) {
    // The earliest tag opener; jinja's root regex is a lazy scan for the same three.
    size_t p = pos;
    while (true) {
      p = src.find('{', p);
      if (p == std::string::npos || p + 1 >= src.size()) { p = std::string::npos; break; }
      const char n = src[p + 1];
      if (n == '{' || n == '%' || n == '#') break;
      ++p;
    }
    if (p == std::string::npos) {
      out.push_back({Tok::Text, src.substr(pos), pos});
      break;
    }
    const char kind = src[p + 1];
    const char sign = (p + 2 < src.size() && (src[p + 2] == '-' || src[p + 2] == '+')) ? src[p + 2] : 0;
    std::string text = src.substr(pos, p - pos);
    if (sign == '-') {
      text = rstrip_ws(text);
    } else if (sign != '+' && kind != '{') {
      // lstrip_blocks: drop the line's leading whitespace when the tag starts the line.
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      const bool line_starting = pos == 0 || src[pos - 1] == '\n';
      if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
        bool all_ws = true;
        for (size_t k = l_pos; k < text.size(); ++k) all_ws = all_ws && is_ws(text[k]);
        if (all_ws) text.resize(l_pos);
      }
    }
    if (!text.empty()) out.push_back({Tok::Text, text, pos});
    const size_t body = p + 2 + (sign ? 1 : 0);
    if (kind == '#') {
      size_t e = src.find("#}", body);
      if (e == std::string::npos) throw SourceError{p, "missing end of comment tag '#}'"};
      if (e > body && src[e - 1] == '-') pos = skip_ws(src, e + 2);
      else if (e > body && src[e - 1] == '+') pos = e + 2;
      else pos = (e + 2 < src.size() && src[e + 2] == '\n') ? e + 3 : e + 2;
      continue;
    }
    const bool block = kind == '%';
    out.push_back({block ? Tok::BlockBegin : Tok::VarBegin, "", p});
    pos = lex_tag(src, body, block, p, out);
  }
  out.push_back({Tok::Eof, "", src.size()});
  return out;
}

}  // namespace kestrel::chat::detail
