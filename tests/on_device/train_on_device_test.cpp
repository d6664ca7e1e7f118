// The training engine with its model on the device: the same mini-batches
// (two micro-batches each, clipping on) stepped by AdamW three times on the
// device and on the CPU from the same weights must give the same losses,
// gradient norms and weights within the arithmetic's tolerance (the GEMMs
// differ: cuBLAS or the emulator's against the CPU's BLAS, so not bit for
// bit). f32, and bf16 weights with f32 masters. The optimizer state lives on
// the device, and a checkpoint written from there resumes on the CPU.
#include <gtest/gtest.h>

#include <cstdlib>

#include <unistd.h>

#include <filesystem>
#include <set>

#include "backend/cuda/cuda_backend.h"
#include "common/testing.h"
#include "core/device_hooks.h"
#include "model/batch.h"
#include "train/checkpoint.h"
#include "train/optimizer_checkpoint.h"
#include "train/engine.h"
#include "../train/engine_testing.h"

namespace kestrel::train {
namespace {

namespace fs = std::filesystem;
using engine_testing::mean_nll;
using engine_testing::sequences;
using engine_testing::split;
using engine_testing::tiny_config;

class TrainOnDevice : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!cuda::available()) GTEST_SKIP() << cuda::describe();
    cuda::init();
  }
};

std::unique_ptr<model::CausalLM> tiny(DType dt, Device dev) {
  model::ModelOptions o;
  o.dtype = dt;
  o.device = dev;
  return model::CausalLM::init_random(tiny_config(), o, /*seed=*/7);
}

std::vector<double> weights_of(model::CausalLM& m) {
  std::vector<double> out;
  for (const model::Param* p : m.params())
    for (double x : testing::to_double(p->weight)) out.push_back(x);
  return out;
}

// Three updates of 2 micro-batches each, clipping at 0.5 (it clips here).
std::vector<MiniBatchResult> three_steps(TrainingEngine& e) {
  std::vector<MiniBatchResult> out;
  for (int s = 0; s < 3; ++s) {
    const auto seqs = sequences(6, s);
    out.push_back(e.train_mini_batch(split(seqs, 3), mean_nll(seqs), e.lr(s), s + 1));
  }
  return out;
}

// f32: the losses and norms agree to float rounding of differently ordered
// sums (~1e-6 relative); AdamW's first steps move each weight by about lr in
// the sign of its gradient, so the weights agree to lr times the gradients'
// relative difference (measured 2e-7 of the weights' scale). bf16: every op
// output is rounded to 8 bits on both sides in different orders, so the
// losses are a few bf16 ulps (2^-8 each) apart; the f32 masters stay close
// and the bf16 weights rounded from them differ by at most one bf16 ulp of
// the largest weight, 2^-8 = 3.9e-3 of the scale (measured 9.5e-4).
struct Tol {
  double scalar, weights;
};
Tol tol_for(DType dt) { return dt == DType::F32 ? Tol{2e-5, 1e-5} : Tol{2e-2, 4e-3}; }

TEST_P(TrainOnDevice, ThreeStepsEqualTheCpuSteps) {
  const DType dt = GetParam();
  auto cpu = tiny(dt, Device::CPU), dev = tiny(dt, Device::CUDA);
  EngineOptions o = engine_testing::options(0.5);
  TrainingEngine ec(*cpu, o), ed(*dev, o);
  for (const optim::ParamSlot& s : ed.optimizer().params()) {
    ASSERT_EQ(s.grad.device(), Device::CUDA) << s.name;
    if (s.master.defined()) {
      ASSERT_EQ(s.master.device(), Device::CUDA) << s.name;
    }
  }
  const std::vector<MiniBatchResult> rc = three_steps(ec), rd = three_steps(ed);
  const Tol tol = tol_for(dt);
  for (size_t s = 0; s < rc.size(); ++s) {
    ASSERT_TRUE(rd[s].finite) << "step " << s << ": loss " << rd[s].loss << ", grad norm " << rd[s].grad_norm;
    EXPECT_NEAR(rd[s].loss, rc[s].loss, tol.scalar * std::abs(rc[s].loss)) << "step " << s;
    EXPECT_NEAR(rd[s].grad_norm, rc[s].grad_norm, tol.scalar * rc[s].grad_norm) << "step " << s;
  }
  EXPECT_GT(rc[0].grad_norm, 0.5) << "clipping should act in this test";
  EXPECT_LE(testing::rel_to_scale(weights_of(*dev), weights_of(*cpu)), tol.weights);
  // The step did move the weights (the comparison above is not of two untouched copies).
  auto fresh = tiny(dt, Device::CPU);
  EXPECT_GT(testing::rel_to_scale(weights_of(*fresh), weights_of(*cpu)), 5 * tol.weights);
}

