// Tensor parallelism of the MoE and MLA layers and expert tensor parallelism,
// with and without expert parallelism, under mpirun (tests/scripts/mpi_ep_tp.sh,
// 2 and 4 ranks): the etp exchange's gather and reduce-scatter are adjoint and
// deliver every rank's rows sorted by expert; one forward/backward under TP2
// gives one process's gradients; 3 AdamW steps of the tiny MoE goldens equal
// one process training all four micro-batches (every step's loss and every
// parameter, gathered whole, within 1e-5 of scale, f32; the DeepSeek
// correction biases bit for bit) under TP2 (sequence parallel), TP1 with the
// experts split over ETP2, TP2 with whole experts (ETP1), TP2 x DP2, EP2 x TP2
// (experts split over the tp group; also with the distributed optimizer), EP2
// with ETP2 (TP1, DP4) and EP2 x TP2 with ETP1.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>

#include "comm/world.h"
#include "common/testing.h"
#include "model/moe_mlp.h"
#include "model/parallel_setup.h"
#include "mpi_testing.h"
#include "ops/copy.h"
#include "parallel/comm_counter.h"
#include "parallel/etp_dispatch.h"
#include "parallel/grid.h"
#include "parallel/sharding.h"
#include "rollout/engine.h"
#include "rollout/reshard.h"
#include "../rollout/same_outputs.h"
#include "train_testing.h"

using namespace kestrel;
using namespace kestrel::testing;

namespace {

// The rows of rank s for local expert e: row i holds s * 1000 + e * 100 + i in every column.
Tensor expert_rows(int s, const std::vector<int64_t>& counts, int64_t D) {
  std::vector<float> v;
  for (size_t e = 0; e < counts.size(); ++e)
    for (int64_t i = 0; i < counts[e]; ++i)
      for (int64_t d = 0; d < D; ++d) v.push_back(float(s * 1000 + int64_t(e) * 100 + i));
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  return Tensor::from_host(v, {n, D});
}

std::vector<int64_t> counts_of(int s, int trial) {
  // Three local experts; some empty, rank sizes unequal (the padded all-gather's blocks differ).
  return {int64_t((s * 3 + trial) % 4), int64_t((s + 2 * trial) % 3), int64_t(s == 1 ? 0 : 2 + trial)};
}

}  // namespace

// etp_gather gives every rank's rows sorted by local expert, then source rank;
// etp_reduce_scatter of a gathered buffer gives back this rank's rows summed
// over the group (here n times them); and the two are adjoint:
// sum over ranks <gather(x), y> = sum over ranks <x, reduce_scatter(y)>.
TEST(EpTp, EtpGatherAndReduceScatterAreAdjoint) {
  auto& w = kestrel::testing::world_group();
  const int n = w.size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int64_t D = 3;
  for (int trial = 0; trial < 3; ++trial) {
    const std::vector<int64_t> mine = counts_of(w.rank(), trial);
    const parallel::EtpLayout L = parallel::etp_layout(w, mine);
    const Tensor x = expert_rows(w.rank(), mine, D);
    const Tensor all = parallel::etp_gather(w, L, x);
    std::vector<float> want;
    for (size_t e = 0; e < mine.size(); ++e)
      for (int s = 0; s < n; ++s) {
        const int64_t c = counts_of(s, trial)[e];
        for (int64_t i = 0; i < c; ++i)
          for (int64_t d = 0; d < D; ++d) want.push_back(float(s * 1000 + int64_t(e) * 100 + i));
      }
    EXPECT_EQ(all.to_float_vector(), want) << "trial " << trial;
    const Tensor back = parallel::etp_reduce_scatter(w, L, all);
    std::vector<float> times_n = x.to_float_vector();
    for (float& v : times_n) v *= float(n);
    EXPECT_EQ(back.to_float_vector(), times_n) << "trial " << trial;
    // Adjointness on random values.
    std::mt19937 rng(uint32_t(17 + w.rank() * 5 + trial));
    std::normal_distribution<float> nd;
    std::vector<float> xv(size_t(x.numel())), yv(size_t(all.numel()));
    for (float& v : xv) v = nd(rng);
    for (float& v : yv) v = nd(rng);
    const Tensor xr = Tensor::from_host(xv, x.shape()), yr = Tensor::from_host(yv, all.shape());
    const std::vector<float> gx = parallel::etp_gather(w, L, xr).to_float_vector();
    const std::vector<float> ry = parallel::etp_reduce_scatter(w, L, yr).to_float_vector();
    double lhs = 0, rhs = 0;
    for (size_t i = 0; i < gx.size(); ++i) lhs += double(gx[i]) * yv[i];
    for (size_t i = 0; i < ry.size(); ++i) rhs += double(xv[i]) * ry[i];
    lhs = global_sum(w, lhs);
    rhs = global_sum(w, rhs);
    EXPECT_NEAR(lhs, rhs, 1e-4 * (std::abs(lhs) + 1)) << "trial " << trial;
  }
}

