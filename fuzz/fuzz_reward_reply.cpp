// One line a reward program printed (a bare number or {"score": ..., "id": ...}).
#include <cmath>

#include "fuzz_common.h"
#include "rl/reward_program.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto a = kestrel::rl::parse_reward_answer(kestrel::fuzz::as_string(data, size), 17);
  if (a.ok && !std::isfinite(a.score)) std::abort();  // an accepted score is finite
  if (a.ok == !a.error.empty()) std::abort();         // exactly one of a score or a reason
  (void)a.extra.dump();
  return 0;
}
