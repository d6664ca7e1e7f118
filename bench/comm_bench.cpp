// Communication volume and step time of one training step per parallel layout.
//
//   OMP_NUM_THREADS=2 build/<b>/bench_comm_bench                         (TP1, one process)
//   OMP_NUM_THREADS=1 mpirun -np 2 build/<b>/bench_comm_bench            (TP2, TP2+SP, DP2, DP2+dist-opt)
//   ... bench_comm_bench --collective-timeout 0   (blocking MPI calls: no timeout polling)
//
// Every layout runs one fp32 training step (forward, vocab-parallel
// logprob/entropy, backward, DP gradient sync, grad clipping, AdamW, param
// gather) on the same model and global batch, with CountingGroup wrappers on
// the tp and dp groups. Printed per layout (rank 0): the bytes this rank sent
// under the ring cost model (parallel/comm_counter.h) per collective kind,
// the closed-form prediction, and the median step time of 3 steps after one
// warm-up. Closed forms (per rank; n = tp, d = dp, T tokens of the rank's
// dp shard, D hidden, L layers, N parameters on the rank, b = 4 bytes):
//   TP (no SP): (4L + 2) all-reduces of [T, D]  -> 2(n-1)/n * (4L+2) T D b
//     (per layer o and down in forward, the q/k/v and gate/up input grads in
//      backward; the embedding output; the lm_head input grad)
//   TP + SP:    (8L + 4) all-gathers/reduce-scatters of [T, D] -> the same bytes
//     + norm-weight grads: (2L + 1) all-reduces of [D]
//   vocab-parallel logprob: all-reduce [T] (max) + [3T] (sums)
//   DP all-reduce: 2(d-1)/d * N b;  distributed optimizer: reduce-scatter
//     (d-1)/d * N b + param all-gather (d-1)/d * N b: the same total.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "comm/world.h"
#include "core/parallel_for.h"
#include "model/parallel_setup.h"
#include "model/scoring.h"
#include "optim/adamw.h"
#include "parallel/comm_counter.h"
#include "parallel/setup.h"

using namespace kestrel;

