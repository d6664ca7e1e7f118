#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/testing.h"
#include "optim/adamw.h"

using namespace kestrel;
using namespace kestrel::optim;
using kestrel::testing::rel_to_scale;

namespace {

nlohmann::json load_golden() {
  std::ifstream in(kestrel::testing::source_path("tests/golden/optim/adamw_golden.json"));
  EXPECT_TRUE(in.good()) << "missing golden; run tests/golden/optim/make_optim_golden.py";
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

Tensor vec(const nlohmann::json& a) { return Tensor::from_vector(a.get<std::vector<float>>(), {int64_t(a.size())}); }
std::vector<double> dvec(const nlohmann::json& a) { return a.get<std::vector<double>>(); }

// Deterministic pseudo-random values for the self-consistency tests.
std::vector<float> values(int64_t n, uint32_t seed, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t s = seed * 2654435761u + 1;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = scale * (float(s >> 8) / float(1 << 24) - 0.5f);
  }
  return v;
}

std::vector<ParamSlot> make_params(const std::vector<int64_t>& sizes, bool with_bf16_copy) {
  std::vector<ParamSlot> ps;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ParamSlot p;
    p.name = "p" + std::to_string(i);
    p.master = Tensor::from_vector(values(sizes[i], uint32_t(i), 2.0f), {sizes[i]}, MemCategory::Params);
    p.grad = Tensor::zeros({sizes[i]}, DType::F32, MemCategory::Grads);
    if (with_bf16_copy) p.model_copy = p.master.to(DType::BF16, MemCategory::Params);
    p.decay = i % 2 == 0;
    ps.push_back(std::move(p));
  }
  return ps;
}

void set_grads(std::vector<ParamSlot>& ps, int step) {
  for (size_t i = 0; i < ps.size(); ++i) {
    auto g = values(ps[i].grad.numel(), uint32_t(100 * step + i), 0.5f);
    std::memcpy(ps[i].grad.raw(), g.data(), g.size() * 4);
  }
}

}  // namespace

TEST(AdamW, MatchesTorchGolden) {
  const auto gold = load_golden();
  AdamWConfig cfg;
  cfg.beta1 = gold["betas"][0];
  cfg.beta2 = gold["betas"][1];
  cfg.eps = gold["eps"];
  cfg.weight_decay = gold["weight_decay"];
  std::vector<ParamSlot> ps;
  for (const auto& p : gold["params"]) {
    ParamSlot s;
    s.name = p["name"];
    s.master = vec(p["init"]);
    s.grad = Tensor::zeros({s.master.numel()}, DType::F32, MemCategory::Grads);
    s.decay = p["decay"];
    ps.push_back(std::move(s));
  }
  AdamW opt(std::move(ps), cfg);
  EXPECT_EQ(opt.exp_avg().storage()->category(), MemCategory::OptimizerState);
  const auto& lrs = gold["lrs"];
  for (size_t step = 0; step < lrs.size(); ++step) {
    for (size_t i = 0; i < gold["params"].size(); ++i)
      opt.params()[i].grad.copy_from(vec(gold["params"][i]["grads"][step]));
    opt.step(lrs[step].get<double>());
    for (size_t i = 0; i < gold["params"].size(); ++i) {
      const auto want = dvec(gold["params"][i]["after_step"][step]);
      const auto got = kestrel::testing::to_double(opt.params()[i].master);
      EXPECT_LE(rel_to_scale(got, want), 1e-6) << opt.params()[i].name << " after step " << step + 1;
    }
  }
  EXPECT_EQ(opt.step_count(), int64_t(lrs.size()));
  for (size_t i = 0; i < gold["params"].size(); ++i) {
    const int64_t off = opt.offsets()[i], n = opt.params()[i].master.numel();
    std::vector<double> m, v;
    for (int64_t k = 0; k < n; ++k) {
      m.push_back(opt.exp_avg().get(off + k));
      v.push_back(opt.exp_avg_sq().get(off + k));
    }
    EXPECT_LE(rel_to_scale(m, dvec(gold["params"][i]["final_exp_avg"])), 1e-6);
    EXPECT_LE(rel_to_scale(v, dvec(gold["params"][i]["final_exp_avg_sq"])), 1e-6);
  }
}

