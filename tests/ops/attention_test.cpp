// Causal GQA attention over packed sequences: CPU kernel vs the double
// reference (forward and backward), the reference backward vs finite
// differences, NaN/Inf propagation, sequence isolation, thread-count
// independence and argument checks; the same for shared prefixes (prefix_of),
// plus shared vs duplicated-prefix equivalence.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>

#include "common/testing.h"
#include "isa_harness.h"
#include "core/parallel_for.h"
#include "core/rng.h"
#include "ops/attention.h"
#include "ops/ref/attention_ref.h"

namespace kestrel::ops {
namespace {

using testing::to_double;

std::vector<double> randn(size_t n, uint64_t stream, double scale = 1.0) {
  Philox rng{0x5eed, stream};
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * rng.normal(i);
  return v;
}

// A tensor of dtype dt holding v (rounded to dt).
Tensor make(const std::vector<double>& v, Shape s, DType dt) {
  Tensor t = Tensor::empty(std::move(s), dt, MemCategory::Other);
  for (size_t i = 0; i < v.size(); ++i) t.set(int64_t(i), float(v[i]));
  return t;
}

struct Case {
  std::vector<int32_t> lens;
  int64_t n_heads, n_kv_heads, head_dim;
  int64_t v_head_dim = 0;  // 0 = head_dim
  std::string name() const {
    std::string s = "lens";
    for (auto l : lens) s += "_" + std::to_string(l);
    s += " H" + std::to_string(n_heads) + " KV" + std::to_string(n_kv_heads) + " d" + std::to_string(head_dim);
    return v_head_dim ? s + " dv" + std::to_string(v_head_dim) : s;
  }
};

std::vector<int32_t> cu_of(const std::vector<int32_t>& lens) {
  std::vector<int32_t> cu{0};
  for (auto l : lens) cu.push_back(cu.back() + l);
  return cu;
}

// Inputs of one problem, already rounded to the dtype, plus the tensors.
struct Problem {
  AttentionShape shape;
  std::vector<int32_t> cu;
  int64_t T;
  Tensor q, k, v, cu_t;
  std::vector<double> qd, kd, vd;
  std::vector<int32_t> pre;  // prefix_of; empty = none
  Tensor pre_t;
  const Tensor* pre_ptr() const { return pre.empty() ? nullptr : &pre_t; }
  const int32_t* pre_data() const { return pre.empty() ? nullptr : pre.data(); }
  ref::AttnRefShape ref_shape() const {
    return {shape.n_heads, shape.n_kv_heads, shape.head_dim, shape.scale, shape.v_head_dim};
  }
  int64_t n_seqs() const { return int64_t(cu.size()) - 1; }
  Shape out_shape() const { return {T, shape.n_heads * shape.value_dim()}; }
  size_t out_numel() const { return size_t(T * shape.n_heads * shape.value_dim()); }
};

Problem make_problem(const Case& c, DType dt, uint64_t seed, const std::vector<int32_t>& prefix_of = {}) {
  Problem p;
  p.pre = prefix_of;
  if (!p.pre.empty()) p.pre_t = Tensor::from_ints(p.pre, {int64_t(p.pre.size())});
  p.shape = {c.n_heads, c.n_kv_heads, c.head_dim, 0.f, c.v_head_dim};
  p.cu = cu_of(c.lens);
  p.T = p.cu.back();
  const int64_t qd = c.n_heads * c.head_dim, kd = c.n_kv_heads * c.head_dim, vd = c.n_kv_heads * p.shape.value_dim();
  p.q = make(randn(p.T * qd, seed * 8 + 0), {p.T, qd}, dt);
  p.k = make(randn(p.T * kd, seed * 8 + 1), {p.T, kd}, dt);
  p.v = make(randn(p.T * vd, seed * 8 + 2), {p.T, vd}, dt);
  p.cu_t = Tensor::from_ints(p.cu, {int64_t(p.cu.size())});
  p.qd = to_double(p.q);
  p.kd = to_double(p.k);
  p.vd = to_double(p.v);
  return p;
}

struct FwdOut { Tensor out, lse; };
FwdOut run_fwd(const Problem& p) {
  FwdOut r{Tensor::empty(p.out_shape(), p.q.dtype()), Tensor::empty({p.shape.n_heads, p.T}, DType::F32)};
  attention_fwd(p.q, p.k, p.v, p.cu_t, p.shape, r.out, r.lse, p.pre_ptr());
  return r;
}

struct Grads { Tensor dq, dk, dv; };
Grads run_bwd(const Problem& p, const FwdOut& f, const Tensor& dout) {
  Grads g{Tensor::empty(p.q.shape(), p.q.dtype()), Tensor::empty(p.k.shape(), p.k.dtype()),
          Tensor::empty(p.v.shape(), p.v.dtype())};
  attention_bwd(p.q, p.k, p.v, f.out, f.lse, dout, p.cu_t, p.shape, g.dq, g.dk, g.dv, p.pre_ptr());
  return g;
}

// Block edges of the kernel are 64 rows: lengths straddle them; length 1 and
// GQA ratios 1, 2 and n_heads; head_dim 64, 24 (not a power of two) and 80.
const std::vector<Case> kCases = {
    {{5, 1, 70, 130}, 4, 4, 64},
    {{64, 1, 65, 3}, 4, 2, 64},
    {{129, 1, 17}, 4, 1, 24},
    {{1, 1, 40}, 2, 1, 80},
};

class AttentionCases : public testing::IsaParamTest<DType> {};

TEST_P(AttentionCases, ForwardMatchesReference) {
  const DType dt = param();
  for (Device dev : testing::available_devices()) {
    ASSERT_EQ(dev, Device::CPU);
    for (size_t ci = 0; ci < kCases.size(); ++ci) {
      const Case& c = kCases[ci];
      const Problem p = make_problem(c, dt, ci);
      const FwdOut f = run_fwd(p);
      std::vector<double> out(p.qd.size()), lse(p.shape.n_heads * p.T);
      ref::attention_fwd_ref(p.qd.data(), p.kd.data(), p.vd.data(), p.cu.data(), p.n_seqs(), p.ref_shape(),
                             out.data(), lse.data());
      EXPECT_TRUE(testing::all_close(to_double(f.out), out, testing::tolerance_for(dt), c.name() + " out"));
      EXPECT_TRUE(testing::all_close(to_double(f.lse), lse, testing::tolerance_for(DType::F32), c.name() + " lse"));
    }
  }
}

TEST_P(AttentionCases, BackwardMatchesReference) {
  const DType dt = param();
  for (size_t ci = 0; ci < kCases.size(); ++ci) {
    const Case& c = kCases[ci];
    const Problem p = make_problem(c, dt, 100 + ci);
    const Tensor dout = make(randn(p.qd.size(), 1000 + ci), p.q.shape(), dt);
    const FwdOut f = run_fwd(p);
    const Grads g = run_bwd(p, f, dout);
    const auto dod = to_double(dout);
    std::vector<double> dq(p.qd.size()), dk(p.kd.size()), dv(p.vd.size());
    ref::attention_bwd_ref(p.qd.data(), p.kd.data(), p.vd.data(), dod.data(), p.cu.data(), p.n_seqs(), p.ref_shape(),
                           dq.data(), dk.data(), dv.data());
    const auto tol = testing::tolerance_for(dt);
    EXPECT_TRUE(testing::all_close(to_double(g.dq), dq, tol, c.name() + " dq"));
    EXPECT_TRUE(testing::all_close(to_double(g.dk), dk, tol, c.name() + " dk"));
    EXPECT_TRUE(testing::all_close(to_double(g.dv), dv, tol, c.name() + " dv"));
  }
}

// NaN in q and k, +Inf in v: the kernel's NaN/Inf land where the reference's do,
// forward and (NaN in q) backward.
TEST_P(AttentionCases, NanInfPropagation) {
  const DType dt = param();
  const Case c{{20, 70}, 4, 2, 24};
  Problem p = make_problem(c, dt, 7);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const int64_t d = c.head_dim, ldq = c.n_heads * d, ldk = c.n_kv_heads * d;
  p.q.set((20 + 5) * ldq + 1 * d + 3, nan);   // seq 2, row 5, head 1
  p.k.set(3 * ldk + 0 * d + 7, nan);          // seq 1, row 3, kv head 0
  p.v.set((20 + 40) * ldk + 1 * d + 2, inf);  // seq 2, row 40, kv head 1
  p.qd = to_double(p.q);
  p.kd = to_double(p.k);
  p.vd = to_double(p.v);
  const FwdOut f = run_fwd(p);
  std::vector<double> out(p.qd.size()), lse(c.n_heads * p.T);
  ref::attention_fwd_ref(p.qd.data(), p.kd.data(), p.vd.data(), p.cu.data(), p.n_seqs(), p.ref_shape(), out.data(),
                         lse.data());
  const auto got = to_double(f.out);
  EXPECT_TRUE(std::isnan(got[(20 + 5) * ldq + 1 * d]));
  EXPECT_TRUE(std::isinf(got[(20 + 50) * ldq + 2 * d + 2]));
  EXPECT_TRUE(testing::all_close(got, out, testing::tolerance_for(dt), "out"));
  EXPECT_TRUE(testing::all_close(to_double(f.lse), lse, testing::tolerance_for(DType::F32), "lse"));

  // Backward with only the NaN in q: dq row, and dk/dv rows up to it, go NaN.
  Problem pb = make_problem(c, dt, 8);
  pb.q.set((20 + 5) * ldq + 1 * d + 3, nan);
  pb.qd = to_double(pb.q);
  const Tensor dout = make(randn(pb.qd.size(), 77), pb.q.shape(), dt);
  const Grads g = run_bwd(pb, run_fwd(pb), dout);
  const auto dod = to_double(dout);
  std::vector<double> dq(pb.qd.size()), dk(pb.kd.size()), dv(pb.vd.size());
  ref::attention_bwd_ref(pb.qd.data(), pb.kd.data(), pb.vd.data(), dod.data(), pb.cu.data(), pb.n_seqs(),
                         pb.ref_shape(), dq.data(), dk.data(), dv.data());
  const auto tol = testing::tolerance_for(dt);
  EXPECT_TRUE(std::isnan(to_double(g.dk)[(20 + 2) * ldk]));
  EXPECT_TRUE(testing::all_close(to_double(g.dq), dq, tol, "dq"));
  EXPECT_TRUE(testing::all_close(to_double(g.dk), dk, tol, "dk"));
  EXPECT_TRUE(testing::all_close(to_double(g.dv), dv, tol, "dv"));
}

// Shared prefixes: several continuations per prefix, plain sequences in
// between, prefixes and continuations shorter than, equal to and crossing the
// kernel's 64-row blocks, GQA ratios 2, 4 and 1, an empty prefix and an empty
// continuation.
struct PrefixCase {
  Case c;
  std::vector<int32_t> prefix_of;
};
const std::vector<PrefixCase> kPrefixCases = {
    {{{48, 40, 70, 1, 65, 30, 100, 64}, 4, 2, 32}, {-1, 0, 0, -1, 0, -1, 5, 5}},
    {{{70, 3, 130, 17}, 4, 1, 24}, {-1, 0, 0, 0}},
    {{{0, 5, 17, 9, 10, 0}, 2, 2, 16}, {-1, 0, 0, -1, -1, 4}},
};

TEST_P(AttentionCases, PrefixMatchesReference) {
  const DType dt = param();
  const auto tol = testing::tolerance_for(dt);
  for (size_t ci = 0; ci < kPrefixCases.size(); ++ci) {
    const auto& [c, pre] = kPrefixCases[ci];
    const Problem p = make_problem(c, dt, 200 + ci, pre);
    const Tensor dout = make(randn(p.qd.size(), 2000 + ci), p.q.shape(), dt);
    const FwdOut f = run_fwd(p);
    const Grads g = run_bwd(p, f, dout);
    std::vector<double> out(p.qd.size()), lse(p.shape.n_heads * p.T);
    ref::attention_fwd_ref(p.qd.data(), p.kd.data(), p.vd.data(), p.cu.data(), p.n_seqs(), p.ref_shape(), out.data(),
                           lse.data(), p.pre_data());
    const std::string name = c.name() + " prefixed";
    EXPECT_TRUE(testing::all_close(to_double(f.out), out, tol, name + " out"));
    EXPECT_TRUE(testing::all_close(to_double(f.lse), lse, testing::tolerance_for(DType::F32), name + " lse"));
    const auto dod = to_double(dout);
    std::vector<double> dq(p.qd.size()), dk(p.kd.size()), dv(p.vd.size());
    ref::attention_bwd_ref(p.qd.data(), p.kd.data(), p.vd.data(), dod.data(), p.cu.data(), p.n_seqs(), p.ref_shape(),
                           dq.data(), dk.data(), dv.data(), p.pre_data());
    EXPECT_TRUE(testing::all_close(to_double(g.dq), dq, tol, name + " dq"));
    EXPECT_TRUE(testing::all_close(to_double(g.dk), dk, tol, name + " dk"));
    EXPECT_TRUE(testing::all_close(to_double(g.dv), dv, tol, name + " dv"));
  }
}

// A shared layout (prefix once, continuations with prefix_of) computes what
// the duplicated layout (each continuation with its own copy of the prefix in
// front) does: continuation rows equal the copies' tail rows, the prefix's
// own rows equal any copy's head rows, and the prefix's dk/dv equal the sum
// over the copies (with dout of the prefix rows in all copies but the first
// zeroed, so the prefix's own queries count once, as in the shared layout).
TEST_P(AttentionCases, PrefixEqualsDuplicatedPrefix) {
  const DType dt = param();
  const int64_t H = 4, KV = 2, d = 32, P = 50;
  const std::vector<int32_t> branch = {30, 70, 14};
  // Shared: [plain 20 | prefix P | branches...]; duplicated: [plain 20 | P+b for each b].
  std::vector<int32_t> lens_s = {20, int32_t(P)}, pre_s = {-1, -1}, lens_d = {20};
  for (int32_t b : branch) {
    lens_s.push_back(b);
    pre_s.push_back(1);
    lens_d.push_back(int32_t(P) + b);
  }
  const Problem ps = make_problem({lens_s, H, KV, d}, dt, 300, pre_s);
  Problem pd = make_problem({lens_d, H, KV, d}, dt, 301);
  const Tensor dout_s = make(randn(ps.qd.size(), 302), ps.q.shape(), dt);
  Tensor dout_d = Tensor::empty(pd.q.shape(), dt);
  // Row maps: duplicated row -> shared row.
  std::vector<int64_t> src(pd.T);
  for (int64_t r = 0; r < 20; ++r) src[r] = r;
  for (int64_t b = 0, at = 20, bs = 20 + P; b < int64_t(branch.size()); bs += branch[b], ++b)
    for (int64_t r = 0; r < P + branch[b]; ++r, ++at) src[at] = r < P ? 20 + r : bs + (r - P);
  auto copy_rows = [&](const Tensor& from, Tensor& to) {
    const int64_t w = from.size(1);
    for (int64_t r = 0; r < pd.T; ++r)
      for (int64_t i = 0; i < w; ++i) to.set(r * w + i, from.get(src[r] * w + i));
  };
  copy_rows(ps.q, pd.q);
  copy_rows(ps.k, pd.k);
  copy_rows(ps.v, pd.v);
  copy_rows(dout_s, dout_d);
  // The prefix's own queries count once: only the first copy keeps their dout.
  for (int64_t b = 1, at = 20 + P + branch[0]; b < int64_t(branch.size()); at += P + branch[b], ++b)
    for (int64_t i = at * pd.q.size(1); i < (at + P) * pd.q.size(1); ++i) dout_d.set(i, 0.f);
  const FwdOut fs = run_fwd(ps), fd = run_fwd(pd);
  const Grads gs = run_bwd(ps, fs, dout_s), gd = run_bwd(pd, fd, dout_d);
  // Expected shared-layout values from the duplicated run: rows mapped back
  // (for the prefix rows any copy's forward, e.g. the last), dk/dv summed.
  auto gather = [&](const Tensor& t, bool sum) {
    const int64_t w = t.size(1);
    std::vector<double> e(size_t(ps.T * w), 0.0);
    const auto x = to_double(t);
    for (int64_t r = 0; r < pd.T; ++r)
      for (int64_t i = 0; i < w; ++i) {
        double& o = e[size_t(src[r] * w + i)];
        o = sum ? o + x[size_t(r * w + i)] : x[size_t(r * w + i)];
      }
    return e;
  };
  const auto tol = testing::tolerance_for(dt);
  EXPECT_TRUE(testing::all_close(to_double(fs.out), gather(fd.out, false), tol, "out"));
  EXPECT_TRUE(testing::all_close(to_double(gs.dk), gather(gd.dk, true), tol, "dk"));
  EXPECT_TRUE(testing::all_close(to_double(gs.dv), gather(gd.dv, true), tol, "dv"));
  // dq of the prefix rows: from the first copy (the others' are 0).
  EXPECT_TRUE(testing::all_close(to_double(gs.dq), gather(gd.dq, true), tol, "dq"));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t r = 0; r < pd.T; ++r)
      EXPECT_NEAR(fs.lse.get(h * ps.T + src[r]), fd.lse.get(h * pd.T + r), 1e-5) << "lse h" << h << " row " << r;
}

// Value heads of another width than the query/key heads (MLA's decompressed
// attention: head_dim = qk_nope + qk_rope, v_head_dim = v): MHA and GQA,
// narrower and wider values, widths off the vector width, with and without
// shared prefixes; forward and backward against the reference.
const std::vector<PrefixCase> kValueDimCases = {
    {{{5, 1, 70, 130}, 4, 4, 48, 32}, {}},
    {{{64, 1, 65, 3}, 4, 2, 24, 40}, {}},
    {{{70, 9, 66}, 2, 2, 192, 128}, {}},  // DeepSeek-V2/V3: 128 nope + 64 rope, values of 128
    {{{48, 40, 70, 1, 65}, 4, 2, 40, 24}, {-1, 0, 0, -1, 3}},
    {{{70, 3, 130, 0}, 4, 1, 20, 36}, {-1, 0, 0, 0}},
};

TEST_P(AttentionCases, ValueHeadDimMatchesReference) {
  const DType dt = param();
  const auto tol = testing::tolerance_for(dt);
  for (size_t ci = 0; ci < kValueDimCases.size(); ++ci) {
    const auto& [c, pre] = kValueDimCases[ci];
    const Problem p = make_problem(c, dt, 400 + ci, pre);
    const Tensor dout = make(randn(p.out_numel(), 4000 + ci), p.out_shape(), dt);
    const FwdOut f = run_fwd(p);
    const Grads g = run_bwd(p, f, dout);
    ASSERT_EQ(f.out.shape(), p.out_shape());
    std::vector<double> out(p.out_numel()), lse(p.shape.n_heads * p.T);
    ref::attention_fwd_ref(p.qd.data(), p.kd.data(), p.vd.data(), p.cu.data(), p.n_seqs(), p.ref_shape(), out.data(),
                           lse.data(), p.pre_data());
    const std::string name = c.name() + (pre.empty() ? "" : " prefixed");
    EXPECT_TRUE(testing::all_close(to_double(f.out), out, tol, name + " out"));
    EXPECT_TRUE(testing::all_close(to_double(f.lse), lse, testing::tolerance_for(DType::F32), name + " lse"));
    const auto dod = to_double(dout);
    std::vector<double> dq(p.qd.size()), dk(p.kd.size()), dv(p.vd.size());
    ref::attention_bwd_ref(p.qd.data(), p.kd.data(), p.vd.data(), dod.data(), p.cu.data(), p.n_seqs(), p.ref_shape(),
                           dq.data(), dk.data(), dv.data(), p.pre_data());
    EXPECT_TRUE(testing::all_close(to_double(g.dq), dq, tol, name + " dq"));
    EXPECT_TRUE(testing::all_close(to_double(g.dk), dk, tol, name + " dk"));
    EXPECT_TRUE(testing::all_close(to_double(g.dv), dv, tol, name + " dv"));
  }
}

// v_head_dim == head_dim spelled out is the default (0) bit for bit.
TEST_P(AttentionCases, ExplicitValueHeadDimEqualsDefault) {
  const DType dt = param();
  const Case c{{70, 33}, 4, 2, 24};
  Problem p = make_problem(c, dt, 450);
  const Tensor dout = make(randn(p.out_numel(), 451), p.out_shape(), dt);
  const FwdOut f0 = run_fwd(p);
  const Grads g0 = run_bwd(p, f0, dout);
  p.shape.v_head_dim = c.head_dim;
  const FwdOut f1 = run_fwd(p);
  const Grads g1 = run_bwd(p, f1, dout);
  EXPECT_EQ(f0.out.to_float_vector(), f1.out.to_float_vector());
  EXPECT_EQ(f0.lse.to_float_vector(), f1.lse.to_float_vector());
  EXPECT_EQ(g0.dq.to_float_vector(), g1.dq.to_float_vector());
  EXPECT_EQ(g0.dk.to_float_vector(), g1.dk.to_float_vector());
  EXPECT_EQ(g0.dv.to_float_vector(), g1.dv.to_float_vector());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AttentionCases,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16),
                                            ::testing::ValuesIn(testing::kernel_isas())),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_" +
                                  isa_name(std::get<1>(info.param));
                         });

