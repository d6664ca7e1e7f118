// The training engine on one process: a mini-batch's update does not depend
// on its micro-batch split, clipping bounds the applied gradient and reports
// the pre-clip norm, a non-finite gradient skips the step, scoring equals the
// model's own scoring, and an optimizer save/load round trip continues bit
// for bit (f32 and bf16 with f32 masters).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "common/testing.h"
#include "model/batch.h"
#include "model/scoring.h"
#include "optim/grad_clip.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/micro_batch.h"
#include "engine_testing.h"

namespace kestrel::train {
namespace {

namespace fs = std::filesystem;

// The tiny model, its sequences, the micro-batch split and the objective are
// the folder's shared ones; options() here has no weight decay.
using engine_testing::mean_nll;
using engine_testing::sequences;
using engine_testing::split;
using engine_testing::tiny_config;

EngineOptions options(double clip) {
  EngineOptions o;
  o.lr.lr = 1e-2;
  o.lr.total_steps = 10;
  o.clip_grad = clip;
  return o;
}

std::vector<double> weights_of(model::CausalLM& m, bool grads = false) {
  std::vector<double> out;
  for (const model::Param* p : m.params())
    for (double x : testing::to_double(grads ? p->grad : p->weight)) out.push_back(x);
  return out;
}

TEST(TrainingEngine, MiniBatchUpdateDoesNotDependOnTheMicroBatchSplit) {
  const auto seqs = sequences(6);
  std::vector<std::vector<double>> results, grads;
  std::vector<double> losses, norms;
  for (size_t per : {6u, 2u, 1u}) {
    auto m = model::CausalLM::init_random(tiny_config(), {}, 3);
    TrainingEngine e(*m, options(0));
    MiniBatchResult r;
    for (int step = 0; step < 2; ++step) r = e.train_mini_batch(split(seqs, per), mean_nll(seqs), e.lr(step));
    EXPECT_EQ(r.micro_batches, int64_t((6 + per - 1) / per));
    EXPECT_TRUE(r.finite);
    results.push_back(weights_of(*m));
    grads.push_back(weights_of(*m, true));  // the engine leaves the (unclipped) gradient of the last step
    losses.push_back(r.loss);
    norms.push_back(r.grad_norm);
  }
  for (size_t k = 1; k < results.size(); ++k) {
    EXPECT_TRUE(testing::all_close(grads[k], grads[0], {1e-8, 1e-5})) << "split " << k;
    // Adam divides by sqrt(v): near-zero gradients amplify summation-order noise, hence the wider atol.
    EXPECT_TRUE(testing::all_close(results[k], results[0], {1e-4, 1e-5})) << "split " << k;
    EXPECT_NEAR(losses[k], losses[0], 1e-6 * std::abs(losses[0]));
    EXPECT_NEAR(norms[k], norms[0], 1e-5 * norms[0]);
  }
}

TEST(TrainingEngine, ClippingBoundsTheAppliedGradientAndReportsThePreClipNorm) {
  const auto seqs = sequences(4);
  auto a = model::CausalLM::init_random(tiny_config(), {}, 5);
  auto b = model::CausalLM::init_random(tiny_config(), {}, 5);
  TrainingEngine measure(*a, options(0));
  TrainingEngine clipped(*b, options(1e-3));
  const MiniBatchResult ra = measure.train_mini_batch(split(seqs, 2), mean_nll(seqs), 0.0);
  const MiniBatchResult rb = clipped.train_mini_batch(split(seqs, 2), mean_nll(seqs), 0.0);
  EXPECT_GT(ra.grad_norm, 1e-2);
  EXPECT_EQ(ra.grad_norm, rb.grad_norm);  // the same gradient, measured before clipping
  // The gradients the optimizer saw: scaled to max_norm / (norm + 1e-6).
  std::vector<Tensor> grads;
  for (const auto& s : clipped.optimizer().params()) grads.push_back(s.grad);
  EXPECT_NEAR(optim::global_grad_norm(grads), 1e-3 * rb.grad_norm / (rb.grad_norm + 1e-6), 1e-8);
}

TEST(TrainingEngine, NonFiniteGradientSkipsTheStep) {
  const auto seqs = sequences(3);
  auto m = model::CausalLM::init_random(tiny_config(), {}, 7);
  const std::vector<double> before = weights_of(*m);
  TrainingEngine e(*m, options(1.0));
  const MiniBatchResult r = e.train_mini_batch(
      split(seqs, 3),
      [](const MicroBatch& mb, size_t) {
        Objective o;
        o.tokens = cross_entropy_objective(std::vector<float>(size_t(mb.batch.num_tokens), NAN));
        o.need_entropy_grad = false;
        return o;
      },
      1e-2);
  EXPECT_FALSE(r.finite);
  EXPECT_EQ(weights_of(*m), before);
  EXPECT_EQ(e.optimizer().step_count(), 0);
}

TEST(TrainingEngine, ScoreEqualsTheModelsScoring) {
  const auto seqs = sequences(5);
  auto m = model::CausalLM::init_random(tiny_config(), {}, 9);
  TrainingEngine e(*m, options(1.0));
  const auto micro = split(seqs, 2);
  size_t calls = 0;
  e.score(micro, [&](size_t i, const Tensor& lp) {
    EXPECT_EQ(testing::to_double(lp), testing::to_double(model::score_tokens(*m, micro[i].batch).logprob));
    ++calls;
  });
  EXPECT_EQ(calls, micro.size());
  EXPECT_EQ(e.optimizer_file_name(), "optimizer.safetensors");
  EXPECT_FALSE(e.distributed());
}

class EngineRoundTrip : public ::testing::TestWithParam<DType> {};

TEST_P(EngineRoundTrip, SaveLoadContinuesBitForBit) {
  const fs::path dir = fs::temp_directory_path() / ("kestrel_engine_rt_" + std::to_string(getpid()));
  fs::remove_all(dir);
  model::ModelOptions mo;
  mo.dtype = GetParam();
  const auto seqs = sequences(4), next = sequences(4, 3);
  auto first = model::CausalLM::init_random(tiny_config(), mo, 11);
  TrainingEngine a(*first, options(1.0));
  for (int s = 0; s < 2; ++s) a.train_mini_batch(split(seqs, 2), mean_nll(seqs), a.lr(s));
  ASSERT_TRUE(first->save((dir / "model").string(), first->dtype()).is_ok());
  ASSERT_TRUE(a.save_optimizer((dir / a.optimizer_file_name()).string()).is_ok());

  auto second = model::CausalLM::init_random(tiny_config(), mo, 99);  // all state must come from disk
  TrainingEngine b(*second, options(1.0));
  ASSERT_TRUE(load_weights_into(*second, (dir / "model").string()).is_ok());
  ASSERT_TRUE(b.load_optimizer((dir / b.optimizer_file_name()).string()).is_ok());
  EXPECT_EQ(b.optimizer().step_count(), 2);
  for (int s = 2; s < 4; ++s) {
    const MiniBatchResult ra = a.train_mini_batch(split(next, 3), mean_nll(next), a.lr(s));
    const MiniBatchResult rb = b.train_mini_batch(split(next, 3), mean_nll(next), b.lr(s));
    EXPECT_EQ(ra.loss, rb.loss);
    EXPECT_EQ(ra.grad_norm, rb.grad_norm);
  }
  EXPECT_EQ(weights_of(*first), weights_of(*second));
  for (size_t i = 0; i < a.optimizer().params().size(); ++i)
    EXPECT_EQ(testing::to_double(a.optimizer().master_view(i)), testing::to_double(b.optimizer().master_view(i)));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, EngineRoundTrip, ::testing::Values(DType::F32, DType::BF16));

}  // namespace
}  // namespace kestrel::train
