// Expert parallelism with the distributed optimizer (tests/scripts/mpi_ep_train.sh,
// 4 ranks: EP2 x DP2, so each expert is held by an expert-data-parallel
// group of 2): the dense AdamW state sharded over dp, the experts' over edp.
//  - 3 AdamW steps of the tiny Qwen3-MoE and DeepSeek-V3 goldens (router
//    losses, DeepSeek's bias update) equal one process training all four
//    micro-batches (losses, every parameter 1e-5 of scale), and the experts'
//    optimizer owns only its edp share.
//  - The layout-free optimizer checkpoint: the EP2 x DP2 distopt file holds
//    the same names and shapes as one process's, its state within 1e-5 of
//    scale (f32); one process's file loaded under EP2 x DP2 distopt (scattered
//    over edp and ep) and saved again (gathered) gives it back bit for bit,
//    f32 and bf16 (the experts' held f32 masters included).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "comm/world.h"
#include "common/testing.h"
#include "io/safetensors.h"
#include "model/moe_mlp.h"
#include "mpi_testing.h"
#include "optim/adamw.h"
#include "train/optimizer_checkpoint.h"
#include "train_testing.h"

using namespace kestrel;
using namespace kestrel::testing;
namespace fs = std::filesystem;

namespace {

constexpr double kLr = 1e-3;

struct EpGroups {
  std::shared_ptr<comm::ProcessGroup> ep, edp;
};

// Megatron's order: the ep ranks consecutive, the expert-data-parallel ranks across them.
EpGroups ep2_groups() {
  comm::World& world = *comm::World::current();
  const int r = world.group()->rank();
  return {world.split(r / 2, r, "ep"), world.split(r % 2, r, "edp")};
}

model::ModelOptions moe_options(const std::string& c, DType dt) {
  model::ModelOptions o = golden_moe_options(c);
  o.dtype = dt;
  return o;
}

// Two steps on micro-batches `mine` of the four, then the optimizer state into `dir`.
void train2_and_save(train::TrainingEngine& e, const std::vector<int>& mine, const std::string& dir) {
  const GoldenMicroBatches g = golden_micro_batches(mine);
  for (int step = 0; step < 2; ++step)
    EXPECT_TRUE(e.train_mini_batch(g.micro, g.objective, e.lr(step), step + 1).finite);
  const Status st = e.save_optimizer_dir(dir);
  EXPECT_TRUE(st.is_ok()) << st.message();
}

train::EngineOptions engine_options(const train::EngineParallel& par) {
  train::EngineOptions eo;
  eo.lr.lr = kLr;
  eo.lr.total_steps = 10;
  eo.parallel = par;
  return eo;
}

train::EngineParallel ep2_dp2_distopt(const EpGroups& g) {
  train::EngineParallel par;
  par.dp = comm::World::current()->group();
  par.expert_dp = g.edp;
  par.distributed_optimizer = true;
  return par;
}

}  // namespace

TEST(EpDistOpt, TrainingEqualsOneProcess) {
  comm::ProcessGroup& w = world_group();
  if (w.size() != 4) GTEST_SKIP() << "written for 4 ranks (EP2 x DP2)";
  const EpGroups g = ep2_groups();
  for (const char* c : {"qwen3_moe", "deepseek_v3"}) {
    const std::string what = std::string(c) + " ep2 x dp2 distributed optimizer";
    model::ModelOptions o = moe_options(c, DType::F32);
    if (std::string(c) == "deepseek_v3") o.moe.bias_update_rate = 1e-3;
    const TrainResult one = train_golden3(c, o, {}, {0, 1, 2, 3}, kLr);
    o.parallel.ep = g.ep;
    const TrainResult got = train_golden3(c, o, ep2_dp2_distopt(g), {w.rank()}, kLr);
    for (size_t s = 0; s < got.losses.size(); ++s) {
      const double total = global_sum(w, got.losses[s]);
      EXPECT_NEAR(total, one.losses[s], 1e-5 * std::abs(one.losses[s])) << what << " step " << s;
    }
    const double worst = expect_equal_to_one_process(got, one, what);
    if (w.rank() == 0) std::printf("[ measured ] %s: largest parameter difference %.3g of scale\n", what.c_str(), worst);
  }
}