// The reference backward is the gradient of the reference forward: central
// differences of the random linear functional sum(W * out) in double.
TEST(AttentionReference, BackwardMatchesFiniteDifferences) {
  const std::vector<int32_t> cu = cu_of({3, 1, 4});
  const ref::AttnRefShape s{4, 2, 6, 0.0};
  const int64_t T = cu.back(), nq = T * 4 * 6, nk = T * 2 * 6;
  const auto q = randn(nq, 1), k = randn(nk, 2), v = randn(nk, 3), W = randn(nq, 4);
  auto loss = [&](const std::vector<double>& qq, const std::vector<double>& kk, const std::vector<double>& vv) {
    std::vector<double> out(nq);
    ref::attention_fwd_ref(qq.data(), kk.data(), vv.data(), cu.data(), 3, s, out.data(), static_cast<double*>(nullptr));
    return std::inner_product(out.begin(), out.end(), W.begin(), 0.0);
  };
  std::vector<double> dq(nq), dk(nk), dv(nk);
  ref::attention_bwd_ref(q.data(), k.data(), v.data(), W.data(), cu.data(), 3, s, dq.data(), dk.data(), dv.data());
  const testing::Tolerance tol{1e-7, 1e-6};
  EXPECT_TRUE(testing::all_close(dq, testing::finite_difference([&](const auto& x) { return loss(x, k, v); }, q), tol, "dq"));
  EXPECT_TRUE(testing::all_close(dk, testing::finite_difference([&](const auto& x) { return loss(q, x, v); }, k), tol, "dk"));
  EXPECT_TRUE(testing::all_close(dv, testing::finite_difference([&](const auto& x) { return loss(q, k, x); }, v), tol, "dv"));
}

