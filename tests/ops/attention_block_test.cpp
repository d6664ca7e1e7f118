// Block attention, the steps of ring context parallelism (ops/attention.h
// attention_block_fwd / attention_merge / attention_block_bwd): the CPU
// kernels against the double reference (f32 and bf16, each ISA level), the
// reference backward against finite differences, and the properties the CP
// layer relies on: splitting a causal packed batch's keys into blocks (any
// cuts, and the zigzag chunks of cp ranks), attending per block and merging
// gives ops::attention_fwd's out and lse; the blocks' backward sums to
// attention_bwd's dq and gives its dk/dv rows; blocks no query sees change
// nothing; empty sequences, Tq or Tk = 0, queries before all their keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>

#include "core/parallel_for.h"
#include "op_harness.h"
#include "ops/attention.h"
#include "ops/ref/attention_ref.h"

namespace kestrel::ops {
namespace {

using namespace kestrel::testing;

constexpr double kNegInfD = -std::numeric_limits<double>::infinity();

// A causal packed batch (the whole problem CP splits): sequences of `lens`,
// q/k/v of every row in dtype dt.
struct Full {
  AttentionShape shape;
  std::vector<int32_t> cu{0};
  Tensor q, k, v, cu_t;
  int64_t T() const { return cu.back(); }
  int64_t n_seqs() const { return int64_t(cu.size()) - 1; }
  int64_t qw() const { return shape.n_heads * shape.head_dim; }
  int64_t kw() const { return shape.n_kv_heads * shape.head_dim; }
  int64_t vw() const { return shape.n_kv_heads * shape.value_dim(); }
  int64_t ow() const { return shape.n_heads * shape.value_dim(); }
};

Full make_full(const std::vector<int32_t>& lens, AttentionShape s, DType dt, uint64_t seed) {
  Full f;
  f.shape = s;
  for (int32_t l : lens) f.cu.push_back(f.cu.back() + l);
  const int64_t T = f.T();
  f.q = make_tensor(randn(T * f.qw(), seed * 8 + 0), {T, f.qw()}, dt);
  f.k = make_tensor(randn(T * f.kw(), seed * 8 + 1), {T, f.kw()}, dt);
  f.v = make_tensor(randn(T * f.vw(), seed * 8 + 2), {T, f.vw()}, dt);
  f.cu_t = make_ids(f.cu);
  return f;
}

// A subset of the rows of a Full batch, per sequence, in the given order:
// its cu, the rows' positions and their rows in the batch.
struct Rows {
  std::vector<int32_t> cu{0}, pos;
  std::vector<int64_t> full_row;
  int64_t n() const { return int64_t(pos.size()); }
};
using PosFn = std::function<std::vector<int32_t>(int64_t seq, int32_t len)>;

Rows pick(const Full& f, const PosFn& positions) {
  Rows r;
  for (int64_t b = 0; b < f.n_seqs(); ++b) {
    for (int32_t p : positions(b, f.cu[b + 1] - f.cu[b])) {
      r.pos.push_back(p);
      r.full_row.push_back(f.cu[b] + p);
    }
    r.cu.push_back(int32_t(r.pos.size()));
  }
  return r;
}

// Positions of CP rank `rank` of `cp` in a sequence of len (a multiple of
// 2*cp): chunks rank and 2*cp-1-rank, in that order.
std::vector<int32_t> zigzag(int32_t len, int cp, int rank) {
  const int32_t c = len / (2 * cp);
  std::vector<int32_t> p;
  for (int chunk : {rank, 2 * cp - 1 - rank})
    for (int32_t i = 0; i < c; ++i) p.push_back(chunk * c + i);
  return p;
}
PosFn zigzag_fn(int cp, int rank) {
  return [=](int64_t, int32_t len) { return zigzag(len, cp, rank); };
}
PosFn range_fn(int32_t lo, int32_t hi) {  // positions [lo, min(hi, len))
  return [=](int64_t, int32_t len) {
    std::vector<int32_t> p;
    for (int32_t i = lo; i < std::min(hi, len); ++i) p.push_back(i);
    return p;
  };
}

// Rows of t (a Full tensor) picked by r, as a tensor of dtype dt.
Tensor gather(const Tensor& t, const Rows& r, DType dt) {
  const int64_t w = t.size(1);
  const auto x = values(t);
  std::vector<double> y(size_t(r.n() * w));
  for (int64_t i = 0; i < r.n(); ++i)
    for (int64_t c = 0; c < w; ++c) y[size_t(i * w + c)] = x[size_t(r.full_row[size_t(i)] * w + c)];
  return make_tensor(y, {r.n(), w}, dt);
}
Tensor ints(const std::vector<int32_t>& v) { return Tensor::from_ints(v, {int64_t(v.size())}); }
AttentionBlock block_of(const Rows& q, const Rows& k) { return {ints(q.cu), ints(k.cu), ints(q.pos), ints(k.pos)}; }
ref::BlockRef ref_block(const Rows& q, const Rows& k) {
  return {q.cu.data(), k.cu.data(), q.pos.data(), k.pos.data(), int64_t(q.cu.size()) - 1};
}
ref::AttnRefShape ref_shape(const AttentionShape& s) {
  return {s.n_heads, s.n_kv_heads, s.head_dim, s.scale, s.v_head_dim};
}

// One block pairing of a Full batch: the q rows and the k/v rows as tensors.
struct Pair {
  Rows qr, kr;
  Tensor q, k, v;
  AttentionBlock blk;
};
Pair make_pair(const Full& f, const Rows& qr, const Rows& kr) {
  const DType dt = f.q.dtype();
  return {qr, kr, gather(f.q, qr, dt), gather(f.k, kr, dt), gather(f.v, kr, dt), block_of(qr, kr)};
}

struct FwdOut {
  Tensor out, lse;
};
FwdOut block_fwd(const Full& f, const Pair& p, DType out_dt) {
  FwdOut r{nan_tensor({p.qr.n(), f.ow()}, out_dt), nan_tensor({f.shape.n_heads, p.qr.n()}, DType::F32)};
  attention_block_fwd(p.q, p.k, p.v, p.blk, f.shape, r.out, r.lse);
  return r;
}
struct Grads {
  Tensor dq, dk, dv;
};
// dq accumulates into `dq` (zeros when undefined); dk/dv start NaN (written).
Grads block_bwd(const Full& f, const Pair& p, const Tensor& out, const Tensor& lse, const Tensor& dout,
                Tensor dq = {}) {
  if (!dq.defined()) dq = Tensor::zeros({p.qr.n(), f.qw()}, DType::F32);
  Grads g{dq, nan_tensor({p.kr.n(), f.kw()}, DType::F32), nan_tensor({p.kr.n(), f.vw()}, DType::F32)};
  attention_block_bwd(p.q, p.k, p.v, out, lse, dout, p.blk, f.shape, g.dq, g.dk, g.dv);
  return g;
}

// The final (out, lse) of the q rows over every key of their sequences
// (causal), from the reference: what a ring's merged forward hands the backward.
struct RefFinal {
  std::vector<double> out, lse;
};
RefFinal ref_final(const Full& f, const Pair& p) {
  const Rows all = pick(f, [](int64_t, int32_t len) {
    std::vector<int32_t> v(static_cast<size_t>(len));
    std::iota(v.begin(), v.end(), 0);
    return v;
  });
  RefFinal r{std::vector<double>(size_t(p.qr.n() * f.ow())), std::vector<double>(size_t(f.shape.n_heads * p.qr.n()))};
  const auto q = values(p.q), k = values(gather(f.k, all, f.k.dtype())), v = values(gather(f.v, all, f.v.dtype()));
  ref::attention_block_fwd_ref(q.data(), k.data(), v.data(), ref_block(p.qr, all), ref_shape(f.shape), r.out.data(),
                               r.lse.data());
  return r;
}

// ------------------------------------------------------ kernel vs reference --

struct BlockCase {
  std::string name;
  std::vector<int32_t> lens;
  AttentionShape shape;
  PosFn q_pos, k_pos;
};

// A random subset of [0, len) in random order (positions need not be sorted).
PosFn shuffled_fn(uint64_t seed, double keep) {
  return [=](int64_t b, int32_t len) {
    std::vector<int32_t> p;
    for (int32_t i = 0; i < len; ++i)
      if (Philox{seed, uint64_t(b)}.uniform(uint64_t(i)) < keep) p.push_back(i);
    for (size_t i = p.size(); i > 1; --i)
      std::swap(p[i - 1], p[size_t(Philox{seed + 1, uint64_t(b)}.uniform(i) * float(i)) % i]);
    return p;
  };
}

std::vector<BlockCase> block_cases() {
  return {
      // Step 0 of a CP2 ring (the diagonal block: causal within each chunk, chunk 3 sees chunk 0).
      {"zigzag2 r0 x r0", {128, 4, 264, 0}, {4, 2, 64}, zigzag_fn(2, 0), zigzag_fn(2, 0)},
      // Keys of an earlier rank: the q chunks see k chunk 0 whole, k chunk 3 not at all (r1 x r0) or partly.
      {"zigzag2 r1 x r0", {128, 4, 264}, {4, 2, 64}, zigzag_fn(2, 1), zigzag_fn(2, 0)},
      // Keys of a later rank: only the late q chunk sees them (CP3, GQA 4:1, head_dim 24).
      {"zigzag3 r0 x r2", {132, 6, 270}, {4, 1, 24}, zigzag_fn(3, 0), zigzag_fn(3, 2)},
      // Values of another width (MLA's 192/128), diagonal block of rank 1.
      {"zigzag2 r1 x r1 mla", {72, 8}, {2, 2, 192, 0.f, 128}, zigzag_fn(2, 1), zigzag_fn(2, 1)},
      // Unsorted positions, values narrower than keys, a scale of its own.
      {"shuffled", {90, 1, 150}, {2, 2, 80, 0.3f, 48}, shuffled_fn(5, 0.6), shuffled_fn(9, 0.5)},
      // A query chunk of > 256 rows (two forward tasks) against a shifted key range.
      {"long range", {330}, {4, 4, 32}, range_fn(0, 300), range_fn(100, 330)},
      // Per sequence: queries of chunk 0 before all keys (chunks 1, 2) and of chunk 3 after them; an empty
      // one; no keys; no queries; all queries before all keys; empty.
      {"edges", {40, 0, 30, 20, 24, 0}, {2, 1, 16},
       [](int64_t b, int32_t len) {
         return b == 0 ? zigzag(len, 2, 0) : b == 3 ? std::vector<int32_t>{} : range_fn(0, 8)(b, len);
       },
       [](int64_t b, int32_t len) {
         return b == 0 ? zigzag(len, 2, 1) : b == 2 ? std::vector<int32_t>{} : range_fn(8, len)(b, len);
       }},
  };
}

class AttentionBlockCases : public IsaParamTest<DType> {};

TEST_P(AttentionBlockCases, ForwardMatchesReference) {
  const DType dt = param();
  uint64_t seed = 10;
  for (const BlockCase& c : block_cases()) {
    const Full f = make_full(c.lens, c.shape, dt, seed++);
    const Pair p = make_pair(f, pick(f, c.q_pos), pick(f, c.k_pos));
    std::vector<double> out(size_t(p.qr.n() * f.ow())), lse(size_t(f.shape.n_heads * p.qr.n()));
    const auto q = values(p.q), k = values(p.k), v = values(p.v);
    ref::attention_block_fwd_ref(q.data(), k.data(), v.data(), ref_block(p.qr, p.kr), ref_shape(f.shape),
                                 out.data(), lse.data());
    for (DType out_dt : {dt, DType::F32}) {
      const FwdOut r = block_fwd(f, p, out_dt);
      const std::string name = c.name + " out " + dtype_name(out_dt);
      EXPECT_TRUE(close_for(dt, values(r.out), out, name));
      EXPECT_TRUE(close_for(DType::F32, values(r.lse), lse, name + " lse"));
    }
  }
}

TEST_P(AttentionBlockCases, BackwardMatchesReference) {
  const DType dt = param();
  uint64_t seed = 20;
  for (const BlockCase& c : block_cases()) {
    const Full f = make_full(c.lens, c.shape, dt, seed++);
    const Pair p = make_pair(f, pick(f, c.q_pos), pick(f, c.k_pos));
    const RefFinal fin = ref_final(f, p);
    for (DType io_dt : {dt, DType::F32}) {  // out and dout in q's dtype, then f32
      const Tensor out = make_tensor(fin.out, {p.qr.n(), f.ow()}, io_dt);
      const Tensor lse = make_tensor(fin.lse, {f.shape.n_heads, p.qr.n()}, DType::F32);
      const Tensor dout = make_tensor(randn(p.qr.n() * f.ow(), seed * 3), {p.qr.n(), f.ow()}, io_dt);
      // dq accumulates onto what is there.
      const auto dq0 = randn(p.qr.n() * f.qw(), seed * 5);
      const Grads g = block_bwd(f, p, out, lse, dout, make_tensor(dq0, {p.qr.n(), f.qw()}, DType::F32));
      std::vector<double> dq = round_to(dq0, DType::F32), dk(size_t(p.kr.n() * f.kw())), dv(size_t(p.kr.n() * f.vw()));
      const auto q = values(p.q), k = values(p.k), v = values(p.v), o = values(out), l = values(lse), d = values(dout);
      ref::attention_block_bwd_ref(q.data(), k.data(), v.data(), o.data(), l.data(), d.data(), ref_block(p.qr, p.kr),
                                   ref_shape(f.shape), dq.data(), dk.data(), dv.data());
      const std::string name = c.name + " out/dout " + dtype_name(io_dt);
      EXPECT_TRUE(close_for(dt, values(g.dq), dq, name + " dq"));
      EXPECT_TRUE(close_for(dt, values(g.dk), dk, name + " dk"));
      EXPECT_TRUE(close_for(dt, values(g.dv), dv, name + " dv"));
    }
  }
}

TEST_P(AttentionBlockCases, MergeMatchesReference) {
  const DType dt = param();
  const int64_t Tq = 37, H = 3, dv = 20;
  auto lse_vals = [&](uint64_t seed) {
    auto l = randn(H * Tq, seed, 3.0);
    for (int64_t i = 0; i < H * Tq; i += 5) l[size_t(i)] = kNegInfD;  // rows that saw no key
    return l;
  };
  auto la = lse_vals(1), lb = lse_vals(2);
  for (int64_t i = 0; i < H * Tq; i += 7) la[size_t(i)] = kNegInfD;
  for (DType out_dt : {dt, DType::F32}) {
    auto oa = randn(Tq * H * dv, 3), ob = round_to(randn(Tq * H * dv, 4), dt);
    for (int64_t i = 0; i < Tq; ++i)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t c = 0; c < dv; ++c) {  // a side with lse -inf holds 0 (as the forward writes it)
          if (la[size_t(h * Tq + i)] == kNegInfD) oa[size_t((i * H + h) * dv + c)] = 0;
          if (lb[size_t(h * Tq + i)] == kNegInfD) ob[size_t((i * H + h) * dv + c)] = 0;
        }
    oa = round_to(oa, out_dt);
    Tensor out = make_tensor(oa, {Tq, H * dv}, out_dt), lse = make_tensor(la, {H, Tq}, DType::F32);
    attention_merge(out, lse, make_tensor(ob, {Tq, H * dv}, dt), make_tensor(lb, {H, Tq}, DType::F32));
    std::vector<double> ro = oa, rl = round_to(la, DType::F32);
    const auto rlb = round_to(lb, DType::F32);
    ref::attention_merge_ref(ro.data(), rl.data(), ob.data(), rlb.data(), Tq, H, dv);
    EXPECT_TRUE(close_for(out_dt, values(out), ro, std::string("merge out ") + dtype_name(out_dt)));
    EXPECT_TRUE(close_for(DType::F32, values(lse), rl, "merge lse"));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AttentionBlockCases,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16),
                                            ::testing::ValuesIn(kernel_isas())),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_" +
                                  isa_name(std::get<1>(info.param));
                         });

