// End-to-end rollout engine tests on a tiny random model (fp32, so exact
// token equality is meaningful): greedy output equals a naive full-recompute
// decode and is invariant to prefix caching, chunk size, chunking on/off,
// preemption (recompute and swap) and batch composition; seeded sampling is
// invariant likewise; logprobs equal the trainer's scoring.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "model/scoring.h"
#include "rollout/engine.h"
#include "same_outputs.h"
#include "tiny_model.h"

using namespace kestrel;
using namespace kestrel::rollout;
using rollout::testing::tiny_model;
using rollout::testing::tiny_prompts;
using rollout::testing::run;
using rollout::testing::RunOut;

namespace {

EngineConfig base_config() {
  EngineConfig c;
  c.block_size = 16;
  c.num_blocks = 64;
  c.max_num_batched_tokens = 256;
  c.max_num_seqs = 64;
  c.enable_prefix_caching = false;
  return c;
}

SamplingParams greedy(int64_t max_tokens = 24) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

SamplingParams sampled(int64_t n, uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.9;
  p.top_k = 40;
  p.top_p = 0.95;
  p.min_p = 0.01;
  p.n = n;
  p.seed = seed;
  p.max_tokens = 20;
  return p;
}

void expect_same_outputs(const RunOut& a, const RunOut& b, const std::string& what) {
  rollout::testing::expect_same_outputs(a.outs, b.outs, 1e-5, what);
}

// Max |rollout logprob - trainer logprob| over every sampled token.
double max_logprob_diff(const model::CausalLM& m, const std::vector<RequestOutput>& outs) {
  double worst = 0;
  for (const auto& o : outs)
    for (const auto& c : o.outputs) {
      std::vector<int32_t> seq = o.prompt_token_ids;
      seq.insert(seq.end(), c.token_ids.begin(), c.token_ids.end());
      const auto b = model::pack_sequences({seq});
      const auto sc = model::score_tokens(m, b);
      const int64_t P = int64_t(o.prompt_token_ids.size());
      for (size_t j = 0; j < c.token_ids.size(); ++j)
        worst = std::max(worst, std::abs(double(c.logprobs[j]) - double(sc.logprob.get(P - 1 + int64_t(j)))));
    }
  return worst;
}

}  // namespace

TEST(Engine, GreedyMatchesNaiveFullRecompute) {
  auto m = tiny_model();
  const auto prompts = tiny_prompts();
  const RunOut r = run(*m, base_config(), prompts, {greedy(10)});
  ASSERT_EQ(r.outs.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> seq = prompts[i];
    for (int step = 0; step < 10; ++step) {
      const Tensor logits = m->forward_inference(model::pack_sequences({seq}));
      const int64_t V = logits.size(1), last = logits.size(0) - 1;
      int32_t best = 0;
      for (int64_t v = 1; v < V; ++v)
        if (logits.get(last * V + v) > logits.get(last * V + best)) best = int32_t(v);
      seq.push_back(best);
    }
    const std::vector<int32_t> want(seq.begin() + int64_t(prompts[i].size()), seq.end());
    EXPECT_EQ(r.outs[i].outputs[0].token_ids, want) << "prompt " << i;
    EXPECT_EQ(r.outs[i].outputs[0].finish_reason, "length");
  }
}