// The reference backward with prefix_of is the gradient of its forward: a
// prefix with two continuations and a plain sequence, central differences.
TEST(AttentionReference, PrefixBackwardMatchesFiniteDifferences) {
  const std::vector<int32_t> cu = cu_of({3, 2, 1, 2}), pre = {-1, 0, -1, 0};
  const ref::AttnRefShape s{4, 2, 6, 0.0};
  const int64_t T = cu.back(), nq = T * 4 * 6, nk = T * 2 * 6;
  const auto q = randn(nq, 11), k = randn(nk, 12), v = randn(nk, 13), W = randn(nq, 14);
  auto loss = [&](const std::vector<double>& qq, const std::vector<double>& kk, const std::vector<double>& vv) {
    std::vector<double> out(nq);
    ref::attention_fwd_ref(qq.data(), kk.data(), vv.data(), cu.data(), 4, s, out.data(), static_cast<double*>(nullptr),
                           pre.data());
    return std::inner_product(out.begin(), out.end(), W.begin(), 0.0);
  };
  std::vector<double> dq(nq), dk(nk), dv(nk);
  ref::attention_bwd_ref(q.data(), k.data(), v.data(), W.data(), cu.data(), 4, s, dq.data(), dk.data(), dv.data(),
                         pre.data());
  const testing::Tolerance tol{1e-7, 1e-6};
  EXPECT_TRUE(testing::all_close(dq, testing::finite_difference([&](const auto& x) { return loss(x, k, v); }, q), tol, "dq"));
  EXPECT_TRUE(testing::all_close(dk, testing::finite_difference([&](const auto& x) { return loss(q, x, v); }, k), tol, "dk"));
  EXPECT_TRUE(testing::all_close(dv, testing::finite_difference([&](const auto& x) { return loss(q, k, x); }, v), tol, "dv"));
}

