// reuse_fp32_param (MindSpeed's BF16 parameter-copy reuse): the f32 master
// held as (bf16 copy, 16-bit residual, one flag bit in exp_avg_sq's sign).
//  - The bit split: the copy equals float_to_bf16 (round to nearest even) and
//    recovery is exact for every high half (all signs, exponents, subnormals,
//    +-0, +-Inf, NaNs) against every special low half (ties, their
//    neighbours, 0, 0xffff), and for 2^20 random patterns. The check MindSpeed
//    ships (tools/reuse_fp32_bittrick_check.py: its plain +0x8000 variant
//    differs from RNE on ties) is reproduced as the reason for the flag.
//  - The tensor ops: split/recover round trip, v's other bits kept.
//  - AdamW with reuse steps bit for bit like full masters (masters, copies,
//    m, v) over several steps, with masters seeded at adversarial values, over
//    uneven owned ranges (the distributed optimizer's shards).
//  - Memory: 10 instead of 12 bytes per parameter (10/dp instead of 12/dp),
//    the allocator's OptimizerState bytes equal AdamW::memory().
//  - state()/load_state: the file is the held-master format; resume is bit-exact.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "backend/cpu/reuse_fp32_kernels.h"
#include "common/testing.h"
#include "ops/reuse_fp32_ops.h"
#include "optim/adamw.h"

using namespace kestrel;
using namespace kestrel::optim;

