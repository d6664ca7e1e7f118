// Shared by the NCCL tests that train one layout twice, once with the model
// on the CPU (groups over MPI) and once on the device (NCCL), and compare
// (train_test.cpp, pipeline_test.cpp, cp_ep_test.cpp).
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/testing.h"
#include "model/transformer.h"
#include "train/engine.h"

namespace kestrel::testing {

// A few steps of one layout: their results and this rank's parameters after them.
struct TrainedRun {
  std::vector<train::MiniBatchResult> steps;
  std::vector<double> weights;  // this rank's parameters (shards), one after the other
};

// Every parameter of m widened to double, one after the other.
inline std::vector<double> flat_weights(model::CausalLM& m) {
  std::vector<double> out;
  for (const model::Param* p : m.params())
    for (double x : to_double(p->weight)) out.push_back(x);
  return out;
}

// As tests/on_device/train_on_device_test.cpp: f32 to float rounding of
// differently ordered sums (the GEMMs differ, so not bit for bit), bf16 to a
// few ulps of 2^-8.
struct TrainTol {
  double scalar, weights;
};
inline TrainTol train_tol(DType dt) { return dt == DType::F32 ? TrainTol{2e-5, 1e-5} : TrainTol{2e-2, 4e-3}; }

// The device run equals the CPU run: every device step finite, losses and
// gradient norms within tol.scalar relative, weights within tol.weights of
// their scale; and clipping acted (the CPU's first gradient norm above
// min_grad_norm, the clip threshold), so the comparison covers it.
inline void expect_same_training(const TrainedRun& cpu, const TrainedRun& dev, TrainTol tol, double min_grad_norm,
                                 const std::string& what) {
  ASSERT_EQ(cpu.steps.size(), dev.steps.size()) << what;
  for (size_t s = 0; s < cpu.steps.size(); ++s) {
    EXPECT_TRUE(dev.steps[s].finite) << what << " step " << s;
    EXPECT_NEAR(dev.steps[s].loss, cpu.steps[s].loss, tol.scalar * std::abs(cpu.steps[s].loss))
        << what << " step " << s;
    EXPECT_NEAR(dev.steps[s].grad_norm, cpu.steps[s].grad_norm, tol.scalar * cpu.steps[s].grad_norm)
        << what << " step " << s;
  }
  ASSERT_FALSE(cpu.steps.empty()) << what;
  EXPECT_GT(cpu.steps[0].grad_norm, min_grad_norm) << what << ": clipping should act in this test";
  ASSERT_FALSE(cpu.weights.empty()) << what;
  EXPECT_LE(rel_to_scale(dev.weights, cpu.weights), tol.weights) << what;
}

}  // namespace kestrel::testing
