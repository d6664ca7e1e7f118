// The rollout engine under tensor parallelism, and the weight resharding at
// the train -> rollout switch (rollout/reshard.h), against the single-process
// engine that every rank also runs: greedy tokens must be identical and
// logprobs within 1e-5 (fp32), seeded sampling identical, with prefix
// caching, chunked prefill and forced preemption (recompute and swap) too.
// The rollout tp size is the world size (-np 2: TP2; -np 4: TP4, whose 2 kv
// heads are then replicated on pairs of ranks).
#include <cstring>

#include "comm/world.h"
#include "rollout/engine.h"
#include "rollout/reshard.h"
#include "rollout/tiny_model.h"
#include "tp_testing.h"

using namespace kestrel;
using namespace kestrel::testing;
using rollout::EngineConfig;
using rollout::RequestOutput;
using rollout::SamplingParams;

namespace {

std::shared_ptr<comm::ProcessGroup> world_ptr() { return comm::World::current()->group(); }

// llama: q/k/v, o_proj and MLP biases (the row-parallel biases are added on
// one rank only), untied lm_head. qwen3: per-head q/k norms, tied embeddings.
io::ModelConfig config_of(const std::string& kind) {
  io::ModelConfig c = rollout::testing::tiny_config(kind == "qwen3");
  c.tie_word_embeddings = kind == "qwen3";
  c.attention_bias = kind == "llama";
  c.o_proj_bias = kind == "llama";
  c.mlp_bias = kind == "llama";
  return c;
}

// The same full weights under any tp group: init_random draws the full
// tensors and cuts them; biases (zero after init) get random full values.
std::unique_ptr<model::CausalLM> make_model(const std::string& kind, std::shared_ptr<comm::ProcessGroup> tp,
                                            DType dt = DType::F32) {
  model::ModelOptions o;
  o.dtype = dt;
  o.parallel.tp = std::move(tp);
  auto m = model::CausalLM::init_random(config_of(kind), o, 7, 0.1);
  uint64_t i = 0;
  for (model::Param* p : m->params()) {
    ++i;
    if (p->name.find(".bias") == std::string::npos) continue;
    Tensor full = rand_full(p->full_shape, 300 + i, 0.05f, dt);
    p->weight = parallel::shard_tensor(full, p->shard, m->tp().rank(), m->tp().size(), p->name);
  }
  return m;
}

EngineConfig base_config() {
  EngineConfig c;
  c.block_size = 16;
  c.num_blocks = 64;
  c.max_num_batched_tokens = 256;
  c.max_num_seqs = 64;
  c.enable_prefix_caching = true;
  return c;
}

// Chunked prefill (tiny budget) plus forced preemption (8 blocks for six
// sequences of up to 74 tokens).
EngineConfig tight_config(const std::string& mode) {
  EngineConfig c = base_config();
  c.max_num_batched_tokens = 7;
  c.num_blocks = 8;
  c.preemption_mode = mode;
  return c;
}

SamplingParams greedy(int64_t max_tokens = 24) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.logprobs = 2;
  return p;
}

SamplingParams seeded(int64_t n, uint64_t seed) {
  SamplingParams p;
  p.temperature = 1.0;
  p.n = n;
  p.seed = seed;
  p.max_tokens = 16;
  return p;
}

struct RunOut {
  std::vector<RequestOutput> outs;
  rollout::EngineStats stats;
};

RunOut run(const model::CausalLM& m, const EngineConfig& cfg, const std::vector<SamplingParams>& params) {
  RunOut r;
  auto e = rollout::Engine::create(m, cfg);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  if (!e.is_ok()) return r;  // every rank fails the same way: no collective is left waiting
  const auto prompts = rollout::testing::tiny_prompts();
  for (size_t i = 0; i < prompts.size(); ++i) {
    Status st = (*e)->add_request("r" + std::to_string(i), prompts[i], params[i % params.size()]);
    EXPECT_TRUE(st.is_ok()) << st.message();
  }
  r.outs = (*e)->run_to_completion();
  r.stats = (*e)->stats();
  EXPECT_EQ(r.stats.free_blocks, r.stats.num_blocks - 1) << "blocks leaked";
  return r;
}

