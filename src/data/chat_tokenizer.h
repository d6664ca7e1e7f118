// A tokenizer folder as the data pipeline uses it: tokenizer.json plus the
// chat template and special tokens of tokenizer_config.json (or
// chat_template.jinja), so prompts render exactly as transformers'
// apply_chat_template(..., tokenize=True) would give them.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/template.h"
#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace kestrel::data {

class ChatTokenizer {
 public:
  // Reads <dir>/tokenizer.json, <dir>/tokenizer_config.json (chat_template,
  // bos_token, eos_token) and <dir>/chat_template.jinja when present.
  static Result<ChatTokenizer> from_dir(const std::string& dir);

  const tokenizer::Tokenizer& tokenizer() const { return *tok_; }
  const std::string& dir() const { return dir_; }
  bool has_chat_template() const { return tmpl_.has_value(); }
  std::optional<int32_t> eos_id() const { return tok_->eos_id(); }
  const std::string& eos_token() const { return eos_text_; }  // "" when none

  // apply_chat_template(messages, tokenize=False, add_generation_prompt); the
  // template sees bos_token / eos_token and every key of `extra`.
  Result<std::string> render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                             const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  // Token ids of text as transformers tokenizes a rendered chat: no
  // post-processor template (add_special_tokens=False), specials recognized.
  std::vector<int32_t> encode(const std::string& text) const { return tok_->encode(text, false); }

 private:
  std::shared_ptr<tokenizer::Tokenizer> tok_;
  std::optional<chat::Template> tmpl_;
  std::string dir_, bos_text_, eos_text_;
};

// verl's data.truncation for sequences longer than the limit.
enum class Truncation { Error, Left, Right, Middle };
// "error" | "left" | "right" | "middle"; origin names the key in errors.
Result<Truncation> parse_truncation(const std::string& s, const std::string& origin);
const char* truncation_name(Truncation t);

// Keeps `max_len` of the ids as verl does: left keeps the last max_len, right
// the first, middle the first max_len/2 and the last max_len - max_len/2.
// Error is not handled here (the caller reports it). `mask` (optional,
// parallel to ids) is cut the same way.
void truncate_ids(std::vector<int32_t>& ids, int64_t max_len, Truncation t, std::vector<uint8_t>* mask = nullptr);

}  // namespace kestrel::data
