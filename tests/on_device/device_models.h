// The device rollout tests' models and sampling settings: the tiny random
// model and the committed goldens on a device (or the host, for the CPU side of
// a comparison), and greedy / sampled requests that always run to max_tokens.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "common/testing.h"
#include "model/transformer.h"
#include "rollout/engine.h"
#include "../rollout/tiny_model.h"

namespace kestrel::rollout::testing {

// A fixture that skips without a device and initialises it otherwise.
class DeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::available()) GTEST_SKIP() << cuda::describe();
    cuda::init();
  }
};

// init_random draws on the host and copies to the device: the same weights on either.
inline std::unique_ptr<model::CausalLM> tiny_on(Device dev, DType dt) {
  model::ModelOptions o;
  o.dtype = dt;
  o.device = dev;
  return model::CausalLM::init_random(tiny_config(), o, 7, 0.1);
}

inline std::unique_ptr<model::CausalLM> golden_on(const std::string& name, Device dev) {
  model::ModelOptions o;
  o.device = dev;
  auto m = model::CausalLM::load(kestrel::testing::source_path("tests/golden/models/" + name), o);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  return m.is_ok() ? std::move(m).value() : nullptr;
}

// ignore_eos: the goldens have EOS ids, and every run must make the same number of tokens.
inline SamplingParams greedy(int64_t max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

inline SamplingParams sampled(int64_t n, uint64_t seed, int64_t max_tokens) {
  SamplingParams p;
  p.temperature = 0.9;
  p.top_k = 40;
  p.n = n;
  p.seed = seed;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

}  // namespace kestrel::rollout::testing