void expect_same(const RunOut& got, const RunOut& want, const std::string& what) {
  ASSERT_EQ(got.outs.size(), want.outs.size()) << what;
  for (size_t i = 0; i < got.outs.size(); ++i) {
    ASSERT_EQ(got.outs[i].outputs.size(), want.outs[i].outputs.size()) << what;
    for (size_t k = 0; k < got.outs[i].outputs.size(); ++k) {
      const auto& x = got.outs[i].outputs[k];
      const auto& y = want.outs[i].outputs[k];
      EXPECT_EQ(x.token_ids, y.token_ids) << what << ": request " << i << " sample " << k;
      EXPECT_EQ(x.finish_reason, y.finish_reason) << what;
      ASSERT_EQ(x.logprobs.size(), y.logprobs.size()) << what;
      for (size_t t = 0; t < x.logprobs.size(); ++t)
        EXPECT_NEAR(x.logprobs[t], y.logprobs[t], 1e-5) << what << ": request " << i << " token " << t;
      ASSERT_EQ(x.top_logprobs.size(), y.top_logprobs.size()) << what;
      for (size_t t = 0; t < x.top_logprobs.size(); ++t) {
        ASSERT_EQ(x.top_logprobs[t].size(), y.top_logprobs[t].size()) << what;
        for (size_t j = 0; j < x.top_logprobs[t].size(); ++j) {
          EXPECT_EQ(x.top_logprobs[t][j].first, y.top_logprobs[t][j].first) << what;
          EXPECT_NEAR(x.top_logprobs[t][j].second, y.top_logprobs[t][j].second, 1e-5) << what;
        }
      }
    }
  }
}

// Every rank must have sampled the same tokens (they feed the same schedulers).
void expect_ranks_agree(const RunOut& r, const std::string& what) {
  std::vector<int32_t> toks;
  for (const auto& o : r.outs)
    for (const auto& c : o.outputs) toks.insert(toks.end(), c.token_ids.begin(), c.token_ids.end());
  int64_t n = int64_t(toks.size()), lo = n, hi = n;
  world_group().all_reduce(&lo, 1, DType::I64, comm::ReduceOp::Min);
  world_group().all_reduce(&hi, 1, DType::I64, comm::ReduceOp::Max);
  EXPECT_EQ(lo, hi) << what;
  if (lo != hi) return;
  std::vector<int32_t> mn = toks, mx = toks;
  world_group().all_reduce(mn.data(), n, DType::I32, comm::ReduceOp::Min);
  world_group().all_reduce(mx.data(), n, DType::I32, comm::ReduceOp::Max);
  EXPECT_EQ(mn, mx) << what << ": ranks sampled different tokens";
}

// The rollout copy's weights: exactly this rank's shard (over `tp`) of the
// reference model's full tensors, converted to the copy's dtype.
void expect_weights_are_shards(const model::CausalLM& got, const model::CausalLM& ref, const std::string& what) {
  auto gp = const_cast<model::CausalLM&>(got).params();
  auto rp = const_cast<model::CausalLM&>(ref).params();
  ASSERT_EQ(gp.size(), rp.size());
  for (size_t i = 0; i < gp.size(); ++i) {
    Tensor want = parallel::shard_tensor(rp[i]->weight, gp[i]->shard, got.tp().rank(), got.tp().size(), rp[i]->name,
                                         MemCategory::Other)
                      .to(got.dtype());
    ASSERT_TRUE(gp[i]->weight.defined()) << gp[i]->name;
    ASSERT_EQ(gp[i]->weight.shape(), want.shape()) << what << ": " << gp[i]->name;
    EXPECT_EQ(std::memcmp(gp[i]->weight.raw(), want.raw(), want.nbytes()), 0) << what << ": " << gp[i]->name;
  }
}