TEST(EpDistOpt, ExpertStateIsShardedOverEdp) {
  comm::ProcessGroup& w = world_group();
  if (w.size() != 4) GTEST_SKIP() << "written for 4 ranks (EP2 x DP2)";
  const EpGroups g = ep2_groups();
  model::ModelOptions o = moe_options("qwen3_moe", DType::BF16);
  o.parallel.ep = g.ep;
  auto m = model::CausalLM::load(golden_model("qwen3_moe"), o);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  train::TrainingEngine e(*m.value(), engine_options(ep2_dp2_distopt(g)));
  const optim::AdamW* ex = e.expert_optimizer();
  ASSERT_NE(ex, nullptr);
  // Each edp rank steps about half of its ep rank's experts, holding m, v and the f32 master for them only.
  const int64_t owned = ex->state_end() - ex->state_begin();
  EXPECT_LE(owned, (ex->numel() + 1) / 2);
  EXPECT_GT(owned, 0);
  EXPECT_TRUE(ex->holds_masters());
  EXPECT_EQ(ex->memory().total_bytes(), 12 * owned);
  for (const optim::ParamSlot& s : ex->params()) EXPECT_TRUE(model::is_routed_expert_param(s.name)) << s.name;
  for (const optim::ParamSlot& s : e.optimizer().params()) EXPECT_FALSE(model::is_routed_expert_param(s.name)) << s.name;
}

TEST(EpDistOpt, CheckpointMovesBetweenOneProcessAndEp2Dp2) {
  comm::ProcessGroup& w = world_group();
  if (w.size() != 4) GTEST_SKIP() << "written for 4 ranks (EP2 x DP2)";
  const EpGroups g = ep2_groups();
  for (DType dt : {DType::F32, DType::BF16})
    for (const char* c : {"qwen3_moe", "deepseek_v3"}) {
      const std::string what = std::string(c) + " " + dtype_name(dt);
      SCOPED_TRACE(what);
      model::ModelOptions o = moe_options(c, dt);
      // One process (on every rank alike; rank 0's folder is the one read back).
      const std::string one_dir = shared_dir("kestrel_ep_distopt_", "one");
      {
        auto m = model::CausalLM::load(golden_model(c), o);
        ASSERT_TRUE(m.is_ok()) << m.status().message();
        train::TrainingEngine e(*m.value(), engine_options({}));
        // The other ranks write a folder of their own (not collective: one process each).
        const std::string own = (fs::temp_directory_path() / ("kestrel_ep_distopt_one_" + std::to_string(::getpid()))).string();
        if (w.rank() != 0) fs::create_directories(own);
        train2_and_save(e, {0, 1, 2, 3}, w.rank() == 0 ? one_dir : own);
        if (w.rank() != 0) fs::remove_all(own);
      }
      w.barrier();
      o.parallel.ep = g.ep;
      // EP2 x DP2 distopt writes the same names and shapes, the state close to one process's (f32).
      const std::string ep_dir = shared_dir("kestrel_ep_distopt_", "ep");
      {
        auto m = model::CausalLM::load(golden_model(c), o);
        ASSERT_TRUE(m.is_ok()) << m.status().message();
        train::TrainingEngine e(*m.value(), engine_options(ep2_dp2_distopt(g)));
        train2_and_save(e, {w.rank()}, ep_dir);
      }
      w.barrier();
      const auto one = read_state(one_dir), ep = read_state(ep_dir);
      expect_state_like(one, ep, dt == DType::F32, "EP2 x DP2 distopt");
      // One process's file scattered into EP2 x DP2 distopt and gathered again: bit for bit.
      const std::string again = shared_dir("kestrel_ep_distopt_", "again");
      {
        auto m = model::CausalLM::load(golden_model(c), o);
        ASSERT_TRUE(m.is_ok()) << m.status().message();
        train::TrainingEngine e(*m.value(), engine_options(ep2_dp2_distopt(g)));
        const Status ls = e.load_optimizer_dir(one_dir);
        EXPECT_TRUE(ls.is_ok()) << ls.message();
        EXPECT_EQ(e.optimizer().step_count(), 2);
        EXPECT_EQ(e.expert_optimizer()->step_count(), 2);
        const Status ss = e.save_optimizer_dir(again);
        EXPECT_TRUE(ss.is_ok()) << ss.message();
      }
      w.barrier();
      const auto back = read_state(again);
      expect_state_equal(one, back, "one process -> EP2 x DP2 distopt -> file");
    }
}
