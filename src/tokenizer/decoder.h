// Decoders of tokenizer.json (HF decode_chain semantics): ByteLevel, ByteFallback, Fuse, Strip,
// Replace (string pattern) and Sequence.
#pragma once
#include <memory>
#include <string>
#include <vector>

namespace kestrel::tokenizer {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the token strings in place; the caller concatenates what is left.
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

std::unique_ptr<Decoder> make_byte_level_decoder();
std::unique_ptr<Decoder> make_byte_fallback_decoder();
std::unique_ptr<Decoder> make_fuse_decoder();
std::unique_ptr<Decoder> make_strip_decoder(char32_t content, size_t start, size_t stop);
std::unique_ptr<Decoder> make_replace_decoder(std::string pattern, std::string content);
std::unique_ptr<Decoder> make_sequence_decoder(std::vector<std::unique_ptr<Decoder>> parts);

}  // namespace kestrel::tokenizer