namespace {

uint16_t rne_bits(uint32_t u) { return float_to_bf16(std::bit_cast<float>(u)); }

// split then recover must give u back, and the copy must be the plain RNE copy.
::testing::AssertionResult round_trips(uint32_t u) {
  uint16_t b = 0, r = 0;
  const bool flag = cpu::reuse_fp32_split_bits(u, &b, &r);
  if (b != rne_bits(u))
    return ::testing::AssertionFailure() << std::hex << "u=0x" << u << ": copy 0x" << b << " != RNE 0x" << rne_bits(u);
  const uint32_t back = cpu::reuse_fp32_recover_bits(b, r, flag);
  if (back != u) return ::testing::AssertionFailure() << std::hex << "u=0x" << u << " recovered as 0x" << back;
  return ::testing::AssertionSuccess();
}

TEST(ReuseFp32Bits, EveryHighHalfWithEverySpecialLowHalf) {
  const uint32_t lows[] = {0x0000, 0x0001, 0x7ffe, 0x7fff, 0x8000, 0x8001, 0x8002, 0xfffe, 0xffff, 0x4000, 0xc000};
  int64_t n = 0, flagged = 0;
  for (uint32_t hi = 0; hi < 0x10000; ++hi)
    for (uint32_t lo : lows) {
      const uint32_t u = (hi << 16) | lo;
      ASSERT_TRUE(round_trips(u));
      uint16_t b, r;
      flagged += cpu::reuse_fp32_split_bits(u, &b, &r);
      ++n;
    }
  // Flags only where (b, r) alone is ambiguous: ties rounded up (odd high half)
  // and NaNs whose quiet bit was clear.
  EXPECT_GT(flagged, 0);
  EXPECT_LT(flagged, n / 5);
}

TEST(ReuseFp32Bits, RandomPatterns) {
  std::mt19937 rng(20261201);
  for (int i = 0; i < (1 << 20); ++i) ASSERT_TRUE(round_trips(uint32_t(rng())));
  // Gaussian values at several scales, as MindSpeed's check draws them.
  std::normal_distribution<float> g(0.f, 1.f);
  for (float scale : {1e-3f, 1.f, 1e3f, 1e-38f, 1e30f})
    for (int i = 0; i < 50000; ++i) ASSERT_TRUE(round_trips(std::bit_cast<uint32_t>(g(rng) * scale)));
}

TEST(ReuseFp32Bits, AdversarialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float vals[] = {0.f, -0.f, inf, -inf, std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                        std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
                        -std::numeric_limits<float>::denorm_min(), 1.f, -1.f};
  for (float v : vals) EXPECT_TRUE(round_trips(std::bit_cast<uint32_t>(v))) << v;
  const uint32_t bits[] = {
      0x3f808000u, 0x3f818000u, 0xbf808000u, 0xbf818000u,  // exact ties, even and odd high halves (MindSpeed's)
      0x3f7fffffu, 0x3f7f8000u, 0x3f7f7fffu,               // rounds up into the next exponent / tie below it
      0x7f7f8000u, 0x7f7fffffu, 0x7f7f7fffu,               // the largest finite: tie and above round to +Inf
      0xff7f8000u, 0xff7fffffu,                            // ... to -Inf
      0x007f8000u, 0x007fffffu, 0x00008000u, 0x00018000u,  // subnormal ties; the largest subnormal rounds to normal
      0x7f800001u, 0x7fbfffffu, 0x7fc00000u, 0x7fffffffu,  // NaNs: signalling payloads (quiet bit forced on), quiet
      0xff800001u, 0xffc00001u, 0x7f808000u, 0xffff8000u};
  for (uint32_t u : bits) EXPECT_TRUE(round_trips(u)) << std::hex << u;
  // Overflow: the copy of the largest finite master is +Inf, exactly as the
  // plain path rounds it, and the master comes back finite.
  uint16_t b, r;
  cpu::reuse_fp32_split_bits(0x7f7fffffu, &b, &r);
  EXPECT_EQ(b, 0x7f80u);
  EXPECT_EQ(std::bit_cast<float>(cpu::reuse_fp32_recover_bits(b, r, false)), std::numeric_limits<float>::max());
}

TEST(ReuseFp32Bits, MindSpeedsPlainVariantNeedsTheFlagOnTies) {
  // i + 0x8000 (MindSpeed without --npu-deterministic) rounds ties away from
  // zero; the RNE copy needs the extra bit exactly there.
  int mismatches = 0;
  for (uint32_t u : {0x3f808000u, 0x3f818000u, 0xbf808000u, 0xbf818000u, 0x3f800000u, 0x3f80ffffu})
    mismatches += uint16_t((u + 0x8000u) >> 16) != rne_bits(u);
  EXPECT_EQ(mismatches, 2);  // the two even-high-half ties
}

TEST(ReuseFp32Ops, SplitRecoverRoundTripKeepsVsOtherBits) {
  const int64_t n = 70000;  // above the kernels' threading threshold
  std::mt19937 rng(7);
  std::vector<float> w(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    w[size_t(k)] = std::bit_cast<float>(uint32_t(rng()));
    v[size_t(k)] = float(k % 97) * 0.25f;
  }
  w[3] = std::bit_cast<float>(0x3f818000u);  // a tie that sets the flag
  const Tensor master = Tensor::from_vector(w, {n});
  Tensor copy = Tensor::zeros({n}, DType::BF16), res = Tensor::zeros({n}, DType::BF16);
  Tensor vt = Tensor::from_vector(v, {n});
  ops::reuse_fp32_split(master, copy, res, vt);
  EXPECT_TRUE(std::signbit(vt.get(3)));  // the flag
  Tensor back = Tensor::zeros({n}, DType::F32), vclean = Tensor::zeros({n}, DType::F32);
  ops::reuse_fp32_recover(copy, res, vt, back, &vclean);
  EXPECT_EQ(std::memcmp(back.raw(), master.raw(), size_t(n) * 4), 0);
  EXPECT_EQ(std::memcmp(vclean.raw(), v.data(), size_t(n) * 4), 0);
  const auto* cb = static_cast<const uint16_t*>(copy.raw());
  for (int64_t k = 0; k < n; ++k) ASSERT_EQ(cb[k], float_to_bf16(w[size_t(k)])) << k;
}

// ---- AdamW with reuse against full masters.

std::vector<float> values(int64_t n, uint32_t seed, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t s = seed * 2654435761u + 1;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = scale * (float(s >> 8) / float(1 << 24) - 0.5f);
  }
  return v;
}