TEST_P(TrainOnDevice, CheckpointFromTheDeviceResumesOnTheCpu) {
  const DType dt = GetParam();
  auto dev = tiny(dt, Device::CUDA);
  EngineOptions o = engine_testing::options(0.5);
  TrainingEngine ed(*dev, o);
  const auto seqs = sequences(6, 0);
  ed.train_mini_batch(split(seqs, 3), mean_nll(seqs), ed.lr(0), 1);
  const fs::path dir = fs::temp_directory_path() / ("kestrel_train_on_device_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const Status model_saved = dev->save((dir / "model").string(), dt);
  ASSERT_TRUE(model_saved.is_ok()) << model_saved.message();
  fs::create_directories(dir / "optim");
  const Status saved = save_optimizer_checkpoint(ed, (dir / "optim").string());
  ASSERT_TRUE(saved.is_ok()) << saved.message();
  // The CPU engine loads both and takes the next step; so does the device engine.
  model::ModelOptions mo;
  mo.dtype = dt;
  auto cpu = model::CausalLM::load((dir / "model").string(), mo);
  ASSERT_TRUE(cpu.is_ok()) << cpu.status().message();
  TrainingEngine ec(*cpu.value(), o);
  const Status loaded = load_optimizer_checkpoint(ec, (dir / "optim").string());
  ASSERT_TRUE(loaded.is_ok()) << loaded.message();
  EXPECT_EQ(ec.optimizer().step_count(), 1);
  const auto next = sequences(6, 1);
  const MiniBatchResult rc = ec.train_mini_batch(split(next, 3), mean_nll(next), ec.lr(1), 2);
  const MiniBatchResult rd = ed.train_mini_batch(split(next, 3), mean_nll(next), ed.lr(1), 2);
  const Tol tol = tol_for(dt);
  EXPECT_NEAR(rd.loss, rc.loss, tol.scalar * std::abs(rc.loss));
  EXPECT_LE(testing::rel_to_scale(weights_of(*dev), weights_of(*cpu.value())), tol.weights);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, TrainOnDevice, ::testing::Values(DType::F32, DType::BF16),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

}  // namespace
}  // namespace kestrel::train

