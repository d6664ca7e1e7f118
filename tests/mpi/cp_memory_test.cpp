// Context parallelism's memory and communication under mpirun
// (tests/scripts/mpi_cp_train.sh, 2 and 4 ranks): one training step of one
// 4,096-token sequence (the built-in tiny model's shape, f32) through the
// engine at cp = 1 (each rank alone) and at cp = world with each algorithm.
//  - The allocator's activation peak per rank against the memory model of
//    docs (rl::train_activations with the layout's cp and Ulysses degree):
//    within 10%, and it falls with cp.
//  - The bytes each rank sends over its cp groups (counted by decorating
//    them) against the closed form: layers x (forward + backward) of
//    parallel::cp_attention_bytes, plus the loss's two all-gathers of the
//    log-probs and entropies (f32 [Tl] each, (cp - 1) Tl 4 bytes on the wire).
// Prints "[cp memory]" and "[cp step bytes]" lines (docs/benchmarks.md).
#include <cstdio>

#include "comm/world.h"
#include "core/allocator.h"
#include "model/cp_batch.h"
#include "mpi_testing.h"
#include "parallel/comm_counter.h"
#include "parallel/grid.h"
#include "rl/memory_plan.h"
#include "train/builtin_model.h"
#include "train/engine.h"
#include "train/token_objective.h"

using namespace kestrel;

