#include "rl/reward_score/pytext.h"

namespace kestrel::rl::pytext {

U32 decode(std::string_view s) {
  U32 out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    bool ok = len > 0 && i + size_t(len) <= n;
    for (int k = 1; ok && k < len; ++k) {
      if ((p[i + size_t(k)] & 0xC0) != 0x80) ok = false;
      else cp = (cp << 6) | (p[i + size_t(k)] & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are invalid too.
    if (ok && ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
               (cp >= 0xD800 && cp <= 0xDFFF)))
      ok = false;
    if (!ok) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += size_t(len);
  }
  return out;
}

std::string encode(const U32& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c < 0x80) {
      out += char(c);
    } else if (c < 0x800) {
      out += char(0xC0 | (c >> 6));
      out += char(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += char(0xE0 | (c >> 12));
      out += char(0x80 | ((c >> 6) & 0x3F));
      out += char(0x80 | (c & 0x3F));
    } else {
      out += char(0xF0 | (c >> 18));
      out += char(0x80 | ((c >> 12) & 0x3F));
      out += char(0x80 | ((c >> 6) & 0x3F));
      out += char(0x80 | (c & 0x3F));
    }
  }
  return out;
}

bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_digit(char32_t c) {
  if (c >= '0' && c <= '9') return true;
  // First code point of each block of ten decimal digits (Unicode Nd).
  static const char32_t kDecimalBlocks[] = {
      0x0660, 0x06F0, 0x07C0, 0x0966, 0x09E6, 0x0A66, 0x0AE6, 0x0B66, 0x0BE6, 0x0C66, 0x0CE6, 0x0D66, 0x0DE6,
      0x0E50, 0x0ED0, 0x0F20, 0x1040, 0x1090, 0x17E0, 0x1810, 0x1946, 0x19D0, 0x1A80, 0x1A90, 0x1B50, 0x1BB0,
      0x1C40, 0x1C50, 0xA620, 0xA8D0, 0xA900, 0xA9D0, 0xA9F0, 0xAA50, 0xABF0, 0xFF10, 0x104A0, 0x11066};
  for (char32_t b : kDecimalBlocks)
    if (c >= b && c < b + 10) return true;
  if (c >= 0x1D7CE && c <= 0x1D7FF) return true;  // mathematical digits
  // Numeric_Type=Digit: superscripts, subscripts, circled and dingbat digits.
  if (c == 0xB2 || c == 0xB3 || c == 0xB9 || c == 0x2070 || (c >= 0x2074 && c <= 0x2079) ||
      (c >= 0x2080 && c <= 0x2089) || (c >= 0x2460 && c <= 0x2468) || (c >= 0x2474 && c <= 0x247C) ||
      (c >= 0x2488 && c <= 0x2490) || c == 0x24EA || (c >= 0x24F5 && c <= 0x24FD) || c == 0x24FF ||
      (c >= 0x2776 && c <= 0x277E) || (c >= 0x2780 && c <= 0x2788) || (c >= 0x278A && c <= 0x2792) ||
      (c >= 0x1369 && c <= 0x1371) || c == 0x19DA || (c >= 0x1F100 && c <= 0x1F10A))
    return true;
  return false;
}

bool is_word(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
  if (is_space(c) || c < 0xA0) return false;
  if (c <= 0xBF)
    return c == 0xAA || c == 0xB2 || c == 0xB3 || c == 0xB5 || c == 0xB9 || c == 0xBA || (c >= 0xBC && c <= 0xBE);
  if (c == 0xD7 || c == 0xF7) return false;
  if ((c >= 0x02C2 && c <= 0x02C5) || (c >= 0x02D2 && c <= 0x02DF) || (c >= 0x0300 && c <= 0x036F)) return false;
  if (c == 0x037E || c == 0x0387 || (c >= 0x055A && c <= 0x055F) || c == 0x0589) return false;
  if (c == 0x060C || c == 0x061B || c == 0x061F || (c >= 0x066A && c <= 0x066D) || c == 0x06D4) return false;
  if (c == 0x0964 || c == 0x0965 || c == 0x0E3F || c == 0x0E4F || c == 0x0E5A || c == 0x0E5B) return false;
  if (c >= 0x2000 && c <= 0x2BFF)  // punctuation, symbols, arrows, operators, box drawing, dingbats
    return (c >= 0x2070 && c <= 0x209F) || (c >= 0x2150 && c <= 0x218F) || (c >= 0x2460 && c <= 0x24FF) ||
           c == 0x2102 || c == 0x2107 || (c >= 0x210A && c <= 0x2113) || c == 0x2115 || (c >= 0x2119 && c <= 0x211D) ||
           c == 0x2124 || c == 0x2126 || c == 0x2128 || (c >= 0x212A && c <= 0x212D) || (c >= 0x212F && c <= 0x2139);
  if (c >= 0x2E00 && c <= 0x2E7F) return false;
  if (c >= 0x3000 && c <= 0x303F)
    return (c >= 0x3005 && c <= 0x3007) || (c >= 0x3021 && c <= 0x3029) || (c >= 0x3031 && c <= 0x3035) ||
           (c >= 0x3038 && c <= 0x303C);
  if (c == 0x30FB || (c >= 0xFE00 && c <= 0xFE0F) || (c >= 0xFE10 && c <= 0xFE6F)) return false;
  if ((c >= 0xFF01 && c <= 0xFF0F) || (c >= 0xFF1A && c <= 0xFF20) || (c >= 0xFF3B && c <= 0xFF40) ||
      (c >= 0xFF5B && c <= 0xFF65) || (c >= 0xFFF0 && c <= 0xFFFF))
    return false;
  if ((c >= 0xE000 && c <= 0xF8FF) || (c >= 0x1F000 && c <= 0x1FBFF)) return false;
  return true;
}

