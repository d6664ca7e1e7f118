// RoPE: inv_freq, attention scaling and cos/sin against transformers'
// values (tests/golden/rope/rope_golden.json, written by
// make_rope_golden.py), the CPU kernel against the double reference, the
// reference backward against finite differences, and argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>

#include "common/testing.h"
#include "isa_harness.h"
#include "op_harness.h"
#include "core/rng.h"
#include "ops/ref/rope_ref.h"
#include "ops/rope.h"

namespace kestrel::ops {
namespace {

using testing::to_double;

std::vector<double> randn(size_t n, uint64_t stream) {
  Philox rng{0x40be, stream};
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = rng.normal(i);
  return v;
}

Tensor make(const std::vector<double>& v, Shape s, DType dt) {
  Tensor t = Tensor::empty(std::move(s), dt, MemCategory::Other);
  for (size_t i = 0; i < v.size(); ++i) t.set(int64_t(i), float(v[i]));
  return t;
}

nlohmann::json load_golden() {
  const std::string path = testing::source_path("tests/golden/rope/rope_golden.json");
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open " + path + " (regenerate with tests/golden/rope/make_rope_golden.py)");
  return nlohmann::json::parse(f);
}

RopeConfig config_from(const nlohmann::json& j) {
  RopeConfig c;
  c.head_dim = j.at("head_dim");
  c.theta = j.at("theta");
  c.scaling_type = j.at("scaling_type");
  c.factor = j.value("factor", c.factor);
  c.low_freq_factor = j.value("low_freq_factor", c.low_freq_factor);
  c.high_freq_factor = j.value("high_freq_factor", c.high_freq_factor);
  c.original_max_position = j.value("original_max_position", c.original_max_position);
  c.beta_fast = j.value("beta_fast", c.beta_fast);
  c.beta_slow = j.value("beta_slow", c.beta_slow);
  c.attention_factor = j.value("attention_factor", c.attention_factor);
  c.mscale = j.value("mscale", c.mscale);
  c.mscale_all_dim = j.value("mscale_all_dim", c.mscale_all_dim);
  c.truncate = j.value("truncate", c.truncate);
  return c;
}

int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::abs(int64_t(ia) - int64_t(ib));
}

// torch's float32 pow (Sleef, 1-ulp accurate) is not correctly rounded; libm's
// is. So inv_freq may sit one ulp from HF's for a few frequencies (about 1 in
// 40 here); everything after the pow replicates HF's float32 arithmetic.
TEST(RopeGolden, InvFreqAndScalingMatchTransformers) {
  const auto golden = load_golden();
  ASSERT_GE(golden.at("cases").size(), 4u);
  for (const auto& gc : golden.at("cases")) {
    const std::string name = gc.at("name");
    const RopeConfig cfg = config_from(gc.at("config"));
    double att = 0;
    const auto inv = rope_inv_freq(cfg, &att);
    const auto want = gc.at("inv_freq").get<std::vector<double>>();
    ASSERT_EQ(inv.size(), want.size()) << name;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_LE(std::abs(inv[i] - want[i]), 1e-6 * std::abs(want[i])) << name << " inv_freq[" << i << "]";
      EXPECT_LE(ulps(float(inv[i]), float(want[i])), 1) << name << " inv_freq[" << i << "]";
    }
    EXPECT_NEAR(att, gc.at("attention_scaling").get<double>(), 1e-12) << name;
  }
}