// -------------------------------------------------------- the CP properties --

// One rank's view of a ring: its q rows against every rank's k/v block.
struct Split {
  std::vector<Rows> q_rows;  // per query group (a cp rank), or one: all rows
  std::vector<Rows> k_rows;  // per key block
};

// Zigzag over cp ranks: rank r's queries against rank r' keys, for every r, r'.
Split zigzag_split(const Full& f, int cp) {
  Split s;
  for (int r = 0; r < cp; ++r) {
    s.q_rows.push_back(pick(f, zigzag_fn(cp, r)));
    s.k_rows.push_back(pick(f, zigzag_fn(cp, r)));
  }
  return s;
}
// All queries against the keys cut (per sequence, at the same fractions) into n blocks.
Split cut_split(const Full& f, const std::vector<double>& cuts) {
  Split s;
  s.q_rows.push_back(pick(f, range_fn(0, std::numeric_limits<int32_t>::max())));
  for (size_t i = 0; i + 1 < cuts.size(); ++i)
    s.k_rows.push_back(pick(f, [&, i](int64_t, int32_t len) {
      return range_fn(int32_t(cuts[i] * len), int32_t(cuts[i + 1] * len))(0, len);
    }));
  return s;
}

// Rows r of a Full-batch result t ([T, w]), as doubles.
std::vector<double> rows_of(const Tensor& t, const Rows& r) { return values(gather(t, r, DType::F32)); }
// lse [H, T] of a Full batch at the rows r: [H, r.n()].
std::vector<double> lse_rows(const Tensor& lse, const Rows& r) {
  const int64_t H = lse.size(0), T = lse.size(1);
  const auto x = values(lse);
  std::vector<double> y;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < r.n(); ++i) y.push_back(x[size_t(h * T + r.full_row[size_t(i)])]);
  return y;
}

