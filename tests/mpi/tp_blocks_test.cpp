// Tensor-parallel building blocks under mpirun (2 or 4 ranks, the world group
// as the tp group): every block's forward and backward must equal the
// single-process op on the gathered data, fp32 within 1e-5 relative. Every
// rank builds the same full tensors and runs the reference itself.
#include "ops/ops.h"
#include "parallel/tp_attention.h"
#include "parallel/tp_layers.h"
#include "parallel/vocab_loss.h"
#include "tp_testing.h"

using namespace kestrel;
using namespace kestrel::parallel;
using namespace kestrel::testing;

namespace {

constexpr int64_t T = 8, IN = 12, OUT = 16;

struct LinearRef {
  Tensor x, w, b, y, dy, dx, dw, db;
};
LinearRef linear_ref(uint64_t seed) {
  LinearRef r;
  r.x = rand_full({T, IN}, seed);
  r.w = rand_full({OUT, IN}, seed + 1, 0.5f);
  r.b = rand_full({OUT}, seed + 2);
  r.dy = rand_full({T, OUT}, seed + 3);
  r.y = Tensor::empty({T, OUT}, DType::F32);
  ops::linear_fwd(r.x, r.w, &r.b, r.y);
  r.dx = Tensor::empty({T, IN}, DType::F32);
  r.dw = Tensor::zeros({OUT, IN}, DType::F32);
  r.db = Tensor::zeros({OUT}, DType::F32);
  ops::linear_bwd(r.x, r.w, r.dy, &r.dx, &r.dw, &r.db);
  return r;
}

}  // namespace

class TpBlocks : public ::testing::TestWithParam<bool> {};  // param: sequence parallel

TEST_P(TpBlocks, ColumnLinear) {
  const bool sp = GetParam();
  auto& g = world_group();
  const int r = g.rank(), n = g.size();
  LinearRef ref = linear_ref(10);
  Tensor w = row_block(ref.w, r, n), b = row_block(ref.b, r, n);
  Tensor x = sp ? row_block(ref.x, r, n) : ref.x.clone();
  Tensor y = Tensor::empty({T, OUT / n}, DType::F32);
  Tensor x_full = column_linear_fwd(g, sp, x, w, &b, y);
  EXPECT_CLOSE(y, col_block(ref.y, r, n), "column fwd y");
  Tensor dy = col_block(ref.dy, r, n);
  Tensor dx = Tensor::empty({sp ? T / n : T, IN}, DType::F32);
  Tensor dw = Tensor::zeros({OUT / n, IN}, DType::F32), db = Tensor::zeros({OUT / n}, DType::F32);
  column_linear_bwd(g, sp, x_full, w, dy, &dx, &dw, &db);
  EXPECT_CLOSE(dx, sp ? row_block(ref.dx, r, n) : ref.dx, "column bwd dx");
  EXPECT_CLOSE(dw, row_block(ref.dw, r, n), "column bwd dw");
  EXPECT_CLOSE(db, row_block(ref.db, r, n), "column bwd db");
}

TEST_P(TpBlocks, RowLinear) {
  const bool sp = GetParam();
  auto& g = world_group();
  const int r = g.rank(), n = g.size();
  LinearRef ref = linear_ref(20);
  Tensor w = col_block(ref.w, r, n), x = col_block(ref.x, r, n);
  Tensor y = Tensor::empty({sp ? T / n : T, OUT}, DType::F32);
  row_linear_fwd(g, sp, x, w, &ref.b, y);
  EXPECT_CLOSE(y, sp ? row_block(ref.y, r, n) : ref.y, "row fwd y");
  Tensor dy = sp ? row_block(ref.dy, r, n) : ref.dy.clone();
  Tensor dx = Tensor::empty({T, IN / n}, DType::F32);
  Tensor dw = Tensor::zeros({OUT, IN / n}, DType::F32), db = Tensor::zeros({OUT}, DType::F32);
  row_linear_bwd(g, sp, x, w, dy, &dx, &dw, &db);
  EXPECT_CLOSE(dx, col_block(ref.dx, r, n), "row bwd dx");
  EXPECT_CLOSE(dw, col_block(ref.dw, r, n), "row bwd dw");
  EXPECT_CLOSE(db, ref.db, "row bwd db (full on every rank)");
}

