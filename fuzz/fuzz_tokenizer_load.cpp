// tokenizer.json as a user's model folder brings it: load, then encode and
// decode a fixed text (with specials) and every id up to the vocab size + 2.
#include <vector>

#include "fuzz_common.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kestrel::tokenizer::Tokenizer;
  auto r = Tokenizer::from_json_text(kestrel::fuzz::as_string(data, size), "fuzz/tokenizer.json");
  if (!r) return 0;
  const Tokenizer& t = r.value();
  for (const char* text : {"Hello world, 12345 <|im_start|>user\n  héllo\t🙂<|endoftext|>", "", " ", "\xff\xfe a"}) {
    const std::vector<int32_t> ids = t.encode(text, true);
    (void)t.decode(ids, false);
    (void)t.decode(ids, true);
  }
  std::vector<int32_t> all;
  const int64_t n = std::min<int64_t>(t.vocab_size() + 2, 4096);
  for (int64_t id = -2; id < n; ++id) all.push_back(static_cast<int32_t>(id));
  (void)t.decode(all, false);
  for (int32_t id : {-1, 0, 1, 2147483647}) {
    (void)t.id_to_token(id);
    (void)t.is_special(id);
  }
  return 0;
}
