// The rollout engine with its model on the device (ModelOptions::device =
// cuda): the KV cache, every step buffer and the step's index tensors live
// there, the sampler reads the logits back. The same model on the CPU is the
// reference: greedy and seeded-sampled tokens equal, log-probs within the
// arithmetic's tolerance (the GEMMs and reductions differ in order, so not
// bit for bit), over prefix caching, chunked prefill, swap preemption and
// forks, for a tiny Llama (f32, bf16), a MoE model with the routing cache
// (router replay R3) and an MLA model (the latent cache). Runs on a GPU
// (the cuda preset) and on the CPU emulator (cuda-emu); skipped where neither is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "core/device_hooks.h"
#include "rollout/engine.h"
#include "rollout/kv_cache.h"
#include "rollout/model_runner.h"
#include "rollout/reshard.h"
#include "rollout/weight_sync.h"
#include "../rollout/moe_models.h"
#include "../rollout/same_outputs.h"
#include "device_models.h"
#include "../rollout/tiny_model.h"

using namespace kestrel;
using namespace kestrel::rollout;
namespace rt = kestrel::rollout::testing;
using rt::run;
using rt::RunOut;
using rt::golden_on;
using rt::greedy;
using rt::sampled;
using rt::tiny_on;
class RolloutOnDevice : public rt::DeviceTest {};

