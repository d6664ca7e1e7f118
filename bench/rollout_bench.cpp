// Rollout engine benchmarks on the "small" config (bench/configs/small.json:
// hidden 512, 8 layers, 8 heads, 2 KV heads, ffn 1536, vocab 8192), random
// weights, f32:
//  1. Throughput: P prompts x n samples, 128 prompt tokens, 256 new tokens,
//     temperature 1, ignore_eos (vLLM's benchmark_throughput setup); output tokens/s.
//  2. Batch-1 decode tokens/s against the memory-bandwidth bound: bytes read
//     per token (every weight matrix once + the KV cache of the context)
//     over the STREAM-like triad bandwidth at the same thread count. A
//     read-only bandwidth is printed too: decode only reads, and on this
//     machine one thread reads faster than it runs a triad. The machine is
//     shared, so the table also gives the rate in CPU time (1 thread only)
//     and uses the median step time.
//  3. Time to first token of a request whose 512-token system prompt is
//     shared with an earlier request, with vs without prefix caching.
// Usage: bench_rollout_bench [--threads 2] [--prompts 64] [--n 8] [--new 256]
//                            [--only throughput|decode|ttft] [--save-model DIR] [--dtype f32|bf16]
//                            [--arch dense|moe|mla|mla-moe] [--config FILE|DIR] [--model DIR]
// --device cuda (a build with the CUDA backend) puts the model and the KV cache
// on GPU 0; --eager 0 turns on CUDA-graph decode (enforce_eager=false, vLLM's
// capture sizes), and the throughput table then also gives the decode steps'
// HBM roofline: bytes a step reads (every weight once + the batch's KV at the
// mean context) over --hbm-gbs (default 4800, an H200's datasheet bandwidth).
// --save-model writes the random weights (HF format) for bench/peers/hf_generate.py.
// --arch picks a built-in config of about the small config's active size per
// token (hidden 512, 8 layers, 8 heads, vocab 8192; about 3 M active weights
// per layer): moe = Qwen3-MoE (GQA 2 kv heads, 16 experts of 768, top-2),
// mla = DeepSeek-V2 with dense MLPs (MLA: kv_lora 128, rope 32, nope 64, v 64),
// mla-moe = DeepSeek-V3 (that MLA, layer 0 dense, 16 experts of 512 top-2 +
// 1 shared). --config builds random weights for any config.json; --model
// loads a model folder (config.json + safetensors) instead of random weights.
// The decode table counts the weights a batch-1 token reads: a MoE layer's
// router, its top-k experts and the shared ones, not every expert.
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench_device.h"
#include "bench_timing.h"
#include "core/parallel_for.h"
#include "core/rng.h"
#include "io/model_config.h"
#include "model/transformer.h"
#include "ops/op_profile.h"
#include "rollout/engine.h"

using namespace kestrel;
using Clock = std::chrono::steady_clock;

namespace {

double secs_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<int32_t> random_tokens(uint64_t stream, int64_t n, int64_t vocab) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(int32_t(philox4x32(uint64_t(i), stream, 2024)[0] % uint32_t(vocab)));
  return t;
}

// a[i] = b[i] + s * c[i] over arrays far larger than the caches; bytes moved
// counted as STREAM does (3 x 8 bytes per element for double: 2 reads, 1 write).
double triad_gbs(int threads) {
  const int64_t n = int64_t(1) << 25;  // 32 Mi doubles = 256 MiB per array
  const size_t sz = static_cast<size_t>(n);
  std::vector<double> a(sz, 0.0), b(sz, 1.0), c(sz, 2.0);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; ++i) a[size_t(i)] = b[size_t(i)] + 3.0 * c[size_t(i)];
    const double s = secs_since(t0);
    best = std::max(best, 3.0 * 8.0 * double(n) / s / 1e9);
  }
  if (a[17] != 7.0) std::fprintf(stderr, "triad check failed\n");
  return best;
}

