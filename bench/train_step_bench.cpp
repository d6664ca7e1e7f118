// Training-step throughput: forward + backward + AdamW on a random-weight model
// built from an HF config.json, in Kestrel, with a fixed thread count.
// Prints one JSON line per run, comparable with bench/peers/torch_train_step.py
// (same flags), plus model-FLOP utilisation against a GEMM peak measured in
// the same process (a large square sgemm through the same BLAS).
//
//   build/release/bench_train_step_bench --config bench/configs/small.json
//       --threads 2 --seq 512 --batch-tokens 2048 --steps 5 [--dtype fp32|bf16]   (one command line)
//
// --scoring plain|packed times a forward-only scoring pass (model::score_tokens:
// log-prob and entropy of every token) instead, the way the RL trainer
// scores old and reference log-probs: "packed" multiplies by weights packed
// once (model::ForwardPacksScope; the packing happens in the first, warm-up
// call and is reported separately), "plain" by the GEMM library as chosen.
//
// --micro-batches N splits each step's rows into N micro-batches (gradients
// accumulated, one AdamW step), as an RL mini-batch runs; --train-packs 0|1
// multiplies every micro-batch's forward x @ W^T by weights packed once per
// step (model::TrainPacksScope), the packing inside the timed step; the
// default is the training engine's rule (train/engine.cpp: bf16 weights only).
//
// --device cuda (a build with the CUDA backend) runs the model, its gradients
// and AdamW's state on GPU 0; each step ends with the stream synchronised, and
// the utilisation is given against a bf16/f32 matmul of 8192^3 through the same
// cuBLAS path (ops::linear_fwd) measured in the process, and against
// --peak-tflops (the chip's datasheet peak; 790 = an H200's dense bf16).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "bench_device.h"
#include "bench_timing.h"
#include "core/parallel_for.h"
#include "core/rng.h"
#include "io/model_config.h"
#include "model/scoring.h"
#include "model/transformer.h"
#include "ops/linear.h"
#include "ops/op_profile.h"
#include "optim/adamw.h"
#include "train/engine.h"
#include "train/token_objective.h"

using namespace kestrel;
using Clock = std::chrono::steady_clock;

static double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Best of a few 1024^3 sgemms: the practical matmul peak of this machine and BLAS.
static double measure_gemm_peak_gflops() {
  const int64_t n = 1024;
  std::vector<float> a(size_t(n * n), 0.5f), b(size_t(n * n), 0.25f), c(size_t(n * n));
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    auto t0 = Clock::now();
    cpu::sgemm(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    best = std::max(best, 2.0 * n * n * n / seconds_since(t0) / 1e9);
  }
  return best;
}

// Best of a few n^3 matmuls (n = --peak-gemm-n, 8192 by default) y = x w^T through ops::linear_fwd on dev in dtype
// dt (the model's own GEMM path): the practical peak on a device, GFLOP/s.
static double measure_device_gemm_peak_gflops(Device dev, DType dt, int64_t n) {
  Tensor x = Tensor::empty({n, n}, dt, MemCategory::Other, dev), w = Tensor::empty({n, n}, dt, MemCategory::Other, dev),
         y = Tensor::empty({n, n}, dt, MemCategory::Other, dev);
  x.fill_(0.5f);
  w.fill_(0.25f);
  double best = 0;
  for (int r = 0; r < 6; ++r) {
    bench::sync_device(dev);
    auto t0 = Clock::now();
    ops::linear_fwd(x, w, nullptr, y);
    bench::sync_device(dev);
    if (r > 0) best = std::max(best, 2.0 * double(n) * n * n / seconds_since(t0) / 1e9);
  }
  return best;
}