namespace {

io::ModelConfig bench_config() {
  io::ModelConfig c;
  c.arch = io::Arch::Qwen2;
  c.model_type = "qwen2";
  c.vocab_size = 4096;
  c.hidden_size = 512;
  c.intermediate_size = 1408;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 64;
  c.max_position_embeddings = 256;
  c.attention_bias = true;
  c.rope.head_dim = 64;
  return c;
}

constexpr int kSeqs = 8, kSeqLen = 128;

struct Layout {
  const char* name;
  int tp;
  bool sp, dist;
};

void run(comm::World& world, const Layout& L) {
  const io::ModelConfig cfg = bench_config();
  auto grid = parallel::make_process_grid(world, parallel::dims_for(L.tp, L.sp), model::model_facts(cfg));
  if (!grid.is_ok()) KS_FAIL(grid.status().message());
  auto tpc = std::make_shared<parallel::CountingGroup>(grid.value()->group(parallel::GroupKind::Tp));
  auto dpc = std::make_shared<parallel::CountingGroup>(grid.value()->group(parallel::GroupKind::Dp));
  model::ModelOptions opts;
  opts.parallel.tp = tpc;
  opts.parallel.sequence_parallel = L.sp;
  auto mp = model::CausalLM::init_random(cfg, opts, 7, 0.02);
  auto& m = *mp;
  parallel::DpOptions dpo;
  dpo.distributed_optimizer = L.dist;
  parallel::DataParallel dp(model::dp_params(m), *dpc, dpo);
  m.set_grad_ready_hook([&](int64_t s) { dp.grads_ready(s); });
  std::vector<optim::ParamSlot> slots;
  for (const auto& p : dp.flat_params()) slots.push_back({p.name, *p.weight, *p.grad, Tensor(), true});
  auto [lo, hi] = dp.owned_range();
  optim::AdamW opt(slots, {}, lo, hi);

  const int d = dpc->size(), n = tpc->size();
  std::vector<std::vector<int32_t>> seqs;
  for (int s = dpc->rank(); s < kSeqs; s += d) {  // this dp rank's share of the global batch
    std::vector<int32_t> q(kSeqLen);
    for (int j = 0; j < kSeqLen; ++j) q[size_t(j)] = int32_t((s * 131 + j * 17) % cfg.vocab_size);
    seqs.push_back(q);
  }
  model::PackedBatch b = model::pack_sequences(seqs);
  const int64_t T = b.num_tokens;

  std::vector<double> times;
  for (int it = 0; it < 4; ++it) {
    if (it == 1) tpc->reset(), dpc->reset();  // count one step (it = 1); time steps 1..3
    world.group()->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    dp.zero_grads();
    dp.start_grad_sync();
    model::Activations acts;
    Tensor logits = m.forward(b, acts);
    Tensor lp = Tensor::empty({T}, DType::F32), ent = Tensor::empty({T}, DType::F32);
    Tensor lse = Tensor::empty({T}, DType::F32);
    model::logprob_entropy_fwd(m, logits, b.targets, lp, &ent, lse);
    Tensor dlp = Tensor::zeros({T}, DType::F32);
    for (int64_t t = 0; t < T; ++t)
      if (b.targets.data<int32_t>()[t] >= 0) dlp.data<float>()[t] = -1.0f / float(T);
    m.backward(b, acts, [&] {
      Tensor dl = logits;  // f32: overwritten by its gradient
      model::logprob_entropy_bwd(m, logits, b.targets, lse, dlp, nullptr, nullptr, dl);
      return dl;
    }());
    dp.finish_grad_sync();
    dp.clip_grad_norm(1.0, tpc.get());
    opt.step_range(lo, hi, 1e-4);
    dp.gather_params();
    world.group()->barrier();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (it == 1) {
      // Snapshot the counts of exactly one step.
      const parallel::CommStats tps = tpc->stats(), dps = dpc->stats();
      const double Db = double(cfg.hidden_size) * 4, Ld = double(cfg.num_hidden_layers);
      const double ring_ar = n > 1 ? 2.0 * (n - 1) / n : 0.0, ring_ag = n > 1 ? double(n - 1) / n : 0.0;
      const int64_t Tp = L.sp ? (T + n - 1) / n * n : T;
      double tp_formula = L.sp ? (8 * Ld + 4) * ring_ag * double(Tp) * Db + (2 * Ld + 1) * ring_ar * Db
                               : (4 * Ld + 2) * ring_ar * double(T) * Db;
      tp_formula += ring_ar * 4.0 * double(T) * 4;  // vocab-parallel logprob: [T] max + [3T] sums
      const double dring = d > 1 ? 2.0 * (d - 1) / d : 0.0;
      const double dp_formula = dring * double(dp.padded_numel()) * 4;
      if (world.rank() == 0) {
        std::printf("\n== %s: tp=%d dp=%d sp=%d dist_opt=%d, %lld tokens per dp rank, %lld params per rank\n", L.name,
                    n, d, int(m.sequence_parallel()), int(L.dist), (long long)T, (long long)dp.numel());
        std::printf("  tp group:\n%s", tps.total_calls() ? tps.to_string().c_str() : "    (no collectives)\n");
        std::printf("  tp wire bytes/step: counted %.0f, closed form %.0f (ratio %.4f)\n", tps.total_wire_bytes(),
                    tp_formula, tp_formula > 0 ? tps.total_wire_bytes() / tp_formula : 0.0);
        std::printf("  dp group:\n%s", dps.total_calls() ? dps.to_string().c_str() : "    (no collectives)\n");
        std::printf("  dp wire bytes/step: counted %.0f, closed form %.0f (ratio %.4f)\n", dps.total_wire_bytes(),
                    dp_formula, dp_formula > 0 ? dps.total_wire_bytes() / dp_formula : 0.0);
      }
    }
    if (it > 0) times.push_back(secs);
  }
  std::sort(times.begin(), times.end());
  if (world.rank() == 0)
    std::printf("  step time (median of %zu): %.3f s with %d threads per rank\n", times.size(), times[times.size() / 2],
                num_threads());
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<comm::World> world;
  try {
    world = std::make_unique<comm::World>(comm::WorldOptions{}, &argc, &argv);
    const int w = world->size();
    // --collective-timeout S (default 600, verl's nccl_timeout): 0 runs the
    // blocking MPI calls, so the cost of the timeout's polling can be compared.
    for (int i = 1; i + 1 < argc; ++i)
      if (std::string(argv[i]) == "--collective-timeout") comm::World::set_collective_timeout(std::atof(argv[i + 1]));
    if (world->rank() == 0) std::printf("collective timeout: %g s\n", comm::World::collective_timeout());
    const Layout layouts[] = {{"TP1", 1, false, false},       {"TP2", 2, false, false}, {"TP2+SP", 2, true, false},
                              {"DP (tp=1)", 1, false, false}, {"DP dist-opt", 1, false, true}};
    for (const Layout& L : layouts) {
      if ((w == 1) != (std::string(L.name) == "TP1")) continue;  // TP1 alone on one process
      if (w % L.tp != 0) continue;
      run(*world, L);
    }
    return 0;
  } catch (const std::exception& e) {
    if (world && world->size() > 1) comm::abort_world(e.what());
    std::fprintf(stderr, "comm_bench: %s\n", e.what());
    return 1;
  }
}
