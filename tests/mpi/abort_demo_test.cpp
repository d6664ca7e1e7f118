// Exercised only by tests/scripts/mpi_abort.sh (KESTREL_ABORT_DEMO=1): rank 1
// fails while rank 0 waits in a collective; comm::abort_world must take the
// whole job down instead of leaving rank 0 hanging.
#include <cstdlib>

#include "mpi_testing.h"

using namespace kestrel;

TEST(AbortDemo, ThrowingRankAbortsTheJob) {
  const char* on = std::getenv("KESTREL_ABORT_DEMO");
  if (!on || std::string(on) != "1") GTEST_SKIP() << "set KESTREL_ABORT_DEMO=1 (tests/scripts/mpi_abort.sh)";
  auto& g = kestrel::testing::world_group();
  if (g.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  if (g.rank() == 1) {
    try {
      KS_FAIL("abort demo: rank 1 failed on purpose");
    } catch (const std::exception& e) {
      comm::abort_world(e.what());
    }
    ADD_FAILURE() << "abort_world returned under MPI";
  } else {
    float x = 1;
    g.all_reduce(&x, 1, DType::F32, comm::ReduceOp::Sum);  // never completes: rank 1 is gone
    ADD_FAILURE() << "rank " << g.rank() << " left the collective";
  }
}
