// The transformers parity goldens of tests/model/golden_parity_test.cpp (and
// the MoE / MLA ones of moe_golden_test.cpp, routing free) with
// the model on the device (ModelOptions::device = cuda): weights loaded from
// the folder and copied over, the packed batch moved with model::to_device,
// then logits, log-probs, entropies, the loss and every parameter gradient
// against the same PyTorch goldens and the same tolerances. Runs on a GPU
// (the cuda preset) and on the CPU emulator (the cuda-emu preset, make test);
// skipped where neither is.
#include <gtest/gtest.h>

#include <filesystem>

#include "backend/cuda/cuda_backend.h"
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

// The tolerances of tests/model/golden_parity_test.cpp (its comment gives the arithmetic).
struct Tol {
  double fwd, grad, scalar;
};
Tol tol_for(DType dt) { return dt == DType::F32 ? Tol{1e-4, 1e-4, 1e-5} : Tol{3e-2, 6e-2, 2e-2}; }

double rel(const Tensor& got, const Tensor& want) {
  return kestrel::testing::rel_to_scale(kestrel::testing::to_double(got), kestrel::testing::to_double(want));
}

class GoldenOnDevice : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!cuda::available()) GTEST_SKIP() << cuda::describe();
    cuda::init();
  }
};

void check_case(const std::string& name, DType dt) {
  const std::string dir = kestrel::testing::source_path("tests/golden/models/" + name);
  auto gf = io::SafetensorsFile::open(dir + "/golden.safetensors");
  ASSERT_TRUE(gf.is_ok()) << gf.status().message();
  Golden g{gf.value()};
  model::ModelOptions opts;
  opts.dtype = dt;
  opts.device = Device::CUDA;
  auto loaded = model::CausalLM::load(dir, opts);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  auto& m = *loaded.value();
  m.enable_grads();
  for (model::Param* p : m.params()) {
    ASSERT_EQ(p->weight.device(), Device::CUDA) << p->name;
    ASSERT_EQ(p->grad.device(), Device::CUDA) << p->name;
  }
  const Tol tol = tol_for(dt);

  const model::PackedBatch b = model::to_device(kestrel::testing::golden_batch(g), Device::CUDA);
  model::Activations acts;
  Tensor logits = m.forward(b, acts);
  ASSERT_EQ(logits.device(), Device::CUDA);
  EXPECT_LE(rel(logits, g.get("logits")), tol.fwd) << name << " logits";

  const model::TokenScores s = model::score_logits(m, b, logits);
  EXPECT_LE(rel(s.logprob, g.get("logprobs")), tol.fwd) << name << " logprobs";
  EXPECT_LE(rel(s.entropy, g.get("entropy")), tol.fwd) << name << " entropy";

  const int64_t T = b.num_tokens;
  Tensor lse = Tensor::empty({T}, DType::F32, MemCategory::Activations, Device::CUDA);
  Tensor logits32 = Tensor::empty(logits.shape(), DType::F32, MemCategory::Activations, Device::CUDA);
  logits32.copy_from(logits);
  const double loss = ops::cross_entropy_fwd(logits32, b.targets, lse);
  const double want = g.get("loss").get(0);
  EXPECT_NEAR(loss, want, tol.scalar * std::abs(want)) << name << " loss";
  ops::cross_entropy_bwd(logits32, b.targets, lse, 1.0, logits32);
  m.backward(b, acts, logits32);
  int checked = 0;
  for (model::Param* p : m.params()) {
    const std::string key = "grad." + p->name;
    ASSERT_TRUE(g.has(key)) << name << ": golden has no " << key;
    EXPECT_LE(rel(p->grad, g.get(key)), tol.grad) << name << " " << key;
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

TEST_P(GoldenOnDevice, F32MatchesTransformers) { check_case(GetParam(), DType::F32); }
INSTANTIATE_TEST_SUITE_P(Models, GoldenOnDevice,
                         ::testing::Values("llama_tied", "qwen2_yarn", "qwen3", "mistral", "qwen2_moe", "qwen3_moe",
                                           "deepseek_v2", "deepseek_v3"));

class GoldenOnDeviceBf16 : public GoldenOnDevice {};
TEST_P(GoldenOnDeviceBf16, Bf16MatchesTransformers) { check_case(GetParam() + "_bf16", DType::BF16); }
INSTANTIATE_TEST_SUITE_P(Models, GoldenOnDeviceBf16, ::testing::Values("qwen2", "qwen3"));

}  // namespace