// cos/sin: where inv_freq agrees bit for bit with HF, to 1e-6 of the scale
// (cosf vs Sleef cos); where it is one ulp off, the angle p*inv_freq moves by
// up to p*inv_freq*2^-23 and cos/sin with it.
TEST(RopeGolden, TableMatchesTransformers) {
  const auto golden = load_golden();
  for (const auto& gc : golden.at("cases")) {
    const std::string name = gc.at("name");
    const RopeConfig cfg = config_from(gc.at("config"));
    const auto positions = gc.at("positions").get<std::vector<int64_t>>();
    const auto want_inv = gc.at("inv_freq").get<std::vector<double>>();
    const auto inv = rope_inv_freq(cfg, nullptr);
    const double att = gc.at("attention_scaling");
    const RopeTable t = make_rope_table(cfg, positions.back() + 1);
    const int64_t half = cfg.head_dim / 2;
    ASSERT_EQ(t.cos.shape(), (Shape{positions.back() + 1, half})) << name;
    for (size_t pi = 0; pi < positions.size(); ++pi) {
      const int64_t p = positions[pi];
      const auto wc = gc.at("cos")[pi].get<std::vector<double>>(), ws = gc.at("sin")[pi].get<std::vector<double>>();
      for (int64_t i = 0; i < half; ++i) {
        const bool exact = float(inv[i]) == float(want_inv[i]);
        const double tol = att * (1e-6 + (exact ? 0.0 : double(p) * want_inv[i] * 0x1p-22));
        EXPECT_NEAR(t.cos.get(p * half + i), wc[i], tol) << name << " cos at position " << p << ", freq " << i;
        EXPECT_NEAR(t.sin.get(p * half + i), ws[i], tol) << name << " sin at position " << p << ", freq " << i;
      }
    }
  }
}

// Packed sequences: positions restart per sequence.
std::vector<int32_t> packed_positions(const std::vector<int32_t>& lens) {
  std::vector<int32_t> pos;
  for (auto l : lens)
    for (int32_t i = 0; i < l; ++i) pos.push_back(i);
  return pos;
}

struct RopeCase { int64_t head_dim, n_heads; RopeConfig cfg; };

std::vector<RopeCase> rope_cases() {
  RopeConfig a;
  a.head_dim = 64;
  RopeConfig b;
  b.head_dim = 24;
  b.theta = 1e6;
  RopeConfig y;  // yarn: attention factor != 1 folded into the table
  y.head_dim = 32;
  y.scaling_type = "yarn";
  y.factor = 4;
  y.original_max_position = 64;
  return {{64, 3, a}, {24, 2, b}, {32, 4, y}};
}

// Runs the kernel (fwd or bwd) and the double reference on the same rounded input.
void check_against_reference(DType dt, bool inverse, Device dev = Device::CPU) {
  SCOPED_TRACE(testing::case_name(dev, dt));
  const auto pos = packed_positions({1, 17, 40, 5});
  const int64_t T = int64_t(pos.size());
  const Tensor pos_t = testing::make_ids(pos, dev);
  for (const auto& rc : rope_cases()) {
    const RopeTable table = rope_table_to(make_rope_table(rc.cfg, 64), dev);
    const int64_t D = rc.n_heads * rc.head_dim;
    Tensor x = testing::make_tensor(to_double(make(randn(T * D, rc.head_dim), {T, D}, dt)), {T, D}, dt, dev);
    std::vector<double> want = to_double(x);
    const auto cos = to_double(table.cos), sin = to_double(table.sin);
    ref::rope_ref(want.data(), T, pos.data(), cos.data(), sin.data(), rc.n_heads, rc.head_dim, inverse);
    if (inverse)
      rope_bwd(x, pos_t, table, rc.n_heads);
    else
      rope_fwd(x, pos_t, table, rc.n_heads);
    EXPECT_TRUE(testing::all_close(to_double(x), want, testing::tolerance_for(dt),
                                   rc.cfg.scaling_type + " d" + std::to_string(rc.head_dim)));
  }
}

class RopeDtypes : public testing::IsaParamTest<DType> {};

TEST_P(RopeDtypes, ForwardMatchesReference) {
  for (Device dev : testing::available_devices()) check_against_reference(param(), false, dev);
}

TEST_P(RopeDtypes, BackwardMatchesReference) {
  for (Device dev : testing::available_devices()) check_against_reference(param(), true, dev);
}