// Forward + backward FLOPs per token of the matmuls (6 x active matmul
// params) and of causal attention at sequence length seq.
static double model_flops_per_token(const io::ModelConfig& c, int64_t seq) {
  const double D = double(c.hidden_size), V = double(c.vocab_size), H = double(c.num_attention_heads);
  double attn_params = 0, qk_width = 0, v_width = 0;  // per layer; widths summed over heads
  if (c.mla.enabled) {
    const auto& m = c.mla;
    const double qk = double(m.qk_head_dim()), qr = double(m.q_lora_rank);
    attn_params = (m.q_lora_rank > 0 ? D * qr + qr * H * qk : D * H * qk) +
                  D * double(m.kv_lora_rank + m.qk_rope_head_dim) +
                  double(m.kv_lora_rank) * H * double(m.qk_nope_head_dim + m.v_head_dim) + H * double(m.v_head_dim) * D;
    qk_width = H * qk;
    v_width = H * double(m.v_head_dim);
  } else {
    attn_params = D * double(c.q_dim()) * 2 + D * double(c.kv_dim()) * 2;
    qk_width = v_width = double(c.q_dim());
  }
  double matmul_params = V * D;  // lm_head
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    double mlp = 3 * D * double(c.intermediate_size);
    if (c.is_moe_layer(l)) {
      const auto& m = c.moe;
      mlp = double(m.num_experts) * D + double(m.top_k) * 3 * D * double(m.moe_intermediate_size) +
            3 * D * double(m.shared_intermediate_size) + (m.shared_expert_gate ? D : 0);
    }
    matmul_params += attn_params + mlp;
  }
  const double attn = double(c.num_hidden_layers) * 2 * (double(seq) / 2) * (qk_width + v_width);
  return 6 * matmul_params + 3 * attn;
}