namespace {

// Log-prob tolerance: logprob = z - lse with z the token's logit and lse the
// row's log-sum-exp (f32). The device sums the GEMMs and the attention in
// another order, so every logit differs by rounding noise:
//  - f32: a few units of 2^-24 relative per reduction, grown over the layers
//    to ~1e-6 of the logit scale (|z| of a few units here), and lse inherits
//    the same; 1e-5 * max(1, |logprob|) leaves an order of magnitude.
//  - bf16: the logits and the activations between ops are rounded to bf16
//    (8 significant bits: ulp(x) = 2^(floor(log2 |x|) - 7)), so the two
//    backends' logits may sit an ulp or two apart, and an activation rounded
//    the other way moves the next layer's sums by about as much: four ulps of
//    the largest logit (0.0625 at the tiny model's 3.7).
double lp_tol(DType dt, double logprob, double logit_scale) {
  if (dt == DType::F32) return 1e-5 * std::max(1.0, std::abs(logprob));
  return 4.0 * std::ldexp(1.0, std::ilogb(std::max(1.0, logit_scale)) - 7);
}

// Same ids, tokens, finish reasons, routing rows and (with counts) the same
// scheduler history; log-probs within lp_tol. Returns the largest log-prob
// difference seen.
double expect_same(const RunOut& cpu, const RunOut& dev, DType dt, double logit_scale, const std::string& what) {
  double worst = 0;
  EXPECT_EQ(cpu.outs.size(), dev.outs.size()) << what;
  if (cpu.outs.size() != dev.outs.size()) return worst;
  for (size_t i = 0; i < cpu.outs.size(); ++i) {
    const RequestOutput &a = cpu.outs[i], &b = dev.outs[i];
    EXPECT_EQ(a.request_id, b.request_id) << what;
    EXPECT_EQ(a.num_cached_prompt_tokens, b.num_cached_prompt_tokens) << what << ": request " << i;
    EXPECT_EQ(a.outputs.size(), b.outputs.size()) << what;
    if (a.outputs.size() != b.outputs.size()) continue;
    for (size_t k = 0; k < a.outputs.size(); ++k) {
      const CompletionOutput &x = a.outputs[k], &y = b.outputs[k];
      const std::string at = what + ": request " + std::to_string(i) + " sample " + std::to_string(k);
      EXPECT_EQ(x.token_ids, y.token_ids) << at;
      EXPECT_EQ(x.finish_reason, y.finish_reason) << at;
      EXPECT_EQ(x.routed_experts, y.routed_experts) << at;
      EXPECT_EQ(x.logprobs.size(), y.logprobs.size()) << at;
      if (x.logprobs.size() != y.logprobs.size()) continue;
      for (size_t t = 0; t < x.logprobs.size(); ++t) {
        const double d = std::abs(double(x.logprobs[t]) - double(y.logprobs[t]));
        worst = std::max(worst, d);
        EXPECT_LE(d, lp_tol(dt, x.logprobs[t], logit_scale)) << at << " token " << t << ": cpu " << x.logprobs[t]
                                                              << ", device " << y.logprobs[t];
      }
    }
  }
  EXPECT_EQ(cpu.stats.steps, dev.stats.steps) << what;
  EXPECT_EQ(cpu.stats.preemptions, dev.stats.preemptions) << what;
  EXPECT_EQ(cpu.stats.swapped_out_blocks, dev.stats.swapped_out_blocks) << what;
  EXPECT_EQ(cpu.stats.prefix_cache_hits, dev.stats.prefix_cache_hits) << what;
  EXPECT_EQ(dev.stats.packed_weights, 0) << what << ": a device model packs no CPU weights";
  return worst;
}

// The largest |logit| of the model's first step over the prompts (the scale the bf16 tolerance is in).
double logit_scale(const model::CausalLM& cpu, const std::vector<std::vector<int32_t>>& prompts) {
  double s = 0;
  for (const auto& p : prompts)
    for (float v : cpu.forward_inference(model::pack_sequences({p})).to_float_vector())
      s = std::max(s, double(std::abs(v)));
  return s;
}

// Prefix caching, prefill in chunks of 32 tokens beside the decodes, and a
// cache of 8 blocks of 16 for six sequences (and three forked samples) of up
// to 55 tokens: preemption by swap (blocks to the host and back).
EngineConfig dense_config() {
  EngineConfig c;
  c.block_size = 16;
  c.num_blocks = 8;
  c.max_num_batched_tokens = 32;
  c.max_num_seqs = 64;
  c.enable_prefix_caching = true;
  c.preemption_mode = "swap";
  return c;
}

// One run on each side: greedy requests and seeded n = 2 sampling (a fork:
// the partial last block copied on the device) in the same batches.
void dense_case(DType dt) {
  auto cpu = tiny_on(Device::CPU, dt);
  auto dev = tiny_on(Device::CUDA, dt);
  const auto prompts = rt::tiny_prompts();
  const double scale = dt == DType::F32 ? 0 : logit_scale(*cpu, prompts);
  const std::string what = std::string(dtype_name(dt)) + " llama";
  const std::vector<SamplingParams> ps = {greedy(5), sampled(2, 11, 5)};
  const RunOut a = run(*cpu, dense_config(), prompts, ps), b = run(*dev, dense_config(), prompts, ps);
  EXPECT_GT(b.stats.preemptions, 0) << what << ": the cache is sized to force a swap";
  EXPECT_GT(b.stats.swapped_out_blocks, 0) << what;
  EXPECT_EQ(b.stats.swapped_in_blocks, b.stats.swapped_out_blocks) << what;
  EXPECT_GT(b.stats.prefix_cache_hits, 0) << what;
  const double worst = expect_same(a, b, dt, scale, what);
  std::printf("[ %s ] largest |log-prob difference| cpu vs device: %.3g (logit scale %.3g), %lld steps\n",
              what.c_str(), worst, scale, (long long)b.stats.steps);
}

}  // namespace

