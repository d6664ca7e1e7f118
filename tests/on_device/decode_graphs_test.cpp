// CUDA-graph decode (rollout/decode_graphs.h: enforce_eager=false) against the
// eager engine on the same device: the same tokens, finish reasons and
// scheduler history, and log-probs bit for bit on the emulator, for a dense
// Llama (f32, bf16) and an MLA model (DeepSeek-V2), over decode batches padded
// to a capture size, batches larger than the largest size (eager), prefix
// caching, swap preemption, forks and a sleep/wake between steps (the graphs
// are dropped with the KV cache and captured again). A MoE model decodes
// eagerly (its routing reads counts back to the host) and says so.
//
// Why exact: a replay runs the recorded kernels on the same inputs, and every
// op of the step computes a row from that row alone (GEMM rows, norms, one
// sequence's attention), so the padding rows cannot reach a real row. On the
// emulator the GEMM of P rows computes each row as the GEMM of B rows does.
// On a GPU cuBLAS may choose another kernel (another summation order) for P
// rows than for B: there tokens must still match and log-probs agree within
// the rounding of the model's dtype (lp_tol).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_graph.h"
#include "io/model_config.h"
#include "rollout/decode_graphs.h"
#include "rollout/engine.h"
#include "../rollout/moe_models.h"
#include "../rollout/same_outputs.h"
#include "device_models.h"
#include "../rollout/tiny_model.h"

using namespace kestrel;
using namespace kestrel::rollout;
namespace rt = kestrel::rollout::testing;
using rt::RunOut;
using rt::golden_on;
using rt::greedy;
using rt::sampled;
using rt::tiny_on;
class DecodeGraphsOnDevice : public rt::DeviceTest {};

namespace {

bool emulated() { return cuda::describe().rfind("emulated", 0) == 0; }

// Six prompts (two sharing a 37-token prefix), greedy and n = 2 sampling, in a
// cache of 8 blocks of 16 (swaps), prefill chunks of 32 beside the decodes.
// One capture size, 2: the cache holds at most a few sequences at once, so
// that a batch of 1 pads to 2 and batches of 3 or more run eagerly.
EngineConfig config(bool eager, int64_t block_size = 16) {
  EngineConfig c;
  c.block_size = block_size;
  c.num_blocks = 8;
  c.max_num_batched_tokens = 32;
  c.max_num_seqs = 64;
  c.enable_prefix_caching = true;
  c.preemption_mode = "swap";
  c.enforce_eager = eager;
  c.cudagraph_capture_sizes = {2};
  return c;
}

// Runs every prompt; before step `*sleep_at` the engine sleeps and wakes (its
// in-flight sequences recompute); *sleep_at < 0: after the first graph replay,
// and *sleep_at is set to that step. Outputs in request order.
RunOut drive(const model::CausalLM& m, const EngineConfig& c, const std::vector<std::vector<int32_t>>& prompts,
             const std::vector<SamplingParams>& ps, int64_t* sleep_at) {
  RunOut r;
  auto e = Engine::create(m, c);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  if (!e.is_ok()) return r;
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_TRUE((*e)->add_request("r" + std::to_string(i), prompts[i], ps[i % ps.size()]).is_ok());
  std::map<std::string, RequestOutput> done;
  for (int64_t step = 0; (*e)->has_unfinished(); ++step) {
    if (*sleep_at < 0 && (*e)->stats().cuda_graph_replays > 0) *sleep_at = step;
    if (step == *sleep_at) {
      (*e)->sleep();
      (*e)->wake_up();
    }
    for (auto& o : (*e)->step()) done[o.request_id] = std::move(o);
  }
  for (size_t i = 0; i < prompts.size(); ++i) r.outs.push_back(done["r" + std::to_string(i)]);
  r.stats = (*e)->stats();
  EXPECT_EQ(r.stats.free_blocks, r.stats.num_blocks - 1) << "blocks leaked";
  return r;
}

double lp_tol(DType dt, double logprob) {
  if (emulated()) return 0;  // bit for bit
  return dt == DType::F32 ? 1e-5 * std::max(1.0, std::abs(logprob)) : 0.0625;
}

void expect_same(const RunOut& eager, const RunOut& graphs, DType dt, const std::string& what) {
  ASSERT_EQ(eager.outs.size(), graphs.outs.size()) << what;
  for (size_t i = 0; i < eager.outs.size(); ++i) {
    ASSERT_EQ(eager.outs[i].outputs.size(), graphs.outs[i].outputs.size()) << what;
    for (size_t k = 0; k < eager.outs[i].outputs.size(); ++k) {
      const CompletionOutput &x = eager.outs[i].outputs[k], &y = graphs.outs[i].outputs[k];
      const std::string at = what + ": request " + std::to_string(i) + " sample " + std::to_string(k);
      EXPECT_EQ(x.token_ids, y.token_ids) << at;
      EXPECT_EQ(x.finish_reason, y.finish_reason) << at;
      ASSERT_EQ(x.logprobs.size(), y.logprobs.size()) << at;
      for (size_t t = 0; t < x.logprobs.size(); ++t)
        EXPECT_LE(std::abs(double(x.logprobs[t]) - double(y.logprobs[t])), lp_tol(dt, x.logprobs[t]))
            << at << " token " << t << ": eager " << x.logprobs[t] << ", graph " << y.logprobs[t];
    }
  }
  EXPECT_EQ(eager.stats.steps, graphs.stats.steps) << what;
  EXPECT_EQ(eager.stats.preemptions, graphs.stats.preemptions) << what;
  EXPECT_EQ(eager.stats.swapped_out_blocks, graphs.stats.swapped_out_blocks) << what;
  EXPECT_EQ(eager.stats.prefix_cache_hits, graphs.stats.prefix_cache_hits) << what;
}

// The graph run against the eager run; the sleep lands after the first replay.
void compare(const model::CausalLM& m, DType dt, const std::vector<std::vector<int32_t>>& prompts,
             const std::vector<SamplingParams>& ps, int64_t block_size, const std::string& what) {
  const int64_t global_before = cuda::Graph::replays();
  // The requests cycle through ps, except the last, which decodes alone for a
  // while at the end (a batch of 1, padded to the capture size 2).
  std::vector<SamplingParams> each;
  for (size_t i = 0; i < prompts.size(); ++i) each.push_back(ps[i % ps.size()]);
  each.back() = greedy(12);
  int64_t sleep_at = -1;
  const RunOut g = drive(m, config(false, block_size), prompts, each, &sleep_at);
  ASSERT_GE(sleep_at, 0) << what << ": no graph replayed";
  const RunOut e = drive(m, config(true, block_size), prompts, each, &sleep_at);
  expect_same(e, g, dt, what);
  EXPECT_EQ(e.stats.cuda_graph_replays, 0) << what;
  EXPECT_GT(g.stats.cuda_graph_replays, 0) << what << ": no decode step replayed a graph";
  EXPECT_LT(g.stats.cuda_graph_replays, g.stats.steps) << what << ": prefill steps run eagerly";
  EXPECT_EQ(cuda::Graph::replays() - global_before, g.stats.cuda_graph_replays) << what;
  EXPECT_EQ(g.stats.cuda_graph_captures, 2) << what << ": captured at the first decode, again after the wake-up";
  EXPECT_GT(g.stats.preemptions, 0) << what << ": the cache is sized to force a swap";
  EXPECT_GT(g.stats.prefix_cache_hits, 0) << what;
  EXPECT_GT(g.stats.cuda_graph_too_large, 0) << what << ": no decode batch beyond the largest size (eager)";
  EXPECT_GT(g.stats.cuda_graph_padding_rows, 0) << what << ": no batch padded to a capture size";
  std::printf("[ %s ] %lld steps: %lld replayed graphs (%lld padding rows), %lld decodes too large for one; %lld "
              "captures, sleep before step %lld\n", what.c_str(), (long long)g.stats.steps,
              (long long)g.stats.cuda_graph_replays, (long long)g.stats.cuda_graph_padding_rows,
              (long long)g.stats.cuda_graph_too_large, (long long)g.stats.cuda_graph_captures, (long long)sleep_at);
}

}  // namespace

