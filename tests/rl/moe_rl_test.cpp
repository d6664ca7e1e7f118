// Mixture-of-experts models in the RL trainer: the actor update on a tiny
// Qwen3-MoE and DeepSeek-V3 (built-in configs, random init) raises the
// advantage-weighted log-prob; router replay R3 trains on the rollout's
// routing and R2 on the old-log-prob pass's even after an earlier mini-batch
// moved the routers (without replay they differ); the router keys act
// (capacity drops tokens, losses and loads in the metrics, a frozen router
// stays, the expert bias moves); the routing travels with the batch through
// packing (with and without shared prompts), the wire format and group
// filtering.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "rl/distributed.h"
#include "rl/dynamic_sampling.h"
#include "rl/workers/actor_worker.h"
#include "rl/workers/log_probs.h"
#include "rl/workers/rollout_worker.h"
#include "model/moe_mlp.h"
#include "rollout/tiny_model.h"
#include "train/builtin_model.h"
#include "train/logging.h"

namespace kestrel::rl {
namespace {

constexpr int64_t kVocab = 128;

std::unique_ptr<model::CausalLM> tiny_moe(const std::string& name, model::MoeTrainOptions moe = {},
                                          uint64_t seed = 5) {
  const io::ModelConfig cfg = train::builtin_model_config(name, kVocab, 1, 256).value();
  model::ModelOptions mo;
  mo.moe = moe;
  return model::CausalLM::init_random(cfg, mo, seed);
}

uint32_t lcg(uint64_t& x) {
  x = x * 6364136223846793005ull + 1442695040888963407ull;
  return uint32_t(x >> 33);
}

// `groups` prompts x n samples; a group's samples share its prompt; advantages +-1 per sequence.
RolloutBatch moe_batch(int64_t groups, int64_t n, uint64_t seed) {
  RolloutBatch b;
  uint64_t x = seed;
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<int32_t> p(size_t(4 + lcg(x) % 4));
    for (auto& t : p) t = int32_t(2 + lcg(x) % (kVocab - 2));
    for (int64_t s = 0; s < n; ++s) {
      std::vector<int32_t> r(size_t(3 + lcg(x) % 5));
      for (auto& t : r) t = int32_t(2 + lcg(x) % (kVocab - 2));
      b.prompts.push_back(p);
      b.responses.push_back(r);
      b.group.push_back(g);
    }
  }
  b.finalize_layout();
  for (int64_t i = 0; i < b.size(); ++i)
    for (int64_t t = b.layout.begin(i); t < b.layout.end(i); ++t) b.advantages.push_back(i % 2 == 0 ? 1.0 : -1.0);
  b.returns = b.advantages;
  b.token_rewards.assign(b.advantages.size(), 0.0);
  b.scores.assign(size_t(b.size()), 0.0);
  return b;
}

// Hand-set routing of every token (k distinct experts per MoE layer); a group's prompt tokens route alike
// (its samples share the prompt, as a rollout's do).
void set_routing(RolloutBatch& b, const model::CausalLM& m, uint64_t seed) {
  const int64_t L = m.num_moe_layers(), k = m.config().moe.top_k, E = m.config().moe.num_experts;
  b.routed_layers = L, b.routed_topk = k, b.routing_source = RouterReplay::R3;
  b.routed_experts.clear();
  uint64_t x = seed;
  std::map<int64_t, std::vector<int32_t>> prompt_routing;
  for (int64_t i = 0; i < b.size(); ++i) {
    const int64_t P = int64_t(b.prompts[size_t(i)].size()), n = P + int64_t(b.responses[size_t(i)].size());
    std::vector<int32_t> r(size_t(n * L * k));
    for (int64_t t = 0; t < n * L; ++t) {
      const int32_t e0 = int32_t(lcg(x) % uint32_t(E));
      for (int64_t j = 0; j < k; ++j) r[size_t(t * k + j)] = int32_t((e0 + j * 3) % E);
    }
    auto [it, fresh] = prompt_routing.try_emplace(b.group[size_t(i)], r.begin(), r.begin() + P * L * k);
    if (!fresh) std::copy(it->second.begin(), it->second.end(), r.begin());
    b.routed_experts.push_back(std::move(r));
  }
}

ActorOptions actor_options(int64_t n, int64_t mini_prompts, double lr) {
  ActorOptions o;
  o.n = n;
  o.response_length = 8;
  o.ppo_mini_batch_size = mini_prompts;
  o.lr.lr = lr;
  o.lr.total_steps = 10;
  o.adamw.weight_decay = 0.0;
  o.log_prob.max_token_len = 4096;
  return o;
}

// sum_i A_i * log p(response_i) under the model.
double weighted_logp(const model::CausalLM& m, const RolloutBatch& b) {
  std::vector<double> lp;
  score_log_probs(m, b, LogProbOptions{}, *comm::local_group("dp"), lp);
  double s = 0;
  for (size_t t = 0; t < lp.size(); ++t) s += b.advantages[t] * lp[t];
  return s;
}

TEST(MoeRl, ActorUpdateRaisesTheAdvantageWeightedLogProb) {
  for (const char* name : {"tiny-qwen3-moe", "tiny-deepseek-v3"}) {
    model::MoeTrainOptions moe;
    moe.aux_loss_coeff = 1e-3;
    moe.z_loss_coeff = 1e-4;
    auto m = tiny_moe(name, moe);
    const RolloutBatch b = moe_batch(2, 3, 11);
    const double before = weighted_logp(*m, b);
    ActorWorker actor(*m, actor_options(3, 2, 1e-3), RlParallel{});
    const auto metrics = actor.update(b, 0);
    const double after = weighted_logp(*m, b);
    EXPECT_GT(after, before) << name;
    EXPECT_GT(metrics.at("actor/grad_norm"), 0.0) << name;
    EXPECT_GT(metrics.at("actor/moe_aux_loss"), 0.0) << name;
    EXPECT_GT(metrics.at("actor/moe_z_loss"), 0.0) << name;
  }
}

TEST(MoeRl, R3TrainsOnTheRolloutsRouting) {
  for (bool share : {true, false}) {
    auto m = tiny_moe("tiny-qwen3-moe");
    RolloutBatch b = moe_batch(2, 3, 21);
    set_routing(b, *m, 5);
    ActorOptions o = actor_options(3, 1, 1e-2);  // two mini-batches: the second after an update
    o.share_prompts = share;
    o.log_prob.share_prompts = share;
    o.router_replay = RouterReplay::R3;
    o.log_prob.router_replay = RouterReplay::R3;
    ActorWorker actor(*m, o, RlParallel{});
    // The old-log-prob pass replays it too.
    std::vector<std::vector<int32_t>> scored;
    std::vector<double> lp;
    score_log_probs(*m, b, o.log_prob, *comm::local_group("dp"), lp, &scored);
    EXPECT_EQ(scored, b.routed_experts) << "share=" << share;
    actor.record_update_routing(true);
    actor.update(b, 0);
    ASSERT_EQ(actor.update_routing().size(), size_t(b.size()));
    for (int64_t i = 0; i < b.size(); ++i)
      EXPECT_EQ(actor.update_routing()[size_t(i)], b.routed_experts[size_t(i)]) << "sequence " << i << " share=" << share;
  }
}

// End to end: the rollout engine records the routing of every prompt and response token (the last
// sampled token, never fed, is -1 there: the router chooses it in training), the batch carries it, and
// the old-log-prob pass and the update (both mini-batches, the second after the routers moved) route
// every recorded token as the rollout did, with shared prompts and without.
TEST(MoeRl, R3TheUpdateRoutesAsTheRolloutDid) {
  for (const char* name : {"tiny-qwen3-moe", "tiny-deepseek-v3"})
    for (bool share : {true, false}) {
      auto m = tiny_moe(name, {}, 13);
      ActorOptions o = actor_options(2, 1, 5e-2);
      o.share_prompts = share;
      o.log_prob.share_prompts = share;
      o.router_replay = RouterReplay::R3;
      o.log_prob.router_replay = RouterReplay::R3;
      ActorWorker actor(*m, o, RlParallel{});
      RolloutOptions ro;
      ro.n = 2;
      ro.response_length = 6;
      ro.seed = 3;
      ro.engine.kv_cache_bytes = int64_t(8) << 20;
      ro.engine.max_model_len = 64;
      ro.engine.record_routing = true;
      RolloutWorker rollout(actor.model(), [&] { return actor.weight_version(); }, ro, RlParallel{});
      RolloutBatch b = rollout.generate({{5, 9, 17, 33, 2}, {40, 41, 42}}, 0);
      ASSERT_EQ(b.routing_source, RouterReplay::R3) << name;
      ASSERT_EQ(b.routed_layers, m->num_moe_layers());
      b.check_routing("test");
      b.advantages.clear();
      for (int64_t i = 0; i < b.size(); ++i)
        for (int64_t t = b.layout.begin(i); t < b.layout.end(i); ++t) b.advantages.push_back(i % 2 ? -1.0 : 1.0);
      actor.compute_log_probs(b);  // replays the rollout's routing
      rollout.sleep(true);
      actor.record_update_routing(true);
      actor.update(b, 0);
      const int64_t w = b.routed_layers * b.routed_topk;
      for (int64_t i = 0; i < b.size(); ++i) {
        const std::vector<int32_t>& want = b.routed_experts[size_t(i)];
        const std::vector<int32_t>& got = actor.update_routing()[size_t(i)];
        ASSERT_EQ(got.size(), want.size());
        int64_t free_rows = 0;
        for (size_t r = 0; r < want.size(); r += size_t(w)) {
          if (want[r] < 0) {
            ++free_rows;
            continue;
          }
          for (size_t j = r; j < r + size_t(w); ++j)
            ASSERT_EQ(got[j], want[j]) << name << " share=" << share << " sequence " << i << " token " << r / size_t(w);
        }
        EXPECT_EQ(free_rows, 1) << "only the last sampled token has no rollout routing";
      }
      rollout.sync();
    }
}

TEST(MoeRl, R3NeedsTheRolloutsRouting) {
  auto m = tiny_moe("tiny-qwen3-moe");
  const RolloutBatch b = moe_batch(1, 2, 3);
  ActorOptions o = actor_options(2, 1, 1e-3);
  o.router_replay = RouterReplay::R3;
  ActorWorker actor(*m, o, RlParallel{});
  try {
    actor.update(b, 0);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("enable_rollout_routing_replay"), std::string::npos) << e.what();
  }
}

