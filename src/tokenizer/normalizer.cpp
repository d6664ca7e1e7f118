#include "tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <cstring>

#include "core/status.h"

namespace kestrel::tokenizer {
namespace {

bool is_ascii(std::string_view s) {
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    if (w & 0x8080808080808080ull) return false;
  }
  for (; i < s.size(); ++i)
    if (static_cast<unsigned char>(s[i]) & 0x80) return false;
  return true;
}

class Nfc final : public Normalizer {
 public:
  Nfc() {
    UErrorCode st = U_ZERO_ERROR;
    n2_ = icu::Normalizer2::getNFCInstance(st);
    if (U_FAILURE(st)) KS_FAIL("tokenizer: ICU has no NFC normalizer: ", u_errorName(st));
  }
  bool normalize(std::string_view in, std::string& out) const override {
    if (is_ascii(in)) return false;  // ASCII is NFC
    UErrorCode st = U_ZERO_ERROR;
    const icu::StringPiece sp(in.data(), static_cast<int32_t>(in.size()));
    if (n2_->isNormalizedUTF8(sp, st) && U_SUCCESS(st)) return false;
    st = U_ZERO_ERROR;
    std::string res;
    icu::StringByteSink<std::string> sink(&res);
    n2_->normalizeUTF8(0, sp, sink, nullptr, st);
    if (U_FAILURE(st)) KS_FAIL("tokenizer: NFC normalization failed: ", u_errorName(st));
    out = std::move(res);
    return true;
  }

 private:
  const icu::Normalizer2* n2_;  // owned by ICU
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  bool normalize(std::string_view in, std::string& out) const override {
    bool changed = false;
    std::string cur, next;
    for (const auto& p : parts_) {
      if (p->normalize(changed ? std::string_view(cur) : in, next)) {
        cur.swap(next);
        changed = true;
      }
    }
    if (changed) out = std::move(cur);
    return changed;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

std::unique_ptr<Normalizer> make_nfc_normalizer() { return std::make_unique<Nfc>(); }
std::unique_ptr<Normalizer> make_sequence_normalizer(std::vector<std::unique_ptr<Normalizer>> parts) {
  return std::make_unique<Sequence>(std::move(parts));
}

}  // namespace kestrel::tokenizer