double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Sum of a 256 MiB array: read-only bandwidth, the pattern of streaming
// weights. 32 partial sums per thread keep the adds off the critical path.
// Best of 5, GB/s by wall time; *cpu_gbs gets the same in process CPU time.
double read_gbs(int threads, double* cpu_gbs) {
  const int64_t n = int64_t(1) << 26;
  std::vector<float> a(static_cast<size_t>(n), 1.0f);
  double best = 0, best_cpu = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    const double c0 = cpu_seconds();
    float total = 0.f;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t b = n * id / nt / 32 * 32, e = id + 1 == nt ? n : n * (id + 1) / nt / 32 * 32;
      float acc[32] = {};
      for (int64_t i = b; i < e; i += 32) {
#pragma omp simd
        for (int j = 0; j < 32; ++j) acc[j] += a[size_t(i + j)];
      }
      for (float v : acc) total += v;
    }
    const double s = secs_since(t0), c = cpu_seconds() - c0;
    if (total != float(n)) std::fprintf(stderr, "read check failed\n");
    best = std::max(best, 4.0 * double(n) / s / 1e9);
    best_cpu = std::max(best_cpu, 4.0 * double(n) / (c / threads) / 1e9);
  }
  *cpu_gbs = best_cpu;
  return best;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

io::ModelConfig small_config() {
  // Run from the repository root (or from build/<name>/).
  for (const char* path : {"bench/configs/small.json", "../../bench/configs/small.json"}) {
    auto c = io::load_model_config(path);
    if (c.is_ok()) return c.value();
  }
  std::fprintf(stderr, "note: bench/configs/small.json not found from here; using the built-in copy\n");
  io::ModelConfig m;
  m.vocab_size = 8192;
  m.hidden_size = 512;
  m.intermediate_size = 1536;
  m.num_hidden_layers = 8;
  m.num_attention_heads = 8;
  m.num_key_value_heads = 2;
  m.head_dim = 64;
  m.max_position_embeddings = 2048;
  m.rms_norm_eps = 1e-5;
  m.tie_word_embeddings = true;
  m.eos_token_ids = {2};
  m.rope.head_dim = 64;
  return m;
}

// Built-in configs (--arch), each about the small config's active size per token.
const char* kMoeConfig = R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "vocab_size": 8192, "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8,
  "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 2048,
  "rms_norm_eps": 1e-5, "tie_word_embeddings": true, "eos_token_id": 2, "rope_theta": 10000.0,
  "num_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 768, "norm_topk_prob": true,
  "decoder_sparse_step": 1, "mlp_only_layers": []})";
const char* kMlaConfig = R"({"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
  "vocab_size": 8192, "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8,
  "num_attention_heads": 8, "num_key_value_heads": 8, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
  "tie_word_embeddings": true, "eos_token_id": 2, "rope_theta": 10000.0, "q_lora_rank": null,
  "kv_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
  "first_k_dense_replace": 8, "n_routed_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 768,
  "n_shared_experts": null, "topk_method": "greedy", "n_group": 1, "topk_group": 1})";
const char* kMlaMoeConfig = R"({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "vocab_size": 8192, "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8,
  "num_attention_heads": 8, "num_key_value_heads": 8, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
  "tie_word_embeddings": true, "eos_token_id": 2, "rope_theta": 10000.0, "q_lora_rank": null,
  "kv_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
  "first_k_dense_replace": 1, "n_routed_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 512,
  "n_shared_experts": 1, "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1, "norm_topk_prob": true,
  "routed_scaling_factor": 1.0})";

io::ModelConfig arch_config(const std::string& arch) {
  if (arch == "dense") return small_config();
  const char* text = arch == "moe" ? kMoeConfig : arch == "mla" ? kMlaConfig : arch == "mla-moe" ? kMlaMoeConfig : nullptr;
  if (!text) {
    std::fprintf(stderr, "unknown --arch %s (dense, moe, mla, mla-moe)\n", arch.c_str());
    std::exit(2);
  }
  return io::parse_model_config(text, "built-in " + arch).value();
}