// The etp exchange's bytes (parallel::CountingGroup, ring cost model): the
// layout all-gathers k i64 counts, the gather all-gathers each rank's block
// padded to the largest rank's rows, the reduce-scatter the same blocks back:
// (n-1) x (8k + 2 x block x D x dtype bytes) per rank, whatever its own rows.
TEST(EpTp, EtpExchangeBytesEqualTheFormula) {
  auto& w = kestrel::testing::world_group();
  const int n = w.size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  parallel::CountingGroup g(comm::World::current()->group());
  const int64_t D = 5;
  for (DType dt : {DType::F32, DType::BF16})
    for (int trial = 0; trial < 3; ++trial) {
      g.reset();
      const std::vector<int64_t> mine = counts_of(w.rank(), trial);
      const parallel::EtpLayout L = parallel::etp_layout(g, mine);
      const Tensor x = expert_rows(w.rank(), mine, D).to(dt);
      const Tensor all = parallel::etp_gather(g, L, x);
      parallel::etp_reduce_scatter(g, L, all);
      const double k = double(mine.size()), b = double(dtype_size(dt));
      const double want = double(n - 1) * (8.0 * k + 2.0 * double(L.block_rows) * double(D) * b);
      EXPECT_EQ(g.stats().of(parallel::CollectiveKind::AllGather).calls, 2);
      EXPECT_EQ(g.stats().of(parallel::CollectiveKind::ReduceScatter).calls, 1);
      EXPECT_EQ(g.stats().total_wire_bytes(), want) << dtype_name(dt) << " trial " << trial;
    }
}

namespace {

// Under tp every reduction sums in another order (the partial dx's
// reduce-scatter, the experts' rows gathered over the group): the gradients
// agree to ~1e-6 of scale (GradientsEqualOneProcess). Adam divides by
// sqrt(v), so on elements whose gradient is near zero (an expert a token
// barely reaches) that noise becomes a step of up to lr: as tp_model_test
// does, eps = 1e-5 bounds the amplification (~lr * noise / eps) while every
// real gradient still takes Adam-sized steps, and lr 1e-3 as ep_model_test.
constexpr double kLr = 1e-3, kAdamEps = 1e-5;

// The grid's model groups: tp (and sequence parallelism), pp, ep, etp.
void use_grid(model::ModelOptions& o, const parallel::ProcessGrid& grid) {
  o.parallel = model::model_parallel_for(grid);
  o.parallel.etp = grid.group(parallel::GroupKind::Etp);
}

// The grid of tp x ep (etp 0: tp's) over the world, sequence parallel under tp.
parallel::ParallelDims dims_of(int tp, int ep, int etp = 0) {
  parallel::ParallelDims d;
  d.tp = tp;
  d.ep = ep;
  d.etp = etp;
  d.sequence_parallel = tp > 1;
  return d;
}

// golden_moe_options with DeepSeek-V3's aux-loss-free bias update on.
model::ModelOptions moe_options(const std::string& c, bool capacity) {
  model::ModelOptions o = golden_moe_options(c, capacity);
  if (c == "deepseek_v3") o.moe.bias_update_rate = 1e-3;
  return o;
}

// 3 AdamW steps of golden `c` on the grid's layout (micro-batch i on dp rank i % dp); every tensor this
// rank holds gathered whole over tp, by name; the losses summed over dp.
TrainResult train_on_grid(const std::string& c, model::ModelOptions o, const parallel::ProcessGrid* grid,
                          double lr, bool distopt = false) {
  train::EngineParallel par;
  par.distributed_optimizer = distopt;
  std::vector<int> mine = {0, 1, 2, 3};
  if (grid) {
    use_grid(o, *grid);
    par.dp = grid->group(parallel::GroupKind::Dp);
    par.expert_dp = grid->group(parallel::GroupKind::Edp);
    mine.clear();
    for (int i = 0; i < 4; ++i)
      if (i % par.dp->size() == par.dp->rank()) mine.push_back(i);
  }
  auto m = model::CausalLM::load(golden_model(c), o);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  auto& model = *m.value();
  train::EngineOptions eo;
  eo.adamw.eps = kAdamEps;
  eo.lr.lr = lr;
  eo.lr.total_steps = 10;
  eo.parallel = par;
  train::TrainingEngine e(model, eo);
  const GoldenMicroBatches g = golden_micro_batches(mine);
  TrainResult r;
  for (int step = 0; step < 3; ++step) {
    double loss = e.train_mini_batch(g.micro, g.objective, e.lr(step)).loss;
    if (par.dp) loss = global_sum(*par.dp, loss);
    r.losses.push_back(loss);
  }
  for (model::Param* p : model.params())
    r.tensors[p->name] = to_double(model.shard_group(*p).size() > 1 ? model.full_tensor(*p) : p->weight);
  for (model::Param* p : model.buffers()) r.tensors[p->name] = to_double(p->weight);
  return r;
}

}  // namespace

