// ops::linear / add: CPU kernels against the double reference, the reference
// backward against finite differences, special values, accumulate semantics.
#include "ops/linear.h"

#include <gtest/gtest.h>

#include "backend/cpu/gemm.h"
#include "core/parallel_for.h"
#include "gemm_providers.h"
#include "op_harness.h"
#include "ops/ref/linear_ref.h"

namespace kestrel {
namespace {

using namespace testing;

struct LinearCase {
  int64_t n, in, out;
};
// T = 1, sizes that are not multiples of 16, one that spans several SIMD
// blocks, and one with enough rows for the BLAS path (not the skinny kernel).
const LinearCase kCases[] = {{1, 5, 3}, {7, 33, 17}, {64, 80, 48}, {100, 70, 90}};

struct LinearData {
  std::vector<double> x, w, b;  // rounded to the dtype under test
};
LinearData linear_data(const LinearCase& c, DType dt, uint64_t seed) {
  return {round_to(randn(c.n * c.in, seed), dt), round_to(randn(c.out * c.in, seed + 1, 0.3), dt),
          round_to(randn(c.out, seed + 2), dt)};
}

KS_ISA_SUITE(Linear);  // the conversions, bias sums and add run per ISA level

// f(dev, dtype, case) under every GEMM library, device, float dtype and case,
// each traced.
template <class F>
void for_each_linear_case(F&& f) {
  for_each_gemm_provider([&] {
    for (Device dev : available_devices())
      for (DType dt : float_dtypes())
        for (const auto& c : kCases) {
          SCOPED_TRACE(case_name(dev, dt) + " n=" + std::to_string(c.n) + " in=" + std::to_string(c.in) +
                       " out=" + std::to_string(c.out));
          f(dev, dt, c);
        }
  });
}

TEST_P(Linear, ForwardMatchesReference) {
  for_each_linear_case([](Device dev, DType dt, const LinearCase& c) {
    for (bool bias : {false, true}) {
      SCOPED_TRACE(bias ? "bias" : "no bias");
      const auto d = linear_data(c, dt, 10);
      Tensor x = make_tensor(d.x, {c.n, c.in}, dt, dev), w = make_tensor(d.w, {c.out, c.in}, dt, dev);
      Tensor b = make_tensor(d.b, {c.out}, dt, dev);
      Tensor y = nan_tensor({c.n, c.out}, dt, dev);  // written, not accumulated
      ops::linear_fwd(x, w, bias ? &b : nullptr, y);
      std::vector<double> want(size_t(c.n * c.out));
      ops::ref::linear_fwd<double>(d.x.data(), d.w.data(), bias ? d.b.data() : nullptr, want.data(), c.n, c.in, c.out);
      EXPECT_TRUE(close_for(dt, values(y), want, "y"));
    }
  });
}

TEST_P(Linear, MixedDtypes) {
  // bf16 activations with f32 weights and bias, f32 output.
  const LinearCase c{5, 19, 11};
  const auto x = round_to(randn(c.n * c.in, 3), DType::BF16), w = randn(c.out * c.in, 4), b = randn(c.out, 5);
  Tensor y = nan_tensor({c.n, c.out}, DType::F32);
  Tensor bt = make_tensor(b, {c.out}, DType::F32);
  ops::linear_fwd(make_tensor(x, {c.n, c.in}, DType::BF16), make_tensor(w, {c.out, c.in}, DType::F32), &bt, y);
  std::vector<double> want(size_t(c.n * c.out));
  ops::ref::linear_fwd<double>(x.data(), round_to(w, DType::F32).data(), round_to(b, DType::F32).data(), want.data(),
                               c.n, c.in, c.out);
  EXPECT_TRUE(close_for(DType::F32, values(y), want, "y"));
}

TEST_P(Linear, NanInfPropagate) {
  for (Device dev : available_devices())
    for (DType dt : float_dtypes()) {
      SCOPED_TRACE(case_name(dev, dt));
      const LinearCase c{6, 21, 9};
      auto d = linear_data(c, dt, 20);
      d.x[1 * c.in + 4] = kNaN;   // row 1 of y becomes NaN
      d.x[3 * c.in + 0] = kInf;   // row 3: +-inf by the sign of w[:, 0]
      d.w[5 * c.in + 2] = -kInf;  // column 5: inf everywhere but rows 1 (NaN) and 3 (maybe inf - inf)
      Tensor b = make_tensor(d.b, {c.out}, dt, dev);
      Tensor y = nan_tensor({c.n, c.out}, dt, dev);
      ops::linear_fwd(make_tensor(d.x, {c.n, c.in}, dt, dev), make_tensor(d.w, {c.out, c.in}, dt, dev), &b, y);
      std::vector<double> want(size_t(c.n * c.out));
      ops::ref::linear_fwd<double>(d.x.data(), d.w.data(), d.b.data(), want.data(), c.n, c.in, c.out);
      EXPECT_TRUE(std::isnan(want[1 * c.out]) && std::isinf(want[0 * c.out + 5]));
      EXPECT_TRUE(close_for(dt, values(y), want, "y"));
    }
}

TEST_P(Linear, ReferenceBackwardMatchesFiniteDifferences) {
  const LinearCase c{3, 4, 5};
  const auto x = randn(c.n * c.in, 30), w = randn(c.out * c.in, 31), b = randn(c.out, 32);
  const auto r = randn(c.n * c.out, 33);  // L = sum r * y
  const size_t nx = x.size(), nw = w.size(), nb = b.size();
  auto L = [&](const std::vector<double>& p) {
    std::vector<double> y(size_t(c.n * c.out));
    ops::ref::linear_fwd<double>(p.data(), p.data() + nx, p.data() + nx + nw, y.data(), c.n, c.in, c.out);
    return dot(r, y);
  };
  std::vector<double> dx(nx), dw(nw, 0.0), db(nb, 0.0);
  ops::ref::linear_bwd<double>(x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data(), c.n, c.in, c.out);
  EXPECT_TRUE(matches_finite_difference(L, concat({x, w, b}), concat({dx, dw, db}), "d(x, w, b)"));
}

TEST_P(Linear, BackwardMatchesReferenceAndAccumulates) {
  for_each_linear_case([](Device dev, DType dt, const LinearCase& c) {
    const auto d = linear_data(c, dt, 40);
    const auto dy = round_to(randn(c.n * c.out, 43), dt);
    const auto dw0 = randn(c.out * c.in, 44), db0 = randn(c.out, 45);  // earlier micro-batches
    Tensor x = make_tensor(d.x, {c.n, c.in}, dt, dev), w = make_tensor(d.w, {c.out, c.in}, dt, dev);
    Tensor dyt = make_tensor(dy, {c.n, c.out}, dt, dev);
    Tensor dx = nan_tensor({c.n, c.in}, dt, dev);
    Tensor dw = make_tensor(dw0, {c.out, c.in}, DType::F32, dev), db = make_tensor(db0, {c.out}, DType::F32, dev);
    ops::linear_bwd(x, w, dyt, &dx, &dw, &db);

    std::vector<double> rdx(d.x.size()), rdw = round_to(dw0, DType::F32), rdb = round_to(db0, DType::F32);
    ops::ref::linear_bwd<double>(d.x.data(), d.w.data(), dy.data(), rdx.data(), rdw.data(), rdb.data(), c.n, c.in,
                                 c.out);
    EXPECT_TRUE(close_for(dt, values(dx), rdx, "dx"));
    EXPECT_TRUE(close_for(DType::F32, values(dw), rdw, "dw (+=)"));
    EXPECT_TRUE(close_for(DType::F32, values(db), rdb, "db (+=)"));

    // A second micro-batch adds again; dx is overwritten, not summed.
    ops::linear_bwd(x, w, dyt, &dx, &dw, &db);
    ops::ref::linear_bwd<double>(d.x.data(), d.w.data(), dy.data(), rdx.data(), rdw.data(), rdb.data(), c.n, c.in,
                                 c.out);
    EXPECT_TRUE(close_for(dt, values(dx), rdx, "dx after second call"));
    EXPECT_TRUE(close_for(DType::F32, values(dw), rdw, "dw after second call"));
    EXPECT_TRUE(close_for(DType::F32, values(db), rdb, "db after second call"));
  });
}

// accumulate_dx: dx += dy @ w on an f32 dx (the q/k/v and gate/up input
// gradients summed in place), for every GEMM library and operand dtype;
// a bf16 dx is refused.
TEST_P(Linear, BackwardAccumulatesDxInPlace) {
  for_each_linear_case([](Device dev, DType dt, const LinearCase& c) {
    const auto d = linear_data(c, dt, 70);
    const auto dy = round_to(randn(c.n * c.out, 71), dt);
    const auto dx0 = round_to(randn(c.n * c.in, 72), DType::F32);  // the gradient summed so far
    Tensor w = make_tensor(d.w, {c.out, c.in}, dt, dev), dyt = make_tensor(dy, {c.n, c.out}, dt, dev);
    Tensor dx = make_tensor(dx0, {c.n, c.in}, DType::F32, dev);
    ops::linear_bwd(Tensor(), w, dyt, &dx, nullptr, nullptr, /*accumulate_dx=*/true);
    std::vector<double> rdx(dx0.size());
    ops::ref::linear_bwd<double>(nullptr, d.w.data(), dy.data(), rdx.data(), nullptr, nullptr, c.n, c.in, c.out);
    for (size_t i = 0; i < rdx.size(); ++i) rdx[i] += dx0[i];
    EXPECT_TRUE(close_for(DType::F32, values(dx), rdx, "dx (+=)"));
  });
  Tensor w = Tensor::zeros({6, 8}, DType::F32), dy = Tensor::zeros({4, 6}, DType::F32);
  Tensor dx_bf16 = Tensor::zeros({4, 8}, DType::BF16);
  try {
    ops::linear_bwd(Tensor(), w, dy, &dx_bf16, nullptr, nullptr, /*accumulate_dx=*/true);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("accumulate_dx needs an f32 dx"), std::string::npos) << e.what();
  }
}

TEST_P(Linear, BackwardSkipsNullOutputs) {
  const LinearCase c{4, 9, 7};
  const auto d = linear_data(c, DType::F32, 50);
  const auto dy = randn(c.n * c.out, 51);
  Tensor w = make_tensor(d.w, {c.out, c.in}, DType::F32);
  Tensor db = Tensor::zeros({c.out}, DType::F32);
  // x is not needed without dw: an undefined tensor is accepted.
  ops::linear_bwd(Tensor(), w, make_tensor(dy, {c.n, c.out}, DType::F32), nullptr, nullptr, &db);
  std::vector<double> rdb(size_t(c.out), 0.0);
  ops::ref::linear_bwd<double>(nullptr, d.w.data(), dy.data(), nullptr, nullptr, rdb.data(), c.n, c.in, c.out);
  EXPECT_TRUE(close_for(DType::F32, values(db), rdb, "db"));
}

TEST_P(Linear, BiasGradientIndependentOfThreadCount) {
  const LinearCase c{300, 8, 130};
  const auto dy = randn(c.n * c.out, 60);
  Tensor dyt = make_tensor(dy, {c.n, c.out}, DType::F32),
         w = make_tensor(randn(c.out * c.in, 61), {c.out, c.in}, DType::F32);
  const int saved = num_threads();
  std::vector<std::vector<double>> got;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    Tensor db = Tensor::zeros({c.out}, DType::F32);
    ops::linear_bwd(Tensor(), w, dyt, nullptr, nullptr, &db);
    got.push_back(values(db));
  }
  set_num_threads(saved);
  EXPECT_EQ(got[0], got[1]);
}