// The update's routing against the old-log-prob pass's record, trained in two mini-batches with a large
// step so the second trains on moved routers.
std::pair<std::vector<std::vector<int32_t>>, std::vector<std::vector<int32_t>>> r2_case(RouterReplay mode) {
  auto m = tiny_moe("tiny-qwen3-moe");
  RolloutBatch b = moe_batch(2, 3, 31);
  ActorOptions o = actor_options(3, 1, 5e-2);
  o.router_replay = mode;
  ActorWorker actor(*m, o, RlParallel{});
  std::vector<std::vector<int32_t>> record;
  if (mode == RouterReplay::R2) {
    actor.compute_log_probs(b);
    EXPECT_EQ(b.routing_source, RouterReplay::R2);
    record = b.routed_experts;
  } else {  // the same record, kept aside: the update routes freely
    score_log_probs(*m, b, o.log_prob, *comm::local_group("dp"), b.old_logp, &record);
  }
  actor.record_update_routing(true);
  actor.update(b, 0);
  return {record, actor.update_routing()};
}

TEST(MoeRl, R2TrainsOnTheOldLogProbPassesRoutingAfterTheRoutersMoved) {
  const auto [record, trained] = r2_case(RouterReplay::R2);
  ASSERT_EQ(record.size(), trained.size());
  for (size_t i = 0; i < record.size(); ++i) EXPECT_EQ(trained[i], record[i]) << "sequence " << i;
  // Without replay the second mini-batch (sequences 3-5, after the first update) routes otherwise somewhere.
  const auto [free_record, free_trained] = r2_case(RouterReplay::Disabled);
  EXPECT_EQ(free_record, record);  // the same weights before the update
  int64_t differ = 0;
  for (size_t i = 3; i < free_record.size(); ++i)
    for (size_t t = 0; t < free_record[i].size(); ++t) differ += free_record[i][t] != free_trained[i][t];
  EXPECT_GT(differ, 0) << "the routers did not move enough to change a routing: the test cannot tell";
}