// (1) and (2): per query group, block forward + merge over every key block
// equals attention_fwd; the blocks' backward (from the merged out/lse) sums to
// attention_bwd's dq and, summed over query groups, gives its dk/dv rows.
void expect_split_equals_full(const Full& f, const Split& s, const std::string& name) {
  const DType dt = f.q.dtype();
  const int64_t H = f.shape.n_heads, T = f.T();
  Tensor out = Tensor::empty({T, f.ow()}, dt), lse = Tensor::empty({H, T}, DType::F32);
  attention_fwd(f.q, f.k, f.v, f.cu_t, f.shape, out, lse);
  // Gradients f32 (bf16 mode keeps activation grads in f32, as the ring does).
  const Tensor dout = make_tensor(randn(T * f.ow(), 77), {T, f.ow()}, DType::F32);
  Tensor dq = Tensor::empty({T, f.qw()}, DType::F32), dk = Tensor::empty({T, f.kw()}, DType::F32),
         dv = Tensor::empty({T, f.vw()}, DType::F32);
  attention_bwd(f.q, f.k, f.v, out, lse, dout, f.cu_t, f.shape, dq, dk, dv);

  std::vector<std::vector<double>> dk_sum(s.k_rows.size()), dv_sum(s.k_rows.size());
  for (size_t qi = 0; qi < s.q_rows.size(); ++qi) {
    const Rows& qr = s.q_rows[qi];
    const std::string tag = name + " q group " + std::to_string(qi);
    Tensor acc = Tensor::zeros({qr.n(), f.ow()}, DType::F32), acc_lse = make_tensor(
        std::vector<double>(size_t(H * qr.n()), kNegInfD), {H, qr.n()}, DType::F32);
    std::vector<Pair> pairs;
    // Ring order: the own block first (r, r-1, ...), as a CP rank sees them.
    for (size_t step = 0; step < s.k_rows.size(); ++step) {
      const size_t ki = (qi + s.k_rows.size() - step) % s.k_rows.size();
      pairs.push_back(make_pair(f, qr, s.k_rows[ki]));
      const FwdOut b = block_fwd(f, pairs.back(), DType::F32);
      attention_merge(acc, acc_lse, b.out, b.lse);
    }
    EXPECT_TRUE(close_for(dt, values(acc), rows_of(out, qr), tag + " out"));
    EXPECT_TRUE(close_for(DType::F32, values(acc_lse), lse_rows(lse, qr), tag + " lse"));
    // The final out goes on (and is kept for the backward) in the model's dtype, rounded once.
    const Tensor out_final = acc.to(dt);
    const Tensor dout_q = gather(dout, qr, DType::F32);
    Tensor dq_acc = Tensor::zeros({qr.n(), f.qw()}, DType::F32);
    for (size_t step = 0; step < pairs.size(); ++step) {
      const size_t ki = (qi + s.k_rows.size() - step) % s.k_rows.size();
      const Grads g = block_bwd(f, pairs[step], out_final, acc_lse, dout_q, dq_acc);
      auto add = [](std::vector<double>& sum, const std::vector<double>& x) {
        if (sum.empty()) sum.assign(x.size(), 0.0);
        for (size_t i = 0; i < x.size(); ++i) sum[i] += x[i];
      };
      add(dk_sum[ki], values(g.dk));
      add(dv_sum[ki], values(g.dv));
    }
    EXPECT_TRUE(close_for(dt, values(dq_acc), rows_of(dq, qr), tag + " dq"));
  }
  for (size_t ki = 0; ki < s.k_rows.size(); ++ki) {
    const std::string tag = name + " k block " + std::to_string(ki);
    EXPECT_TRUE(close_for(dt, dk_sum[ki], rows_of(dk, s.k_rows[ki]), tag + " dk"));
    EXPECT_TRUE(close_for(dt, dv_sum[ki], rows_of(dv, s.k_rows[ki]), tag + " dv"));
  }
}