bool is_digits(const U32& s) {
  if (s.empty()) return false;
  for (char32_t c : s)
    if (!is_digit(c)) return false;
  return true;
}

namespace {

// One character's lowercase (not the final-sigma rule, nor U+0130).
char32_t lower1(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if ((c >= 0xC0 && c <= 0xD6) || (c >= 0xD8 && c <= 0xDE)) return c + 32;
  if (c >= 0x0100 && c <= 0x017F) {
    if ((c <= 0x012F || (c >= 0x0132 && c <= 0x0137) || (c >= 0x014A && c <= 0x0177)) && c % 2 == 0) return c + 1;
    if (((c >= 0x0139 && c <= 0x0148) || (c >= 0x0179 && c <= 0x017E)) && c % 2 == 1) return c + 1;
    if (c == 0x0178) return 0xFF;
    return c;
  }
  if (c == 0x0386) return 0x03AC;
  if (c >= 0x0388 && c <= 0x038A) return c + 37;
  if (c == 0x038C) return 0x03CC;
  if (c == 0x038E || c == 0x038F) return c + 63;
  if ((c >= 0x0391 && c <= 0x03A1) || (c >= 0x03A3 && c <= 0x03AB)) return c + 32;
  if (c >= 0x0400 && c <= 0x040F) return c + 80;
  if (c >= 0x0410 && c <= 0x042F) return c + 32;
  if (((c >= 0x0460 && c <= 0x0481) || (c >= 0x048A && c <= 0x04BF) || (c >= 0x04D0 && c <= 0x052F)) && c % 2 == 0)
    return c + 1;
  if (c == 0x04C0) return 0x04CF;
  if (c >= 0x04C1 && c <= 0x04CE && c % 2 == 1) return c + 1;
  if (c >= 0x0531 && c <= 0x0556) return c + 48;
  if (((c >= 0x1E00 && c <= 0x1E95) || (c >= 0x1EA0 && c <= 0x1EFF)) && c % 2 == 0) return c + 1;
  if (c == 0x1E9E) return 0xDF;
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
  return c;
}

bool is_letter(char32_t c) { return is_word(c) && !is_digit(c) && c != '_' && !(c >= 0x2150 && c <= 0x24FF); }
bool case_ignorable(char32_t c) { return c == '\'' || c == 0xB7 || c == 0x2019 || (c >= 0x0300 && c <= 0x036F); }

}  // namespace

U32 lower(const U32& s) {
  U32 out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char32_t c = s[i];
    if (c == 0x0130) {  // 'İ'.lower() == 'i' + COMBINING DOT ABOVE
      out += U'i';
      out += char32_t(0x0307);
      continue;
    }
    if (c == 0x03A3) {  // Final_Sigma: after a letter and not before one
      size_t j = i;
      while (j > 0 && case_ignorable(s[j - 1])) --j;
      const bool after_letter = j > 0 && is_letter(s[j - 1]);
      size_t k = i + 1;
      while (k < s.size() && case_ignorable(s[k])) ++k;
      const bool before_letter = k < s.size() && is_letter(s[k]);
      out += after_letter && !before_letter ? char32_t(0x03C2) : char32_t(0x03C3);
      continue;
    }
    out += lower1(c);
  }
  return out;
}

U32 strip(const U32& s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

bool starts_at(const U32& s, size_t pos, const U32& lit) {
  return pos <= s.size() && s.size() - pos >= lit.size() && s.compare(pos, lit.size(), lit) == 0;
}

bool contains(const U32& s, const U32& lit) { return s.find(lit) != U32::npos; }

U32 replace(const U32& s, const U32& from, const U32& to) {
  if (from.empty()) return s;
  U32 out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != U32::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out += to;
  }
  out.append(s, pos, U32::npos);
  return out;
}

std::vector<U32> split(const U32& s, const U32& sep) {
  std::vector<U32> out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(sep, pos)) != U32::npos; pos = hit + sep.size()) out.push_back(s.substr(pos, hit - pos));
  out.push_back(s.substr(pos));
  return out;
}

std::vector<U32> split_ws(const U32& s) {
  std::vector<U32> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && is_space(s[i])) ++i;
    size_t j = i;
    while (j < s.size() && !is_space(s[j])) ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

U32 tail(const U32& s, size_t n) { return s.size() > n ? s.substr(s.size() - n) : s; }

size_t count(const U32& s, const U32& lit) {
  size_t k = 0;
  for (size_t pos = 0; (pos = s.find(lit, pos)) != U32::npos; pos += lit.size()) ++k;
  return k;
}

size_t rfind(const U32& s, const U32& lit) { return s.rfind(lit); }

}  // namespace kestrel::rl::pytext
