// The engine's NaN/Inf guard on one process (the dp/tp flag reduction runs
// under mpirun in tests/mpi/nan_guard_test.cpp):
//  - a NaN injected into a gradient (the test-only hook) skips that update:
//    weights bit for bit unchanged, the optimizer's step count and
//    weight_version() held, the gradients zeroed, the skip counted; the run
//    then continues exactly as if the update had never been called;
//  - a non-finite loss with finite gradients skips too;
//  - K consecutive skips abort with a message naming the step and the quantity;
//  - a non-finite learning rate is an error at once;
//  - save_optimizer refuses a state or weights holding a NaN, naming the tensor;
//  - the skip counts travel with the optimizer state;
//  - the environment hook (KESTREL_TEST_INJECT_NAN_GRAD) picks updates and engines.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "ops/copy.h"
#include "ops/optim_ops.h"
#include "train/engine_testing.h"

namespace kestrel::train {
namespace {

namespace fs = std::filesystem;
using namespace engine_testing;

EngineOptions inject_at(std::set<int64_t> updates, int64_t k = 10) {
  EngineOptions o = options();
  o.max_consecutive_skipped_steps = k;
  o.test_inject_nan_grad = [updates](int64_t u) { return updates.count(u) > 0; };
  return o;
}

double grad_sq(TrainingEngine& e) {
  double s = 0;
  for (const auto& p : e.optimizer().params()) s += ops::sum_squares(p.grad);
  return s;
}

class NanGuard : public ::testing::TestWithParam<bool> {};  // param: bf16 with reuse_fp32_param, else f32

TEST_P(NanGuard, InjectedNanSkipsTheUpdateAndTheRunContinuesAsIfItNeverHappened) {
  model::ModelOptions mo;
  mo.dtype = GetParam() ? DType::BF16 : DType::F32;
  auto a = model::CausalLM::init_random(tiny_config(), mo, 31), b = model::CausalLM::init_random(tiny_config(), mo, 31);
  EngineOptions oa = inject_at({2}), ob = options();
  oa.reuse_fp32_param = ob.reuse_fp32_param = GetParam();
  TrainingEngine ea(*a, oa), eb(*b, ob);
  // a: updates 1..4 with update 2 poisoned; b: the same batches without batch 2.
  for (int s = 0; s < 4; ++s) {
    const auto seqs = sequences(4, s);
    const std::vector<uint8_t> before = weight_bytes(*a);
    const MiniBatchResult r = ea.train_mini_batch(split(seqs, 2), mean_nll(seqs), ea.lr(ea.weight_version()), s + 1);
    if (s == 1) {
      EXPECT_FALSE(r.finite);
      EXPECT_FALSE(r.grad_norm_finite);
      EXPECT_TRUE(r.loss_finite);
      EXPECT_TRUE(std::isnan(r.grad_norm));
      EXPECT_EQ(weight_bytes(*a), before) << "a skipped update changed the weights";
      EXPECT_EQ(ea.optimizer().step_count(), 1);
      EXPECT_EQ(ea.weight_version(), 1);
      EXPECT_EQ(grad_sq(ea), 0.0) << "gradients not zeroed after the skip";
      EXPECT_EQ(ea.skipped_steps(), 1);
      EXPECT_EQ(ea.consecutive_skipped_steps(), 1);
      continue;
    }
    EXPECT_TRUE(r.finite);
    eb.train_mini_batch(split(seqs, 2), mean_nll(seqs), eb.lr(eb.weight_version()), s + 1);
  }
  EXPECT_EQ(ea.consecutive_skipped_steps(), 0);
  EXPECT_EQ(ea.skipped_steps(), 1);
  EXPECT_EQ(ea.optimizer().step_count(), 3);
  EXPECT_EQ(weight_bytes(*a), weight_bytes(*b));
}

INSTANTIATE_TEST_SUITE_P(Modes, NanGuard, ::testing::Values(false, true),
                         [](const auto& i) { return i.param ? "Bf16Reuse" : "F32"; });

TEST(NanGuard, NonFiniteLossWithFiniteGradientsSkips) {
  io::ModelConfig c = tiny_config();
  model::ModelOptions mo;
  mo.value_head = true;
  auto m = model::CausalLM::init_random(c, mo, 8);
  TrainingEngine e(*m, options());
  const std::vector<uint8_t> before = weight_bytes(*m);
  const auto seqs = sequences(3);
  const MiniBatchResult r = e.train_mini_batch(
      split(seqs, 3),
      [](const MicroBatch&, size_t) {
        Objective o;
        o.values = [](const Tensor&, Tensor& dv) {
          ops::fill(dv, 0.01f);  // a finite gradient
          return double(INFINITY);
        };
        return o;
      },
      1e-2, 7);
  EXPECT_FALSE(r.finite);
  EXPECT_FALSE(r.loss_finite);
  EXPECT_TRUE(r.grad_norm_finite);
  EXPECT_EQ(weight_bytes(*m), before);
  EXPECT_EQ(e.skipped_steps(), 1);
}

TEST(NanGuard, AbortsAfterKConsecutiveSkipsNamingTheStepAndTheQuantity) {
  auto m = model::CausalLM::init_random(tiny_config(), {}, 4);
  EngineOptions o = inject_at({2, 3, 4, 6, 7, 8}, 3);
  o.name = "actor";
  TrainingEngine e(*m, o);
  const auto seqs = sequences(3);
  auto update = [&](int64_t step) { return e.train_mini_batch(split(seqs, 3), mean_nll(seqs), 1e-3, step); };
  EXPECT_TRUE(update(1).finite);
  EXPECT_FALSE(update(2).finite);
  EXPECT_FALSE(update(3).finite);
  try {
    update(4);
    FAIL() << "no abort after 3 consecutive skips";
  } catch (const Error& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find("actor: aborting at step 4 (update 4): 3 consecutive optimizer updates skipped"),
              std::string::npos) << msg;
    EXPECT_NE(msg.find("the gradient norm is nan"), std::string::npos) << msg;
    EXPECT_NE(msg.find("max_consecutive_skipped_steps=3"), std::string::npos) << msg;
  }
  // K = 0 never aborts.
  auto m2 = model::CausalLM::init_random(tiny_config(), {}, 4);
  TrainingEngine e2(*m2, inject_at({1, 2, 3, 4, 5}, 0));
  for (int s = 1; s <= 5; ++s) EXPECT_FALSE(e2.train_mini_batch(split(seqs, 3), mean_nll(seqs), 1e-3, s).finite);
  EXPECT_EQ(e2.consecutive_skipped_steps(), 5);
}

TEST(NanGuard, NonFiniteLearningRateIsAnError) {
  auto m = model::CausalLM::init_random(tiny_config(), {}, 4);
  EngineOptions o = options();
  o.name = "actor";
  TrainingEngine e(*m, o);
  const std::vector<uint8_t> before = weight_bytes(*m);
  const auto seqs = sequences(3);
  try {
    e.train_mini_batch(split(seqs, 3), mean_nll(seqs), NAN, 1);
    FAIL() << "lr=nan accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("actor: the learning rate is nan at step 1"), std::string::npos)
        << err.what();
  }
  EXPECT_EQ(weight_bytes(*m), before);
}

TEST(NanGuard, SaveRefusesNonFiniteWeightsAndStateNamingTheTensor) {
  const fs::path dir = fs::temp_directory_path() / ("kestrel_nan_save_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  model::ModelOptions mo;
  mo.dtype = DType::BF16;
  auto m = model::CausalLM::init_random(tiny_config(), mo, 4);
  EngineOptions o = options();
  o.name = "critic";
  TrainingEngine e(*m, o);
  ASSERT_TRUE(e.check_finite().is_ok());
  model::Param* p = m->params().back();
  Tensor one = p->weight.view({-1}).slice_rows(3, 4);
  ops::fill(one, INFINITY);
  const std::string path = (dir / "optimizer.safetensors").string();
  const Status s = e.save_optimizer(path);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("critic: refusing to save: model weight '" + p->name + "' holds a NaN or Inf"),
            std::string::npos) << s.message();
  EXPECT_FALSE(fs::exists(path));
  fs::remove_all(dir);
}

TEST(NanGuard, SkipCountsTravelWithTheOptimizerState) {
  const fs::path dir = fs::temp_directory_path() / ("kestrel_nan_counts_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto m = model::CausalLM::init_random(tiny_config(), {}, 4);
  TrainingEngine e(*m, inject_at({2, 3}));
  const auto seqs = sequences(3);
  for (int s = 1; s <= 3; ++s) e.train_mini_batch(split(seqs, 3), mean_nll(seqs), 1e-3, s);
  const std::string path = (dir / "optimizer.safetensors").string();
  ASSERT_TRUE(e.save_optimizer(path).is_ok());
  auto m2 = model::CausalLM::init_random(tiny_config(), {}, 4);
  TrainingEngine e2(*m2, inject_at({4}));
  ASSERT_TRUE(e2.load_optimizer(path).is_ok());
  EXPECT_EQ(e2.skipped_steps(), 2);
  EXPECT_EQ(e2.consecutive_skipped_steps(), 2);
  // The next update is number 4 (1 applied + 2 skipped + 1): the hook hits it.
  EXPECT_FALSE(e2.train_mini_batch(split(seqs, 3), mean_nll(seqs), 1e-3, 4).finite);
  EXPECT_EQ(e2.consecutive_skipped_steps(), 3);
  fs::remove_all(dir);
}

TEST(NanGuard, EnvironmentHookPicksUpdatesAndEngines) {
  const auto seqs = sequences(3);
  auto skipped = [&](const char* spec, const char* name, int updates) {
    ::setenv("KESTREL_TEST_INJECT_NAN_GRAD", spec, 1);
    auto m = model::CausalLM::init_random(tiny_config(), {}, 4);
    EngineOptions o = options();
    o.name = name;
    TrainingEngine e(*m, o);  // reads the variable here
    ::unsetenv("KESTREL_TEST_INJECT_NAN_GRAD");
    std::string out;
    for (int s = 1; s <= updates; ++s) out += e.train_mini_batch(split(seqs, 3), mean_nll(seqs), 1e-3, s).finite ? '.' : 'x';
    return out;
  };
  EXPECT_EQ(skipped("2", "sft", 4), ".x..");
  EXPECT_EQ(skipped("1,3-4", "sft", 5), "x.xx.");
  EXPECT_EQ(skipped("critic:2", "actor", 3), "...");
  EXPECT_EQ(skipped("critic:2", "critic", 3), ".x.");
}

}  // namespace
}  // namespace kestrel::train