namespace {

constexpr int64_t kTokens = 4096;

io::ModelConfig config() { return train::builtin_model_config("tiny", 64, 1, 8192).value(); }

struct Counted {
  std::shared_ptr<parallel::CountingGroup> cp, ulysses, ring;  // ulysses / ring null when it is the cp group itself
  double wire_bytes() const {
    double b = cp->stats().total_wire_bytes();
    if (ulysses) b += ulysses->stats().total_wire_bytes();
    if (ring) b += ring->stats().total_wire_bytes();
    return b;
  }
};

// The world as the cp group (cp = world), groups decorated to count bytes.
parallel::CpGroups counted_groups(parallel::CpAlgo algo, int u_hybrid, Counted& c) {
  comm::World& world = *comm::World::current();
  const int n = world.size();
  parallel::ParallelDims dims;
  dims.cp = n;
  const parallel::GridLayout layout(dims, n);
  const int u = parallel::cp_ulysses_degree(algo, n, u_hybrid);
  const parallel::CpGroups raw = parallel::make_cp_groups(world, layout, world.group(), u);
  c.cp = std::make_shared<parallel::CountingGroup>(raw.cp);
  parallel::CpGroups g;
  g.cp = c.cp;
  auto wrap = [&](const std::shared_ptr<comm::ProcessGroup>& x, std::shared_ptr<parallel::CountingGroup>& slot) {
    if (x == raw.cp) return std::shared_ptr<comm::ProcessGroup>(c.cp);
    slot = std::make_shared<parallel::CountingGroup>(x);
    return std::shared_ptr<comm::ProcessGroup>(slot);
  };
  g.ulysses = wrap(raw.ulysses, c.ulysses);
  g.ring = wrap(raw.ring, c.ring);
  return g;
}

struct Step {
  int64_t activation_peak = 0;  // bytes above what was live before the step
  int64_t local_tokens = 0;
};

// One AdamW step of one kTokens-token sequence (mean token loss).
Step train_step(const model::ModelOptions& mo) {
  auto m = model::CausalLM::init_random(config(), mo, 5, 0.05);
  train::EngineOptions eo;
  eo.lr.lr = 1e-3;
  eo.lr.total_steps = 1;
  if (m->cp_size() > 1) eo.parallel.dp = comm::World::current()->group();  // gradients summed over cp (category Grads)
  train::TrainingEngine e(*m, eo);
  std::vector<int32_t> s;
  for (int64_t t = 0; t < kTokens; ++t) s.push_back(int32_t(2 + (t * 5 + (t * t) % 7) % 60));
  std::vector<train::MicroBatch> micro{{model::pack_sequences({s}), {}, {}}};
  const float w = 1.f / float(kTokens - 1);
  auto objective = [w](const train::MicroBatch& mb, size_t) {
    std::vector<float> weights;
    for (int32_t t : mb.batch.host.targets) weights.push_back(t >= 0 ? w : 0.f);
    train::Objective ob;
    ob.tokens = train::cross_entropy_objective(weights);
    ob.need_entropy_grad = false;
    return ob;
  };
  Allocator& alloc = cpu_allocator();
  const int64_t A = int64_t(MemCategory::Activations);
  const int64_t before = alloc.stats().live[size_t(A)];
  alloc.reset_peak();
  e.train_mini_batch(micro, objective, e.lr(0));
  Step r;
  r.activation_peak = alloc.stats().peak[size_t(A)] - before;
  r.local_tokens = model::cp_local_batch(*m, micro[0].batch).num_tokens;
  return r;
}

rl::TrainActivations predicted(int64_t cp, int64_t u) {
  rl::PlanInputs in;
  in.model = config();
  in.layout.cp = cp;
  in.layout.cp_ulysses = u;
  in.max_positions = 8192;
  return rl::train_activations(rl::plan_shapes(in, 1, 1), in, kTokens, DType::F32);
}

void check_layout(const char* name, parallel::CpAlgo algo, int u_hybrid) {
  auto& w = kestrel::testing::world_group();
  const int n = w.size();
  const int u = parallel::cp_ulysses_degree(algo, n, u_hybrid);
  Counted c;
  model::ModelOptions mo;
  mo.max_positions = 8192;
  mo.parallel.cp = std::make_shared<const parallel::CpGroups>(counted_groups(algo, u_hybrid, c));
  const Step got = train_step(mo);
  const rl::TrainActivations want = predicted(n, u);
  const double rel = double(got.activation_peak) / double(want.peak) - 1;
  EXPECT_LE(std::abs(rel), 0.10) << name << ": measured " << got.activation_peak << " B, the model " << want.peak;
  // The bytes this rank sent over its cp groups in the step.
  parallel::CpLayout L;
  {
    std::vector<int32_t> cu{0, int32_t(kTokens)}, pos;
    for (int64_t t = 0; t < kTokens; ++t) pos.push_back(int32_t(t));
    L = parallel::make_cp_layout({&cu, &pos}, n, w.rank(), u);
  }
  const io::ModelConfig cfg = config();
  const ops::AttentionShape s{cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, 0.f, 0};
  const parallel::CpAttentionBytes b = parallel::cp_attention_bytes(L, s, DType::F32);
  const double formula = double(cfg.num_hidden_layers) * (b.ulysses_fwd + b.ulysses_bwd + b.ring_fwd + b.ring_bwd) +
                         2.0 * 4.0 * double(n - 1) * double(L.local_tokens);
  EXPECT_EQ(c.wire_bytes(), formula) << name;
  if (w.rank() == 0) {
    std::printf("[cp memory] %s cp=%d u=%d: %lld tokens per rank, activation peak %lld B measured, %lld B modelled "
                "(%+.1f%%, at %s)\n",
                name, n, u, (long long)got.local_tokens, (long long)got.activation_peak, (long long)want.peak,
                100 * rel, want.at.c_str());
    std::printf("[cp step bytes] %s cp=%d u=%d: %.0f B sent over the cp groups, formula %.0f B\n", name, n, u,
                c.wire_bytes(), formula);
  }
}

}  // namespace

TEST(CpMemory, ActivationPeakAndBytesFollowTheModel) {
  auto& w = kestrel::testing::world_group();
  if (w.size() != 2 && w.size() != 4) GTEST_SKIP() << "written for 2 and 4 ranks";
  // cp = 1: each rank alone, the whole sequence.
  {
    model::ModelOptions mo;
    mo.max_positions = 8192;
    const Step one = train_step(mo);
    const rl::TrainActivations want = predicted(1, 1);
    EXPECT_LE(std::abs(double(one.activation_peak) / double(want.peak) - 1), 0.10);
    if (w.rank() == 0)
      std::printf("[cp memory] none cp=1: %lld tokens per rank, activation peak %lld B measured, %lld B modelled "
                  "(%+.1f%%, at %s)\n",
                  (long long)kTokens, (long long)one.activation_peak, (long long)want.peak,
                  100 * (double(one.activation_peak) / double(want.peak) - 1), want.at.c_str());
  }
  check_layout("ulysses", parallel::CpAlgo::Ulysses, 0);
  check_layout("ring", parallel::CpAlgo::Ring, 0);
  if (w.size() == 4) check_layout("hybrid", parallel::CpAlgo::Hybrid, 2);
}