TEST_P(RopeDtypes, NanInfPropagation) {
  const DType dt = param();
  RopeConfig cfg;
  cfg.head_dim = 16;
  const RopeTable table = make_rope_table(cfg, 8);
  const std::vector<int32_t> pos{0, 3, 7, 1};
  Tensor x = make(randn(4 * 32, 9), {4, 32}, dt);
  x.set(1 * 32 + 16 + 2, std::numeric_limits<float>::quiet_NaN());  // token 1, head 1, first half
  x.set(0 * 32 + 8 + 1, std::numeric_limits<float>::infinity());     // token 0 (position 0), head 0, second half
  x.set(2 * 32 + 5, -std::numeric_limits<float>::infinity());        // token 2, head 0
  std::vector<double> want = to_double(x);
  const auto cos = to_double(table.cos), sin = to_double(table.sin);
  ref::rope_ref(want.data(), 4, pos.data(), cos.data(), sin.data(), 2, 16, false);
  rope_fwd(x, Tensor::from_ints(pos, {4}), table, 2);
  const auto got = to_double(x);
  EXPECT_TRUE(std::isnan(got[1 * 32 + 16 + 2 + 8]));  // the NaN's rotation partner
  EXPECT_TRUE(testing::all_close(got, want, testing::tolerance_for(dt), "nan/inf"));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RopeDtypes,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16),
                                            ::testing::ValuesIn(testing::kernel_isas())),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_" +
                                  isa_name(std::get<1>(info.param));
                         });

// rope_bwd is the gradient of rope_fwd: central differences of sum(W * rope(x)).
TEST(RopeReference, BackwardMatchesFiniteDifferences) {
  const std::vector<int32_t> pos{0, 5, 2};
  const int64_t H = 2, hd = 6, P = 8, half = hd / 2;
  const auto cos = randn(P * half, 1), sin = randn(P * half, 2);  // any table: the map is linear in x
  const auto x = randn(3 * H * hd, 3), W = randn(3 * H * hd, 4);
  auto loss = [&](const std::vector<double>& xx) {
    std::vector<double> y = xx;
    ref::rope_ref(y.data(), 3, pos.data(), cos.data(), sin.data(), H, hd, false);
    return std::inner_product(y.begin(), y.end(), W.begin(), 0.0);
  };
  std::vector<double> g = W;
  ref::rope_ref(g.data(), 3, pos.data(), cos.data(), sin.data(), H, hd, true);
  EXPECT_TRUE(testing::all_close(g, testing::finite_difference(loss, x), {1e-7, 1e-6}, "dx"));
}

// Partial and interleaved rotation (MLA): heads of W columns of which
// [rot_offset, rot_offset + rot) rotate, in HF's rotate_half layout or in
// DeepSeek's interleaved pairs. The columns outside the range keep their bits.
struct LayoutCase {
  int64_t n_heads, width, rot_offset, rot;
  bool interleaved;
  std::string name() const {
    return "H" + std::to_string(n_heads) + " W" + std::to_string(width) + " off" + std::to_string(rot_offset) +
           " rot" + std::to_string(rot) + (interleaved ? " interleaved" : " halves");
  }
};
const std::vector<LayoutCase> kLayoutCases = {
    {3, 64, 0, 64, true},     // a plain interleaved head
    {2, 24, 0, 24, true},     // interleaved, rotated width off the vector width
    {4, 48, 16, 32, false},   // MLA query heads [nope 16 | rope 32], halves
    {4, 48, 16, 32, true},    // the same, interleaved
    {2, 40, 8, 20, true},     // columns on both sides of the rotated range
    {2, 40, 6, 20, false},
    {1, 36, 0, 36, true},     // a single "head": MLA's k_pe row [T, rope]
    {16, 192, 128, 64, true}, // DeepSeek-V3: 128 nope + 64 rope
};

RopeTable layout_table(const LayoutCase& lc, int64_t positions) {
  RopeConfig cfg;
  cfg.head_dim = lc.rot;
  cfg.interleaved = lc.interleaved;
  cfg.theta = 1e4;
  return make_rope_table(cfg, positions);
}

class RopeLayouts : public testing::IsaParamTest<DType> {};

