// The PPO critic: which rows carry a response token's value, the clipped
// value loss's parameter gradient against central finite differences, the
// split invariance of a mini-batch's gradient, updates on fixed returns
// lowering the loss, verl's data metrics, and the checkpoint round trip.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "common/testing.h"
#include "model/batch.h"
#include "rl/critic.h"
#include "rollout/tiny_model.h"

namespace kestrel::rl {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<model::CausalLM> tiny_critic(DType dt = DType::F32, uint64_t seed = 7) {
  model::ModelOptions o;
  o.dtype = dt;
  o.value_head = true;
  return model::CausalLM::init_random(rollout::testing::tiny_config(), o, seed, 0.1);
}

// 6 sequences, prompts 3..7 tokens, responses 2..8 tokens (one empty response);
// with same_prompt the two samples of a group share their prompt.
RolloutBatch batch(uint64_t seed, bool same_prompt = false) {
  RolloutBatch b;
  uint64_t x = seed;
  auto next = [&x]() {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return uint32_t(x >> 33);
  };
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p(size_t(3 + next() % 5)), r(size_t(i == 4 ? 0 : 2 + next() % 7));
    for (auto& t : p) t = int32_t(next() % 128);
    for (auto& t : r) t = int32_t(next() % 128);
    if (same_prompt && i % 2 == 1) p = b.prompts.back();
    b.prompts.push_back(p);
    b.responses.push_back(r);
    b.group.push_back(i / 2);
  }
  b.finalize_layout();
  for (int64_t t = 0; t < b.layout.num_tokens(); ++t) b.returns.push_back(double(int(next() % 2001) - 1000) / 1000.0);
  return b;
}

std::vector<int64_t> all_of(const RolloutBatch& b) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < b.size(); ++i) v.push_back(i);
  return v;
}

// Old values away from the current ones on every third token, so both
// branches of the clipped loss (and clipped-out gradients) are exercised.
std::vector<double> shifted(const std::vector<double>& v) {
  std::vector<double> o = v;
  for (size_t t = 0; t < o.size(); ++t) o[t] += t % 3 == 0 ? 0.5 : t % 3 == 1 ? 0.0 : -0.45;
  return o;
}

std::vector<float> grads_of(model::CausalLM& m) {
  std::vector<float> g;
  for (model::Param* p : m.params()) {
    auto v = p->grad.to_float_vector();
    g.insert(g.end(), v.begin(), v.end());
  }
  return g;
}

TEST(Critic, ValueOfAResponseTokenIsTheStateBeforeIt) {
  auto m = tiny_critic();
  const RolloutBatch b = batch(1);
  const std::vector<double> v = compute_values(*m, b, 24);  // several packed groups
  ASSERT_EQ(v.size(), size_t(b.layout.num_tokens()));
  for (int64_t i = 0; i < b.size(); ++i) {
    const Tensor alone = m->forward_inference(model::pack_sequences({b.sequence(i)}));  // [P + R, 1]
    const int64_t P = int64_t(b.prompts[size_t(i)].size());
    for (int64_t j = 0; j < b.layout.length(i); ++j)
      EXPECT_NEAR(v[size_t(b.layout.begin(i) + j)], alone.get(P - 1 + j), 1e-5) << "seq " << i << " token " << j;
  }
}

