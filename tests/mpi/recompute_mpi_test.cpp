// Activation recompute under mpirun (2 ranks; tests/scripts/mpi_recompute.sh):
// TP2 with sequence parallelism (the norm recompute's all-gather and the
// rerun's tp collectives run inside the backward on both ranks in the same
// order) and DP2 (every rank its share of the batch, gradients summed over
// dp). 3 AdamW steps through train::TrainingEngine with each mode give this
// rank's weight and gradient shards, and the losses, bit for bit the run
// without recompute in the same layout. TP2 x DP2 needs 4 ranks: too slow on
// the two loaded cores the suite runs on, so the layouts are checked apart.
#include <cstring>

#include "comm/world.h"
#include "model/recompute.h"
#include "mpi_testing.h"
#include "train/engine.h"
#include "train/token_objective.h"

using namespace kestrel;

namespace {

io::ModelConfig config() {
  // Odd token counts below make sequence parallelism pad; two kv heads over tp2.
  const std::string j = R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 64,
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
    "attention_bias": true, "eos_token_id": 1})";
  return io::parse_model_config(j, "recompute_mpi_test").value();
}

std::vector<std::vector<int32_t>> sequences(int salt) {
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> s;
    for (int t = 0; t < 5 + (i * 3 + salt) % 7; ++t) s.push_back(int32_t(2 + (i * 11 + t * 5 + salt) % 60));
    out.push_back(std::move(s));
  }
  return out;
}

model::RecomputePolicy policy(const std::string& g, const std::string& m, int64_t n,
                              std::vector<std::string> mods, bool act, bool norm) {
  auto r = model::make_recompute_policy(g, m, n, mods, act, -1, norm, -1, "");
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r.is_ok() ? r.value() : model::RecomputePolicy();
}

std::vector<model::RecomputePolicy> modes() {
  return {policy("full", "uniform", 2, {}, false, false), policy("full", "block", 3, {}, false, false),
          policy("full", "block", 1, {}, true, true), policy("selective", "", -1, {"core_attn", "layernorm"}, true, false),
          policy("selective", "", -1, {"mlp"}, false, false), policy("", "", -1, {}, true, true)};
}

struct Out {
  std::vector<float> bits;  // weights, grads (f32 copies of this rank's shards) and losses
};

// tp: the world is the tp group (SP on); else the world is the dp group.
Out train3(bool tp, DType dt, const model::RecomputePolicy& rp) {
  comm::ProcessGroup& w = kestrel::testing::world_group();
  model::ModelOptions o;
  o.dtype = dt;
  o.recompute = rp;
  if (tp) {
    o.parallel.tp = comm::World::current()->group();
    o.parallel.sequence_parallel = true;
  }
  auto m = model::CausalLM::init_random(config(), o, 7, 0.05);
  train::EngineOptions eo;
  eo.lr.lr = 1e-2;
  eo.lr.total_steps = 10;
  if (!tp) eo.parallel.dp = comm::World::current()->group();
  train::TrainingEngine e(*m, eo);
  // Under dp each rank trains its own sequences; under tp every rank the same.
  const auto seqs = sequences(tp ? 0 : w.rank());
  int64_t n = 0;
  for (const auto& s : seqs) n += int64_t(s.size()) - 1;
  n = tp ? n : int64_t(kestrel::testing::global_sum(w, double(n)));
  std::vector<train::MicroBatch> micro(2);
  micro[0].batch = model::pack_sequences({seqs.begin(), seqs.begin() + 2});
  micro[1].batch = model::pack_sequences({seqs.begin() + 2, seqs.end()});
  const float wt = 1.f / float(n);
  auto objective = [wt](const train::MicroBatch& mb, size_t) {
    std::vector<float> weights;
    for (int64_t t = 0; t < mb.batch.num_tokens; ++t) weights.push_back(mb.batch.targets.get(t) >= 0 ? wt : 0.f);
    train::Objective ob;
    ob.tokens = train::cross_entropy_objective(weights);
    return ob;
  };
  Out out;
  for (int step = 0; step < 3; ++step) out.bits.push_back(float(e.train_mini_batch(micro, objective, e.lr(step)).loss));
  for (const model::Param* p : m->params())
    for (const Tensor* t : {&p->weight, &p->grad})
      for (float x : t->to_float_vector()) out.bits.push_back(x);
  return out;
}

void check(bool tp) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const Out base = train3(tp, dt, {});
    EXPECT_GT(base.bits.size(), size_t(1000));
    for (const model::RecomputePolicy& rp : modes()) {
      SCOPED_TRACE(rp.describe() + (tp ? " tp2+sp " : " dp2 ") + dtype_name(dt));
      const Out r = train3(tp, dt, rp);
      EXPECT_EQ(r.bits.size(), base.bits.size());
      EXPECT_TRUE(r.bits.size() == base.bits.size() &&
                  std::memcmp(r.bits.data(), base.bits.data(), r.bits.size() * sizeof(float)) == 0);
    }
  }
}

}  // namespace

TEST(RecomputeMpi, Tp2SequenceParallelIsBitIdenticalToNone) {
  if (kestrel::testing::world_group().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  check(true);
}

TEST(RecomputeMpi, Dp2IsBitIdenticalToNone) {
  if (kestrel::testing::world_group().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  check(false);
}
