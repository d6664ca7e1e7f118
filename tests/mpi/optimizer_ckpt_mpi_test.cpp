// The layout-independent optimizer checkpoint (train/optimizer_checkpoint.h)
// under mpirun -np 2: 2 AdamW steps in layout A, save (weights with
// CausalLM::save, the optimizer with save_optimizer_checkpoint), load into
// layout B, 1 more step, against an uninterrupted 3-step run of layout B.
//   TP2 -> TP1, TP1 -> TP2 (a model with one kv head, replicated on both tp
//   ranks, and a vocabulary of 25 that tp 2 pads), DP2 + distributed
//   optimizer -> DP1, DP1 -> DP2 + distributed optimizer (f32, bf16, bf16
//   with reuse_fp32_param), and the same layout both sides (TP2 -> TP2, DP2 +
//   distributed optimizer -> same).
// Every case: the restored state, saved again in layout B, is the saved file
// bit for bit (the criterion "bit for bit in what it restores"). Same layout:
// the resumed weights equal the uninterrupted run's bit for bit. Across
// layouts the first two steps themselves differ (TP's partial sums of the
// row-parallel GEMMs and DP's packing of the sequences into other
// micro-batches change the f32 rounding, and AdamW's normalisation carries
// that into the updates), so the resumed weights are compared with 1e-4
// relative to each tensor's scale for f32 (measured up to 4e-5 for TP, 5e-7
// for DP) and 1e-2 for bf16 (one bf16 ulp of a weight); the measured
// differences are printed next to the two layouts' own. A misplaced shard,
// owned range or master moves weights by about lr = 1e-2 relative: far
// outside these bounds.
// Run by tests/scripts/mpi_optimizer_ckpt.sh.
#include <unistd.h>

#include <cstdio>

#include "mpi_testing.h"
#include "train/optimizer_checkpoint_testing.h"

using namespace kestrel;
using namespace kestrel::testing;
using namespace kestrel::train;
using namespace kestrel::train::engine_testing;
using namespace kestrel::train::ckpt_testing;

namespace {

std::shared_ptr<comm::ProcessGroup> world_ptr() { return comm::World::current()->group(); }

// One folder every rank sees (rank 0's pid names it).
std::string shared_dir(const std::string& name) {
  comm::ProcessGroup& w = world_group();
  int32_t pid = int32_t(::getpid());
  w.broadcast(&pid, 1, DType::I32, 0);
  const auto d = fs::temp_directory_path() / ("kestrel_optckpt_mpi_" + std::to_string(pid)) / name;
  if (w.rank() == 0) {
    fs::remove_all(d);
    fs::create_directories(d);
  }
  w.barrier();
  return d.string();
}

// One kv head (replicated over tp 2) and 25 tokens (padded to 256 rows under tp 2).
io::ModelConfig tp_config() {
  const std::string j = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 25,
    "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 1, "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
    "eos_token_id": 1})";
  return io::parse_model_config(j, "test").value();
}

model::ModelOptions mopts(DType dt, bool tp) {
  model::ModelOptions o;
  o.dtype = dt;
  if (tp) o.parallel.tp = world_ptr();
  return o;
}

EngineOptions eopts(bool reuse, bool dp, bool dist) {
  EngineOptions o = options(0.0);
  o.reuse_fp32_param = reuse;
  if (dp) {
    o.parallel.dp = world_ptr();
    o.parallel.distributed_optimizer = dist;
  }
  return o;
}

// Step s: 6 sequences; under dp each rank trains those with i % dp == rank
// (gradients summed over dp, the objective's denominator the whole batch's).
void train(TrainingEngine& e, int s) {
  const auto all = sequences(6, s);
  std::vector<std::vector<int32_t>> mine;
  comm::ProcessGroup& dp = e.dp_group();
  for (size_t q = 0; q < all.size(); ++q)
    if (int(q % size_t(dp.size())) == dp.rank()) mine.push_back(all[q]);
  const MiniBatchResult r = e.train_mini_batch(split(mine, 2), mean_nll(all), e.lr(s), s + 1);
  EXPECT_TRUE(r.finite);
}

// The full weights of a (possibly tp-sharded) model, by name (collective over its tp group).
std::map<std::string, std::vector<uint8_t>> full_weights(const model::CausalLM& m) {
  std::map<std::string, std::vector<uint8_t>> out;
  for (const model::Param* p : const_cast<model::CausalLM&>(m).params()) {
    const Tensor t = m.full_tensor(*p);
    std::vector<uint8_t> b(t.nbytes());
    std::memcpy(b.data(), t.raw(), b.size());
    out.emplace(p->name, std::move(b));
  }
  return out;
}

struct Layout {
  bool tp = false, dp = false, dist = false;
  std::string name() const {
    return tp ? "TP2" : dp ? (dist ? "DP2+distopt" : "DP2") : "one process";
  }
  bool parallel() const { return tp || dp; }
};