// d(value loss)/d(param) of one mini-batch (two micro-batches) against
// central differences of compute_values + value_loss.
void check_fd(AggMode mode) {
  auto m = tiny_critic();
  m->enable_grads();
  m->zero_grads();
  const RolloutBatch b = batch(2);
  const std::vector<int64_t> all = all_of(b);
  const std::vector<double> old = shifted(compute_values(*m, b, 0));
  const double c = 0.2;
  const AggScope scope = mini_batch_scope(b, all, mode, 12.0);
  ValueLossTotals tot;
  value_forward_backward(*m, b, {0, 1, 2}, b.returns, old, c, scope, &tot);
  value_forward_backward(*m, b, {3, 4, 5}, b.returns, old, c, scope, &tot);
  const auto loss_now = [&]() { return value_loss(b.layout, compute_values(*m, b, 0), old, b.returns, nullptr, c, scope).loss; };
  EXPECT_NEAR(tot.loss, loss_now(), 1e-6);
  EXPECT_GT(tot.clipfrac_tokens, 0);
  EXPECT_LT(tot.clipfrac_tokens, tot.tokens);
  const double h = 1e-3;
  int checked = 0;
  for (model::Param* p : m->params()) {
    const int64_t n = p->weight.numel();
    for (int64_t i : {int64_t(1), n / 3, n - 2}) {
      const float w0 = p->weight.get(i);
      p->weight.set(i, float(w0 + h));
      const double fp = loss_now();
      p->weight.set(i, float(w0 - h));
      const double fm = loss_now();
      p->weight.set(i, w0);
      const double fd = (fp - fm) / (2 * h);
      EXPECT_NEAR(p->grad.get(i), fd, 5e-4 + 2e-2 * std::abs(fd)) << p->name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 40);
}
TEST(Critic, ValueLossGradientMatchesFiniteDifferencesTokenMean) { check_fd(AggMode::TokenMean); }
TEST(Critic, ValueLossGradientMatchesFiniteDifferencesSeqMeanTokenMean) { check_fd(AggMode::SeqMeanTokenMean); }

TEST(Critic, MiniBatchGradientDoesNotDependOnTheMicroBatchSplit) {
  const RolloutBatch b = batch(3);
  const std::vector<int64_t> all = all_of(b);
  std::vector<float> ref;
  double ref_loss = 0;
  for (auto [max_tokens, max_seqs] : {std::pair<int64_t, int64_t>{0, 6}, {0, 1}, {20, 0}}) {
    auto m = tiny_critic();
    m->enable_grads();
    m->zero_grads();
    const std::vector<double> old = shifted(compute_values(*m, b, 0));
    const AggScope scope = mini_batch_scope(b, all, AggMode::TokenMean, 0);
    double loss = 0;
    for (const auto& g : split_mini_batch(b, all, max_tokens, max_seqs))
      loss += value_forward_backward(*m, b, g, b.returns, old, 0.2, scope, nullptr);
    const std::vector<float> g = grads_of(*m);
    if (ref.empty()) {
      ref = g;
      ref_loss = loss;
      continue;
    }
    EXPECT_NEAR(loss, ref_loss, 1e-6);  // packing changes only f32 GEMM rounding
    std::vector<double> a(g.begin(), g.end()), r(ref.begin(), ref.end());
    EXPECT_LE(kestrel::testing::rel_to_scale(a, r), 1e-5) << max_tokens << "/" << max_seqs;
  }
}

CriticOptions small_options() {
  CriticOptions o;
  o.ppo_mini_batch_size = 3;  // 2 mini-batches of 3 sequences
  o.n = 1;
  o.ppo_epochs = 2;
  o.micro_batch_size = 2;
  o.cliprange_value = 0.5;
  o.lr.lr = 1e-3;
  o.response_length = 8;
  return o;
}

TEST(Critic, UpdatesOnFixedReturnsLowerTheValueLoss) {
  Critic critic(tiny_critic(), small_options());
  const RolloutBatch b = batch(4);
  const auto loss_of = [&](const std::vector<double>& v) {
    return value_loss(b.layout, v, v, b.returns, nullptr, 0.5, mini_batch_scope(b, all_of(b), AggMode::TokenMean, 0)).loss;
  };
  const double initial = loss_of(critic.values(b));
  double prev = initial;
  for (int64_t step = 0; step < 6; ++step) {
    const std::vector<double> old = critic.values(b);
    const auto m = critic.update(b, b.returns, old, step);
    EXPECT_EQ(m.at("critic/num_updates"), 4);
    EXPECT_EQ(m.at("critic/lr"), 1e-3);
    EXPECT_GT(m.at("critic/grad_norm"), 0);
    EXPECT_GE(m.at("critic/vf_clipfrac"), 0);
    EXPECT_TRUE(std::isfinite(m.at("critic/vpred_mean")));
    const double now = loss_of(critic.values(b));
    EXPECT_LT(now, prev) << "step " << step;
    prev = now;
  }
  EXPECT_LT(prev, 0.1 * initial) << "initial " << initial;
}

TEST(Critic, DataMetricsFollowVerl) {
  const std::vector<double> v = {0.5, 1.0, -1.0, 2.0}, G = {1.0, 1.0, 0.0, 3.0};
  const auto m = critic_data_metrics(v, G);
  EXPECT_DOUBLE_EQ(m.at("critic/values/mean"), 0.625);
  EXPECT_DOUBLE_EQ(m.at("critic/values/max"), 2.0);
  EXPECT_DOUBLE_EQ(m.at("critic/values/min"), -1.0);
  // G - V = {0.5, 0, 1, 1}: mean 0.625, unbiased var 0.229166...; Var(G) = 1.583333...
  EXPECT_NEAR(m.at("critic/vf_explained_var"), 1.0 - (0.6875 / 3) / (4.75 / 3 + 1e-5), 1e-12);
  EXPECT_EQ(critic_data_metrics({1.0}, {2.0}).count("critic/vf_explained_var"), 0u);
}

TEST(Critic, CheckpointRoundTripContinuesIdentically) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const RolloutBatch b = batch(5);
    Critic a(tiny_critic(dt), small_options());
    a.update(b, b.returns, a.values(b), 0);
    const auto dir = fs::temp_directory_path() / ("kestrel_critic_test_" + std::to_string(::getpid())) /
                     (std::string("critic_") + dtype_name(dt));
    fs::remove_all(dir);
    ASSERT_TRUE(a.save(dir.string()).is_ok());
    EXPECT_TRUE(fs::exists(dir / "model" / "config.json"));
    EXPECT_TRUE(fs::exists(dir / "optimizer_pp0.safetensors"));

    Critic c(tiny_critic(dt, 99), small_options());  // different weights, overwritten by the load
    const Status st = c.load(dir.string());
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_EQ(c.optimizer().step_count(), a.optimizer().step_count());
    const auto pa = a.model().params(), pc = c.model().params();
    ASSERT_EQ(pa.size(), pc.size());
    for (size_t i = 0; i < pa.size(); ++i)
      EXPECT_EQ(std::memcmp(pa[i]->weight.raw(), pc[i]->weight.raw(), pa[i]->weight.nbytes()), 0) << pa[i]->name;
    const auto ma = a.update(b, b.returns, a.values(b), 1);
    const auto mc = c.update(b, b.returns, c.values(b), 1);
    EXPECT_EQ(ma.at("critic/vf_loss"), mc.at("critic/vf_loss"));
    EXPECT_EQ(a.values(b), c.values(b));
    fs::remove_all(dir);
  }
}