TEST_F(RolloutOnDevice, KvCacheLivesOnTheDeviceAndSwapsThroughTheHost) {
  KVGeometry g;
  g.n_layers = 2;
  g.num_blocks = 4;
  g.block_size = 2;
  g.n_kv_heads = 1;
  g.head_dim = 3;
  g.routing_width = 2;
  KVCache kv(g, Device::CUDA);
  kv.set_swap_capacity(2);
  kv.allocate();
  EXPECT_EQ(kv.device(), Device::CUDA);
  for (int64_t l = 0; l < g.n_layers; ++l) {
    EXPECT_EQ(kv.k(l).device(), Device::CUDA);
    EXPECT_EQ(kv.v(l).device(), Device::CUDA);
  }
  EXPECT_EQ(kv.routing_rows().device(), Device::CUDA);
  // Block 1 of every array: distinct values, swapped out to the host, block 1
  // overwritten, swapped back into block 3, copied to block 2 on the device.
  const int64_t per_block = g.block_size * g.n_kv_heads * g.head_dim;  // 6 values
  auto block = [&](Tensor& t, int64_t b) { return t.view({g.num_blocks, -1}).slice_rows(b, b + 1); };
  std::vector<float> vals(static_cast<size_t>(per_block));
  for (int64_t i = 0; i < per_block; ++i) vals[size_t(i)] = float(i) + 0.5f;
  const Tensor host_vals = Tensor::from_host(vals, {1, per_block});
  const Tensor host_rows = Tensor::from_host(std::vector<int32_t>{7, 1, 4, 2}, {1, g.block_size * g.routing_width});
  Tensor routing = kv.routing_rows().view({g.num_blocks, g.block_size * g.routing_width});
  for (int64_t l = 0; l < g.n_layers; ++l) block(kv.k(l), 1).copy_from(host_vals);
  routing.slice_rows(1, 2).copy_from(host_rows);
  const std::vector<int32_t> host = kv.swap_reserve(1);
  ASSERT_EQ(host.size(), 1u);
  kv.swap_out({{1, host[0]}});
  for (int64_t l = 0; l < g.n_layers; ++l) block(kv.k(l), 1).zero_();
  routing.slice_rows(1, 2).zero_();
  kv.swap_in({{host[0], 3}});
  kv.copy_blocks({{3, 2}});
  for (int64_t b : {2, 3}) {
    for (int64_t l = 0; l < g.n_layers; ++l) EXPECT_EQ(block(kv.k(l), b).to_host<float>(), vals) << "block " << b;
    EXPECT_EQ(routing.slice_rows(b, b + 1).to_host<int32_t>(), host_rows.to_host<int32_t>()) << "block " << b;
  }
  kv.swap_release(host);
}

TEST_F(RolloutOnDevice, EngineKvCacheIsDeviceMemoryAndSleepFreesIt) {
  auto m = tiny_on(Device::CUDA, DType::F32);
  EngineConfig c = dense_config();
  const KVGeometry g = kv_geometry(*m, c.block_size, false);
  const int64_t kv_bytes = c.num_blocks * g.bytes_per_block();
  const int64_t dev_before = device_allocator(Device::CUDA)->stats().live_of(MemCategory::KVCache);
  const int64_t host_before = cpu_allocator().stats().live_of(MemCategory::KVCache);
  auto e = Engine::create(*m, c);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  EXPECT_EQ(device_allocator(Device::CUDA)->stats().live_of(MemCategory::KVCache) - dev_before, kv_bytes);
  EXPECT_EQ(cpu_allocator().stats().live_of(MemCategory::KVCache), host_before) << "the swap area is allocated on use";
  (*e)->sleep();
  EXPECT_EQ(device_allocator(Device::CUDA)->stats().live_of(MemCategory::KVCache), dev_before);
  (*e)->wake_up();
  EXPECT_EQ(device_allocator(Device::CUDA)->stats().live_of(MemCategory::KVCache) - dev_before, kv_bytes);
  ASSERT_TRUE((*e)->add_request("a", rt::tiny_prompts()[3], greedy(3)).is_ok());
  const auto outs = (*e)->run_to_completion();
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].outputs[0].token_ids.size(), 3u);
  EXPECT_EQ((*e)->stats().packed_weights, 0);
  EXPECT_EQ((*e)->weight_packs().count(), 0);
}