TEST(AdamW, RangeSteppingEqualsWholeStepping) {
  const std::vector<int64_t> sizes = {7, 1, 33, 16};
  AdamWConfig cfg;
  cfg.weight_decay = 0.05;
  AdamW whole(make_params(sizes, true), cfg);
  AdamW parts(make_params(sizes, true), cfg);
  // Three "ranks" owning uneven slices that cut through parameters.
  const int64_t n = whole.numel();
  ASSERT_EQ(n, 57);
  std::vector<std::unique_ptr<AdamW>> shards;
  const std::vector<int64_t> cuts = {0, 5, 40, n};
  for (size_t r = 0; r + 1 < cuts.size(); ++r)
    shards.push_back(std::make_unique<AdamW>(make_params(sizes, true), cfg, cuts[r], cuts[r + 1]));
  for (int step = 0; step < 4; ++step) {
    const double lr = 1e-2 * (step + 1);
    set_grads(whole.params(), step);
    set_grads(parts.params(), step);
    whole.step(lr);
    parts.step_ranges({{0, 5}, {5, 40}, {40, n}}, lr);
    for (auto& s : shards) {
      set_grads(s->params(), step);
      s->step(lr);
      EXPECT_EQ(s->exp_avg().numel(), s->state_end() - s->state_begin());
    }
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto want = whole.params()[i].master.to_float_vector();
    EXPECT_EQ(parts.params()[i].master.to_float_vector(), want) << i;
    EXPECT_EQ(parts.params()[i].model_copy.to_float_vector(), whole.params()[i].model_copy.to_float_vector());
    // Each shard updated exactly its slice; assemble the slices.
    for (int64_t k = 0; k < sizes[i]; ++k) {
      const int64_t flat = whole.offsets()[i] + k;
      for (auto& s : shards)
        if (flat >= s->state_begin() && flat < s->state_end()) {
          EXPECT_EQ(s->params()[i].master.get(k), want[size_t(k)]) << "param " << i << " elem " << k;
          EXPECT_EQ(s->exp_avg_sq().get(flat - s->state_begin()), whole.exp_avg_sq().get(flat));
        }
    }
  }
}

TEST(AdamW, StepRangeTouchesOnlyItsRange) {
  AdamW opt(make_params({10, 10}, true), AdamWConfig{});
  set_grads(opt.params(), 0);
  const auto before0 = opt.params()[0].master.to_float_vector();
  const auto before1 = opt.params()[1].master.to_float_vector();
  opt.step_range(8, 12, 0.1);
  const auto after0 = opt.params()[0].master.to_float_vector();
  const auto after1 = opt.params()[1].master.to_float_vector();
  for (int k = 0; k < 10; ++k) {
    EXPECT_EQ(after0[k] != before0[k], k >= 8) << k;
    EXPECT_EQ(after1[k] != before1[k], k < 2) << k;
  }
  EXPECT_THROW(opt.step_range(5, 21, 0.1), Error);
}

TEST(AdamW, Bf16ModelCopyIsRoundedMaster) {
  AdamW opt(make_params({300}, true), AdamWConfig{});
  set_grads(opt.params(), 1);
  opt.step(3e-3);
  const auto& p = opt.params()[0];
  for (int64_t k = 0; k < 300; ++k) {
    const float m = p.master.get(k);
    EXPECT_EQ(static_cast<const uint16_t*>(p.model_copy.raw())[k], float_to_bf16(m)) << k;
  }
}

TEST(AdamW, NoDecayFlagAndZeroGradStep) {
  // With zero grads, m = v = 0 and the update is 0: only decay moves params.
  AdamWConfig cfg;
  cfg.weight_decay = 0.5;
  AdamW opt(make_params({4, 4}, false), cfg);  // p0 decays, p1 does not
  const auto p0 = opt.params()[0].master.to_float_vector();
  const auto p1 = opt.params()[1].master.to_float_vector();
  opt.step(0.1);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(opt.params()[0].master.get(k), p0[k] * float(1.0 - 0.1 * 0.5));
    EXPECT_EQ(opt.params()[1].master.get(k), p1[k]);
  }
}

