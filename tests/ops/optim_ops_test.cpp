// ops/optim_ops.h: the AdamW step, sum of squares and in-place scale on every
// backend against the scalar reference: the double instantiation within f32
// tolerance, and the f32 instantiation bit for bit (the kernels keep torch's
// f32 arithmetic: two explicit fused multiply-adds, nothing else fused).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")  // this file's own f32 arithmetic, as the kernels'
#endif
#include "ops/optim_ops.h"

#include <gtest/gtest.h>

#include "core/parallel_for.h"
#include "op_harness.h"
#include "ops/ref/optim_ref.h"

namespace kestrel {
namespace {

using namespace testing;

struct AdamState {
  std::vector<float> w, m, v;
};

AdamState initial(int64_t n, uint64_t seed) {
  auto f = [](const std::vector<double>& d) { return std::vector<float>(d.begin(), d.end()); };
  AdamState s{f(randn(n, seed, 2.0)), f(randn(n, seed + 1, 0.1)), {}};
  s.v = f(randn(n, seed + 2, 0.05));
  for (float& x : s.v) x = x * x;  // second moments are >= 0
  return s;
}

std::vector<float> grads(int64_t n, int step) {
  const auto d = randn(n, 100 + uint64_t(step), 0.5);
  return std::vector<float>(d.begin(), d.end());
}

AdamWScalars scalars(int64_t t, bool decay, double lr = 1e-2) {
  return AdamWScalars::make(lr, 0.9, 0.999, 1e-8, 0.1, t, decay);
}

// Runs `steps` steps of the op on dev; returns the final state (and the model copy as float).
AdamState run_op(Device dev, const AdamState& s0, int steps, bool decay, DType copy_dt, std::vector<float>* copy) {
  const int64_t n = int64_t(s0.w.size());
  auto on_dev = [&](const std::vector<float>& x) {
    return make_tensor(std::vector<double>(x.begin(), x.end()), {n}, DType::F32, dev);
  };
  Tensor w = on_dev(s0.w), m = on_dev(s0.m), v = on_dev(s0.v);
  Tensor c = copy_dt == DType::U8 ? Tensor() : Tensor::zeros({n}, copy_dt, MemCategory::Other, dev);
  for (int t = 1; t <= steps; ++t) {
    Tensor g = on_dev(grads(n, t));
    ops::adamw_step(scalars(t, decay), w, m, v, g, c.defined() ? &c : nullptr);
  }
  if (copy) *copy = c.defined() ? c.to_float_vector() : std::vector<float>();
  return {w.to_host<float>(), m.to_host<float>(), v.to_host<float>()};
}

template <class T>
std::vector<T> as(const std::vector<float>& v) {
  return std::vector<T>(v.begin(), v.end());
}

TEST(AdamwStep, MatchesDoubleReference) {
  for (Device dev : available_devices())
    for (bool decay : {true, false})
      for (int64_t n : {1, 7, 1000}) {
        SCOPED_TRACE(case_name(dev, DType::F32) + " decay=" + std::to_string(decay) + " n=" + std::to_string(n));
        const AdamState s0 = initial(n, 1);
        const AdamState got = run_op(dev, s0, 3, decay, DType::U8, nullptr);
        auto w = as<double>(s0.w), m = as<double>(s0.m), v = as<double>(s0.v);
        for (int t = 1; t <= 3; ++t) {
          const auto g = as<double>(grads(n, t));
          ops::ref::adamw_step<double>(scalars(t, decay), w.data(), m.data(), v.data(), g.data(), n);
        }
        EXPECT_TRUE(close_for(DType::F32, as<double>(got.w), w, "master"));
        EXPECT_TRUE(close_for(DType::F32, as<double>(got.m), m, "exp_avg"));
        EXPECT_TRUE(all_close(as<double>(got.v), v, {1e-9, 1e-5}, "exp_avg_sq"));
      }
}

TEST(AdamwStep, BitIdenticalToF32Reference) {
  for (Device dev : available_devices())
    for (bool decay : {true, false}) {
      SCOPED_TRACE(case_name(dev, DType::F32) + " decay=" + std::to_string(decay));
      const int64_t n = 513;
      const AdamState s0 = initial(n, 2);
      const AdamState got = run_op(dev, s0, 4, decay, DType::U8, nullptr);
      AdamState want = s0;
      for (int t = 1; t <= 4; ++t) {
        const auto g = grads(n, t);
        ops::ref::adamw_step<float>(scalars(t, decay), want.w.data(), want.m.data(), want.v.data(), g.data(), n);
      }
      EXPECT_EQ(got.w, want.w);
      EXPECT_EQ(got.m, want.m);
      EXPECT_EQ(got.v, want.v);
    }
}

TEST(AdamwStep, ModelCopyIsTheRoundedMaster) {
  for (Device dev : available_devices())
    for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
      SCOPED_TRACE(case_name(dev, dt));
      const int64_t n = 300;
      std::vector<float> copy;
      const AdamState got = run_op(dev, initial(n, 3), 2, true, dt, &copy);
      Tensor rounded = Tensor::from_vector(got.w, {n}).to(dt);
      EXPECT_EQ(copy, rounded.to_float_vector());
      // The copy does not change the master's arithmetic.
      EXPECT_EQ(got.w, run_op(dev, initial(n, 3), 2, true, DType::U8, nullptr).w);
    }
}

TEST(AdamwStep, F32CopyThatIsTheMasterIsLeftAlone) {
  const int64_t n = 16;
  const AdamState s0 = initial(n, 4);
  Tensor w = Tensor::from_vector(s0.w, {n}), m = Tensor::from_vector(s0.m, {n}), v = Tensor::from_vector(s0.v, {n});
  Tensor g = Tensor::from_vector(grads(n, 1), {n});
  Tensor alias = w;
  ops::adamw_step(scalars(1, true), w, m, v, g, &alias);
  EXPECT_EQ(w.to_host<float>(), run_op(Device::CPU, s0, 1, true, DType::U8, nullptr).w);
}

TEST(AdamwStep, ScalarsAsTorchComputesThem) {
  // t = 1: step size lr / (1 - beta1), bias correction sqrt(1 - beta2), in double then cast once.
  const AdamWScalars s = AdamWScalars::make(1e-3, 0.9, 0.95, 1e-8, 0.1, 1, true);
  EXPECT_EQ(s.neg_step, -float(1e-3 / (1.0 - 0.9)));
  EXPECT_EQ(s.bc2_sqrt, float(std::sqrt(1.0 - 0.95)));
  EXPECT_EQ(s.decay_keep, float(1.0 - 1e-3 * 0.1));
  EXPECT_EQ(s.one_m_beta1, float(1.0 - 0.9));
  EXPECT_TRUE(s.decay);
  // Decay is off without weight decay or at lr 0, whatever the parameter says.
  EXPECT_FALSE(AdamWScalars::make(1e-3, 0.9, 0.95, 1e-8, 0.0, 1, true).decay);
  EXPECT_FALSE(AdamWScalars::make(0.0, 0.9, 0.95, 1e-8, 0.1, 1, true).decay);
}

TEST(AdamwStep, SameResultsAtAnyThreadCount) {
  const int64_t n = (1 << 15) + 4097;  // past the parallel threshold
  const AdamState s0 = initial(n, 5);
  const int saved = num_threads();
  set_num_threads(1);
  std::vector<float> c1, c2;
  const AdamState one = run_op(Device::CPU, s0, 2, true, DType::BF16, &c1);
  set_num_threads(2);
  const AdamState two = run_op(Device::CPU, s0, 2, true, DType::BF16, &c2);
  set_num_threads(saved);
  EXPECT_EQ(one.w, two.w);
  EXPECT_EQ(one.v, two.v);
  EXPECT_EQ(c1, c2);
}

TEST(AdamwStep, BadArgumentsFailWithAMessage) {
  Tensor w = Tensor::zeros({4}, DType::F32, MemCategory::Other), m = w.clone(), v = w.clone();
  Tensor g3 = Tensor::zeros({3}, DType::F32, MemCategory::Other);
  Tensor gb = Tensor::zeros({4}, DType::BF16, MemCategory::Other);
  EXPECT_THROW_MSG(ops::adamw_step(scalars(1, true), w, m, v, g3, nullptr), "ops::adamw_step: grad must have shape [4]");
  EXPECT_THROW_MSG(ops::adamw_step(scalars(1, true), w, m, v, gb, nullptr), "grad must be f32");
  Tensor i32 = Tensor::zeros({4}, DType::I32, MemCategory::Other);
  EXPECT_THROW_MSG(ops::adamw_step(scalars(1, true), w, m, v, m, &i32), "model_copy must be bf16, f16 or f32");
  std::vector<float> mem(4);
  Tensor cuda = Tensor::from_blob(mem.data(), {4}, DType::F32, nullptr, Device::CUDA);
  EXPECT_THROW_MSG(ops::adamw_step(scalars(1, true), cuda, m, v, m, nullptr), "tensors on different devices");
#if !KESTREL_HAVE_CUDA  // a build without the CUDA backend names the missing kernel
  Tensor cm = cuda, cv = cuda, cg = cuda;
  EXPECT_THROW_MSG(ops::adamw_step(scalars(1, true), cuda, cm, cv, cg, nullptr),
                   "not supported yet: CUDA kernel for ops::adamw_step");
#endif
}

TEST(SumSquares, MatchesReferenceInChunkOrder) {
  for (Device dev : available_devices())
    for (int64_t n : {0, 1, 4095, 4097, 100000}) {
      SCOPED_TRACE(case_name(dev, DType::F32) + " n=" + std::to_string(n));
      const auto d = randn(n, 7, 3.0);
      const std::vector<float> x(d.begin(), d.end());
      const double got = ops::sum_squares(Tensor::from_vector(x, {n}));
      EXPECT_NEAR(got, ops::ref::sum_squares(x.data(), n), 1e-12 * (1 + got));
      // The documented order: 4096-element chunks summed in order, then the chunk sums in order.
      double want = 0;
      for (int64_t lo = 0; lo < n; lo += 4096) want += ops::ref::sum_squares(x.data() + lo, std::min<int64_t>(4096, n - lo));
      EXPECT_EQ(got, want);
    }
}

TEST(SumSquares, SameResultAtAnyThreadCount) {
  const int64_t n = 1 << 17;
  const auto d = randn(n, 8);
  const Tensor x = Tensor::from_vector(std::vector<float>(d.begin(), d.end()), {n});
  const int saved = num_threads();
  set_num_threads(1);
  const double one = ops::sum_squares(x);
  set_num_threads(2);
  const double two = ops::sum_squares(x);
  set_num_threads(saved);
  EXPECT_EQ(one, two);
}

TEST(Scale, ExactF32ProductInPlace) {
  for (Device dev : available_devices())
    for (int64_t n : {1, 33, (1 << 16) + 5}) {
      SCOPED_TRACE(case_name(dev, DType::F32) + " n=" + std::to_string(n));
      const auto d = randn(n, 9);
      std::vector<float> want(d.begin(), d.end());
      Tensor x = Tensor::from_vector(want, {n});
      ops::scale_(x, 0.37f);
      ops::ref::scale(want.data(), 0.37f, n);
      EXPECT_EQ(x.to_host<float>(), want);
    }
  Tensor b = Tensor::zeros({2}, DType::BF16, MemCategory::Other);
  EXPECT_THROW_MSG(ops::scale_(b, 2.f), "ops::scale_: x must be f32");
  EXPECT_THROW_MSG(ops::sum_squares(b), "ops::sum_squares: x must be f32");
}

}  // namespace
}  // namespace kestrel