TEST_P(RopeLayouts, MatchReferenceForwardAndBackward) {
  const DType dt = param();
  const auto pos = packed_positions({1, 17, 40, 5});
  const int64_t T = int64_t(pos.size());
  const Tensor pos_t = Tensor::from_ints(pos, {T});
  for (const auto& lc : kLayoutCases)
    for (bool inverse : {false, true}) {
      const std::string name = lc.name() + (inverse ? " bwd" : " fwd");
      const RopeTable table = layout_table(lc, 64);
      ASSERT_EQ(table.interleaved, lc.interleaved) << "make_rope_table copies RopeConfig::interleaved";
      const int64_t D = lc.n_heads * lc.width;
      Tensor x = make(randn(T * D, 50 + lc.width), {T, D}, dt);
      const std::vector<double> x0 = to_double(x);
      std::vector<double> want = x0;
      const auto cos = to_double(table.cos), sin = to_double(table.sin);
      ref::rope_ref(want.data(), T, pos.data(), cos.data(), sin.data(), lc.n_heads, lc.rot, inverse, lc.width,
                    lc.rot_offset, lc.interleaved);
      if (inverse)
        rope_bwd(x, pos_t, table, lc.n_heads, lc.rot_offset);
      else
        rope_fwd(x, pos_t, table, lc.n_heads, lc.rot_offset);
      const auto got = to_double(x);
      EXPECT_TRUE(testing::all_close(got, want, testing::tolerance_for(dt), name));
      int64_t changed_outside = 0;
      for (int64_t i = 0; i < T * D; ++i) {
        const int64_t c = i % lc.width;
        if ((c < lc.rot_offset || c >= lc.rot_offset + lc.rot) && got[size_t(i)] != x0[size_t(i)]) ++changed_outside;
      }
      EXPECT_EQ(changed_outside, 0) << name << ": columns outside the rotated range changed";
    }
}

TEST_P(RopeLayouts, NanReachesOnlyItsPartner) {
  const DType dt = param();
  const LayoutCase lc{2, 20, 4, 12, true};
  const RopeTable table = layout_table(lc, 8);
  const std::vector<int32_t> pos{3, 5};
  Tensor x = make(randn(2 * 40, 71), {2, 40}, dt);
  x.set(20 + 4 + 6, std::numeric_limits<float>::quiet_NaN());  // token 0, head 1, pair 3's first
  rope_fwd(x, Tensor::from_ints(pos, {2}), table, 2, 4);
  for (int64_t i = 0; i < 80; ++i)
    EXPECT_EQ(std::isnan(x.get(i)), i == 30 || i == 31) << "flat " << i;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RopeLayouts,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16),
                                            ::testing::ValuesIn(testing::kernel_isas())),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_" +
                                  isa_name(std::get<1>(info.param));
                         });

// Lane-wise math: every layout gives the same bits at every ISA level.
TEST(RopeLayoutsIsa, SameBitsAtEveryLevel) {
  const auto isas = testing::kernel_isas();
  if (isas.size() < 2) GTEST_SKIP() << "one ISA level on this machine";
  const auto pos = packed_positions({7, 33});
  const int64_t T = int64_t(pos.size());
  const Tensor pos_t = Tensor::from_ints(pos, {T});
  for (DType dt : {DType::F32, DType::BF16})
    for (const auto& lc : kLayoutCases) {
      const RopeTable table = layout_table(lc, 64);
      const int64_t D = lc.n_heads * lc.width;
      std::vector<std::vector<float>> got;
      for (IsaLevel isa : isas) {
        testing::IsaScope scope(isa);
        Tensor x = make(randn(T * D, 80), {T, D}, dt), y = make(randn(T * D, 81), {T, D}, dt);
        rope_fwd(x, pos_t, table, lc.n_heads, lc.rot_offset);
        rope_bwd(y, pos_t, table, lc.n_heads, lc.rot_offset);
        auto v = x.to_float_vector(), w = y.to_float_vector();
        v.insert(v.end(), w.begin(), w.end());
        got.push_back(std::move(v));
      }
      for (size_t i = 1; i < got.size(); ++i)
        EXPECT_EQ(std::memcmp(got[0].data(), got[i].data(), got[0].size() * 4), 0)
            << lc.name() << " " << dtype_name(dt) << ": " << isa_name(isas[i]) << " differs from " << isa_name(isas[0]);
    }
}