TEST_P(TpBlocks, VocabEmbedding) {
  const bool sp = GetParam();
  auto& g = world_group();
  const int r = g.rank(), n = g.size();
  const int64_t V = 32, D = 12;
  Tensor table = rand_full({V, D}, 30);
  std::vector<int32_t> idv = {0, 31, 5, 17, 8, 24, 5, 16};  // ids in every shard, one repeated
  Tensor ids = Tensor::from_ints(idv, {T});
  Tensor ref_y = Tensor::empty({T, D}, DType::F32);
  ops::embedding_fwd(ids, table, ref_y);
  Tensor dy_full = rand_full({T, D}, 31);
  Tensor ref_dt = Tensor::zeros({V, D}, DType::F32);
  ops::embedding_bwd(ids, dy_full, ref_dt);

  const VocabRange vr = vocab_range(V, r, n);
  Tensor shard = row_block(table, r, n);
  Tensor y = Tensor::empty({sp ? T / n : T, D}, DType::F32);
  vocab_embedding_fwd(g, sp, ids, shard, vr.start, y);
  EXPECT_CLOSE(y, sp ? row_block(ref_y, r, n) : ref_y, "vocab embedding fwd");
  Tensor dt = Tensor::zeros({V / n, D}, DType::F32);
  vocab_embedding_bwd(g, sp, ids, sp ? row_block(dy_full, r, n) : dy_full, dt, vr.start);
  EXPECT_CLOSE(dt, row_block(ref_dt, r, n), "vocab embedding bwd");
}

// Under SP a norm sees only this rank's tokens: its weight grad is the sum over ranks.
TEST_P(TpBlocks, SequenceParallelNormGrad) {
  const bool sp = GetParam();
  auto& g = world_group();
  const int r = g.rank(), n = g.size();
  const int64_t D = 12;
  Tensor x = rand_full({T, D}, 40), w = rand_full({D}, 41), dy = rand_full({T, D}, 42);
  Tensor ref_y = Tensor::empty({T, D}, DType::F32), rstd = Tensor::empty({T}, DType::F32);
  ops::rmsnorm_fwd(x, w, 1e-6f, ref_y, rstd);
  Tensor ref_dx = Tensor::empty({T, D}, DType::F32), ref_dw = Tensor::zeros({D}, DType::F32);
  ops::rmsnorm_bwd(x, w, rstd, dy, ref_dx, ref_dw);

  Tensor xl = sp ? row_block(x, r, n) : x, dyl = sp ? row_block(dy, r, n) : dy;
  const int64_t Tl = xl.size(0);
  Tensor y = Tensor::empty({Tl, D}, DType::F32), rs = Tensor::empty({Tl}, DType::F32);
  ops::rmsnorm_fwd(xl, w, 1e-6f, y, rs);
  Tensor y_full = tp_enter_fwd(g, sp, y);  // what the column-parallel GEMMs see
  EXPECT_CLOSE(y_full, ref_y, "norm output entering the tp region");
  Tensor dx = Tensor::empty({Tl, D}, DType::F32), partial = Tensor::zeros({D}, DType::F32);
  Tensor dw = Tensor::zeros({D}, DType::F32);
  ops::rmsnorm_bwd(xl, w, rs, dyl, dx, partial);
  if (sp)
    reduce_replicated_grad(g, partial, dw);
  else
    dw = partial;
  EXPECT_CLOSE(dw, ref_dw, "norm weight grad");
  EXPECT_CLOSE(dx, sp ? row_block(ref_dx, r, n) : ref_dx, "norm dx");
}

