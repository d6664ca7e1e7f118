// Vocabulary padding for tensor parallelism without MPI: the padded size
// rule, padded shards (zeros past the vocabulary) from shard_tensor and
// cut_shard_into alike, and the vocab-parallel reductions leaving the padding
// columns out (the real columns give the op's values, padding dlogits are 0).
#include <gtest/gtest.h>

#include "core/rng.h"
#include "ops/ops.h"
#include "parallel/reshard.h"
#include "parallel/sharding.h"
#include "parallel/vocab_loss.h"

using namespace kestrel;
using namespace kestrel::parallel;

namespace {
Tensor rnd(Shape s, uint64_t seed) {
  Tensor t = Tensor::empty(s, DType::F32);
  Philox p{seed, 1};
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, 2 * p.uniform(uint64_t(i)) - 1);
  return t;
}
}  // namespace

TEST(VocabPadding, PaddedSizeRule) {
  EXPECT_EQ(padded_vocab_size(1001, 128, 1), 1001);    // one rank: never padded
  EXPECT_EQ(padded_vocab_size(1001, 128, 2), 1024);    // Megatron: a multiple of 128 * tp
  EXPECT_EQ(padded_vocab_size(1001, 128, 4), 1024);
  EXPECT_EQ(padded_vocab_size(1001, 128, 8), 1024);
  EXPECT_EQ(padded_vocab_size(32001, 128, 2), 32256);  // Llama-2 + one added token
  EXPECT_EQ(padded_vocab_size(1000, 128, 2), 1000);    // already divisible: unchanged
  EXPECT_EQ(padded_vocab_size(1001, 0, 2), 1001);      // no padding asked
  EXPECT_EQ(padded_vocab_size(7, 1, 2), 8);
}

TEST(VocabPadding, ShardsArePaddedWithZerosAndGatherDropsThem) {
  const Tensor full = rnd({7, 3}, 1);  // V = 7, D = 3
  const ShardSpec spec{ShardKind::Vocab, 0, 1};  // pad to a multiple of 1 * n
  EXPECT_EQ(shard_shape(full.shape(), spec, 2), (Shape{4, 3}));
  EXPECT_EQ(shard_shape(full.shape(), spec, 1), (Shape{7, 3}));
  for (int r = 0; r < 2; ++r) {
    const Tensor s = shard_tensor(full, spec, r, 2);
    ASSERT_EQ(s.shape(), (Shape{4, 3}));
    Tensor cut = Tensor::empty({4, 3}, DType::F32);
    cut.fill_(5.0f);
    cut_shard_into(full, spec, r, 2, cut);
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t d = 0; d < 3; ++d) {
        const int64_t row = r * 4 + i;
        const float want = row < 7 ? full.get(row * 3 + d) : 0.0f;
        EXPECT_EQ(s.get(i * 3 + d), want) << r << " " << i;
        EXPECT_EQ(cut.get(i * 3 + d), want) << r << " " << i;
      }
  }
  // Without a pad multiple the old rule stands: an error naming the tensor.
  EXPECT_THROW(shard_shape(full.shape(), {ShardKind::Vocab, 0, 0}, 2, "embed"), Error);
}

TEST(VocabPadding, ReductionsLeavePaddingColumnsOut) {
  comm::LocalGroup g("tp");
  const int64_t T = 4, V = 6, Vp = 8;
  Tensor padded = rnd({T, Vp}, 2);
  for (int64_t t = 0; t < T; ++t) padded.set(t * Vp + 7, 50.0f);  // a padding column that would win
  Tensor real = Tensor::empty({T, V}, DType::F32);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = 0; v < V; ++v) real.set(t * V + v, padded.get(t * Vp + v));
  const Tensor tg = Tensor::from_ints({1, -1, 5, 0}, {T});
  Tensor lp0 = Tensor::empty({T}, DType::F32), e0 = Tensor::empty({T}, DType::F32), l0 = Tensor::empty({T}, DType::F32);
  Tensor lp1 = Tensor::empty({T}, DType::F32), e1 = Tensor::empty({T}, DType::F32), l1 = Tensor::empty({T}, DType::F32);
  ops::logprob_entropy_fwd(real, tg, lp0, &e0, l0);
  vocab_logprob_entropy_fwd(g, padded, tg, 0, lp1, &e1, l1, V);
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_NEAR(lp1.get(t), lp0.get(t), 1e-6);
    EXPECT_NEAR(e1.get(t), e0.get(t), 1e-6);
    EXPECT_NEAR(l1.get(t), l0.get(t), 1e-6);
  }
  const Tensor dlp = Tensor::from_vector(std::vector<float>{-0.5f, 0.f, 1.0f, 0.25f}, {T});
  const Tensor dent = Tensor::from_vector(std::vector<float>{0.1f, 0.2f, -0.3f, 0.4f}, {T});
  Tensor d0 = Tensor::empty({T, V}, DType::F32), d1 = Tensor::empty({T, Vp}, DType::F32);
  ops::logprob_entropy_bwd(real, tg, l0, dlp, &dent, d0);
  vocab_logprob_entropy_bwd(g, padded, tg, 0, l1, dlp, &dent, &e1, d1, V);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t v = 0; v < V; ++v) EXPECT_NEAR(d1.get(t * Vp + v), d0.get(t * V + v), 1e-6);
    for (int64_t v = V; v < Vp; ++v) EXPECT_EQ(d1.get(t * Vp + v), 0.0f);
  }
  const double ce0 = ops::cross_entropy_fwd(real, tg, l0);
  EXPECT_NEAR(vocab_cross_entropy_fwd(g, padded, tg, 0, l1, V), ce0, 1e-6);
}