TEST(Engine, GreedyInvariantToCachingChunkingAndPreemption) {
  auto m = tiny_model();
  const auto prompts = tiny_prompts();
  const RunOut base = run(*m, base_config(), prompts, {greedy()});
  {
    EngineConfig c = base_config();
    c.enable_prefix_caching = true;
    const RunOut r = run(*m, c, prompts, {greedy()});
    expect_same_outputs(base, r, "prefix caching");
    // Prompts 0 and 1 share 37 tokens: prompt 1 hits 2 full blocks of prompt 0,
    // registered when prompt 0 was scheduled in the same step.
    EXPECT_EQ(r.outs[1].num_cached_prompt_tokens, 32);
    EXPECT_EQ(r.outs[0].num_cached_prompt_tokens, 0);
    EXPECT_EQ(r.stats.prefix_cache_hits, 32);
  }
  for (int64_t budget : {1, 4, 16}) {
    EngineConfig c = base_config();
    c.max_num_batched_tokens = budget;
    c.enable_prefix_caching = budget == 4;
    expect_same_outputs(base, run(*m, c, prompts, {greedy()}), "budget " + std::to_string(budget));
  }
  {
    EngineConfig c = base_config();
    c.enable_chunked_prefill = false;
    c.max_num_batched_tokens = 64;  // prompts run whole or wait
    expect_same_outputs(base, run(*m, c, prompts, {greedy()}), "no chunking");
  }
  {
    EngineConfig c = base_config();
    c.max_num_seqs = 2;
    expect_same_outputs(base, run(*m, c, prompts, {greedy()}), "max_num_seqs 2");
  }
  for (const char* mode : {"recompute", "swap"}) {
    for (bool caching : {false, true}) {
      EngineConfig c = base_config();
      c.num_blocks = 8;  // 7 usable blocks of 16 for six sequences of up to 74 tokens
      c.preemption_mode = mode;
      c.enable_prefix_caching = caching;
      const RunOut r = run(*m, c, prompts, {greedy()});
      const std::string what = std::string(mode) + (caching ? " + caching" : "");
      expect_same_outputs(base, r, what);
      EXPECT_GT(r.stats.preemptions, 0) << what;
      if (std::string(mode) == "swap") {
        EXPECT_GT(r.stats.swapped_out_blocks, 0) << what;
        EXPECT_EQ(r.stats.swapped_in_blocks, r.stats.swapped_out_blocks) << what;
      } else {
        EXPECT_EQ(r.stats.swapped_out_blocks, 0) << what;
      }
    }
  }
}

TEST(Engine, SeededSamplingIndependentOfBatchChunkingAndPreemption) {
  auto m = tiny_model();
  const auto prompts = tiny_prompts();
  const SamplingParams p = sampled(3, 42);
  // Prompt 0 alone.
  const RunOut alone = run(*m, base_config(), {prompts[0]}, {p});
  // Prompt 0 among others, with prefix caching, small chunks and preemption.
  EngineConfig c = base_config();
  c.enable_prefix_caching = true;
  c.max_num_batched_tokens = 7;
  c.num_blocks = 10;
  std::vector<std::vector<int32_t>> mixed = {prompts[2], prompts[1], prompts[0], prompts[4]};
  std::vector<SamplingParams> ps = {sampled(2, 1), sampled(1, 5), p, sampled(4, 9)};
  const RunOut together = run(*m, c, mixed, ps, {"a", "b", "r0", "d"});
  ASSERT_EQ(together.outs.size(), 4u);
  RunOut picked;
  picked.outs.push_back(together.outs[2]);
  expect_same_outputs(alone, picked, "alone vs batched");
  EXPECT_GT(together.stats.preemptions, 0);
  // The samples differ from each other (keys differ by sample index).
  const auto& o = alone.outs[0].outputs;
  ASSERT_EQ(o.size(), 3u);
  EXPECT_TRUE(o[0].token_ids != o[1].token_ids || o[1].token_ids != o[2].token_ids);
  // Sample 0 of an n = 3 request is the n = 1 request with the same seed.
  SamplingParams p1 = p;
  p1.n = 1;
  const RunOut single = run(*m, base_config(), {prompts[0]}, {p1});
  EXPECT_EQ(single.outs[0].outputs[0].token_ids, o[0].token_ids);
  // Swap mode with forked samples sharing blocks.
  EngineConfig cs = c;
  cs.preemption_mode = "swap";
  const RunOut swapped = run(*m, cs, mixed, ps, {"a", "b", "r0", "d"});
  expect_same_outputs(together, swapped, "swap vs recompute");
}

TEST(Engine, LogprobsEqualTrainerScoring) {
  for (bool qwen3 : {false, true}) {
    auto m = tiny_model(qwen3);
    const auto prompts = tiny_prompts();
    EngineConfig c = base_config();
    c.enable_prefix_caching = true;
    c.max_num_batched_tokens = 16;  // chunked prefill and mixed steps
    const RunOut g = run(*m, c, prompts, {greedy()});
    EXPECT_LE(max_logprob_diff(*m, g.outs), 1e-5) << (qwen3 ? "qwen3" : "llama") << " greedy";
    const RunOut s = run(*m, c, prompts, {sampled(2, 3)});
    EXPECT_LE(max_logprob_diff(*m, s.outs), 1e-5) << (qwen3 ? "qwen3" : "llama") << " sampled";
  }
}

