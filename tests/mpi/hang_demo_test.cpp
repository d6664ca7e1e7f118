// Exercised only by tests/scripts/mpi_rank_death.sh (KESTREL_HANG_DEMO=1):
// rank 1 stops itself (SIGSTOP, as a hung or frozen process) while rank 0
// waits in a collective. The collective timeout must turn the hang into a
// report naming world rank 1 and the step, and abort the job.
#include <signal.h>

#include <cstdlib>

#include "comm/world.h"
#include "core/progress.h"
#include "mpi_testing.h"

using namespace kestrel;

TEST(HangDemo, StoppedRankIsNamedAfterTheTimeout) {
  const char* on = std::getenv("KESTREL_HANG_DEMO");
  if (!on || std::string(on) != "1") GTEST_SKIP() << "set KESTREL_HANG_DEMO=1 (tests/scripts/mpi_rank_death.sh)";
  auto& g = kestrel::testing::world_group();
  if (g.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  comm::World::current()->set_collective_timeout(3);
  set_progress(7, "update_actor");
  float x = 1;
  g.all_reduce(&x, 1, DType::F32, comm::ReduceOp::Sum);  // a healthy collective first
  EXPECT_EQ(x, float(g.size()));
  if (g.rank() == 1) raise(SIGSTOP);  // frozen: never reaches the next collective, never answers pings
  g.all_reduce(&x, 1, DType::F32, comm::ReduceOp::Sum);
  ADD_FAILURE() << "rank " << g.rank() << " left the collective";
}
