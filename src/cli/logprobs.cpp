#include <cstdio>

#include "cli/commands.h"

namespace kestrel::cli {

int cmd_logprobs(const Args&) {
  std::fprintf(stderr, "kestrel logprobs: not supported yet: model loading is being built\n");
  return 2;
}

}  // namespace kestrel::cli