TEST(Engine, TopLogprobsIncludeTheGreedyToken) {
  auto m = tiny_model();
  SamplingParams p = greedy(5);
  p.logprobs = 3;
  const RunOut r = run(*m, base_config(), {tiny_prompts()[2]}, {p});
  const auto& c = r.outs[0].outputs[0];
  ASSERT_EQ(c.top_logprobs.size(), 5u);
  for (size_t t = 0; t < 5; ++t) {
    ASSERT_EQ(c.top_logprobs[t].size(), 3u);
    EXPECT_EQ(c.top_logprobs[t][0].first, c.token_ids[t]);
    EXPECT_FLOAT_EQ(c.top_logprobs[t][0].second, c.logprobs[t]);
    EXPECT_GE(c.top_logprobs[t][0].second, c.top_logprobs[t][1].second);
  }
}

TEST(Engine, StopConditions) {
  const auto prompts = tiny_prompts();
  auto m = tiny_model();
  const RunOut base = run(*m, base_config(), {prompts[3]}, {greedy(16)});
  const auto ref = base.outs[0].outputs[0].token_ids;
  ASSERT_EQ(ref.size(), 16u);
  EXPECT_EQ(base.outs[0].outputs[0].finish_reason, "length");
  const int32_t target = ref[5];
  const size_t first = size_t(std::find(ref.begin(), ref.end(), target) - ref.begin());

  // stop_token_ids: the output ends with the first occurrence, included.
  SamplingParams p = greedy(16);
  p.stop_token_ids = {target};
  RunOut r = run(*m, base_config(), {prompts[3]}, {p});
  EXPECT_EQ(r.outs[0].outputs[0].token_ids, std::vector<int32_t>(ref.begin(), ref.begin() + int64_t(first) + 1));
  EXPECT_EQ(r.outs[0].outputs[0].finish_reason, "stop");

  // EOS from config.json, and ignore_eos.
  io::ModelConfig cfg = rollout::testing::tiny_config();
  cfg.eos_token_ids = {target};
  model::ModelOptions o;
  auto m_eos = model::CausalLM::init_random(cfg, o, 7, 0.1);
  r = run(*m_eos, base_config(), {prompts[3]}, {greedy(16)});
  EXPECT_EQ(r.outs[0].outputs[0].token_ids.size(), first + 1);
  EXPECT_EQ(r.outs[0].outputs[0].finish_reason, "stop");
  p = greedy(16);
  p.ignore_eos = true;
  r = run(*m_eos, base_config(), {prompts[3]}, {p});
  EXPECT_EQ(r.outs[0].outputs[0].token_ids, ref);

  // Stop strings through EngineConfig::detokenize (one letter per token here).
  EngineConfig c = base_config();
  c.detokenize = [](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t t : ids) s += char('a' + t % 26);
    return s;
  };
  const std::string text = c.detokenize(ref);
  const std::string stop = text.substr(6, 2);
  const size_t at = text.find(stop);
  p = greedy(16);
  p.stop = {stop};
  r = run(*m, c, {prompts[3]}, {p});
  EXPECT_EQ(r.outs[0].outputs[0].token_ids.size(), at + 2);
  EXPECT_EQ(r.outs[0].outputs[0].finish_reason, "stop");

  // max_model_len caps the sequence ("length").
  c = base_config();
  c.max_model_len = int64_t(prompts[3].size()) + 4;
  r = run(*m, c, {prompts[3]}, {greedy(16)});
  EXPECT_EQ(r.outs[0].outputs[0].token_ids, std::vector<int32_t>(ref.begin(), ref.begin() + 4));
  EXPECT_EQ(r.outs[0].outputs[0].finish_reason, "length");
}

