// Python str semantics on UTF-8 text, for the ports of verl's rule scorers
// (rl/reward_score/*): verl's scorers index, slice, lower() and regex-match
// Python strings, i.e. code points, with Unicode-aware \s, \w, isdigit() and
// lower(). Text is decoded to code points (U32) once; invalid UTF-8 bytes
// become U+FFFD, as Python's decode(errors="replace") makes them.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kestrel::rl::pytext {

using U32 = std::u32string;

U32 decode(std::string_view utf8);
std::string encode(const U32& s);

// str.isspace() of one character (also what Python's regex \s matches).
bool is_space(char32_t c);
// str.isdigit() of one character: ASCII digits, the common Unicode decimal
// digit blocks (Arabic-Indic, Devanagari, fullwidth, ...), super- and
// subscript and circled digits.
bool is_digit(char32_t c);
// Python regex \w: [A-Za-z0-9_] and Unicode letters and digits (punctuation,
// symbols, spaces, combining marks and emoji are not word characters).
bool is_word(char32_t c);
// str.isdigit() of a string: non-empty and every character a digit.
bool is_digits(const U32& s);
// str.lower(): ASCII, Latin-1, Latin Extended-A, Greek (final sigma
// included), Cyrillic, Armenian and fullwidth letters.
U32 lower(const U32& s);
// str.strip() (Unicode whitespace).
U32 strip(const U32& s);

bool starts_at(const U32& s, size_t pos, const U32& lit);
bool contains(const U32& s, const U32& lit);
// str.replace(from, to): left to right, non-overlapping, not rescanned.
U32 replace(const U32& s, const U32& from, const U32& to);
// str.split(sep) (sep non-empty).
std::vector<U32> split(const U32& s, const U32& sep);
// str.split() without a separator: runs of whitespace, no empty pieces.
std::vector<U32> split_ws(const U32& s);
// s[-n:]
U32 tail(const U32& s, size_t n);
// str.count(lit)
size_t count(const U32& s, const U32& lit);
// str.rfind(lit); npos when absent.
size_t rfind(const U32& s, const U32& lit);

}  // namespace kestrel::rl::pytext