TEST(AdamW, StateRoundTripResumesIdentically) {
  AdamWConfig cfg;
  AdamW a(make_params({5, 9}, false), cfg, 3, 14);
  AdamW b(make_params({5, 9}, false), cfg, 3, 14);
  for (int s = 0; s < 2; ++s) {
    set_grads(a.params(), s);
    a.step(1e-2);
  }
  // b gets a's params and state (as a checkpoint load would) and then both continue.
  for (size_t i = 0; i < 2; ++i) b.params()[i].master.copy_from(a.params()[i].master);
  OptimizerState st = a.state();
  EXPECT_EQ(st.metadata.at("layout"), "p0:5;p1:9:nodecay");
  std::map<std::string, Tensor> saved;
  for (auto& [n, t] : st.tensors) saved[n] = t.clone();
  ASSERT_TRUE(b.load_state(saved, st.metadata, "ckpt/optim.safetensors").is_ok());
  EXPECT_EQ(b.step_count(), 2);
  set_grads(a.params(), 2);
  set_grads(b.params(), 2);
  a.step(1e-2);
  b.step(1e-2);
  for (size_t i = 0; i < 2; ++i)
    EXPECT_EQ(a.params()[i].master.to_float_vector(), b.params()[i].master.to_float_vector());

  // Layout and range mismatches are refused with a clear message.
  AdamW other(make_params({5, 8}, false), cfg);
  Status s1 = other.load_state(saved, st.metadata, "ckpt/optim.safetensors");
  ASSERT_FALSE(s1.is_ok());
  EXPECT_NE(s1.message().find("ckpt/optim.safetensors: optimizer state was saved for different parameters"),
            std::string::npos) << s1.message();
  AdamW resharded(make_params({5, 9}, false), cfg, 0, 7);
  Status s2 = resharded.load_state(saved, st.metadata, "ckpt/optim.safetensors");
  ASSERT_FALSE(s2.is_ok());
  EXPECT_NE(s2.message().find("not supported yet: resharding optimizer state"), std::string::npos) << s2.message();
}

// ---- Held (sharded) masters: the distributed optimizer's mixed-precision mode.

namespace {

// Mixed-precision slots as the trainers build them: a low-precision model copy
// and either a full f32 master made from it or none (the optimizer holds it).
std::vector<ParamSlot> make_mixed(const std::vector<int64_t>& sizes, bool held, DType dt = DType::BF16) {
  std::vector<ParamSlot> ps;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ParamSlot p;
    p.name = "p" + std::to_string(i);
    p.model_copy = Tensor::from_vector(values(sizes[i], uint32_t(i), 2.0f), {sizes[i]}).to(dt, MemCategory::Params);
    if (!held) p.master = p.model_copy.to(DType::F32, MemCategory::OptimizerState);
    p.grad = Tensor::zeros({sizes[i]}, DType::F32, MemCategory::Grads);
    p.decay = i % 2 == 0;
    ps.push_back(std::move(p));
  }
  return ps;
}

int64_t live_state_bytes() { return cpu_allocator().stats().live_of(MemCategory::OptimizerState); }

}  // namespace

class HeldMasters : public ::testing::TestWithParam<DType> {};

