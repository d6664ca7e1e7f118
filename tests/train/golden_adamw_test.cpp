// Three AdamW steps against PyTorch: the losses before each step and the
// parameters after the third (tests/golden/models/*/golden.safetensors keys
// adamw_loss and adamw_final.*). torch.optim.AdamW there decays every parameter.
#include <gtest/gtest.h>

#include "common/testing.h"
#include "io/safetensors.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "train/token_objective.h"

using namespace kestrel;

namespace {

model::PackedBatch golden_batch(const io::SafetensorsFile& g) {
  Tensor ids = g.get("input_ids").value().to(DType::I64);
  Tensor cu = g.get("cu_seqlens").value().to(DType::I64);
  std::vector<std::vector<int32_t>> seqs;
  for (int64_t s = 0; s + 1 < cu.numel(); ++s) {
    std::vector<int32_t> q;
    for (int64_t t = cu.data<int64_t>()[s]; t < cu.data<int64_t>()[s + 1]; ++t) q.push_back(int32_t(ids.data<int64_t>()[t]));
    seqs.push_back(q);
  }
  return model::pack_sequences(seqs);
}

}  // namespace

class GoldenAdamW : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenAdamW, ThreeStepsMatchTorch) {
  const std::string dir = kestrel::testing::source_path("tests/golden/models/" + GetParam());
  auto g = io::SafetensorsFile::open(dir + "/golden.safetensors");
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  auto loaded = model::CausalLM::load(dir);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  auto& m = *loaded.value();
  m.enable_grads();
  std::vector<optim::ParamSlot> slots;
  for (model::Param* p : m.params()) slots.push_back({p->name, p->weight, p->grad, Tensor(), true});
  optim::AdamW opt(slots, {0.9, 0.95, 1e-8, 0.1});

  model::PackedBatch b = golden_batch(*g.value());
  int64_t n_targets = 0;
  for (int64_t t = 0; t < b.num_tokens; ++t) n_targets += b.targets.data<int32_t>()[t] >= 0;
  std::vector<float> w(size_t(b.num_tokens));
  for (int64_t t = 0; t < b.num_tokens; ++t) w[size_t(t)] = b.targets.data<int32_t>()[t] >= 0 ? 1.0f / float(n_targets) : 0.f;

  Tensor want_losses = g.value()->get("adamw_loss").value();
  for (int step = 0; step < 3; ++step) {
    m.zero_grads();
    auto r = train::forward_backward(m, b, train::cross_entropy_objective(w));
    EXPECT_NEAR(r.loss, want_losses.get(step), 1e-5 * std::abs(want_losses.get(step))) << "step " << step;
    opt.step(1e-2);
  }
  // AdamW divides by sqrt(v): for gradients near 1e-7 float rounding moves the
  // update by up to ~2.5e-4 (measured by the golden script's author against an
  // independent AdamW), so parameters compare at 1e-3 absolute.
  for (model::Param* p : m.params()) {
    Tensor want = g.value()->get("adamw_final." + p->name).value();
    EXPECT_TRUE(kestrel::testing::all_close(kestrel::testing::to_double(p->weight), kestrel::testing::to_double(want), {1e-3, 0}, p->name));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GoldenAdamW,
                         ::testing::Values("llama_tied", "llama3_untied_rope", "qwen2", "qwen2_yarn", "qwen3",
                                           "mistral"));
