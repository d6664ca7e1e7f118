// Rollout engine benchmarks on the "small" config (bench/configs/small.json:
// hidden 512, 8 layers, 8 heads, 2 KV heads, ffn 1536, vocab 8192), random
// weights, f32:
//  1. Throughput: P prompts x n samples, 128 prompt tokens, 256 new tokens,
//     temperature 1, ignore_eos (vLLM's benchmark_throughput setup); output tokens/s.
//  2. Batch-1 decode tokens/s against the memory-bandwidth bound
//     (STREAM-like triad bandwidth / bytes of weights read per token).
//  3. Time to first token of a request whose 512-token system prompt is
//     shared with an earlier request, with vs without prefix caching.
// Usage: bench_rollout_bench [--threads 2] [--prompts 64] [--n 8] [--new 256]
//                            [--only throughput|decode|ttft] [--save-model DIR]
// --save-model writes the random weights (HF format) for bench/peers/hf_generate.py.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/parallel_for.h"
#include "core/rng.h"
#include "io/model_config.h"
#include "model/transformer.h"
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

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  int64_t prompts = 64, n = 8, new_tokens = 256, prompt_len = 128;
  std::string only, save_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--threads") threads = std::stoi(next());
    else if (a == "--prompts") prompts = std::stoll(next());
    else if (a == "--n") n = std::stoll(next());
    else if (a == "--new") new_tokens = std::stoll(next());
    else if (a == "--only") only = next();
    else if (a == "--save-model") save_dir = next();
    else {
      std::fprintf(stderr, "usage: %s [--threads T] [--prompts P] [--n N] [--new K] [--only throughput|decode|ttft] "
                   "[--save-model DIR]\n", argv[0]);
      return 2;
    }
  }
  set_num_threads(threads);
  const io::ModelConfig cfg = small_config();
  model::ModelOptions mo;
  auto m = model::CausalLM::init_random(cfg, mo, 1234, 0.02);
  if (!save_dir.empty()) {
    Status s = m->save(save_dir, DType::F32);
    if (!s.is_ok()) {
      std::fprintf(stderr, "%s\n", s.message().c_str());
      return 1;
    }
    std::printf("saved the random model to %s\n", save_dir.c_str());
  }
  std::printf("# rollout bench: small config (%lld params), f32, %d threads\n\n", (long long)m->num_parameters(),
              threads);

  if (only.empty() || only == "throughput") {
    rollout::EngineConfig ec;  // 8192-token steps
    ec.max_num_seqs = 512;
    // Room for every sequence at full length (512 x 384 tokens x 16 KiB), so
    // the number measures batching, not preemption.
    ec.kv_cache_bytes = int64_t(3) << 30;
    auto e = rollout::Engine::create(*m, ec).value();
    rollout::SamplingParams sp;
    sp.temperature = 1.0;
    sp.n = n;
    sp.max_tokens = new_tokens;
    sp.ignore_eos = true;
    for (int64_t i = 0; i < prompts; ++i) {
      sp.seed = uint64_t(i);
      e->add_request("p" + std::to_string(i), random_tokens(uint64_t(i), prompt_len, cfg.vocab_size), sp).throw_if_error();
    }
    const auto t0 = Clock::now();
    const auto outs = e->run_to_completion();
    const double s = secs_since(t0);
    const auto st = e->stats();
    std::printf("## throughput: %lld prompts x n=%lld, %lld prompt + %lld new tokens, temperature 1\n",
                (long long)prompts, (long long)n, (long long)prompt_len, (long long)new_tokens);
    std::printf("| output tokens | seconds | output tok/s | total tok/s | steps | preemptions |\n|---|---|---|---|---|---|\n");
    std::printf("| %lld | %.2f | %.1f | %.1f | %lld | %lld |\n\n", (long long)st.generated_tokens, s,
                double(st.generated_tokens) / s, double(st.generated_tokens + st.prompt_tokens) / s,
                (long long)st.steps, (long long)st.preemptions);
  }

  if (only.empty() || only == "decode") {
    const double bw = triad_gbs(threads);
    // Weights read per decode step: every matrix once (the tied embedding as
    // lm_head); the embedding lookup itself reads one row.
    int64_t weight_bytes = 0;
    for (model::Param* p : m->params()) weight_bytes += int64_t(p->weight.nbytes());
    if (!cfg.tie_word_embeddings) weight_bytes -= cfg.vocab_size * cfg.hidden_size * 4;  // untied input table: one row
    const double bound = bw * 1e9 / double(weight_bytes);
    rollout::EngineConfig ec;
    auto e = rollout::Engine::create(*m, ec).value();
    rollout::SamplingParams sp;
    sp.temperature = 1.0;
    sp.max_tokens = new_tokens;
    sp.ignore_eos = true;
    e->add_request("d", random_tokens(999, prompt_len, cfg.vocab_size), sp).throw_if_error();
    e->step();  // prefill + first token, not timed
    const auto t0 = Clock::now();
    int64_t steps = 0;
    while (e->has_unfinished()) {
      e->step();
      ++steps;
    }
    const double s = secs_since(t0);
    std::printf("## batch-1 decode (context %lld..%lld)\n", (long long)prompt_len, (long long)(prompt_len + new_tokens));
    std::printf("| triad GB/s | weight MB/token | bound tok/s | measured tok/s | fraction of bound |\n|---|---|---|---|---|\n");
    std::printf("| %.1f | %.1f | %.1f | %.1f | %.2f |\n\n", bw, double(weight_bytes) / 1e6, bound, double(steps) / s,
                double(steps) / s / bound);
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
