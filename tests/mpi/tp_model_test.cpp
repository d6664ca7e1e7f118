// The acceptance tests for the model under TP / SP / DP / the
// distributed optimizer: 3 AdamW steps (with global grad-norm clipping) on a
// tiny random model built in code must give the per-token logprobs, the loss,
// the grad norm, the reassembled gradients and the reassembled parameters of
// one process, fp32 within 1e-5 relative. The single-process reference runs
// on every rank. The layout follows the world size: tp as named, dp = world/tp
// (so under -np 4 "Tp2" is TP2 x DP2).
#include <unistd.h>

#include <filesystem>

#include "comm/world.h"
#include "model/parallel_setup.h"
#include "model/scoring.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "parallel/balance.h"
#include "parallel/setup.h"
#include "tp_testing.h"

using namespace kestrel;
using namespace kestrel::testing;

namespace {

io::ModelConfig tiny_config(const std::string& kind) {
  io::ModelConfig c;
  c.arch = kind == "qwen3" ? io::Arch::Qwen3 : kind == "qwen2" ? io::Arch::Qwen2 : io::Arch::Llama;
  c.model_type = kind;
  c.vocab_size = 128;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = kind == "qwen3";
  c.attention_bias = kind != "qwen3";  // qwen2: q/k/v biases; llama: also o_proj bias
  c.o_proj_bias = kind == "llama";
  c.mlp_bias = kind == "llama";        // row-parallel down_proj bias
  c.qk_norm = kind == "qwen3";
  c.rope.head_dim = 16;
  c.rope.theta = 10000.0;
  return c;
}

// 57 tokens: odd, so sequence parallelism must pad (to 58 or 60 rows).
const std::vector<int64_t> kLens = {7, 12, 3, 9, 5, 10, 4, 7};
std::vector<std::vector<int32_t>> all_sequences() {
  std::vector<std::vector<int32_t>> seqs;
  for (size_t s = 0; s < kLens.size(); ++s) {
    std::vector<int32_t> q;
    for (int64_t j = 0; j < kLens[s]; ++j) q.push_back(int32_t((s * 37 + size_t(j) * 11 + size_t(j * j) * 5) % 128));
    seqs.push_back(q);
  }
  return seqs;
}
int64_t counted_tokens() {
  int64_t n = 0;
  for (int64_t l : kLens) n += l - 1;
  return n;
}

constexpr int kSteps = 3;
constexpr double kLr = 1e-3, kMaxNorm = 1.0, kEntCoef = 0.01;

// Adam divides by sqrt(v): a gradient that is zero in exact arithmetic (the
// k_proj bias: softmax is invariant to a shift shared by a query's scores) is
// fp32 summation noise of ~1e-10 whose sign differs between layouts, and with
// eps = 1e-8 that noise becomes a full lr-sized step. eps = 1e-5 bounds this
// amplification (~lr * noise / eps) far below the 1e-5 criterion while every
// real gradient (1e-4 .. 1e-1 here) still takes Adam-sized steps.
optim::AdamWConfig adamw_config() {
  optim::AdamWConfig c;
  c.eps = 1e-5;
  return c;
}

// init_random zeroes biases; random ones make them count in the comparisons.
void randomize_biases(model::CausalLM& m) {
  uint64_t i = 0;
  for (model::Param* p : m.params()) {
    ++i;
    if (p->name.find(".bias") == std::string::npos) continue;
    Tensor full = rand_full(p->full_shape, 500 + i, 0.05f);
    p->weight = parallel::shard_tensor(full, p->shard, m.tp().rank(), m.tp().size(), p->name);
  }
}

struct StepOut {
  double loss = 0, norm = 0;
  std::vector<std::vector<float>> logprobs;  // per sequence (ids of all_sequences())
};

// Loss = -sum_t w * logprob_t - kEntCoef * sum_t w * entropy_t with
// w = scale / (counted tokens of the whole batch): an SFT term plus an entropy
// bonus, so both backward paths of the token scores are exercised.
double step_forward_backward(model::CausalLM& m, const model::PackedBatch& b, float scale, StepOut& out,
                             const std::vector<size_t>& seq_ids) {
  const int64_t T = b.num_tokens;
  model::Activations acts;
  Tensor logits = m.forward(b, acts);
  Tensor lp = Tensor::empty({T}, DType::F32), ent = Tensor::empty({T}, DType::F32), lse = Tensor::empty({T}, DType::F32);
  model::logprob_entropy_fwd(m, logits, b.targets, lp, &ent, lse);
  Tensor dlp = Tensor::zeros({T}, DType::F32), dent = Tensor::zeros({T}, DType::F32);
  const float w = scale / float(counted_tokens());
  double loss = 0;
  const int32_t* tg = b.targets.data<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    if (tg[t] < 0) continue;
    loss -= double(w) * (double(lp.get(t)) + kEntCoef * double(ent.get(t)));
    dlp.set(t, -w);
    dent.set(t, float(-w * kEntCoef));
  }
  const int32_t* cu = b.cu_seqlens.data<int32_t>();
  for (size_t s = 0; s < seq_ids.size(); ++s) {
    auto& dst = out.logprobs[seq_ids[s]];
    dst.assign(lp.data<float>() + cu[s], lp.data<float>() + cu[s + 1]);
  }
  Tensor dlogits = Tensor::empty(logits.shape(), DType::F32);
  model::logprob_entropy_bwd(m, logits, b.targets, lse, dlp, &dent, &ent, dlogits);
  m.backward(b, acts, dlogits);
  return loss;
}

