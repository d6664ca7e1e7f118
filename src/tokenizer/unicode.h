// UTF-8 and Unicode-property helpers shared by the tokenizer stages. Character classes come from
// ICU (the same Unicode tables HF's onig/Rust regexes use, up to the Unicode version).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace kestrel::tokenizer {

// Decodes the code point at s[i]; sets len to its byte length (>= 1). Invalid UTF-8 decodes as one
// byte with code point 0xFFFD so that scanning always advances (HF only ever sees valid UTF-8).
inline char32_t decode_utf8(std::string_view s, size_t i, size_t& len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) { len = 1; return b0; }
  auto cont = [&](size_t k) { return i + k < s.size() && (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80; };
  auto at = [&](size_t k) { return static_cast<unsigned char>(s[i + k]) & 0x3Fu; };
  if (b0 >= 0xC2 && b0 < 0xE0 && cont(1)) { len = 2; return ((b0 & 0x1Fu) << 6) | at(1); }
  if (b0 >= 0xE0 && b0 < 0xF0 && cont(1) && cont(2)) {
    const char32_t cp = ((b0 & 0x0Fu) << 12) | (at(1) << 6) | at(2);
    if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) { len = 3; return cp; }
  }
  if (b0 >= 0xF0 && b0 < 0xF5 && cont(1) && cont(2) && cont(3)) {
    const char32_t cp = ((b0 & 0x07u) << 18) | (at(1) << 12) | (at(2) << 6) | at(3);
    if (cp >= 0x10000 && cp <= 0x10FFFF) { len = 4; return cp; }
  }
  len = 1;
  return 0xFFFD;
}

void append_utf8(std::string& out, char32_t cp);

// The three classes the well-known pre-tokenizer regexes are built from.
enum CharClass : uint8_t {
  kOther = 0,
  kLetter = 1,  // \p{L}
  kNumber = 2,  // \p{N}
  kSpace = 4,   // \s as onig and Rust regex read it: the Unicode White_Space property
};
CharClass char_class(char32_t cp);

// Rust regex's \w (Alphabetic, M, Nd, Pc, Join_Control): used by added tokens' single_word.
bool is_word_char(char32_t cp);
inline bool is_white_space(char32_t cp) { return char_class(cp) == kSpace; }

// GPT-2's bytes_to_unicode: every byte gets a printable code point, so BPE vocab entries are text.
const std::array<char32_t, 256>& byte_to_unicode();
// Inverse of byte_to_unicode; -1 for code points outside its image.
int unicode_to_byte(char32_t cp);

// Rust's String::from_utf8_lossy: each maximal ill-formed subpart becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);

}  // namespace kestrel::tokenizer