namespace kestrel::train {
namespace {

// Every weight widened to f32 exactly (bf16 -> f32), for bit-for-bit comparisons.
std::vector<float> exact_weights(model::CausalLM& m) {
  std::vector<float> w;
  for (const model::Param* p : m.params()) {
    const std::vector<float> f = p->weight.to_float_vector();
    w.insert(w.end(), f.begin(), f.end());
  }
  return w;
}

// Live and peak device bytes of the optimizer state.
struct OptimBytes {
  int64_t live, peak;
};
OptimBytes optim_bytes() {
  const MemStats s = device_allocator(Device::CUDA)->stats();
  return {s.live_of(MemCategory::OptimizerState), s.peak_of(MemCategory::OptimizerState)};
}

// Optimizer offload (1 piece) and the swap optimizer (4 pieces): three steps
// of a bf16 model give bit for bit the weights of the state kept on the
// device; between steps the device holds none of the state, and during the
// swapped step at most two pieces of it (one stepping while the next comes
// in and the last goes out, MindSpeed's window). On the emulator both swapped
// runs go under both of its copy schedules (tests/cuda_emu/fake_runtime.cpp),
// the copies as late and as early as a GPU could run them, so a missing wait
// or a copy queued out of order changes the weights.
TEST_F(TrainOnDevice, OptimizerOffloadAndSwapOptimizerAreBitIdenticalWithLessDeviceMemory) {
  struct Case {
    int64_t pieces;
    const char* transfers;  // the emulator's copy schedule
  };
  const std::vector<Case> cases = {{0, "lazy"}, {1, "lazy"}, {4, "lazy"}, {1, "eager"}, {4, "eager"}};
  const char* before = std::getenv("KESTREL_EMU_TRANSFERS");
  std::vector<std::vector<float>> weights;  // bf16 weights widened exactly
  std::vector<OptimBytes> bytes;
  for (const Case& c : cases) {
    setenv("KESTREL_EMU_TRANSFERS", c.transfers, 1);  // read by the emulator only
    auto dev = tiny(DType::BF16, Device::CUDA);
    EngineOptions o = engine_testing::options(0.5);
    o.optimizer_offload_pieces = c.pieces;
    device_allocator(Device::CUDA)->reset_peak();
    const int64_t before_live = optim_bytes().live;
    {
      TrainingEngine e(*dev, o);
      EXPECT_EQ(e.optimizer().offload_chunks(), c.pieces);
      three_steps(e);
      bytes.push_back({optim_bytes().live - before_live, optim_bytes().peak - before_live});
    }
    weights.push_back(exact_weights(*dev));
  }
  if (before) setenv("KESTREL_EMU_TRANSFERS", before, 1);
  else unsetenv("KESTREL_EMU_TRANSFERS");
  for (size_t k = 1; k < cases.size(); ++k)
    EXPECT_EQ(weights[k], weights[0]) << (cases[k].pieces == 1 ? "optimizer offload" : "the swap optimizer")
                                      << " changed the weights (copies " << cases[k].transfers << ")";
  // On the device: m, v and the f32 masters, 12 bytes a parameter.
  EXPECT_GT(bytes[0].live, 0);
  for (size_t k = 1; k < cases.size(); ++k) {
    EXPECT_EQ(bytes[k].live, 0) << k;
    EXPECT_LE(bytes[k].peak, bytes[0].peak) << k;
  }
  EXPECT_LE(bytes[2].peak, bytes[0].peak / 2 + 128) << "the swap optimizer holds two of its four pieces at most";
}

int64_t device_live(MemCategory c) { return device_allocator(Device::CUDA)->stats().live_of(c); }

// Bytes of the distinct storages behind the weights (or gradients) of m.
int64_t storage_bytes(model::CausalLM& m, bool grads) {
  std::set<const Storage*> seen;
  int64_t n = 0;
  for (model::Param* p : grads ? m.params() : m.state_tensors()) {
    const Tensor& t = grads ? p->grad : p->weight;
    if (t.defined() && seen.insert(t.storage().get()).second) n += int64_t(t.storage()->bytes());
  }
  return n;
}

// param_offload and grad_offload (an actor between its phases): three bf16
// steps with the weights and gradients sent to pinned host memory after each,
// and brought back by the next step's first use, give bit for bit the weights
// of keeping them on the device. While offloaded the device holds exactly the
// model's weight and gradient bytes less (what another model, the reference
// or the critic, then has to compute in).
TEST_F(TrainOnDevice, ParamAndGradOffloadAreBitIdenticalAndFreeTheDevice) {
  std::vector<std::vector<float>> weights;
  for (bool offload : {false, true}) {
    auto dev = tiny(DType::BF16, Device::CUDA);
    TrainingEngine e(*dev, engine_testing::options(0.5));
    const int64_t wbytes = storage_bytes(*dev, false), gbytes = storage_bytes(*dev, true);
    ASSERT_GT(wbytes, 0);
    ASSERT_GT(gbytes, 0);
    for (int s = 0; s < 3; ++s) {
      const auto seqs = sequences(6, s);
      e.train_mini_batch(split(seqs, 3), mean_nll(seqs), e.lr(s), s + 1);
      EXPECT_TRUE(dev->weights_on_device() && dev->grads_on_device());
      if (!offload) continue;
      const int64_t params = device_live(MemCategory::Params), grads = device_live(MemCategory::Grads);
      dev->offload_to_host(true, true);
      EXPECT_EQ(params - device_live(MemCategory::Params), wbytes) << "step " << s;
      EXPECT_EQ(grads - device_live(MemCategory::Grads), gbytes) << "step " << s;
      for (model::Param* p : dev->params()) {
        EXPECT_EQ(p->weight.device(), Device::CPU) << p->name;
        EXPECT_EQ(p->weight.storage()->allocator(), pinned_host_allocator()) << p->name;
        EXPECT_EQ(p->grad.device(), Device::CPU) << p->name;
      }
    }
    weights.push_back(exact_weights(*dev));
  }
  EXPECT_EQ(weights[1], weights[0]) << "param_offload / grad_offload changed the weights";
}

}  // namespace
}  // namespace kestrel::train
