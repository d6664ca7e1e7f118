// The parallel blocks on a size-1 group must be exactly the single-process
// ops (bit for bit), sharding rules and their errors, the byte counter's cost
// model, and DataParallel on one rank.
#include <gtest/gtest.h>

#include <cstring>

#include "core/rng.h"
#include "ops/ops.h"
#include "parallel/comm_counter.h"
#include "parallel/data_parallel.h"
#include "parallel/sharding.h"
#include "parallel/tp_layers.h"
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
bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}
}  // namespace

TEST(TpLocal, SizeOneIsExactlyTheOps) {
  comm::LocalGroup g("tp");
  Tensor x = rnd({6, 8}, 1), w = rnd({4, 8}, 2), b = rnd({4}, 3), dy = rnd({6, 4}, 4);
  Tensor y0 = Tensor::empty({6, 4}, DType::F32), y1 = Tensor::empty({6, 4}, DType::F32);
  ops::linear_fwd(x, w, &b, y0);
  for (bool sp : {false, true}) {
    column_linear_fwd(g, sp, x, w, &b, y1);
    EXPECT_TRUE(same_bits(y0, y1));
    row_linear_fwd(g, sp, x, w, &b, y1);
    EXPECT_TRUE(same_bits(y0, y1));
  }
  Tensor dx0 = Tensor::empty({6, 8}, DType::F32), dw0 = Tensor::zeros({4, 8}, DType::F32);
  ops::linear_bwd(x, w, dy, &dx0, &dw0, nullptr);
  Tensor dx1 = Tensor::empty({6, 8}, DType::F32), dw1 = Tensor::zeros({4, 8}, DType::F32);
  row_linear_bwd(g, true, x, w, dy, &dx1, &dw1, nullptr);
  EXPECT_TRUE(same_bits(dx0, dx1) && same_bits(dw0, dw1));

  Tensor logits = rnd({5, 16}, 5), tg = Tensor::from_ints({1, -1, 15, 0, 7}, {5});
  Tensor lp0 = Tensor::empty({5}, DType::F32), e0 = Tensor::empty({5}, DType::F32), l0 = Tensor::empty({5}, DType::F32);
  Tensor lp1 = Tensor::empty({5}, DType::F32), e1 = Tensor::empty({5}, DType::F32), l1 = Tensor::empty({5}, DType::F32);
  ops::logprob_entropy_fwd(logits, tg, lp0, &e0, l0);
  vocab_logprob_entropy_fwd(g, logits, tg, 0, lp1, &e1, l1);
  EXPECT_TRUE(same_bits(lp0, lp1) && same_bits(e0, e1) && same_bits(l0, l1));
}

// The vocab-parallel formulas themselves, on one rank with a vocab offset
// (the shard path): must match the op on the same logits.
TEST(TpLocal, VocabFormulasMatchOpOnOneShard) {
  comm::LocalGroup g("tp");
  Tensor logits = rnd({5, 16}, 6), tg = Tensor::from_ints({1, -1, 15, 0, 7}, {5});
  Tensor lp0 = Tensor::empty({5}, DType::F32), e0 = Tensor::empty({5}, DType::F32), l0 = Tensor::empty({5}, DType::F32);
  ops::logprob_entropy_fwd(logits, tg, lp0, &e0, l0);
  // Shift ids so that vocab_start != 0 forces the vocab-parallel formulas.
  Tensor tg2 = Tensor::from_ints({101, -1, 115, 100, 107}, {5});
  Tensor lp1 = Tensor::empty({5}, DType::F32), e1 = Tensor::empty({5}, DType::F32), l1 = Tensor::empty({5}, DType::F32);
  vocab_logprob_entropy_fwd(g, logits, tg2, 100, lp1, &e1, l1);
  for (int t = 0; t < 5; ++t) {
    EXPECT_NEAR(lp1.get(t), lp0.get(t), 1e-5);
    EXPECT_NEAR(e1.get(t), e0.get(t), 1e-5);
    EXPECT_NEAR(l1.get(t), l0.get(t), 1e-5);
  }
}

