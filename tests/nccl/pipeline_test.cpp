// Pipeline parallelism on the device across processes (train/pipeline.h):
// the activations and their gradients travel between the stages over NCCL.
//
// NCCL has no tags (a pair's messages match in posting order) and a send may
// wait on the stream until its receiver posts (the emulator's fake NCCL
// sends synchronously, so it hangs where a GPU could). The transfer plan
// every rank follows (train::plan_transfers) is first replayed here with
// those rules for many pipeline sizes, chunk counts and micro-batch counts:
// every rank finishes and every receive gets the message meant for it; a
// naive plan (each op's receive just before it, its send just after, each
// op boundary one group) is caught by the same replay.
//
// Then the same model, micro-batches and 3 AdamW steps (clipping on) at PP2,
// once on the CPU (groups over MPI) and once on the device (NCCL), give the
// same losses, gradient norms and weights within tests/nccl/train_test.cpp's
// f32 tolerances: 1F1B with 4 micro-batches (rank 0: a warm-up forward,
// three steady pairs, a cool-down backward) and interleaved 1F1B with two
// chunks per rank (rank 0: 4 warm-up forwards, 4 steady pairs, 4 cool-down
// backwards); tied embeddings, so the stages' embedding-gradient exchange
// runs on the device too. Scoring through the pipeline (forward only: the
// engine's log-probs of several micro-batches, and kestrel logprobs's
// log-probs and entropies) gives every stage the CPU's results, and the HF
// folder saved from device stages is byte for byte the one saved from the
// same weights on the CPU. Needs 2 ranks (pp 2).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "model/parallel_setup.h"
#include "model/pipeline_save.h"
#include "mpi/mpi_testing.h"
#include "nccl_testing.h"
#include "nccl_training.h"
#include "parallel/grid.h"
#include "rollout/reshard.h"
#include "train/engine.h"
#include "train/pipeline.h"
#include "../train/engine_testing.h"

