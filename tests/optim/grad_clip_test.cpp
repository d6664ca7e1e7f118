#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "optim/grad_clip.h"

using namespace kestrel;
using namespace kestrel::optim;

namespace {
// A stand-in for a 2-rank group: all_gather returns this rank's bytes followed
// by a fixed "peer" block, so the cross-rank sum can be checked by hand.
class FakePeerGroup final : public comm::ProcessGroup {
 public:
  explicit FakePeerGroup(double peer_sq) : peer_(peer_sq) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "dp"; }
  void all_gather(const void* send, void* recv, int64_t n, DType dt) override {
    ASSERT_EQ(dt, DType::U8);
    ASSERT_EQ(n, 8);
    std::memcpy(recv, send, 8);
    std::memcpy(static_cast<char*>(recv) + 8, &peer_, 8);
  }
  void all_reduce(void*, int64_t, DType, comm::ReduceOp) override { FAIL() << "unexpected"; }
  void reduce_scatter(const void*, void*, int64_t, DType, comm::ReduceOp) override { FAIL(); }
  void broadcast(void*, int64_t, DType, int) override { FAIL(); }
  void all_to_all(const void*, void*, int64_t, DType) override { FAIL(); }
  void all_to_allv(const void*, const std::vector<int64_t>&, void*, const std::vector<int64_t>&, DType) override { FAIL(); }
  void send(const void*, int64_t, DType, int, int) override { FAIL(); }
  void recv(void*, int64_t, DType, int, int) override { FAIL(); }
  void barrier() override {}

 private:
  double peer_;
};
}  // namespace

TEST(GradClip, ClipsToMaxNormLikeTorch) {
  Tensor a = Tensor::from_vector({3.0f, 4.0f}, {2});
  Tensor b = Tensor::from_vector({12.0f}, {1});
  // ||(3, 4, 12)|| = 13; coef = 1 / (13 + 1e-6).
  ClipResult r = clip_grad_norm({a, b}, 1.0);
  EXPECT_DOUBLE_EQ(r.norm, 13.0);
  EXPECT_TRUE(r.finite);
  EXPECT_TRUE(r.clipped);
  EXPECT_DOUBLE_EQ(r.coef, 1.0 / (13.0 + 1e-6));
  const float c = float(1.0 / (13.0 + 1e-6));
  EXPECT_EQ(a.get(0), 3.0f * c);
  EXPECT_EQ(a.get(1), 4.0f * c);
  EXPECT_EQ(b.get(0), 12.0f * c);
}

TEST(GradClip, BelowMaxNormUntouched) {
  Tensor a = Tensor::from_vector({0.3f, -0.4f}, {2});
  ClipResult r = clip_grad_norm({a}, 1.0);
  EXPECT_NEAR(r.norm, 0.5, 1e-7);
  EXPECT_FALSE(r.clipped);
  EXPECT_EQ(r.coef, 1.0);
  EXPECT_EQ(a.get(0), 0.3f);
  // max_norm <= 0: measure only.
  Tensor big = Tensor::from_vector({30.0f, 40.0f}, {2});
  EXPECT_EQ(clip_grad_norm({big}, 0.0).norm, 50.0);
  EXPECT_EQ(big.get(0), 30.0f);
}

TEST(GradClip, DoubleAccumulationOverManyElements) {
  // 100000 elements of 0.1f: a float accumulator drifts; double does not.
  const int64_t n = 100000;
  Tensor g = Tensor::empty({n}, DType::F32);
  g.fill_(0.1f);
  const double v = double(0.1f);
  EXPECT_NEAR(global_grad_norm({g}), std::sqrt(double(n) * v * v), 1e-12);
}

TEST(GradClip, NonFiniteNormReportedNotApplied) {
  Tensor a = Tensor::from_vector({1.0f, std::numeric_limits<float>::infinity()}, {2});
  ClipResult r = clip_grad_norm({a}, 1.0);
  EXPECT_FALSE(r.finite);
  EXPECT_FALSE(r.clipped);
  EXPECT_EQ(a.get(0), 1.0f);
  Tensor n = Tensor::from_vector({std::nanf("")}, {1});
  EXPECT_FALSE(clip_grad_norm({n}, 1.0).finite);
}

TEST(GradClip, SumsSquaresAcrossRanks) {
  Tensor a = Tensor::from_vector({3.0f, 4.0f}, {2});  // local squared sum 25
  FakePeerGroup pg(144.0);                            // the peer holds 144
  ClipResult r = clip_grad_norm({a}, 1.0, &pg);
  EXPECT_DOUBLE_EQ(r.norm, 13.0);
  EXPECT_EQ(a.get(0), 3.0f * float(1.0 / (13.0 + 1e-6)));
  // A size-1 group is the local case.
  comm::LocalGroup local;
  Tensor b = Tensor::from_vector({3.0f, 4.0f}, {2});
  EXPECT_DOUBLE_EQ(global_grad_norm({b}, &local), 5.0);
}

TEST(GradClip, SlotsOverload) {
  ParamSlot p;
  p.master = Tensor::zeros({2}, DType::F32);
  p.grad = Tensor::from_vector({6.0f, 8.0f}, {2});
  std::vector<ParamSlot> ps = {p};
  ClipResult r = clip_grad_norm(ps, 5.0);
  EXPECT_DOUBLE_EQ(r.norm, 10.0);
  EXPECT_NEAR(p.grad.get(0), 3.0f, 1e-6);
}
