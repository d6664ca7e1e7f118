// Large-EP rollout under mpirun (tests/scripts/mpi_hier_a2a.sh, 2 and 4
// ranks; the world as the ep group): each rank's rollout engine runs on the
// tiny Qwen3-MoE / DeepSeek-V3 golden holding only its block of experts
// (ModelParallel::ep, read in place), every step's tokens dispatched to their
// experts' ranks and back. The ranks get different numbers of requests of
// different lengths (the last rank none), so the ranks that finish first
// serve the others' tokens with one-token idle steps on the null block.
// Greedy output equals one process's engine holding every expert token for
// token, its logprobs within 1e-5; with the all-to-all and allgather
// dispatchers alike.
#include <string>
#include <vector>

#include "comm/world.h"
#include "common/testing.h"
#include "mpi_testing.h"
#include "rollout/engine.h"
#include "train_testing.h"

using namespace kestrel;
using namespace kestrel::testing;

namespace {

rollout::EngineConfig engine_config() {
  rollout::EngineConfig c;
  c.block_size = 8;
  c.num_blocks = 64;
  c.max_num_batched_tokens = 24;  // long prompts prefill in chunks: more steps, some mixed with decodes
  c.max_num_seqs = 16;
  c.enable_prefix_caching = false;
  return c;
}

// Rank r's requests: r + 1 prompts (none on the last rank of 4), lengths and budgets differing by rank.
std::vector<std::vector<int32_t>> prompts_of(int rank, int ranks) {
  std::vector<std::vector<int32_t>> out;
  const int n = ranks == 4 && rank == 3 ? 0 : rank + 1;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p;
    for (int t = 0; t < 5 + (rank * 7 + i * 11) % 23; ++t) p.push_back(int32_t(1 + (rank * 31 + i * 13 + t * 7) % 90));
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<rollout::RequestOutput> generate(const model::CausalLM& m, const std::vector<std::vector<int32_t>>& prompts,
                                             int rank, rollout::EngineStats* stats) {
  auto e = rollout::Engine::create(m, engine_config());
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  if (!e.is_ok()) return {};
  for (size_t i = 0; i < prompts.size(); ++i) {
    rollout::SamplingParams p;
    p.temperature = 0;
    p.max_tokens = 4 + 3 * rank + int64_t(i);
    p.ignore_eos = true;
    EXPECT_TRUE((*e)->add_request("r" + std::to_string(i), prompts[i], p).is_ok());
  }
  auto outs = (*e)->run_to_completion();
  if (stats) *stats = (*e)->stats();
  return outs;
}

}  // namespace

TEST(EpRollout, GreedyEqualsOneProcessWithIdleRanks) {
  auto& w = world_group();
  const int n = w.size();
  if (n != 2 && n != 4) GTEST_SKIP() << "written for 2 and 4 ranks";
  for (const std::string c : {"qwen3_moe", "deepseek_v3"})
    for (const model::MoeDispatcher d : {model::MoeDispatcher::AllToAll, model::MoeDispatcher::AllGather}) {
      SCOPED_TRACE(c + (d == model::MoeDispatcher::AllToAll ? " alltoall" : " allgather"));
      model::ModelOptions o;
      o.parallel.ep = comm::World::current()->group();
      o.moe.dispatcher = d;
      auto ep_model = model::CausalLM::load(golden_model(c), o);
      auto one_model = model::CausalLM::load(golden_model(c), model::ModelOptions{});
      ASSERT_TRUE(ep_model.is_ok() && one_model.is_ok());
      const auto prompts = prompts_of(w.rank(), n);
      rollout::EngineStats st;
      const auto got = generate(**ep_model, prompts, w.rank(), &st);
      const auto want = generate(**one_model, prompts, w.rank(), nullptr);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].outputs.size(), 1u);
        EXPECT_EQ(got[i].outputs[0].token_ids, want[i].outputs[0].token_ids) << "request " << i;
        const auto& a = got[i].outputs[0].logprobs;
        const auto& b = want[i].outputs[0].logprobs;
        ASSERT_EQ(a.size(), b.size());
        for (size_t t = 0; t < a.size(); ++t) EXPECT_NEAR(a[t], b[t], 1e-5) << "request " << i << " token " << t;
      }
      // The ranks stepped together: rank 0 (one short request) idled while the others worked.
      int64_t steps = st.steps + st.idle_steps, most = steps;
      w.all_reduce(&most, 1, DType::I64, comm::ReduceOp::Max);
      EXPECT_EQ(steps, most) << "every ep rank runs every step";
      if (w.rank() == 0) {
        EXPECT_GT(st.idle_steps, 0);
      }
      if (n == 4 && w.rank() == 3) {
        EXPECT_EQ(st.steps, 0);
      }
    }
}
