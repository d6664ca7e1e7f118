// Training on the device across processes: the same tiny Llama, mini-batches
// and AdamW steps (clipping on) under one parallel layout, once with the
// model on the CPU (groups over MPI) and once on the device (the grid built
// for it: device buffers over NCCL), must give the same losses, gradient
// norms and weights, within the tolerances of the one-process device test
// (tests/on_device/train_on_device_test.cpp: the GEMMs differ, so not bit for
// bit). Layouts: TP2, TP2 with sequence parallelism, and DP2 with the
// distributed optimizer; f32 (bf16 buffers are the collectives test's; a bf16
// layout costs 10 s more on the emulator). With 4 ranks "Tp2" is TP2 x DP2.
#include <gtest/gtest.h>

#include "model/parallel_setup.h"
#include "mpi/mpi_testing.h"
#include "nccl_testing.h"
#include "nccl_training.h"
#include "parallel/grid.h"
#include "train/engine.h"
#include "../train/engine_testing.h"

namespace kestrel::testing {
namespace {

using train::engine_testing::mean_nll;
using train::engine_testing::sequences;
using train::engine_testing::split;
using train::engine_testing::tiny_config;

struct Layout {
  int tp = 1;
  bool sp = false;
  bool distopt = false;
};

// Three updates; each dp rank trains its share of the 8 sequences (2 micro-batches),
// the objective carrying the whole mini-batch's token count.
TrainedRun three_steps(const Layout& l, DType dt, Device dev) {
  parallel::ParallelDims dims;
  dims.tp = l.tp;
  dims.sequence_parallel = l.sp;
  parallel::ProcessGrid grid(*comm::World::current(), dims, dev);
  model::ModelOptions mo;
  mo.dtype = dt;
  mo.device = dev;
  mo.parallel = model::model_parallel_for(grid);
  auto m = model::CausalLM::init_random(tiny_config(), mo, /*seed=*/7);
  train::EngineOptions eo = train::engine_testing::options(0.5);
  eo.parallel.dp = grid.group(parallel::GroupKind::Dp);
  eo.parallel.distributed_optimizer = l.distopt;
  train::TrainingEngine e(*m, eo);
  const int dp = grid.dp().size(), r = grid.dp().rank();
  TrainedRun out;
  for (int s = 0; s < 3; ++s) {
    const auto all = sequences(8, s);
    const size_t per = all.size() / size_t(dp);
    const std::vector<std::vector<int32_t>> mine(all.begin() + long(per * size_t(r)),
                                                 all.begin() + long(per * size_t(r + 1)));
    out.steps.push_back(e.train_mini_batch(split(mine, (mine.size() + 1) / 2), mean_nll(all), e.lr(s), s + 1));
  }
  out.weights = flat_weights(*m);
  return out;
}

void expect_layout_matches(const Layout& l, DType dt) {
  const TrainedRun cpu = three_steps(l, dt, Device::CPU), dev = three_steps(l, dt, Device::CUDA);
  const std::string what = "tp " + std::to_string(l.tp) + (l.sp ? " sp" : "") + (l.distopt ? " distopt" : "");
  expect_same_training(cpu, dev, train_tol(dt), 0.5, what);
}

class NcclTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_ready()) GTEST_SKIP() << "no device: " << cuda::describe();
  }
};

TEST_F(NcclTrain, Tp2EqualsTheCpu) { expect_layout_matches({2, false, false}, DType::F32); }
TEST_F(NcclTrain, Tp2SequenceParallelEqualsTheCpu) { expect_layout_matches({2, true, false}, DType::F32); }
TEST_F(NcclTrain, DpDistributedOptimizerEqualsTheCpu) { expect_layout_matches({1, false, true}, DType::F32); }

}  // namespace
}  // namespace kestrel::testing