TEST(MoeRl, R2WithoutOldLogProbsChangesNothing) {
  auto a = tiny_moe("tiny-qwen3-moe"), c = tiny_moe("tiny-qwen3-moe");
  const RolloutBatch b = moe_batch(2, 2, 41);
  ActorOptions o = actor_options(2, 2, 1e-2);
  ActorWorker plain(*a, o, RlParallel{});
  o.router_replay = RouterReplay::R2;
  ActorWorker r2(*c, o, RlParallel{});
  EXPECT_EQ(plain.update(b, 0), r2.update(b, 0));
}

TEST(MoeRl, RouterKeysActInTheUpdate) {
  model::MoeTrainOptions moe;
  moe.capacity_factor = 0.5;  // half the fair share: tokens are dropped
  moe.aux_loss_coeff = 1e-2;
  moe.load_balancing_type = "seq_aux_loss";
  moe.z_loss_coeff = 1e-3;
  moe.freeze_router = true;
  moe.bias_update_rate = 1e-2;
  auto m = tiny_moe("tiny-deepseek-v3", moe);
  auto* mlp = dynamic_cast<model::MoeMlp*>(&const_cast<model::Block&>(m->block(1)).mlp());
  ASSERT_NE(mlp, nullptr);
  const std::vector<float> router0 = mlp->router.weight.to_host<float>();
  const std::vector<float> expert0 = mlp->gate[0].weight.to_host<float>();
  std::vector<float> bias0;
  for (model::Param* p : m->buffers()) bias0 = p->weight.to_host<float>();
  ActorOptions o = actor_options(2, 2, 1e-2);
  o.adamw.weight_decay = 0.1;  // a frozen router is not decayed either
  ActorWorker actor(*m, o, RlParallel{});
  const auto mt = actor.update(moe_batch(2, 2, 51), 0);
  EXPECT_GT(mt.at("actor/moe_dropped_tokens"), 0.0);
  EXPECT_LT(mt.at("actor/moe_dropped_tokens"), 1.0);
  EXPECT_GT(mt.at("actor/moe_aux_loss"), 0.0);
  EXPECT_GT(mt.at("actor/moe_z_loss"), 0.0);
  EXPECT_GE(mt.at("actor/moe_max_load"), 1.0);
  EXPECT_LE(mt.at("actor/moe_min_load"), 1.0);
  EXPECT_EQ(mlp->router.weight.to_host<float>(), router0) << "a frozen router moved";
  EXPECT_NE(mlp->gate[0].weight.to_host<float>(), expert0);
  std::vector<float> bias1;
  for (model::Param* p : m->buffers()) bias1 = p->weight.to_host<float>();
  EXPECT_NE(bias1, bias0) << "the expert bias did not move";
}

