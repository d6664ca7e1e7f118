// reuse_fp32_param through train::TrainingEngine on one process: bf16
// training equals the plain mixed-precision path bit for bit over several
// AdamW steps (weights, recovered masters, loss and norm), the optimizer
// state costs 2 bytes per parameter less in the allocator's accounting
// (MemCategory::OptimizerState; Params unchanged) and in AdamW's report,
// f32 models are refused as MindSpeed refuses them, and an optimizer
// save/load continues bit for bit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "train/checkpoint.h"
#include "train/engine_testing.h"

namespace kestrel::train {
namespace {

namespace fs = std::filesystem;
using namespace engine_testing;

int64_t live(MemCategory c) { return cpu_allocator().stats().live_of(c); }

std::unique_ptr<model::CausalLM> bf16_model(uint64_t seed) {
  model::ModelOptions mo;
  mo.dtype = DType::BF16;
  return model::CausalLM::init_random(tiny_config(), mo, seed);
}

TEST(ReuseFp32Engine, TrainsBitForBitLikeThePlainMixedPrecisionPath) {
  auto a = bf16_model(21), b = bf16_model(21);
  EngineOptions oa = options(), ob = options();
  ob.reuse_fp32_param = true;
  TrainingEngine plain(*a, oa), reuse(*b, ob);
  ASSERT_TRUE(reuse.optimizer().reuses_fp32());
  ASSERT_FALSE(plain.optimizer().reuses_fp32());
  for (int s = 0; s < 5; ++s) {
    const auto seqs = sequences(5, s);
    const MiniBatchResult ra = plain.train_mini_batch(split(seqs, 2), mean_nll(seqs), plain.lr(s));
    const MiniBatchResult rb = reuse.train_mini_batch(split(seqs, 2), mean_nll(seqs), reuse.lr(s));
    ASSERT_TRUE(ra.finite && rb.finite);
    EXPECT_EQ(ra.loss, rb.loss) << "step " << s;
    EXPECT_EQ(ra.grad_norm, rb.grad_norm) << "step " << s;
    ASSERT_EQ(weight_bytes(*a), weight_bytes(*b)) << "bf16 weights differ after step " << s;
    for (size_t i = 0; i < plain.optimizer().params().size(); ++i)
      ASSERT_EQ(f32_bits(plain.optimizer().master_view(i)), f32_bits(reuse.optimizer().master_view(i)))
          << "master " << plain.optimizer().params()[i].name << " after step " << s;
  }
  EXPECT_EQ(f32_bits(plain.optimizer().exp_avg_sq()), f32_bits(reuse.optimizer().exp_avg_sq_clean()));
  EXPECT_EQ(f32_bits(plain.optimizer().exp_avg()), f32_bits(reuse.optimizer().exp_avg()));
}

TEST(ReuseFp32Engine, SavesTwoBytesPerParameter) {
  auto a = bf16_model(3), b = bf16_model(3);
  int64_t n = 0;
  for (const model::Param* p : a->params()) n += p->weight.numel();
  EngineOptions ob = options();
  ob.reuse_fp32_param = true;
  const int64_t s0 = live(MemCategory::OptimizerState), p0 = live(MemCategory::Params);
  auto plain = std::make_unique<TrainingEngine>(*a, options());
  const int64_t s1 = live(MemCategory::OptimizerState), p1 = live(MemCategory::Params);
  auto reuse = std::make_unique<TrainingEngine>(*b, ob);
  const int64_t s2 = live(MemCategory::OptimizerState), p2 = live(MemCategory::Params);
  EXPECT_EQ(s1 - s0, 12 * n);  // f32 master + m + v
  EXPECT_EQ(s2 - s1, 10 * n);  // residual + m + v
  EXPECT_EQ(p1 - p0, p2 - p1);  // the bf16 weights (Params) are the same bytes either way
  EXPECT_EQ(plain->optimizer().memory().total_bytes() - reuse->optimizer().memory().total_bytes(), 2 * n);
  EXPECT_DOUBLE_EQ(plain->optimizer().memory().bytes_per_param(), 12.0);
  EXPECT_DOUBLE_EQ(reuse->optimizer().memory().bytes_per_param(), 10.0);
  const std::string report = reuse->optimizer().memory().to_string();
  EXPECT_EQ(report.rfind("10.000 B/param (m 4.000, v 4.000, master 0.000, residual 2.000; reuse_fp32_param)", 0), 0u)
      << report;
  // The transient of a step stays on the stack: no OptimizerState bytes appear while training.
  const auto seqs = sequences(4);
  reuse->train_mini_batch(split(seqs, 2), mean_nll(seqs), reuse->lr(0));
  EXPECT_EQ(live(MemCategory::OptimizerState), s2);
}

// (Models are f32 or bf16; f16 model copies are refused by AdamW itself: tests/optim/reuse_fp32_test.cpp.)
TEST(ReuseFp32Engine, RefusesF32AsMindSpeedDoes) {
  for (DType dt : {DType::F32}) {
    model::ModelOptions mo;
    mo.dtype = dt;
    auto m = model::CausalLM::init_random(tiny_config(), mo, 5);
    EngineOptions o = options();
    o.reuse_fp32_param = true;
    o.name = "actor";
    try {
      TrainingEngine e(*m, o);
      FAIL() << dtype_name(dt) << " accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("actor: reuse_fp32_param=true needs bf16 weights"), std::string::npos) << msg;
      EXPECT_NE(msg.find("only support for `bf16`"), std::string::npos) << msg;
      EXPECT_NE(msg.find("no separate bf16 copy"), std::string::npos) << msg;
    }
  }
}

TEST(ReuseFp32Engine, SaveLoadContinuesBitForBit) {
  const fs::path dir = fs::temp_directory_path() / ("kestrel_reuse_rt_" + std::to_string(getpid()));
  fs::remove_all(dir);
  EngineOptions o = options();
  o.reuse_fp32_param = true;
  auto first = bf16_model(11);
  TrainingEngine a(*first, o);
  for (int s = 0; s < 2; ++s) {
    const auto seqs = sequences(4, s);
    a.train_mini_batch(split(seqs, 2), mean_nll(seqs), a.lr(s));
  }
  ASSERT_TRUE(first->save((dir / "model").string(), first->dtype()).is_ok());
  ASSERT_TRUE(a.save_optimizer((dir / a.optimizer_file_name()).string()).is_ok());

  auto second = bf16_model(99);  // all state must come from disk
  TrainingEngine b(*second, o);
  ASSERT_TRUE(load_weights_into(*second, (dir / "model").string()).is_ok());
  ASSERT_TRUE(b.load_optimizer((dir / b.optimizer_file_name()).string()).is_ok());
  EXPECT_EQ(b.optimizer().step_count(), 2);
  for (int s = 2; s < 5; ++s) {
    const auto seqs = sequences(4, s);
    const MiniBatchResult ra = a.train_mini_batch(split(seqs, 3), mean_nll(seqs), a.lr(s));
    const MiniBatchResult rb = b.train_mini_batch(split(seqs, 3), mean_nll(seqs), b.lr(s));
    EXPECT_EQ(ra.loss, rb.loss);
  }
  EXPECT_EQ(weight_bytes(*first), weight_bytes(*second));
  for (size_t i = 0; i < a.optimizer().params().size(); ++i)
    EXPECT_EQ(f32_bits(a.optimizer().master_view(i)), f32_bits(b.optimizer().master_view(i)));
  // A plain (full-master) engine refuses the file with a message naming the setting.
  auto third = bf16_model(99);
  TrainingEngine c(*third, options());
  const Status s = c.load_optimizer((dir / c.optimizer_file_name()).string());
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("reuse_fp32_param"), std::string::npos) << s.message();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kestrel::train