INSTANTIATE_TEST_SUITE_P(Tp, TpBlocks, ::testing::Values(false, true),
                         [](const auto& i) { return i.param ? "SequenceParallel" : "Replicated"; });

TEST(TpVocabLoss, LogprobEntropyForwardBackward) {
  auto& g = world_group();
  const int r = g.rank(), n = g.size();
  const int64_t V = 32;
  Tensor logits = rand_full({T, V}, 50, 4.0f);
  Tensor targets = Tensor::from_ints({3, 31, -1, 0, 16, 9, 22, -1}, {T});
  Tensor lp = Tensor::empty({T}, DType::F32), ent = Tensor::empty({T}, DType::F32), lse = Tensor::empty({T}, DType::F32);
  ops::logprob_entropy_fwd(logits, targets, lp, &ent, lse);
  Tensor dlp = rand_full({T}, 51), dent = rand_full({T}, 52);
  Tensor ref_d = Tensor::empty({T, V}, DType::F32);
  ops::logprob_entropy_bwd(logits, targets, lse, dlp, &dent, ref_d);

  const VocabRange vr = vocab_range(V, r, n);
  Tensor shard = col_block(logits, r, n);
  Tensor plp = Tensor::empty({T}, DType::F32), pent = Tensor::empty({T}, DType::F32), plse = Tensor::empty({T}, DType::F32);
  vocab_logprob_entropy_fwd(g, shard, targets, vr.start, plp, &pent, plse);
  EXPECT_CLOSE(plp, lp, "logprob");
  EXPECT_CLOSE(pent, ent, "entropy");
  EXPECT_CLOSE(plse, lse, "lse");
  Tensor d = Tensor::empty({T, V / n}, DType::F32);
  vocab_logprob_entropy_bwd(g, shard, targets, vr.start, plse, dlp, &dent, &pent, d);
  EXPECT_CLOSE(d, col_block(ref_d, r, n), "dlogits");
  // In place, as the trainer reuses the one logits buffer.
  vocab_logprob_entropy_bwd(g, shard, targets, vr.start, plse, dlp, nullptr, nullptr, shard);
  Tensor ref_d2 = Tensor::empty({T, V}, DType::F32);
  ops::logprob_entropy_bwd(logits, targets, lse, dlp, nullptr, ref_d2);
  EXPECT_CLOSE(shard, col_block(ref_d2, r, n), "dlogits in place, no entropy term");
}

TEST(TpVocabLoss, CrossEntropy) {
  auto& g = world_group();
  const int r = g.rank(), n = g.size();
  const int64_t V = 32;
  Tensor logits = rand_full({T, V}, 60, 3.0f);
  Tensor targets = Tensor::from_ints({1, -1, 30, 7, 15, 16, 2, 31}, {T});
  Tensor lse = Tensor::empty({T}, DType::F32);
  const double loss = ops::cross_entropy_fwd(logits, targets, lse);
  Tensor ref_d = Tensor::empty({T, V}, DType::F32);
  ops::cross_entropy_bwd(logits, targets, lse, 0.7, ref_d);
  const VocabRange vr = vocab_range(V, r, n);
  Tensor shard = col_block(logits, r, n), plse = Tensor::empty({T}, DType::F32);
  const double ploss = vocab_cross_entropy_fwd(g, shard, targets, vr.start, plse);
  EXPECT_NEAR(ploss, loss, 1e-5 * std::abs(loss));
  Tensor d = Tensor::empty({T, V / n}, DType::F32);
  vocab_cross_entropy_bwd(g, shard, targets, vr.start, plse, 0.7, d);
  EXPECT_CLOSE(d, col_block(ref_d, r, n), "cross-entropy dlogits");
}