class AttentionBlockProperties : public IsaParamTest<DType> {};

TEST_P(AttentionBlockProperties, KeyBlocksMergeToFullAttention) {
  const DType dt = param();
  // Lengths around the 64-row tiles, one of 1, an empty one; GQA 2:1.
  const Full f = make_full({70, 1, 0, 130, 33}, {4, 2, 32}, dt, 40);
  for (const std::vector<double>& cuts :
       {std::vector<double>{0, 1}, {0, 0.5, 1}, {0, 0.2, 0.45, 1}, {0, 0.1, 0.3, 0.5, 0.75, 1}}) {
    const Split s = cut_split(f, cuts);
    expect_split_equals_full(f, s, std::to_string(s.k_rows.size()) + " key blocks");
  }
}

TEST_P(AttentionBlockProperties, ZigzagRingMergesToFullAttention) {
  const DType dt = param();
  for (int cp : {2, 3, 4}) {
    // Sequence lengths multiples of 2*cp (the CP padding rule), one empty; values narrower (MLA-like) at cp 3.
    std::vector<int32_t> lens;
    for (int32_t m : {12, 1, 0, 25, 6}) lens.push_back(m * 2 * cp);
    const AttentionShape shape = cp == 3 ? AttentionShape{4, 4, 40, 0.f, 24} : AttentionShape{4, 1, 32};
    const Full f = make_full(lens, shape, dt, 50 + uint64_t(cp));
    expect_split_equals_full(f, zigzag_split(f, cp), "zigzag cp" + std::to_string(cp));
  }
}

