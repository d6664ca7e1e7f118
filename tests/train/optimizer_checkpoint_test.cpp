// The layout-independent optimizer checkpoint (train/optimizer_checkpoint.h)
// in one process: 2 AdamW steps under layout A, save, load into layout B, 1
// more step, against an uninterrupted 3-step run in layout B.
//   - one process -> one process (f32; bf16; bf16 with reuse_fp32_param, and
//     across reuse on/off): the restored state re-saved is the saved file bit
//     for bit, and the resumed weights equal the uninterrupted run's bit for bit;
//   - a two-stage pipeline emulated with model slices (each slice its own
//     engine, the pp group a RankOnlyGroup of rank 0/1), PP2 -> PP1 and PP1 ->
//     PP2: restored state bit for bit (both stages' files against the whole
//     model's one); the resumed weights against the uninterrupted runs of
//     both layouts (ckpt_testing::ResumeDiff: across layouts the runs
//     themselves differ, a chain of slices equalling the whole model to 1e-6
//     and not bit for bit, tests/model/slice_test.cpp, and AdamW carrying such
//     differences into the updates; the resumed run may be no further from
//     layout B's run than layout A's own run is), and bit for bit against a
//     run that stays in layout A (PP2 -> PP2);
//   - the old per-rank file still loads in its own layout; refusals name the
//     file and the fix: a missing stage file, a parameter in no file, another
//     model's shapes, another weight dtype, old-format files of another layout.
#include <gtest/gtest.h>

#include "train/optimizer_checkpoint_testing.h"

using namespace kestrel;
using namespace kestrel::train;
using namespace kestrel::train::engine_testing;
using namespace kestrel::train::ckpt_testing;

namespace {

model::ModelOptions mopts(DType dt) {
  model::ModelOptions o;
  o.dtype = dt;
  return o;
}

EngineOptions eopts(bool reuse) {
  EngineOptions o = options(0.0);  // no clipping: the pipe's hand-made step does not clip
  o.reuse_fp32_param = reuse;
  return o;
}

void train_whole(TrainingEngine& e, int s) {
  StepData d = step_data(s);
  const MiniBatchResult r = e.train_mini_batch(d.micro, d.objective, e.lr(s), s + 1);
  ASSERT_TRUE(r.finite);
}
void train_pipe_step(Pipe& p, int s) {
  StepData d = step_data(s);
  train_pipe(p, d.micro, d.objective, p.e0->lr(s));
}

// The state restored into `engines` re-saved equals the state saved in `dir`, bit for bit.
void expect_restored_exactly(const std::string& dir, const std::vector<TrainingEngine*>& engines,
                             const std::string& name) {
  const std::string again = tmp_dir(name + "_resaved");
  for (TrainingEngine* e : engines) ASSERT_TRUE(save_optimizer_checkpoint(*e, again).is_ok());
  const SavedState a = saved_state(dir), b = saved_state(again);
  EXPECT_TRUE(a.duplicates_differ.empty()) << a.duplicates_differ.front();
  EXPECT_TRUE(b.duplicates_differ.empty()) << b.duplicates_differ.front();
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [k, bytes] : a.tensors) {
    ASSERT_TRUE(b.tensors.count(k)) << k;
    EXPECT_TRUE(b.tensors.at(k) == bytes) << k << " differs after the round trip";
  }
  for (const auto& [f, st] : b.step_count) EXPECT_EQ(st, "2") << f;
}

struct OneProcessCase {
  DType dt;
  bool reuse_a, reuse_b;
};

}  // namespace

