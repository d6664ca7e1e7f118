// Context and expert parallelism on the device across processes: the same
// model, micro-batches and 3 AdamW steps (clipping on) under one layout, once
// with the model on the CPU (groups over MPI) and once on the device (the
// grid built for it: device buffers over NCCL), must give the same losses,
// gradient norms and weights within train_test.cpp's tolerances (the GEMMs
// differ, so not bit for bit). f32, 2 ranks (ctest; run.sh with 4 ranks
// runs CP4, whose ring posts across three steps, and EP2 / ETP2 x DP2):
//  - CP2 Ulysses and CP2 ring (cp = the world's size) on a tiny Llama (4
//    query heads over 2 kv heads), one micro-batch a step of six sequences of
//    1 to 23 tokens (the zigzag split pads each to a multiple of 2cp); then
//    the trained model's scoring
//    (TrainingEngine::score: forward only, log-probs gathered over cp), equal
//    to the CPU's too. The ring's K/V and dK/dV travel point to point, which
//    NCCL matches by posting order only.
//  - EP2 on the tiny Qwen3-MoE golden (8 routed experts, 4 per rank; router
//    losses on) with the all-to-all dispatcher: each rank trains its own
//    micro-batch (dp 2), the rows go to their experts' ranks and back. (The
//    all-gather dispatcher's all-gather and reduce-scatter are the TP
//    layers' collectives; it is not run here to keep the emulator's time.)
//  - ETP2 apart from TP (tp 1): every expert's FFN split over both ranks,
//    the attention data-parallel.
#include <gtest/gtest.h>

#include "model/cp_batch.h"
#include "model/parallel_setup.h"
#include "mpi/mpi_testing.h"
#include "mpi/train_testing.h"
#include "nccl_testing.h"
#include "nccl_training.h"
#include "parallel/grid.h"
#include "train/engine.h"
#include "../train/engine_testing.h"

namespace kestrel::testing {
namespace {

using train::engine_testing::tiny_config;

struct Trained : TrainedRun {
  std::vector<std::vector<float>> logprobs;  // scoring of each micro-batch after training (cp only)
};

// train_test.cpp's f32 comparison, and the scoring's log-probs within its scalar tolerance.
void expect_same(const Trained& cpu, const Trained& dev, const std::string& what, double min_grad_norm) {
  const TrainTol tol = train_tol(DType::F32);
  expect_same_training(cpu, dev, tol, min_grad_norm, what);
  ASSERT_EQ(cpu.logprobs.size(), dev.logprobs.size()) << what;
  for (size_t i = 0; i < cpu.logprobs.size(); ++i) {
    const std::vector<double> c(cpu.logprobs[i].begin(), cpu.logprobs[i].end()),
        d(dev.logprobs[i].begin(), dev.logprobs[i].end());
    EXPECT_LE(rel_err(d, c), tol.scalar) << what << ": scoring of micro-batch " << i;
  }
}

// The device tests below, on an even number of ranks (2 by ctest, 4 by hand).
class NcclEvenRanks : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_ready()) GTEST_SKIP() << "no device: " << cuda::describe();
    if (comm::World::current()->group()->size() % 2) GTEST_SKIP() << "written for 2 or 4 ranks";
  }
};

// ---- context parallelism ----

// Sequences of 1 to 23 tokens inside the tiny vocabulary (24): none a
// multiple of 2 * cp, so every one ends in pad rows.
std::vector<std::vector<int32_t>> cp_sequences(int step) {
  std::vector<std::vector<int32_t>> out;
  static constexpr int kLengths[] = {5, 23, 1, 11, 2, 17};
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> s;
    const int n = kLengths[(i + step) % 6];
    for (int t = 0; t < n; ++t) s.push_back(int32_t(2 + (i * 7 + t * 3 + step * 5 + (t * t) % 7) % 22));
    out.push_back(std::move(s));
  }
  return out;
}

