// Encode/decode of arbitrary text and ids with real tokenizers: the first
// byte picks the tokenizer (byte-level BPE Qwen2, Llama-3, GPT-2, or BPE with
// byte_fallback); the rest is text to encode, and read as little-endian
// int32 ids to decode.
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz_common.h"
#include "tokenizer/tokenizer.h"

namespace {
using kestrel::tokenizer::Tokenizer;
const Tokenizer& pick(uint8_t b) {
  static std::vector<std::unique_ptr<Tokenizer>> toks = [] {
    std::vector<std::unique_ptr<Tokenizer>> v;
    for (const char* name : {"qwen2", "llama3", "gpt2", "bytefb"}) {
      auto r = Tokenizer::from_dir(std::string(KESTREL_SOURCE_DIR) + "/tests/golden/tokenizer/" + name);
      if (!r) {
        std::fprintf(stderr, "fuzz_tokenizer_encode: %s\n", r.status().message().c_str());
        std::abort();
      }
      v.push_back(std::make_unique<Tokenizer>(std::move(r).value()));
    }
    return v;
  }();
  return *toks[b % toks.size()];
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Tokenizer& t = pick(data[0]);
  const std::string text = kestrel::fuzz::as_string(data + 1, size - 1);
  const bool specials = data[0] & 0x80;
  const std::vector<int32_t> ids = t.encode(text, specials);
  const int64_t vocab = t.vocab_size();
  for (int32_t id : ids)
    if (id < 0 || id >= vocab) std::abort();  // encode must emit only ids of the vocabulary
  (void)t.decode(ids, specials);
  std::vector<int32_t> raw((size - 1) / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data + 1, raw.size() * 4);
  (void)t.decode(raw, !specials);
  return 0;
}
