// Paged attention against its double-precision reference, and against the
// training attention (ops::attention_fwd) when every chunk is a whole sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "common/testing.h"
#include "core/rng.h"
#include "ops/attention.h"
#include "ops/paged_attention.h"
#include "ops/ref/paged_attention_ref.h"

using namespace kestrel;

namespace {

struct Case {
  int64_t H = 4, Hkv = 2, d = 16, bs = 4, num_blocks = 40;
  std::vector<int32_t> q_lens, ctx_lens;  // per sequence: query rows, context (>= query rows)
};

struct Built {
  Tensor q, k_new, v_new, kc, vc, tables, cu_q, seq_lens, slots;
  int64_t max_blocks = 0, T = 0;
};

Tensor randn(Shape s, uint64_t stream, DType dt) {
  Tensor t = Tensor::empty(s, DType::F32, MemCategory::Other);
  Philox r{99, stream};
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, r.normal(uint64_t(i)));
  return dt == DType::F32 ? t : t.to(dt);
}

// Random block tables (shuffled ids, never the null block); the cached prefix
// of each sequence is written straight into the cache, the chunk through
// paged_kv_write like the engine does.
Built build(const Case& c, DType dt) {
  Built b;
  const int64_t B = int64_t(c.q_lens.size()), kv = c.Hkv * c.d;
  for (int64_t i = 0; i < B; ++i) {
    b.T += c.q_lens[i];
    b.max_blocks = std::max<int64_t>(b.max_blocks, (c.ctx_lens[i] + c.bs - 1) / c.bs);
  }
  std::vector<int32_t> ids(size_t(c.num_blocks - 1));
  std::iota(ids.begin(), ids.end(), 1);
  std::mt19937 g(5);
  std::shuffle(ids.begin(), ids.end(), g);
  b.kc = randn({c.num_blocks, c.bs, c.Hkv, c.d}, 1, dt);  // garbage outside the tables is random, not zero
  b.vc = randn({c.num_blocks, c.bs, c.Hkv, c.d}, 2, dt);
  b.q = randn({b.T, c.H * c.d}, 3, dt);
  b.k_new = randn({b.T, kv}, 4, dt);
  b.v_new = randn({b.T, kv}, 5, dt);
  b.tables = Tensor::zeros({B, b.max_blocks}, DType::I32);
  b.cu_q = Tensor::zeros({B + 1}, DType::I32);
  b.seq_lens = Tensor::zeros({B}, DType::I32);
  b.slots = Tensor::zeros({b.T}, DType::I32);
  size_t next = 0;
  int64_t row = 0;
  for (int64_t i = 0; i < B; ++i) {
    const int64_t nb = (c.ctx_lens[i] + c.bs - 1) / c.bs;
    for (int64_t j = 0; j < nb; ++j) b.tables.data<int32_t>()[i * b.max_blocks + j] = ids.at(next++);
    b.seq_lens.data<int32_t>()[i] = c.ctx_lens[i];
    b.cu_q.data<int32_t>()[i + 1] = b.cu_q.data<int32_t>()[i] + c.q_lens[i];
    for (int64_t p = c.ctx_lens[i] - c.q_lens[i]; p < c.ctx_lens[i]; ++p, ++row) {
      const int32_t blk = b.tables.data<int32_t>()[i * b.max_blocks + p / c.bs];
      b.slots.data<int32_t>()[row] = int32_t(blk * c.bs + p % c.bs);
    }
  }
  ops::paged_kv_write(b.k_new, b.v_new, b.slots, b.kc, b.vc);
  return b;
}

std::vector<double> ref_out(const Case& c, const Built& b) {
  auto q = kestrel::testing::to_double(b.q), kc = kestrel::testing::to_double(b.kc), vc = kestrel::testing::to_double(b.vc);
  std::vector<double> out(size_t(b.T * c.H * c.d));
  ops::ref::AttnRefShape s{c.H, c.Hkv, c.d, 0};
  ops::ref::paged_attention_fwd_ref(q.data(), kc.data(), vc.data(), c.bs, b.tables.data<int32_t>(), b.max_blocks,
                                    b.cu_q.data<int32_t>(), b.seq_lens.data<int32_t>(), int64_t(c.q_lens.size()), s,
                                    out.data());
  return out;
}

