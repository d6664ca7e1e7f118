// Context parallelism under mpirun (tests/scripts/mpi_cp_train.sh, 2 and 4
// ranks): the training engine with the model's cp groups (model/cp_batch.h)
// trains 3 AdamW steps on packed micro-batches of a 3,001- and a 1,024-token
// sequence with short ones (1, 2, 5 and 17 tokens: the zigzag split pads each
// to a multiple of 2cp) exactly as one process does: the same losses,
// parameters (fp32, 1e-5 relative to each tensor's scale) and the scoring
// log-probs of the trained model. Layouts: 2 ranks: Ulysses CP2, ring CP2;
// 4 ranks: Ulysses CP4, ring CP4, hybrid (Ulysses 2 x ring 2), CP2 x TP2
// (with sequence parallelism), CP2 x DP2 (plain and distributed optimizer).
#include <cmath>
#include <map>

#include "comm/world.h"
#include "common/testing.h"
#include "model/cp_batch.h"
#include "model/parallel_setup.h"
#include "mpi_testing.h"
#include "parallel/setup.h"
#include "train_testing.h"

using namespace kestrel;

namespace {

io::ModelConfig config() {
  // Four query heads over two kv heads: Ulysses 4 replicates the kv heads.
  const std::string j = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
    "eos_token_id": 1})";
  return io::parse_model_config(j, "cp_train_test").value();
}

std::vector<int32_t> tokens(int64_t n, int salt) {
  std::vector<int32_t> s;
  for (int64_t t = 0; t < n; ++t) s.push_back(int32_t(2 + (t * 7 + salt * 13 + (t * t) % 11) % 62));
  return s;
}

// Two micro-batches: a long sequence packed with short ones each.
std::vector<std::vector<std::vector<int32_t>>> micro_sequences() {
  return {{tokens(5, 1), tokens(3001, 2), tokens(1, 3)}, {tokens(17, 4), tokens(2, 5), tokens(1024, 6)}};
}

struct Layout {
  std::string name;
  int tp = 1, cp = 1;
  parallel::CpAlgo algo = parallel::CpAlgo::Ulysses;
  int ulysses = 0;  // hybrid's ulysses_degree_in_cp
  bool distopt = false;
};

struct CpRun {
  std::vector<double> losses;                     // this rank's share of each step's loss
  std::map<std::string, std::vector<double>> g;   // the first step's reduced gradients (tp = 1, no distributed optimizer)
  std::map<std::string, std::vector<double>> w;   // this rank's parameters (full tensors: tp gathers them)
  std::vector<std::vector<float>> logprobs;       // the trained model's scores of every micro-batch it ran
};

// 3 AdamW steps of the micro-batches `mine` with the mean token loss over all.
CpRun train3(model::ModelOptions mo, train::EngineParallel par, const std::vector<int>& mine) {
  auto model = model::CausalLM::init_random(config(), mo, 77, 0.1);
  train::EngineOptions eo;
  eo.lr.lr = 3e-3;
  eo.lr.total_steps = 10;
  eo.clip_grad = 0;  // measured, not clipped: the gradients stay as reduced
  // Adam divides each element by its own gradient's magnitude, so an element
  // whose gradient is at rounding-noise level takes a full +-lr step in any
  // run, in a direction no summation order reproduces (measured: 1.7e-5 of
  // q_proj's scale at eps 1e-8). eps 1e-6, far below these gradients' bulk,
  // keeps such steps proportional to the gradient; the gradients themselves
  // are compared as they are (1e-5).
  eo.adamw.eps = 1e-6;
  eo.parallel = std::move(par);
  train::TrainingEngine e(*model, eo);
  const auto all = micro_sequences();
  int64_t n = 0;
  for (const auto& mb : all)
    for (const auto& s : mb) n += int64_t(s.size()) - 1;
  std::vector<train::MicroBatch> micro;
  for (int i : mine) micro.push_back({model::pack_sequences(all[size_t(i)]), {}, {}});
  const train::ObjectiveFn objective = kestrel::testing::mean_token_objective(1.f / float(n));
  CpRun r;
  for (int step = 0; step < 3; ++step) {
    r.losses.push_back(e.train_mini_batch(micro, objective, e.lr(step)).loss);
    if (step == 0 && model->tp().size() == 1 && !eo.parallel.distributed_optimizer)
      for (model::Param* p : model->params()) r.g[p->name] = kestrel::testing::to_double(p->grad);
  }
  for (model::Param* p : model->params()) r.w[p->name] = kestrel::testing::to_double(model->full_tensor(*p));
  e.score(micro, [&](size_t, const Tensor& lp) { r.logprobs.push_back(lp.to_float_vector()); });
  return r;
}

using kestrel::testing::rel_err;

