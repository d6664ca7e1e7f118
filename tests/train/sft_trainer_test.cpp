// The SFT trainer: token-mean loss over response tokens, micro-batching, and
// bit-identical resume from a checkpoint (also with reuse_fp32_param, which
// trains bit for bit like the plain bf16 path); a checkpoint holding a NaN/Inf
// is refused, leaving the previous one and the pointer untouched.
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "common/testing.h"
#include "comm/process_group.h"
#include "core/files.h"
#include "ops/copy.h"
#include "train/checkpoint.h"
#include "train/micro_batch.h"
#include "train/sft_trainer.h"

namespace kestrel::train {
namespace {

namespace fs = std::filesystem;

io::ModelConfig tiny_config() {
  io::ModelConfig c;
  const std::string j = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 24,
    "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
    "eos_token_id": 1})";
  return io::parse_model_config(j, "test").value();
}

std::vector<SftExample> examples(int n) {
  std::vector<SftExample> out;
  for (int i = 0; i < n; ++i) {
    SftExample e;
    const int len = 5 + i % 4, prompt = 2 + i % 3;
    for (int t = 0; t < len; ++t) {
      e.ids.push_back(int32_t(2 + (i * 7 + t * 3) % 22));
      e.loss_mask.push_back(t >= prompt ? 1 : 0);
    }
    out.push_back(std::move(e));
  }
  return out;
}

// A fixed order: 0..n-1 cycled, `batch` at a time.
class CycleSource : public BatchSource {
 public:
  CycleSource(int64_t n, int64_t batch) : n_(n), b_(batch) {}
  std::vector<int64_t> next_batch() override {
    std::vector<int64_t> out;
    for (int64_t k = 0; k < b_; ++k) out.push_back((pos_ + k) % n_);
    pos_ += b_;
    return out;
  }
  int64_t batches_per_epoch() const override { return n_ / b_; }
  int64_t epoch() const override { return pos_ / n_; }
  nlohmann::json state() const override { return {{"pos", pos_}, {"seed", 0}}; }
  Status restore(const nlohmann::json& s, const std::string&) override {
    pos_ = s.at("pos").get<int64_t>();
    return Status::ok();
  }

 private:
  int64_t n_, b_, pos_ = 0;
};

SftOptions options(int64_t steps) {
  SftOptions o;
  o.total_steps = steps;
  o.micro_batch_size = 2;
  o.adamw.weight_decay = 0.01;
  o.lr.lr = 1e-2;
  o.lr.style = optim::LrStyle::Cosine;
  o.lr.warmup_steps = 1;
  o.clip_grad = 1.0;
  o.progress = false;
  o.resume_mode = "disable";
  return o;
}

std::vector<float> weights_of(model::CausalLM& m) {
  std::vector<float> w;
  for (auto* p : m.params()) {
    auto v = p->weight.to_float_vector();
    w.insert(w.end(), v.begin(), v.end());
  }
  return w;
}