// (3) A block no query sees: out 0, lse -inf, dk = dv = 0, dq unchanged;
// merging it leaves out and lse bit-identical (and a merge into the empty
// accumulator takes the other side as it is).
TEST_P(AttentionBlockProperties, InvisibleBlockChangesNothing) {
  const DType dt = param();
  const Full f = make_full({64, 100, 8}, {4, 2, 32}, dt, 60);
  // CP4: rank 0's first chunk vs rank 1's keys is invisible; use the queries of chunk 0 only.
  const Rows qr = pick(f, [](int64_t, int32_t len) { return range_fn(0, len / 8)(0, len); });
  const Pair inv = make_pair(f, qr, pick(f, zigzag_fn(4, 1)));
  const FwdOut b = block_fwd(f, inv, dt);
  EXPECT_TRUE(all_close(values(b.out), std::vector<double>(size_t(qr.n() * f.ow()), 0.0), {0, 0}, "out"));
  EXPECT_TRUE(all_close(values(b.lse), std::vector<double>(size_t(f.shape.n_heads * qr.n()), kNegInfD), {0, 0}, "lse"));

  const Pair own = make_pair(f, qr, pick(f, zigzag_fn(4, 0)));
  const FwdOut a = block_fwd(f, own, DType::F32);
  Tensor out = a.out.clone(), lse = a.lse.clone();
  attention_merge(out, lse, b.out, b.lse);
  EXPECT_EQ(out.to_float_vector(), a.out.to_float_vector());
  EXPECT_EQ(lse.to_float_vector(), a.lse.to_float_vector());
  Tensor empty = Tensor::zeros(a.out.shape(), DType::F32), empty_lse = b.lse.clone();
  attention_merge(empty, empty_lse, a.out, a.lse);
  EXPECT_EQ(empty.to_float_vector(), a.out.to_float_vector());
  EXPECT_EQ(empty_lse.to_float_vector(), a.lse.to_float_vector());

  const Tensor dout = make_tensor(randn(qr.n() * f.ow(), 61), {qr.n(), f.ow()}, DType::F32);
  const Tensor dq0 = make_tensor(randn(qr.n() * f.qw(), 62), {qr.n(), f.qw()}, DType::F32);
  const Grads g = block_bwd(f, inv, a.out, a.lse, dout, dq0.clone());
  EXPECT_EQ(g.dq.to_float_vector(), dq0.to_float_vector());
  EXPECT_TRUE(all_close(values(g.dk), std::vector<double>(size_t(inv.kr.n() * f.kw()), 0.0), {0, 0}, "dk"));
  EXPECT_TRUE(all_close(values(g.dv), std::vector<double>(size_t(inv.kr.n() * f.vw()), 0.0), {0, 0}, "dv"));
}

