// Activation recompute (model/recompute.h): step time (forward + backward +
// AdamW) and the measured activation peak of each mode against none, on a
// random-weight model built from an HF config.json. The modes run
// interleaved, round after round, and each reports its best step, so a
// machine shared with other work skews them alike. Besides the wall time it
// reports process CPU time per thread (less sensitive to descheduling).
//
//   build/release/bench_recompute_bench --config bench/configs/small.json
//       --threads 2 --seq 512 --batch-tokens 2048 --rounds 3 [--dtype fp32|bf16]   (one command line)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "bench_timing.h"
#include "core/allocator.h"
#include "core/parallel_for.h"
#include "core/rng.h"
#include "io/model_config.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "train/token_objective.h"

using namespace kestrel;
using Clock = std::chrono::steady_clock;

namespace {

struct Mode {
  std::string name;
  model::RecomputePolicy policy;
};

model::RecomputePolicy make(const std::string& g, const std::string& m, int64_t n, std::vector<std::string> mods,
                            bool act, bool norm) {
  return model::make_recompute_policy(g, m, n, mods, act, -1, norm, -1, "").value();
}

struct Runner {
  std::unique_ptr<model::CausalLM> model;
  std::unique_ptr<optim::AdamW> opt;
  std::vector<Tensor> masters;
  double best_s = 1e30, best_cpu_s = 1e30;
  int64_t peak = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string config = "bench/configs/small.json", dtype_s = "fp32";
  int threads = 2, rounds = 3;
  int64_t seq = 512, batch_tokens = 2048;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--config") config = v;
    else if (k == "--threads") threads = std::atoi(v.c_str());
    else if (k == "--seq") seq = std::atoll(v.c_str());
    else if (k == "--batch-tokens") batch_tokens = std::atoll(v.c_str());
    else if (k == "--rounds") rounds = std::atoi(v.c_str());
    else if (k == "--dtype") dtype_s = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  set_num_threads(threads);
  if (Status st = cpu::gemm_init(); !st.is_ok()) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    return 1;
  }
  auto cfg = io::load_model_config(config);
  if (!cfg.is_ok()) {
    std::fprintf(stderr, "%s\n", cfg.status().message().c_str());
    return 1;
  }
  const DType dt = dtype_s == "bf16" ? DType::BF16 : DType::F32;
  const int64_t L = cfg->num_hidden_layers;
  std::vector<Mode> modes = {{"none", {}},
                             {"full/uniform/1", make("full", "uniform", 1, {}, false, false)},
                             {"full/uniform/2", make("full", "uniform", 2, {}, false, false)},
                             {"full/block/" + std::to_string(L / 2), make("full", "block", L / 2, {}, false, false)},
                             {"selective core_attn", make("selective", "", -1, {"core_attn"}, false, false)},
                             {"selective mlp", make("selective", "", -1, {"mlp"}, false, false)},
                             {"activation function", make("", "", -1, {}, true, false)},
                             {"norm", make("", "", -1, {}, false, true)},
                             {"core_attn+act+norm", make("selective", "", -1, {"core_attn"}, true, true)}};

  // batch_tokens / seq rows of random tokens, packed.
  std::vector<std::vector<int32_t>> rows;
  Philox rng{42, 0};
  uint64_t k = 0;
  for (int64_t r = 0; r < batch_tokens / seq; ++r) {
    std::vector<int32_t> s(static_cast<size_t>(seq));
    for (auto& t : s) t = int32_t(rng.uniform(k++) * float(cfg->vocab_size)) % int32_t(cfg->vocab_size);
    rows.push_back(s);
  }
  const model::PackedBatch b = model::pack_sequences(rows);
  std::vector<float> w(size_t(b.num_tokens), 1.0f / float(b.num_tokens));
  const auto objective = train::cross_entropy_objective(w);

  std::vector<Runner> runs(modes.size());
  for (size_t i = 0; i < modes.size(); ++i) {
    model::ModelOptions opts;
    opts.dtype = dt;
    opts.max_positions = std::max<int64_t>(seq, 16);
    opts.recompute = modes[i].policy;
    Runner& r = runs[i];
    r.model = model::CausalLM::init_random(cfg.value(), opts, 1234);
    r.model->enable_grads();
    std::vector<optim::ParamSlot> slots;
    r.masters.reserve(r.model->params().size());
    for (model::Param* p : r.model->params()) {
      if (dt == DType::F32) {
        slots.push_back({p->name, p->weight, p->grad, Tensor(), p->weight_decay});
      } else {
        r.masters.push_back(p->weight.to(DType::F32, MemCategory::OptimizerState));
        slots.push_back({p->name, r.masters.back(), p->grad, p->weight, p->weight_decay});
      }
    }
    r.opt = std::make_unique<optim::AdamW>(slots, optim::AdamWConfig{0.9, 0.95, 1e-8, 0.1});
  }
  // Round 0 warms up (and measures the peaks); rounds 1.. are timed.
  std::vector<double> losses(modes.size());
  for (int round = 0; round <= rounds; ++round)
    for (size_t i = 0; i < modes.size(); ++i) {
      Runner& r = runs[i];
      cpu_allocator().reset_peak();
      const int64_t before = cpu_allocator().stats().live_of(MemCategory::Activations);
      const auto t0 = Clock::now();
      const double c0 = bench::cpu_seconds();
      r.model->zero_grads();
      losses[i] = train::forward_backward(*r.model, b, objective, false).loss;
      r.opt->step(1e-4);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      const double cs = (bench::cpu_seconds() - c0) / threads;  // leaves out time the threads were descheduled
      if (round == 0) {
        r.peak = cpu_allocator().stats().peak_of(MemCategory::Activations) - before;
      } else {
        r.best_s = std::min(r.best_s, s);
        r.best_cpu_s = std::min(r.best_cpu_s, cs);
      }
    }
  std::printf("config %s, %s, %d threads, %lld tokens (seq %lld), best of %d interleaved rounds\n", config.c_str(),
              dtype_s.c_str(), threads, (long long)b.num_tokens, (long long)seq, rounds);
  std::printf("| mode | step s (wall) | CPU s / thread | CPU vs none | activation peak MiB | vs none | loss |\n"
              "|---|---:|---:|---:|---:|---:|---|\n");
  for (size_t i = 0; i < modes.size(); ++i)
    std::printf("| %s | %.3f | %.3f | %+.1f%% | %.1f | %+.1f%% | %.6f |\n", modes[i].name.c_str(), runs[i].best_s,
                runs[i].best_cpu_s, 100.0 * (runs[i].best_cpu_s / runs[0].best_cpu_s - 1),
                double(runs[i].peak) / 1048576.0, 100.0 * (double(runs[i].peak) / double(runs[0].peak) - 1),
                losses[i]);
  return 0;
}