// Stand-in for an optimizer step, identical on every layout: w <- 1.5 w + 0.01.
void perturb(model::CausalLM& m) {
  for (model::Param* p : m.params())
    for (int64_t i = 0; i < p->weight.numel(); ++i) p->weight.set(i, 1.5f * p->weight.get(i) + 0.01f);
}

int64_t param_bytes(const model::CausalLM& m) {
  int64_t n = 0;
  for (model::Param* p : const_cast<model::CausalLM&>(m).params()) n += int64_t(p->weight.nbytes());
  return n;
}

}  // namespace

TEST(RolloutTp, GreedyMatchesSingleProcess) {
  for (const std::string kind : {"llama", "qwen3"}) {
    auto ref = make_model(kind, comm::local_group("tp"));
    auto tpm = make_model(kind, world_ptr());
    EXPECT_EQ(tpm->heads().n_heads, 4 / world_group().size());
    EXPECT_EQ(tpm->local_vocab(), 128 / world_group().size());
    for (const char* cfg_name : {"base", "recompute", "swap"}) {
      const EngineConfig cfg = std::string(cfg_name) == "base" ? base_config() : tight_config(cfg_name);
      const std::string what = kind + " " + cfg_name;
      const RunOut want = run(*ref, cfg, {greedy()});
      const RunOut got = run(*tpm, cfg, {greedy()});
      expect_same(got, want, what);
      expect_ranks_agree(got, what);
      EXPECT_EQ(got.stats.preemptions, want.stats.preemptions) << what;
      EXPECT_EQ(got.stats.prefix_cache_hits, want.stats.prefix_cache_hits) << what;
      if (std::string(cfg_name) != "base") {
        EXPECT_GT(got.stats.preemptions, 0) << what;
      } else {
        EXPECT_GT(got.stats.prefix_cache_hits, 0) << what;
      }
      if (std::string(cfg_name) == "swap") {
        EXPECT_GT(got.stats.swapped_out_blocks, 0) << what;
      }
    }
  }
}

TEST(RolloutTp, SeededSamplingMatchesSingleProcess) {
  auto ref = make_model("llama", comm::local_group("tp"));
  auto tpm = make_model("llama", world_ptr());
  SamplingParams filtered = seeded(2, 11);
  filtered.temperature = 0.8;
  filtered.top_k = 20;
  filtered.top_p = 0.9;
  const std::vector<SamplingParams> ps = {seeded(3, 42), seeded(1, 5), filtered};
  for (const char* cfg_name : {"base", "recompute"}) {
    const EngineConfig cfg = std::string(cfg_name) == "base" ? base_config() : tight_config(cfg_name);
    const RunOut want = run(*ref, cfg, ps);
    const RunOut got = run(*tpm, cfg, ps);
    expect_same(got, want, std::string("sampling ") + cfg_name);
    expect_ranks_agree(got, std::string("sampling ") + cfg_name);
  }
}

TEST(RolloutTp, Bf16RunsAndTracksSingleProcess) {
  // bf16 partial sums reduced in another order may flip a rounding, so only
  // the first token of each prompt is compared, loosely.
  auto ref = make_model("qwen3", comm::local_group("tp"), DType::BF16);
  auto tpm = make_model("qwen3", world_ptr(), DType::BF16);
  const RunOut want = run(*ref, base_config(), {greedy(4)});
  const RunOut got = run(*tpm, base_config(), {greedy(4)});
  expect_ranks_agree(got, "bf16");
  ASSERT_EQ(got.outs.size(), want.outs.size());
  for (size_t i = 0; i < got.outs.size(); ++i) {
    EXPECT_EQ(got.outs[i].outputs[0].token_ids[0], want.outs[i].outputs[0].token_ids[0]) << "prompt " << i;
    EXPECT_NEAR(got.outs[i].outputs[0].logprobs[0], want.outs[i].outputs[0].logprobs[0], 3e-2) << "prompt " << i;
  }
}