std::string scratch(const std::string& name) {
  const auto d = fs::temp_directory_path() / ("kestrel_sft_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  return d.string();
}

TEST(MicroBatch, SplitByTokensOrCountAndWeights) {
  EXPECT_EQ(split_micro_batches({5, 4, 3, 9, 1}, 9, 0),
            (std::vector<std::vector<int64_t>>{{0, 1}, {2}, {3}, {4}}));
  EXPECT_EQ(split_micro_batches({5, 4, 3, 9, 1}, 0, 2), (std::vector<std::vector<int64_t>>{{0, 1}, {2, 3}, {4}}));
  std::vector<uint8_t> a = {0, 0, 1, 1}, b = {0, 1, 1};
  EXPECT_EQ(sft_token_weights({&a, &b}, 0.5f), (std::vector<float>{0, 0.5f, 0.5f, 0, 0.5f, 0.5f, 0}));
}

// Expert parallelism evens the ranks' micro-batch counts by cutting the
// largest group (the first of equals) in two, keeping the order.
TEST(MicroBatch, SplitToCountCutsTheLargestGroup) {
  std::vector<std::vector<int64_t>> g = {{0, 1}, {2, 3, 4}, {5}};
  split_to_count(g, 3);
  EXPECT_EQ(g, (std::vector<std::vector<int64_t>>{{0, 1}, {2, 3, 4}, {5}}));
  split_to_count(g, 5);
  EXPECT_EQ(g, (std::vector<std::vector<int64_t>>{{0}, {1}, {2, 3}, {4}, {5}}));
  split_to_count(g, 6);
  EXPECT_EQ(g, (std::vector<std::vector<int64_t>>{{0}, {1}, {2}, {3}, {4}, {5}}));
  EXPECT_THROW(split_to_count(g, 7), Error);  // six sequences cannot fill seven micro-batches
  std::vector<std::vector<int64_t>> none;
  split_to_count(none, 0);
  EXPECT_TRUE(none.empty());
  auto one = split_micro_batches({5, 4}, 0, 2);
  align_micro_batch_count(one, *comm::local_group("ep"), "test");  // size 1: unchanged
  EXPECT_EQ(one, (std::vector<std::vector<int64_t>>{{0, 1}}));
}

// The step loss is the token-mean NLL over the response tokens of the whole
// mini-batch, whatever the micro-batch split: it equals the validation loss of
// the same rows before the update.
TEST(SftTrainer, LossIsTokenMeanOverResponsesAcrossMicroBatches) {
  auto m = model::CausalLM::init_random(tiny_config(), {}, 3);
  auto ex = examples(6);
  auto o = options(1);
  o.max_token_len_per_micro = 13;  // forces several micro-batches
  SftTrainer t(*m, ex, ex, std::make_unique<CycleSource>(6, 6), o, nullptr);
  const double val = t.validate().at("val/loss");
  const auto met = t.train_step();
  EXPECT_NEAR(met.at("train/loss"), val, 1e-5 * std::abs(val));
  EXPECT_GT(met.at("train/micro_batches"), 2.0);
  int64_t resp = 0;
  for (const auto& e : ex)
    for (size_t i = 1; i < e.loss_mask.size(); ++i) resp += e.loss_mask[i];
  EXPECT_EQ(met.at("train/num_response_tokens"), double(resp));
  EXPECT_EQ(met.at("train/lr"), 0.0);  // verl's warmup: the first update runs at factor 0
}

// Gradient accumulation: one micro-batch or many give the same update (up to
// summation order).
TEST(SftTrainer, MicroBatchSplitDoesNotChangeTheUpdate) {
  auto a = model::CausalLM::init_random(tiny_config(), {}, 5);
  auto b = model::CausalLM::init_random(tiny_config(), {}, 5);
  auto o = options(3);
  o.lr.warmup_steps = 0;
  auto oa = o, ob = o;
  oa.max_token_len_per_micro = 1000;
  ob.max_token_len_per_micro = 8;
  SftTrainer ta(*a, examples(8), {}, std::make_unique<CycleSource>(8, 4), oa, nullptr);
  SftTrainer tb(*b, examples(8), {}, std::make_unique<CycleSource>(8, 4), ob, nullptr);
  ASSERT_TRUE(ta.fit().is_ok());
  ASSERT_TRUE(tb.fit().is_ok());
  const auto wa = weights_of(*a), wb = weights_of(*b);
  std::vector<double> da(wa.begin(), wa.end()), db(wb.begin(), wb.end());
  EXPECT_TRUE(testing::all_close(da, db, {1e-5, 1e-4}, "weights"));
}

TEST(SftTrainer, TrainingReducesLoss) {
  auto m = model::CausalLM::init_random(tiny_config(), {}, 9);
  auto o = options(30);
  o.lr.lr = 3e-2;
  auto ex = examples(4);
  SftTrainer t(*m, ex, ex, std::make_unique<CycleSource>(4, 4), o, nullptr);
  const double before = t.validate().at("val/loss");
  ASSERT_TRUE(t.fit().is_ok());
  EXPECT_LT(t.validate().at("val/loss"), 0.5 * before);
}

// Save at step 2, resume in a fresh trainer, finish: weights and optimizer
// state are bit-identical to an uninterrupted run.
void check_resume(DType dtype, bool reuse_fp32 = false) {
  const std::string root = scratch(std::string("resume_") + dtype_name(dtype) + (reuse_fp32 ? "_reuse" : ""));
  model::ModelOptions mo;
  mo.dtype = dtype;
  auto ref = model::CausalLM::init_random(tiny_config(), mo, 11);
  // The reference trains without reuse: reuse must change nothing.
  SftTrainer tr(*ref, examples(8), {}, std::make_unique<CycleSource>(8, 3), options(5), nullptr);
  ASSERT_TRUE(tr.fit().is_ok());

  auto first = model::CausalLM::init_random(tiny_config(), mo, 11);
  auto o1 = options(5);
  o1.reuse_fp32_param = reuse_fp32;
  o1.ckpt_root = root;
  o1.save_freq = 2;
  {
    SftTrainer t1(*first, examples(8), {}, std::make_unique<CycleSource>(8, 3), o1, nullptr);
    for (int i = 0; i < 2; ++i) t1.train_step();
    ASSERT_TRUE(t1.save_checkpoint().is_ok());
    t1.train_step();  // progress after the checkpoint is lost with the "crash"
  }
  EXPECT_EQ(latest_checkpoint_step(root).value(), std::optional<int64_t>(2));
  auto second = model::CausalLM::init_random(tiny_config(), mo, 99);  // different init: all state must come from disk
  auto o2 = o1;
  o2.resume_mode = "auto";
  SftTrainer t2(*second, examples(8), {}, std::make_unique<CycleSource>(8, 3), o2, nullptr);
  ASSERT_TRUE(t2.fit().is_ok());
  EXPECT_EQ(t2.global_step(), 5);
  EXPECT_EQ(weights_of(*second), weights_of(*ref));
  EXPECT_EQ(t2.optimizer().exp_avg_sq_clean().to_float_vector(), tr.optimizer().exp_avg_sq().to_float_vector());
  EXPECT_EQ(t2.optimizer().step_count(), 5);
  EXPECT_TRUE(fs::exists(checkpoint_dir(root, 4)));
  EXPECT_TRUE(fs::exists(checkpoint_dir(root, 5)));  // the last step always saves
  EXPECT_TRUE(fs::exists(checkpoint_dir(root, 5) + "/model/config.json"));
  EXPECT_TRUE(fs::exists(checkpoint_dir(root, 5) + "/optimizer_pp0.safetensors"));
  EXPECT_TRUE(fs::exists(checkpoint_dir(root, 5) + "/trainer_state.json"));
}

TEST(SftTrainer, ResumeIsBitIdentical) { check_resume(DType::F32); }
// bf16 compute keeps f32 masters in the optimizer; they travel in the checkpoint.
TEST(SftTrainer, ResumeIsBitIdenticalBf16) { check_resume(DType::BF16); }
// reuse_fp32_param: the masters travel as f32 in the checkpoint; the run equals the plain bf16 one.
TEST(SftTrainer, ResumeIsBitIdenticalBf16ReuseFp32) { check_resume(DType::BF16, true); }

TEST(SftTrainer, RefusesACheckpointHoldingANaN) {
  const std::string root = scratch("nan_ckpt");
  auto m = model::CausalLM::init_random(tiny_config(), {}, 3);
  auto o = options(5);
  o.ckpt_root = root;
  SftTrainer t(*m, examples(8), {}, std::make_unique<CycleSource>(8, 3), o, nullptr);
  t.train_step();
  ASSERT_TRUE(t.save_checkpoint().is_ok());
  t.train_step();
  model::Param* p = m->params().front();
  Tensor one = p->weight.view({-1}).slice_rows(0, 1);
  ops::fill(one, NAN);
  const Status s = t.save_checkpoint();
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("model weight '" + p->name + "' holds a NaN or Inf"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("global_step_2 not written"), std::string::npos) << s.message();
  EXPECT_EQ(latest_checkpoint_step(root).value(), std::optional<int64_t>(1));
  EXPECT_FALSE(fs::exists(checkpoint_dir(root, 2)));
  for (const auto& e : fs::directory_iterator(root))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp", 0), std::string::npos) << e.path();
}

// The mpirun path's plumbing on size-1 groups (tests/scripts/mpi_sft.sh runs
// the real multi-rank layouts): a world and a dp group given to the trainer
// change nothing (the same dp share, losses, weights and checkpoint files),
// and the trainer state records the layout.
TEST(SftTrainer, SizeOneGroupsEqualOneProcess) {
  const std::string ra = scratch("groups_none"), rb = scratch("groups_local");
  auto a = model::CausalLM::init_random(tiny_config(), {}, 21);
  auto b = model::CausalLM::init_random(tiny_config(), {}, 21);
  auto oa = options(3);
  oa.ckpt_root = ra;
  oa.save_freq = 3;
  oa.test_freq = 3;
  auto ob = oa;
  ob.ckpt_root = rb;
  ob.world = std::make_shared<comm::LocalGroup>("world");
  ob.dp = std::make_shared<comm::LocalGroup>("dp");
  SftTrainer ta(*a, examples(8), examples(3), std::make_unique<CycleSource>(8, 4), oa, nullptr);
  SftTrainer tb(*b, examples(8), examples(3), std::make_unique<CycleSource>(8, 4), ob, nullptr);
  EXPECT_TRUE(tb.leader());
  ASSERT_TRUE(ta.fit().is_ok());
  ASSERT_TRUE(tb.fit().is_ok());
  EXPECT_EQ(weights_of(*a), weights_of(*b));
  EXPECT_EQ(ta.validate().at("val/loss"), tb.validate().at("val/loss"));
  const std::string sa = read_file(checkpoint_dir(ra, 3) + "/trainer_state.json").value();
  const std::string sb = read_file(checkpoint_dir(rb, 3) + "/trainer_state.json").value();
  const auto ja = nlohmann::json::parse(sa), jb = nlohmann::json::parse(sb);
  EXPECT_EQ(jb.at("parallel"), (nlohmann::json{{"world", 1}, {"tp", 1}, {"pp", 1}, {"dp", 1}}));
  EXPECT_EQ(ja.at("parallel"), jb.at("parallel"));
  EXPECT_EQ(read_file(checkpoint_dir(ra, 3) + "/model/model.safetensors").value(),
            read_file(checkpoint_dir(rb, 3) + "/model/model.safetensors").value());
}

TEST(SftTrainer, ResumePathMustBeAStepFolder) {
  auto m = model::CausalLM::init_random(tiny_config(), {}, 1);
  auto o = options(1);
  o.resume_mode = "resume_path";
  o.resume_from_path = "/nonexistent/run";
  SftTrainer t(*m, examples(4), {}, std::make_unique<CycleSource>(4, 2), o, nullptr);
  auto s = t.fit();
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("global_step_N"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace kestrel::train