TEST(DecodeGraphSizes, VllmDefaultsAndRequestedSizes) {
  const std::vector<int64_t> d = default_capture_sizes(1024, 8192);
  ASSERT_GE(d.size(), 6u);
  EXPECT_EQ(std::vector<int64_t>(d.begin(), d.begin() + 6), (std::vector<int64_t>{1, 2, 4, 8, 16, 24}));
  EXPECT_EQ(d.back(), 512);
  EXPECT_EQ(d[d.size() - 2], 496);  // every 16 past 256
  EXPECT_EQ(std::count(d.begin(), d.end(), 248), 1);
  EXPECT_EQ(default_capture_sizes(20, 8192), (std::vector<int64_t>{1, 2, 4, 8, 16}));
  EXPECT_EQ(default_capture_sizes(256, 4), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(capture_sizes({8, 2, 2, 100}, 64, 8192).value(), (std::vector<int64_t>{2, 8}));
  EXPECT_FALSE(capture_sizes({4, 0}, 64, 8192).is_ok());
}

TEST_F(DecodeGraphsOnDevice, DenseF32SameAsEager) {
  auto m = tiny_on(Device::CUDA, DType::F32);
  compare(*m, DType::F32, rt::tiny_prompts(), {greedy(5), sampled(2, 11, 5)}, 16, "f32 llama");
}

TEST_F(DecodeGraphsOnDevice, DenseBf16SameAsEager) {
  auto m = tiny_on(Device::CUDA, DType::BF16);
  compare(*m, DType::BF16, rt::tiny_prompts(), {greedy(5), sampled(2, 11, 5)}, 16, "bf16 llama");
}

// DeepSeek-V2's attention (MLA: the latent cache) with dense MLPs in every
// layer (the golden model's MoE layers would decode eagerly).
TEST_F(DecodeGraphsOnDevice, MlaSameAsEager) {
  auto cfg = io::load_model_config(kestrel::testing::source_path("tests/golden/models/deepseek_v2"));
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().message();
  io::ModelConfig c = cfg.value();
  c.moe.first_k_dense_replace = c.num_hidden_layers;
  model::ModelOptions o;
  o.device = Device::CUDA;
  auto m = model::CausalLM::init_random(c, o, 7, 0.1);
  ASSERT_TRUE(c.mla.enabled && m->num_moe_layers() == 0);
  compare(*m, DType::F32, rt::moe_prompts(), {greedy(4), sampled(2, 5, 4)}, 8, "deepseek_v2 attention (MLA)");
}

// MoE decodes eagerly (one line on stderr says why) with the same outputs.
TEST_F(DecodeGraphsOnDevice, MoeDecodesEagerly) {
  auto m = golden_on("qwen2_moe", Device::CUDA);
  ASSERT_TRUE(m);
  int64_t never = 1 << 30;
  const RunOut g = drive(*m, config(false, 8), rt::moe_prompts(), {greedy(3)}, &never);
  const RunOut e = drive(*m, config(true, 8), rt::moe_prompts(), {greedy(3)}, &never);
  expect_same(e, g, DType::F32, "qwen2_moe");
  EXPECT_EQ(g.stats.cuda_graph_replays, 0);
  EXPECT_EQ(g.stats.cuda_graph_captures, 0);
}