// Masters with adversarial bit patterns (ties with odd and even high halves,
// subnormals, signed zeros, values next to exponent boundaries) among random ones.
std::vector<float> adversarial_masters(int64_t n, uint32_t seed) {
  std::vector<float> v = values(n, seed, 2.0f);
  const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0xbf818000u, 0x3f7fffffu, 0x3f7f8000u, 0x00018000u,
                              0x80008000u, 0x00000000u, 0x80000000u, 0x3c23d70au, 0x3dcccccdu, 0xbe7fffffu};
  for (int64_t k = 0; k < n; k += 3) v[size_t(k)] = std::bit_cast<float>(special[size_t(k / 3) % std::size(special)]);
  return v;
}

// full: each slot has a full f32 master (the plain mixed-precision path);
// else no master (held, or with reuse (bf16 copy, residual)).
std::vector<ParamSlot> slots(const std::vector<int64_t>& sizes, bool full) {
  std::vector<ParamSlot> ps;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ParamSlot p;
    p.name = "p" + std::to_string(i);
    p.model_copy = Tensor::from_vector(values(sizes[i], uint32_t(i), 2.0f), {sizes[i]}).to(DType::BF16, MemCategory::Params);
    if (full) p.master = p.model_copy.to(DType::F32, MemCategory::OptimizerState);
    p.grad = Tensor::zeros({sizes[i]}, DType::F32, MemCategory::Grads);
    p.decay = i % 2 == 0;
    ps.push_back(std::move(p));
  }
  return ps;
}

void set_grads(AdamW& opt, int step) {
  for (size_t i = 0; i < opt.params().size(); ++i) {
    std::vector<float> g = values(opt.params()[i].grad.numel(), uint32_t(100 * step + i), 0.5f);
    if (step == 1 && !g.empty()) g[0] = 0.f;  // a zero gradient: v stays exactly 0 where a flag may be set
    std::memcpy(opt.params()[i].grad.raw(), g.data(), g.size() * 4);
  }
}

std::vector<uint16_t> copy_bits(const Tensor& t) {
  std::vector<uint16_t> out(size_t(t.numel()));
  std::memcpy(out.data(), t.raw(), out.size() * 2);
  return out;
}
std::vector<uint32_t> f32_bits(const Tensor& t) {
  std::vector<uint32_t> out(size_t(t.numel()));
  std::memcpy(out.data(), t.raw(), out.size() * 4);
  return out;
}

int64_t live_state_bytes() { return cpu_allocator().stats().live_of(MemCategory::OptimizerState); }

TEST(ReuseFp32AdamW, StepsBitIdenticalToFullMastersOverUnevenShards) {
  const std::vector<int64_t> sizes = {7, 1, 33, 16, 4100};
  AdamWConfig cfg;
  cfg.weight_decay = 0.05;
  AdamW whole(slots(sizes, true), cfg);
  const int64_t n = whole.numel();
  for (size_t i = 0; i < sizes.size(); ++i)
    whole.set_master(i, Tensor::from_vector(adversarial_masters(sizes[i], uint32_t(i)), {sizes[i]}));
  const std::vector<int64_t> cuts = {0, 5, 40, 2000, n};  // cutting through parameters, as dp shards do
  std::vector<std::unique_ptr<AdamW>> shards;
  for (size_t r = 0; r + 1 < cuts.size(); ++r) {
    auto s = std::make_unique<AdamW>(slots(sizes, false), cfg, cuts[r], cuts[r + 1], /*reuse_fp32=*/true);
    ASSERT_TRUE(s->reuses_fp32());
    EXPECT_EQ(s->held_masters().dtype(), DType::BF16);
    for (size_t i = 0; i < sizes.size(); ++i)
      s->set_master(i, Tensor::from_vector(adversarial_masters(sizes[i], uint32_t(i)), {sizes[i]}));
    shards.push_back(std::move(s));
  }
  for (int step = 1; step <= 4; ++step) {
    const double lr = step == 3 ? 0.0 : 1e-2 * step;  // lr 0: the masters must come back untouched
    set_grads(whole, step);
    whole.step(lr);
    for (auto& s : shards) {
      set_grads(*s, step);
      s->step(lr);
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      const auto want_copy = copy_bits(whole.params()[i].model_copy);
      const auto want_master = f32_bits(whole.params()[i].master);
      for (size_t r = 0; r < shards.size(); ++r) {
        const AdamW& s = *shards[r];
        auto [lo, hi] = s.owned_of(i);
        const auto got_copy = copy_bits(s.params()[i].model_copy);
        const auto got_master = f32_bits(s.master_view(i));
        for (int64_t f = lo; f < hi; ++f) {
          const size_t k = size_t(f - s.offsets()[i]);
          ASSERT_EQ(got_copy[k], want_copy[k]) << "step " << step << " shard " << r << " param " << i << " elem " << k;
          ASSERT_EQ(got_master[size_t(f - lo)], want_master[k]) << "step " << step << " param " << i << " elem " << k;
        }
      }
    }
    for (size_t r = 0; r < shards.size(); ++r) {
      const OptimizerState st = shards[r]->state();
      const auto m = f32_bits(st.tensors[0].second), v = f32_bits(st.tensors[1].second);
      const auto wm = f32_bits(whole.exp_avg()), wv = f32_bits(whole.exp_avg_sq());
      for (int64_t f = cuts[r]; f < cuts[r + 1]; ++f) {
        ASSERT_EQ(m[size_t(f - cuts[r])], wm[size_t(f)]) << "exp_avg, step " << step;
        ASSERT_EQ(v[size_t(f - cuts[r])], wv[size_t(f)]) << "exp_avg_sq, step " << step;
      }
    }
  }
  EXPECT_EQ(shards[0]->step_count(), 4);
}