namespace {
struct GradPass {
  double loss = 0;
  std::vector<double> logprob;
  std::map<std::string, std::vector<double>> grads;  // gathered whole over each tensor's shard group
};

// One forward and backward of micro-batch 0 (a fixed weight per token): the
// loss, the log-probs and every gradient this rank holds, gathered whole.
GradPass grads_of(const std::string& c, model::ModelOptions o, const parallel::ProcessGrid* grid,
                  const std::vector<std::vector<int32_t>>& seqs) {
  if (grid) use_grid(o, *grid);
  auto m = model::CausalLM::load(golden_model(c), o);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  auto& model = *m.value();
  model.enable_grads();
  model.zero_grads();
  const model::PackedBatch b = model::pack_sequences(seqs);
  const train::ForwardBackwardResult r =
      train::forward_backward(model, b, train::cross_entropy_objective(token_weights(b, 0.05f)));
  GradPass g;
  g.loss = r.loss;
  g.logprob = to_double(r.logprob);
  for (model::Param* p : model.params()) {
    comm::ProcessGroup& sg = model.shard_group(*p);
    g.grads[p->name] = to_double(sg.size() > 1 ? parallel::gather_tensor(sg, p->grad, p->shard, p->full_shape) : p->grad);
  }
  return g;
}
}  // namespace

