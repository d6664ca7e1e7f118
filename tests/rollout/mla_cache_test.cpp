// The rollout's caches for MLA and MoE models: an MLA model's KV cache keeps
// one latent row [c_kv | k_pe] (kv_lora_rank + qk_rope_head_dim values) per
// token and layer, never K/V (geometry, bytes per token, the engine's sizing,
// the allocator's bytes, sleep/wake), compared with GQA of the same width;
// the routing cache of record_routing sits beside it; a decode step of a MoE
// or MLA model allocates its slot buffers once, however many layers run.
#include <gtest/gtest.h>

#include <cstdio>

#include "moe_models.h"
#include "rollout/kv_cache.h"
#include "rollout/model_runner.h"

using namespace kestrel;
using namespace kestrel::rollout;
using namespace kestrel::rollout::testing;

namespace {

// Values per token and layer of a GQA cache as wide as the MLA attention:
// K and V for every head at the query/key head width (nope + rope).
int64_t gqa_values_same_width(const io::ModelConfig& c) {
  return 2 * c.num_attention_heads * c.mla.qk_head_dim();
}

void report_cache(const std::string& what, const io::ModelConfig& c, int64_t latent, DType dt) {
  const int64_t gqa = gqa_values_same_width(c), decompressed = c.num_attention_heads * (c.mla.qk_head_dim() + c.mla.v_head_dim);
  std::printf("[ %s ] MLA cache: %lld values per token per layer (kv_lora_rank %lld + qk_rope_head_dim %lld), "
              "%lld bytes per token over %lld layers in %s; GQA of the same width (2 x %lld heads x %lld): %lld "
              "values (%.1fx); decompressed K and V (%lld heads x (%lld + %lld)): %lld values (%.1fx)\n",
              what.c_str(), (long long)latent, (long long)c.mla.kv_lora_rank, (long long)c.mla.qk_rope_head_dim,
              (long long)(latent * c.num_hidden_layers * int64_t(dtype_size(dt))), (long long)c.num_hidden_layers,
              dtype_name(dt), (long long)c.num_attention_heads, (long long)c.mla.qk_head_dim(), (long long)gqa,
              double(gqa) / double(latent), (long long)c.num_attention_heads, (long long)c.mla.qk_head_dim(),
              (long long)c.mla.v_head_dim, (long long)decompressed, double(decompressed) / double(latent));
}

}  // namespace

TEST(MlaCache, LatentGeometryAndBytesPerToken) {
  for (const char* name : {"deepseek_v2", "deepseek_v3"}) {
    for (DType dt : {DType::F32, DType::BF16}) {
      auto m = load_golden(name, dt, dt == DType::BF16);
      ASSERT_TRUE(m);
      const io::ModelConfig& c = m->config();
      const int64_t latent = c.mla.kv_lora_rank + c.mla.qk_rope_head_dim, es = int64_t(dtype_size(dt));
      ASSERT_EQ(latent, 24);  // kv_lora 16 + rope 8
      const KVGeometry g = kv_geometry(*m, 16, /*record_routing=*/false);
      EXPECT_TRUE(g.latent());
      EXPECT_EQ(g.latent_dim, latent);
      EXPECT_EQ(g.n_kv_heads, 0);
      EXPECT_EQ(g.values_per_token_layer(), latent);
      EXPECT_EQ(g.kv_bytes_per_token(), c.num_hidden_layers * latent * es);
      EXPECT_EQ(kv_bytes_per_token(*m), c.num_hidden_layers * latent * es);
      EXPECT_EQ(g.bytes_per_block(), 16 * c.num_hidden_layers * latent * es);
      // From config.json alone, as a memory plan sees it.
      const KVGeometry gc = kv_geometry(c, 0, dt, 16, false);
      EXPECT_EQ(gc.latent_dim, latent);
      EXPECT_EQ(gc.bytes_per_block(), g.bytes_per_block());
      // The routing cache: n_moe_layers * k i32 per slot, counted in the block's bytes.
      const KVGeometry gr = kv_geometry(*m, 16, true);
      EXPECT_EQ(gr.routing_width, m->num_moe_layers() * c.moe.top_k);
      EXPECT_EQ(gr.bytes_per_block(), g.bytes_per_block() + 16 * gr.routing_width * 4);
      // 8x less than GQA of the same width here (2 x 4 heads x 16 = 128 vs 24).
      EXPECT_EQ(gqa_values_same_width(c), 128);
      report_cache(std::string(name) + " " + dtype_name(dt), c, latent, dt);
    }
  }
  // The full-size DeepSeek-V3 (config.json of deepseek-ai/DeepSeek-V3): 576
  // values per token and layer against 2 x 128 heads x 192.
  io::ModelConfig v3;
  v3.num_hidden_layers = 61;
  v3.num_attention_heads = 128;
  v3.mla.kv_lora_rank = 512;
  v3.mla.qk_rope_head_dim = 64;
  v3.mla.qk_nope_head_dim = 128;
  v3.mla.v_head_dim = 128;
  ASSERT_EQ(v3.mla.qk_head_dim(), 192);
  report_cache("DeepSeek-V3 671B", v3, 576, DType::BF16);
  EXPECT_EQ(gqa_values_same_width(v3) / 576, 85);
  // A dense model keeps K and V of its kv heads.
  auto dense = model::CausalLM::load(kestrel::testing::source_path("tests/golden/models/qwen3"));
  ASSERT_TRUE(dense.is_ok());
  const KVGeometry gd = kv_geometry(**dense, 16, false);
  EXPECT_FALSE(gd.latent());
  EXPECT_EQ(gd.values_per_token_layer(), 2 * (*dense)->config().num_key_value_heads * (*dense)->config().head_dim);
}