TEST(MoeRl, DenseModelsIgnoreRouterReplay) {
  auto m = rollout::testing::tiny_model();
  RolloutBatch b = moe_batch(1, 2, 61);
  ActorOptions o = actor_options(2, 1, 1e-3);
  o.router_replay = RouterReplay::R3;
  ActorWorker actor(*m, o, RlParallel{});
  const auto mt = actor.update(b, 0);
  EXPECT_EQ(mt.count("actor/moe_aux_loss"), 0u);
}

TEST(MoeRl, PackingGivesEachRowItsTokensRouting) {
  RolloutBatch b;
  b.prompts = {{1, 2, 3}, {4}, {1, 2, 3}};
  b.responses = {{5, 6}, {7, 8, 9}, {10}};
  b.finalize_layout();
  b.routed_layers = 1, b.routed_topk = 1;
  // Token t of sequence i routes to expert 100 i + t (prompt tokens of sequences 0 and 2 alike: 0, 1, 2).
  for (int64_t i = 0; i < 3; ++i) {
    std::vector<int32_t> r;
    const int64_t n = int64_t(b.prompts[size_t(i)].size() + b.responses[size_t(i)].size());
    for (int64_t t = 0; t < n; ++t) r.push_back(i == 2 && t < 3 ? int32_t(t) : int32_t(100 * i + t));
    b.routed_experts.push_back(r);
  }
  // Unshared: the sequences back to back.
  PackedSequences u = pack_rollout_sequences(b, {0, 1, 2}, false, true);
  EXPECT_EQ(u.batch.routed_experts.to_host<int32_t>(),
            (std::vector<int32_t>{0, 1, 2, 3, 4, 100, 101, 102, 103, 0, 1, 2, 203}));
  // Shared: prefix {1,2} (rows 0-1), seq 0 {3,5,6}, seq 2 {3,10}, seq 1 {4,7,8,9} (see SharedPromptPacking...).
  PackedSequences s = pack_rollout_sequences(b, {0, 1, 2}, true, true);
  EXPECT_EQ(s.batch.routed_experts.to_host<int32_t>(), (std::vector<int32_t>{0, 1, 2, 3, 4, 2, 203, 100, 101, 102, 103}));
  EXPECT_EQ(s.batch.routed_experts.shape(), (Shape{11, 1, 1}));
  EXPECT_FALSE(pack_rollout_sequences(b, {0, 1, 2}, true).batch.routed_experts.defined());
  // And back: each sequence's tokens from the packed rows.
  for (bool share : {false, true}) {
    const PackedSequences p = pack_rollout_sequences(b, {2, 0}, share, true);
    std::vector<std::vector<int32_t>> back;
    unpack_routing(b, {2, 0}, share, p.batch.routed_experts.to_host<int32_t>(), 1, 1, back);
    EXPECT_EQ(back[0], b.routed_experts[0]);
    EXPECT_EQ(back[2], b.routed_experts[2]);
    EXPECT_TRUE(back[1].empty());
  }
  b.routed_experts[1].pop_back();
  EXPECT_THROW(pack_rollout_sequences(b, {0, 1}, false, true), std::exception);
}

