// MoE and MLA models in the training engine, on the tiny transformers goldens
// (tests/golden/models/, Qwen3-MoE and DeepSeek-V3): activation recompute
// trains bit-identically to none; the router statistics count every routed
// slot once (also under full recompute); capacity dropping drops what
// Megatron's rule says and is the identity when nothing overflows; the router
// losses enter the update as their mean over the mini-batch's micro-batches;
// the aux-loss-free bias update moves each expert's correction bias by the
// rate against its load.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "common/testing.h"
#include "model/batch.h"
#include "model/moe_mlp.h"
#include "train/engine.h"
#include "train/token_objective.h"

namespace kestrel::train {
namespace {

std::string golden(const std::string& c) { return kestrel::testing::source_path("tests/golden/models/" + c); }

// Token sequences inside the goldens' vocabulary (96).
std::vector<std::vector<int32_t>> sequences(int n, int len0, int salt = 0) {
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> s;
    for (int t = 0; t < len0 + (i * 5 + salt) % 9; ++t) s.push_back(int32_t(1 + (i * 37 + t * 11 + salt) % 95));
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<MicroBatch> two_micro_batches(const std::vector<std::vector<int32_t>>& seqs) {
  std::vector<MicroBatch> micro(2);
  const size_t h = seqs.size() / 2;
  micro[0].batch = model::pack_sequences({seqs.begin(), seqs.begin() + long(h)});
  micro[1].batch = model::pack_sequences({seqs.begin() + long(h), seqs.end()});
  return micro;
}

ObjectiveFn mean_nll(const std::vector<std::vector<int32_t>>& seqs, float scale = 1.f) {
  int64_t n = 0;
  for (const auto& s : seqs) n += int64_t(s.size()) - 1;
  const float w = scale / float(n);
  return [w](const MicroBatch& mb, size_t) {
    std::vector<float> weights;
    for (int32_t t : mb.batch.host.targets) weights.push_back(t >= 0 ? w : 0.f);
    Objective o;
    o.tokens = cross_entropy_objective(weights);
    o.need_entropy_grad = false;
    return o;
  };
}

std::unique_ptr<model::CausalLM> load(const std::string& c, const model::ModelOptions& o) {
  auto m = model::CausalLM::load(golden(c), o);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  return std::move(m.value());
}

model::MoeTrainOptions router_losses(const std::string& c) {
  model::MoeTrainOptions moe;
  moe.load_balancing_type = c.rfind("deepseek", 0) == 0 ? "seq_aux_loss" : "aux_loss";
  moe.aux_loss_coeff = 0.01;
  moe.z_loss_coeff = 0.001;
  return moe;
}

EngineOptions engine_options() {
  EngineOptions eo;
  eo.lr.lr = 1e-2;
  eo.lr.total_steps = 10;
  eo.clip_grad = 1.0;
  return eo;
}

std::vector<double> flat(model::CausalLM& m, bool grads) {
  std::vector<double> out;
  for (const model::Param* p : m.params())
    for (double x : kestrel::testing::to_double(grads ? p->grad : p->weight)) out.push_back(x);
  return out;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

struct TrainedRun {
  std::vector<double> weights, grads, losses;
  std::vector<model::MoeStepStats> stats;
};

TrainedRun train3(const std::string& c, DType dt, const model::RecomputePolicy& rp, const model::MoeTrainOptions& moe) {
  model::ModelOptions o;
  o.dtype = dt;
  o.recompute = rp;
  o.moe = moe;
  auto m = load(c, o);
  TrainingEngine e(*m, engine_options());
  const auto seqs = sequences(6, 7);
  const auto micro = two_micro_batches(seqs);
  TrainedRun r;
  for (int step = 0; step < 3; ++step) {
    const MiniBatchResult res = e.train_mini_batch(micro, mean_nll(seqs), e.lr(step));
    r.losses.push_back(res.loss);
    r.stats.push_back(res.moe);
  }
  r.weights = flat(*m, false);
  r.grads = flat(*m, true);
  return r;
}

model::RecomputePolicy policy(const std::string& gran, const std::string& method, int64_t n,
                              std::vector<std::string> modules = {}, bool act = false, bool norm = false) {
  auto r = model::make_recompute_policy(gran, method, n, modules, act, -1, norm, -1, "");
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r.is_ok() ? r.value() : model::RecomputePolicy();
}

// Every recompute mode that applies to MoE / MLA layers, with the router
// losses and capacity dropping on: the same bits as keeping everything.
TEST(MoeEngine, RecomputeTrainsBitIdenticallyToNone) {
  const std::vector<model::RecomputePolicy> modes = {
      policy("full", "uniform", 1), policy("full", "block", 2), policy("selective", "", -1, {"core_attn"}),
      policy("selective", "", -1, {"layernorm"}), policy("selective", "", -1, {"mlp"}),
      policy("", "", -1, {}, /*act=*/true), policy("", "", -1, {}, false, /*norm=*/true),
      policy("full", "block", 1, {}, true, true)};
  for (const char* c : {"qwen3_moe", "deepseek_v3"})
    for (DType dt : {DType::F32, DType::BF16}) {
      model::MoeTrainOptions moe = router_losses(c);
      moe.capacity_factor = 1.0;  // drops some slots of these skewed routings
      const TrainedRun none = train3(c, dt, {}, moe);
      for (const auto& rp : modes) {
        SCOPED_TRACE(std::string(c) + " " + dtype_name(dt) + " " + rp.describe());
        const TrainedRun r = train3(c, dt, rp, moe);
        EXPECT_EQ(r.losses, none.losses);
        EXPECT_TRUE(same_bits(r.grads, none.grads));
        EXPECT_TRUE(same_bits(r.weights, none.weights));
        // Statistics from the forwards that ran, not from recompute reruns.
        for (size_t s = 0; s < r.stats.size(); ++s)
          for (size_t l = 0; l < r.stats[s].layers.size(); ++l) {
            EXPECT_EQ(r.stats[s].layers[l].tokens_per_expert, none.stats[s].layers[l].tokens_per_expert);
            EXPECT_EQ(r.stats[s].layers[l].micro_batches, 2);
          }
      }
    }
}

// Dropless: every token's k slots are routed once, in every MoE layer.
TEST(MoeEngine, StatisticsConserveTokens) {
  const TrainedRun r = train3("qwen3_moe", DType::F32, {}, {});
  const auto seqs = sequences(6, 7);
  int64_t T = 0;
  for (const auto& s : seqs) T += int64_t(s.size());
  ASSERT_EQ(r.stats[0].layers.size(), 3u);
  for (const auto& l : r.stats[0].layers) {
    int64_t routed = 0;
    for (int64_t c : l.tokens_per_expert) routed += c;
    EXPECT_EQ(routed, T * 2) << "layer " << l.layer;  // top-2
    EXPECT_EQ(l.tokens, T);
    EXPECT_EQ(l.dropped, 0);
  }
}

// Megatron's capacity: ceil(T*k/E * factor) per expert and micro-batch; a
// factor no expert reaches changes nothing; padding to capacity computes zero
// rows and changes nothing either (to the GEMM's rounding, which may depend on
// the row count).
TEST(MoeEngine, CapacityDropsOverflowAndIsTheIdentityBelowIt) {
  const TrainedRun dropless = train3("qwen3_moe", DType::F32, {}, {});
  model::MoeTrainOptions big;
  big.capacity_factor = 100.0;
  const TrainedRun roomy = train3("qwen3_moe", DType::F32, {}, big);
  EXPECT_TRUE(same_bits(roomy.weights, dropless.weights));
  model::MoeTrainOptions tight;
  tight.capacity_factor = 0.5;
  const TrainedRun dropped = train3("qwen3_moe", DType::F32, {}, tight);
  for (const auto& l : dropped.stats[0].layers) {
    EXPECT_GT(l.dropped, 0) << "layer " << l.layer;
    int64_t kept = 0;
    for (int64_t c : l.tokens_per_expert) kept += c;
    EXPECT_EQ(kept + l.dropped, l.tokens * 2);
  }
  model::MoeTrainOptions padded = tight;
  padded.pad_to_capacity = true;
  const TrainedRun pad = train3("qwen3_moe", DType::F32, {}, padded);
  // (AdamW turns rounding-level gradient differences of near-zero elements
  // into differences of a small fraction of a step, lr = 1e-2.)
  EXPECT_TRUE(kestrel::testing::all_close(pad.losses, dropped.losses, {0, 1e-6}, "padded losses"));
  EXPECT_TRUE(kestrel::testing::all_close(pad.weights, dropped.weights, {1e-4, 0}, "padded"));
  EXPECT_EQ(pad.stats[0].layers[0].dropped, dropped.stats[0].layers[0].dropped);
}

// The router losses' gradient in an update of two micro-batches is the mean
// of the two micro-batches' gradients (Megatron scales each by
// 1/num_micro_batches): an update whose token loss has weight 0 carries only
// the router losses' gradient, equal to (g0 + g1) / 2 computed one
// micro-batch at a time.
TEST(MoeEngine, RouterLossesEnterAsTheirMicroBatchMean) {
  const std::string c = "deepseek_v3";
  const auto seqs = sequences(6, 7);
  const auto micro = two_micro_batches(seqs);
  model::ModelOptions o;
  o.moe = router_losses(c);
  auto m_update = load(c, o);
  EngineOptions eo = engine_options();
  eo.clip_grad = 0;  // measure only
  TrainingEngine e(*m_update, eo);
  e.train_mini_batch(micro, mean_nll(seqs, /*scale=*/0.f), 0.0);
  const std::vector<double> update = flat(*m_update, true);
  auto m = load(c, o);
  m->enable_grads();
  m->set_moe_loss_scale(0.5);
  for (const MicroBatch& mb : micro) {
    model::Activations acts;
    Tensor logits = m->forward(mb.batch, acts);
    Tensor zero = Tensor::zeros({logits.size(0), logits.size(1)}, DType::F32, MemCategory::Activations);
    m->backward(mb.batch, acts, zero);
  }
  const std::vector<double> by_hand = flat(*m, true);
  double scale = 0;
  for (double x : by_hand) scale = std::max(scale, std::abs(x));
  EXPECT_GT(scale, 1e-6) << "the router losses must have a gradient to compare";
  EXPECT_TRUE(kestrel::testing::all_close(update, by_hand, {1e-7 * scale, 1e-6}, "router-loss gradient"));
}

// DeepSeek-V3's aux-loss-free balancing: after an applied step each layer's
// e_score_correction_bias moved by rate * sign(mean load - load) with the
// loads of the step's forwards; with rate 0 it stays.
TEST(MoeEngine, CorrectionBiasMovesAgainstTheStepsLoad) {
  for (double rate : {0.0, 1e-3}) {
    model::ModelOptions o;
    o.moe.bias_update_rate = rate;
    auto m = load("deepseek_v3", o);
    std::vector<std::vector<double>> before;
    for (model::Param* b : m->buffers()) before.push_back(kestrel::testing::to_double(b->weight));
    ASSERT_EQ(before.size(), 2u);
    TrainingEngine e(*m, engine_options());
    const auto seqs = sequences(6, 7);
    const MiniBatchResult r = e.train_mini_batch(two_micro_batches(seqs), mean_nll(seqs), e.lr(0));
    ASSERT_TRUE(r.finite);
    ASSERT_EQ(r.moe.layers.size(), 2u);
    const std::vector<model::Param*> bufs = m->buffers();
    for (size_t l = 0; l < bufs.size(); ++l) {
      const std::vector<int64_t>& load = r.moe.layers[l].tokens_per_expert;
      double mean = 0;
      for (int64_t x : load) mean += double(x) / double(load.size());
      const std::vector<double> after = kestrel::testing::to_double(bufs[l]->weight);
      for (size_t i = 0; i < load.size(); ++i) {
        const double off = mean - double(load[i]);
        const double want = double(float(before[l][i]) + float(rate) * float((off > 0) - (off < 0)));
        EXPECT_EQ(after[i], want) << "layer " << r.moe.layers[l].layer << " expert " << i << " rate " << rate;
      }
    }
  }
}

}  // namespace
}  // namespace kestrel::train