TEST(Engine, RejectsBadRequestsWithClearErrors) {
  auto m = tiny_model();
  EngineConfig c = base_config();
  c.num_blocks = 3;  // 2 usable blocks of 16 tokens
  auto e = Engine::create(*m, c);
  ASSERT_TRUE(e.is_ok());
  EXPECT_FALSE((*e)->add_request("x", {}, greedy()).is_ok());
  EXPECT_FALSE((*e)->add_request("x", {1, 500}, greedy()).is_ok());
  Status st = (*e)->add_request("x", std::vector<int32_t>(30, 1), greedy(8));
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("KV blocks"), std::string::npos) << st.message();
  SamplingParams p = greedy();
  p.stop = {"x"};
  EXPECT_FALSE((*e)->add_request("x", {1}, p).is_ok());  // stop strings without a detokenizer
  ASSERT_TRUE((*e)->add_request("x", {1}, greedy(4)).is_ok());
  EXPECT_FALSE((*e)->add_request("x", {1}, greedy(4)).is_ok());  // duplicate id
  EngineConfig bad = base_config();
  bad.preemption_mode = "swop";
  EXPECT_FALSE(Engine::create(*m, bad).is_ok());
}

TEST(Engine, SleepFreesKvMemoryAndWakeUpResumes) {
  auto m = tiny_model();
  const auto prompts = tiny_prompts();
  const int64_t before = cpu_allocator().stats().live_of(MemCategory::KVCache);
  EngineConfig c = base_config();
  c.enable_prefix_caching = true;
  c.preemption_mode = "swap";
  const RunOut ref = run(*m, c, prompts, {sampled(2, 11)});

  auto e = Engine::create(*m, c);
  ASSERT_TRUE(e.is_ok());
  const int64_t kv_bytes = 2 * 2 * c.num_blocks * 16 * 2 * 16 * 4;  // K+V x layers x blocks x bs x Hkv x hd x f32
  EXPECT_EQ(cpu_allocator().stats().live_of(MemCategory::KVCache) - before, kv_bytes);
  for (size_t i = 0; i < prompts.size(); ++i)
    ASSERT_TRUE((*e)->add_request("r" + std::to_string(i), prompts[i], sampled(2, 11)).is_ok());
  for (int i = 0; i < 4; ++i) (*e)->step();
  (*e)->sleep();
  EXPECT_TRUE((*e)->is_sleeping());
  EXPECT_EQ(cpu_allocator().stats().live_of(MemCategory::KVCache), before);
  EXPECT_THROW((*e)->step(), Error);
  (*e)->wake_up();
  EXPECT_EQ(cpu_allocator().stats().live_of(MemCategory::KVCache) - before, kv_bytes);
  RunOut resumed;
  resumed.outs = (*e)->run_to_completion();
  expect_same_outputs(ref, resumed, "sleep mid-generation");
}

TEST(Engine, WeightUpdateResetsThePrefixCache) {
  auto m = tiny_model();
  const auto prompts = tiny_prompts();
  EngineConfig c = base_config();
  c.enable_prefix_caching = true;
  auto e = Engine::create(*m, c);
  ASSERT_TRUE(e.is_ok());
  ASSERT_TRUE((*e)->add_request("a", prompts[0], greedy()).is_ok());
  (*e)->run_to_completion();
  ASSERT_TRUE((*e)->add_request("b", prompts[0], greedy()).is_ok());
  auto again = (*e)->run_to_completion();
  EXPECT_EQ(again[0].num_cached_prompt_tokens, 32);  // 44 hittable tokens -> 2 full blocks

  // The trainer changes the weights in place; the engine sees them at once.
  model::Param* w = m->find_param("model.norm.weight");
  ASSERT_NE(w, nullptr);
  w->weight.fill_(1.7f);
  m->find_param("model.layers.0.mlp.down_proj.weight")->weight.fill_(0.01f);
  (*e)->update_weights_version();
  EXPECT_EQ((*e)->stats().weights_version, 1);
  ASSERT_TRUE((*e)->add_request("c", prompts[0], greedy()).is_ok());
  auto after = (*e)->run_to_completion();
  EXPECT_EQ(after[0].num_cached_prompt_tokens, 0);
  const RunOut fresh = run(*m, base_config(), {prompts[0]}, {greedy()});
  EXPECT_EQ(after[0].outputs[0].token_ids, fresh.outs[0].outputs[0].token_ids);
  EXPECT_NE(after[0].outputs[0].token_ids, again[0].outputs[0].token_ids);
}

