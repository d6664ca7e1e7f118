// The distributed optimizer's memory claim (use_distributed_optimizer): in
// bf16 mixed precision the optimizer state is 12 bytes per parameter (f32
// master 4 + exp_avg 4 + exp_avg_sq 4) in one process and 12/dp with the
// distributed optimizer, whose AdamW holds the f32 master only for its owned
// range; f32 training goes from 8 to 8/dp. The accounting (AdamW::memory()
// and the allocator's OptimizerState bytes) must show it, and the training
// must not change: after 3 AdamW steps on a tiny random bf16 model the DP
// parameters equal one process's, bit for bit with the same gradients and
// within the bf16 tolerance with real (differently batched) gradients.
// The world group is the dp group (dp = world size, tp = 1).
#include <cstdio>

#include "comm/world.h"
#include "model/parallel_setup.h"
#include "model/scoring.h"
#include "optim/adamw.h"
#include "parallel/data_parallel.h"
#include "tp_testing.h"

using namespace kestrel;
using namespace kestrel::testing;

namespace {

io::ModelConfig tiny_llama() {
  io::ModelConfig c;
  c.arch = io::Arch::Llama;
  c.model_type = "llama";
  c.vocab_size = 128;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-6;
  c.attention_bias = true;  // biases make the no-decay path and odd-sized params count
  c.o_proj_bias = true;
  c.mlp_bias = true;
  c.rope.head_dim = 16;
  c.rope.theta = 10000.0;
  return c;
}

std::unique_ptr<model::CausalLM> make_model(DType dt) {
  model::ModelOptions o;
  o.dtype = dt;
  return model::CausalLM::init_random(tiny_llama(), o, 1234, 0.05);
}

constexpr int kSteps = 3;
constexpr double kLr = 1e-3;
optim::AdamWConfig adamw_config() {
  optim::AdamWConfig c;
  c.eps = 1e-5;  // as tp_model_test: keeps exactly-zero gradients' summation noise from taking lr-sized steps
  return c;
}

int64_t live_state_bytes() { return cpu_allocator().stats().live_of(MemCategory::OptimizerState); }

// One process, bf16 with full masters, as the SFT/RL trainers build it. The
// full masters are allocated inside `mem_delta`'s window so the allocator
// delta covers everything the optimizer state costs.
std::unique_ptr<optim::AdamW> full_master_optimizer(model::CausalLM& m, int64_t* mem_delta) {
  const int64_t before = live_state_bytes();
  std::vector<optim::ParamSlot> slots;
  for (model::Param* p : m.params()) {
    optim::ParamSlot s{p->name, Tensor(), p->grad, Tensor(), p->weight_decay};
    if (p->weight.dtype() == DType::F32) {
      s.master = p->weight;
    } else {
      s.master = p->weight.to(DType::F32, MemCategory::OptimizerState);
      s.model_copy = p->weight;
    }
    slots.push_back(std::move(s));
  }
  auto opt = std::make_unique<optim::AdamW>(std::move(slots), adamw_config());
  *mem_delta = live_state_bytes() - before;
  return opt;
}

// The optimizer over DataParallel's flat space and owned range. Mixed
// precision: held masters with the distributed optimizer (the point of this
// test), full masters without it.
std::unique_ptr<optim::AdamW> dp_optimizer(model::CausalLM& m, parallel::DataParallel& dp, int64_t* mem_delta) {
  const int64_t before = live_state_bytes();
  std::vector<optim::ParamSlot> slots;
  for (const auto& p : dp.flat_params()) {
    optim::ParamSlot s{p.name, Tensor(), *p.grad, Tensor(), m.find_param(p.name)->weight_decay};
    if (p.weight->dtype() == DType::F32)
      s.master = *p.weight;
    else if (dp.options().distributed_optimizer)
      s.model_copy = *p.weight;  // master held by the optimizer for the owned range only
    else
      s.master = p.weight->to(DType::F32, MemCategory::OptimizerState), s.model_copy = *p.weight;
    slots.push_back(std::move(s));
  }
  auto [lo, hi] = dp.owned_range();
  auto opt = std::make_unique<optim::AdamW>(std::move(slots), adamw_config(), lo, hi);
  *mem_delta = live_state_bytes() - before;
  return opt;
}

// The accounting: AdamW::memory() against the allocator, and bytes/param
// against `full` (12 bf16, 8 f32) cut to 1/dp by the distributed optimizer.
void expect_state_bytes(const optim::AdamW& opt, int64_t mem_delta, double full, bool sharded, const char* what,
                        int dp) {
  auto& g = world_group();
  const optim::OptimizerMemory mem = opt.memory();
  EXPECT_EQ(mem_delta, mem.total_bytes()) << what << ": allocator OptimizerState bytes vs AdamW::memory()";
  const double per_param = mem.bytes_per_param();
  if (!sharded) {
    EXPECT_DOUBLE_EQ(per_param, full) << what << ": " << mem.to_string();
  } else {
    const int n = g.size();
    // Exactly the owned fraction; the owned range is a 1/dp shard of the
    // padded flat space, clipped to the real parameters.
    EXPECT_DOUBLE_EQ(per_param, full * double(mem.owned) / double(mem.params)) << what << ": " << mem.to_string();
    EXPECT_NEAR(per_param, full / n, full * n / double(mem.params)) << what << ": " << mem.to_string();
    // Over all ranks the shards add up to one full copy of the state.
    EXPECT_EQ(global_sum(g, double(mem.total_bytes())), full * double(mem.params)) << what;
  }
  if (g.rank() == 0)
    std::printf("[ memory ] %-28s dp=%d: %s\n", what, dp, mem.to_string().c_str());
}

// Gradients identical on every rank and exactly representable in bf16, so
// averaging over dp = 2 or 4 (g/dp summed dp times) reproduces them exactly.
float synth_grad(size_t param, int64_t k, int step) {
  return round_bf16(0.05f * uniform_value(7000 + 31 * uint64_t(step) + uint64_t(param), 0, k));
}

int64_t bf16_mismatches(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  const auto* x = static_cast<const uint16_t*>(a.raw());
  const auto* y = static_cast<const uint16_t*>(b.raw());
  int64_t bad = 0;
  for (int64_t i = 0; i < a.numel(); ++i) bad += x[i] != y[i];
  return bad;
}

// This rank's sequences (i % dp == rank) and the whole batch's token count.
const std::vector<std::vector<int32_t>>& sequences() {
  static const std::vector<std::vector<int32_t>> seqs = [] {
    const std::vector<int64_t> lens = {7, 12, 3, 9, 5, 10, 4, 8};
    std::vector<std::vector<int32_t>> s;
    for (size_t q = 0; q < lens.size(); ++q) {
      std::vector<int32_t> t;
      for (int64_t j = 0; j < lens[q]; ++j) t.push_back(int32_t((q * 37 + size_t(j) * 11 + size_t(j * j) * 5) % 128));
      s.push_back(t);
    }
    return s;
  }();
  return seqs;
}
int64_t counted_tokens() {
  int64_t n = 0;
  for (const auto& s : sequences()) n += int64_t(s.size()) - 1;
  return n;
}

// Backward of -scale/N * sum of next-token logprobs (N: counted tokens of the whole batch).
void sft_backward(model::CausalLM& m, const model::PackedBatch& b, float scale) {
  const int64_t T = b.num_tokens;
  model::Activations acts;
  Tensor logits = m.forward(b, acts);
  Tensor lp = Tensor::empty({T}, DType::F32), lse = Tensor::empty({T}, DType::F32);
  model::logprob_entropy_fwd(m, logits, b.targets, lp, nullptr, lse);
  Tensor dlp = Tensor::zeros({T}, DType::F32);
  const int32_t* tg = b.targets.data<int32_t>();
  for (int64_t t = 0; t < T; ++t)
    if (tg[t] >= 0) dlp.set(t, -scale / float(counted_tokens()));
  Tensor dlogits = Tensor::empty(logits.shape(), DType::F32);
  model::logprob_entropy_bwd(m, logits, b.targets, lse, dlp, nullptr, nullptr, dlogits);
  m.backward(b, acts, dlogits);
}

}  // namespace

