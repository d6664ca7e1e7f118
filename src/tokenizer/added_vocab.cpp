#include "tokenizer/added_vocab.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace kestrel::tokenizer {
namespace {

// Last / first character of s (U+0000 when s is empty).
char32_t last_char(std::string_view s) {
  if (s.empty()) return 0;
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80 && s.size() - i < 4) --i;
  size_t len;
  const char32_t cp = decode_utf8(s, i, len);
  return i + len == s.size() ? cp : 0xFFFD;
}
char32_t first_char(std::string_view s) {
  if (s.empty()) return 0;
  size_t len;
  return decode_utf8(s, 0, len);
}

// Start of the white space at the end of s (Rust regex `\s*$`).
size_t trailing_space_start(std::string_view s) {
  size_t i = s.size();
  while (i > 0) {
    size_t j = i - 1;
    while (j > 0 && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80 && i - j < 4) --j;
    size_t len;
    const char32_t cp = decode_utf8(s, j, len);
    if (j + len != i || !is_white_space(cp)) break;
    i = j;
  }
  return i;
}
// Length of the white space at the start of s (Rust regex `^\s*`).
size_t leading_space_len(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t len;
    if (!is_white_space(decode_utf8(s, i, len))) break;
    i += len;
  }
  return i;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>* tokens,
                                     std::vector<std::pair<std::string, int32_t>> patterns)
    : tokens_(tokens) {
  nodes_.emplace_back();
  for (const auto& [pat, tok] : patterns) {
    if (pat.empty()) continue;
    first_byte_[static_cast<unsigned char>(pat[0])] = true;
    int32_t n = 0;
    for (unsigned char b : pat) {
      auto& next = nodes_[n].next;
      auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(b, int32_t(-1)));
      if (it != next.end() && it->first == b) {
        n = it->second;
      } else {
        const auto child = static_cast<int32_t>(nodes_.size());
        next.insert(it, {b, child});
        nodes_.emplace_back();
        n = child;
      }
    }
    if (nodes_[n].token < 0) nodes_[n].token = tok;  // the first token listed with a content wins
  }
}

std::pair<size_t, int32_t> AddedTokenMatcher::longest_at(std::string_view s, size_t pos) const {
  std::pair<size_t, int32_t> best{0, -1};
  int32_t n = 0;
  for (size_t i = pos; i < s.size(); ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    const auto& next = nodes_[n].next;
    auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(b, int32_t(-1)));
    if (it == next.end() || it->first != b) break;
    n = it->second;
    if (nodes_[n].token >= 0) best = {i + 1, nodes_[n].token};
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view s, std::vector<AddedSplit>& out) const {
  out.clear();
  size_t start_offset = 0;
  for (size_t pos = 0; pos < s.size();) {
    if (!first_byte_[static_cast<unsigned char>(s[pos])]) { ++pos; continue; }
    const auto [match_end, tok] = longest_at(s, pos);
    if (tok < 0) { ++pos; continue; }
    size_t start = pos, stop = match_end;
    pos = match_end;  // matching resumes after the match even when the rules below discard it
    const AddedToken& t = (*tokens_)[tok];
    if (t.single_word) {
      const bool start_space = start == 0 || !is_word_char(last_char(s.substr(0, start)));
      const bool stop_space = stop == s.size() || !is_word_char(first_char(s.substr(stop)));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) start = std::max(trailing_space_start(s.substr(0, start)), start_offset);
    if (t.rstrip) stop += leading_space_len(s.substr(stop));
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, tok});
    start_offset = stop;
  }
  if (start_offset != s.size()) out.push_back({start_offset, s.size(), -1});
}

}  // namespace kestrel::tokenizer