TEST(RolloutTp, RanksThatDivergeFailTogether) {
  if (world_group().size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  auto tpm = make_model("llama", world_ptr());
  auto e = rollout::Engine::create(*tpm, base_config());
  ASSERT_TRUE(e.is_ok()) << e.status().message();  // no collective before this point
  // Rank 1 gets a different prompt: the first step's digests differ on every rank.
  const std::vector<int32_t> prompt = {1, 2, 3, world_group().rank() == 1 ? 5 : 4};
  EXPECT_TRUE((*e)->add_request("r", prompt, greedy(4)).is_ok());
  try {
    (*e)->run_to_completion();
    ADD_FAILURE() << "diverged ranks were not detected";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("scheduled different batches"), std::string::npos) << err.what();
  }
}

TEST(RolloutTp, EqualTpSizesReadTheTrainingModelInPlace) {
  auto train = make_model("llama", world_ptr());
  rollout::RolloutWeightsOptions o;
  o.tp = world_ptr();
  auto w = rollout::RolloutWeights::create(*train, o);
  EXPECT_TRUE(w->in_place());
  EXPECT_EQ(&w->model(), train.get());
  const auto& st = w->refresh();
  EXPECT_TRUE(st.in_place);
  EXPECT_EQ(st.bytes_received + st.bytes_copied, 0);
}

TEST(RolloutTp, ReshardTrainingTpToRolloutTp1) {
  if (world_group().size() < 2) GTEST_SKIP() << "needs 2 or more ranks (at 1 both layouts are TP1: in place)";
  // Training TP over the world, rollout TP1: every rank gets a full copy and
  // runs its own single-process engine.
  auto ref = make_model("llama", comm::local_group("tp"));
  auto train = make_model("llama", world_ptr());
  rollout::RolloutWeightsOptions o;
  o.tp = comm::local_group("rollout_tp");
  auto w = rollout::RolloutWeights::create(*train, o);
  EXPECT_FALSE(w->in_place());
  EXPECT_EQ(w->model().tp().size(), 1);
  expect_weights_are_shards(w->model(), *ref, "tp -> 1");
  // Bytes: the full model is written; every non-replicated shard arrives from the n - 1 other ranks.
  const int n = world_group().size();
  int64_t sharded = 0;
  for (model::Param* p : train->params())
    if (p->shard.kind != parallel::ShardKind::Replicated) sharded += int64_t(p->weight.nbytes());
  EXPECT_EQ(w->last().bytes_copied, param_bytes(*ref));
  EXPECT_EQ(w->last().bytes_received, int64_t(n - 1) * sharded);
  EXPECT_EQ(w->last().tensors, int64_t(ref->params().size()));

  expect_same(run(w->model(), tight_config("recompute"), {greedy()}), run(*ref, tight_config("recompute"), {greedy()}),
              "tp -> 1");

  // A training step, then refresh(): the copy follows (and release() frees it meanwhile).
  perturb(*train);
  perturb(*ref);
  w->release();
  EXPECT_TRUE(w->released());
  EXPECT_FALSE(w->model().find_param("model.layers.0.self_attn.q_proj.weight")->weight.defined());
  w->refresh();
  EXPECT_FALSE(w->released());
  expect_weights_are_shards(w->model(), *ref, "tp -> 1 after a step");
  expect_same(run(w->model(), base_config(), {greedy(12)}), run(*ref, base_config(), {greedy(12)}),
              "tp -> 1 after a step");
}