TEST(OptimizerCheckpoint, OneProcessResumesBitForBit) {
  const io::ModelConfig cfg = tiny_config();
  for (OneProcessCase c : {OneProcessCase{DType::F32, false, false}, {DType::BF16, false, false},
                           {DType::BF16, true, true}, {DType::BF16, false, true}, {DType::BF16, true, false}}) {
    SCOPED_TRACE(std::string(dtype_name(c.dt)) + " reuse " + std::to_string(c.reuse_a) + " -> " +
                 std::to_string(c.reuse_b));
    auto ref = model::CausalLM::init_random(cfg, mopts(c.dt), 11);
    TrainingEngine eref(*ref, eopts(c.reuse_b));
    for (int s = 0; s < 3; ++s) train_whole(eref, s);

    auto a = model::CausalLM::init_random(cfg, mopts(c.dt), 11);
    TrainingEngine ea(*a, eopts(c.reuse_a));
    for (int s = 0; s < 2; ++s) train_whole(ea, s);
    const std::string dir = tmp_dir("one");
    ASSERT_TRUE(save_optimizer_checkpoint(ea, dir, {{"skipped_steps", "0"}, {"my_key", "v"}}).is_ok());
    EXPECT_TRUE(fs::exists(dir + "/optimizer_pp0.safetensors"));

    auto b = model::CausalLM::init_random(cfg, mopts(c.dt), 99);  // other weights: the checkpoint's replace them
    TrainingEngine eb(*b, eopts(c.reuse_b));
    copy_weights(*a, *b);  // what load_weights_into(model/) does
    std::map<std::string, std::string> md;
    const Status st = load_optimizer_checkpoint(eb, dir, &md);
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_EQ(md["my_key"], "v");
    EXPECT_EQ(md["step_count"], "2");
    EXPECT_EQ(eb.optimizer().step_count(), 2);
    EXPECT_EQ(weight_bytes(*b), weight_bytes(*a));
    expect_restored_exactly(dir, {&eb}, "one");
    train_whole(eb, 2);
    EXPECT_EQ(weight_bytes(*b), weight_bytes(*ref)) << "resumed run differs from the uninterrupted one";
  }
}

TEST(OptimizerCheckpoint, OldPerRankFormatStillLoadsInItsLayout) {
  const io::ModelConfig cfg = tiny_config();
  auto ref = model::CausalLM::init_random(cfg, mopts(DType::BF16), 3);
  TrainingEngine eref(*ref, eopts(false));
  for (int s = 0; s < 3; ++s) train_whole(eref, s);
  auto a = model::CausalLM::init_random(cfg, mopts(DType::BF16), 3);
  TrainingEngine ea(*a, eopts(false));
  for (int s = 0; s < 2; ++s) train_whole(ea, s);
  const std::string dir = tmp_dir("old");
  ASSERT_TRUE(ea.save_optimizer(dir + "/" + ea.optimizer_file_name()).is_ok());
  auto b = model::CausalLM::init_random(cfg, mopts(DType::BF16), 4);
  TrainingEngine eb(*b, eopts(false));
  copy_weights(*a, *b);
  std::map<std::string, std::string> md;
  const Status st = load_optimizer_checkpoint(eb, dir, &md);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(md["skipped_steps"], "0");
  train_whole(eb, 2);
  EXPECT_EQ(weight_bytes(*b), weight_bytes(*ref));

  // An old file of another layout only: refused, naming the format and the fix.
  const std::string other = tmp_dir("old_other");
  fs::copy_file(dir + "/optimizer.safetensors", other + "/optimizer_tp0_dp1.safetensors");
  const Status bad = load_optimizer_checkpoint(eb, other);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.message().find("old per-rank optimizer format"), std::string::npos) << bad.message();
  EXPECT_NE(bad.message().find("optimizer_tp0_dp1.safetensors"), std::string::npos) << bad.message();
  const Status none = load_optimizer_checkpoint(eb, tmp_dir("empty"));
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.message().find("no optimizer state"), std::string::npos) << none.message();
}

