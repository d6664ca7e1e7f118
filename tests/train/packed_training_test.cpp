// The training forward through a mini-batch's packed weights
// (model::TrainPacksScope; train/engine.cpp packs bf16 weights once per
// mini-batch): the same loss and gradients as the unpacked path to the
// tolerance of another summation order, and recompute's reruns read the same
// packs.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/packed_linear.h"
#include "model/recompute.h"
#include "model/transformer.h"
#include "rollout/tiny_model.h"
#include "train/token_objective.h"

using namespace kestrel;

namespace {

// Sequences of the tiny prompts with a few continuation tokens: 45-61 rows each.
model::PackedBatch scoring_batch() {
  std::vector<std::vector<int32_t>> seqs;
  for (auto p : rollout::testing::tiny_prompts()) {
    for (int32_t t = 0; t < 11; ++t) p.push_back((t * 37 + 5) % 128);
    seqs.push_back(p);
  }
  return model::pack_sequences(seqs);
}

// A training mini-batch's forward through packs (model::TrainPacksScope, what
// train/engine.cpp does for bf16 weights): the loss and every gradient as the
// unpacked path's to the tolerance of another summation order; the
// backward's recompute reruns read the same packs, so recompute changes no
// bit of the packed path, as it changes none of the plain one.
TEST(PackedTraining, ThroughPacksMatchesPlainTraining) {
  std::string why;
  if (!cpu::packed_linear_enabled(&why)) GTEST_SKIP() << "packing is off here: " << why;
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const model::PackedBatch b = scoring_batch();
    const std::vector<float> w(size_t(b.num_tokens), 1.0f / float(b.num_tokens));
    const train::TokenObjective objective = train::cross_entropy_objective(w);
    struct Run {
      double loss = 0;
      std::vector<std::vector<float>> grads;
      int64_t packs = 0;
    };
    auto run = [&](bool packed, bool recompute) {
      model::ModelOptions o;
      o.dtype = dt;
      if (recompute)
        o.recompute = model::make_recompute_policy("full", "uniform", 1, {}, false, -1, false, -1, "").value();
      auto m = model::CausalLM::init_random(rollout::testing::tiny_config(true), o, 7, 0.1);
      m->enable_grads();
      cpu::WeightPacks packs;
      Run r;
      {
        model::TrainPacksScope scope(*m, packed ? &packs : nullptr);
        r.loss = train::forward_backward(*m, b, objective, false).loss;
      }
      EXPECT_EQ(m->train_packs(), nullptr);  // the scope ended
      r.packs = packs.count();
      for (const model::Param* p : m->params()) {
        std::vector<float> g(size_t(p->grad.numel()));
        for (int64_t i = 0; i < p->grad.numel(); ++i) g[size_t(i)] = p->grad.get(i);
        r.grads.push_back(std::move(g));
      }
      return r;
    };
    const Run plain = run(false, false), packed = run(true, false), packed_rc = run(true, true);
    EXPECT_EQ(packed.packs > 0, cpu::packed_linear_bytes(64, 64, dt) > 0);
    // f32: another summation order (~1e-6 relative). bf16: a projection's
    // output rounded to bf16 may land one ulp apart (2^-8 relative), which
    // the loss and the gradients carry at that size.
    const double tol = dt == DType::F32 ? 1e-4 : 3e-2;
    EXPECT_NEAR(packed.loss, plain.loss, tol * std::fabs(plain.loss));
    ASSERT_EQ(packed.grads.size(), plain.grads.size());
    for (size_t k = 0; k < plain.grads.size(); ++k) {
      double scale = 0, worst = 0;
      for (size_t i = 0; i < plain.grads[k].size(); ++i) {
        scale = std::max(scale, double(std::fabs(plain.grads[k][i])));
        worst = std::max(worst, double(std::fabs(packed.grads[k][i] - plain.grads[k][i])));
      }
      EXPECT_LE(worst, tol * scale + 1e-12) << "parameter " << k;
      EXPECT_EQ(packed_rc.grads[k], packed.grads[k]) << "parameter " << k << ": recompute's rerun changed a bit";
    }
    EXPECT_EQ(packed_rc.loss, packed.loss);
  }
}

}  // namespace
