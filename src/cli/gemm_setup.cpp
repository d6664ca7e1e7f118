// The GEMM choice of a command's process (backend/cpu/gemm.h), made once at
// its start: before threads start (loading OpenBLAS may set
// OPENBLAS_CORETYPE for a moment) and, under MPI, the same on every rank.
#include <array>
#include <cstdio>

#include "backend/cpu/gemm.h"
#include "cli/commands.h"
#include "comm/world.h"
#include "core/status.h"

namespace kestrel::cli {

void init_gemm_for_job() {
  static bool done = false;  // the SFT warm start runs inside kestrel train: once per process
  if (done) return;
  done = true;
  const comm::World* world = comm::World::current();
  const bool multi = world && world->size() > 1;
  // One machine: rank 0 measures (or reads the cache) first, the others then
  // find its cache file instead of measuring against each other.
  Status st;
  {
    const comm::UntimedCollectives measuring;  // rank 0's measurement takes seconds, more on a busy machine
    if (multi && world->rank() != 0) world->group()->barrier();
    st = cpu::gemm_init();
    if (multi && world->rank() == 0) world->group()->barrier();
  }
  if (!st.is_ok()) KS_FAIL(st.message());
  if (!multi) return;
  // Several machines: each measured its own; every rank takes rank 0's, so
  // replicated arithmetic rounds alike on all of them.
  const std::array<cpu::GemmProvider, 3> mine = cpu::gemm_choice();
  std::array<int32_t, 3> root{};
  for (size_t k = 0; k < 3; ++k) root[k] = int32_t(mine[k]);
  world->group()->broadcast(root.data(), 3, DType::I32, 0);
  std::array<cpu::GemmProvider, 3> chosen{};
  for (size_t k = 0; k < 3; ++k) chosen[k] = cpu::GemmProvider(root[k]);
  if (chosen == mine) return;
  if (Status a = cpu::adopt_gemm_choice(chosen, "rank 0's choice, adopted by rank " + std::to_string(world->rank()));
      !a.is_ok())
    KS_FAIL(a.message());
  std::fprintf(stderr, "GEMM: rank %d: %s\n", world->rank(), cpu::gemm_summary().c_str());
}

}  // namespace kestrel::cli