// The loss, log-probs and gradients themselves (no optimizer in between), every
// rank on the same micro-batch (an odd token count: under SP the last rank's
// rows end in padding), against one process: TP2 on all four MoE goldens with
// and without capacity (2 ranks); EP2 x TP2 and EP2 with ETP2 (TP1) on Qwen3-MoE
// and DeepSeek-V3, and TP4 on 3 tokens (the last rank routes no row of its
// own, its etp share empty) on Qwen3-MoE and Qwen2-MoE (4 ranks). A routed expert receives the rows of every data-
// parallel replica feeding it (dp / edp of them, each with the same batch), so
// its gradient is that many times one process's. Loss and log-probs 1e-6,
// gradients 1e-5 of scale (they agree to ~1e-6: every reduction sums in another order).
TEST(EpTp, GradientsEqualOneProcess) {
  comm::World& world = *comm::World::current();
  const int n = world.group()->size();
  if (n != 2 && n != 4) GTEST_SKIP() << "written for 2 and 4 ranks";
  struct Case {
    int tp, ep, etp;
    std::vector<std::string> models;
    bool short_batch = false;  // 3 tokens: under TP4 the last rank holds no row of its own (only padding)
  };
  std::vector<Case> cases;
  if (n == 2) cases.push_back({2, 1, 0, {"qwen3_moe", "deepseek_v3", "qwen2_moe", "deepseek_v2"}});
  else cases = {{2, 2, 0, {"qwen3_moe", "deepseek_v3"}}, {1, 2, 2, {"qwen3_moe", "deepseek_v3"}},
                {4, 1, 0, {"qwen3_moe", "qwen2_moe"}, true}};
  double worst = 0;
  for (const Case& k : cases) {
    const parallel::ParallelDims d = dims_of(k.tp, k.ep, k.etp);
    const parallel::ProcessGrid grid(world, d);
    const double feeds = double(grid.layout().dp()) / double(grid.layout().edp());
    for (const std::string& c : k.models)
      for (bool capacity : {false, true}) {
        if (capacity && n == 4) continue;
        const std::string what = c + " tp" + std::to_string(k.tp) + " ep" + std::to_string(k.ep) + " etp" +
                                 std::to_string(d.expert_tp()) + (capacity ? " capacity 1 padded" : "") +
                                 (k.short_batch ? " 3 tokens" : "");
        const std::vector<std::vector<int32_t>> seqs =
            k.short_batch ? std::vector<std::vector<int32_t>>{{5, 17, 29}} : golden_micro_sequences()[0];
        const GradPass one = grads_of(c, moe_options(c, capacity), nullptr, seqs);
        const GradPass got = grads_of(c, moe_options(c, capacity), &grid, seqs);
        EXPECT_NEAR(got.loss, one.loss, 1e-6 * std::abs(one.loss)) << what;
        EXPECT_LE(rel_err(got.logprob, one.logprob), 1e-6) << what << ": log-probs";
        for (const auto& [name, g] : got.grads) {
          auto it = one.grads.find(name);
          ASSERT_TRUE(it != one.grads.end()) << what << ": " << name;
          std::vector<double> want = it->second;
          if (model::is_routed_expert_param(name))
            for (double& v : want) v *= feeds;
          const double e = rel_err(g, want);
          worst = std::max(worst, e);
          EXPECT_LE(e, 1e-5) << what << ": gradient of " << name;
        }
      }
  }
  if (world.group()->rank() == 0) std::printf("[ measured ] gradients: largest difference %.3g of scale\n", worst);
}

TEST(EpTp, TrainingEqualsOneProcess) {
  comm::World& world = *comm::World::current();
  const int n = world.group()->size();
  if (n != 2 && n != 4) GTEST_SKIP() << "written for 2 and 4 ranks";
  struct Case {
    int tp, ep, etp;  // etp 0: tp's
    std::vector<std::string> models;
    bool capacity;
    bool distopt = false;  // the distributed optimizer (dense state over dp, the experts' over edp)
  };
  std::vector<Case> cases;
  if (n == 2) {
    cases.push_back({2, 1, 0, {"qwen3_moe", "deepseek_v3", "qwen2_moe", "deepseek_v2"}, false});
    cases.push_back({2, 1, 0, {"qwen3_moe"}, true});
    cases.push_back({1, 1, 2, {"qwen3_moe", "deepseek_v3"}, false});  // experts split, attention data-parallel
    cases.push_back({2, 1, 1, {"qwen2_moe"}, false});                 // attention split, experts whole
  } else {
    cases.push_back({2, 2, 0, {"qwen3_moe", "deepseek_v3"}, false});  // EP2 x TP2
    cases.push_back({1, 2, 2, {"qwen3_moe", "deepseek_v3"}, false});  // EP2 with ETP2 (TP1 DP4)
    cases.push_back({2, 2, 0, {"deepseek_v3"}, false, true});         // EP2 x TP2, distributed optimizer
    cases.push_back({2, 2, 1, {"qwen3_moe", "deepseek_v3"}, false});  // EP2 x TP2 with whole experts
    cases.push_back({2, 1, 0, {"deepseek_v3", "qwen2_moe"}, false});  // TP2 x DP2
  }
  for (const Case& k : cases) {
    const parallel::ParallelDims d = dims_of(k.tp, k.ep, k.etp);
    const parallel::ProcessGrid grid(world, d);
    for (const std::string& c : k.models) {
      const std::string what = c + " tp" + std::to_string(k.tp) + " ep" + std::to_string(k.ep) + " etp" +
                               std::to_string(d.expert_tp()) + " dp" + std::to_string(n / k.tp) +
                               (k.capacity ? " capacity 1 padded" : "") + (k.distopt ? " distopt" : "");
      const TrainResult one = train_on_grid(c, moe_options(c, k.capacity), nullptr, kLr);
      const TrainResult got = train_on_grid(c, moe_options(c, k.capacity), &grid, kLr, k.distopt);
      ASSERT_EQ(got.losses.size(), one.losses.size());
      for (size_t s = 0; s < got.losses.size(); ++s)
        EXPECT_NEAR(got.losses[s], one.losses[s], 1e-5 * std::abs(one.losses[s])) << what << " step " << s;
      const double worst = expect_equal_to_one_process(got, one, what);
      if (world.group()->rank() == 0)
        std::printf("[ measured ] %s: largest parameter difference %.3g of scale\n", what.c_str(), worst);
    }
  }
}