// Same gradients everywhere: the held-master DP run must reproduce one
// process bit for bit, and hold 12/dp bytes of optimizer state per parameter.
TEST(DistOpt, Bf16HeldMastersBitIdenticalWithSameGrads) {
  auto& g = world_group();
  if ((g.size() & (g.size() - 1)) != 0) GTEST_SKIP() << "exact averaging needs a power-of-two dp";
  auto ref = make_model(DType::BF16);
  ref->enable_grads();
  int64_t ref_bytes = 0;
  auto ref_opt = full_master_optimizer(*ref, &ref_bytes);
  expect_state_bytes(*ref_opt, ref_bytes, 12.0, false, "bf16 one process", 1);

  auto m = make_model(DType::BF16);
  parallel::DpOptions o;
  o.distributed_optimizer = true;
  o.bucket_bytes = 16 << 10;
  parallel::DataParallel dp(model::dp_params(*m), g, o);
  int64_t dp_bytes = 0;
  auto opt = dp_optimizer(*m, dp, &dp_bytes);
  EXPECT_TRUE(opt->holds_masters());
  expect_state_bytes(*opt, dp_bytes, 12.0, true, "bf16 distributed optimizer", g.size());

  const auto params = ref->params();
  for (int s = 0; s < kSteps; ++s) {
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor& rg = params[i]->grad;
      Tensor& dg = m->find_param(params[i]->name)->grad;
      for (int64_t k = 0; k < rg.numel(); ++k) rg.set(k, synth_grad(i, k, s)), dg.set(k, synth_grad(i, k, s));
    }
    ref_opt->step(kLr);
    dp.finish_grad_sync();
    opt->step(kLr);
    dp.gather_params();
  }
  int64_t bad = 0, total = 0;
  for (model::Param* p : m->params()) {
    const int64_t b = bf16_mismatches(p->weight, ref->find_param(p->name)->weight);
    EXPECT_EQ(b, 0) << p->name;
    bad += b, total += p->weight.numel();
  }
  EXPECT_EQ(bad, 0) << "of " << total;
}

