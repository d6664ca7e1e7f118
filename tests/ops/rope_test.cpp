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
void check_against_reference(DType dt, bool inverse) {
  const auto pos = packed_positions({1, 17, 40, 5});
  const int64_t T = int64_t(pos.size());
  const Tensor pos_t = Tensor::from_ints(pos, {T});
  for (const auto& rc : rope_cases()) {
    const RopeTable table = make_rope_table(rc.cfg, 64);
    const int64_t D = rc.n_heads * rc.head_dim;
    Tensor x = make(randn(T * D, rc.head_dim), {T, D}, dt);
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
  for (Device dev : testing::available_devices()) {
    ASSERT_EQ(dev, Device::CPU);
    check_against_reference(param(), false);
  }
}

TEST_P(RopeDtypes, BackwardMatchesReference) { check_against_reference(param(), true); }

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

KS_ISA_SUITE(Rope);

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
  expect_error([&] { rope_fwd(x, Tensor::from_ints({0, 1}, {2}), table, 3); }, "x must be [T, n_heads*head_dim]");
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
