// A YAML config file as `--config FILE` / `--config-path DIR --config-name
// NAME` give it: Hydra composition (defaults lists, packages), merging into
// the key table, interpolation, validation, and the YAML written back.
#include "config/config.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kestrel::config;
  static const std::string path = kestrel::fuzz::scratch_path("job.yaml");
  kestrel::fuzz::write_file(path, data, size);
  LoadOptions o;
  o.config_files = {path};
  auto c = load(o);
  if (c) (void)c.value().to_yaml();
  o.schema = &sft_schema();
  (void)load(o);
  return 0;
}