// (4) Tq = 0, Tk = 0 and both: shapes with no rows are valid; nothing is read.
TEST_P(AttentionBlockProperties, EmptyRowsAreValid) {
  const DType dt = param();
  const Full f = make_full({16, 0, 8}, {2, 1, 16}, dt, 70);
  const Rows none = pick(f, [](int64_t, int32_t) { return std::vector<int32_t>{}; });
  const Rows all = pick(f, range_fn(0, 1 << 20));
  for (const auto& [qr, kr] : {std::pair{none, all}, std::pair{all, none}, std::pair{none, none}}) {
    const Pair p = make_pair(f, qr, kr);
    const FwdOut r = block_fwd(f, p, dt);
    const auto o = values(r.out);
    EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](double x) { return x == 0; }));
    const auto l = values(r.lse);
    EXPECT_TRUE(std::all_of(l.begin(), l.end(), [](double x) { return x == kNegInfD; }));
    const Tensor dout = Tensor::zeros(r.out.shape(), DType::F32);
    const Grads g = block_bwd(f, p, r.out, r.lse, dout);
    const auto dk = values(g.dk), dq = values(g.dq);
    EXPECT_TRUE(std::all_of(dk.begin(), dk.end(), [](double x) { return x == 0; }));
    EXPECT_TRUE(std::all_of(dq.begin(), dq.end(), [](double x) { return x == 0; }));
    Tensor m = r.out.clone(), ml = r.lse.clone();
    EXPECT_NO_THROW(attention_merge(m, ml, r.out, r.lse));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AttentionBlockProperties,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16),
                                            ::testing::ValuesIn(kernel_isas())),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_" +
                                  isa_name(std::get<1>(info.param));
                         });