Tensor run(const Case& c, const Built& b, DType dt) {
  Tensor out = Tensor::empty({b.T, c.H * c.d}, dt);
  ops::paged_attention_fwd(b.q, b.kc, b.vc, b.tables, b.cu_q, b.seq_lens, ops::AttentionShape{c.H, c.Hkv, c.d, 0.f},
                           out);
  return out;
}

}  // namespace

TEST(PagedAttention, MixedPrefillChunksAndDecodesMatchReference) {
  Case c;
  // A decode (1 row, long context), a first prefill chunk, a middle chunk of
  // a longer sequence crossing blocks, a 20-row chunk (two query tiles), and
  // a single-token sequence.
  c.q_lens = {1, 7, 5, 20, 1};
  c.ctx_lens = {29, 7, 18, 37, 1};
  for (DType dt : {DType::F32, DType::BF16}) {
    const Built b = build(c, dt);
    const Tensor out = run(c, b, dt);
    EXPECT_TRUE(kestrel::testing::all_close(kestrel::testing::to_double(out), ref_out(c, b), kestrel::testing::tolerance_for(dt), dtype_name(dt)));
  }
}

TEST(PagedAttention, GqaGroupsAndLargerHeads) {
  Case c;
  c.H = 8;
  c.Hkv = 2;
  c.d = 64;
  c.bs = 16;
  c.num_blocks = 20;
  c.q_lens = {3, 40, 1, 1};
  c.ctx_lens = {50, 40, 70, 16};
  const Built b = build(c, DType::F32);
  EXPECT_TRUE(kestrel::testing::all_close(kestrel::testing::to_double(run(c, b, DType::F32)), ref_out(c, b), {2e-5, 1e-4}));
}

TEST(PagedAttention, WholeSequencesMatchTrainingAttention) {
  Case c;
  c.q_lens = {9, 16, 3};
  c.ctx_lens = {9, 16, 3};
  const Built b = build(c, DType::F32);
  Tensor out = Tensor::empty({b.T, c.H * c.d}, DType::F32), lse = Tensor::empty({c.H, b.T}, DType::F32);
  ops::attention_fwd(b.q, b.k_new, b.v_new, b.cu_q, ops::AttentionShape{c.H, c.Hkv, c.d, 0.f}, out, lse);
  EXPECT_TRUE(kestrel::testing::all_close(kestrel::testing::to_double(run(c, b, DType::F32)), kestrel::testing::to_double(out), {2e-6, 1e-5}));
}

TEST(PagedAttention, CopyBlocksAndBadInputs) {
  Case c;
  c.q_lens = {2};
  c.ctx_lens = {6};
  Built b = build(c, DType::F32);
  Tensor host = Tensor::zeros({5, c.bs, c.Hkv, c.d}, DType::F32);
  ops::copy_kv_blocks(b.kc, host, {{3, 0}, {7, 4}});
  const int64_t blk = c.bs * c.Hkv * c.d;
  for (int64_t i = 0; i < blk; ++i) {
    EXPECT_EQ(host.get(i), b.kc.get(3 * blk + i));
    EXPECT_EQ(host.get(4 * blk + i), b.kc.get(7 * blk + i));
    EXPECT_EQ(host.get(blk + i), 0.f);
  }
  EXPECT_THROW(ops::copy_kv_blocks(b.kc, host, {{3, 5}}), Error);
  // A block table entry outside the cache is caught before any read.
  b.tables.data<int32_t>()[0] = int32_t(c.num_blocks);
  EXPECT_THROW(run(c, b, DType::F32), Error);
}