// The reference backward of a partial, interleaved rotation is its gradient.
TEST(RopeReference, PartialInterleavedBackwardMatchesFiniteDifferences) {
  const std::vector<int32_t> pos{0, 5, 2};
  const int64_t H = 2, W = 10, off = 3, hd = 6, P = 8, half = hd / 2;
  const auto cos = randn(P * half, 11), sin = randn(P * half, 12);
  const auto x = randn(3 * H * W, 13), Wt = randn(3 * H * W, 14);
  for (bool interleaved : {false, true}) {
    auto loss = [&](const std::vector<double>& xx) {
      std::vector<double> y = xx;
      ref::rope_ref(y.data(), 3, pos.data(), cos.data(), sin.data(), H, hd, false, W, off, interleaved);
      return std::inner_product(y.begin(), y.end(), Wt.begin(), 0.0);
    };
    std::vector<double> g = Wt;
    ref::rope_ref(g.data(), 3, pos.data(), cos.data(), sin.data(), H, hd, true, W, off, interleaved);
    EXPECT_TRUE(testing::all_close(g, testing::finite_difference(loss, x), {1e-7, 1e-6},
                                   interleaved ? "dx interleaved" : "dx halves"));
  }
}

KS_ISA_SUITE(Rope);

// rope_bwd is the transpose of rope_fwd in every layout: <fwd(x), y> = <x, bwd(y)>.
TEST_P(Rope, LayoutBackwardIsTheTranspose) {
  const auto pos = packed_positions({9, 30});
  const int64_t T = int64_t(pos.size());
  const Tensor pos_t = Tensor::from_ints(pos, {T});
  for (const auto& lc : kLayoutCases) {
    const RopeTable table = layout_table(lc, 32);
    const int64_t D = lc.n_heads * lc.width;
    const auto xv = randn(T * D, 60), yv = randn(T * D, 61);
    Tensor x = make(xv, {T, D}, DType::F32), y = make(yv, {T, D}, DType::F32);
    rope_fwd(x, pos_t, table, lc.n_heads, lc.rot_offset);
    rope_bwd(y, pos_t, table, lc.n_heads, lc.rot_offset);
    const double lhs = testing::dot(to_double(x), yv), rhs = testing::dot(xv, to_double(y));
    EXPECT_NEAR(lhs, rhs, 1e-5 * double(T * D)) << lc.name();
  }
}