TEST(ReuseFp32AdamW, MemoryIsTwoBytesPerParameterLess) {
  const std::vector<int64_t> sizes = {7, 1, 33, 16, 4100};
  int64_t n = 0;
  for (int64_t s : sizes) n += s;
  // One process: 12 -> 10 bytes per parameter.
  {
    std::vector<ParamSlot> full = slots(sizes, true);  // masters allocated before the window: not part of AdamW
    const int64_t before = live_state_bytes();
    AdamW plain(std::move(full), AdamWConfig{});
    const int64_t plain_delta = live_state_bytes() - before;  // m, v only: full masters were made outside
    EXPECT_EQ(plain_delta, 8 * n);
    EXPECT_DOUBLE_EQ(plain.memory().bytes_per_param(), 12.0);

    std::vector<ParamSlot> bare = slots(sizes, false);
    const int64_t before2 = live_state_bytes();
    AdamW reuse(std::move(bare), AdamWConfig{}, 0, -1, true);
    const int64_t reuse_delta = live_state_bytes() - before2;
    EXPECT_EQ(reuse_delta, reuse.memory().total_bytes());
    EXPECT_DOUBLE_EQ(reuse.memory().bytes_per_param(), 10.0) << reuse.memory().to_string();
    EXPECT_EQ(reuse.memory().residual_bytes, 2 * n);
    EXPECT_EQ(reuse.memory().master_bytes, 0);
    EXPECT_EQ(plain.memory().total_bytes() - reuse.memory().total_bytes(), 2 * n);
    EXPECT_NE(reuse.memory().to_string().find("residual 2.000; reuse_fp32_param"), std::string::npos)
        << reuse.memory().to_string();
  }
  // A 1/4 shard (the distributed optimizer): 12/dp -> 10/dp.
  {
    const int64_t lo = n / 4, hi = n / 2;
    const int64_t before = live_state_bytes();
    AdamW held(slots(sizes, false), AdamWConfig{}, lo, hi, false);
    const int64_t held_delta = live_state_bytes() - before;
    const int64_t before2 = live_state_bytes();
    AdamW reuse(slots(sizes, false), AdamWConfig{}, lo, hi, true);
    const int64_t reuse_delta = live_state_bytes() - before2;
    EXPECT_EQ(held_delta, held.memory().total_bytes());
    EXPECT_EQ(reuse_delta, reuse.memory().total_bytes());
    EXPECT_EQ(held_delta - reuse_delta, 2 * (hi - lo));
    EXPECT_DOUBLE_EQ(reuse.memory().bytes_per_param(), 10.0 * double(hi - lo) / double(n));
  }
}

