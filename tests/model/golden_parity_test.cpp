// Parity with PyTorch/transformers, llm.c style: tiny random models of every
// architecture were run by tests/golden/models/make_golden.py; here Kestrel
// loads the same config.json + safetensors and must reproduce logits,
// per-token logprobs and entropies, the loss and every parameter gradient.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/golden_file.h"
#include "common/testing.h"
#include "io/safetensors.h"
#include "model/scoring.h"
#include "model/transformer.h"
#include "ops/loss.h"

using namespace kestrel;
namespace fs = std::filesystem;

namespace {

using Golden = kestrel::testing::GoldenFile;

std::string golden_dir(const std::string& c) { return kestrel::testing::source_path("tests/golden/models/" + c); }

// fp32: the criterion of the issue, 1e-4 relative to each tensor's scale.
// bf16: both sides round every op output to 8 mantissa bits but accumulate in
// different orders (and PyTorch keeps bf16 activation gradients where Kestrel
// keeps f32), so element errors of a few bf16 ulps (2^-8 = 0.4% each) compound
// through 2 layers; 3e-2 of scale for forward values and 6e-2 for gradients
// bounds that while still catching any wrong formula (those give O(1) errors).
struct Tol {
  double fwd, grad, scalar;
};
Tol tol_for(DType dt) { return dt == DType::F32 ? Tol{1e-4, 1e-4, 1e-5} : Tol{3e-2, 6e-2, 2e-2}; }

void check_case(const std::string& name, DType dt) {
  const std::string dir = golden_dir(name);
  ASSERT_TRUE(fs::exists(dir + "/golden.safetensors")) << dir;
  auto gf = io::SafetensorsFile::open(dir + "/golden.safetensors");
  ASSERT_TRUE(gf.is_ok()) << gf.status().message();
  Golden g{gf.value()};
  model::ModelOptions opts;
  opts.dtype = dt;
  auto loaded = model::CausalLM::load(dir, opts);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  auto& m = *loaded.value();
  m.enable_grads();
  const Tol tol = tol_for(dt);

  model::PackedBatch b = kestrel::testing::golden_batch(g);
  model::Activations acts;
  Tensor logits = m.forward(b, acts);
  EXPECT_LE(kestrel::testing::rel_to_scale(kestrel::testing::to_double(logits), kestrel::testing::to_double(g.get("logits"))), tol.fwd)
      << name << " logits";

  Tensor lp = Tensor::empty({b.num_tokens}, DType::F32), ent = Tensor::empty({b.num_tokens}, DType::F32);
  Tensor lse = Tensor::empty({b.num_tokens}, DType::F32);
  ops::logprob_entropy_fwd(logits, b.targets, lp, &ent, lse);
  EXPECT_LE(kestrel::testing::rel_to_scale(kestrel::testing::to_double(lp), kestrel::testing::to_double(g.get("logprobs"))), tol.fwd)
      << name << " logprobs";
  EXPECT_LE(kestrel::testing::rel_to_scale(kestrel::testing::to_double(ent), kestrel::testing::to_double(g.get("entropy"))), tol.fwd)
      << name << " entropy";

  Tensor logits32 = logits.to(DType::F32, MemCategory::Activations);
  double loss = ops::cross_entropy_fwd(logits32, b.targets, lse);
  EXPECT_NEAR(loss, g.get("loss").get(0), tol.scalar * std::abs(g.get("loss").get(0))) << name << " loss";
  ops::cross_entropy_bwd(logits32, b.targets, lse, 1.0, logits32);  // in place: the one [T, V] buffer
  m.backward(b, acts, logits32);
  int checked = 0;
  for (model::Param* p : m.params()) {
    const std::string key = "grad." + p->name;
    ASSERT_TRUE(g.has(key)) << name << ": golden has no " << key;
    EXPECT_LE(kestrel::testing::rel_to_scale(kestrel::testing::to_double(p->grad), kestrel::testing::to_double(g.get(key))), tol.grad)
        << name << " " << key;
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

}  // namespace

class GoldenF32 : public ::testing::TestWithParam<std::string> {};
TEST_P(GoldenF32, LogitsLogprobsLossAndGradsMatchTransformers) { check_case(GetParam(), DType::F32); }
INSTANTIATE_TEST_SUITE_P(Models, GoldenF32,
                         ::testing::Values("llama_tied", "llama3_untied_rope", "qwen2", "qwen2_yarn", "qwen3",
                                           "mistral"));

class GoldenBF16 : public ::testing::TestWithParam<std::string> {};
TEST_P(GoldenBF16, MatchesTransformersInBf16) { check_case(GetParam() + "_bf16", DType::BF16); }
INSTANTIATE_TEST_SUITE_P(Models, GoldenBF16, ::testing::Values("llama_tied", "qwen2", "qwen3", "mistral"));