void run_layout(const Layout& L, const CpRun& one) {
  comm::World& world = *comm::World::current();
  parallel::ParallelDims dims = parallel::dims_for(L.tp, L.tp > 1);
  dims.cp = L.cp;
  auto g = parallel::make_process_grid(world, dims, model::model_facts(config()));
  ASSERT_TRUE(g.is_ok()) << g.status().message();  // the same on every rank
  const parallel::ProcessGrid& grid = *g.value();
  model::ModelOptions mo;
  mo.parallel = model::model_parallel_for(grid);
  model::set_context_parallel(mo.parallel, world, grid, L.algo, L.ulysses);
  train::EngineParallel par;
  par.dp = grid.group(parallel::GroupKind::DpCp);
  par.distributed_optimizer = L.distopt;
  const auto dp = grid.group(parallel::GroupKind::Dp);
  // dp rank d trains micro-batch d of the two (dp 1: both); its cp ranks the same one.
  std::vector<int> mine;
  for (int i = 0; i < 2; ++i)
    if (i % dp->size() == dp->rank()) mine.push_back(i);
  const CpRun r = train3(mo, par, mine);
  for (size_t s = 0; s < r.losses.size(); ++s) {
    // Every cp (and tp) rank holds its dp share's full loss: sum over dp only.
    const double total = kestrel::testing::global_sum(*dp, r.losses[s]);
    EXPECT_NEAR(total, one.losses[s], 1e-5 * std::abs(one.losses[s])) << L.name << " step " << s;
  }
  EXPECT_EQ(r.w.size(), one.w.size()) << L.name;
  for (const auto& [name, v] : r.w) {
    auto it = one.w.find(name);
    EXPECT_TRUE(it != one.w.end()) << L.name << ": " << name;
    if (it != one.w.end()) {
      EXPECT_LE(rel_err(v, it->second), 1e-5) << L.name << ": " << name;
    }
  }
  for (const auto& [name, v] : r.g) {
    auto it = one.g.find(name);
    EXPECT_TRUE(it != one.g.end()) << L.name << ": " << name;
    if (it != one.g.end()) {
      EXPECT_LE(rel_err(v, it->second), 1e-5) << L.name << ": gradient of " << name;
    }
  }
  for (size_t k = 0; k < mine.size(); ++k) {
    const std::vector<float>& want = one.logprobs[size_t(mine[k])];
    EXPECT_EQ(r.logprobs[k].size(), want.size()) << L.name;
    std::vector<double> a(r.logprobs[k].begin(), r.logprobs[k].end()), b(want.begin(), want.end());
    EXPECT_LE(rel_err(a, b), 1e-5) << L.name << ": log-probs of micro-batch " << mine[k];
  }
}

const CpRun& one_process() {
  static const CpRun one = train3(model::ModelOptions(), {}, {0, 1});
  return one;
}

}  // namespace

TEST(CpTrain, TwoRanksEqualOneProcess) {
  if (kestrel::testing::world_group().size() != 2) GTEST_SKIP() << "written for 2 ranks";
  const CpRun& one = one_process();
  run_layout({"ulysses cp2", 1, 2, parallel::CpAlgo::Ulysses}, one);
  run_layout({"ring cp2", 1, 2, parallel::CpAlgo::Ring}, one);
}

TEST(CpTrain, FourRanksEqualOneProcess) {
  if (kestrel::testing::world_group().size() != 4) GTEST_SKIP() << "written for 4 ranks";
  const CpRun& one = one_process();
  run_layout({"ulysses cp4", 1, 4, parallel::CpAlgo::Ulysses}, one);
  run_layout({"ring cp4", 1, 4, parallel::CpAlgo::Ring}, one);
  run_layout({"hybrid cp4 (ulysses 2 x ring 2)", 1, 4, parallel::CpAlgo::Hybrid, 2}, one);
  run_layout({"ulysses cp2 x tp2", 2, 2, parallel::CpAlgo::Ulysses}, one);
  run_layout({"ring cp2 x tp2", 2, 2, parallel::CpAlgo::Ring}, one);
  run_layout({"ring cp2 x dp2", 1, 2, parallel::CpAlgo::Ring}, one);
  run_layout({"ulysses cp2 x dp2, distributed optimizer", 1, 2, parallel::CpAlgo::Ulysses, 0, true}, one);
}

TEST(CpTrain, RefusalsNameTheNumbers) {
  // 4 query heads: Ulysses over 8 cannot split them (checked before any communication).
  const Status s = parallel::check_cp_heads(4, 2, 1, 8, 8);
  EXPECT_NE(s.message().find("Ulysses degree 8"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("4 query heads"), std::string::npos) << s.message();
  // Prompt sharing is refused under cp (the model layer, on any world).
  if (kestrel::testing::world_group().size() < 2) return;
  comm::World& world = *comm::World::current();
  parallel::ParallelDims dims = parallel::dims_for(1, false);
  dims.cp = 2;
  auto g = parallel::make_process_grid(world, dims, model::model_facts(config()));
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  model::ModelOptions mo;
  mo.parallel = model::model_parallel_for(*g.value());
  model::set_context_parallel(mo.parallel, world, *g.value(), parallel::CpAlgo::Ring, 0);
  auto m = model::CausalLM::init_random(config(), mo, 1, 0.1);
  const model::PackedBatch shared = model::pack_prefix_groups({{tokens(4, 1), {tokens(3, 2), tokens(2, 3)}}});
  try {
    model::cp_local_batch(*m, shared);
    ADD_FAILURE() << "prompt sharing under cp was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("prompt sharing"), std::string::npos) << e.what();
  }
}