// 4 query heads, 2 kv heads: split over 2 ranks, replicated kv over 4.
TEST(TpAttention, HeadShardedGqa) {
  auto& g = world_group();
  const int r = g.rank(), n = g.size();
  const int64_t H = 4, Hkv = 2, hd = 8;
  Tensor q = rand_full({T, H * hd}, 70), k = rand_full({T, Hkv * hd}, 71), v = rand_full({T, Hkv * hd}, 72);
  Tensor cu = Tensor::from_ints({0, 3, 8}, {3});
  ops::AttentionShape s{H, Hkv, hd, 0.f};
  Tensor out = Tensor::empty({T, H * hd}, DType::F32), lse = Tensor::empty({H, T}, DType::F32);
  ops::attention_fwd(q, k, v, cu, s, out, lse);
  Tensor dout = rand_full({T, H * hd}, 73);
  Tensor dq = Tensor::empty({T, H * hd}, DType::F32), dk = Tensor::empty({T, Hkv * hd}, DType::F32),
         dv = Tensor::empty({T, Hkv * hd}, DType::F32);
  ops::attention_bwd(q, k, v, out, lse, dout, cu, s, dq, dk, dv);

  const TpHeads h = tp_heads(H, Hkv, r, n);
  EXPECT_EQ(h.kv_replicas, n > Hkv ? n / Hkv : 1);
  const int64_t kb = h.kv_head_begin * hd, ke = (h.kv_head_begin + h.n_kv_heads) * hd;
  Tensor ql = col_block(q, r, n), kl = cols_of(k, kb, ke), vl = cols_of(v, kb, ke);
  Tensor o = Tensor::empty({T, h.n_heads * hd}, DType::F32), l = Tensor::empty({h.n_heads, T}, DType::F32);
  tp_attention_fwd(h, hd, ql, kl, vl, cu, o, l);
  EXPECT_CLOSE(o, col_block(out, r, n), "attention out");
  EXPECT_CLOSE(l, row_block(lse, r, n), "attention lse");
  Tensor dql = Tensor::empty(ql.shape(), DType::F32), dkl = Tensor::empty(kl.shape(), DType::F32),
         dvl = Tensor::empty(vl.shape(), DType::F32);
  tp_attention_bwd(h, hd, ql, kl, vl, o, l, col_block(dout, r, n), cu, dql, dkl, dvl);
  EXPECT_CLOSE(dql, col_block(dq, r, n), "dq");
  // Replicas each hold part of dk/dv; their sum is the kv head's gradient.
  Tensor dk_sum = Tensor::zeros(kl.shape(), DType::F32), dv_sum = Tensor::zeros(vl.shape(), DType::F32);
  reduce_kv_replica_grad(g, h, dkl, dk_sum);
  reduce_kv_replica_grad(g, h, dvl, dv_sum);
  EXPECT_CLOSE(dk_sum, cols_of(dk, kb, ke), "dk summed over replicas");
  EXPECT_CLOSE(dv_sum, cols_of(dv, kb, ke), "dv summed over replicas");
}

TEST(TpSharding, ShardGatherRoundTrip) {
  auto& g = world_group();
  const int r = g.rank(), n = g.size();
  struct Case {
    ShardSpec spec;
    Shape shape;
  };
  const Case cases[] = {{{ShardKind::Column, 0}, {16, 6}}, {{ShardKind::Row, 0}, {6, 16}},
                        {{ShardKind::Vocab, 0}, {32, 4}},  {{ShardKind::Replicated, 0}, {5}},
                        {{ShardKind::KvHeads, 2}, {16, 6}}, {{ShardKind::Column, 0}, {8}}};
  for (const auto& c : cases) {
    Tensor full = rand_full(c.shape, 80);
    Tensor shard = shard_tensor(full, c.spec, r, n, "t");
    EXPECT_EQ(shard.shape(), shard_shape(c.shape, c.spec, n));
    Tensor back = gather_tensor(g, shard, c.spec, c.shape);
    EXPECT_EQ(back.to_float_vector(), full.to_float_vector()) << shard_kind_name(c.spec.kind);
  }
}