// The reference backward with v_head_dim != head_dim (GQA, a prefix) is the
// gradient of its forward.
TEST(AttentionReference, ValueHeadDimBackwardMatchesFiniteDifferences) {
  const std::vector<int32_t> cu = cu_of({3, 2, 1}), pre = {-1, 0, -1};
  const ref::AttnRefShape s{4, 2, 6, 0.0, 4};
  const int64_t T = cu.back(), nq = T * 4 * 6, nk = T * 2 * 6, nv = T * 2 * 4, no = T * 4 * 4;
  const auto q = randn(nq, 21), k = randn(nk, 22), v = randn(nv, 23), W = randn(no, 24);
  auto loss = [&](const std::vector<double>& qq, const std::vector<double>& kk, const std::vector<double>& vv) {
    std::vector<double> out(no);
    ref::attention_fwd_ref(qq.data(), kk.data(), vv.data(), cu.data(), 3, s, out.data(), static_cast<double*>(nullptr),
                           pre.data());
    return std::inner_product(out.begin(), out.end(), W.begin(), 0.0);
  };
  std::vector<double> dq(nq), dk(nk), dv(nv);
  ref::attention_bwd_ref(q.data(), k.data(), v.data(), W.data(), cu.data(), 3, s, dq.data(), dk.data(), dv.data(),
                         pre.data());
  const testing::Tolerance tol{1e-7, 1e-6};
  EXPECT_TRUE(testing::all_close(dq, testing::finite_difference([&](const auto& x) { return loss(x, k, v); }, q), tol, "dq"));
  EXPECT_TRUE(testing::all_close(dk, testing::finite_difference([&](const auto& x) { return loss(q, x, v); }, k), tol, "dk"));
  EXPECT_TRUE(testing::all_close(dv, testing::finite_difference([&](const auto& x) { return loss(q, k, x); }, v), tol, "dv"));
}

