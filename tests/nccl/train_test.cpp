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

struct Run {
  std::vector<train::MiniBatchResult> steps;
  std::vector<double> weights;  // this rank's shards, parameter after parameter
};

// Three updates; each dp rank trains its share of the 8 sequences (2 micro-batches),
// the objective carrying the whole mini-batch's token count.
Run three_steps(const Layout& l, DType dt, Device dev) {
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
  Run out;
  for (int s = 0; s < 3; ++s) {
    const auto all = sequences(8, s);
    const size_t per = all.size() / size_t(dp);
    const std::vector<std::vector<int32_t>> mine(all.begin() + long(per * size_t(r)),
                                                 all.begin() + long(per * size_t(r + 1)));
    out.steps.push_back(e.train_mini_batch(split(mine, (mine.size() + 1) / 2), mean_nll(all), e.lr(s), s + 1));
  }
  for (const model::Param* p : m->params())
    for (double x : to_double(p->weight)) out.weights.push_back(x);
  return out;
}

// As tests/on_device/train_on_device_test.cpp: f32 to float rounding of
// differently ordered sums, bf16 to a few ulps of 2^-8.
struct Tol {
  double scalar, weights;
};
Tol tol_for(DType dt) { return dt == DType::F32 ? Tol{2e-5, 1e-5} : Tol{2e-2, 4e-3}; }

void expect_same_training(const Layout& l, DType dt) {
  const Run cpu = three_steps(l, dt, Device::CPU), dev = three_steps(l, dt, Device::CUDA);
  const Tol tol = tol_for(dt);
  ASSERT_EQ(cpu.steps.size(), dev.steps.size());
  for (size_t s = 0; s < cpu.steps.size(); ++s) {
    EXPECT_TRUE(dev.steps[s].finite) << "step " << s;
    EXPECT_NEAR(dev.steps[s].loss, cpu.steps[s].loss, tol.scalar * std::abs(cpu.steps[s].loss)) << "step " << s;
    EXPECT_NEAR(dev.steps[s].grad_norm, cpu.steps[s].grad_norm, tol.scalar * cpu.steps[s].grad_norm) << "step " << s;
  }
  EXPECT_GT(cpu.steps[0].grad_norm, 0.5) << "clipping should act in this test";
  EXPECT_LE(rel_to_scale(dev.weights, cpu.weights), tol.weights);
}

class NcclTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_ready()) GTEST_SKIP() << "no device: " << cuda::describe();
  }
};

TEST_F(NcclTrain, Tp2EqualsTheCpu) { expect_same_training({2, false, false}, DType::F32); }
TEST_F(NcclTrain, Tp2SequenceParallelEqualsTheCpu) { expect_same_training({2, true, false}, DType::F32); }
TEST_F(NcclTrain, DpDistributedOptimizerEqualsTheCpu) { expect_same_training({1, false, true}, DType::F32); }

}  // namespace
}  // namespace kestrel::testing