int main(int argc, char** argv) {
  std::string config = "bench/configs/small.json", dtype_s = "fp32", scoring, device_s = "cpu";
  double peak_tflops = 0;  // the datasheet peak, for the device's MFU
  int64_t peak_gemm_n = 8192;
  int threads = 2, steps = 5, warmup = 2, micro_batches = 1, train_packs = -1;
  int64_t seq = 512, batch_tokens = 2048;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--config") config = v;
    else if (k == "--threads") threads = std::atoi(v.c_str());
    else if (k == "--seq") seq = std::atoll(v.c_str());
    else if (k == "--batch-tokens") batch_tokens = std::atoll(v.c_str());
    else if (k == "--steps") steps = std::atoi(v.c_str());
    else if (k == "--warmup") warmup = std::atoi(v.c_str());
    else if (k == "--dtype") dtype_s = v;
    else if (k == "--scoring" && (v == "plain" || v == "packed")) scoring = v;
    else if (k == "--micro-batches") micro_batches = std::max(1, std::atoi(v.c_str()));
    else if (k == "--train-packs") train_packs = std::atoi(v.c_str());
    else if (k == "--device") device_s = v;
    else if (k == "--peak-tflops") peak_tflops = std::atof(v.c_str());
    else if (k == "--peak-gemm-n") peak_gemm_n = std::max<int64_t>(64, std::atoll(v.c_str()));
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  set_num_threads(threads);
  // The GEMM choice (and its one-time micro-benchmark) before any timing.
  if (Status st = cpu::gemm_init(); !st.is_ok()) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    return 1;
  }
  if (device_s != "cpu" && !scoring.empty()) {
    std::fprintf(stderr, "--scoring with --device %s: not supported yet (the packed weights are the CPU's)\n",
                 device_s.c_str());
    return 2;
  }
  Device device = Device::CPU;
  if (!bench::init_device(device_s, &device)) return 1;
  auto cfg = io::load_model_config(config);
  if (!cfg.is_ok()) {
    std::fprintf(stderr, "%s\n", cfg.status().message().c_str());
    return 1;
  }
  DType dt = dtype_s == "bf16" ? DType::BF16 : DType::F32;
  model::ModelOptions opts;
  opts.dtype = dt;
  opts.max_positions = std::max<int64_t>(seq, 16);
  opts.device = device;
  auto m = model::CausalLM::init_random(cfg.value(), opts, 1234);
  if (train_packs < 0)  // the training engine's rule
    train_packs = train::train_packs_apply(device, dt, 1, 1, 1, m->num_moe_layers() > 0, cfg->mla.enabled) ? 1 : 0;
  m->enable_grads();
  std::vector<optim::ParamSlot> slots;
  std::vector<Tensor> masters;
  for (model::Param* p : m->params()) {
    if (dt == DType::F32) {
      slots.push_back({p->name, p->weight, p->grad, Tensor(), p->weight_decay});
    } else {
      masters.push_back(p->weight.to(DType::F32, MemCategory::OptimizerState));
      slots.push_back({p->name, masters.back(), p->grad, p->weight, p->weight_decay});
    }
  }
  optim::AdamW opt(slots, {0.9, 0.95, 1e-8, 0.1});

  // batch_tokens / seq rows of random tokens, packed.
  std::vector<std::vector<int32_t>> rows;
  Philox rng{42, 0};
  uint64_t k = 0;
  for (int64_t r = 0; r < batch_tokens / seq; ++r) {
    std::vector<int32_t> s(static_cast<size_t>(seq));
    for (auto& t : s) t = int32_t(rng.uniform(k++) * float(cfg->vocab_size)) % int32_t(cfg->vocab_size);
    rows.push_back(s);
  }
  model::PackedBatch b = model::to_device(model::pack_sequences(rows), device);
  std::vector<float> w(size_t(b.num_tokens), 1.0f / float(b.num_tokens));
  auto objective = train::cross_entropy_objective(w);
  // The same rows as micro-batches: rows split as evenly as they go.
  std::vector<model::PackedBatch> micro;
  std::vector<train::TokenObjective> micro_obj;
  if (micro_batches > 1 || train_packs > 0) {
    const size_t per = (rows.size() + size_t(micro_batches) - 1) / size_t(micro_batches);
    for (size_t r0 = 0; r0 < rows.size(); r0 += per) {
      std::vector<std::vector<int32_t>> part(rows.begin() + long(r0), rows.begin() + long(std::min(rows.size(), r0 + per)));
      micro.push_back(model::to_device(model::pack_sequences(part), device));
      std::vector<float> mw(size_t(micro.back().num_tokens), 1.0f / float(b.num_tokens));
      micro_obj.push_back(train::cross_entropy_objective(mw));
    }
  }

  if (!scoring.empty()) {
    cpu::WeightPacks packs;
    std::optional<model::ForwardPacksScope> scope;
    if (scoring == "packed") scope.emplace(*m, &packs);
    auto t0 = Clock::now();
    model::score_tokens(*m, b);  // warm-up; packs every weight when packed
    const double first_s = seconds_since(t0);
    std::vector<double> times;
    for (int s = 0; s < steps; ++s) {
      t0 = Clock::now();
      model::score_tokens(*m, b);
      times.push_back(seconds_since(t0));
    }
    std::sort(times.begin(), times.end());
    const double pass_s = times[times.size() / 2];
    std::printf("{\"engine\": \"kestrel\", \"mode\": \"scoring %s\", \"config\": \"%s\", \"threads\": %d, \"dtype\": "
                "\"%s\", \"tokens_per_s\": %.1f, \"pass_s\": %.4f, \"first_pass_s\": %.4f, \"packed_bytes\": %lld, %s}\n",
                scoring.c_str(), config.c_str(), threads, dtype_s.c_str(), double(b.num_tokens) / pass_s, pass_s, first_s,
                (long long)packs.bytes(), bench::machine_json_fields().c_str());
    return 0;
  }

  // Wall time per step, and process CPU time per step / threads: on a shared
  // machine the second leaves out time the threads were descheduled.
  std::vector<double> times, cpu_times;
  double loss = 0;
  for (int s = 0; s < warmup + steps; ++s) {
    if (s == warmup) ops::op_profile_reset();  // KESTREL_OP_PROFILE: the timed steps only
    auto t0 = Clock::now();
    const double c0 = bench::cpu_seconds();
    m->zero_grads();
    if (micro.empty()) {
      loss = train::forward_backward(*m, b, objective, false).loss;
    } else {
      cpu::WeightPacks packs;  // per step: the weights change at every AdamW step
      model::TrainPacksScope scope(*m, train_packs > 0 ? &packs : nullptr);
      loss = 0;
      for (size_t i = 0; i < micro.size(); ++i) loss += train::forward_backward(*m, micro[i], micro_obj[i], false).loss;
    }
    opt.step(1e-4);
    bench::sync_device(device);
    if (s >= warmup) {
      times.push_back(seconds_since(t0));
      cpu_times.push_back((bench::cpu_seconds() - c0) / threads);
    }
  }
  std::sort(times.begin(), times.end());
  const double step_s = times[times.size() / 2];
  std::sort(cpu_times.begin(), cpu_times.end());
  const double cpu_step_s = cpu_times[cpu_times.size() / 2];

  // Model FLOPs per step: 6 x (matmul params a token passes through, incl.
  // lm_head) per token, plus causal attention 3 x 2 x (seq/2) x (q.k width +
  // value width) x heads per token per layer. A MoE layer counts its router,
  // its k routed experts and its shared expert(s) (the active parameters); an
  // MLA layer its q (LoRA or full), kv_a, kv_b and o projections.
  const double flops = double(b.num_tokens) * model_flops_per_token(cfg.value(), seq);
  if (ops::op_profile_enabled()) {
    const std::string title = "op profile of " + std::to_string(steps) + " training steps";
    ops::op_profile_report(stdout, title.c_str());
  }
  if (device == Device::CUDA) {
    const double peak = measure_device_gemm_peak_gflops(device, dt, peak_gemm_n);
    const double achieved = flops / step_s / 1e9;
    std::printf(
        "{\"engine\": \"kestrel\", \"device\": \"cuda\", \"config\": \"%s\", \"dtype\": \"%s\", \"seq\": %lld, "
        "\"batch_tokens\": %lld, \"tokens_per_s\": %.1f, \"step_s\": %.4f, \"params\": %lld, \"loss\": %.4f, "
        "\"model_tflops_per_s\": %.1f, \"gemm_peak_tflops\": %.1f, \"mfu_vs_gemm_peak\": %.3f, \"mfu_vs_datasheet\": "
        "%.3f, \"datasheet_tflops\": %.0f, \"micro_batches\": %d}\n",
        config.c_str(), dtype_s.c_str(), (long long)seq, (long long)b.num_tokens, double(b.num_tokens) / step_s, step_s,
        (long long)m->num_parameters(), loss, achieved / 1e3, peak / 1e3, achieved / peak,
        peak_tflops > 0 ? achieved / 1e3 / peak_tflops : 0.0, peak_tflops, int(std::max<size_t>(1, micro.size())));
    return 0;
  }
  const double peak = measure_gemm_peak_gflops();
  std::printf(
      "{\"engine\": \"kestrel\", \"config\": \"%s\", \"threads\": %d, \"dtype\": \"%s\", \"tokens_per_s\": %.1f, "
      "\"step_s\": %.4f, \"step_s_min\": %.4f, \"step_s_max\": %.4f, \"cpu_step_s\": %.4f, \"params\": %lld, \"loss\": %.4f, "
      "\"model_gflops_per_s\": %.1f, \"gemm_peak_gflops\": %.1f, "
      "\"mfu_vs_gemm_peak\": %.3f, \"micro_batches\": %d, \"train_packs\": %d, %s}\n",
      config.c_str(), threads, dtype_s.c_str(), double(b.num_tokens) / step_s, step_s, times.front(), times.back(),
      cpu_step_s, (long long)m->num_parameters(),
      loss, flops / step_s / 1e9, peak, flops / step_s / 1e9 / peak, int(std::max<size_t>(1, micro.size())),
      train_packs > 0 ? 1 : 0, bench::machine_json_fields().c_str());
  return 0;
}
