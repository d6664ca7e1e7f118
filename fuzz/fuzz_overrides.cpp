// Command-line arguments as `kestrel train ARGS...` parses them: one argument
// per input line (at most 32): config flags and Hydra overrides (key=value,
// +key, ++key, ~key, lists, interpolations), loaded over the built-in tree.
#include <vector>

#include "config/config.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kestrel::config;
  const std::string in = kestrel::fuzz::as_string(data, size);
  std::vector<std::string> args;
  for (size_t start = 0; start <= in.size() && args.size() < 32;) {
    size_t nl = in.find('\n', start);
    if (nl == std::string::npos) nl = in.size();
    args.push_back(in.substr(start, nl - start));
    start = nl + 1;
  }
  std::vector<std::string> rest;
  auto o = options_from_args(args, &rest);
  if (!o) return 0;
  LoadOptions lo = o.value();
  lo.config_files.clear();  // files are fuzz_yaml_config's; here only the overrides
  auto c = load(lo);
  if (c) (void)c.value().to_yaml();
  return 0;
}