TEST(MlaCache, EngineSizesAndAllocatesTheLatentCacheAndSleeps) {
  auto m = load_golden("deepseek_v3");
  ASSERT_TRUE(m);
  EngineConfig c;
  c.block_size = 8;
  c.kv_cache_bytes = 100000;
  c.max_num_batched_tokens = 16;
  c.enable_prefix_caching = true;
  c.preemption_mode = "swap";
  c.swap_space_gib = 0;  // no host blocks: the allocator's bytes are the device arrays alone
  c.record_routing = true;
  const KVGeometry g = kv_geometry(*m, 8, true);
  const int64_t per_block = 8 * (3 * 24 * 4 + 2 * 2 * 4);  // latent rows of 3 layers + 2 MoE layers x top-2 i32
  ASSERT_EQ(g.bytes_per_block(), per_block);
  const int64_t blocks = 100000 / per_block;
  SamplingParams p;
  p.temperature = 1.0;
  p.n = 2;
  p.seed = 3;
  p.max_tokens = 10;
  p.ignore_eos = true;
  const auto prompts = moe_prompts();
  // Uninterrupted.
  auto ref = Engine::create(*m, c);
  ASSERT_TRUE(ref.is_ok()) << ref.status().message();
  for (size_t i = 0; i < prompts.size(); ++i) ASSERT_TRUE((*ref)->add_request("r" + std::to_string(i), prompts[i], p).is_ok());
  const auto want = (*ref)->run_to_completion();
  ref.value().reset();

  const int64_t before = cpu_allocator().stats().live_of(MemCategory::KVCache);
  auto e = Engine::create(*m, c);
  ASSERT_TRUE(e.is_ok());
  EXPECT_EQ((*e)->stats().num_blocks, blocks);
  EXPECT_EQ(cpu_allocator().stats().live_of(MemCategory::KVCache) - before, blocks * per_block);
  for (size_t i = 0; i < prompts.size(); ++i) ASSERT_TRUE((*e)->add_request("r" + std::to_string(i), prompts[i], p).is_ok());
  for (int i = 0; i < 4; ++i) (*e)->step();
  (*e)->sleep();
  EXPECT_EQ(cpu_allocator().stats().live_of(MemCategory::KVCache), before);
  (*e)->wake_up();
  EXPECT_EQ(cpu_allocator().stats().live_of(MemCategory::KVCache) - before, blocks * per_block);
  const auto got = (*e)->run_to_completion();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    for (size_t k = 0; k < got[i].outputs.size(); ++k) {
      EXPECT_EQ(got[i].outputs[k].token_ids, want[i].outputs[k].token_ids) << "sleep mid-generation, request " << i;
      EXPECT_EQ(got[i].outputs[k].routed_experts, want[i].outputs[k].routed_experts) << "request " << i;
    }
}

