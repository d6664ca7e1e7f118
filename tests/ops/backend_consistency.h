// The fixture of the backend-consistency harness (backend_consistency*_test.cpp):
// every op with a device kernel runs on the device and on the CPU from the same
// inputs and must agree within the tolerance of the output's dtype. Skipped
// where no device is present, unless KESTREL_TEST_CONSISTENCY_ON_CPU=1 (CPU
// against CPU: a dry run of the tests' shapes and arguments).
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/testing.h"
#include "op_harness.h"

namespace kestrel::testing {

class BackendConsistency : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    for (Device d : testing::available_devices())
      if (d != Device::CPU) dev_ = d;
    // KESTREL_TEST_CONSISTENCY_ON_CPU=1 runs the CPU against itself: a dry run of this file's
    // shapes and arguments where no device is present, so device time is not spent on a test's typo.
    const char* dry = std::getenv("KESTREL_TEST_CONSISTENCY_ON_CPU");
    if (dev_ == Device::CPU && !(dry && std::string(dry) == "1"))
      GTEST_SKIP() << "no device backend here (build the cuda preset and run on a machine with a GPU)";
  }
  DType dt() const { return GetParam(); }
  // A host tensor of n random values (scale s) rounded to dt, shaped `shape`.
  Tensor host(Shape shape, DType dt, uint64_t seed, double s = 1.0) const {
    const int64_t n = shape_numel(shape);
    return make_tensor(randn(n, seed, s), std::move(shape), dt);
  }
  Tensor on_dev(const Tensor& h) const {
    return h.copy_to(dev_);
  }
  // Device result against the CPU's, within the tolerance of the stored dtype.
  static ::testing::AssertionResult agree(const Tensor& dev_t, const Tensor& cpu_t, const std::string& what,
                                          double widen = 1.0) {
    testing::Tolerance tol = testing::tolerance_for(cpu_t.dtype());
    tol.atol *= widen;
    tol.rtol *= widen;
    return testing::all_close(testing::to_double(dev_t), testing::to_double(cpu_t), tol, what);
  }
  static void expect_bits(const Tensor& dev_t, const Tensor& cpu_t, const std::string& what) {
    EXPECT_EQ(dev_t.to_float_vector(), cpu_t.to_float_vector()) << what;
  }
  Device dev_ = Device::CPU;
};

}  // namespace kestrel::testing
