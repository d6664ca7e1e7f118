// Threading: OpenMP with an explicit thread count that the CLI sets once
// (--threads). Kernels partition work statically so results are independent
// of scheduling.
#pragma once
#include <cstdint>

namespace kestrel {

void set_num_threads(int n);  // n <= 0 keeps the OpenMP default
int num_threads();

}  // namespace kestrel