TEST(ReuseFp32AdamW, StateIsTheHeldFormatAndResumesBitExact) {
  const std::vector<int64_t> sizes = {7, 33, 16};
  AdamWConfig cfg;
  AdamW a(slots(sizes, false), cfg, 0, -1, true);
  for (size_t i = 0; i < sizes.size(); ++i)
    a.set_master(i, Tensor::from_vector(adversarial_masters(sizes[i], uint32_t(i)), {sizes[i]}));
  for (int s = 1; s <= 2; ++s) {
    set_grads(a, s);
    a.step(1e-2);
  }
  const OptimizerState st = a.state();
  EXPECT_EQ(st.metadata.at("master"), "held");
  EXPECT_EQ(st.metadata.at("reuse_fp32_param"), "true");
  std::map<std::string, Tensor> saved;
  for (const auto& [k, t] : st.tensors) saved[k] = t.clone();
  EXPECT_EQ(saved.at("master").dtype(), DType::F32);
  // The saved v carries no flags (non-negative everywhere).
  for (float x : saved.at("exp_avg_sq").to_float_vector()) ASSERT_FALSE(std::signbit(x));

  // Loaded into a fresh reuse optimizer (other starting weights) and into a
  // held-master one (the distributed optimizer without reuse): all continue identically.
  std::vector<ParamSlot> sb = slots(sizes, false), sc = slots(sizes, false);
  for (auto& p : sb) p.model_copy.zero_();
  AdamW b(std::move(sb), cfg, 0, -1, true);
  AdamW c(std::move(sc), cfg, 0, -1, false);
  ASSERT_TRUE(b.load_state(saved, st.metadata, "test").is_ok());
  ASSERT_TRUE(c.load_state(saved, st.metadata, "test").is_ok());
  for (int s = 3; s <= 5; ++s)
    for (AdamW* o : {&a, &b, &c}) {
      set_grads(*o, s);
      o->step(1e-2);
    }
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(copy_bits(b.params()[i].model_copy), copy_bits(a.params()[i].model_copy)) << i;
    EXPECT_EQ(copy_bits(c.params()[i].model_copy), copy_bits(a.params()[i].model_copy)) << i;
    EXPECT_EQ(f32_bits(b.master_view(i)), f32_bits(a.master_view(i))) << i;
    EXPECT_EQ(f32_bits(c.master_view(i)), f32_bits(a.master_view(i))) << i;
  }
  EXPECT_EQ(b.step_count(), 5);
  // A full-master optimizer refuses the file, naming the setting.
  AdamW full(slots(sizes, true), cfg);
  const Status s = full.load_state(saved, st.metadata, "opt.safetensors");
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("reuse_fp32_param"), std::string::npos) << s.message();
}

TEST(ReuseFp32AdamW, NonBf16CopiesAreRefusedAndF32SlotsAreUntouched) {
  std::vector<ParamSlot> f16;
  ParamSlot p;
  p.name = "w";
  p.model_copy = Tensor::zeros({4}, DType::F16);
  p.grad = Tensor::zeros({4}, DType::F32);
  f16.push_back(p);
  try {
    AdamW o(std::move(f16), AdamWConfig{}, 0, -1, true);
    FAIL() << "f16 copies were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reuse_fp32_param needs bf16"), std::string::npos) << e.what();
  }
  // f32 weights are their own masters: nothing to reuse, the optimizer says so.
  std::vector<ParamSlot> f32;
  ParamSlot q;
  q.name = "w";
  q.master = Tensor::zeros({4}, DType::F32);
  q.grad = Tensor::zeros({4}, DType::F32);
  f32.push_back(q);
  AdamW o(std::move(f32), AdamWConfig{}, 0, -1, true);
  EXPECT_FALSE(o.reuses_fp32());
  EXPECT_EQ(o.memory().residual_bytes, 0);
}

TEST(ReuseFp32AdamW, FirstNonFiniteNamesTheTensor) {
  const std::vector<int64_t> sizes = {7, 5};
  AdamW a(slots(sizes, false), AdamWConfig{}, 0, -1, true);
  EXPECT_EQ(a.first_non_finite(), "");
  std::vector<float> bad = values(5, 3, 1.f);
  bad[2] = NAN;
  a.set_master(1, Tensor::from_vector(bad, {5}));
  EXPECT_EQ(a.first_non_finite(), "master.p1");
}

}  // namespace