// The whole-model paths under TP2 (2 ranks) and EP2 x TP2 (4 ranks): saving
// gathers every tensor (each expert over its tp group, then over the ep
// group) into one HF folder, and the rollout's whole-model copy (tp 1, every
// expert) receives every tensor; both hold the loaded golden's values bit for bit (f32).
TEST(EpTp, SavingAndRolloutWeightsGatherEveryTensor) {
  comm::World& world = *comm::World::current();
  auto& w = *world.group();
  if (w.size() != 2 && w.size() != 4) GTEST_SKIP() << "written for 2 and 4 ranks";
  const parallel::ParallelDims d = dims_of(2, w.size() / 2);
  const parallel::ProcessGrid grid(world, d);
  for (const std::string c : {"qwen3_moe", "deepseek_v3"}) {
    const std::string what = c + " tp2 ep" + std::to_string(d.ep);
    model::ModelOptions o;
    use_grid(o, grid);
    auto m = model::CausalLM::load(golden_model(c), o);
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    auto orig = model::CausalLM::load(golden_model(c), model::ModelOptions{});
    ASSERT_TRUE(orig.is_ok());
    std::map<std::string, std::vector<double>> want;
    for (model::Param* p : orig.value()->state_tensors()) want[p->name] = to_double(p->weight);
    const auto expect_whole = [&](const model::CausalLM& got, const std::string& where) {
      const auto ts = const_cast<model::CausalLM&>(got).state_tensors();
      EXPECT_EQ(ts.size(), want.size()) << what << " " << where;
      for (const model::Param* p : ts) {
        auto it = want.find(p->name);
        ASSERT_TRUE(it != want.end()) << what << " " << where << ": " << p->name;
        EXPECT_EQ(to_double(p->weight), it->second) << what << " " << where << ": " << p->name;
      }
    };
    // Saving: collective over the world; tp rank 0 of ep rank 0 writes.
    const std::string dir = (std::filesystem::temp_directory_path() / ("kestrel_ep_tp_save_" + c)).string();
    if (w.rank() == 0) std::filesystem::remove_all(dir);
    w.barrier();
    const Status s = m.value()->save(dir, DType::F32);
    ASSERT_TRUE(s.is_ok()) << s.message();
    w.barrier();
    auto saved = model::CausalLM::load(dir, model::ModelOptions{});
    ASSERT_TRUE(saved.is_ok()) << saved.status().message();
    expect_whole(*saved.value(), "saved folder");
    w.barrier();
    if (w.rank() == 0) std::filesystem::remove_all(dir);
    // The rollout's copy: tp 1, every expert.
    rollout::RolloutWeightsOptions ro;
    ro.tp = comm::local_group("rollout_tp");
    auto rw = rollout::RolloutWeights::create(*m.value(), ro);
    expect_whole(rw->model(), "rollout copy");
  }
}