// Weight bytes one batch-1 decode token reads: every matrix once, a MoE
// layer's routed experts scaled by top_k / num_experts (the grouped GEMM
// reads only the experts a token was routed to), an untied input table one row.
int64_t active_weight_bytes(model::CausalLM& m) {
  const io::ModelConfig& c = m.config();
  double bytes = 0;
  for (model::Param* p : m.params()) {
    double b = double(p->weight.nbytes());
    if (p->name.find(".mlp.experts.") != std::string::npos) b *= double(c.moe.top_k) / double(c.moe.num_experts);
    bytes += b;
  }
  if (!c.tie_word_embeddings) bytes -= double(c.vocab_size * c.hidden_size * int64_t(dtype_size(m.dtype())));
  return int64_t(bytes);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  int64_t prompts = 64, n = 8, new_tokens = 256, prompt_len = 128;
  std::string only, save_dir, arch = "dense", config_path, model_dir, device_s = "cpu";
  DType dtype = DType::F32;
  bool eager = true;
  double hbm_gbs = 4800;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--threads") threads = std::stoi(next());
    else if (a == "--prompts") prompts = std::stoll(next());
    else if (a == "--n") n = std::stoll(next());
    else if (a == "--new") new_tokens = std::stoll(next());
    else if (a == "--only") only = next();
    else if (a == "--save-model") save_dir = next();
    else if (a == "--dtype") dtype = next() == "bf16" ? DType::BF16 : DType::F32;
    else if (a == "--arch") arch = next();
    else if (a == "--config") config_path = next();
    else if (a == "--model") model_dir = next();
    else if (a == "--device") device_s = next();
    else if (a == "--eager") eager = next() != "0";
    else if (a == "--hbm-gbs") hbm_gbs = std::stod(next());
    else if (a == "--prompt-len") prompt_len = std::stoll(next());
    else {
      std::fprintf(stderr, "usage: %s [--threads T] [--prompts P] [--n N] [--new K] [--only throughput|decode|ttft] "
                   "[--save-model DIR] [--dtype f32|bf16] [--arch dense|moe|mla|mla-moe] [--config FILE|DIR] "
                   "[--model DIR] [--device cpu|cuda] [--eager 0|1] [--hbm-gbs G] [--prompt-len L]\n", argv[0]);
      return 2;
    }
  }
  set_num_threads(threads);
  model::ModelOptions mo;
  mo.dtype = dtype;
  if (device_s != "cpu" && only != "throughput") {
    std::fprintf(stderr, "--device %s: pass --only throughput (the decode and TTFT tables measure against the "
                         "host's memory bandwidth and are not built for a device yet)\n", device_s.c_str());
    return 2;
  }
  if (!bench::init_device(device_s, &mo.device)) return 1;
  std::unique_ptr<model::CausalLM> m;
  std::string what = arch == "dense" ? "small config" : "built-in " + arch + " config";
  if (!model_dir.empty()) {
    auto loaded = model::CausalLM::load(model_dir, mo);
    if (!loaded.is_ok()) {
      std::fprintf(stderr, "%s\n", loaded.status().message().c_str());
      return 1;
    }
    m = std::move(loaded).value();
    what = model_dir;
  } else {
    io::ModelConfig c = arch_config(arch);
    if (!config_path.empty()) {
      auto r = io::load_model_config(config_path);
      if (!r.is_ok()) {
        std::fprintf(stderr, "%s\n", r.status().message().c_str());
        return 1;
      }
      c = r.value();
      what = config_path + " (random weights)";
    }
    m = model::CausalLM::init_random(c, mo, 1234, 0.02);
  }
  const io::ModelConfig cfg = m->config();
  if (!save_dir.empty()) {
    Status s = m->save(save_dir, DType::F32);
    if (!s.is_ok()) {
      std::fprintf(stderr, "%s\n", s.message().c_str());
      return 1;
    }
    std::printf("saved the random model to %s\n", save_dir.c_str());
  }
  std::printf("# rollout bench: %s (%lld params, %lld MoE layers, %s attention), %s, %d threads\n", what.c_str(),
              (long long)m->num_parameters(), (long long)m->num_moe_layers(), cfg.mla.enabled ? "MLA" : "GQA",
              dtype_name(dtype), threads);
  bench::print_machine_header("# ");
  std::printf("\n");

  if (only.empty() || only == "throughput") {
    rollout::EngineConfig ec;  // 8192-token steps
    ec.max_num_seqs = 512;
    // Room for every sequence at full length (512 x 384 tokens x 16 KiB), so
    // the number measures batching, not preemption.
    ec.kv_cache_bytes = int64_t(3) << 30;
    ec.enforce_eager = eager;
    auto e = rollout::Engine::create(*m, ec).value();
    rollout::SamplingParams sp;
    sp.temperature = 1.0;
    sp.n = n;
    sp.max_tokens = new_tokens;
    sp.ignore_eos = true;
    // On a device, one short request first, off the clock: its decode steps
    // capture the CUDA graphs (every capture size, --eager 0), which vLLM does
    // at start-up, before its benchmark's clock (on an H200 the 51 sizes up to
    // 512 took 1.7 s of a 5 s run), and the kernels' lazy initialisation.
    rollout::EngineStats warm{};
    if (mo.device != Device::CPU) {
      rollout::SamplingParams wp = sp;
      wp.n = 1;
      wp.max_tokens = 2;
      wp.seed = 12345;
      const auto tw = Clock::now();
      e->add_request("warm-up", random_tokens(777, prompt_len, cfg.vocab_size), wp).throw_if_error();
      (void)e->run_to_completion();
      warm = e->stats();
      std::printf("# warm-up, off the clock: %.2f s (%lld CUDA graph capture rounds)\n", secs_since(tw),
                  (long long)warm.cuda_graph_captures);
    }
    for (int64_t i = 0; i < prompts; ++i) {
      sp.seed = uint64_t(i);
      e->add_request("p" + std::to_string(i), random_tokens(uint64_t(i), prompt_len, cfg.vocab_size), sp).throw_if_error();
    }
    ops::op_profile_reset();  // KESTREL_OP_PROFILE: the engine's steps only, not the set-up
    const auto t0 = Clock::now();
    const auto outs = e->run_to_completion();
    const double s = secs_since(t0);
    if (ops::op_profile_enabled()) ops::op_profile_report(stdout, "op profile of the throughput run");
    rollout::EngineStats st = e->stats();  // the timed requests' share: the warm-up's counts taken off
    st.generated_tokens -= warm.generated_tokens;
    st.prompt_tokens -= warm.prompt_tokens;
    st.steps -= warm.steps;
    st.preemptions -= warm.preemptions;
    std::printf("## throughput: %lld prompts x n=%lld, %lld prompt + %lld new tokens, temperature 1\n",
                (long long)prompts, (long long)n, (long long)prompt_len, (long long)new_tokens);
    std::printf("| output tokens | seconds | output tok/s | total tok/s | steps | preemptions |\n|---|---|---|---|---|---|\n");
    std::printf("| %lld | %.2f | %.1f | %.1f | %lld | %lld |\n\n", (long long)st.generated_tokens, s,
                double(st.generated_tokens) / s, double(st.generated_tokens + st.prompt_tokens) / s,
                (long long)st.steps, (long long)st.preemptions);
    if (mo.device != Device::CPU) {
      // The decode steps' roofline: each reads every weight once and the KV
      // of the batch's sequences at the mean context.
      const double batch = double(prompts * n), mean_ctx = double(prompt_len) + 0.5 * double(new_tokens);
      const double step_bytes = double(active_weight_bytes(*m)) + batch * mean_ctx * double(rollout::kv_bytes_per_token(*m));
      const double bound = hbm_gbs * 1e9 / step_bytes * batch;
      std::printf("{\"engine\": \"kestrel\", \"device\": \"%s\", \"mode\": \"%s\", \"dtype\": \"%s\", \"sequences\": %lld, "
                  "\"new_tokens\": %lld, \"output_tok_per_s\": %.1f, \"seconds\": %.3f, \"steps\": %lld, "
                  "\"step_mb\": %.1f, \"hbm_bound_tok_per_s\": %.0f, \"fraction_of_hbm_bound\": %.4f}\n\n",
                  device_s.c_str(), eager ? "eager" : "cudagraph", dtype_name(dtype), (long long)(prompts * n),
                  (long long)new_tokens, double(st.generated_tokens) / s, s, (long long)st.steps, step_bytes / 1e6, bound,
                  double(st.generated_tokens) / s / bound);
    }
  }

  if (only.empty() || only == "decode") {
    const double bw = triad_gbs(threads);
    double read_cpu = 0;
    const double read_bw = read_gbs(threads, &read_cpu);
    // Bytes read per decode step: every matrix once (the tied embedding as
    // lm_head; an untied input table only one row; a MoE layer's top-k
    // experts), plus the cache of every position in every layer (K and V,
    // or MLA's latent rows), at the mean context of the timed steps.
    const int64_t weight_bytes = active_weight_bytes(*m);
    const double mean_ctx = double(prompt_len) + 0.5 * double(new_tokens);
    const double kv_bytes = mean_ctx * double(rollout::kv_bytes_per_token(*m));
    const double token_bytes = double(weight_bytes) + kv_bytes;
    rollout::EngineConfig ec;
    auto e = rollout::Engine::create(*m, ec).value();
    rollout::SamplingParams sp;
    sp.temperature = 1.0;
    sp.max_tokens = new_tokens;
    sp.ignore_eos = true;
    e->add_request("d", random_tokens(999, prompt_len, cfg.vocab_size), sp).throw_if_error();
    e->step();  // prefill + first token, not timed
    std::vector<double> wall, cpu;
    const auto t0 = Clock::now();
    while (e->has_unfinished()) {
      const auto s0 = Clock::now();
      const double c0 = cpu_seconds();
      e->step();
      wall.push_back(secs_since(s0));
      cpu.push_back(cpu_seconds() - c0);
    }
    const double s = secs_since(t0);
    const double steps = double(wall.size());
    const double bound = bw * 1e9 / token_bytes, read_bound = read_bw * 1e9 / token_bytes;
    const double mean_tps = steps / s, med_tps = 1.0 / median(wall);
    std::printf("## batch-1 decode (context %lld..%lld)\n", (long long)prompt_len, (long long)(prompt_len + new_tokens));
    std::printf("bytes per token: %.1f MB weights read (of %.1f MB) + %.2f MB KV (mean context %.0f; %lld cache "
                "bytes per token)\n", double(weight_bytes) / 1e6, double(rollout::weight_bytes(*m)) / 1e6,
                kv_bytes / 1e6, mean_ctx, (long long)rollout::kv_bytes_per_token(*m));
    std::printf("| triad GB/s | read GB/s | bound tok/s (triad) | bound tok/s (read) | measured tok/s (mean) | "
                "measured tok/s (median step) | fraction of triad bound | fraction of read bound |\n"
                "|---|---|---|---|---|---|---|---|\n");
    std::printf("| %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f |\n", bw, read_bw, bound, read_bound, mean_tps,
                med_tps, med_tps / bound, med_tps / read_bound);
    if (threads == 1) {
      // CPU time leaves out the time this thread waited for a core.
      const double cpu_tps = 1.0 / median(cpu), cpu_bound = read_cpu * 1e9 / token_bytes;
      std::printf("in CPU time: read %.1f GB/s, bound %.1f tok/s, measured %.1f tok/s (median step), %.2f of the read bound\n",
                  read_cpu, cpu_bound, cpu_tps, cpu_tps / cpu_bound);
    }
    std::printf("\n");
  }

  if (only.empty() || only == "ttft") {
    const auto system = random_tokens(7777, 512, cfg.vocab_size);
    std::printf("## time to first token, 512-token shared system prompt + 32-token user turn\n");
    std::printf("| prefix caching | mean TTFT ms | cached prompt tokens |\n|---|---|---|\n");
    double ttft[2] = {0, 0};
    for (int caching = 0; caching < 2; ++caching) {
      rollout::EngineConfig ec;
      ec.enable_prefix_caching = caching == 1;
      auto e = rollout::Engine::create(*m, ec).value();
      rollout::SamplingParams sp;
      sp.temperature = 1.0;
      sp.max_tokens = 1;
      auto prompt_for = [&](int i) {
        auto p = system;
        const auto user = random_tokens(100 + uint64_t(i), 32, cfg.vocab_size);
        p.insert(p.end(), user.begin(), user.end());
        return p;
      };
      e->add_request("warm", prompt_for(0), sp).throw_if_error();
      e->run_to_completion();
      const int reps = 5;
      double total = 0;
      int64_t cached = 0;
      for (int i = 1; i <= reps; ++i) {
        const auto t0 = Clock::now();
        e->add_request("q" + std::to_string(i), prompt_for(i), sp).throw_if_error();
        auto outs = e->run_to_completion();
        total += secs_since(t0);
        cached = outs[0].num_cached_prompt_tokens;
      }
      ttft[caching] = 1e3 * total / reps;
      std::printf("| %s | %.1f | %lld |\n", caching ? "on" : "off", ttft[caching], (long long)cached);
    }
    std::printf("\nTTFT speedup from prefix caching: %.1fx\n", ttft[0] / ttft[1]);
  }
  return 0;
}
