// Shared test helpers: tolerance comparison with NaN/Inf position checks, and
// central finite differences in double for backward checks.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kestrel::testing {

// A file of the source tree: under KESTREL_SOURCE_DIR when the environment
// sets it (a test binary carried to another machine, scripts/device_check.sh),
// else under the tree the binary was built from.
inline std::string source_path(const std::string& rel) {
  const char* env = std::getenv("KESTREL_SOURCE_DIR");
  return std::string(env && *env ? env : KESTREL_SOURCE_DIR) + "/" + rel;
}

struct Tolerance {
  double atol = 1e-5;
  double rtol = 1e-5;
};
// Per-dtype defaults for comparing a kernel against the double reference.
inline Tolerance tolerance_for(DType t) {
  switch (t) {
    case DType::BF16: return {1e-2, 1.6e-2};  // 8 mantissa bits: one ulp is 2^-8 relative
    case DType::F16: return {1e-3, 2e-3};
    default: return {1e-5, 1e-4};
  }
}

// Asserts |got - want| <= atol + rtol*|want| elementwise, and that NaN/Inf sit at the same positions.
inline ::testing::AssertionResult all_close(const std::vector<double>& got, const std::vector<double>& want,
                                            Tolerance tol, const std::string& what = "") {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << want.size();
  size_t bad = 0, first = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    if (std::isnan(w) || std::isnan(g)) {
      if (std::isnan(w) != std::isnan(g)) return ::testing::AssertionFailure() << what << ": NaN mismatch at " << i << " got " << g << " want " << w;
      continue;
    }
    if (std::isinf(w) || std::isinf(g)) {
      if (g != w) return ::testing::AssertionFailure() << what << ": Inf mismatch at " << i << " got " << g << " want " << w;
      continue;
    }
    const double err = std::abs(g - w), lim = tol.atol + tol.rtol * std::abs(w);
    if (err > lim) {
      if (!bad) first = i;
      ++bad;
      worst = std::max(worst, err);
    }
  }
  if (bad)
    return ::testing::AssertionFailure() << what << ": " << bad << "/" << got.size() << " elements out of tolerance (atol "
                                         << tol.atol << ", rtol " << tol.rtol << "); first at " << first << ": got "
                                         << got[first] << " want " << want[first] << "; worst abs err " << worst;
  return ::testing::AssertionSuccess();
}

inline std::vector<double> to_double(const Tensor& t) {
  auto f = t.to_float_vector();
  return std::vector<double>(f.begin(), f.end());
}

// Max |a-b| / max(max|b|, tiny): "relative to its scale", the golden-file criterion.
// A NaN, an Inf or a length mismatch is an infinite error: std::max alone
// would skip a NaN (every comparison with it is false) and pass a broken result.
inline double rel_to_scale(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double scale = 1e-30, err = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    // Equal values (the same infinity included) and NaN where NaN is wanted are exact.
    if (got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]))) {
      if (std::isfinite(want[i])) scale = std::max(scale, std::abs(want[i]));
      continue;
    }
    const double d = std::abs(got[i] - want[i]);
    if (!std::isfinite(d)) return std::numeric_limits<double>::infinity();
    scale = std::max(scale, std::abs(want[i]));
    err = std::max(err, d);
  }
  return err / scale;
}

// Central differences of a scalar function of x, in double: d f / d x_i.
inline std::vector<double> finite_difference(const std::function<double(const std::vector<double>&)>& f,
                                             std::vector<double> x, double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

// Sets (value != nullptr) or unsets an environment variable for a scope, then
// restores what it was.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace kestrel::testing

#if KESTREL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace kestrel::testing {
// Devices the op harness runs on: CPU always; CUDA when built (the cuda preset)
// and a device is present (initialised on first use). KESTREL_TEST_CUDA=0 leaves it out.
inline std::vector<Device> available_devices() {
#if KESTREL_HAVE_CUDA
  static const bool cuda = [] {
    const char* e = std::getenv("KESTREL_TEST_CUDA");
    if ((e && std::string(e) == "0") || !cuda::available()) return false;
    cuda::init();
    return true;
  }();
  if (cuda) return {Device::CPU, Device::CUDA};
#endif
  return {Device::CPU};
}
}  // namespace kestrel::testing