// Every rank is a cp rank (cp = the world's size, dp 1): all train the same
// micro-batch of each step (one: the emulator's time). With 4 ranks (run.sh's ranks argument) the
// ring has four places, so its transfers are posted across three steps.
Trained cp_three_steps(parallel::CpAlgo algo, Device dev) {
  comm::World& world = *comm::World::current();
  parallel::ParallelDims dims;
  dims.cp = world.group()->size();
  parallel::ProcessGrid grid(world, dims, dev);
  model::ModelOptions mo;
  mo.device = dev;
  mo.parallel = model::model_parallel_for(grid);
  model::set_context_parallel(mo.parallel, world, grid, algo, 0);
  auto m = model::CausalLM::init_random(tiny_config(), mo, /*seed=*/7);
  train::EngineOptions eo = train::engine_testing::options(0.5);
  eo.parallel.dp = grid.group(parallel::GroupKind::DpCp);
  train::TrainingEngine e(*m, eo);
  Trained out;
  std::vector<train::MicroBatch> last;
  for (int s = 0; s < 3; ++s) {
    const auto all = cp_sequences(s);
    const auto micro = train::engine_testing::split(all, all.size());
    out.steps.push_back(e.train_mini_batch(micro, train::engine_testing::mean_nll(all), e.lr(s), s + 1));
    last = micro;
  }
  out.weights = flat_weights(*m);
  // Scoring runs the forward alone (forward_inference) with the log-probs
  // gathered over cp: a path of its own.
  e.score(last, [&](size_t, const Tensor& lp) { out.logprobs.push_back(lp.to_float_vector()); });
  return out;
}

class NcclContextParallel : public NcclEvenRanks {};

TEST_F(NcclContextParallel, UlyssesEqualsTheCpu) {
  const Trained cpu = cp_three_steps(parallel::CpAlgo::Ulysses, Device::CPU);
  const Trained dev = cp_three_steps(parallel::CpAlgo::Ulysses, Device::CUDA);
  expect_same(cpu, dev, "ulysses cp" + std::to_string(comm::World::current()->group()->size()), 0.5);
}

TEST_F(NcclContextParallel, RingEqualsTheCpu) {
  const Trained cpu = cp_three_steps(parallel::CpAlgo::Ring, Device::CPU);
  const Trained dev = cp_three_steps(parallel::CpAlgo::Ring, Device::CUDA);
  expect_same(cpu, dev, "ring cp" + std::to_string(comm::World::current()->group()->size()), 0.5);
}

// ---- expert parallelism ----

struct EpCase {
  int ep = 1, etp = 1;
  model::MoeDispatcher dispatcher = model::MoeDispatcher::AllToAll;
};

// 3 AdamW steps of the Qwen3-MoE golden: micro-batch r of the four on dp rank
// r (one each: the emulator's time), the loss's scale counting all four.
Trained ep_three_steps(const EpCase& l, Device dev) {
  comm::World& world = *comm::World::current();
  parallel::ParallelDims dims;
  dims.ep = l.ep;
  dims.etp = l.etp;
  parallel::ProcessGrid grid(world, dims, dev);
  model::ModelOptions o = golden_moe_options("qwen3_moe");
  o.device = dev;
  o.moe.dispatcher = l.dispatcher;
  o.parallel = model::model_parallel_for(grid);
  o.parallel.etp = grid.group(parallel::GroupKind::Etp);
  auto loaded = model::CausalLM::load(golden_model("qwen3_moe"), o);
  EXPECT_TRUE(loaded.is_ok()) << loaded.status().message();
  if (!loaded.is_ok()) return {};
  model::CausalLM& m = *loaded.value();
  train::EngineOptions eo;
  eo.adamw.eps = 1e-5;  // as ep_tp_test: elements with gradients at rounding level take proportional steps
  eo.lr.lr = 1e-3;
  eo.lr.total_steps = 10;
  eo.clip_grad = 0.05;
  eo.parallel.dp = grid.group(parallel::GroupKind::Dp);
  eo.parallel.expert_dp = grid.group(parallel::GroupKind::Edp);
  train::TrainingEngine e(m, eo);
  const GoldenMicroBatches g = golden_micro_batches({eo.parallel.dp->rank()});
  Trained out;
  for (int s = 0; s < 3; ++s) out.steps.push_back(e.train_mini_batch(g.micro, g.objective, e.lr(s), s + 1));
  out.weights = flat_weights(m);
  return out;
}

class NcclExpertParallel : public NcclEvenRanks {};

TEST_F(NcclExpertParallel, Ep2AllToAllEqualsTheCpu) {
  const EpCase l{2, 1, model::MoeDispatcher::AllToAll};
  expect_same(ep_three_steps(l, Device::CPU), ep_three_steps(l, Device::CUDA), "ep2 alltoall", 0.05);
}

TEST_F(NcclExpertParallel, Etp2ApartFromTpEqualsTheCpu) {
  const EpCase l{1, 2, model::MoeDispatcher::AllToAll};
  expect_same(ep_three_steps(l, Device::CPU), ep_three_steps(l, Device::CUDA), "etp2 tp1", 0.05);
}

}  // namespace
}  // namespace kestrel::testing