// Real forward/backward: each rank scores its own sequences, so bf16 GEMMs and
// the gradient sums differ from one process in rounding. Parameters after 3
// steps must agree within the bf16 tolerance, with the distributed optimizer
// (12/dp bytes/param) and without it (12).
TEST(DistOpt, Bf16ModelThreeStepsMatchesOneProcess) {
  auto& g = world_group();
  const int n = g.size();
  auto ref = make_model(DType::BF16);
  ref->enable_grads();
  int64_t ref_bytes = 0;
  auto ref_opt = full_master_optimizer(*ref, &ref_bytes);
  const model::PackedBatch all = model::pack_sequences(sequences());
  for (int s = 0; s < kSteps; ++s) {
    ref->zero_grads();
    sft_backward(*ref, all, 1.0f);
    ref_opt->step(kLr);
  }
  std::vector<std::vector<int32_t>> mine;
  for (size_t q = 0; q < sequences().size(); ++q)
    if (int(q % size_t(n)) == g.rank()) mine.push_back(sequences()[q]);
  const model::PackedBatch b = model::pack_sequences(mine);

  for (bool dist : {true, false}) {
    auto m = make_model(DType::BF16);
    parallel::DpOptions o;
    o.distributed_optimizer = dist;
    o.bucket_bytes = 16 << 10;
    parallel::DataParallel dp(model::dp_params(*m), g, o);
    m->set_grad_ready_hook([&](int64_t stage) { dp.grads_ready(stage); });
    int64_t bytes = 0;
    auto opt = dp_optimizer(*m, dp, &bytes);
    EXPECT_EQ(opt->holds_masters(), dist);
    expect_state_bytes(*opt, bytes, 12.0, dist, dist ? "bf16 distributed optimizer" : "bf16 dp, all-reduce", n);
    for (int s = 0; s < kSteps; ++s) {
      dp.zero_grads();
      dp.start_grad_sync();
      sft_backward(*m, b, float(n));  // grads are averaged over dp: each rank's loss carries a factor dp
      dp.finish_grad_sync();
      opt->step(kLr);
      dp.gather_params();
    }
    int64_t same = 0, total = 0;
    for (model::Param* p : m->params()) {
      const Tensor& w = ref->find_param(p->name)->weight;
      EXPECT_TRUE(all_close(to_double(p->weight), to_double(w), tolerance_for(DType::BF16), p->name))
          << (dist ? "distributed optimizer" : "all-reduce");
      same += p->weight.numel() - bf16_mismatches(p->weight, w);
      total += p->weight.numel();
    }
    if (g.rank() == 0)
      std::printf("[ params ] bf16 dp=%d %s: %lld of %lld parameters bit-identical to one process after %d steps\n",
                  n, dist ? "distributed optimizer" : "all-reduce", (long long)same, (long long)total, kSteps);
  }
}

// f32 training: the weights are the masters, so the state is m and v: 8 bytes
// per parameter, 8/dp with the distributed optimizer.
TEST(DistOpt, F32StateBytesPerParam) {
  auto& g = world_group();
  auto ref = make_model(DType::F32);
  ref->enable_grads();
  int64_t ref_bytes = 0;
  auto ref_opt = full_master_optimizer(*ref, &ref_bytes);
  EXPECT_FALSE(ref_opt->holds_masters());
  expect_state_bytes(*ref_opt, ref_bytes, 8.0, false, "f32 one process", 1);
  for (bool dist : {true, false}) {
    auto m = make_model(DType::F32);
    parallel::DpOptions o;
    o.distributed_optimizer = dist;
    parallel::DataParallel dp(model::dp_params(*m), g, o);
    int64_t bytes = 0;
    auto opt = dp_optimizer(*m, dp, &bytes);
    EXPECT_FALSE(opt->holds_masters());
    expect_state_bytes(*opt, bytes, 8.0, dist, dist ? "f32 distributed optimizer" : "f32 dp, all-reduce", g.size());
  }
}