TEST(RolloutTp, ReshardTp1ToRolloutTp) {
  if (world_group().size() < 2) GTEST_SKIP() << "needs 2 or more ranks (at 1 both layouts are TP1: in place)";
  // Training TP1 (each rank a full replica, as under data parallelism),
  // rollout TP over the world: each rank cuts its shard locally.
  auto ref = make_model("qwen3", comm::local_group("tp"));
  auto train = make_model("qwen3", comm::local_group("tp"));
  rollout::RolloutWeightsOptions o;
  o.tp = world_ptr();
  auto w = rollout::RolloutWeights::create(*train, o);
  EXPECT_FALSE(w->in_place());
  EXPECT_EQ(w->model().tp().size(), world_group().size());
  expect_weights_are_shards(w->model(), *ref, "1 -> tp");
  EXPECT_EQ(w->last().bytes_received, 0);
  EXPECT_EQ(w->last().bytes_copied, param_bytes(w->model()));
  for (const char* cfg_name : {"base", "swap"}) {
    const EngineConfig cfg = std::string(cfg_name) == "base" ? base_config() : tight_config(cfg_name);
    const RunOut got = run(w->model(), cfg, {greedy()});
    expect_same(got, run(*ref, cfg, {greedy()}), std::string("1 -> tp ") + cfg_name);
    expect_ranks_agree(got, std::string("1 -> tp ") + cfg_name);
  }
  perturb(*train);
  perturb(*ref);
  w->refresh();
  expect_weights_are_shards(w->model(), *ref, "1 -> tp after a step");
  const RunOut got = run(w->model(), base_config(), {seeded(2, 3)});
  expect_same(got, run(*ref, base_config(), {seeded(2, 3)}), "1 -> tp after a step");
}

TEST(RolloutTp, ReshardConvertsTheDtype) {
  // f32 training weights, bf16 rollout (a copy even at equal tp sizes).
  auto ref = make_model("llama", comm::local_group("tp"));
  auto train = make_model("llama", world_ptr());
  for (bool same_tp : {true, false}) {
    rollout::RolloutWeightsOptions o;
    o.tp = same_tp ? world_ptr() : comm::local_group("rollout_tp");
    o.dtype = DType::BF16;
    auto w = rollout::RolloutWeights::create(*train, o);
    EXPECT_FALSE(w->in_place());
    EXPECT_EQ(w->model().dtype(), DType::BF16);
    expect_weights_are_shards(w->model(), *ref, same_tp ? "bf16 same tp" : "bf16 tp -> 1");
  }
}

TEST(RolloutTp, ReshardBetweenSubgroups) {
  // With 4 ranks: training TP2 x DP2 (pairs {0,1}, {2,3}) -> rollout TP4, and
  // training TP4 -> rollout TP2 pairs.
  const int n = world_group().size();
  if (n != 4) GTEST_SKIP() << "needs 4 ranks";
  const int r = world_group().rank();
  auto pair = comm::World::current()->split(r / 2, r, "tp_pair");
  auto ref = make_model("llama", comm::local_group("tp"));
  {
    auto train = make_model("llama", pair);
    rollout::RolloutWeightsOptions o;
    o.tp = world_ptr();
    auto w = rollout::RolloutWeights::create(*train, o);
    expect_weights_are_shards(w->model(), *ref, "tp2 -> tp4");
    const RunOut got = run(w->model(), tight_config("recompute"), {greedy()});
    expect_same(got, run(*ref, tight_config("recompute"), {greedy()}), "tp2 -> tp4");
    expect_ranks_agree(got, "tp2 -> tp4");
  }
  {
    auto train = make_model("llama", world_ptr());
    rollout::RolloutWeightsOptions o;
    o.tp = pair;
    auto w = rollout::RolloutWeights::create(*train, o);
    expect_weights_are_shards(w->model(), *ref, "tp4 -> tp2");
    const RunOut got = run(w->model(), base_config(), {seeded(2, 8)});
    expect_same(got, run(*ref, base_config(), {seeded(2, 8)}), "tp4 -> tp2");
  }
}
