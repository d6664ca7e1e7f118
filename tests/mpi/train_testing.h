// Helpers of the multi-rank training tests (moe_mpi_test, ep_model_test,
// ep_distopt_test, ep_tp_test, cp_train_test): the mean token loss as an
// engine objective, the relative comparison, the MoE goldens' options, 3 AdamW
// steps of a golden MoE model on four fixed micro-batches, each rank training
// its share, and the optimizer files' comparisons.
#pragma once
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/testing.h"
#include "io/safetensors.h"
#include "mpi_testing.h"
#include "train/optimizer_checkpoint.h"
#include "train/engine.h"
#include "train/token_objective.h"

namespace kestrel::testing {

// Relative to want's largest |value|; vectors of different sizes never agree (1e30).
inline double rel_err(const std::vector<double>& got, const std::vector<double>& want) {
  return got.size() == want.size() ? rel_to_scale(got, want) : 1e30;
}

// Weight w on every packed row with a target: the mean token loss when w is 1 / (targets of the whole mini-batch).
inline std::vector<float> token_weights(const model::PackedBatch& b, float w) {
  std::vector<float> weights;
  for (int32_t t : b.host.targets) weights.push_back(t >= 0 ? w : 0.f);
  return weights;
}
inline train::ObjectiveFn mean_token_objective(float w) {
  return [w](const train::MicroBatch& mb, size_t) {
    train::Objective ob;
    ob.tokens = train::cross_entropy_objective(token_weights(mb.batch, w));
    ob.need_entropy_grad = false;
    return ob;
  };
}

inline std::string golden_model(const std::string& c) { return source_path("tests/golden/models/" + c); }

// The MoE goldens' training options of the multi-rank tests: Megatron's
// router losses on (DeepSeek's per sequence), optionally capacity 1 padded.
inline model::ModelOptions golden_moe_options(const std::string& c, bool capacity = false) {
  model::ModelOptions o;
  o.moe.load_balancing_type = c.rfind("deepseek", 0) == 0 ? "seq_aux_loss" : "aux_loss";
  o.moe.aux_loss_coeff = 0.01;
  o.moe.z_loss_coeff = 0.001;
  if (capacity) {
    o.moe.capacity_factor = 1.0;
    o.moe.pad_to_capacity = true;
  }
  return o;
}

// Four micro-batches of two sequences each (inside the goldens' vocabulary 96).
inline std::vector<std::vector<std::vector<int32_t>>> golden_micro_sequences() {
  std::vector<std::vector<std::vector<int32_t>>> out(4);
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> s;
    for (int t = 0; t < 6 + (i * 5) % 9; ++t) s.push_back(int32_t(1 + (i * 37 + t * 11) % 95));
    out[size_t(i / 2)].push_back(std::move(s));
  }
  return out;
}

// Micro-batches `mine` of the four packed for the engine, and the mean token loss over all four
// (every dp rank's loss carries the global token count).
struct GoldenMicroBatches {
  std::vector<train::MicroBatch> micro;
  train::ObjectiveFn objective;
};
inline GoldenMicroBatches golden_micro_batches(const std::vector<int>& mine) {
  const auto all = golden_micro_sequences();
  int64_t n = 0;
  for (const auto& mb : all)
    for (const auto& s : mb) n += int64_t(s.size()) - 1;
  GoldenMicroBatches g;
  for (int i : mine) g.micro.push_back({model::pack_sequences(all[size_t(i)]), {}, {}});
  g.objective = mean_token_objective(1.f / float(n));
  return g;
}

struct TrainResult {
  std::vector<double> losses;                          // this rank's share of each step's loss
  std::map<std::string, std::vector<double>> tensors;  // this rank's params and buffers by name
};

