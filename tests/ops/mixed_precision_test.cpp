// bf16 mode keeps activations bf16 but their gradients f32. Every backward
// that takes bf16 activations with f32 gradients must equal the all-f32
// kernel run on the same (exactly upcast) values.
#include <gtest/gtest.h>

#include <cmath>

#include "common/testing.h"
#include "isa_harness.h"
#include "core/rng.h"
#include "ops/ops.h"

using namespace kestrel;

namespace {

Tensor random_tensor(Shape s, DType dt, uint64_t stream, float scale = 1.0f) {
  Tensor t = Tensor::empty(s, dt);
  Philox rng{77, stream};
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, scale * rng.normal(uint64_t(i)));
  return t;
}

void expect_equal(const Tensor& a, const Tensor& b, const char* what) {
  EXPECT_TRUE(kestrel::testing::all_close(kestrel::testing::to_double(a), kestrel::testing::to_double(b), {1e-6, 1e-5}, what));
}

}  // namespace

KS_ISA_SUITE(MixedPrecision);

TEST_P(MixedPrecision, RmsnormBackwardBf16ActivationsF32Grads) {
  const int64_t N = 9, D = 40;
  Tensor x = random_tensor({N, D}, DType::BF16, 1), w = random_tensor({D}, DType::BF16, 2);
  Tensor dy = random_tensor({N, D}, DType::F32, 3);
  Tensor y = Tensor::empty({N, D}, DType::BF16), rstd = Tensor::empty({N}, DType::F32);
  ops::rmsnorm_fwd(x, w, 1e-6f, y, rstd);
  Tensor dx = Tensor::empty({N, D}, DType::F32), dw = Tensor::zeros({D}, DType::F32);
  ops::rmsnorm_bwd(x, w, rstd, dy, dx, dw);
  Tensor dx32 = Tensor::empty({N, D}, DType::F32), dw32 = Tensor::zeros({D}, DType::F32);
  ops::rmsnorm_bwd(x.to(DType::F32), w.to(DType::F32), rstd, dy, dx32, dw32);
  expect_equal(dx, dx32, "dx");
  expect_equal(dw, dw32, "dw");
}

TEST_P(MixedPrecision, SwigluBackwardBf16ActivationsF32Grads) {
  const int64_t T = 7, F = 33;
  Tensor g = random_tensor({T, F}, DType::BF16, 4), u = random_tensor({T, F}, DType::BF16, 5);
  Tensor dh = random_tensor({T, F}, DType::F32, 6);
  Tensor dg = Tensor::empty({T, F}, DType::F32), du = Tensor::empty({T, F}, DType::F32);
  ops::swiglu_bwd(g, u, dh, dg, du);
  // The f32 reference must see silu rounded as the bf16 forward stored it; compare
  // dgate exactly and dup against d * round_bf16(silu(x)).
  Tensor dg32 = Tensor::empty({T, F}, DType::F32), du32 = Tensor::empty({T, F}, DType::F32);
  ops::swiglu_bwd(g.to(DType::F32), u.to(DType::F32), dh, dg32, du32);
  expect_equal(dg, dg32, "dgate");
  for (int64_t i = 0; i < T * F; ++i) {
    const float x = g.get(i);
    const float silu = round_bf16(x / (1.f + std::exp(-x)));
    EXPECT_NEAR(du.get(i), dh.get(i) * silu, 1e-5f * (1 + std::abs(dh.get(i) * silu))) << i;
  }
}

TEST_P(MixedPrecision, AttentionBackwardBf16ActivationsF32Grads) {
  const int64_t T = 13, H = 4, Hkv = 2, hd = 16;
  ops::AttentionShape s{H, Hkv, hd, 0.f};
  Tensor q = random_tensor({T, H * hd}, DType::BF16, 7), k = random_tensor({T, Hkv * hd}, DType::BF16, 8);
  Tensor v = random_tensor({T, Hkv * hd}, DType::BF16, 9);
  Tensor cu = Tensor::from_ints({0, 5, 13}, {3});
  Tensor out = Tensor::empty({T, H * hd}, DType::BF16), lse = Tensor::empty({H, T}, DType::F32);
  ops::attention_fwd(q, k, v, cu, s, out, lse);
  Tensor dout = random_tensor({T, H * hd}, DType::F32, 10);
  Tensor dq = Tensor::empty({T, H * hd}, DType::F32), dk = Tensor::empty({T, Hkv * hd}, DType::F32),
         dv = Tensor::empty({T, Hkv * hd}, DType::F32);
  ops::attention_bwd(q, k, v, out, lse, dout, cu, s, dq, dk, dv);
  Tensor dq32 = Tensor::empty({T, H * hd}, DType::F32), dk32 = Tensor::empty({T, Hkv * hd}, DType::F32),
         dv32 = Tensor::empty({T, Hkv * hd}, DType::F32);
  ops::attention_bwd(q.to(DType::F32), k.to(DType::F32), v.to(DType::F32), out.to(DType::F32), lse, dout, cu, s, dq32,
                     dk32, dv32);
  expect_equal(dq, dq32, "dq");
  expect_equal(dk, dk32, "dk");
  expect_equal(dv, dv32, "dv");
}