// The layout-independent optimizer checkpoint under EP2 x TP2 with the
// distributed optimizer (4 ranks; each expert's state gathered over its tp
// group, then the ep group): after 2 steps it holds one process's names and
// shapes, its state within 1e-5 of scale (f32); one process's file loaded
// under EP2 x TP2 (cut over tp, scattered over edp and ep) and saved again
// gives it back bit for bit, f32 and bf16 (the held f32 masters included).
TEST(EpTp, OptimizerCheckpointMovesBetweenOneProcessAndEp2Tp2) {
  comm::World& world = *comm::World::current();
  comm::ProcessGroup& w = *world.group();
  if (w.size() != 4) GTEST_SKIP() << "written for 4 ranks (EP2 x TP2)";
  const parallel::ProcessGrid grid(world, dims_of(2, 2));
  const auto engine_opts = [&](bool parallel_layout) {
    train::EngineOptions eo;
    eo.adamw.eps = kAdamEps;
    eo.lr.lr = kLr;
    eo.lr.total_steps = 10;
    if (parallel_layout) {
      eo.parallel.dp = grid.group(parallel::GroupKind::Dp);
      eo.parallel.expert_dp = grid.group(parallel::GroupKind::Edp);
      eo.parallel.distributed_optimizer = true;
    }
    return eo;
  };
  const auto train2_and_save = [&](train::TrainingEngine& e, const std::vector<int>& mine, const std::string& dir) {
    const GoldenMicroBatches g = golden_micro_batches(mine);
    for (int step = 0; step < 2; ++step) EXPECT_TRUE(e.train_mini_batch(g.micro, g.objective, e.lr(step)).finite);
    const Status st = e.save_optimizer_dir(dir);
    EXPECT_TRUE(st.is_ok()) << st.message();
  };
  for (DType dt : {DType::F32, DType::BF16})
    for (const std::string c : {"qwen3_moe", "deepseek_v3"}) {
      SCOPED_TRACE(c + " " + dtype_name(dt));
      model::ModelOptions o = moe_options(c, false);
      o.moe.bias_update_rate = 0;
      o.dtype = dt;
      const std::string one_dir = shared_dir("kestrel_ep_tp_", "one");
      {  // one process on every rank alike; rank 0's folder is the one read back
        auto m = model::CausalLM::load(golden_model(c), o);
        ASSERT_TRUE(m.is_ok()) << m.status().message();
        train::TrainingEngine e(*m.value(), engine_opts(false));
        // The other ranks write a folder of their own (not collective: one process each).
        const std::string own =
            (std::filesystem::temp_directory_path() / ("kestrel_ep_tp_one_" + std::to_string(::getpid()))).string();
        if (w.rank() != 0) std::filesystem::create_directories(own);
        train2_and_save(e, {0, 1, 2, 3}, w.rank() == 0 ? one_dir : own);
        if (w.rank() != 0) std::filesystem::remove_all(own);
      }
      w.barrier();
      use_grid(o, grid);
      const std::string ep_dir = shared_dir("kestrel_ep_tp_", "ep");
      {
        auto m = model::CausalLM::load(golden_model(c), o);
        ASSERT_TRUE(m.is_ok()) << m.status().message();
        train::TrainingEngine e(*m.value(), engine_opts(true));
        const auto dp = grid.group(parallel::GroupKind::Dp);
        train2_and_save(e, {dp->rank(), dp->rank() + 2}, ep_dir);
      }
      w.barrier();
      const auto one = read_state(one_dir), ep = read_state(ep_dir);
      expect_state_like(one, ep, dt == DType::F32, "EP2 x TP2");
      const std::string again = shared_dir("kestrel_ep_tp_", "again");
      {
        auto m = model::CausalLM::load(golden_model(c), o);
        ASSERT_TRUE(m.is_ok()) << m.status().message();
        train::TrainingEngine e(*m.value(), engine_opts(true));
        const Status ls = e.load_optimizer_dir(one_dir);
        EXPECT_TRUE(ls.is_ok()) << ls.message();
        EXPECT_EQ(e.optimizer().step_count(), 2);
        const Status ss = e.save_optimizer_dir(again);
        EXPECT_TRUE(ss.is_ok()) << ss.message();
      }
      w.barrier();
      const auto back = read_state(again);
      expect_state_equal(one, back, "one process -> EP2 x TP2 distopt -> file");
    }
}