TEST(MlaCache, RunnerRefusesACacheOfTheOtherKind) {
  auto m = load_golden("deepseek_v2");
  ASSERT_TRUE(m);
  KVCache gqa(KVGeometry{3, 4, 8, 4, 16, DType::F32});
  try {
    ModelRunner r(*m, gqa);
    ADD_FAILURE() << "a GQA cache for an MLA model was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("latent rows of 24"), std::string::npos) << e.what();
  }
  KVGeometry no_routing = kv_geometry(*m, 8, false), routing = kv_geometry(*m, 8, true);
  no_routing.num_blocks = routing.num_blocks = 4;
  KVCache ok(no_routing), ok_r(routing);
  EXPECT_NO_THROW(ModelRunner(*m, ok));
  EXPECT_NO_THROW(ModelRunner(*m, ok_r));
  routing.routing_width += 1;
  KVCache bad_r(routing);
  EXPECT_THROW(ModelRunner(*m, bad_r), Error);
}

namespace {

// One sequence: a prefill of `prompt` tokens in blocks 1.., then decode steps.
StepBatch step(const std::vector<int32_t>& ids, int64_t start, int64_t block_size, int64_t max_blocks) {
  StepBatch b;
  const int64_t n = int64_t(ids.size());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = start + i;
    b.input_ids.push_back(ids[size_t(i)]);
    b.positions.push_back(int32_t(p));
    b.slot_mapping.push_back(int32_t((1 + p / block_size) * block_size + p % block_size));
  }
  b.cu_q = {0, int32_t(n)};
  b.seq_lens = {int32_t(start + n)};
  for (int64_t j = 0; j < max_blocks; ++j) b.block_tables.push_back(int32_t(1 + j));
  b.max_blocks = max_blocks;
  b.sample_rows = {int32_t(n - 1)};
  return b;
}

struct DecodeCost {
  int64_t slot_buffers = 0;
  // Above what was live before the step, less the step's routing record
  // (i32 [1, n_moe_layers, k]: one per step, as wide as the model has MoE layers).
  int64_t peak_activation_bytes = 0;
};

DecodeCost decode_cost(const model::CausalLM& m) {
  KVGeometry g = kv_geometry(m, 8, /*record_routing=*/true);
  g.num_blocks = 8;
  KVCache kv(g);
  kv.allocate();
  ModelRunner r(m, kv);
  const auto prompts = moe_prompts();
  r.execute(step(prompts[0], 0, 8, 4));  // prefill of 23 tokens
  DecodeCost c;
  for (int i = 0; i < 3; ++i) {
    const int64_t live = cpu_allocator().stats().live_of(MemCategory::Activations);
    cpu_allocator().reset_peak();
    r.execute(step({int32_t(5 + i)}, 23 + i, 8, 4));
    c.slot_buffers = r.last_slot_buffers();
    const int64_t record = m.num_moe_layers() * m.config().moe.top_k * 4;
    c.peak_activation_bytes =
        std::max(c.peak_activation_bytes, cpu_allocator().stats().peak_of(MemCategory::Activations) - live - record);
  }
  return c;
}

}  // namespace

TEST(MoeDecode, SlotBuffersAndPeakActivationsIndependentOfLayerCount) {
  // A decode step allocates one buffer per slot for all layers; a MoE layer
  // adds only its routing-sized expert buffers, freed by the next layer's.
  // So the same model with twice the layers costs the same.
  for (const char* name : {"qwen3_moe", "deepseek_v3"}) {
    auto m = load_golden(name);
    ASSERT_TRUE(m);
    io::ModelConfig deep = m->config();
    deep.num_hidden_layers = 6;
    model::ModelOptions o;
    auto m6 = model::CausalLM::init_random(deep, o, 11, 0.2);
    auto m3 = model::CausalLM::init_random(m->config(), o, 11, 0.2);
    const DecodeCost c3 = decode_cost(*m3), c6 = decode_cost(*m6);
    std::printf("[ %s decode ] slot buffers %lld (3 layers) / %lld (6 layers); peak activation bytes %lld / %lld\n",
                name, (long long)c3.slot_buffers, (long long)c6.slot_buffers, (long long)c3.peak_activation_bytes,
                (long long)c6.peak_activation_bytes);
    EXPECT_GT(c3.slot_buffers, 0) << name;
    EXPECT_EQ(c3.slot_buffers, c6.slot_buffers) << name;
    EXPECT_EQ(c3.peak_activation_bytes, c6.peak_activation_bytes) << name;
  }
}
