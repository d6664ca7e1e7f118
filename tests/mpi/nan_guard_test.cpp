// The NaN/Inf guard under mpirun (dp = world, with and without the
// distributed optimizer): a NaN gradient on one rank, or a non-finite loss on
// one rank with finite gradients everywhere, makes every rank skip the same
// update (the norm is global, the loss flag is reduced), leaving the weights
// bit for bit as they were and identical across ranks; K consecutive skips
// abort on every rank; under TP2 a NaN loss on one tp rank skips everywhere
// and reuse_fp32_param matches the layout without it. Run by
// tests/scripts/nan_guard_mpi.sh.
#include <cmath>

#include "model/parallel_setup.h"
#include "mpi_testing.h"
#include "parallel/setup.h"
#include "train/engine_testing.h"

using namespace kestrel;
using namespace kestrel::testing;
using namespace kestrel::train;
using namespace kestrel::train::engine_testing;

namespace {

EngineOptions dp_options(bool dist) {
  EngineOptions o = options();
  o.parallel.dp = comm::World::current()->group();
  o.parallel.distributed_optimizer = dist;
  return o;
}

// Every rank's weight bytes equal rank 0's (all-gathered as bytes).
bool same_on_every_rank(comm::ProcessGroup& g, const std::vector<uint8_t>& w) {
  std::vector<uint8_t> all(w.size() * size_t(g.size()));
  g.all_gather(w.data(), all.data(), int64_t(w.size()), DType::U8);
  for (int r = 1; r < g.size(); ++r)
    if (!std::equal(w.begin(), w.end(), all.begin() + long(size_t(r) * w.size()))) return false;
  return true;
}

}  // namespace

TEST(NanGuardMpi, ANanGradientOnOneRankSkipsOnEveryRank) {
  auto& g = world_group();
  const int bad_rank = g.size() - 1;
  for (bool dist : {true, false}) {
    auto m = model::CausalLM::init_random(tiny_config(), {}, 51);
    EngineOptions o = dp_options(dist);
    o.test_inject_nan_grad = [&](int64_t u) { return u == 2 && g.rank() == bad_rank; };
    TrainingEngine e(*m, o);
    const auto seqs = sequences(2 * g.size());
    for (int s = 1; s <= 3; ++s) {
      const std::vector<uint8_t> before = weight_bytes(*m);
      const MiniBatchResult r = e.train_mini_batch(split(seqs, 2), mean_nll(seqs), 1e-3, s);
      EXPECT_EQ(r.finite, s != 2) << "rank " << g.rank() << " step " << s;
      if (s == 2) {
        EXPECT_FALSE(r.grad_norm_finite);
        EXPECT_EQ(weight_bytes(*m), before) << "rank " << g.rank();
      }
      EXPECT_TRUE(same_on_every_rank(g, weight_bytes(*m))) << "step " << s;
    }
    EXPECT_EQ(e.skipped_steps(), 1);
    EXPECT_EQ(e.optimizer().step_count(), 2);
  }
}

TEST(NanGuardMpi, ANonFiniteLossOnOneRankSkipsOnEveryRank) {
  auto& g = world_group();
  for (bool dist : {true, false}) {
    auto m = model::CausalLM::init_random(tiny_config(), {}, 52);
    TrainingEngine e(*m, dp_options(dist));
    const auto seqs = sequences(2 * g.size());
    const ObjectiveFn nll = mean_nll(seqs);
    const std::vector<uint8_t> before = weight_bytes(*m);
    const MiniBatchResult r = e.train_mini_batch(
        split(seqs, 2),
        [&](const MicroBatch& mb, size_t i) {
          Objective o = nll(mb, i);
          if (g.rank() == 0) {  // finite gradients, a NaN loss on rank 0 only
            TokenObjective inner = o.tokens;
            o.tokens = [inner](const TokenView& t, float* dlp, float* dent) {
              inner(t, dlp, dent);
              return double(NAN);
            };
          }
          return o;
        },
        1e-3, 9);
    EXPECT_FALSE(r.finite) << "rank " << g.rank();
    EXPECT_FALSE(r.loss_finite) << "rank " << g.rank();
    EXPECT_TRUE(r.grad_norm_finite) << "rank " << g.rank();
    EXPECT_EQ(weight_bytes(*m), before);
    EXPECT_EQ(e.skipped_steps(), 1);
  }
}