// HF DeepSeek-V3 (apply_rotary_pos_emb_interleave) computes the same pairs and
// writes them de-interleaved: [r1*cos - r2*sin | r2*cos + r1*sin] with
// r1 = r[0::2], r2 = r[1::2]. Kestrel's in-place pairs, de-interleaved, are
// that; and HF DeepSeek-V2's complex product (r[2i] + i r[2i+1]) * (cos + i sin)
// is them as they stand.
TEST_P(Rope, InterleavedIsDeepseekRotation) {
  const LayoutCase lc{4, 48, 16, 32, true};
  const auto pos = packed_positions({3, 20});
  const int64_t T = int64_t(pos.size()), D = lc.n_heads * lc.width, half = lc.rot / 2;
  const RopeTable table = layout_table(lc, 32);
  const auto xv = testing::round_to(randn(T * D, 70), DType::F32);
  Tensor x = make(xv, {T, D}, DType::F32);
  rope_fwd(x, Tensor::from_ints(pos, {T}), table, lc.n_heads, lc.rot_offset);
  const auto got = to_double(x);
  std::vector<double> v3(size_t(T * D)), mine_deint(size_t(T * D)), v2(size_t(T * D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < lc.n_heads; ++h) {
      const int64_t base = (t * lc.n_heads + h) * lc.width + lc.rot_offset;
      for (int64_t i = 0; i < half; ++i) {
        const double c = table.cos.get(pos[size_t(t)] * half + i), sn = table.sin.get(pos[size_t(t)] * half + i);
        const double r1 = xv[size_t(base + 2 * i)], r2 = xv[size_t(base + 2 * i + 1)];
        v3[size_t(base + i)] = r1 * c - r2 * sn;  // V3: cat([q1*cos - q2*sin, q2*cos + q1*sin])
        v3[size_t(base + half + i)] = r2 * c + r1 * sn;
        mine_deint[size_t(base + i)] = got[size_t(base + 2 * i)];
        mine_deint[size_t(base + half + i)] = got[size_t(base + 2 * i + 1)];
        v2[size_t(base + 2 * i)] = r1 * c - r2 * sn;  // V2: real and imaginary part of the complex product
        v2[size_t(base + 2 * i + 1)] = r1 * sn + r2 * c;
      }
    }
  const testing::Tolerance tol{1e-6, 1e-6};
  std::vector<double> a, b, a2, b2;
  for (int64_t i = 0; i < T * D; ++i) {
    const int64_t c = i % lc.width;
    if (c < lc.rot_offset || c >= lc.rot_offset + lc.rot) continue;
    a.push_back(mine_deint[size_t(i)]), b.push_back(v3[size_t(i)]);
    a2.push_back(got[size_t(i)]), b2.push_back(v2[size_t(i)]);
  }
  EXPECT_TRUE(testing::all_close(a, b, tol, "de-interleaved vs HF DeepSeek-V3"));
  EXPECT_TRUE(testing::all_close(a2, b2, tol, "in place vs HF DeepSeek-V2"));
}


TEST_P(Rope, BackwardInvertsForward) {
  RopeConfig cfg;
  cfg.head_dim = 8;
  const RopeTable table = make_rope_table(cfg, 100);
  const std::vector<int32_t> pos{0, 99, 50};
  const Tensor pos_t = Tensor::from_ints(pos, {3});
  const auto x0 = randn(3 * 16, 5);
  Tensor x = make(x0, {3, 16}, DType::F32);
  rope_fwd(x, pos_t, table, 2);
  rope_bwd(x, pos_t, table, 2);
  EXPECT_TRUE(testing::all_close(to_double(x), x0, {1e-6, 1e-5}, "inverse(fwd(x))"));
}

TEST_P(Rope, RejectsBadArguments) {
  RopeConfig cfg;
  cfg.head_dim = 8;
  const RopeTable table = make_rope_table(cfg, 4);
  Tensor x = Tensor::zeros({2, 16}, DType::F32);
  auto expect_error = [](auto&& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { rope_fwd(x, Tensor::from_ints({0, 4}, {2}), table, 2); }, "outside the RoPE table [0, 4)");
  expect_error([&] { rope_fwd(x, Tensor::from_ints({0, 1}, {2}), table, 3); }, "x must be [T, n_heads*W]");
  // Heads of 8 columns: a rotated range of 8 fits only at offset 0.
  expect_error([&] { rope_fwd(x, Tensor::from_ints({0, 1}, {2}), table, 2, 2); },
               "the rotated columns [2, 10) (rot_offset + the table's head_dim 8) must lie within each head of x, "
               "which has W = 8 columns");
  expect_error([&] { rope_bwd(x, Tensor::from_ints({0, 1}, {2}), table, 2, -1); }, "the rotated columns [-1, 7)");
  // Heads wider than the table need no offset: the first head_dim columns rotate.
  EXPECT_NO_THROW(rope_fwd(x, Tensor::from_ints({0, 1}, {2}), table, 1));
  expect_error([&] { rope_fwd(x, Tensor::from_ints({0}, {1}), table, 2); }, "positions must be i32 [2]");
  RopeConfig bad = cfg;
  bad.scaling_type = "dynamic";
  expect_error([&] { make_rope_table(bad, 4); }, "not supported yet: rope scaling type 'dynamic'");
  bad = cfg;
  bad.head_dim = 7;
  expect_error([&] { rope_inv_freq(bad, nullptr); }, "positive even number");
}

}  // namespace
}  // namespace kestrel::ops