struct Reference {
  std::unique_ptr<model::CausalLM> model;
  std::vector<StepOut> steps;
};

Reference run_reference(const io::ModelConfig& cfg) {
  Reference r;
  r.model = model::CausalLM::init_random(cfg, {}, 1234, 0.05);
  auto& m = *r.model;
  randomize_biases(m);
  m.enable_grads();
  std::vector<optim::ParamSlot> slots;
  for (model::Param* p : m.params()) slots.push_back({p->name, p->weight, p->grad, Tensor(), p->weight_decay});
  optim::AdamW opt(slots, adamw_config());
  const auto seqs = all_sequences();
  std::vector<size_t> ids(seqs.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  model::PackedBatch b = model::pack_sequences(seqs);
  for (int s = 0; s < kSteps; ++s) {
    StepOut out;
    out.logprobs.resize(seqs.size());
    m.zero_grads();
    out.loss = step_forward_backward(m, b, 1.0f, out, ids);
    out.norm = optim::clip_grad_norm(opt.params(), kMaxNorm).norm;
    opt.step(kLr);
    r.steps.push_back(std::move(out));
  }
  return r;
}

struct Layout {
  int tp = 1;
  bool sp = false, dist_opt = false;
  std::string config = "qwen2";
};

void run_layout(const Layout& L) {
  comm::World& world = *comm::World::current();
  if (world.size() % L.tp != 0) GTEST_SKIP() << "world size " << world.size() << " does not fit tp " << L.tp;
  const io::ModelConfig cfg = tiny_config(L.config);
  const Reference ref = run_reference(cfg);

  auto grid_r = parallel::make_process_grid(world, parallel::dims_for(L.tp, L.sp), model::model_facts(cfg));
  ASSERT_TRUE(grid_r.is_ok()) << grid_r.status().message();  // same outcome on every rank
  parallel::ProcessGrid& grid = *grid_r.value();
  comm::ProcessGroup& tp = grid.tp();
  comm::ProcessGroup& dpg = grid.dp();
  model::ModelOptions opts;
  opts.parallel = model::model_parallel_for(grid);
  auto mp = model::CausalLM::init_random(cfg, opts, 1234, 0.05);
  auto& m = *mp;
  randomize_biases(m);
  EXPECT_EQ(m.sequence_parallel(), L.sp && L.tp > 1);

  parallel::DpOptions dpo;
  dpo.distributed_optimizer = L.dist_opt;
  dpo.bucket_bytes = 16 << 10;  // several buckets even for the tiny model
  parallel::DataParallel dp(model::dp_params(m), dpg, dpo);
  m.set_grad_ready_hook([&](int64_t stage) { dp.grads_ready(stage); });
  std::vector<optim::ParamSlot> slots;
  for (const auto& p : dp.flat_params()) {
    const model::Param* mpar = m.find_param(p.name);
    slots.push_back({p.name, *p.weight, *p.grad, Tensor(), mpar->weight_decay});
  }
  auto [lo, hi] = dp.owned_range();
  const int64_t state_before = cpu_allocator().stats().live_of(MemCategory::OptimizerState);
  optim::AdamW opt(slots, adamw_config(), lo, hi);
  const int64_t state_bytes = cpu_allocator().stats().live_of(MemCategory::OptimizerState) - state_before;
  // f32 training: the optimizer state is m and v, 8 bytes per parameter of
  // this rank's model shard, cut to 8/dp by the distributed optimizer.
  const double per_param = double(state_bytes) / double(dp.numel());
  const double want_per_param = L.dist_opt ? 8.0 * double(hi - lo) / double(dp.numel()) : 8.0;
  EXPECT_DOUBLE_EQ(per_param, want_per_param);
  if (L.dist_opt) {
    EXPECT_NEAR(per_param, 8.0 / dpg.size(), 8.0 * dpg.size() / double(dp.numel()));
  }
  if (world.rank() == 0)
    std::printf("[ layout ] %s tp=%d dp=%d sp=%d dist_opt=%d: %.3f optimizer-state bytes/param (%lld params/rank)\n",
                L.config.c_str(), tp.size(), dpg.size(), int(m.sequence_parallel()), int(L.dist_opt), per_param,
                (long long)dp.numel());

  // This dp rank's sequences, balanced by tokens as verl's balance_batch does.
  const auto seqs = all_sequences();
  const auto order = parallel::balance_batch_order(kLens, dpg.size());
  const size_t per = seqs.size() / size_t(dpg.size());
  std::vector<size_t> mine;
  std::vector<std::vector<int32_t>> my_seqs;
  for (size_t i = 0; i < per; ++i) {
    mine.push_back(size_t(order[size_t(dpg.rank()) * per + i]));
    my_seqs.push_back(seqs[mine.back()]);
  }
  model::PackedBatch b = model::pack_sequences(my_seqs);

  for (int s = 0; s < kSteps; ++s) {
    StepOut out;
    out.logprobs.resize(seqs.size());
    dp.zero_grads();
    dp.start_grad_sync();
    // Gradients are averaged over dp, so each rank's loss carries a factor dp.
    const double local = step_forward_backward(m, b, float(dpg.size()), out, mine);
    dp.finish_grad_sync();
    const double loss = parallel::sum_over(dpg, local) / dpg.size();
    const double norm = dp.clip_grad_norm(kMaxNorm, &tp);
    opt.step_range(lo, hi, kLr);
    dp.gather_params();

    const StepOut& want = ref.steps[size_t(s)];
    EXPECT_NEAR(loss, want.loss, 1e-5 * std::abs(want.loss)) << "step " << s;
    EXPECT_NEAR(norm, want.norm, 1e-5 * want.norm) << "step " << s;
    for (size_t q : mine) {
      const auto& g = out.logprobs[q];
      const auto& w = want.logprobs[q];
      ASSERT_EQ(g.size(), w.size());
      EXPECT_LE(rel_to_scale(std::vector<double>(g.begin(), g.end()), std::vector<double>(w.begin(), w.end())),
                kTpTol)
          << "step " << s << " logprobs of sequence " << q;
    }
  }
  // Gradients of the last step (after clipping) and parameters after 3 steps.
  dp.gather_grads();
  auto& rm = *ref.model;
  for (model::Param* p : m.params()) {
    const model::Param* rp = rm.find_param(p->name);
    ASSERT_NE(rp, nullptr) << p->name;
    Tensor g = parallel::gather_tensor(tp, p->grad, p->shard, p->full_shape);
    EXPECT_CLOSE(g, rp->grad, "grad of " + p->name);
    EXPECT_CLOSE(m.full_tensor(*p), rp->weight, "weight of " + p->name);
  }

  // save() gathers HF-shaped tensors to tp rank 0 (one dp replica writes).
  // Named after rank 0's pid: other mpi_tests runs (ctest runs the scripts in
  // parallel) must not share the folder.
  int64_t pid = ::getpid();
  world.group()->broadcast(&pid, 1, DType::I64, 0);
  const std::string dir =
      std::filesystem::temp_directory_path().string() + "/kestrel_tp_save_" + L.config + "_" + std::to_string(pid);
  if (grid.coords().dp == 0) {
    Status st = m.save(dir, DType::F32);
    EXPECT_TRUE(st.is_ok()) << st.message();
  }
  world.group()->barrier();
  auto loaded = model::CausalLM::load(dir, {});
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  for (model::Param* p : loaded.value()->params())
    EXPECT_CLOSE(p->weight, rm.find_param(p->name)->weight, "saved " + p->name);
  world.group()->barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace

TEST(TpModel, Tp2) { run_layout({2, false, false, "qwen2"}); }
TEST(TpModel, Tp2SequenceParallel) { run_layout({2, true, false, "llama"}); }
TEST(TpModel, Tp2SequenceParallelQkNormTied) { run_layout({2, true, false, "qwen3"}); }
TEST(TpModel, Dp) { run_layout({1, false, false, "qwen2"}); }
TEST(TpModel, DpDistributedOptimizer) { run_layout({1, false, true, "llama"}); }
TEST(TpModel, Tp2DistributedOptimizer) { run_layout({2, true, true, "qwen3"}); }
// All ranks in one tp group: with 4 ranks the 2 kv heads are replicated.
TEST(TpModel, TpWorldSequenceParallel) {
  run_layout({comm::World::current()->size(), true, false, "qwen3"});
}