// 3 AdamW steps of golden model `c` on micro-batches `mine` of the four (the
// others belong to other dp ranks) with the mean token loss over all of them.
inline TrainResult train_golden3(const std::string& c, model::ModelOptions o, train::EngineParallel par,
                                 const std::vector<int>& mine, double lr) {
  auto m = model::CausalLM::load(golden_model(c), o);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  auto& model = *m.value();
  train::EngineOptions eo;
  eo.lr.lr = lr;
  eo.lr.total_steps = 10;
  eo.parallel = std::move(par);
  train::TrainingEngine e(model, eo);
  const GoldenMicroBatches g = golden_micro_batches(mine);
  TrainResult r;
  for (int step = 0; step < 3; ++step) r.losses.push_back(e.train_mini_batch(g.micro, g.objective, e.lr(step)).loss);
  for (model::Param* p : model.state_tensors()) r.tensors[p->name] = to_double(p->weight);
  return r;
}

// Every tensor this rank holds equals one process's (f32 1e-5 of its scale);
// the correction biases bit for bit. Returns the largest relative difference.
inline double expect_equal_to_one_process(const TrainResult& r, const TrainResult& one, const std::string& what) {
  EXPECT_FALSE(r.tensors.empty());
  double worst = 0;
  for (const auto& [name, v] : r.tensors) {
    auto it = one.tensors.find(name);
    EXPECT_TRUE(it != one.tensors.end()) << what << ": " << name;
    if (it == one.tensors.end()) continue;
    if (name.find("e_score_correction_bias") != std::string::npos) {
      EXPECT_EQ(v, it->second) << what << ": " << name;
      continue;
    }
    const double e = rel_err(v, it->second);
    worst = std::max(worst, e);
    EXPECT_LE(e, 1e-5) << what << ": " << name;
  }
  return worst;
}

// A folder every rank sees (rank 0's pid), fresh.
inline std::string shared_dir(const std::string& prefix, const std::string& name) {
  comm::ProcessGroup& w = world_group();
  int32_t pid = int32_t(::getpid());
  w.broadcast(&pid, 1, DType::I32, 0);
  const std::filesystem::path d = std::filesystem::temp_directory_path() / (prefix + std::to_string(pid)) / name;
  if (w.rank() == 0) {
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
  }
  w.barrier();
  return d.string();
}

// The tensors of a stage file: name -> (shape, f32 values).
inline std::map<std::string, std::pair<Shape, std::vector<double>>> read_state(const std::string& dir) {
  std::map<std::string, std::pair<Shape, std::vector<double>>> out;
  auto f = io::SafetensorsFile::open(dir + "/" + train::optimizer_stage_file_name(0));
  EXPECT_TRUE(f.is_ok()) << f.status().message();
  if (!f.is_ok()) return out;
  for (const io::TensorInfo& info : f.value()->tensors()) {
    auto t = f.value()->get(info.name);
    EXPECT_TRUE(t.is_ok()) << info.name;
    if (t.is_ok()) out[info.name] = {info.shape, to_double(t.value())};
  }
  return out;
}

using StateMap = std::map<std::string, std::pair<Shape, std::vector<double>>>;

// A layout's optimizer file against one process's: the same names and
// shapes; with `values`, every tensor within 1e-5 of its scale.
inline void expect_state_like(const StateMap& one, const StateMap& got, bool values, const std::string& what) {
  EXPECT_EQ(one.size(), got.size()) << what;
  for (const auto& [k, sv] : one) {
    auto it = got.find(k);
    EXPECT_TRUE(it != got.end()) << k << " missing from the " << what << " file";
    if (it == got.end()) continue;
    EXPECT_EQ(sv.first, it->second.first) << what << ": " << k;
    if (values) {
      EXPECT_LE(rel_err(it->second.second, sv.second), 1e-5) << what << ": " << k;
    }
  }
}

// The same file again, bit for bit (a round trip through another layout); names the first three that differ.
inline void expect_state_equal(const StateMap& one, const StateMap& back, const std::string& what) {
  EXPECT_EQ(back.size(), one.size()) << what;
  size_t differ = 0;
  for (const auto& [k, sv] : one) {
    auto it = back.find(k);
    if ((it == back.end() || it->second != sv) && differ++ < 3) ADD_FAILURE() << k << " differs after " << what;
  }
  EXPECT_EQ(differ, 0u) << what;
}

}  // namespace kestrel::testing
