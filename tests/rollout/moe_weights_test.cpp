// The rollout's copy of a MoE model's weights (rollout/reshard.h) carries its
// buffers: DeepSeek-V3's e_score_correction_bias, f32 in every precision,
// which training's aux-loss-free balancing moves after each step. A bf16
// rollout copy of an f32 actor keeps the bias in f32, bit for bit, follows
// a bias update on refresh() (also after release()), and generates and routes
// as a bf16 model of the same weights does. The pipelined (pp > 1) copy and
// export are tested under mpirun in tests/mpi/pp_weights_test.cpp.
#include <gtest/gtest.h>

#include <cstring>

#include "moe_models.h"
#include "rollout/engine.h"
#include "rollout/reshard.h"

using namespace kestrel;
using namespace kestrel::rollout;
using namespace kestrel::rollout::testing;

namespace {

// Every state tensor (parameters, then buffers) of `got` equals `want`'s byte for byte.
void expect_same_state(const model::CausalLM& got, const model::CausalLM& want, const std::string& what) {
  auto g = const_cast<model::CausalLM&>(got).state_tensors();
  auto w = const_cast<model::CausalLM&>(want).state_tensors();
  ASSERT_EQ(g.size(), w.size()) << what;
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_EQ(g[i]->name, w[i]->name) << what;
    ASSERT_TRUE(g[i]->weight.defined()) << what << ": " << g[i]->name;
    ASSERT_EQ(g[i]->weight.dtype(), w[i]->weight.dtype()) << what << ": " << g[i]->name;
    ASSERT_EQ(g[i]->weight.shape(), w[i]->weight.shape()) << what << ": " << g[i]->name;
    EXPECT_EQ(std::memcmp(g[i]->weight.raw(), w[i]->weight.raw(), w[i]->weight.nbytes()), 0) << what << ": " << g[i]->name;
  }
}

// A step's expert loads that move every bias entry (rate * sign(mean - load)).
model::MoeStepStats loads(const model::CausalLM& m, int64_t salt) {
  model::MoeStepStats s;
  for (int64_t layer = 0; layer < m.config().num_hidden_layers; ++layer) {
    if (!m.config().is_moe_layer(layer)) continue;
    model::MoeLayerStats l;
    l.layer = layer;
    for (int64_t e = 0; e < m.config().moe.num_experts; ++e) l.tokens_per_expert.push_back((e * 7 + salt + layer) % 11);
    s.layers.push_back(l);
  }
  return s;
}

std::vector<RequestOutput> generate(const model::CausalLM& m) {
  EngineConfig c;
  c.block_size = 8;
  c.num_blocks = 64;
  c.record_routing = true;
  auto e = Engine::create(m, c);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  if (!e.is_ok()) return {};
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 8;
  p.ignore_eos = true;
  const auto prompts = moe_prompts();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_TRUE((*e)->add_request("r" + std::to_string(i), prompts[i], p).is_ok());
  return (*e)->run_to_completion();
}

}  // namespace

TEST(MoeRolloutWeights, Bf16CopyCarriesTheF32CorrectionBias) {
  auto train = load_golden("deepseek_v3");                // the f32 actor
  auto same = load_golden("deepseek_v3", DType::BF16);    // the same weights rounded to bf16 on load
  ASSERT_TRUE(train && same);
  ASSERT_EQ(train->buffers().size(), 2u);
  RolloutWeightsOptions o;
  o.dtype = DType::BF16;
  auto w = RolloutWeights::create(*train, o);
  ASSERT_FALSE(w->in_place());
  EXPECT_EQ(w->last().tensors, int64_t(train->state_tensors().size()));
  for (model::Param* b : const_cast<model::CausalLM&>(w->model()).buffers()) EXPECT_EQ(b->weight.dtype(), DType::F32);
  expect_same_state(w->model(), *same, "bf16 copy");
  // Training moves the biases; the copy follows on refresh, also after release().
  for (int step = 0; step < 2; ++step) {
    const model::MoeStepStats s = loads(*train, step);
    train->update_moe_correction_bias(s, 0.01);
    same->update_moe_correction_bias(s, 0.01);
    if (step == 1) {
      w->release();
      EXPECT_TRUE(w->released());
    }
    w->refresh();
    expect_same_state(w->model(), *same, "after bias update " + std::to_string(step));
  }
  // The copy generates and routes as the bf16 model does.
  const auto a = generate(w->model()), b = generate(*same);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].outputs[0].token_ids, b[i].outputs[0].token_ids) << "request " << i;
    EXPECT_EQ(a[i].outputs[0].routed_experts, b[i].outputs[0].routed_experts) << "request " << i;
  }
}

TEST(MoeRolloutWeights, InPlaceReadsTheTrainingBiasAtOnce) {
  // Same dtype and tp: the engine reads the training model itself, its
  // correction bias included, so a bias update routes the next request.
  auto train = load_golden("deepseek_v3");
  ASSERT_TRUE(train);
  auto w = RolloutWeights::create(*train, {});
  ASSERT_TRUE(w->in_place());
  const auto before = generate(w->model());
  model::MoeStepStats s = loads(*train, 3);
  train->update_moe_correction_bias(s, 5.0);  // a large step: routing changes
  const auto after = generate(w->model());
  bool changed = false;
  for (size_t i = 0; i < before.size(); ++i) changed |= before[i].outputs[0].routed_experts != after[i].outputs[0].routed_experts;
  EXPECT_TRUE(changed) << "the rollout did not see the training model's new correction bias";
  int64_t rows = 0;
  EXPECT_EQ(routing_mismatches(*train, after, "after the update", &rows), 0);
}