TEST(NanGuardMpi, KConsecutiveSkipsAbortOnEveryRank) {
  auto& g = world_group();
  auto m = model::CausalLM::init_random(tiny_config(), {}, 53);
  EngineOptions o = dp_options(true);
  o.max_consecutive_skipped_steps = 2;
  o.test_inject_nan_grad = [&](int64_t) { return g.rank() == 0; };
  TrainingEngine e(*m, o);
  const auto seqs = sequences(2 * g.size());
  EXPECT_FALSE(e.train_mini_batch(split(seqs, 2), mean_nll(seqs), 1e-3, 1).finite);
  bool threw = false;
  try {
    e.train_mini_batch(split(seqs, 2), mean_nll(seqs), 1e-3, 2);
  } catch (const Error& err) {
    threw = std::string(err.what()).find("aborting at step 2") != std::string::npos;
  }
  EXPECT_TRUE(threw) << "rank " << g.rank();
  int32_t all = threw ? 1 : 0;
  g.all_reduce(&all, 1, DType::I32, comm::ReduceOp::Min);
  EXPECT_EQ(all, 1);
}

// TP2 (x dp = world/2, distributed optimizer, sequence parallelism): a NaN
// loss on one tp rank skips on every rank; bf16 with reuse_fp32_param trains
// bit for bit like the same layout without it.
TEST(NanGuardMpi, TensorParallelSkipsTogetherAndReuseMatches) {
  comm::World& world = *comm::World::current();
  if (world.size() % 2 != 0) GTEST_SKIP() << "tp 2 needs an even world";
  const io::ModelConfig cfg = tiny_config();
  auto grid_r = parallel::make_process_grid(world, parallel::dims_for(2, true), model::model_facts(cfg));
  ASSERT_TRUE(grid_r.is_ok()) << grid_r.status().message();
  parallel::ProcessGrid& grid = *grid_r.value();
  auto make = [&](DType dt) {
    model::ModelOptions mo;
    mo.dtype = dt;
    mo.parallel = model::model_parallel_for(grid);
    return model::CausalLM::init_random(cfg, mo, 61);
  };
  auto opts = [&](bool reuse) {
    EngineOptions o = options();
    o.parallel.dp = grid.group(parallel::GroupKind::Dp);
    o.parallel.distributed_optimizer = true;
    o.reuse_fp32_param = reuse;
    return o;
  };
  const auto seqs = sequences(4);
  {  // the loss is NaN on tp rank 1 only (its gradients are finite)
    auto m = make(DType::F32);
    TrainingEngine e(*m, opts(false));
    const ObjectiveFn nll = mean_nll(seqs);
    const std::vector<uint8_t> before = weight_bytes(*m);
    const MiniBatchResult r = e.train_mini_batch(
        split(seqs, 2),
        [&](const MicroBatch& mb, size_t i) {
          Objective o = nll(mb, i);
          if (grid.tp().rank() == 1) {
            TokenObjective inner = o.tokens;
            o.tokens = [inner](const TokenView& t, float* dlp, float* dent) {
              inner(t, dlp, dent);
              return double(NAN);
            };
          }
          return o;
        },
        1e-3, 1);
    EXPECT_FALSE(r.finite) << "world rank " << world.rank();
    EXPECT_FALSE(r.loss_finite);
    EXPECT_EQ(weight_bytes(*m), before);
  }
  {  // reuse_fp32_param under tp 2 with the distributed optimizer
    auto a = make(DType::BF16), b = make(DType::BF16);
    TrainingEngine plain(*a, opts(false)), reuse(*b, opts(true));
    for (int s = 0; s < 3; ++s) {
      const auto step_seqs = sequences(4, s);
      const MiniBatchResult ra = plain.train_mini_batch(split(step_seqs, 2), mean_nll(step_seqs), plain.lr(s), s + 1);
      const MiniBatchResult rb = reuse.train_mini_batch(split(step_seqs, 2), mean_nll(step_seqs), reuse.lr(s), s + 1);
      EXPECT_TRUE(ra.finite && rb.finite);
      EXPECT_EQ(ra.grad_norm, rb.grad_norm);
      EXPECT_EQ(weight_bytes(*a), weight_bytes(*b)) << "tp2 step " << s;
    }
  }
}