KS_ISA_SUITE(AttentionBlockKernel);

// Work is split per task, not per thread: 1 and 2 threads agree bit for bit.
TEST_P(AttentionBlockKernel, ThreadCountIndependent) {
  const Full f = make_full({300, 37, 64}, {4, 2, 40, 0.f, 24}, DType::BF16, 80);
  const Pair p = make_pair(f, pick(f, zigzag_fn(1, 0)), pick(f, shuffled_fn(3, 0.7)));
  const Tensor dout = make_tensor(randn(p.qr.n() * f.ow(), 81), {p.qr.n(), f.ow()}, DType::BF16);
  auto run = [&](int threads) {
    const int saved = num_threads();
    set_num_threads(threads);
    FwdOut r = block_fwd(f, p, DType::BF16);
    Tensor m = Tensor::zeros(r.out.shape(), DType::F32), ml = make_tensor(
        std::vector<double>(size_t(r.lse.numel()), kNegInfD), r.lse.shape(), DType::F32);
    attention_merge(m, ml, r.out, r.lse);
    const Grads g = block_bwd(f, p, r.out, r.lse, dout);
    set_num_threads(saved);
    return std::vector<std::vector<float>>{r.out.to_float_vector(), r.lse.to_float_vector(), m.to_float_vector(),
                                           g.dq.to_float_vector(),  g.dk.to_float_vector(),  g.dv.to_float_vector()};
  };
  EXPECT_EQ(run(1), run(2));
}

TEST_P(AttentionBlockKernel, RejectsBadArguments) {
  const Full f = make_full({8, 4}, {4, 2, 8}, DType::F32, 90);
  const Pair p = make_pair(f, pick(f, zigzag_fn(2, 0)), pick(f, zigzag_fn(2, 1)));
  FwdOut r = block_fwd(f, p, DType::F32);
  AttentionBlock bad = p.blk;
  bad.cu_k = ints({0, 4});
  EXPECT_THROW_MSG(attention_block_fwd(p.q, p.k, p.v, bad, f.shape, r.out, r.lse), "cu_k must be i32 [n_seqs+1]");
  bad = p.blk;
  bad.cu_q = ints({0, 5, 7});
  EXPECT_THROW_MSG(attention_block_fwd(p.q, p.k, p.v, bad, f.shape, r.out, r.lse), "cu_q must start at 0 and end at 6");
  bad = p.blk;
  bad.k_pos = ints({0, 1});
  EXPECT_THROW_MSG(attention_block_fwd(p.q, p.k, p.v, bad, f.shape, r.out, r.lse), "k_pos must be i32 [Tk]");
  Tensor out_bad = Tensor::empty({6, 31}, DType::F32);
  EXPECT_THROW_MSG(attention_block_fwd(p.q, p.k, p.v, p.blk, f.shape, out_bad, r.lse), "out must be f32[6, 32]");
  const Tensor v_bf = p.v.to(DType::BF16);
  EXPECT_THROW_MSG(attention_block_fwd(p.q, p.k, v_bf, p.blk, f.shape, r.out, r.lse), "v must be f32[6, 16]");
  Tensor dq_bf = Tensor::empty({6, 32}, DType::BF16), dk = Tensor::empty({6, 16}, DType::F32),
         dv = Tensor::empty({6, 16}, DType::F32);
  EXPECT_THROW_MSG(attention_block_bwd(p.q, p.k, p.v, r.out, r.lse, r.out, p.blk, f.shape, dq_bf, dk, dv),
                   "dq must be f32[6, 32]");
  Tensor lse3 = Tensor::empty({3, 6}, DType::F32);
  EXPECT_THROW_MSG(attention_merge(r.out, lse3, r.out, r.lse), "out must be f32 or bf16 [Tq, n_heads*v_head_dim]");
  EXPECT_THROW_MSG(attention_merge(r.out, r.lse, r.out, lse3), "lse_b must be f32 [4, 6]");
}

// ------------------------------------------------------------- reference --