namespace kestrel::testing {
namespace {

using train::PipeOp;
using train::PipeOpKind;
using train::PipeTransfer;
using Slots = std::vector<std::vector<PipeTransfer>>;  // [slot][transfer], as plan_transfers gives a rank

// ---- The transfer plan under NCCL's rules (no device needed) ----

// Replays every rank's slots as NCCL runs them: a rank posts slot k as one
// group once the group before it completed and its op k-1 ran; a group
// completes when each of its transfers met its other end; between a pair the
// n-th send posted meets the n-th receive posted. Returns "" when every rank
// ends and every receive met the send meant for it, else what went wrong.
std::string replay(const std::vector<std::vector<PipeOp>>& ops, const std::vector<Slots>& slots, int v) {
  const int p = int(ops.size());
  struct Posted {
    int rank;
    size_t slot;
    PipeOp consumer;
  };
  std::map<std::pair<int, int>, std::vector<Posted>> sends, recvs;  // (from, to) -> in posting order
  std::map<std::pair<int, int>, size_t> met;                        // (from, to) -> pairs met so far
  std::vector<size_t> at(size_t(p), 0), left(size_t(p), 0);         // current slot, its transfers not yet met
  auto op_index = [&](int r, const PipeOp& op) {
    const auto& l = ops[size_t(r)];
    return size_t(std::find(l.begin(), l.end(), op) - l.begin());
  };
  std::string error;
  auto post = [&](int r) {
    const size_t k = at[size_t(r)];
    left[size_t(r)] = slots[size_t(r)][k].size();
    for (const PipeTransfer& t : slots[size_t(r)][k]) {
      if (t.from == r) {
        // The op producing it: the one whose transfer this is (ops before slot k ran).
        size_t i = 0;
        while (i < ops[size_t(r)].size() && train::transfer_of(ops[size_t(r)][i], r, p, v) != t) ++i;
        if (i >= k && error.empty()) error = "rank " + std::to_string(r) + " sends " + to_string(t.consumer) +
                                             "'s input in slot " + std::to_string(k) + " before computing it";
        sends[{r, t.to}].push_back({r, k, t.consumer});
      } else {
        if (op_index(r, t.consumer) < k && error.empty())
          error = "rank " + std::to_string(r) + " receives " + to_string(t.consumer) + "'s input after running it";
        recvs[{t.from, r}].push_back({r, k, t.consumer});
      }
    }
  };
  for (int r = 0; r < p; ++r) post(r);
  for (bool progress = true; progress && error.empty();) {
    progress = false;
    for (auto& [pair, s] : sends) {
      auto& rv = recvs[pair];
      for (size_t& n = met[pair]; n < s.size() && n < rv.size(); ++n) {
        if (!(s[n].consumer == rv[n].consumer))
          return "crossed: rank " + std::to_string(pair.first) + "'s send for " + to_string(s[n].consumer) +
                 " met rank " + std::to_string(pair.second) + "'s receive for " + to_string(rv[n].consumer);
        --left[size_t(s[n].rank)];
        --left[size_t(rv[n].rank)];
        progress = true;
      }
    }
    for (int r = 0; r < p; ++r)
      while (left[size_t(r)] == 0 && at[size_t(r)] + 1 < slots[size_t(r)].size()) {
        ++at[size_t(r)];
        post(r);
        progress = true;
      }
  }
  if (!error.empty()) return error;
  std::string stuck;
  for (int r = 0; r < p; ++r)
    if (left[size_t(r)] > 0) stuck += " rank " + std::to_string(r) + " in slot " + std::to_string(at[size_t(r)]);
  if (!stuck.empty()) return "deadlock:" + stuck;
  // Every transfer the ops need was planned, once.
  for (int r = 0; r < p; ++r) {
    size_t need_out = 0, need_in = 0, sent = 0, got = 0;
    for (const PipeOp& op : ops[size_t(r)]) {
      need_out += train::transfer_of(op, r, p, v) ? 1 : 0;
      const bool first = r == 0 && op.chunk == 0, last = r == p - 1 && op.chunk == v - 1;
      need_in += (op.kind == PipeOpKind::Forward ? !first : !last) ? 1 : 0;
    }
    for (const auto& slot : slots[size_t(r)])
      for (const PipeTransfer& t : slot) ++(t.from == r ? sent : got);
    if (sent != need_out || got != need_in)
      return "rank " + std::to_string(r) + " plans " + std::to_string(sent) + " sends and " + std::to_string(got) +
             " receives, its ops need " + std::to_string(need_out) + " and " + std::to_string(need_in);
  }
  return "";
}

// What pipeline_train runs: interleaved 1F1B, or all forwards then all
// backwards where Megatron refuses the micro-batch count.
std::vector<std::vector<PipeOp>> training_ops(int p, int64_t m, int v, int64_t group) {
  std::vector<std::vector<PipeOp>> all;
  for (int r = 0; r < p; ++r) {
    auto s = train::schedule_interleaved_1f1b(p, r, m, v, group);
    all.push_back(s ? s.value() : train::schedule_all_forward_all_backward(p, r, m, v, group));
  }
  return all;
}

std::vector<Slots> planned(const std::vector<std::vector<PipeOp>>& ops, int v) {
  std::vector<Slots> out;
  for (int r = 0; r < int(ops.size()); ++r) out.push_back(train::plan_transfers(ops, v, r).value());
  return out;
}

TEST(NcclPipeline, TransferPlanNeverCrossesNorDeadlocksUnderNcclRules) {
  int cases = 0;
  for (int p : {2, 3, 4, 6})
    for (int v : {1, 2, 3})
      for (int64_t group : {int64_t(0), int64_t(p + 1)})
        for (int64_t m = 1; m <= 12; ++m) {
          if (v == 1 && group > 0) continue;
          const std::string what = "p=" + std::to_string(p) + " v=" + std::to_string(v) + " group=" +
                                   std::to_string(group) + " m=" + std::to_string(m);
          const auto train = training_ops(p, m, v, group);
          EXPECT_EQ(replay(train, planned(train, v), v), "") << "training, " << what;
          std::vector<std::vector<PipeOp>> fwd;
          for (int r = 0; r < p; ++r) fwd.push_back(train::schedule_forward_only(p, r, m, v));
          EXPECT_EQ(replay(fwd, planned(fwd, v), v), "") << "forward only, " << what;
          ++cases;
        }
  EXPECT_EQ(cases, 240);
}

TEST(NcclPipeline, ReplayCatchesANaivePlan) {
  // Each op's receive right before it and its send right after, so op k's
  // send and op k+1's receive share a group: fine for plain 1F1B, but at pp 2
  // with two chunks the ranks send each other activations and gradients over
  // one pair, and the replay must see that go wrong.
  const int p = 2, v = 2;
  const auto ops = training_ops(p, 4, v, 0);
  std::vector<Slots> naive(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    const auto& l = ops[size_t(r)];
    Slots& s = naive[size_t(r)];
    s.resize(l.size() + 1);
    for (size_t k = 0; k < l.size(); ++k) {
      const PipeOp& op = l[k];
      const bool first = r == 0 && op.chunk == 0, last = r == p - 1 && op.chunk == v - 1;
      if (op.kind == PipeOpKind::Forward && !first)
        s[k].push_back({r > 0 ? r - 1 : p - 1, r, op});
      if (op.kind == PipeOpKind::Backward && !last)
        s[k].push_back({r < p - 1 ? r + 1 : 0, r, op});
      if (auto t = train::transfer_of(op, r, p, v)) s[k + 1].insert(s[k + 1].begin(), *t);
    }
  }
  EXPECT_NE(replay(ops, naive, v), "");
  EXPECT_EQ(replay(ops, planned(ops, v), v), "");
}

// ---- On the device against the CPU (2 ranks) ----

// Why a device test cannot run here ("" when it can).
std::string without_pp2_device() {
  if (world_group().size() != 2) return "needs 2 ranks (pp 2)";
  if (!device_ready()) return "no device: " + cuda::describe();
  return "";
}
#define SKIP_WITHOUT_PP2_DEVICE()                                    \
  if (const std::string why = without_pp2_device(); !why.empty()) \
  GTEST_SKIP() << why

// The tiny tied Llama with 4 layers.
io::ModelConfig config4() {
  io::ModelConfig c = train::engine_testing::tiny_config();
  c.num_hidden_layers = 4;
  return c;
}

// This rank's stage at pp 2: layers 0-1 / 2-3, or interleaved (virtual stage
// c * 2 + r holds layer c * 2 + r): rank 0 layers 0 and 2, rank 1 1 and 3.
std::unique_ptr<model::CausalLM> stage(const parallel::ProcessGrid& grid, bool interleaved, Device dev) {
  const int r = grid.coords().pp;
  model::ModelOptions mo;
  mo.dtype = DType::F32;
  mo.device = dev;
  mo.parallel = model::model_parallel_for(grid);
  if (interleaved) mo.chunks = {{r, 1}, {r + 2, 1}};
  else mo.chunks = {{2 * r, 2}};
  mo.has_embedding = r == 0;
  mo.has_head = r == 1;
  return model::CausalLM::init_random(config4(), mo, /*seed=*/7);
}

parallel::ProcessGrid pp2_grid(Device dev) {
  parallel::ParallelDims dims;
  dims.pp = 2;
  return parallel::ProcessGrid(*comm::World::current(), dims, dev);
}

struct Run : TrainedRun {
  std::vector<PipeOp> ops;  // the last step's executed op list
};

// Three updates of 8 sequences in 4 micro-batches.
Run three_steps(bool interleaved, Device dev) {
  const parallel::ProcessGrid grid = pp2_grid(dev);
  auto m = stage(grid, interleaved, dev);
  train::EngineOptions eo = train::engine_testing::options(0.5);
  eo.parallel.dp = grid.group(parallel::GroupKind::Dp);
  train::TrainingEngine e(*m, eo);
  e.record_pipeline_trace(true);
  Run out;
  for (int s = 0; s < 3; ++s) {
    const auto all = train::engine_testing::sequences(8, s);
    out.steps.push_back(e.train_mini_batch(train::engine_testing::split(all, 2), train::engine_testing::mean_nll(all),
                                           e.lr(s), s + 1));
  }
  out.weights = flat_weights(*m);
  out.ops = e.pipeline_trace()->ops;
  return out;
}

void expect_pipeline_matches(bool interleaved) {
  const Run cpu = three_steps(interleaved, Device::CPU), dev = three_steps(interleaved, Device::CUDA);
  expect_same_training(cpu, dev, train_tol(DType::F32), 0.5, interleaved ? "interleaved" : "1F1B");
  // The schedule ran as planned (not the all-forward fallback), the same on both.
  const int r = world_group().rank();
  const auto want = interleaved ? train::schedule_interleaved_1f1b(2, r, 4, 2).value() : train::schedule_1f1b(2, r, 4);
  EXPECT_EQ(dev.ops, want);
  EXPECT_EQ(cpu.ops, want);
}

TEST(NcclPipeline, OneFOneBOnTheDeviceEqualsTheCpu) {
  SKIP_WITHOUT_PP2_DEVICE();
  expect_pipeline_matches(false);
}
TEST(NcclPipeline, InterleavedOnTheDeviceEqualsTheCpu) {
  SKIP_WITHOUT_PP2_DEVICE();
  expect_pipeline_matches(true);
}

TEST(NcclPipeline, ScoringOnTheDeviceEqualsTheCpu) {
  SKIP_WITHOUT_PP2_DEVICE();
  const auto seqs = train::engine_testing::sequences(6, 3);
  const auto micro = train::engine_testing::split(seqs, 2);  // 3 micro-batches
  for (bool interleaved : {false, true}) {
    SCOPED_TRACE(interleaved ? "interleaved" : "1F1B stages");
    std::vector<std::vector<double>> got[2];  // [cpu, device][micro-batch]
    std::vector<double> tokens[2][2];         // [cpu, device][log-probs, entropies] of one packed batch
    for (int d = 0; d < 2; ++d) {
      const Device dev = d == 0 ? Device::CPU : Device::CUDA;
      const parallel::ProcessGrid grid = pp2_grid(dev);
      auto m = stage(grid, interleaved, dev);
      std::vector<train::MicroBatch> here = micro;  // the batches where the model is (the engine moves them so)
      for (train::MicroBatch& mb : here) mb.batch = model::to_device(mb.batch, dev);
      train::score_micro_batches(*m, here, [&](size_t, const Tensor& t) {
        EXPECT_EQ(t.device(), dev);
        got[d].push_back(to_double(t));
      });
      const model::TokenScores s = train::pipeline_score_tokens(*m, here[1].batch);
      tokens[d][0] = to_double(s.logprob);
      tokens[d][1] = to_double(s.entropy);
    }
    ASSERT_EQ(got[0].size(), micro.size());
    ASSERT_EQ(got[1].size(), micro.size());
    for (size_t i = 0; i < micro.size(); ++i)
      EXPECT_LE(rel_to_scale(got[1][i], got[0][i]), 2e-5) << "log-probs of micro-batch " << i;
    EXPECT_LE(rel_to_scale(tokens[1][0], tokens[0][0]), 2e-5) << "pipeline_score_tokens log-probs";
    EXPECT_LE(rel_to_scale(tokens[1][1], tokens[0][1]), 2e-5) << "pipeline_score_tokens entropies";
  }
}

// A folder every rank names alike: world rank 0's pid.
std::string shared_tmp(const std::string& name) {
  int64_t pid = world_group().rank() == 0 ? int64_t(::getpid()) : 0;
  world_group().all_reduce(&pid, 1, DType::I64, comm::ReduceOp::Max);
  return (std::filesystem::temp_directory_path() / ("kestrel_nccl_pp_" + std::to_string(pid)) / name).string();
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(NcclPipeline, SavedFolderFromDeviceStagesEqualsTheCpus) {
  SKIP_WITHOUT_PP2_DEVICE();
  for (bool interleaved : {false, true})
    for (DType disk : {DType::F32, DType::BF16}) {
      const std::string what = std::string(interleaved ? "interleaved" : "1F1B stages") + ", " + dtype_name(disk);
      const parallel::ProcessGrid dev_grid = pp2_grid(Device::CUDA), cpu_grid = pp2_grid(Device::CPU);
      auto on_dev = stage(dev_grid, interleaved, Device::CUDA);
      auto on_cpu = stage(cpu_grid, interleaved, Device::CPU);
      for (model::Param* p : on_cpu->params()) p->weight.copy_from(on_dev->find_param(p->name)->weight);  // exactly
      const std::string a = shared_tmp("dev"), b = shared_tmp("cpu");
      ASSERT_TRUE(model::save_pipelined_model(*on_dev, a, disk).is_ok()) << what;
      ASSERT_TRUE(model::save_pipelined_model(*on_cpu, b, disk).is_ok()) << what;
      world_group().barrier();
      if (world_group().rank() == 0) {
        for (const char* f : {"model.safetensors", "config.json"}) {
          const std::string x = slurp(std::filesystem::path(a) / f), y = slurp(std::filesystem::path(b) / f);
          EXPECT_FALSE(y.empty()) << what << ": " << f;
          EXPECT_TRUE(x == y) << what << ": " << f << " differs";
        }
        std::filesystem::remove_all(std::filesystem::path(a).parent_path());
      }
      world_group().barrier();
    }
}

// The rollout's whole-model copy filled from device stages (rollout/reshard.h:
// each tensor broadcast over pp from the stage that holds it) equals the copy
// filled from the same weights on CPU stages, bit for bit, in the training
// dtype and in bf16; the non-owning stage's receive buffer must be on the
// device, or the owner's NCCL broadcast never meets its MPI one.
TEST(NcclPipeline, RolloutCopyFromDeviceStagesEqualsTheCpus) {
  SKIP_WITHOUT_PP2_DEVICE();
  for (DType rollout_dtype : {DType::F32, DType::BF16}) {
    const parallel::ProcessGrid dev_grid = pp2_grid(Device::CUDA), cpu_grid = pp2_grid(Device::CPU);
    auto on_dev = stage(dev_grid, /*interleaved=*/false, Device::CUDA);
    auto on_cpu = stage(cpu_grid, /*interleaved=*/false, Device::CPU);
    for (model::Param* p : on_cpu->params()) p->weight.copy_from(on_dev->find_param(p->name)->weight);  // exactly
    rollout::RolloutWeightsOptions o;
    o.dtype = rollout_dtype;
    auto from_dev = rollout::RolloutWeights::create(*on_dev, o);
    auto from_cpu = rollout::RolloutWeights::create(*on_cpu, o);
    auto got = const_cast<model::CausalLM&>(from_dev->model()).state_tensors();
    auto want = const_cast<model::CausalLM&>(from_cpu->model()).state_tensors();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i]->name, want[i]->name);
      EXPECT_EQ(got[i]->weight.device(), Device::CUDA) << got[i]->name;
      EXPECT_EQ(got[i]->weight.to_float_vector(), want[i]->weight.to_float_vector())
          << got[i]->name << " (" << dtype_name(rollout_dtype) << " rollout)";
    }
  }
}

}  // namespace
}  // namespace kestrel::testing