TEST_P(HeldMasters, StepBitIdenticalToFullMasters) {
  const DType dt = GetParam();
  const std::vector<int64_t> sizes = {7, 1, 33, 16};
  AdamWConfig cfg;
  cfg.weight_decay = 0.05;
  AdamW whole(make_mixed(sizes, false, dt), cfg);
  const int64_t n = whole.numel();
  const std::vector<int64_t> cuts = {0, 5, 40, n};  // uneven, cutting through parameters
  std::vector<std::unique_ptr<AdamW>> shards;
  for (size_t r = 0; r + 1 < cuts.size(); ++r) {
    shards.push_back(std::make_unique<AdamW>(make_mixed(sizes, true, dt), cfg, cuts[r], cuts[r + 1]));
    EXPECT_TRUE(shards.back()->holds_masters());
    EXPECT_EQ(shards.back()->held_masters().numel(), cuts[r + 1] - cuts[r]);
    EXPECT_EQ(shards.back()->held_masters().storage()->category(), MemCategory::OptimizerState);
    EXPECT_FALSE(shards.back()->params()[0].master.defined());
  }
  EXPECT_FALSE(whole.holds_masters());
  std::vector<std::vector<float>> init;
  for (const auto& p : shards[0]->params()) init.push_back(p.model_copy.to_float_vector());
  for (int step = 0; step < 4; ++step) {
    const double lr = 1e-2 * (step + 1);
    set_grads(whole.params(), step);
    whole.step(lr);
    for (auto& s : shards) {
      set_grads(s->params(), step);
      s->step(lr);
    }
  }
  for (size_t r = 0; r < shards.size(); ++r) {
    const AdamW& s = *shards[r];
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto [lo, hi] = s.owned_of(i);
      const Tensor mv = s.master_view(i);
      ASSERT_EQ(mv.numel(), hi - lo);
      for (int64_t f = whole.offsets()[i]; f < whole.offsets()[i + 1]; ++f) {
        const int64_t k = f - whole.offsets()[i];
        const float copy = s.params()[i].model_copy.get(k);
        if (f >= lo && f < hi) {
          EXPECT_EQ(mv.get(f - lo), whole.params()[i].master.get(k)) << "rank " << r << " param " << i << " elem " << k;
          EXPECT_EQ(copy, whole.params()[i].model_copy.get(k)) << "rank " << r << " param " << i << " elem " << k;
          EXPECT_EQ(s.exp_avg_sq().get(f - s.state_begin()), whole.exp_avg_sq().get(f));
        } else {
          // Not owned: only DataParallel::gather_params() may write it.
          EXPECT_EQ(copy, init[i][size_t(k)]) << "rank " << r << " param " << i << " elem " << k;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, HeldMasters, ::testing::Values(DType::BF16, DType::F16),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

TEST(AdamW, MemoryAccountingBytesPerParam) {
  const std::vector<int64_t> sizes = {7, 1, 33, 16};  // 57 elements
  {
    // One process, bf16 with full masters: master 4 + m 4 + v 4.
    const int64_t before = live_state_bytes();
    AdamW full(make_mixed(sizes, false), AdamWConfig{});
    const OptimizerMemory mem = full.memory();
    EXPECT_EQ(mem.params, 57);
    EXPECT_EQ(mem.owned, 57);
    EXPECT_EQ(mem.master_bytes, 57 * 4);
    EXPECT_DOUBLE_EQ(mem.bytes_per_param(), 12.0) << mem.to_string();
    // make_mixed allocates the full masters in the OptimizerState category, as the trainers do.
    EXPECT_EQ(live_state_bytes() - before, mem.total_bytes());
  }
  {
    // Held masters over [19, 38): a third of the space, 12/3 bytes per param.
    const int64_t before = live_state_bytes();
    AdamW shard(make_mixed(sizes, true), AdamWConfig{}, 19, 38);
    const OptimizerMemory mem = shard.memory();
    EXPECT_EQ(mem.owned, 19);
    EXPECT_EQ(mem.master_bytes, 19 * 4);
    EXPECT_DOUBLE_EQ(mem.bytes_per_param(), 4.0) << mem.to_string();
    EXPECT_EQ(live_state_bytes() - before, mem.total_bytes());
  }
  {
    // f32: the weights are the masters; m and v only, sharded: 8/3.
    const int64_t before = live_state_bytes();
    AdamW f32(make_params(sizes, false), AdamWConfig{}, 0, 19);
    EXPECT_EQ(f32.memory().master_bytes, 0);
    EXPECT_DOUBLE_EQ(f32.memory().bytes_per_param(), 8.0 / 3.0);
    EXPECT_EQ(live_state_bytes() - before, f32.memory().total_bytes());
    // A master-less f32 model copy is stepped in place (no held buffer).
    auto ps = make_params(sizes, false);
    for (auto& p : ps) std::swap(p.master, p.model_copy);
    AdamW inplace(std::move(ps), AdamWConfig{});
    EXPECT_FALSE(inplace.holds_masters());
    EXPECT_DOUBLE_EQ(inplace.memory().bytes_per_param(), 8.0);
  }
}

TEST(AdamW, SetMasterSeedsHeldSlice) {
  AdamW opt(make_mixed({10, 6}, true), AdamWConfig{}, 4, 13);
  Tensor full = Tensor::from_vector(values(10, 7, 1.0f), {10});
  opt.set_master(0, full);
  const Tensor mv = opt.master_view(0);
  ASSERT_EQ(mv.numel(), 6);
  for (int64_t k = 4; k < 10; ++k) {
    EXPECT_EQ(mv.get(k - 4), full.get(k));
    EXPECT_EQ(static_cast<const uint16_t*>(opt.params()[0].model_copy.raw())[k], float_to_bf16(full.get(k)));
  }
  EXPECT_THROW(opt.set_master(1, full), Error);  // wrong numel

  // A parameter outside the owned range has an empty master view, held or full.
  AdamW tail(make_mixed({10, 6}, true), AdamWConfig{}, 12, 16);
  AdamW full_tail(make_mixed({10, 6}, false), AdamWConfig{}, 12, 16);
  EXPECT_EQ(tail.master_view(0).numel(), 0);
  EXPECT_EQ(full_tail.master_view(0).numel(), 0);
  EXPECT_EQ(full_tail.master_view(1).numel(), 4);
  EXPECT_EQ(tail.owned_of(0).first, tail.owned_of(0).second);
}

TEST(AdamW, HeldMasterStateRoundTripAndLayoutChecks) {
  const std::vector<int64_t> sizes = {5, 9};
  AdamWConfig cfg;
  AdamW a(make_mixed(sizes, true), cfg, 3, 14);
  for (int s = 0; s < 2; ++s) {
    set_grads(a.params(), s);
    a.step(1e-2);
  }
  OptimizerState st = a.state();
  EXPECT_EQ(st.metadata.at("master"), "held");
  EXPECT_EQ(st.metadata.at("held_params"), "all");
  std::map<std::string, Tensor> saved;
  for (auto& [n, t] : st.tensors) saved[n] = t.clone();
  ASSERT_TRUE(saved.count("master"));
  EXPECT_EQ(saved["master"].numel(), 11);

  // A fresh rank with the same layout resumes bit-identically, model copy included.
  AdamW b(make_mixed(sizes, true), cfg, 3, 14);
  ASSERT_TRUE(b.load_state(saved, st.metadata, "ckpt/optim_rank0.safetensors").is_ok());
  for (size_t i = 0; i < 2; ++i) {
    auto [lo, hi] = a.owned_of(i);
    for (int64_t f = lo; f < hi; ++f)
      EXPECT_EQ(b.params()[i].model_copy.get(f - a.offsets()[i]), a.params()[i].model_copy.get(f - a.offsets()[i]));
  }
  set_grads(a.params(), 2);
  set_grads(b.params(), 2);
  a.step(1e-2);
  b.step(1e-2);
  EXPECT_EQ(a.held_masters().to_float_vector(), b.held_masters().to_float_vector());

  auto refused = [&](AdamW& o, const std::string& what) {
    Status s = o.load_state(saved, st.metadata, "ckpt/optim_rank0.safetensors");
    EXPECT_FALSE(s.is_ok()) << what;
    EXPECT_EQ(s.message().rfind("ckpt/optim_rank0.safetensors: ", 0), 0u) << s.message();
    return s.message();
  };
  AdamW other_dp(make_mixed(sizes, true), cfg, 0, 7);  // another dp size
  EXPECT_NE(refused(other_dp, "dp").find("different data-parallel size"), std::string::npos);
  AdamW full(make_mixed(sizes, false), cfg, 3, 14);  // full masters (no distributed optimizer)
  EXPECT_NE(refused(full, "full").find("this optimizer keeps full masters"), std::string::npos);
  // And a full-master state into held masters.
  OptimizerState fst = full.state();
  EXPECT_EQ(fst.metadata.count("master"), 0u);
  std::map<std::string, Tensor> fsaved(fst.tensors.begin(), fst.tensors.end());
  Status s3 = b.load_state(fsaved, fst.metadata, "ckpt/full.safetensors");
  ASSERT_FALSE(s3.is_ok());
  EXPECT_NE(s3.message().find("ckpt/full.safetensors: optimizer state has no f32 master slice"), std::string::npos)
      << s3.message();
}
