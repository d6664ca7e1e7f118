// The PPO critic under mpirun: 3 update steps (values, then update on fixed
// returns with the values before the update as old values) under DP (with
// and without the distributed optimizer, balanced or contiguous dp shares)
// and under TP must give one process's values, value losses, grad norms and
// final weights, fp32 within 1e-5 relative to scale. The single-process
// reference runs on every rank. Layout: tp as named, dp = world / tp.
#include "comm/world.h"
#include "model/parallel_setup.h"
#include "parallel/setup.h"
#include "parallel/sharding.h"
#include "rl/critic.h"
#include "tp_testing.h"

using namespace kestrel;
using namespace kestrel::testing;

namespace {

io::ModelConfig tiny_config() {
  io::ModelConfig c;
  c.arch = io::Arch::Qwen2;
  c.model_type = "qwen2";
  c.vocab_size = 128;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = true;
  c.attention_bias = true;
  c.rope.head_dim = 16;
  c.rope.theta = 10000.0;
  return c;
}

// 4 prompts x 2 samples (samples of a prompt share it), responses of 1..7 tokens, fixed returns.
rl::RolloutBatch rollout_batch() {
  rl::RolloutBatch b;
  uint64_t x = 12345;
  auto next = [&x]() {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return uint32_t(x >> 33);
  };
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> p(size_t(3 + next() % 5)), r(size_t(1 + next() % 7));
    for (auto& t : p) t = int32_t(next() % 128);
    for (auto& t : r) t = int32_t(next() % 128);
    if (i % 2 == 1) p = b.prompts.back();
    b.prompts.push_back(p);
    b.responses.push_back(r);
    b.group.push_back(i / 2);
  }
  b.finalize_layout();
  for (int64_t t = 0; t < b.layout.num_tokens(); ++t) b.returns.push_back(double(int(next() % 2001) - 1000) / 1000.0);
  return b;
}

rl::CriticOptions critic_options() {
  rl::CriticOptions o;
  o.ppo_mini_batch_size = 4;  // prompts: one mini-batch of the whole batch per update
  o.n = 2;
  o.micro_batch_size = 2;     // several micro-batches per dp rank
  o.forward_micro_batch_size = 3;
  o.cliprange_value = 0.2;
  o.response_length = 8;
  o.adamw.eps = 1e-5;  // bounds Adam's amplification of fp32 noise on near-zero grads (see tp_model_test.cpp)
  o.lr.lr = 1e-3;
  o.lr.total_steps = 3;
  o.clip_grad = 0.5;
  return o;
}

// init_random zeroes biases; random ones make them count in the comparisons
// (a zero k_proj bias would only collect fp32 noise: its gradient is zero in
// exact arithmetic, softmax being invariant to a shift of a query's scores).
std::unique_ptr<model::CausalLM> value_model(const model::ModelOptions& mo) {
  auto m = model::CausalLM::init_random(tiny_config(), mo, 21, 0.1);
  uint64_t i = 0;
  for (model::Param* p : m->params()) {
    ++i;
    if (p->name.find(".bias") == std::string::npos) continue;
    Tensor full = rand_full(p->full_shape, 500 + i, 0.05f);
    p->weight = parallel::shard_tensor(full, p->shard, m->tp().rank(), m->tp().size(), p->name);
  }
  return m;
}

struct Run {
  std::vector<std::vector<double>> values;  // per step, before the update
  std::vector<double> loss, norm;
  std::vector<Tensor> weights;  // full (gathered over tp), in params() order
};

Run three_steps(rl::Critic& critic) {
  const rl::RolloutBatch b = rollout_batch();
  Run r;
  for (int64_t step = 0; step < 3; ++step) {
    const std::vector<double> v = critic.values(b);
    const auto m = critic.update(b, b.returns, v, step);
    r.values.push_back(v);
    r.loss.push_back(m.at("critic/vf_loss"));
    r.norm.push_back(m.at("critic/grad_norm"));
  }
  model::CausalLM& model = critic.model();
  for (model::Param* p : model.params())
    r.weights.push_back(parallel::gather_tensor(model.tp(), p->weight, p->shard, p->full_shape));
  return r;
}

void run(int tp, bool distributed_optimizer, bool balance) {
  comm::World& world = *comm::World::current();
  model::ModelOptions mo;
  mo.value_head = true;
  // One process, on every rank.
  rl::Critic ref(value_model(mo), critic_options());
  const Run want = three_steps(ref);

  auto grid = parallel::make_process_grid(world, parallel::dims_for(tp, false), model::model_facts(tiny_config()));
  ASSERT_TRUE(grid.is_ok()) << grid.status().message();
  model::ModelOptions po = mo;
  po.parallel = model::model_parallel_for(**grid);
  rl::RlParallel par;
  par.world = world.group();
  par.dp = (*grid)->group(parallel::GroupKind::Dp);
  par.distributed_optimizer = distributed_optimizer;
  rl::Critic critic(value_model(po), critic_options());
  critic.use_parallel(par, balance);  // as RlTrainer hands its layout over
  EXPECT_EQ(critic.model().tp().size(), tp);
  EXPECT_EQ(par.dp->size(), world.size() / tp);
  EXPECT_TRUE(critic.engine().distributed());
  const Run got = three_steps(critic);

  for (int s = 0; s < 3; ++s) {
    EXPECT_LE(rel_to_scale(got.values[size_t(s)], want.values[size_t(s)]), 1e-5) << "values of step " << s;
    EXPECT_NEAR(got.loss[size_t(s)], want.loss[size_t(s)], 1e-5 * std::abs(want.loss[size_t(s)])) << "step " << s;
    EXPECT_NEAR(got.norm[size_t(s)], want.norm[size_t(s)], 1e-5 * want.norm[size_t(s)]) << "step " << s;
  }
  EXPECT_NE(want.values[0], want.values[2]);  // the critic did learn
  ASSERT_EQ(got.weights.size(), want.weights.size());
  size_t k = 0;
  for (model::Param* p : ref.model().params()) {
    EXPECT_LE(rel_err(got.weights[k], p->weight), 1e-5) << p->name;
    ++k;
  }
}

}  // namespace

TEST(CriticParallel, Dp) { run(1, false, false); }
TEST(CriticParallel, DpDistributedOptimizerBalanced) { run(1, true, true); }
TEST(CriticParallel, Tp2) {
  if (comm::World::current()->size() % 2 != 0) GTEST_SKIP() << "needs an even world size";
  run(2, false, true);
}
