// Normalizers of tokenizer.json: NFC (ICU) and Sequence of them.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kestrel::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Writes the normalized text to out and returns true, or returns false (out untouched) when the
  // text is already normalized, so the common case copies nothing. Thread-safe.
  virtual bool normalize(std::string_view in, std::string& out) const = 0;
};

std::unique_ptr<Normalizer> make_nfc_normalizer();
std::unique_ptr<Normalizer> make_sequence_normalizer(std::vector<std::unique_ptr<Normalizer>> parts);

}  // namespace kestrel::tokenizer