TEST(Critic, RejectsAModelWithoutValueHead) {
  try {
    Critic c(rollout::testing::tiny_model(), small_options());
    FAIL() << "accepted a causal LM";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("value head"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kestrel::rl

namespace kestrel::rl {
namespace {

// use_prefix_grouper: a group's samples share one copy of the prompt; values,
// loss and gradient are those of the plain packing.
TEST(Critic, SharedPromptsGiveTheSameValuesAndGradient) {
  const RolloutBatch b = batch(4, /*same_prompt=*/true);
  const std::vector<int64_t> all = all_of(b);
  std::vector<float> ref;
  double ref_loss = 0;
  for (auto [max_tokens, share] : {std::pair<int64_t, bool>{0, false}, {0, true}, {20, true}}) {
    auto m = tiny_critic();
    m->enable_grads();
    m->zero_grads();
    const std::vector<double> plain = compute_values(*m, b, 0);
    const std::vector<double> shared = compute_values(*m, b, max_tokens, true);
    for (size_t t = 0; t < plain.size(); ++t) ASSERT_NEAR(plain[t], shared[t], 1e-5) << t;
    const std::vector<double> old = shifted(plain);
    const AggScope scope = mini_batch_scope(b, all, AggMode::TokenMean, 0);
    double loss = 0;
    for (const auto& g : split_mini_batch(b, all, max_tokens, 6, share))
      loss += value_forward_backward(*m, b, g, b.returns, old, 0.2, scope, nullptr, share);
    const std::vector<float> g = grads_of(*m);
    if (ref.empty()) {
      ref = g;
      ref_loss = loss;
      continue;
    }
    EXPECT_NEAR(loss, ref_loss, 1e-6);
    std::vector<double> a(g.begin(), g.end()), r(ref.begin(), ref.end());
    EXPECT_LE(kestrel::testing::rel_to_scale(a, r), 1e-5) << max_tokens;
  }
}

}  // namespace
}  // namespace kestrel::rl