// A tiny Llama (Qwen3's per-head q/k norms cost seconds on the emulator; the
// transformers goldens on the device cover them).
TEST_F(RolloutOnDevice, DenseF32MatchesCpu) { dense_case(DType::F32); }
TEST_F(RolloutOnDevice, DenseBf16MatchesCpu) { dense_case(DType::BF16); }

// Qwen2-MoE with the routing cache (router replay R3: the routing rows live
// beside the K/V on the device and swap with them; a shared expert too) and
// DeepSeek-V2 (MLA: the latent cache), f32, with prefix caching, chunked
// prefill and a swap.
class RolloutOnDeviceGolden : public RolloutOnDevice, public ::testing::WithParamInterface<std::string> {};

TEST_P(RolloutOnDeviceGolden, MatchesCpu) {
  const std::string name = GetParam();
  const auto prompts = rt::moe_prompts();
  auto cpu = golden_on(name, Device::CPU);
  auto dev = golden_on(name, Device::CUDA);
  ASSERT_TRUE(cpu && dev);
  EngineConfig c;
  c.block_size = 8;
  c.num_blocks = 8;
  c.max_num_batched_tokens = 32;
  c.enable_prefix_caching = true;
  c.preemption_mode = "swap";
  c.record_routing = cpu->num_moe_layers() > 0;
  const std::vector<SamplingParams> ps = {greedy(4)};
  const RunOut a = run(*cpu, c, prompts, ps), b = run(*dev, c, prompts, ps);
  EXPECT_GT(b.stats.swapped_out_blocks, 0);
  EXPECT_GT(b.stats.prefix_cache_hits, 0);
  const double worst = expect_same(a, b, DType::F32, 0, name);
  std::printf("[ %s ] largest |log-prob difference| cpu vs device: %.3g, %lld steps\n", name.c_str(), worst,
              (long long)b.stats.steps);
  if (c.record_routing) {
    EXPECT_FALSE(b.outs.empty() || b.outs[0].outputs[0].routed_experts.empty());
  }
}
INSTANTIATE_TEST_SUITE_P(Models, RolloutOnDeviceGolden, ::testing::Values("qwen2_moe", "deepseek_v2"));

// A rollout copy in another dtype (f32 actor, bf16 rollout) of a model on the
// device: the copy is made on the device, its bytes equal the copy of the same
// actor on the CPU, and release() + refresh() allocate it there again.
TEST_F(RolloutOnDevice, RolloutCopyOfADeviceActorIsOnTheDevice) {
  auto cpu = tiny_on(Device::CPU, DType::F32);
  auto dev = tiny_on(Device::CUDA, DType::F32);
  RolloutWeightsOptions o;
  o.dtype = DType::BF16;
  auto wc = RolloutWeights::create(*cpu, o);
  auto wd = RolloutWeights::create(*dev, o);
  ASSERT_FALSE(wd->in_place());
  EXPECT_EQ(wd->model().device(), Device::CUDA);
  auto state = [](const model::CausalLM& m) { return const_cast<model::CausalLM&>(m).state_tensors(); };
  for (model::Param* p : state(wd->model())) EXPECT_EQ(p->weight.device(), Device::CUDA) << p->name;
  const uint64_t want = weights_checksum(state(wc->model()));
  EXPECT_EQ(weights_checksum(state(wd->model())), want);
  wd->release();
  wd->refresh();
  for (model::Param* p : state(wd->model())) EXPECT_EQ(p->weight.device(), Device::CUDA) << p->name;
  EXPECT_EQ(weights_checksum(state(wd->model())), want);
  // The engine runs on the copy, on the device.
  const std::vector<std::vector<int32_t>> one = {rt::tiny_prompts()[4]};
  const RunOut a = run(wc->model(), dense_config(), one, {greedy(4)});
  const RunOut b = run(wd->model(), dense_config(), one, {greedy(4)});
  expect_same(a, b, DType::BF16, logit_scale(wc->model(), one), "bf16 rollout copy");
}
