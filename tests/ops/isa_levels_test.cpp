// The kernel ISA levels (backend/cpu/isa.h) against each other: the other
// *_test.cpp files check every level against the double reference; these
// check what the levels must share. Lane-wise kernels (SwiGLU, RoPE, the
// elementwise half of RMSNorm) run the same operations per element at every
// width, tails padded the same way, so they agree bit for bit. Kernels with
// horizontal sums (RMSNorm's rstd, the log-softmax sums, attention's softmax
// denominators and dot products over head_dim) add the same f32 terms in a
// width-dependent order, so they agree to f32 rounding of those sums: a
// relative 1e-5 bounds it with room for n <= 2^12-term sums of
// same-signed terms (error <= n * 2^-24 relative in the worst order).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/parallel_for.h"
#include "op_harness.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/loss.h"
#include "ops/norm.h"
#include "ops/rope.h"

namespace kestrel {
namespace {

using namespace testing;

// Runs f at avx2 and at avx512 (skips where the machine has no AVX-512);
// f returns the outputs to compare.
template <class F>
std::pair<std::vector<Tensor>, std::vector<Tensor>> at_both(F&& f) {
  std::vector<Tensor> a, b;
  {
    IsaScope s(IsaLevel::Avx2);
    a = f();
  }
  {
    IsaScope s(IsaLevel::Avx512);
    b = f();
  }
  return {a, b};
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(IsaLevels, LaneWiseKernelsAgreeBitwise) {
  if (machine_isa() != IsaLevel::Avx512) GTEST_SKIP() << "one ISA level on this machine";
  const int64_t T = 37, F = 133, H = 3, d = 22;  // row lengths that leave tails at 8 and 16 lanes
  for (DType dt : float_dtypes()) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor g = make_tensor(randn(T * F, 1, 3.0), {T, F}, dt), u = make_tensor(randn(T * F, 2), {T, F}, dt);
    const Tensor dh = make_tensor(randn(T * F, 3), {T, F}, dt);
    auto [a, b] = at_both([&] {
      Tensor h = Tensor::empty({T, F}, dt), dg = Tensor::empty({T, F}, dt), du = Tensor::empty({T, F}, dt);
      ops::swiglu_fwd(g, u, h);
      ops::swiglu_bwd(g, u, dh, dg, du);
      return std::vector<Tensor>{h, dg, du};
    });
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], b[i])) << "swiglu output " << i;

    ops::RopeConfig rc;
    rc.head_dim = d;
    const ops::RopeTable table = ops::make_rope_table(rc, 64);
    std::vector<int32_t> pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t((t * 5) % 64);
    const Tensor pos_t = Tensor::from_ints(pos, {T});
    const std::vector<double> xv = randn(T * H * d, 4);
    auto [ra, rb] = at_both([&] {
      Tensor x = make_tensor(xv, {T, H * d}, dt), y = make_tensor(xv, {T, H * d}, dt);
      ops::rope_fwd(x, pos_t, table, H);
      ops::rope_bwd(y, pos_t, table, H);
      return std::vector<Tensor>{x, y};
    });
    for (size_t i = 0; i < ra.size(); ++i) EXPECT_TRUE(same_bits(ra[i], rb[i])) << "rope output " << i;
  }
}

TEST(IsaLevels, SummingKernelsAgreeToF32Rounding) {
  if (machine_isa() != IsaLevel::Avx512) GTEST_SKIP() << "one ISA level on this machine";
  const Tolerance tol{1e-5, 1e-5};
  const int64_t T = 29, D = 200, V = 1001;
  const Tensor x = make_tensor(randn(T * D, 5), {T, D}, DType::F32), w = make_tensor(randn(D, 6), {D}, DType::F32);
  const Tensor logits = make_tensor(randn(T * V, 7, 4.0), {T, V}, DType::F32);
  std::vector<int32_t> tg(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) tg[size_t(t)] = int32_t((t * 37) % V);
  const Tensor tgt = Tensor::from_ints(tg, {T});
  // Attention: 3 sequences, 4 heads / 2 kv heads of 40.
  const std::vector<int32_t> cu = {0, 5, 75, T + 61};
  const int64_t Ta = cu.back(), Ha = 4, KV = 2, hd = 40;
  const Tensor q = make_tensor(randn(Ta * Ha * hd, 8), {Ta, Ha * hd}, DType::F32);
  const Tensor k = make_tensor(randn(Ta * KV * hd, 9), {Ta, KV * hd}, DType::F32);
  const Tensor v = make_tensor(randn(Ta * KV * hd, 10), {Ta, KV * hd}, DType::F32);
  const Tensor dout = make_tensor(randn(Ta * Ha * hd, 11), {Ta, Ha * hd}, DType::F32);
  const Tensor cu_t = Tensor::from_ints(cu, {int64_t(cu.size())});
  const ops::AttentionShape shape{Ha, KV, hd, 0.f};
  auto [a, b] = at_both([&] {
    Tensor y = Tensor::empty({T, D}, DType::F32), rstd = Tensor::empty({T}, DType::F32);
    ops::rmsnorm_fwd(x, w, 1e-5f, y, rstd);
    Tensor lp = Tensor::empty({T}, DType::F32), ent = Tensor::empty({T}, DType::F32), lse = Tensor::empty({T}, DType::F32);
    ops::logprob_entropy_fwd(logits, tgt, lp, &ent, lse);
    Tensor out = Tensor::empty(q.shape(), DType::F32), alse = Tensor::empty({Ha, Ta}, DType::F32);
    ops::attention_fwd(q, k, v, cu_t, shape, out, alse);
    Tensor dq = Tensor::empty(q.shape(), DType::F32), dk = Tensor::empty(k.shape(), DType::F32),
           dv = Tensor::empty(v.shape(), DType::F32);
    ops::attention_bwd(q, k, v, out, alse, dout, cu_t, shape, dq, dk, dv);
    return std::vector<Tensor>{y, rstd, lp, ent, lse, out, alse, dq, dk, dv};
  });
  const char* names[] = {"rmsnorm y", "rstd", "logprob", "entropy", "lse", "attn out", "attn lse", "dq", "dk", "dv"};
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(all_close(values(b[i]), values(a[i]), tol, names[i]));
}

}  // namespace
}  // namespace kestrel