// A in layout a for 2 steps, save, B in layout b, load, re-save (bit for bit), 1 step, against b's 3-step run.
void resume_case(const io::ModelConfig& cfg, Layout a, Layout b, DType dt, bool reuse) {
  comm::ProcessGroup& w = world_group();
  const std::string what = a.name() + " -> " + b.name() + " " + dtype_name(dt) + (reuse ? " reuse" : "");
  SCOPED_TRACE(what);
  auto ref = model::CausalLM::init_random(cfg, mopts(dt, b.tp), 17);
  TrainingEngine eref(*ref, eopts(reuse, b.dp, b.dist));
  for (int s = 0; s < 3; ++s) train(eref, s);

  const std::string dir = shared_dir("a");
  std::map<std::string, std::vector<uint8_t>> ref_a;  // layout a's own 3-step run (for the printed context)
  {
    auto ma = model::CausalLM::init_random(cfg, mopts(dt, a.tp), 17);
    TrainingEngine ea(*ma, eopts(reuse, a.dp, a.dist));
    for (int s = 0; s < 2; ++s) train(ea, s);
    // The weights: tp gathers them, one rank writes. A one-process layout runs
    // on every rank identically; rank 0 writes.
    if (a.tp || w.rank() == 0) {
      EXPECT_TRUE(ma->save(dir + "/model", dt).is_ok());
    }
    if (a.parallel() || w.rank() == 0) {
      const Status st = save_optimizer_checkpoint(ea, dir, {{"skipped_steps", "0"}});
      EXPECT_TRUE(st.is_ok()) << st.message();
    }
    w.barrier();
    train(ea, 2);
    ref_a = full_weights(*ma);
  }

  auto loaded = model::CausalLM::load(dir + "/model", mopts(dt, b.tp));
  EXPECT_TRUE(loaded.is_ok()) << loaded.status().message();
  if (!loaded.is_ok()) return;  // the same on every rank
  auto mb = std::move(loaded).value();
  TrainingEngine eb(*mb, eopts(reuse, b.dp, b.dist));
  std::map<std::string, std::string> md;
  const Status st = load_optimizer_checkpoint(eb, dir, &md);
  EXPECT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(eb.optimizer().step_count(), 2);
  EXPECT_EQ(md["skipped_steps"], "0");

  // Re-saved in layout b: bit for bit the file of layout a.
  const std::string again = b.parallel() ? shared_dir("b") : tmp_dir("b_rank" + std::to_string(w.rank()));
  const Status st2 = save_optimizer_checkpoint(eb, again);
  EXPECT_TRUE(st2.is_ok()) << st2.message();
  w.barrier();
  const SavedState sa = saved_state(dir), sb = saved_state(again);
  EXPECT_EQ(sa.tensors.size(), sb.tensors.size());
  size_t differ = 0;
  for (const auto& [k, bytes] : sa.tensors)
    if (!sb.tensors.count(k) || sb.tensors.at(k) != bytes) {
      if (differ++ < 3) ADD_FAILURE() << k << " differs after " << what;
    }
  EXPECT_EQ(differ, 0u);

  train(eb, 2);
  const auto got = full_weights(*mb), want = full_weights(*ref);
  if (a.tp == b.tp && a.dp == b.dp && a.dist == b.dist) {
    EXPECT_TRUE(got == want) << "same layout: the resumed weights differ from the uninterrupted run";
  } else {
    const double rel = max_rel_diff(got, want, dt), layouts = max_rel_diff(ref_a, want, dt);
    if (w.rank() == 0)
      std::printf("[ measured ] %s: max relative weight difference to the uninterrupted run of the new layout %.3g "
                  "(the two layouts' uninterrupted runs: %.3g)\n", what.c_str(), rel, layouts);
    EXPECT_LE(rel, dt == DType::F32 ? 1e-4 : 1e-2);
  }
  w.barrier();
}

const Layout kOne{}, kTp{true, false, false}, kDist{false, true, true};

}  // namespace

TEST(OptimizerCkptMpi, TensorParallelResumesAcrossLayouts) {
  ASSERT_EQ(world_group().size(), 2) << "run with mpirun -np 2";
  const io::ModelConfig cfg = tp_config();
  for (auto [dt, reuse] : {std::pair{DType::F32, false}, std::pair{DType::BF16, false}, std::pair{DType::BF16, true}}) {
    resume_case(cfg, kTp, kOne, dt, reuse);
    resume_case(cfg, kOne, kTp, dt, reuse);
  }
  resume_case(cfg, kTp, kTp, DType::BF16, false);
}

TEST(OptimizerCkptMpi, DistributedOptimizerResumesAcrossLayouts) {
  ASSERT_EQ(world_group().size(), 2) << "run with mpirun -np 2";
  const io::ModelConfig cfg = tiny_config();
  for (auto [dt, reuse] : {std::pair{DType::F32, false}, std::pair{DType::BF16, false}, std::pair{DType::BF16, true}}) {
    resume_case(cfg, kDist, kOne, dt, reuse);
    resume_case(cfg, kOne, kDist, dt, reuse);
  }
  resume_case(cfg, kDist, kDist, DType::BF16, true);
  resume_case(cfg, kDist, kDist, DType::F32, false);
}
