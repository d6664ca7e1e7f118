#include "tokenizer/unicode.h"

#include <unicode/uchar.h>

#include <memory>

namespace kestrel::tokenizer {

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

CharClass icu_class(char32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  if (u_isUWhiteSpace(c)) return kSpace;
  switch (u_charType(c)) {
    case U_UPPERCASE_LETTER: case U_LOWERCASE_LETTER: case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER: case U_OTHER_LETTER:
      return kLetter;
    case U_DECIMAL_DIGIT_NUMBER: case U_LETTER_NUMBER: case U_OTHER_NUMBER:
      return kNumber;
    default:
      return kOther;
  }
}

// The BMP is looked up in a table (64 KiB, built once) because the pre-tokenizer asks for every
// character of the input; planes 1-16 (emoji, rare CJK) ask ICU directly.
const uint8_t* bmp_table() {
  static const std::unique_ptr<uint8_t[]> table = [] {
    auto t = std::make_unique<uint8_t[]>(0x10000);
    for (char32_t c = 0; c < 0x10000; ++c) t[c] = icu_class(c);
    return t;
  }();
  return table.get();
}

}  // namespace

CharClass char_class(char32_t cp) {
  if (cp < 0x10000) return static_cast<CharClass>(bmp_table()[cp]);
  return icu_class(cp);
}

bool is_word_char(char32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL)) return true;
  switch (u_charType(c)) {
    case U_NON_SPACING_MARK: case U_ENCLOSING_MARK: case U_COMBINING_SPACING_MARK:
    case U_DECIMAL_DIGIT_NUMBER: case U_CONNECTOR_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

const std::array<char32_t, 256>& byte_to_unicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

int unicode_to_byte(char32_t cp) {
  // The image of byte_to_unicode lies below 256 + 68.
  static const std::array<int16_t, 324> inverse = [] {
    std::array<int16_t, 324> t{};
    t.fill(-1);
    const auto& fwd = byte_to_unicode();
    for (int b = 0; b < 256; ++b) t[fwd[b]] = static_cast<int16_t>(b);
    return t;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char b0 = byte(i);
    if (b0 < 0x80) { out.push_back(static_cast<char>(b0)); ++i; continue; }
    // Expected length and the allowed range of the second byte (Unicode Table 3-7).
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) need = 2;
    else if (b0 >= 0xE0 && b0 <= 0xEF) { need = 3; if (b0 == 0xE0) lo = 0xA0; if (b0 == 0xED) hi = 0x9F; }
    else if (b0 >= 0xF0 && b0 <= 0xF4) { need = 4; if (b0 == 0xF0) lo = 0x90; if (b0 == 0xF4) hi = 0x8F; }
    if (need == 0) { out += "\xEF\xBF\xBD"; ++i; continue; }
    size_t k = 1;
    for (; k < need && i + k < s.size(); ++k) {
      const unsigned char b = byte(i + k);
      const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
      if (b < l || b > h) break;
    }
    if (k == need) {
      out.append(s.substr(i, need));
    } else {
      out += "\xEF\xBF\xBD";  // the maximal subpart s[i, i+k) is replaced as a whole
    }
    i += k;
  }
  return out;
}

}  // namespace kestrel::tokenizer
