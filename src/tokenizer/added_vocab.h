// Added tokens (special or not) of tokenizer.json and how HF splits input text on them: leftmost-
// longest matching (aho-corasick LeftmostLongest), then the single_word / lstrip / rstrip rules.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kestrel::tokenizer {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
  // What decode() and id_to_token() give back: HF returns a normalized token's normalized content.
  std::string decoded;
};

// A piece of the input: either plain text, or an added token (token >= 0 indexes the token list).
struct AddedSplit {
  size_t begin, end;
  int32_t token;
};

class AddedTokenMatcher {
 public:
  // patterns[i] is what token i must match in the text (its normalized content for normalized
  // tokens); tokens are the same indices' flags.
  AddedTokenMatcher(const std::vector<AddedToken>* tokens, std::vector<std::pair<std::string, int32_t>> patterns);
  bool empty() const { return nodes_.size() <= 1; }
  // HF's AddedVocabulary::find_matches: splits covering `sentence`, in order. Thread-safe.
  void split(std::string_view sentence, std::vector<AddedSplit>& out) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
    int32_t token = -1;
  };
  // Longest pattern starting at pos: its end and token, or token -1.
  std::pair<size_t, int32_t> longest_at(std::string_view s, size_t pos) const;

  const std::vector<AddedToken>* tokens_;
  std::vector<Node> nodes_;
  bool first_byte_[256] = {};
};

}  // namespace kestrel::tokenizer