// PP2 -> PP1: both stages' files into one whole model.
TEST(OptimizerCheckpoint, PipelineTwoStagesResumeAsOne) {
  const io::ModelConfig cfg = tiny_config();
  for (auto [dt, reuse] : {std::pair{DType::F32, false}, std::pair{DType::BF16, false}, std::pair{DType::BF16, true}}) {
    SCOPED_TRACE(std::string(dtype_name(dt)) + (reuse ? " reuse" : ""));
    auto ref = model::CausalLM::init_random(cfg, mopts(dt), 21);
    TrainingEngine eref(*ref, eopts(reuse));
    for (int s = 0; s < 3; ++s) train_whole(eref, s);
    Pipe pref = make_pipe(cfg, mopts(dt), 21, eopts(reuse));  // PP2 throughout
    for (int s = 0; s < 3; ++s) train_pipe_step(pref, s);

    Pipe a = make_pipe(cfg, mopts(dt), 21, eopts(reuse));
    for (int s = 0; s < 2; ++s) train_pipe_step(a, s);
    const std::string dir = tmp_dir("pp2");
    ASSERT_TRUE(save_optimizer_checkpoint(*a.e0, dir).is_ok());
    ASSERT_TRUE(save_optimizer_checkpoint(*a.e1, dir).is_ok());
    EXPECT_TRUE(fs::exists(dir + "/optimizer_pp0.safetensors") && fs::exists(dir + "/optimizer_pp1.safetensors"));

    auto b = model::CausalLM::init_random(cfg, mopts(dt), 5);
    TrainingEngine eb(*b, eopts(reuse));
    copy_weights(*a.s0, *b);
    copy_weights(*a.s1, *b);
    const Status st = load_optimizer_checkpoint(eb, dir);
    ASSERT_TRUE(st.is_ok()) << st.message();
    expect_restored_exactly(dir, {&eb}, "pp2");
    train_whole(eb, 2);
    const ResumeDiff d = resume_diff(weights_by_name({b.get()}), weights_by_name({ref.get()}),
                                     weights_by_name({pref.s0.get(), pref.s1.get()}), dt);
    std::printf("[ measured ] PP2 -> PP1 %s%s: max relative weight difference %s\n", dtype_name(dt),
                reuse ? " reuse" : "", d.str().c_str());
    d.expect_close(dt);

    // Back into two stages (PP2 -> PP2 through the same files): bit for bit the uninterrupted PP2 run.
    Pipe c = make_pipe(cfg, mopts(dt), 6, eopts(reuse));
    copy_weights(*a.s0, *c.s0);
    copy_weights(*a.s1, *c.s1);
    ASSERT_TRUE(load_optimizer_checkpoint(*c.e0, dir).is_ok());
    ASSERT_TRUE(load_optimizer_checkpoint(*c.e1, dir).is_ok());
    train_pipe_step(c, 2);
    EXPECT_EQ(weights_by_name({c.s0.get(), c.s1.get()}), weights_by_name({pref.s0.get(), pref.s1.get()}));
  }
}

// PP1 -> PP2: one whole model's file into two slices.
TEST(OptimizerCheckpoint, PipelineOneStageResumesAsTwo) {
  const io::ModelConfig cfg = tiny_config();
  for (auto [dt, reuse] : {std::pair{DType::F32, false}, std::pair{DType::BF16, true}}) {
    SCOPED_TRACE(std::string(dtype_name(dt)) + (reuse ? " reuse" : ""));
    Pipe pref = make_pipe(cfg, mopts(dt), 31, eopts(reuse));
    for (int s = 0; s < 3; ++s) train_pipe_step(pref, s);
    auto wref = model::CausalLM::init_random(cfg, mopts(dt), 31);
    TrainingEngine ewref(*wref, eopts(reuse));
    for (int s = 0; s < 3; ++s) train_whole(ewref, s);

    auto a = model::CausalLM::init_random(cfg, mopts(dt), 31);
    TrainingEngine ea(*a, eopts(reuse));
    for (int s = 0; s < 2; ++s) train_whole(ea, s);
    const std::string dir = tmp_dir("pp1");
    ASSERT_TRUE(save_optimizer_checkpoint(ea, dir).is_ok());

    Pipe b = make_pipe(cfg, mopts(dt), 7, eopts(reuse));
    copy_weights(*a, *b.s0);
    copy_weights(*a, *b.s1);
    for (TrainingEngine* e : {b.e0.get(), b.e1.get()}) {
      const Status st = load_optimizer_checkpoint(*e, dir);
      ASSERT_TRUE(st.is_ok()) << st.message();
    }
    expect_restored_exactly(dir, {b.e0.get(), b.e1.get()}, "pp1");
    train_pipe_step(b, 2);
    const ResumeDiff d = resume_diff(weights_by_name({b.s0.get(), b.s1.get()}),
                                     weights_by_name({pref.s0.get(), pref.s1.get()}), weights_by_name({wref.get()}), dt);
    std::printf("[ measured ] PP1 -> PP2 %s%s: max relative weight difference %s\n", dtype_name(dt),
                reuse ? " reuse" : "", d.str().c_str());
    d.expect_close(dt);
  }
}