TEST_P(Linear, RejectsBadShapes) {
  Tensor x = Tensor::zeros({4, 8}, DType::F32), w = Tensor::zeros({6, 7}, DType::F32),
         y = Tensor::zeros({4, 6}, DType::F32);
  try {
    ops::linear_fwd(x, w, nullptr, y);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ops::linear_fwd: w must have shape [*, 8]"), std::string::npos) << e.what();
  }
  Tensor dw_bf16 = Tensor::zeros({6, 8}, DType::BF16), w8 = Tensor::zeros({6, 8}, DType::F32);
  EXPECT_THROW(ops::linear_bwd(x, w8, y, nullptr, &dw_bf16, nullptr), Error);  // parameter grads are f32
  Tensor ints = Tensor::zeros({4, 8}, DType::I32);
  EXPECT_THROW(ops::linear_fwd(ints, w8, nullptr, y), Error);
}

KS_ISA_SUITE(Add);  // the conversions, bias sums and add run per ISA level

TEST_P(Add, MatchesReferenceInPlaceAndMixed) {
  for (Device dev : available_devices())
    for (DType dt : float_dtypes()) {
      SCOPED_TRACE(case_name(dev, dt));
      const int64_t n = 5, d = 37;
      auto a = round_to(randn(n * d, 70), dt), b = round_to(randn(n * d, 71), dt);
      a[3] = kNaN;
      b[10] = kInf;
      std::vector<double> want(a.size());
      ops::ref::add<double>(a.data(), b.data(), want.data(), int64_t(a.size()));
      Tensor at = make_tensor(a, {n, d}, dt, dev), bt = make_tensor(b, {n, d}, dt, dev);
      Tensor y = nan_tensor({n, d}, dt, dev);
      ops::add(at, bt, y);
      EXPECT_TRUE(close_for(dt, values(y), want, "y = a + b"));
      ops::add_inplace(at, bt);  // the residual-stream update
      EXPECT_TRUE(close_for(dt, values(at), want, "a += b"));
      // f32 residual stream plus a bf16 branch.
      Tensor acc = make_tensor(a, {n, d}, DType::F32, dev);
      ops::add_inplace(acc, bt);
      EXPECT_TRUE(close_for(DType::F32, values(acc), want, "f32 += " + std::string(dtype_name(dt))));
    }
  Tensor a = Tensor::zeros({2, 3}, DType::F32), b = Tensor::zeros({3, 2}, DType::F32);
  EXPECT_THROW(ops::add(a, b, a), Error);
}

}  // namespace
}  // namespace kestrel