TEST(Engine, Bf16RolloutTracksBf16Scoring) {
  // bf16 rounds every op output, and the rollout's GEMMs see different row
  // counts than the trainer's, so agreement is to bf16 precision only.
  auto m = tiny_model(false, DType::BF16);
  EngineConfig c = base_config();
  c.enable_prefix_caching = true;
  c.max_num_batched_tokens = 16;
  const RunOut r = run(*m, c, tiny_prompts(), {sampled(2, 5)});
  ASSERT_EQ(r.outs.size(), 6u);
  EXPECT_LE(max_logprob_diff(*m, r.outs), 0.1);
}

// actor_rollout_ref.rollout.gpu_memory_utilization: kv = utilization x memory - weights.
TEST(EngineMemory, KvCacheBytesFromUtilization) {
  const int64_t GiB = int64_t(1) << 30;
  EXPECT_EQ(kv_cache_bytes_for(0.5, 16 * GiB, 3 * GiB).value(), 5 * GiB);
  EXPECT_EQ(kv_cache_bytes_for(1.0, 1000, 400).value(), 600);
  EXPECT_EQ(kv_cache_bytes_for(0.25, 4000, 0).value(), 1000);
  // Nothing left for the cache: the error names the key and both sides.
  auto r = kv_cache_bytes_for(0.1, 1000, 100);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("actor_rollout_ref.rollout.gpu_memory_utilization"), std::string::npos);
  EXPECT_NE(r.status().message().find("(100 bytes)"), std::string::npos) << r.status().message();
  EXPECT_FALSE(kv_cache_bytes_for(0.0, 1000, 1).is_ok());
  EXPECT_FALSE(kv_cache_bytes_for(1.5, 1000, 1).is_ok());
}

TEST(EngineMemory, DeviceMemoryFromMeminfoOrEnv) {
  EXPECT_EQ(parse_meminfo_total("MemTotal:       24683584 kB\nMemFree: 1 kB\n").value(), int64_t(24683584) * 1024);
  EXPECT_FALSE(parse_meminfo_total("MemFree: 1 kB\n").is_ok());
  ::setenv("KESTREL_DEVICE_MEMORY", "123456789", 1);
  EXPECT_EQ(device_memory_bytes(4).value(), 123456789);  // the variable is one process's memory
  ::setenv("KESTREL_DEVICE_MEMORY", "12x", 1);
  EXPECT_FALSE(device_memory_bytes().is_ok());
  ::unsetenv("KESTREL_DEVICE_MEMORY");
  const int64_t all = device_memory_bytes(1).value();
  EXPECT_GT(all, 0);
  EXPECT_EQ(device_memory_bytes(2).value(), all / 2);  // MemTotal shared by the processes on the machine
}

TEST(EngineMemory, WeightBytesAreParametersTimesDtype) {
  auto m = tiny_model();
  EXPECT_EQ(weight_bytes(*m), m->num_parameters() * int64_t(dtype_size(m->dtype())));
}

// enforce_eager=false on the CPU: CUDA graphs are a device feature, so the
// engine runs every step eagerly (the same outputs, nothing captured); a
// capture size below 1 is refused either way.
TEST(Engine, CudaGraphSettingsAreANoOpOnTheCpu) {
  auto m = tiny_model();
  const auto prompts = tiny_prompts();
  EngineConfig c = base_config();
  const RunOut eager = run(*m, c, prompts, {greedy(6)});
  c.enforce_eager = false;
  c.cudagraph_capture_sizes = {1, 2, 4};
  const RunOut graphs = run(*m, c, prompts, {greedy(6)});
  rollout::testing::expect_same_outputs(eager.outs, graphs.outs, 0, "enforce_eager=false on the CPU");
  EXPECT_EQ(graphs.stats.cuda_graph_captures, 0);
  EXPECT_EQ(graphs.stats.cuda_graph_replays, 0);
  c.cudagraph_capture_sizes = {2, 0};
  auto bad = Engine::create(*m, c);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("cudagraph_capture_sizes"), std::string::npos) << bad.status().message();
}