TEST(OptimizerCheckpoint, RefusalsNameTheFileAndTheFix) {
  const io::ModelConfig cfg = tiny_config();
  auto whole = model::CausalLM::init_random(cfg, mopts(DType::F32), 1);
  TrainingEngine ew(*whole, eopts(false));
  train_whole(ew, 0);
  const std::vector<uint8_t> before = weight_bytes(*whole);
  auto expect_refused = [&](TrainingEngine& e, const std::string& dir, std::initializer_list<const char*> parts) {
    const Status st = load_optimizer_checkpoint(e, dir);
    ASSERT_FALSE(st.is_ok());
    for (const char* p : parts) EXPECT_NE(st.message().find(p), std::string::npos) << st.message();
  };

  // A missing stage file.
  Pipe p = make_pipe(cfg, mopts(DType::F32), 1, eopts(false));
  train_pipe_step(p, 0);
  const std::string pp2 = tmp_dir("missing");
  ASSERT_TRUE(save_optimizer_checkpoint(*p.e0, pp2).is_ok());
  ASSERT_TRUE(save_optimizer_checkpoint(*p.e1, pp2).is_ok());
  fs::remove(pp2 + "/optimizer_pp1.safetensors");
  expect_refused(ew, pp2, {"optimizer_pp1.safetensors: missing", "2 pipeline stages", "restore the file"});
  EXPECT_EQ(ew.optimizer().step_count(), 1);  // a refused load changes nothing

  // A parameter in no file: stage 0's file of a one-stage "pipeline" (a slice that is not the whole model).
  model::ModelOptions o0 = mopts(DType::F32);
  o0.num_layers = 1;
  o0.has_head = false;
  auto s0 = model::CausalLM::init_random(cfg, o0, 1);
  TrainingEngine e0(*s0, eopts(false));
  const std::string part = tmp_dir("part");
  ASSERT_TRUE(save_optimizer_checkpoint(e0, part).is_ok());
  expect_refused(ew, part, {"'model.layers.1.", "in none of the optimizer files", "optimizer_pp0.safetensors",
                            "resume with the model it was saved from"});

  // Another model's shapes.
  io::ModelConfig wide = cfg;
  wide.intermediate_size = 48;
  auto other = model::CausalLM::init_random(wide, mopts(DType::F32), 1);
  TrainingEngine eo(*other, eopts(false));
  const std::string shp = tmp_dir("shape");
  ASSERT_TRUE(save_optimizer_checkpoint(eo, shp).is_ok());
  expect_refused(ew, shp, {"optimizer_pp0.safetensors", "f32[48, 16]", "another model", "resume with the model"});

  // Another weight dtype (f32 weights have no master in the file; bf16 ones need it).
  auto bf = model::CausalLM::init_random(cfg, mopts(DType::BF16), 1);
  TrainingEngine eb(*bf, eopts(false));
  const std::string f32dir = tmp_dir("f32");
  ASSERT_TRUE(save_optimizer_checkpoint(ew, f32dir).is_ok());
  expect_refused(eb, f32dir, {"optimizer_pp0.safetensors", "written for f32 weights", "weight dtype"});
  const std::string bfdir = tmp_dir("bf16");
  ASSERT_TRUE(save_optimizer_checkpoint(eb, bfdir).is_ok());
  expect_refused(ew, bfdir, {"optimizer_pp0.safetensors", "this model trains f32", "weight dtype"});
  EXPECT_EQ(weight_bytes(*whole), before);
}
