// Internal state of a Tokenizer, shared by the loader (tokenizer_load.cpp) and the encode/decode
// pipeline (tokenizer.cpp).
#pragma once
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace kestrel::tokenizer {

// One item of a post-processor template: a fixed list of ids, or the encoded sequence.
struct TemplatePiece {
  bool is_sequence = false;
  std::vector<int32_t> ids;
};

struct Tokenizer::Impl {
  std::string source;  // the file it was read from, for messages

  std::unique_ptr<Normalizer> normalizer;  // may be null
  PreTokenizer pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<Decoder> decoder;  // may be null: tokens joined with " " as HF does

  std::vector<AddedToken> added;  // in file order
  std::unique_ptr<AddedTokenMatcher> raw_matcher;   // tokens with normalized == false
  std::unique_ptr<AddedTokenMatcher> norm_matcher;  // tokens with normalized == true
  StrMap<int32_t> added_by_content;
  std::unordered_map<int32_t, int32_t> added_by_id;  // id -> index into `added`
  std::unordered_set<std::string> special_contents;

  std::vector<std::string> id_to_model_token;  // model vocab, by id ("" for holes)
  std::vector<TemplatePiece> single_template;  // empty: no template
  int64_t vocab_size = 0;
  std::optional<int32_t> bos, eos;

  // Appends the ids of text without the post-processor template.
  void encode_into(std::string_view text, std::vector<int32_t>& out) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;  // after added-token split
};

}  // namespace kestrel::tokenizer
