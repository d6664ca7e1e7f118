// Threading: OpenMP with an explicit thread count that the CLI sets once
// (--threads). Kernels partition work statically so results are independent
// of scheduling.
//
// Deterministic mode (MindSpeed-RL's deterministic computation, Megatron's
// deterministic_mode, verl's full_determinism): Kestrel's own kernels already
// partition every reduction independently of the thread count (each has a
// test: tests/ops/*ThreadCount*). What is not, by default, is the GEMM
// library: a threaded BLAS splits a product differently at 1, 2 or N threads,
// and its kernels may round differently per split, and `KESTREL_BLAS=auto`
// picks a library by timing. In deterministic mode every GEMM is cut into
// fixed output tiles (their shape depends only on the problem), each tile is
// one single-threaded library call, and one library runs every pattern
// (oneDNN, else BLIS, else OpenBLAS, by what is installed, never by timing;
// KESTREL_BLAS names another): results are then
// bit-identical across runs and across thread counts on one build and machine
// (backend/cpu/gemm.h).
#pragma once
#include <cstdint>

namespace kestrel {

void set_num_threads(int n);  // n <= 0 keeps the OpenMP default
int num_threads();

// Process-wide; set once at start (the CLI: the config key, or
// KESTREL_DETERMINISTIC=1), before the first GEMM.
void set_deterministic(bool on);
bool deterministic();

}  // namespace kestrel