KS_ISA_SUITE(Attention);

// Tokens of one sequence never see another: overwrite sequence 2 (with NaN,
// the strongest perturbation) and sequences 1 and 3 are bit-identical.
TEST_P(Attention, SequencesAreIsolated) {
  const Case c{{70, 50, 9}, 4, 2, 64};
  Problem p = make_problem(c, DType::F32, 11);
  Tensor dout = make(randn(p.qd.size(), 12), p.q.shape(), DType::F32);
  const FwdOut f1 = run_fwd(p);
  const Grads g1 = run_bwd(p, f1, dout);
  const int64_t lq = p.q.size(1), lk = p.k.size(1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t r = 70; r < 120; ++r) {
    for (int64_t i = 0; i < lq; ++i) { p.q.set(r * lq + i, nan); dout.set(r * lq + i, nan); }
    for (int64_t i = 0; i < lk; ++i) { p.k.set(r * lk + i, nan); p.v.set(r * lk + i, 1e30f); }
  }
  const FwdOut f2 = run_fwd(p);
  const Grads g2 = run_bwd(p, f2, dout);
  auto same_rows = [](const Tensor& a, const Tensor& b, int64_t r0, int64_t r1, const char* what) {
    const int64_t w = a.size(1);
    for (int64_t i = r0 * w; i < r1 * w; ++i)
      if (a.get(i) != b.get(i)) return ::testing::AssertionFailure() << what << " differs at flat " << i;
    return ::testing::AssertionSuccess();
  };
  for (auto [r0, r1] : {std::pair<int64_t, int64_t>{0, 70}, {120, 129}}) {
    EXPECT_TRUE(same_rows(f1.out, f2.out, r0, r1, "out"));
    EXPECT_TRUE(same_rows(g1.dq, g2.dq, r0, r1, "dq"));
    EXPECT_TRUE(same_rows(g1.dk, g2.dk, r0, r1, "dk"));
    EXPECT_TRUE(same_rows(g1.dv, g2.dv, r0, r1, "dv"));
  }
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t t : {0, 69, 120, 128}) EXPECT_EQ(f1.lse.get(h * 129 + t), f2.lse.get(h * 129 + t));
}