TEST(MoeRl, RoutingTravelsOnTheWireAndThroughGroupFiltering) {
  std::vector<WireResponse> mine = {{1, 0, {5, 6}, {-0.5f, -1.5f}, {3, 1, 4, 1, 5, 9}},
                                    {0, 1, {7}, {}, {}},
                                    {0, 0, {8, 9, 10}, {-1, -2, -3}, {2, 7}}};
  const auto all = all_gather_responses(*comm::local_group("world"), mine, true);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].routed_experts, (std::vector<int32_t>{2, 7}));
  EXPECT_TRUE(all[1].routed_experts.empty());
  EXPECT_EQ(all[2].routed_experts, (std::vector<int32_t>{3, 1, 4, 1, 5, 9}));
  EXPECT_EQ(all[2].logprobs, (std::vector<float>{-0.5f, -1.5f}));

  RolloutBatch b = moe_batch(3, 2, 71);
  auto m = tiny_moe("tiny-qwen3-moe");
  set_routing(b, *m, 9);
  const RolloutBatch sel = select_groups(b, {2, 0}, 0);
  ASSERT_EQ(sel.size(), 4);
  EXPECT_EQ(sel.routed_experts[0], b.routed_experts[0]);
  EXPECT_EQ(sel.routed_experts[3], b.routed_experts[5]);
  EXPECT_EQ(sel.routing_source, RouterReplay::R3);
  RolloutBatch acc;
  append_batch(acc, sel);
  append_batch(acc, sel);
  EXPECT_EQ(acc.routed_experts.size(), 8u);
  acc.check_routing("appended");
}

TEST(MoeRl, MetricsOfTheRouterStatistics) {
  model::MoeStepStats s;
  // Layer 1: 4 experts, 12 kept slots of which expert 0 has 6 (load 2.0), expert 3 none; 4 dropped.
  s.layers.push_back({1, {6, 3, 3, 0}, 4, 8, 0.3, 0.06, 3});
  s.layers.push_back({2, {2, 2, 2, 2}, 0, 4, 0.1, 0.0, 1});
  train::MoeMetrics mm;
  mm.add(s);
  mm.gather_stages(*comm::local_group("pp"));
  const auto m = mm.metrics("actor");
  EXPECT_DOUBLE_EQ(m.at("actor/moe_aux_loss"), 0.3 / 3 + 0.1);
  EXPECT_DOUBLE_EQ(m.at("actor/moe_z_loss"), 0.06 / 3);
  EXPECT_DOUBLE_EQ(m.at("actor/moe_max_load"), 2.0);
  EXPECT_DOUBLE_EQ(m.at("actor/moe_min_load"), 0.0);
  EXPECT_DOUBLE_EQ(m.at("actor/moe_dropped_tokens"), 4.0 / 24.0);
  EXPECT_EQ(m.count("actor/moe_ep_max_rank_load"), 0u);  // no expert parallelism
  // EP2: rank 0 holds experts 0-1 (layer 1: 9 of 12 slots, load 1.5; layer 2: 4 of 8, 1.0), rank 1 experts 2-3
  // (layer 1: 3 of 12, 0.5).
  const auto m2 = mm.metrics("actor", 2);
  EXPECT_DOUBLE_EQ(m2.at("actor/moe_ep_max_rank_load"), 1.5);
  EXPECT_DOUBLE_EQ(m2.at("actor/moe_ep_min_rank_load"), 0.5);
  mm.add(s);  // a second mini-batch: the same means and shares
  EXPECT_EQ(mm.metrics("actor"), m);
  EXPECT_TRUE(train::MoeMetrics().metrics("actor").empty());
}

}  // namespace
}  // namespace kestrel::rl
