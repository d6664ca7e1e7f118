// Context-parallel attention on one process (cp = 1, size-1 groups): the
// padded local batch's attention equals ops::attention_fwd/bwd over the
// unpadded batch on every real row, bit for bit, and the byte formula says
// nothing is sent. Multi-rank runs: tests/mpi/cp_attention_test.cpp.
#include <gtest/gtest.h>

#include "core/rng.h"
#include "ops/attention.h"
#include "parallel/cp_attention.h"

using namespace kestrel;
using namespace kestrel::parallel;

namespace {
Tensor rnd(Shape s, uint64_t seed) {
  Tensor t = Tensor::empty(s, DType::F32);
  Philox p{seed, 3};
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, 2 * p.uniform(uint64_t(i)) - 1);
  return t;
}
}  // namespace

TEST(CpAttentionLocal, OneRankEqualsAttentionBitForBit) {
  std::vector<int32_t> cu{0}, pos;
  for (int L : {1, 4, 13}) {
    for (int i = 0; i < L; ++i) pos.push_back(i);
    cu.push_back(int32_t(pos.size()));
  }
  const int64_t T = int64_t(pos.size()), H = 4, Hkv = 2, hd = 8;
  const CpLayout L = make_cp_layout({&cu, &pos}, 1, 0, 1);
  EXPECT_EQ(L.local_tokens, 2 + 4 + 14);  // each sequence padded to a multiple of 2
  CpGroups g{comm::local_group("cp"), comm::local_group("cp_ulysses"), comm::local_group("cp_ring")};
  const ops::AttentionShape s{H, Hkv, hd, 0.f, 0};
  Tensor q = rnd({T, H * hd}, 1), k = rnd({T, Hkv * hd}, 2), v = rnd({T, Hkv * hd}, 3), dout = rnd({T, H * hd}, 4);
  Tensor cu_t = Tensor::from_host(cu, {int64_t(cu.size())});
  Tensor out = Tensor::empty({T, H * hd}, DType::F32), lse = Tensor::empty({H, T}, DType::F32);
  ops::attention_fwd(q, k, v, cu_t, s, out, lse);
  Tensor dq = Tensor::empty(q.shape(), DType::F32), dk = Tensor::empty(k.shape(), DType::F32);
  Tensor dv = Tensor::empty(v.shape(), DType::F32);
  ops::attention_bwd(q, k, v, out, lse, dout, cu_t, s, dq, dk, dv);

  const int64_t Tl = L.local_tokens;
  Tensor ql = cp_local_rows(L, q, 0.5f), kl = cp_local_rows(L, k, 0.5f), vl = cp_local_rows(L, v, 0.5f);
  Tensor outl = Tensor::empty({Tl, H * hd}, DType::F32);
  CpAttentionSaved saved;
  cp_attention_fwd(g, L, s, ql, kl, vl, outl, saved);
  Tensor dql = Tensor::empty(ql.shape(), DType::F32), dkl = Tensor::empty(kl.shape(), DType::F32);
  Tensor dvl = Tensor::empty(vl.shape(), DType::F32);
  cp_attention_bwd(g, L, s, saved, cp_local_rows(L, dout, 0.f), dql, dkl, dvl);
  for (auto [local, ref] : {std::pair{&outl, &out}, {&dql, &dq}, {&dkl, &dk}, {&dvl, &dv}})
    EXPECT_EQ(cp_gather_rows(*g.cp, L, *local).to_float_vector(), ref->to_float_vector());
  const CpAttentionBytes b = cp_attention_bytes(L, s, DType::F32);
  EXPECT_EQ(b.ulysses_fwd + b.ulysses_bwd + b.ring_fwd + b.ring_bwd, 0.0);
}