// Work is split per task, not per thread: 1 and 2 threads agree bit for bit.
void expect_thread_count_independent(const Problem& p, const Tensor& dout) {
  const int saved = num_threads();
  set_num_threads(1);
  const FwdOut f1 = run_fwd(p);
  const Grads g1 = run_bwd(p, f1, dout);
  set_num_threads(2);
  const FwdOut f2 = run_fwd(p);
  const Grads g2 = run_bwd(p, f2, dout);
  set_num_threads(saved);
  EXPECT_EQ(f1.out.to_float_vector(), f2.out.to_float_vector());
  EXPECT_EQ(f1.lse.to_float_vector(), f2.lse.to_float_vector());
  EXPECT_EQ(g1.dq.to_float_vector(), g2.dq.to_float_vector());
  EXPECT_EQ(g1.dk.to_float_vector(), g2.dk.to_float_vector());
  EXPECT_EQ(g1.dv.to_float_vector(), g2.dv.to_float_vector());
}

TEST_P(Attention, ThreadCountIndependent) {
  const Case c{{100, 37, 64}, 4, 2, 64};
  const Problem p = make_problem(c, DType::BF16, 21);
  expect_thread_count_independent(p, make(randn(p.qd.size(), 22), p.q.shape(), DType::BF16));
}

