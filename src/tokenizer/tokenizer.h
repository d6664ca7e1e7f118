// A Hugging Face tokenizer.json reader that produces the same token ids as HF `tokenizers` for
// byte-level BPE models (GPT-2, Qwen2/2.5/3, Llama-3) and BPE with byte_fallback.
//
// Supported: normalizer null | NFC | Sequence; pre_tokenizer null | ByteLevel | Split (Regex or
// String, any behavior, invert) | Sequence; model BPE (merges as "a b" or [a, b], ignore_merges,
// byte_fallback, unk_token, fuse_unk); added tokens with special / lstrip / rstrip / single_word /
// normalized; post_processor null | ByteLevel | TemplateProcessing (single) | RobertaProcessing |
// BertProcessing | Sequence; decoder null | ByteLevel | ByteFallback | Fuse | Strip | Replace
// (string) | Sequence. Anything else fails to load with "not supported yet: <what>".
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kestrel::tokenizer {

class Tokenizer {
 public:
  // Reads a tokenizer.json.
  static Result<Tokenizer> from_file(const std::string& path);
  // The same from the file's text; `path` names it in errors (fuzz/, tests).
  static Result<Tokenizer> from_json_text(const std::string& text, const std::string& path);
  // Reads <dir>/tokenizer.json and, when present, <dir>/tokenizer_config.json for bos/eos.
  static Result<Tokenizer> from_dir(const std::string& dir);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of text. Added/special tokens in the text are always recognized (as in HF);
  // add_special_tokens only controls the post-processor's template (Llama-3's BOS, say).
  // Thread-safe: encode concurrently from many threads. Invalid UTF-8 bytes are tokenized
  // one byte at a time as "other" characters (HF cannot receive such input).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // encode() of each text on `threads` threads (<= 0: hardware concurrency).
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string>& texts, bool add_special_tokens = true,
                                                 int threads = 0) const;

  // Text of ids, as HF decode(): ids that are no token are skipped; skip_special drops tokens
  // marked special; malformed UTF-8 from partial byte tokens becomes U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  int32_t token_to_id(std::string_view token) const;  // -1 if none
  std::string id_to_token(int32_t id) const;          // "" if none
  // One past the largest id of the model vocab and the added tokens (what an embedding must cover).
  int64_t vocab_size() const;
  bool is_special(int32_t id) const;
  // From tokenizer_config.json (from_dir), else from the post-processor's template (bos only).
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;

  struct Impl;
  // For tests and benchmarks of the internals.
  const Impl& impl() const { return *impl_; }
  Impl& mutable_impl() { return *impl_; }

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kestrel::tokenizer
