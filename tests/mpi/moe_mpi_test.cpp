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
#include "train/engine.h"
#include "train/token_objective.h"

using namespace kestrel;

namespace {

std::string golden(const std::string& c) { return kestrel::testing::source_path("tests/golden/models/" + c); }

// Four micro-batches of two sequences each (inside the goldens' vocabulary 96).
std::vector<std::vector<std::vector<int32_t>>> micro_sequences() {
  std::vector<std::vector<std::vector<int32_t>>> out(4);
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> s;
    for (int t = 0; t < 6 + (i * 5) % 9; ++t) s.push_back(int32_t(1 + (i * 37 + t * 11) % 95));
    out[size_t(i / 2)].push_back(std::move(s));
  }
  return out;
}

model::ModelOptions options(const std::string& c) {
  model::ModelOptions o;
  o.moe.load_balancing_type = c.rfind("deepseek", 0) == 0 ? "seq_aux_loss" : "aux_loss";
  o.moe.aux_loss_coeff = 0.01;
  o.moe.z_loss_coeff = 0.001;
  if (c == "deepseek_v3") o.moe.bias_update_rate = 1e-3;
  return o;
}

struct TrainResult {
  std::vector<double> losses;
  std::map<std::string, std::vector<double>> tensors;  // this rank's params and buffers by name
};

// Trains micro-batches `mine` of the four (the others belong to other dp
// ranks) with the mean token loss over all of them.
TrainResult train3(const std::string& c, model::ModelOptions o, train::EngineParallel par, const std::vector<int>& mine) {
  auto m = model::CausalLM::load(golden(c), o);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  auto& model = *m.value();
  train::EngineOptions eo;
  eo.lr.lr = 1e-2;
  eo.lr.total_steps = 10;
  eo.parallel = std::move(par);
  train::TrainingEngine e(model, eo);
  const auto all = micro_sequences();
  int64_t n = 0;
  for (const auto& mb : all)
    for (const auto& s : mb) n += int64_t(s.size()) - 1;
  std::vector<train::MicroBatch> micro;
  for (int i : mine) {
    train::MicroBatch mb;
    mb.batch = model::pack_sequences(all[size_t(i)]);
    micro.push_back(std::move(mb));
  }
  const float w = 1.f / float(n);
  auto objective = [w](const train::MicroBatch& mb, size_t) {
    std::vector<float> weights;
    for (int32_t t : mb.batch.host.targets) weights.push_back(t >= 0 ? w : 0.f);
    train::Objective ob;
    ob.tokens = train::cross_entropy_objective(weights);
    ob.need_entropy_grad = false;
    return ob;
  };
  TrainResult r;
  for (int step = 0; step < 3; ++step) r.losses.push_back(e.train_mini_batch(micro, objective, e.lr(step)).loss);
  for (model::Param* p : model.state_tensors()) r.tensors[p->name] = kestrel::testing::to_double(p->weight);
  return r;
}

double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  double scale = 1e-30, err = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::abs(b[i]));
    err = std::max(err, std::abs(a[i] - b[i]));
  }
  return err / scale;
}

// Every tensor this rank holds equals one process's (f32 1e-5 of its scale);
// the correction biases bit for bit.
void expect_equal_to_one_process(const TrainResult& r, const TrainResult& one, const std::string& what) {
  EXPECT_FALSE(r.tensors.empty());
  for (const auto& [name, v] : r.tensors) {
    auto it = one.tensors.find(name);
    EXPECT_TRUE(it != one.tensors.end()) << what << ": " << name;
    if (it == one.tensors.end()) continue;
    if (name.find("e_score_correction_bias") != std::string::npos)
      EXPECT_EQ(v, it->second) << what << ": " << name;
    else
      EXPECT_LE(rel_err(v, it->second), 1e-5) << what << ": " << name;
  }
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