// With prefix_of, dK/dV of a prefix sum over several continuations: still
// bit-identical at 1 and 2 threads.
TEST_P(Attention, PrefixThreadCountIndependent) {
  const Case c{{60, 37, 80, 5, 20, 44}, 4, 2, 32};
  const Problem p = make_problem(c, DType::F32, 23, {-1, 0, 0, -1, 0, 3});
  expect_thread_count_independent(p, make(randn(p.qd.size(), 24), p.q.shape(), DType::F32));
}

// v_head_dim != head_dim with a prefix: still bit-identical at 1 and 2 threads.
TEST_P(Attention, ValueHeadDimThreadCountIndependent) {
  Case c{{60, 37, 80, 5}, 4, 2, 40};
  c.v_head_dim = 24;
  const Problem p = make_problem(c, DType::BF16, 25, {-1, 0, 0, -1});
  expect_thread_count_independent(p, make(randn(p.out_numel(), 26), p.out_shape(), DType::BF16));
}

TEST_P(Attention, RejectsBadArguments) {
  const Case c{{5, 3}, 4, 2, 8};
  const Problem p = make_problem(c, DType::F32, 31);
  FwdOut f = run_fwd(p);
  auto expect_error = [](auto&& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  AttentionShape bad = p.shape;
  bad.n_kv_heads = 3;
  expect_error([&] { attention_fwd(p.q, p.k, p.v, p.cu_t, bad, f.out, f.lse); }, "n_heads divisible by n_kv_heads");
  const Tensor cu_bad = Tensor::from_ints({0, 5, 7}, {3});
  expect_error([&] { attention_fwd(p.q, p.k, p.v, cu_bad, p.shape, f.out, f.lse); }, "end at T=8");
  const Tensor cu_dec = Tensor::from_ints({0, 6, 5, 8}, {4});
  expect_error([&] { attention_fwd(p.q, p.k, p.v, cu_dec, p.shape, f.out, f.lse); }, "non-decreasing");
  const Tensor k_bf = p.k.to(DType::BF16);
  expect_error([&] { attention_fwd(p.q, k_bf, p.v, p.cu_t, p.shape, f.out, f.lse); }, "k must be f32[8, 16]");
  Tensor lse_bad = Tensor::empty({8, 4}, DType::F32);
  expect_error([&] { attention_fwd(p.q, p.k, p.v, p.cu_t, p.shape, f.out, lse_bad); }, "lse must be f32 [n_heads, T]");
  Tensor dq = Tensor::empty(p.q.shape(), DType::F32), dk = Tensor::empty(p.k.shape(), DType::F32);
  Tensor dv_bad = Tensor::empty(p.q.shape(), DType::F32);
  expect_error([&] { attention_bwd(p.q, p.k, p.v, f.out, f.lse, f.out, p.cu_t, p.shape, dq, dk, dv_bad); },
               "dv must be f32[8, 16]");
  // Values of width 4 per kv head: v and out must follow v_head_dim, not head_dim.
  AttentionShape vs = p.shape;
  vs.v_head_dim = 4;
  Tensor v4 = Tensor::zeros({8, 2 * 4}, DType::F32), out4 = Tensor::empty({8, 4 * 4}, DType::F32);
  expect_error([&] { attention_fwd(p.q, p.k, p.v, p.cu_t, vs, out4, f.lse); }, "v must be f32[8, 8]");
  expect_error([&] { attention_fwd(p.q, p.k, v4, p.cu_t, vs, f.out, f.lse); }, "out must be f32[8, 16]");
  EXPECT_NO_THROW(attention_fwd(p.q, p.k, v4, p.cu_t, vs, out4, f.lse));
  Tensor dv4 = Tensor::empty(v4.shape(), DType::F32);
  expect_error([&] { attention_bwd(p.q, p.k, v4, out4, f.lse, f.out, p.cu_t, vs, dq, dk, dv4); },
               "dout must be f32[8, 16]");
  vs.v_head_dim = -1;
  expect_error([&] { attention_fwd(p.q, p.k, v4, p.cu_t, vs, out4, f.lse); }, "v_head_dim=-1");
}

TEST_P(Attention, RejectsBadPrefixOf) {
  const Case c{{5, 3, 4}, 4, 2, 8};
  const Problem p = make_problem(c, DType::F32, 32);
  FwdOut f = run_fwd(p);
  auto expect_error = [&](const Tensor& pre, const std::string& needle, bool bwd = false) {
    try {
      if (bwd) {
        Tensor dq = Tensor::empty(p.q.shape(), DType::F32), dk = Tensor::empty(p.k.shape(), DType::F32),
               dv = Tensor::empty(p.k.shape(), DType::F32);
        attention_bwd(p.q, p.k, p.v, f.out, f.lse, f.out, p.cu_t, p.shape, dq, dk, dv, &pre);
      } else {
        attention_fwd(p.q, p.k, p.v, p.cu_t, p.shape, f.out, f.lse, &pre);
      }
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(Tensor::from_ints({-1, 0}, {2}), "prefix_of must be i32 [n_seqs] = [3]");
  expect_error(Tensor::from_ints({-1, 0, 0}, {3}).to(DType::F32), "prefix_of must be i32");
  expect_error(Tensor::from_ints({-1, 1, -1}, {3}), "prefix_of[1] = 1: must be -1 (no prefix) or the index of an earlier");
  expect_error(Tensor::from_ints({-1, 2, -1}, {3}), "prefix_of[1] = 2");
  expect_error(Tensor::from_ints({-1, -2, -1}, {3}), "prefix_of[1] = -2");
  expect_error(Tensor::from_ints({-1, 0, 1}, {3}), "only one level of prefix", /*bwd=*/true);
  expect_error(Tensor::from_ints({0, -1, -1}, {3}), "prefix_of[0] = 0", /*bwd=*/true);
  // Valid: several continuations of one prefix.
  const Tensor ok = Tensor::from_ints({-1, 0, 0}, {3});
  EXPECT_NO_THROW(attention_fwd(p.q, p.k, p.v, p.cu_t, p.shape, f.out, f.lse, &ok));
}

}  // namespace
}  // namespace kestrel::ops
