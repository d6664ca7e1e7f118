// main() of mpi_tests: initialises MPI through comm::World (even when started
// without mpirun, as a 1-rank world), runs the tests on every rank and exits
// non-zero on every rank when any rank failed. Rank 0 prints gtest's usual
// output; the other ranks print only their failures, prefixed "[rank R]".
#include <gtest/gtest.h>

#include <cstdio>
#include <exception>

#include "comm/world.h"

namespace {

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.message());
  }
  void OnTestEnd(const ::testing::TestInfo& t) override {
    if (t.result()->Failed())
      std::fprintf(stderr, "[rank %d] [  FAILED  ] %s.%s\n", rank_, t.test_suite_name(), t.name());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  try {
    kestrel::comm::WorldOptions opts;
    opts.mpi = kestrel::comm::MpiMode::Always;
    kestrel::comm::World world(opts, &argc, &argv);
    if (world.rank() != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new FailurePrinter(world.rank()));
    }
    int32_t failed = RUN_ALL_TESTS() != 0;
    world.group()->all_reduce(&failed, 1, kestrel::DType::I32, kestrel::comm::ReduceOp::Max);
    if (failed && world.rank() == 0) std::fprintf(stderr, "mpi_tests: a test failed on some rank\n");
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    kestrel::comm::abort_world(e.what());
    return 1;
  }
}