TEST(Sharding, RulesAndErrors) {
  EXPECT_EQ(hf_shard_spec("model.layers.0.self_attn.q_proj.weight", 2).kind, ShardKind::Column);
  EXPECT_EQ(hf_shard_spec("model.layers.0.self_attn.q_proj.bias", 2).kind, ShardKind::Column);
  EXPECT_EQ(hf_shard_spec("model.layers.0.self_attn.k_proj.weight", 2).kind, ShardKind::KvHeads);
  EXPECT_EQ(hf_shard_spec("model.layers.0.self_attn.o_proj.weight", 2).kind, ShardKind::Row);
  EXPECT_EQ(hf_shard_spec("model.layers.0.self_attn.o_proj.bias", 2).kind, ShardKind::Replicated);
  EXPECT_EQ(hf_shard_spec("model.layers.0.mlp.down_proj.weight", 2).kind, ShardKind::Row);
  EXPECT_EQ(hf_shard_spec("model.layers.0.mlp.up_proj.weight", 2).kind, ShardKind::Column);
  EXPECT_EQ(hf_shard_spec("model.embed_tokens.weight", 2).kind, ShardKind::Vocab);
  EXPECT_EQ(hf_shard_spec("lm_head.weight", 2).kind, ShardKind::Vocab);
  EXPECT_EQ(hf_shard_spec("model.layers.0.self_attn.q_norm.weight", 2).kind, ShardKind::Replicated);
  EXPECT_EQ(hf_shard_spec("model.norm.weight", 2).kind, ShardKind::Replicated);

  // Every rank's shard, put back by hand, is the full tensor (Row: columns).
  Tensor full = rnd({4, 6}, 7);
  for (int r = 0; r < 3; ++r) {
    Tensor s = shard_tensor(full, {ShardKind::Row, 0}, r, 3, "w");
    ASSERT_EQ(s.shape(), (Shape{4, 2}));
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 2; ++j) EXPECT_EQ(s.get(i * 2 + j), full.get(i * 6 + r * 2 + j));
  }
  // kv heads replicated over 4 ranks when there are 2: ranks 0,1 -> head 0; 2,3 -> head 1.
  Tensor kv = rnd({4, 3}, 8);  // 2 heads of head_dim 2
  Tensor s3 = shard_tensor(kv, {ShardKind::KvHeads, 2}, 3, 4, "k");
  ASSERT_EQ(s3.shape(), (Shape{2, 3}));
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(s3.get(i), kv.get(6 + i));
  const TpHeads h = tp_heads(4, 2, 3, 4);
  EXPECT_EQ(h.n_heads, 1);
  EXPECT_EQ(h.kv_head_begin, 1);
  EXPECT_EQ(h.kv_replicas, 2);
  EXPECT_FALSE(h.kv_owner);

  try {
    shard_tensor(rnd({5, 2}, 9), {ShardKind::Column, 0}, 0, 2, "model.x.weight");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.x.weight"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tp_heads(6, 2, 0, 4), Error);  // 6 heads over 4 ranks
  EXPECT_THROW(tp_heads(12, 3, 0, 2), Error);  // 3 kv heads vs 2 ranks
  EXPECT_THROW(vocab_range(97, 0, 2), Error);
}

TEST(CommCounter, RingCostModel) {
  // A size-1 group moves nothing but counts the calls and payloads.
  auto g = std::make_shared<CountingGroup>(comm::local_group("tp"));
  std::vector<float> buf(100);
  g->all_reduce(buf.data(), 100, DType::F32, comm::ReduceOp::Sum);
  EXPECT_EQ(g->stats().of(CollectiveKind::AllReduce).calls, 1);
  EXPECT_EQ(g->stats().of(CollectiveKind::AllReduce).payload_bytes, 400);
  EXPECT_EQ(g->stats().total_wire_bytes(), 0);
  g->reset();
  EXPECT_EQ(g->stats().total_calls(), 0);
}

TEST(DataParallelLocal, OneRankKeepsGradsAndOwnsEverything) {
  comm::LocalGroup g("dp");
  Tensor w0 = rnd({3, 4}, 10), w1 = rnd({5}, 11), g0, g1;
  DpOptions o;
  o.distributed_optimizer = true;
  DataParallel dp({{"a", &w0, &g0, 0, true}, {"b", &w1, &g1, 1, false}}, g, o);
  EXPECT_EQ(dp.numel(), 17);
  EXPECT_EQ(dp.owned_range(), (std::pair<int64_t, int64_t>{0, 17}));
  EXPECT_EQ(g0.shape(), (Shape{3, 4}));
  EXPECT_EQ(dp.offsets()[1], 5);  // "b" first: reverse order
  for (int i = 0; i < 12; ++i) g0.set(i, 1.0f);
  for (int i = 0; i < 5; ++i) g1.set(i, 100.0f);
  dp.finish_grad_sync();
  EXPECT_EQ(g0.get(3), 1.0f);
  EXPECT_NEAR(dp.grad_norm(nullptr), std::sqrt(12.0), 1e-12);  // "b" is a duplicate: not counted
  dp.clip_grad_norm(1.0, nullptr);
  EXPECT_NEAR(g0.get(0), 1.0 / (std::sqrt(12.0) + 1e-6), 1e-7);
}