// The reference block backward is the gradient of the reference ring: keys
// split into blocks (unsorted positions, GQA, values narrower than keys), each
// block's forward, merged; L = sum(W * merged out). dL/dq = the sum of the
// blocks' dq, dL/dk and dL/dv of a block's rows = that block's dk, dv.
TEST(AttentionBlockReference, BackwardMatchesFiniteDifferences) {
  const ref::AttnRefShape s{4, 2, 6, 0.0, 4};
  // q rows: sequence 0 positions 4, 1, 3; sequence 2: 0, 2, 3. Keys: two blocks.
  const Rows qr{{0, 3, 3, 6}, {4, 1, 3, 0, 2, 3}, {}};
  const std::vector<Rows> kb = {{{0, 3, 3, 5}, {0, 3, 4, 1, 0}, {}}, {{0, 2, 2, 4}, {2, 1, 3, 2}, {}}};
  const int64_t Tq = qr.n(), nq = Tq * 4 * 6, no = Tq * 4 * 4;
  std::vector<std::vector<double>> k, v;
  for (size_t b = 0; b < kb.size(); ++b) {
    k.push_back(randn(kb[b].n() * 2 * 6, 100 + b));
    v.push_back(randn(kb[b].n() * 2 * 4, 200 + b));
  }
  const auto q = randn(nq, 1), W = randn(no, 2);
  auto merged = [&](const std::vector<double>& qq, const std::vector<std::vector<double>>& kk,
                    const std::vector<std::vector<double>>& vv, std::vector<double>* lse_out) {
    std::vector<double> out(size_t(no), 0.0), lse(size_t(4 * Tq), kNegInfD);
    for (size_t b = 0; b < kb.size(); ++b) {
      std::vector<double> ob(static_cast<size_t>(no)), lb(static_cast<size_t>(4 * Tq));
      ref::attention_block_fwd_ref(qq.data(), kk[b].data(), vv[b].data(), ref_block(qr, kb[b]), s, ob.data(),
                                   lb.data());
      ref::attention_merge_ref(out.data(), lse.data(), ob.data(), lb.data(), Tq, 4, 4);
    }
    if (lse_out) *lse_out = lse;
    return out;
  };
  auto loss = [&](const std::vector<double>& qq, const std::vector<std::vector<double>>& kk,
                  const std::vector<std::vector<double>>& vv) {
    const auto out = merged(qq, kk, vv, nullptr);
    return std::inner_product(out.begin(), out.end(), W.begin(), 0.0);
  };
  std::vector<double> lse;
  const auto out = merged(q, k, v, &lse);
  std::vector<double> dq(size_t(nq), 0.0);
  const Tolerance tol{1e-7, 1e-6};
  for (size_t b = 0; b < kb.size(); ++b) {
    std::vector<double> dk(k[b].size()), dv(v[b].size());
    ref::attention_block_bwd_ref(q.data(), k[b].data(), v[b].data(), out.data(), lse.data(), W.data(),
                                 ref_block(qr, kb[b]), s, dq.data(), dk.data(), dv.data());
    const std::string tag = "block " + std::to_string(b);
    EXPECT_TRUE(matches_finite_difference([&](const auto& x) { auto kk = k; kk[b] = x; return loss(q, kk, v); },
                                          k[b], dk, tag + " dk", tol));
    EXPECT_TRUE(matches_finite_difference([&](const auto& x) { auto vv = v; vv[b] = x; return loss(q, k, vv); },
                                          v[b], dv, tag + " dv", tol));
  }
  EXPECT_TRUE(matches_finite_difference([&](const auto& x) { return loss(x, k, v); }, q, dq, "dq", tol));
}

// The reference block forward over all of a sequence's keys is the plain
// causal reference (attention_fwd_ref).
TEST(AttentionBlockReference, WholeSequenceIsCausalAttention) {
  const ref::AttnRefShape s{2, 1, 8, 0.0, 0};
  const std::vector<int32_t> cu = {0, 7, 7, 12}, pos = {0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4};
  const int64_t T = 12;
  const auto q = randn(T * 16, 1), k = randn(T * 8, 2), v = randn(T * 8, 3);
  std::vector<double> o1(size_t(T * 16)), l1(size_t(2 * T)), o2(o1.size()), l2(l1.size());
  ref::attention_fwd_ref(q.data(), k.data(), v.data(), cu.data(), 3, s, o1.data(), l1.data());
  ref::attention_block_fwd_ref(q.data(), k.data(), v.data(), ref::BlockRef{cu.data(), cu.data(), pos.data(), pos.data(), 3},
                               s, o2.data(), l2.data());
  EXPECT_TRUE(all_close(o2, o1, {1e-12, 1e-12}, "out"));
  EXPECT_TRUE(all_close(l2, l1, {1e-12, 1e-12}, "lse"));
}

}  // namespace
}  // namespace kestrel::ops
