// Helpers for op tests: random inputs rounded to the storage dtype, tensors
// built from double values on a test device, values read back as double, and
// the finite-difference check of a reference backward. Stable and simple on
// purpose: every tests/ops/*_test.cpp may include it.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/testing.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "isa_harness.h"

namespace kestrel::testing {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// The floating dtypes every dense op is tested in.
inline std::vector<DType> float_dtypes() { return {DType::F32, DType::BF16}; }

// "cpu/bf16": for SCOPED_TRACE.
inline std::string case_name(Device dev, DType dt) { return std::string(device_name(dev)) + "/" + dtype_name(dt); }

// n standard-normal values (times scale) from a Philox stream: reproducible per seed.
inline std::vector<double> randn(int64_t n, uint64_t seed, double scale = 1.0) {
  Philox rng{0x5eedULL, seed};
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * double(rng.normal(uint64_t(i)));
  return v;
}

// The value v takes once stored as dt (what the kernel sees; feed these to the reference).
inline double round_to(double v, DType dt) {
  const float f = float(v);
  if (dt == DType::BF16) return double(round_bf16(f));
  if (dt == DType::F16) return double(f16_to_float(float_to_f16(f)));
  return double(f);
}
inline std::vector<double> round_to(std::vector<double> v, DType dt) {
  for (double& x : v) x = round_to(x, dt);
  return v;
}

// A tensor of dtype dt on dev holding v (rounded to dt).
inline Tensor make_tensor(const std::vector<double>& v, Shape shape, DType dt, Device dev = Device::CPU) {
  KS_CHECK(int64_t(v.size()) == shape_numel(shape), "make_tensor: ", v.size(), " values for ", shape_str(shape));
  Tensor t = Tensor::empty(std::move(shape), dt, MemCategory::Other, Device::CPU);
  for (size_t i = 0; i < v.size(); ++i) t.set(int64_t(i), float(v[i]));
  if (dev == Device::CPU) return t;
  Tensor d = Tensor::empty(t.shape(), dt, MemCategory::Other, dev);
  d.copy_from(t);  // host to device, same dtype: the bits as set() rounded them
  return d;
}
// An output tensor pre-filled with NaN: an op that writes (=) every element must overwrite all of them.
inline Tensor nan_tensor(Shape shape, DType dt, Device dev = Device::CPU) {
  const size_t n = size_t(shape_numel(shape));
  return make_tensor(std::vector<double>(n, kNaN), std::move(shape), dt, dev);
}
inline Tensor make_ids(const std::vector<int32_t>& v, Device dev = Device::CPU) {
  Tensor t = Tensor::from_ints(v, {int64_t(v.size())});
  if (dev == Device::CPU) return t;
  Tensor d = Tensor::empty(t.shape(), t.dtype(), MemCategory::Other, dev);
  d.copy_from(t);
  return d;
}

// Host copy of a tensor's values as double.
inline std::vector<double> values(const Tensor& t) { return to_double(t); }

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}
inline std::vector<double> axpy(double alpha, const std::vector<double>& x, std::vector<double> y) {
  for (size_t i = 0; i < y.size(); ++i) y[i] += alpha * x[i];
  return y;
}
// Slice [begin, begin + n) of a flat vector (to split a packed parameter vector).
inline std::vector<double> part(const std::vector<double>& v, size_t begin, size_t n) {
  return std::vector<double>(v.begin() + long(begin), v.begin() + long(begin + n));
}
inline std::vector<double> concat(std::initializer_list<std::vector<double>> parts) {
  std::vector<double> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// Checks an analytic gradient (the reference backward) against central
// differences of the scalar function L at x, all in double.
inline ::testing::AssertionResult matches_finite_difference(const std::function<double(const std::vector<double>&)>& L,
                                                            const std::vector<double>& x,
                                                            const std::vector<double>& analytic,
                                                            const std::string& what, Tolerance tol = {1e-6, 1e-5}) {
  return all_close(analytic, finite_difference(L, x), tol, what + " vs finite differences");
}

// all_close with the tolerance of the dtype the result was stored in.
inline ::testing::AssertionResult close_for(DType stored, const std::vector<double>& got,
                                            const std::vector<double>& want, const std::string& what) {
  return all_close(got, want, tolerance_for(stored), what);
}

}  // namespace kestrel::testing

// Expects stmt to throw kestrel::Error with `needle` in its message.
#define EXPECT_THROW_MSG(stmt, needle)                                                                    \
  do {                                                                                                    \
    try {                                                                                                 \
      stmt;                                                                                               \
      ADD_FAILURE() << #stmt " did not throw";                                                            \
    } catch (const ::kestrel::Error& e) {                                                                 \
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();        \
    }                                                                                                     \
  } while (0)
