// MoE / MLA models under mpirun (2 ranks; tests/scripts/mpi_moe.sh): data
// parallelism (plain and with the distributed optimizer) and pipeline
// parallelism (two stages) train the tiny transformers goldens (Qwen3-MoE,
// DeepSeek-V3 with MLA) exactly as one process does: 3 AdamW steps with the
// router losses and DeepSeek's aux-loss-free bias update on give the same
// losses and parameters (fp32, 1e-5 relative), and the correction biases,
// moved by loads summed over the dp ranks (or held by their stage), are the
// same bits as one process's.
#include <cmath>
#include <map>

#include "comm/world.h"
#include "common/testing.h"
#include "mpi_testing.h"
#include "train_testing.h"

using namespace kestrel;
using namespace kestrel::testing;

namespace {

model::ModelOptions options(const std::string& c) {
  model::ModelOptions o = golden_moe_options(c);
  if (c == "deepseek_v3") o.moe.bias_update_rate = 1e-3;
  return o;
}

TrainResult train3(const std::string& c, model::ModelOptions o, train::EngineParallel par, const std::vector<int>& mine) {
  return train_golden3(c, std::move(o), std::move(par), mine, 1e-2);
}

}  // namespace

TEST(MoeMpi, DataParallelEqualsOneProcess) {
  auto& w = kestrel::testing::world_group();
  if (w.size() != 2) GTEST_SKIP() << "needs 2 ranks";
  for (const char* c : {"qwen3_moe", "deepseek_v3"})
    for (bool distopt : {false, true}) {
      const std::string what = std::string(c) + (distopt ? " dp2 distributed optimizer" : " dp2");
      const TrainResult one = train3(c, options(c), {}, {0, 1, 2, 3});
      train::EngineParallel par;
      par.dp = comm::World::current()->group();
      par.distributed_optimizer = distopt;
      const int r = w.rank();
      const TrainResult dp = train3(c, options(c), par, {2 * r, 2 * r + 1});
      for (size_t s = 0; s < dp.losses.size(); ++s) {
        const double total = kestrel::testing::global_sum(w, dp.losses[s]);
        EXPECT_NEAR(total, one.losses[s], 1e-5 * std::abs(one.losses[s])) << what << " step " << s;
      }
      expect_equal_to_one_process(dp, one, what);
    }
}

TEST(MoeMpi, TwoPipelineStagesEqualOneProcess) {
  auto& w = kestrel::testing::world_group();
  if (w.size() != 2) GTEST_SKIP() << "needs 2 ranks";
  for (const char* c : {"qwen3_moe", "deepseek_v3"}) {
    const TrainResult one = train3(c, options(c), {}, {0, 1, 2, 3});
    model::ModelOptions o = options(c);
    o.parallel.pp = comm::World::current()->group();
    // 3 layers: stage 0 holds layer 0 with the embedding, stage 1 layers 1-2 and the head.
    const bool first = w.rank() == 0;
    o.first_layer = first ? 0 : 1;
    o.num_layers = first ? 1 : 2;
    o.has_embedding = first;
    o.has_head = !first;
    const TrainResult pp = train3(c, o, {}, {0, 1, 2, 3});
    for (size_t s = 0; s < pp.losses.size(); ++s)
      EXPECT_NEAR(pp.losses[s], one.losses[s], 1e-5 * std::abs(one.losses[s])) << c << " pp2 step " << s;
    expect_equal_to_one_process(pp, one, std::string(c) + " pp2");
  }
}
