// reuse_fp32_param under mpirun (dp = world, tp = 1), through
// train::TrainingEngine: with the distributed optimizer (each rank holds
// residuals for its owned range only; the all-gather moves the bf16 halves)
// and with the plain all-reduce, bf16 training with reuse equals the same
// layout without it bit for bit over several AdamW steps (weights on every
// rank, the owned masters), the optimizer state is 2 bytes per owned
// parameter less (summed over ranks: 2 per parameter), and each rank's
// optimizer file resumes bit for bit. Run by tests/scripts/nan_guard_mpi.sh.
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "mpi_testing.h"
#include "train/checkpoint.h"
#include "train/engine_testing.h"

using namespace kestrel;
using namespace kestrel::testing;
using namespace kestrel::train;
using namespace kestrel::train::engine_testing;

namespace {

std::unique_ptr<model::CausalLM> bf16_model(uint64_t seed) {
  model::ModelOptions mo;
  mo.dtype = DType::BF16;
  return model::CausalLM::init_random(tiny_config(), mo, seed);
}

// This rank's sequences of step s (i % dp == rank) and the objective with the
// whole batch's token count as its denominator (the gradients are summed over dp).
struct Share {
  std::vector<MicroBatch> micro;
  ObjectiveFn objective;
};
Share share(comm::ProcessGroup& g, int s) {
  const auto all = sequences(8, s);
  std::vector<std::vector<int32_t>> mine;
  for (size_t q = 0; q < all.size(); ++q)
    if (int(q % size_t(g.size())) == g.rank()) mine.push_back(all[q]);
  return {split(mine, 2), mean_nll(all)};
}

EngineOptions dp_options(comm::ProcessGroup& g, bool dist, bool reuse) {
  EngineOptions o = options();
  o.parallel.dp = comm::World::current()->group();
  o.parallel.distributed_optimizer = dist;
  o.reuse_fp32_param = reuse;
  return o;
}

int64_t live_state() { return cpu_allocator().stats().live_of(MemCategory::OptimizerState); }

}  // namespace

TEST(ReuseFp32Mpi, TrainsBitForBitLikeTheSameLayoutWithout) {
  auto& g = world_group();
  for (bool dist : {true, false}) {
    auto a = bf16_model(41), b = bf16_model(41);
    const int64_t s0 = live_state();
    TrainingEngine plain(*a, dp_options(g, dist, false));
    const int64_t s1 = live_state();
    TrainingEngine reuse(*b, dp_options(g, dist, true));
    const int64_t s2 = live_state();
    EXPECT_TRUE(reuse.distributed());
    EXPECT_TRUE(reuse.optimizer().reuses_fp32());
    const int64_t owned = reuse.optimizer().state_end() - reuse.optimizer().state_begin();
    EXPECT_EQ((s1 - s0) - (s2 - s1), 2 * owned) << "allocator: reuse saves 2 bytes per owned parameter";
    EXPECT_EQ(s2 - s1, reuse.optimizer().memory().total_bytes());
    EXPECT_EQ(plain.optimizer().memory().total_bytes() - reuse.optimizer().memory().total_bytes(), 2 * owned);
    // Over all ranks: 2 bytes per parameter with the distributed optimizer (each rank 2/dp), 2*dp without.
    const double saved = global_sum(g, double(2 * owned));
    EXPECT_EQ(saved, double(2 * reuse.optimizer().numel() * (dist ? 1 : g.size())));
    if (g.rank() == 0)
      std::printf("[ memory ] dp=%d %s: plain %s | reuse %s\n", g.size(), dist ? "distributed optimizer" : "all-reduce",
                  plain.optimizer().memory().to_string().c_str(), reuse.optimizer().memory().to_string().c_str());
    for (int s = 0; s < 4; ++s) {
      Share sh = share(g, s);
      const MiniBatchResult ra = plain.train_mini_batch(sh.micro, sh.objective, plain.lr(s), s + 1);
      const MiniBatchResult rb = reuse.train_mini_batch(sh.micro, sh.objective, reuse.lr(s), s + 1);
      EXPECT_TRUE(ra.finite && rb.finite);
      EXPECT_EQ(ra.grad_norm, rb.grad_norm) << "step " << s;
      EXPECT_EQ(weight_bytes(*a), weight_bytes(*b)) << (dist ? "distopt" : "all-reduce") << " step " << s;
      for (size_t i = 0; i < plain.optimizer().params().size(); ++i)
        EXPECT_EQ(f32_bits(plain.optimizer().master_view(i)), f32_bits(reuse.optimizer().master_view(i)))
            << plain.optimizer().params()[i].name << " step " << s;
    }
  }
}

TEST(ReuseFp32Mpi, EachRanksOptimizerFileResumesBitForBit) {
  auto& g = world_group();
  namespace fs = std::filesystem;
  int64_t pid = ::getpid();
  g.broadcast(&pid, 1, DType::I64, 0);
  const fs::path dir = fs::temp_directory_path() / ("kestrel_mpi_reuse_" + std::to_string(pid));
  if (g.rank() == 0) fs::create_directories(dir);
  g.barrier();
  auto a = bf16_model(43);
  TrainingEngine ea(*a, dp_options(g, true, true));
  for (int s = 0; s < 2; ++s) {
    Share sh = share(g, s);
    ea.train_mini_batch(sh.micro, sh.objective, ea.lr(s), s + 1);
  }
  const std::string file = (dir / ea.optimizer_file_name()).string();
  EXPECT_TRUE(ea.save_optimizer(file).is_ok());
  if (g.rank() == 0) {
    EXPECT_TRUE(a->save((dir / "model").string(), a->dtype()).is_ok());
  }
  g.barrier();
  auto b = bf16_model(97);
  TrainingEngine eb(*b, dp_options(g, true, true));
  EXPECT_TRUE(load_weights_into(*b, (dir / "model").string()).is_ok());
  EXPECT_TRUE(eb.load_optimizer(file).is_ok());
  for (int s = 2; s < 5; ++s) {
    Share sh = share(g, s);
    ea.train_mini_batch(sh.micro, sh.objective, ea.lr(s), s + 1);
    eb.train_mini_batch(sh.micro, sh.objective, eb.lr(s), s + 1);
  }
  EXPECT_EQ(weight_bytes(*a), weight_bytes(*b));
  for (size_t i = 0; i < ea.optimizer().params().size(); ++i)
    EXPECT_EQ(f32_bits(ea.optimizer().master_view(i)), f32_bits(eb.optimizer().master_view(i)));
  g.barrier();
  if (g.rank() == 0) fs::remove_all(dir);
}
