// Paged attention against its double-precision reference, and against the
// training attention (ops::attention_fwd) when every chunk is a whole sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "common/testing.h"
#include "core/parallel_for.h"
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

// Cache slot of position pos of sequence i.
int64_t slot_of(const Case& c, const Built& b, int64_t i, int64_t pos) {
  return int64_t(b.tables.data<int32_t>()[i * b.max_blocks + pos / c.bs]) * c.bs + pos % c.bs;
}

// Every K/V element of the slot set to x.
void poison_slot(const Case& c, Built& b, int64_t slot, float x) {
  const int64_t row = c.Hkv * c.d;
  for (int64_t e = 0; e < row; ++e) {
    b.kc.set(slot * row + e, x);
    b.vc.set(slot * row + e, x);
  }
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

void expect_matches_reference(const Case& c, DType dt) {
  const Built b = build(c, dt);
  EXPECT_TRUE(kestrel::testing::all_close(kestrel::testing::to_double(run(c, b, dt)), ref_out(c, b),
                                          kestrel::testing::tolerance_for(dt),
                                          std::string(dtype_name(dt)) + " H=" + std::to_string(c.H) +
                                              " Hkv=" + std::to_string(c.Hkv) + " d=" + std::to_string(c.d) +
                                              " bs=" + std::to_string(c.bs)));
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

// GQA ratios 1, 2, 3, 4, 8; head_dim not a multiple of the 8-float vector
// (f32 and bf16 then go through padded scratch rows); block sizes that cut
// 8-key score groups (3, 5, 12) or exceed them (32).
TEST(PagedAttention, OddGeometriesMatchReference) {
  struct Geo { int64_t H, Hkv, d, bs; };
  for (const Geo& geo : {Geo{3, 1, 20, 5}, Geo{2, 2, 24, 12}, Geo{8, 2, 8, 3}, Geo{4, 1, 40, 32}, Geo{8, 1, 16, 16},
                         Geo{4, 4, 7, 4}}) {
    Case c;
    c.H = geo.H;
    c.Hkv = geo.Hkv;
    c.d = geo.d;
    c.bs = geo.bs;
    c.q_lens = {1, 9, 17, 1, 2};
    c.ctx_lens = {23, 9, 40, 61, 2};
    int64_t blocks = 1;
    for (int32_t n : c.ctx_lens) blocks += (n + c.bs - 1) / c.bs;
    c.num_blocks = blocks + 3;
    for (DType dt : {DType::F32, DType::BF16}) expect_matches_reference(c, dt);
  }
}

// Contexts longer than one softmax chunk (the kernel rescales between
// chunks): long decodes and a prefill tile over a long cached prefix.
TEST(PagedAttention, LongContextsSpanSeveralSoftmaxChunks) {
  Case c;
  c.d = 16;
  c.bs = 16;
  c.q_lens = {1, 20, 1, 3};
  c.ctx_lens = {700, 320, 513, 1100};
  c.num_blocks = 180;
  for (DType dt : {DType::F32, DType::BF16}) expect_matches_reference(c, dt);
}

// Each output is computed by one task in a fixed order: bit-identical at 1
// and 2 threads, and when a sequence runs alone instead of in the batch.
TEST(PagedAttention, ResultsIndependentOfThreadsAndBatch) {
  Case c;
  c.d = 32;
  c.bs = 16;
  for (int i = 0; i < 40; ++i) {
    const bool prefill = i % 5 == 0;
    c.q_lens.push_back(prefill ? 21 : 1);
    c.ctx_lens.push_back(prefill ? 21 + 3 * i : 50 + 2 * i);
  }
  c.num_blocks = 260;
  for (DType dt : {DType::F32, DType::BF16}) {
    const Built b = build(c, dt);
    const int before = num_threads();
    set_num_threads(1);
    const Tensor one = run(c, b, dt);
    set_num_threads(2);
    const Tensor two = run(c, b, dt);
    set_num_threads(before);
    EXPECT_TRUE(bitwise_equal(one, two)) << dtype_name(dt);
    for (int64_t s : {int64_t(0), int64_t(7), int64_t(39)}) {  // a prefill, a decode, the last decode
      const int64_t r0 = b.cu_q.data<int32_t>()[s], nq = c.q_lens[size_t(s)], ldq = c.H * c.d;
      Tensor q = Tensor::empty({nq, ldq}, dt), out = Tensor::empty({nq, ldq}, dt);
      const size_t es = dtype_size(dt);
      std::memcpy(q.raw(), static_cast<const char*>(b.q.raw()) + size_t(r0 * ldq) * es, size_t(nq * ldq) * es);
      std::vector<int32_t> table(b.tables.data<int32_t>() + s * b.max_blocks,
                                 b.tables.data<int32_t>() + (s + 1) * b.max_blocks);
      ops::paged_attention_fwd(q, b.kc, b.vc, Tensor::from_ints(table, {1, b.max_blocks}),
                               Tensor::from_ints({0, int32_t(nq)}, {2}), Tensor::from_ints({c.ctx_lens[size_t(s)]}, {1}),
                               ops::AttentionShape{c.H, c.Hkv, c.d, 0.f}, out);
      EXPECT_EQ(0, std::memcmp(out.raw(), static_cast<const char*>(one.raw()) + size_t(r0 * ldq) * es,
                               size_t(nq * ldq) * es))
          << dtype_name(dt) << " sequence " << s;
    }
  }
}

// Slots outside every context (the tail of a partial block, unused blocks)
// may hold anything (the engine's cache is never cleared): NaN there must
// not reach any output. A NaN/Inf token reaches only the rows that see it.
TEST(PagedAttention, GarbageAndLaterTokensNeverLeak) {
  Case c;
  c.d = 16;
  c.bs = 8;
  c.num_blocks = 12;
  c.q_lens = {6, 1, 3};
  c.ctx_lens = {13, 21, 3};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType dt : {DType::F32, DType::BF16}) {
    Built b = build(c, dt);
    std::vector<bool> used(size_t(c.num_blocks * c.bs), false);
    for (int64_t i = 0; i < int64_t(c.q_lens.size()); ++i)
      for (int64_t p = 0; p < c.ctx_lens[size_t(i)]; ++p) used[size_t(slot_of(c, b, i, p))] = true;
    for (int64_t sl = 0; sl < c.num_blocks * c.bs; ++sl)
      if (!used[size_t(sl)]) poison_slot(c, b, sl, nan);
    const auto want = ref_out(c, b);
    for (double x : want) ASSERT_TRUE(std::isfinite(x));
    EXPECT_TRUE(kestrel::testing::all_close(kestrel::testing::to_double(run(c, b, dt)), want,
                                            kestrel::testing::tolerance_for(dt), dtype_name(dt)));
    // The last token of sequence 0's chunk: only its own query row sees it.
    const int64_t s_last = slot_of(c, b, 0, c.ctx_lens[0] - 1), row = c.Hkv * c.d;
    for (int64_t e = 0; e < row; ++e) {
      b.kc.set(s_last * row + e, nan);
      b.vc.set(s_last * row + e, std::numeric_limits<float>::infinity());
    }
    const auto want2 = ref_out(c, b);
    const auto got2 = kestrel::testing::to_double(run(c, b, dt));
    EXPECT_TRUE(kestrel::testing::all_close(got2, want2, kestrel::testing::tolerance_for(dt), dtype_name(dt)));
    for (int64_t t = 0; t < b.T; ++t)
      for (int64_t e = 0; e < c.H * c.d; ++e)
        EXPECT_EQ(std::isfinite(got2[size_t(t * c.H * c.d + e)]), t != c.q_lens[0] - 1) << "row " << t;
  }
}
