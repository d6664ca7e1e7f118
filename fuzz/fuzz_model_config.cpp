// Hugging Face config.json: parsing with transformers' defaults and checks.
#include "fuzz_common.h"
#include "io/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = kestrel::io::parse_model_config(kestrel::fuzz::as_string(data, size), "fuzz/config.json");
  if (r) (void)r.value().num_parameters();
  return 0;
}