namespace {
rollout::EngineConfig rollout_config() {
  rollout::EngineConfig c;
  c.block_size = 8;
  c.num_blocks = 64;
  c.max_num_batched_tokens = 24;  // long prompts prefill in chunks, some steps mixed with decodes
  c.max_num_seqs = 16;
  return c;
}

// Greedy requests; `replica` varies their number, prompts and lengths.
std::vector<rollout::RequestOutput> greedy(const model::CausalLM& m, int replica = 0) {
  auto e = rollout::Engine::create(m, rollout_config());
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  if (!e.is_ok()) return {};
  for (int i = 0; i < 5 - 2 * replica; ++i) {
    std::vector<int32_t> p;
    for (int t = 0; t < 6 + (i * 7 + replica * 5) % 19; ++t) p.push_back(int32_t(1 + (i * 13 + t * 7 + replica) % 90));
    rollout::SamplingParams s;
    s.temperature = 0;
    s.max_tokens = 6 + i + 3 * replica;
    s.ignore_eos = true;
    EXPECT_TRUE((*e)->add_request("r" + std::to_string(i), p, s).is_ok());
  }
  return (*e)->run_to_completion();
}
}  // namespace

// The rollout engine on MoE and MLA models under tensor parallelism (the
// world as the tp group: TP2, TP4; no sequence parallelism, every row on
// every rank): heads and expert FFNs split over tp, the MoE output's partial
// sums all-reduced, MLA's latent cache on every rank. Greedy tokens equal one
// process's engine, log-probs within 1e-5 (f32).
TEST(EpTp, RolloutUnderTpEqualsOneProcess) {
  auto& w = world_group();
  if (w.size() != 2 && w.size() != 4) GTEST_SKIP() << "written for 2 and 4 ranks";
  for (const std::string c : {"qwen3_moe", "deepseek_v3", "qwen2_moe", "deepseek_v2"}) {
    SCOPED_TRACE(c + " tp" + std::to_string(w.size()));
    model::ModelOptions o;
    o.parallel.tp = comm::World::current()->group();
    auto tp_model = model::CausalLM::load(golden_model(c), o);
    auto one_model = model::CausalLM::load(golden_model(c), model::ModelOptions{});
    ASSERT_TRUE(tp_model.is_ok() && one_model.is_ok()) << (tp_model.is_ok() ? "" : tp_model.status().message());
    rollout::testing::expect_same_outputs(greedy(*tp_model.value()), greedy(*one_model.value()), 1e-5,
                                          c + " tp" + std::to_string(w.size()));
  }
}

// The expert-parallel rollout on the actor's EP2 x TP2 layout (4 ranks, the
// experts read in place, each split over its tp group): each dp replica's
// engine (its own requests, more on one than the other) steps in lockstep
// with its ep peers; greedy tokens equal one process's, log-probs within 1e-5.
TEST(EpTp, RolloutUnderEp2Tp2EqualsOneProcess) {
  comm::World& world = *comm::World::current();
  if (world.group()->size() != 4) GTEST_SKIP() << "written for 4 ranks (EP2 x TP2)";
  const parallel::ProcessGrid grid(world, dims_of(2, 2));
  const int replica = grid.group(parallel::GroupKind::Dp)->rank();
  for (const std::string c : {"qwen3_moe", "deepseek_v3"}) {
    SCOPED_TRACE(c + " ep2 tp2");
    model::ModelOptions o;
    use_grid(o, grid);
    auto ep_model = model::CausalLM::load(golden_model(c), o);
    auto one_model = model::CausalLM::load(golden_model(c), model::ModelOptions{});
    ASSERT_TRUE(ep_model.is_ok() && one_model.is_ok()) << (ep_model.is_ok() ? "" : ep_model.status().message());
    rollout::testing::expect_same_outputs(greedy(*ep_model.value(), replica), greedy(*one_model.value(), replica),
                                          1e-5, c + " ep2 tp2 replica " + std::to_string(replica));
  }
}
